//! Requests (`ucp_request_param_t`, `ucs_status_ptr_t`) in Rust form.
//!
//! * An operation that completes at once returns without a request (unless
//!   [`RequestFlags::NO_IMM_CMPL`]); the callback is then not called, as in UCX.
//! * Otherwise it returns a [`Request`]: poll [`Request::status`], wait on it, or let the
//!   callback run. Dropping a `Request` is `ucp_request_free`: the operation goes on and the
//!   callback still fires.
//! * The raw operations take pointers and are `unsafe` (the buffer must outlive the request).
//!   The safe ones are futures over owned buffers ([`crate::SendFuture`], [`crate::RecvFuture`]):
//!   the buffer lives inside the worker until the transport is done with it, so dropping the
//!   future of a pending receive cancels it and data never lands in memory the caller owns again.

use std::any::Any;
use std::task::Waker;

use bitflags::bitflags;
use ucs::idtable::Id;
use ucs::mpool::{ObjPool, PoolBox};
use ucs::Status;

use crate::tag::{ExpEntry, ExpQueues, ExpStore, Tag};
use ucs::idtable::IdTable;

bitflags! {
    /// `UCP_OP_ATTR_FLAG_*`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct RequestFlags: u32 {
        /// Always return a request, even when the operation completed at once.
        const NO_IMM_CMPL = 1 << 0;
        /// Fail with `NoResource` instead of returning a request.
        const FORCE_IMM_CMPL = 1 << 1;
    }
}

/// What a completed receive got (`ucp_tag_recv_info_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvInfo {
    /// Bytes the sender sent.
    pub length: usize,
    /// The sender's tag.
    pub sender_tag: Tag,
}

/// A completion callback: the final status and, for receives, what arrived (for sends, the
/// length sent and the tag).
pub type Callback = Box<dyn FnOnce(Status, RecvInfo) + Send>;

/// A completion callback without allocation: a function and a user value (`cb` and
/// `user_data` of `ucp_request_param_t`).
pub type CallbackFn = fn(Status, RecvInfo, usize);

/// One buffer of an iov datatype (`ucp_dt_iov_t`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct IoVec {
    /// Start.
    pub buffer: *mut u8,
    /// Length in bytes.
    pub length: usize,
}

/// Parameters of an operation (`ucp_request_param_t`).
#[derive(Default)]
pub struct RequestParam {
    /// Immediate-completion behaviour.
    pub flags: RequestFlags,
    /// Called once when the operation completes (not when it completed at once).
    pub callback: Option<Callback>,
    /// The same as a plain function with a user value (no allocation); runs after `callback`.
    pub callback_fn: Option<(CallbackFn, usize)>,
    /// A registration of the buffer (`ucp_mem_map`), used by zero-copy protocols instead of
    /// registering per message.
    pub memh: Option<crate::mem::MemHandle>,
    /// Set by the `*_detached` operations: the request is released from the start (no handle).
    pub(crate) detached: bool,
}

impl std::fmt::Debug for RequestParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestParam")
            .field("flags", &self.flags)
            .field("callback", &self.callback.is_some())
            .field("callback_fn", &self.callback_fn.is_some())
            .field("memh", &self.memh.is_some())
            .finish()
    }
}

impl RequestParam {
    /// No callback, no flags.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a callback.
    pub fn callback(mut self, cb: impl FnOnce(Status, RecvInfo) + Send + 'static) -> Self {
        self.callback = Some(Box::new(cb));
        self
    }

    /// Sets an allocation-free callback: `f(status, info, user_data)`.
    pub fn callback_fn(mut self, f: CallbackFn, user_data: usize) -> Self {
        self.callback_fn = Some((f, user_data));
        self
    }

    /// Sets flags.
    pub fn flags(mut self, flags: RequestFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Sets the memory-handle hint.
    pub fn memh(mut self, memh: crate::mem::MemHandle) -> Self {
        self.memh = Some(memh);
        self
    }
}

/// A contiguous piece of user memory; laid out as [`IoVec`], so a caller's iov list is read in
/// place.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct Seg {
    pub ptr: *mut u8,
    pub len: usize,
}

