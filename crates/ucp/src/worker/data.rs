//! The raw API's buffers and results: what a caller passes (`RecvData`, `SendData`, turned
//! into the operation's [`UserBuf`] here, where the caller's promise about the memory is
//! taken), and what a receive returns.

use ucs::{Status, UcsResult};

use super::Request;
use crate::dt::{GenState, GenericBuf, IoVec, UserBuf};
use crate::request::{RecvInfo, RequestFlags, RequestParam};

/// Receive buffer of the raw API.
#[derive(Debug)]
pub enum RecvData<'a> {
    /// One buffer.
    Contig(&'a mut [u8]),
    /// Scattered buffers (`ucp_dt_iov_t`).
    Iov(&'a [IoVec]),
    /// A generic datatype (`ucp_dt_create_generic`): its `start_unpack(buffer, count)` makes
    /// the receive's state, which takes the message at offsets (see [`Datatype`](crate::Datatype);
    /// [`GenericBuf::recv`]).
    Generic(&'a GenericBuf<'a>),
}

impl RecvData<'_> {
    /// The operation's buffer: the caller's promise about its memory is taken here.
    ///
    /// # Safety
    /// The memory (and an iov list itself) must stay valid, and not be accessed, until the
    /// operation completes. `None`: an invalid iov list (see [`UserBuf::iov`]) or a generic
    /// datatype whose start failed; the caller reports [`invalid_data`]. A buffer made here
    /// is given back with [`end_call`] once the call is done with it.
    #[inline(always)]
    pub(crate) unsafe fn into_buf(self) -> Option<UserBuf> {
        match self {
            // SAFETY: forwarded from the caller.
            RecvData::Contig(s) => Some(unsafe { UserBuf::contig(s.as_mut_ptr(), s.len()) }),
            // SAFETY: forwarded from the caller.
            RecvData::Iov(v) => unsafe { UserBuf::iov(v) },
            RecvData::Generic(g) => generic_buf(g.dt.start_unpack(g.buffer, g.count)),
        }
    }
}

/// Send buffer of the raw API.
#[derive(Debug)]
pub enum SendData<'a> {
    /// One buffer.
    Contig(&'a [u8]),
    /// Gathered buffers (`ucp_dt_iov_t`).
    Iov(&'a [IoVec]),
    /// A generic datatype (`ucp_dt_create_generic`): its `start_pack(buffer, count)` makes
    /// the send's state, which produces the message at offsets (see [`Datatype`](crate::Datatype);
    /// [`GenericBuf::send`]).
    Generic(&'a GenericBuf<'a>),
}

impl SendData<'_> {
    /// The operation's buffer: the caller's promise about its memory is taken here.
    ///
    /// # Safety
    /// The memory (and an iov list itself) must stay valid and unmodified until the operation
    /// completes. `None`: an invalid iov list or a generic datatype whose start failed (the
    /// caller reports [`invalid_data`]). A buffer made here is given back with [`end_call`]
    /// once the call is done with it.
    #[inline(always)]
    pub(crate) unsafe fn into_buf(self) -> Option<UserBuf> {
        match self {
            // SAFETY: forwarded from the caller; a send only reads the memory.
            SendData::Contig(s) => Some(unsafe { UserBuf::contig(s.as_ptr() as *mut u8, s.len()) }),
            // SAFETY: forwarded from the caller.
            SendData::Iov(v) => unsafe { UserBuf::iov(v) },
            SendData::Generic(g) => generic_buf(g.dt.start_pack(g.buffer, g.count)),
        }
    }

    /// [`SendData::into_buf`] for remote memory access, which reads memory in place: a
    /// generic datatype is refused (`Unsupported`, reported by [`invalid_data`]).
    ///
    /// # Safety
    /// As [`SendData::into_buf`].
    #[inline(always)]
    pub(crate) unsafe fn into_rma_buf(self, op: &str) -> Option<UserBuf> {
        match self {
            SendData::Generic(_) => generic_rma(op),
            // SAFETY: forwarded from the caller.
            d => unsafe { d.into_buf() },
        }
    }
}

