//! The raw API's buffers and results: what a caller passes (`RecvData`, `SendData`, turned
//! into the operation's [`UserBuf`] here, where the caller's promise about the memory is
//! taken), and what a receive returns.

use ucs::{Status, UcsResult};

use super::Request;
use crate::dt::{IoVec, UserBuf};
use crate::request::{RecvInfo, RequestFlags, RequestParam};

/// Receive buffer of the raw API.
#[derive(Debug)]
pub enum RecvData<'a> {
    /// One buffer.
    Contig(&'a mut [u8]),
    /// Scattered buffers (`ucp_dt_iov_t`).
    Iov(&'a [IoVec]),
}

impl RecvData<'_> {
    /// The operation's buffer: the caller's promise about its memory is taken here.
    ///
    /// # Safety
    /// The memory (and an iov list itself) must stay valid, and not be accessed, until the
    /// operation completes. `None`: an invalid iov list (see [`UserBuf::iov`]; the caller
    /// reports `InvalidParam`).
    #[inline(always)]
    pub(crate) unsafe fn into_buf(self) -> Option<UserBuf> {
        match self {
            // SAFETY: forwarded from the caller.
            RecvData::Contig(s) => Some(unsafe { UserBuf::contig(s.as_mut_ptr(), s.len()) }),
            // SAFETY: forwarded from the caller.
            RecvData::Iov(v) => unsafe { UserBuf::iov(v) },
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
}

impl SendData<'_> {
    /// The operation's buffer: the caller's promise about its memory is taken here.
    ///
    /// # Safety
    /// The memory (and an iov list itself) must stay valid and unmodified until the operation
    /// completes. `None`: an invalid iov list (the caller reports `InvalidParam`).
    #[inline(always)]
    pub(crate) unsafe fn into_buf(self) -> Option<UserBuf> {
        match self {
            // SAFETY: forwarded from the caller; a send only reads the memory.
            SendData::Contig(s) => Some(unsafe { UserBuf::contig(s.as_ptr() as *mut u8, s.len()) }),
            // SAFETY: forwarded from the caller.
            SendData::Iov(v) => unsafe { UserBuf::iov(v) },
        }
    }
}

/// The error of an invalid iov list (logged by [`UserBuf::iov`]).
#[cold]
#[inline(never)]
pub(crate) fn invalid_iov<T>() -> UcsResult<T> {
    Err(Status::InvalidParam)
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