const _: () = {
    assert!(std::mem::size_of::<Seg>() == std::mem::size_of::<IoVec>());
    assert!(std::mem::align_of::<Seg>() == std::mem::align_of::<IoVec>());
    assert!(std::mem::offset_of!(Seg, ptr) == std::mem::offset_of!(IoVec, buffer));
    assert!(std::mem::offset_of!(Seg, len) == std::mem::offset_of!(IoVec, length));
};

/// User data of an operation: contiguous or iov.
#[derive(Debug)]
pub(crate) enum Buf {
    Contig(Seg),
    /// The caller's iov list of two or more pieces, read in place: as for `ucp_dt_iov_t` in
    /// UCX, the raw API's caller keeps the list valid and unchanged until the operation
    /// completes. Nothing is copied or allocated, whatever the list's length.
    Iov {
        list: *const Seg,
        n: usize,
    },
}

impl Buf {
    /// An iov buffer over `list` (two or more pieces; one piece is [`Buf::Contig`]).
    ///
    /// # Safety
    /// `list` must stay valid and unchanged for as long as the returned value is used.
    pub unsafe fn iov(list: &[IoVec]) -> Buf {
        Buf::Iov { list: list.as_ptr().cast::<Seg>(), n: list.len() }
    }

    /// The pieces.
    #[inline]
    fn segs(&self) -> &[Seg] {
        match self {
            Buf::Contig(s) => std::slice::from_ref(s),
            // SAFETY: the caller's list, valid while the operation lasts (`Buf::iov`), of
            // `IoVec`s, which have `Seg`'s layout (asserted above).
            Buf::Iov { list, n } => unsafe { std::slice::from_raw_parts(*list, *n) },
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Buf::Contig(s) => s.len,
            _ => self.segs().iter().map(|s| s.len).sum(),
        }
    }

    pub fn contig(&self) -> Option<Seg> {
        match self {
            // Directly, not through `segs`: this is on every send's fast path.
            Buf::Contig(s) => Some(*s),
            _ => match self.segs() {
                [s] => Some(*s),
                _ => None,
            },
        }
    }