impl RecvData<'_> {
    /// [`RecvData::into_buf`] for remote memory access, as [`SendData::into_rma_buf`].
    ///
    /// # Safety
    /// As [`RecvData::into_buf`].
    #[inline(always)]
    pub(crate) unsafe fn into_rma_buf(self, op: &str) -> Option<UserBuf> {
        match self {
            RecvData::Generic(_) => generic_rma(op),
            // SAFETY: forwarded from the caller.
            d => unsafe { d.into_buf() },
        }
    }
}

/// A generic datatype given to remote memory access, which reads and writes memory in place
/// (as in UCX, contiguous or iov only): `Unsupported`, for [`invalid_data`].
#[cold]
#[inline(never)]
fn generic_rma(op: &str) -> Option<UserBuf> {
    tracing::error!("{op}: generic datatypes are not supported by remote memory access (contiguous or iov only)");
    START_ERROR.with(|c| c.set(Some(Status::Unsupported)));
    None
}

thread_local! {
    /// The error of the last generic datatype start that failed on this thread, for
    /// [`invalid_data`] to report right after. (`into_buf` answers an `Option`, not a
    /// `Result`, for the reason [`UserBuf::iov`] gives.)
    static START_ERROR: std::cell::Cell<Option<Status>> = const { std::cell::Cell::new(None) };
}

/// The buffer of a generic datatype's operation whose start went as `st`.
#[cold]
#[inline(never)]
fn generic_buf(st: UcsResult<std::rc::Rc<GenState>>) -> Option<UserBuf> {
    match st {
        // SAFETY: the buffer holds the call's reference until `end_call`; a request made
        // for the operation takes its own.
        Ok(st) => Some(unsafe { UserBuf::generic(st) }),
        Err(e) => {
            START_ERROR.with(|c| c.set(Some(e)));
            None
        }
    }
}

/// The error of data `into_buf` refused: a generic datatype's start error, or `InvalidParam`
/// for an invalid iov list (logged by [`UserBuf::iov`]).
#[cold]
#[inline(never)]
pub(crate) fn invalid_data<T>() -> UcsResult<T> {
    Err(START_ERROR.with(|c| c.take()).unwrap_or(Status::InvalidParam))
}

/// Ends the call that made `buf` with `into_buf` and whose core call went as `r`
/// (`at_once`: whether a success completed the operation without a request): a generic
/// datatype's call reference goes (a request made for the operation keeps its own; else the
/// user's `finish` runs now), and an operation that completed at once reports a callback's
/// error instead of its success. Must be called once, outside the engine, for every buffer
/// `into_buf` made.
#[inline(always)]
pub(crate) fn end_call<T>(buf: UserBuf, r: UcsResult<T>, at_once: impl FnOnce(&T) -> bool) -> UcsResult<T> {
    // SAFETY: `buf` came from `into_buf` and this is the one call that ends it.
    match unsafe { buf.end_call() } {
        None => r,
        Some(e) => match r {
            Ok(v) if at_once(&v) => Err(e),
            r => r,
        },
    }
}

/// The parameters of a detached operation (no request handle), or the error of asking for
/// a handle with `NO_IMM_CMPL`.
#[inline]
pub(crate) fn detach(mut param: RequestParam, op: &str) -> UcsResult<RequestParam> {
    if param.flags.contains(RequestFlags::NO_IMM_CMPL) {
        return no_handle_for(op);
    }
    param.detached = true;
    Ok(param)
}

#[cold]
#[inline(never)]
fn no_handle_for<T>(op: &str) -> UcsResult<T> {
    tracing::error!("{op}: NO_IMM_CMPL asks for a request handle, which a detached operation does not give");
    Err(Status::InvalidParam)
}

/// Outcome of a receive: completed at once, or a request.
#[derive(Debug)]
pub enum RecvResult<'w> {
    /// Completed at once (no callback).
    Done(RecvInfo),
    /// In progress.
    Pending(Request<'w>),
}

impl RecvResult<'_> {
    /// Waits for completion (progressing the worker).
    pub fn wait(self) -> Result<RecvInfo, Status> {
        match self {
            RecvResult::Done(i) => Ok(i),
            RecvResult::Pending(r) => r.wait(),
        }
    }
}