    /// Calls `f(segment_pointer, position, n)` for the pieces of `[offset, offset + len)`:
    /// `n` bytes at `segment_pointer` are bytes `position..position + n` of that range.
    #[inline]
    fn pieces(&self, offset: usize, len: usize, mut f: impl FnMut(*mut u8, usize, usize)) {
        let segs = self.segs();
        let mut skip = offset;
        let mut done = 0;
        for s in segs {
            if done == len {
                break;
            }
            if skip >= s.len {
                skip -= s.len;
                continue;
            }
            let n = (s.len - skip).min(len - done);
            // `skip + n <= s.len`: the pointer stays within the segment.
            f(s.ptr.wrapping_add(skip), done, n);
            done += n;
            skip = 0;
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` of the data into `dst`.
    ///
    /// # Safety
    /// The segments must be valid for reads, and `offset + dst.len() <= self.len()`.
    pub unsafe fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        let d = dst.as_mut_ptr();
        self.pieces(offset, dst.len(), |p, at, n| {
            // SAFETY: the caller guarantees the segment is readable; `pieces` keeps `n` bytes
            // within it, and `at + n <= dst.len()`.
            unsafe { ucs::memory::copy(p, d.add(at), n) }
        });
    }

    /// Copies `src` into the data starting at `offset`.
    ///
    /// # Safety
    /// The segments must be valid for writes and not aliased, and
    /// `offset + src.len() <= self.len()`.
    #[inline]
    pub unsafe fn copy_in(&self, offset: usize, src: &[u8]) {
        if let Buf::Contig(s) = self {
            // SAFETY: as below, for the one segment: `offset + src.len() <= s.len`.
            unsafe { ucs::memory::copy(src.as_ptr(), s.ptr.add(offset), src.len()) };
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.copy_in_pieces(offset, src) };
    }

    /// [`Buf::copy_in`] for an iov list, out of line so that the contiguous case stays small
    /// enough to inline into the receive paths.
    ///
    /// # Safety
    /// As [`Buf::copy_in`].
    #[inline(never)]
    unsafe fn copy_in_pieces(&self, offset: usize, src: &[u8]) {
        self.pieces(offset, src.len(), |p, at, n| {
            // SAFETY: as in `copy_out`, with the roles swapped.
            unsafe { ucs::memory::copy(src.as_ptr().add(at), p, n) }
        });
    }
}

/// Progress of a send.
#[derive(Debug)]
pub(crate) enum SendPhase {
    /// Not started (queued behind wireup or other sends).
    Queued,
    /// Eager fragments sent up to `offset`.
    Frags { offset: usize, msg_id: u64 },
    /// Eager zero-copy fragments posted up to `offset` (`msg_id` of a multi-fragment message).
    Zcopy { offset: usize, msg_id: u64 },
    /// All data sent; waiting for the sync ack.
    WaitAck,
    /// RTS queued or sent; waiting for ATS or RTR.
    Rts { sent: bool },
    /// Putting the data (put_zcopy scheme); ATP follows.
    Put,
    /// Sending AM fragments to receive request `rreq` from `offset`.
    RndvFrags { rreq: u64, offset: usize },
}

/// A send in flight.
#[derive(Debug)]
pub(crate) struct SendReq {
    pub ep: Id,
    pub tag: Tag,
    pub buf: Buf,
    pub sync: bool,
    pub phase: SendPhase,
    /// Zero-copy state (out of line, from the worker's pool: most sends never need it).
    pub zc: Option<PoolBox<ZcState>>,
    /// The memory-handle hint of the operation.
    pub hint: Option<Id>,
}

/// State of a zero-copy rendezvous: registration, remote key, the matched RTS.
#[derive(Debug, Default)]
pub(crate) struct ZcState {
    /// Registration of the local buffer (kept until the operation completes).
    pub memh: Option<uct::MemH>,
    /// The unpacked remote key of an operation in flight.
    pub rkey: Option<uct::RemoteKey>,
    /// The matched rendezvous request (receiver).
    pub rts: Option<crate::core::Rts>,
    /// Counts the eager zero-copy fragments in flight, plus one until all are posted.
    pub comp: Option<std::rc::Rc<uct::Completion>>,
}

/// The worker's pool of [`ZcState`]s: a request's zero-copy state comes from it and returns
/// to it when the request drops it, so zero-copy and rendezvous operations allocate nothing
/// once the pool has grown.
pub(crate) type ZcPool = std::rc::Rc<ObjPool<ZcState>>;

/// Slots the worker's pool of zero-copy states ([`ZcPool`]) adds at a time.
pub(crate) const ZC_POOL_CHUNK: usize = 64;

/// The zero-copy state of a request, taken from `pool` on first use.
pub(crate) fn zc_mut<'a>(pool: &ZcPool, zc: &'a mut Option<PoolBox<ZcState>>) -> &'a mut ZcState {
    zc.get_or_insert_with(|| {
        pool.get(ZcState::default())
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<ZcState>()))
    })
}

/// A receive in flight.
#[derive(Debug)]
pub(crate) struct RecvReq {
    pub buf: Buf,
    /// Bytes arrived so far (multi-fragment eager, rendezvous fragments).
    pub received: usize,
    /// Length of the matched message.
    pub total: usize,
    /// Zero-copy rendezvous state (from the worker's pool).
    pub zc: Option<PoolBox<ZcState>>,
    /// The sender's sync request to acknowledge when complete.
    pub sync: Option<(u64, u64)>,
    /// Set when the message was longer than the buffer; the data is dropped.
    pub truncated: bool,
    /// The memory-handle hint of the operation.
    pub hint: Option<Id>,
}

/// Flushing and closing an endpoint.
#[derive(Debug)]
pub(crate) struct CloseReq {
    pub ep: Id,
}

#[derive(Debug)]
pub(crate) enum ReqKind {
    Send(SendReq),
    Recv(RecvReq),
    Close(CloseReq),
    /// A request completed at creation (NO_IMM_CMPL) or whose work is gone.
    Done,
}

/// State of one request, owned by the worker.
pub(crate) struct ReqState {
    pub kind: ReqKind,
    /// A receive's place in the expected queues ([`Reqs::exp`]), while it waits there.
    pub exp: ExpEntry,
    /// `InProgress` until done.
    pub status: Status,
    pub info: RecvInfo,
    /// The user no longer holds a handle: free on completion.
    pub released: bool,
    /// The allocation-free callback.
    pub cb_fn: Option<(CallbackFn, usize)>,
    /// Callback, waker and owned buffer, for the requests that have them.
    pub ext: Option<Box<ReqExt>>,
}

/// The worker's requests, and the queues of posted receives, whose entries live in the
/// receives' own request slots: posting a receive fills one slot, and matching a message names
/// the slot, with no table of its own to keep in step (UCX links the request itself).
///
/// Invariant: a request is on a queue (`exp.is_posted()`) only while it is in progress; every
/// completion of a posted receive takes it off first ([`Reqs::unpost`]), so no slot is freed
/// or reused while linked.
#[derive(Default)]
pub(crate) struct Reqs {
    pub tab: IdTable<ReqState>,
    pub exp: ExpQueues,
}

impl Reqs {
    /// Takes request `id` off the expected queues if it waits there; true if it did.
    pub fn unpost(&mut self, id: Id) -> bool {
        match self.tab.get(id) {
            Some(r) if r.exp.is_posted() => self.exp.remove(&mut self.tab, id.index()),
            _ => false,
        }
    }
}

impl std::ops::Deref for Reqs {
    type Target = IdTable<ReqState>;
    fn deref(&self) -> &Self::Target {
        &self.tab
    }
}

impl std::ops::DerefMut for Reqs {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tab
    }
}

impl ExpStore for IdTable<ReqState> {
    #[inline(always)]
    fn exp_entry(&mut self, i: u32) -> &mut ExpEntry {
        match self.get_at_mut(i) {
            Some(r) => &mut r.exp,
            // The invariant of `Reqs`: the queues only hold slots of requests in the table.
            None => unreachable!("a posted receive's slot {i} is vacant"),
        }
    }
}

/// The less common parts of a request.
#[derive(Default)]
pub(crate) struct ReqExt {
    pub callback: Option<Callback>,
    pub waker: Option<Waker>,
    /// A buffer the worker holds for a future until the transport is done with it.
    pub owned: Option<Box<dyn Any + Send>>,
}

impl ReqState {
    #[inline]
    pub fn new(kind: ReqKind, callback: Option<Callback>, cb_fn: Option<(CallbackFn, usize)>, released: bool) -> Self {
        ReqState {
            kind,
            exp: ExpEntry::NONE,
            status: Status::InProgress,
            info: RecvInfo::default(),
            released,
            cb_fn,
            ext: callback.map(|cb| Box::new(ReqExt { callback: Some(cb), ..Default::default() })),
        }
    }

    /// True when dropping this state would free nothing: no extension, no zero-copy state (a
    /// [`Buf`] owns nothing). A field added to the request that owns memory must be checked
    /// here too (else it leaks when a completed request is freed on the fast path).
    #[inline(always)]
    pub fn owns_nothing(&self) -> bool {
        self.ext.is_none()
            && match &self.kind {
                ReqKind::Recv(r) => r.zc.is_none(),
                ReqKind::Send(s) => s.zc.is_none(),
                ReqKind::Close(_) | ReqKind::Done => true,
            }
    }

    /// The extension, created on first use.
    pub fn ext_mut(&mut self) -> &mut ReqExt {
        self.ext.get_or_insert_with(Default::default)
    }

    /// Takes the callback, waker and owned buffer out.
    pub fn take_ext(&mut self) -> (Option<Callback>, Option<Waker>, Option<Box<dyn Any + Send>>) {
        match self.ext.take() {
            Some(e) => {
                let e = *e;
                (e.callback, e.waker, e.owned)
            }
            None => (None, None, None),
        }
    }
}

/// A handle to an operation in progress (`void *request`). Dropping it is `ucp_request_free`:
/// the operation continues and its callback still runs.
pub struct Request<'w> {
    pub(crate) worker: &'w crate::Worker,
    pub(crate) id: Id,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("id", &self.id).field("status", &self.status()).finish()
    }
}

impl<'w> Request<'w> {
    /// `InProgress` while running, then the final status (`ucp_request_check_status`).
    #[inline]
    pub fn status(&self) -> Status {
        self.worker.request_status(self.id).0
    }

    /// True once completed.
    #[inline]
    pub fn is_completed(&self) -> bool {
        self.status() != Status::InProgress
    }

    /// For receives: what arrived (`ucp_tag_recv_request_test`); `None` while in progress.
    pub fn recv_info(&self) -> Option<RecvInfo> {
        let (s, info) = self.worker.request_status(self.id);
        (s != Status::InProgress).then_some(info)
    }

    /// Cancels the operation if it has not progressed too far (`ucp_request_cancel`): a posted
    /// receive not yet matched completes with `Canceled`.
    pub fn cancel(&self) {
        self.worker.request_cancel(self.id);
    }

    /// Progresses the worker until the request completes; returns its outcome.
    pub fn wait(self) -> Result<RecvInfo, Status> {
        loop {
            let (s, info) = self.worker.request_status(self.id);
            match s {
                Status::InProgress => {
                    self.worker.progress();
                }
                Status::Ok => return Ok(info),
                e => return Err(e),
            }
        }
    }

    /// The worker-wide id (for logs).
    pub fn id(&self) -> u64 {
        self.id.raw()
    }
}

impl Drop for Request<'_> {
    #[inline]
    fn drop(&mut self) {
        self.worker.request_release(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_state_stays_small() {
        // Every posted receive and queued send is one of these, written into the request table:
        // rarely used parts stay boxed. A posted receive's queue entry (40 bytes) is part of it.
        assert!(std::mem::size_of::<ReqState>() <= 200, "{}", std::mem::size_of::<ReqState>());
    }

    #[test]
    fn iov_buffers_read_the_callers_list_in_place() {
        let mut bytes = [0u8; 64];
        let p = bytes.as_mut_ptr();
        // Longer than any fixed-size copy would hold: still read in place, nothing allocated.
        let list: Vec<IoVec> = (0..20).map(|i| IoVec { buffer: p.wrapping_add(i * 3), length: 2 }).collect();
        // SAFETY: `list` outlives `buf`, unchanged.
        let buf = unsafe { Buf::iov(&list) };
        assert!(std::ptr::eq(buf.segs().as_ptr().cast::<IoVec>(), list.as_ptr()));
        assert_eq!((buf.len(), buf.contig().is_none()), (40, true));
        let data: Vec<u8> = (1..=40).collect();
        // SAFETY: every piece lies within `bytes`, alive and not otherwise borrowed here.
        unsafe { buf.copy_in(0, &data) };
        assert_eq!(&bytes[..6], &[1, 2, 0, 3, 4, 0]);
        assert_eq!(&bytes[57..60], &[39, 40, 0]);
    }

    #[test]
    fn iov_copies_span_segments() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 0];
        let mut c = [0u8; 5];
        let list: Vec<IoVec> = [a.as_mut_ptr(), b.as_mut_ptr(), c.as_mut_ptr()]
            .into_iter()
            .zip([3, 0, 5])
            .map(|(buffer, length)| IoVec { buffer, length })
            .collect();
        // SAFETY: `list` outlives `buf`, unchanged.
        let buf = unsafe { Buf::iov(&list) };
        assert_eq!(buf.len(), 8);
        // SAFETY: the segments are the three arrays above, alive for the whole test.
        unsafe {
            buf.copy_in(0, &[1, 2, 3, 4, 5, 6, 7, 8]);
            buf.copy_in(2, &[9, 9]);
            let mut out = [0u8; 5];
            buf.copy_out(1, &mut out);
            assert_eq!(out, [2, 9, 9, 5, 6]);
        }
        assert_eq!((a, c), ([1, 2, 9], [9, 5, 6, 7, 8]));
    }
}
