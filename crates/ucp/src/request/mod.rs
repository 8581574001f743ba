//! Requests (`ucp_request_param_t`, `ucs_status_ptr_t`) in Rust form, and the state the
//! engine keeps for each.
//!
//! * An operation that completes at once returns without a request (unless
//!   [`RequestFlags::NO_IMM_CMPL`]); the callback is then not called, as in UCX.
//! * Otherwise it returns a [`Request`](crate::Request): poll [`Request::status`](crate::Request::status), wait on it, or let the
//!   callback run. Dropping a `Request` is `ucp_request_free`: the operation goes on and the
//!   callback still fires.
//! * The raw operations take pointers and are `unsafe` (the buffer must outlive the request).
//!   The safe ones are futures over owned buffers ([`crate::SendFuture`], [`crate::RecvFuture`]):
//!   the buffer lives inside the worker until the transport is done with it, so dropping the
//!   future of a pending receive cancels it and data never lands in memory the caller owns again.
//!
//! Files: `param` (what the user passes), `complete` (how a
//! request completes: callbacks and wakers run outside the engine); the state itself is here.
//! The handle itself is the API's (`crate::worker`).

use std::any::Any;
use std::task::Waker;

use ucs::idtable::{Id, IdTable};
use ucs::mpool::{ObjPool, PoolBox};
use ucs::Status;

use crate::dt::UserBuf;
use crate::proto::select::Proto;
use crate::tag::matcher::{ExpEntry, ExpQueues, ExpStore, Tag};

pub(crate) mod complete;
mod param;

pub use crate::dt::IoVec;
pub use param::{Callback, CallbackFn, RecvInfo, RequestFlags, RequestParam};

/// Progress of a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendPhase {
    /// Not started (queued behind wireup or other sends).
    Queued,
    /// Eager fragments sent up to `offset`.
    Frags { offset: usize, msg_id: u64 },
    /// Eager zero-copy fragments posted up to `offset` (`msg_id` of a multi-fragment message);
    /// the request's zero-copy state counts those in flight.
    Zcopy { offset: usize, msg_id: u64 },
    /// All data sent; waiting for the sync ack.
    WaitAck,
    /// RTS queued or sent; waiting for ATS or RTR.
    Rts { sent: bool },
    /// Putting the data (put_zcopy scheme; the target in the zero-copy state); ATP follows.
    Put { started: bool },
    /// Sending AM fragments to receive request `rreq` from `offset`.
    RndvFrags { rreq: u64, offset: usize },
}

/// A rendezvous request to send, as received.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rts {
    /// The receiver's endpoint to the sender (as the sender's header names it).
    pub ep: u64,
    /// The sender's request.
    pub sreq: u64,
    pub size: usize,
    /// The sender's buffer and key (empty: no get).
    pub addr: u64,
    pub rkey: uct::PackedKey,
    /// The sender's buffer is contiguous.
    pub contig: bool,
}

impl From<crate::wire::RtsHdr> for Rts {
    fn from(h: crate::wire::RtsHdr) -> Rts {
        Rts { ep: h.ep, sreq: h.sreq, size: h.size, addr: h.addr, rkey: h.rkey, contig: h.contig }
    }
}

/// Where the receiver asked the data to be put.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PutTarget {
    pub addr: u64,
    pub rkey: uct::PackedKey,
    /// The receiver's request (the ATP names it).
    pub rreq: u64,
}

/// What a send carries besides its data: it decides the headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendMsg {
    /// A tagged message (`ucp_tag_send_nbx`).
    Tag(Tag),
    /// An active message (`ucp_am_send_nbx`).
    Am(AmOut),
    /// Bytes of the endpoint's stream (`ucp_stream_send_nbx`).
    Stream,
}

impl SendMsg {
    /// The tag a send's completion reports (0 for an active message).
    #[inline]
    pub fn tag(&self) -> Tag {
        match self {
            SendMsg::Tag(t) => *t,
            SendMsg::Am(_) | SendMsg::Stream => 0,
        }
    }
}

/// An active message's identity: the user's id, whether it names a reply endpoint, and its
/// user header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AmOut {
    pub id: u16,
    pub reply: bool,
    pub hdr: crate::wire::UserHdr,
}

impl AmOut {
    /// The fixed fields of its headers.
    #[inline]
    pub fn word(&self) -> crate::wire::am::AmWord {
        let flags = if self.reply { crate::wire::am::AM_FLAG_REPLY } else { 0 };
        crate::wire::am::AmWord { id: self.id, flags, hdr_len: self.hdr.len() as u32 }
    }
}

/// A [`SendMsg`] as a request keeps it, in 16 bytes (a request stays small): the tag, or an
/// active message's fixed header word and its user header's address (never null: an empty
/// header gets a dangling one), or, for a stream, the address of [`STREAM_MARK`]; the address
/// tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackedMsg {
    word: u64,
    hdr: *const u8,
}

/// What a [`PackedMsg`] of a stream send points at.
static STREAM_MARK: u8 = 0;

impl PackedMsg {
    /// Packs `m`.
    #[inline(always)]
    pub fn new(m: SendMsg) -> PackedMsg {
        match m {
            SendMsg::Tag(tag) => PackedMsg { word: tag, hdr: std::ptr::null() },
            SendMsg::Stream => PackedMsg { word: 0, hdr: &STREAM_MARK },
            SendMsg::Am(a) => {
                let p = a.hdr.0.contig_seg().map_or(std::ptr::null(), |s| s.ptr.cast_const());
                let hdr = if p.is_null() { std::ptr::NonNull::<u8>::dangling().as_ptr().cast_const() } else { p };
                PackedMsg { word: a.word().word(), hdr }
            }
        }
    }

    /// The message.
    #[inline(always)]
    pub fn get(self) -> SendMsg {
        if self.hdr.is_null() {
            return SendMsg::Tag(self.word);
        }
        if std::ptr::eq(self.hdr, &STREAM_MARK) {
            return SendMsg::Stream;
        }
        let len = (self.word >> 32) as usize;
        // SAFETY: the user header the send was given (contiguous), under the promise its
        // `UserBuf` was made with: valid until the send completes.
        let hdr = crate::wire::UserHdr(unsafe { UserBuf::contig(self.hdr.cast_mut(), len) });
        let reply = (self.word >> 16) as u8 & crate::wire::am::AM_FLAG_REPLY != 0;
        SendMsg::Am(AmOut { id: self.word as u16, reply, hdr })
    }
}

/// A send in flight.
#[derive(Debug)]
pub(crate) struct SendReq {
    pub ep: Id,
    pub msg: PackedMsg,
    pub buf: UserBuf,
    /// A synchronous send: complete only once the receiver matched it.
    pub sync: bool,
    /// The receiver's match of a synchronous send was acknowledged.
    pub acked: bool,
    /// The protocol [`select`](crate::proto::select::select) chose.
    pub proto: Proto,
    pub phase: SendPhase,
    /// Zero-copy state (out of line, from the worker's pool: most sends never need it).
    pub zc: Option<PoolBox<ZcState>>,
    /// The memory-handle hint of the operation ([`SendReq::hint`]).
    pub hint_id: Option<Id>,
}

impl SendReq {
    /// The memory-handle hint.
    #[inline]
    pub fn hint(&self) -> Option<Id> {
        self.hint_id
    }
}

/// State of zero-copy protocols: a registration, the matched RTS, a put's target, the
/// fragments in flight.
#[derive(Debug, Default)]
pub(crate) struct ZcState {
    /// Registration of the local buffer (kept until the operation completes).
    pub memh: Option<uct::MemH>,
    /// The matched rendezvous request (receiver).
    pub rts: Option<Rts>,
    /// Where the receiver asked the data to be put (sender).
    pub put: Option<PutTarget>,
    /// Eager zero-copy fragments posted and not yet completed.
    pub inflight: u32,
    /// A rendezvous get or put on the request's buffer is in flight.
    pub rma: bool,
    /// The first error a zero-copy fragment completed with.
    pub error: Option<Status>,
    /// An offloaded rendezvous's operation in the transport (sender), until its FIN or until
    /// software at the receiver answered instead (then it is cancelled).
    pub tm_op: Option<u64>,
}

impl ZcState {
    /// Whether a transport may still access the request's buffer.
    #[inline]
    pub fn busy(&self) -> bool {
        self.inflight > 0 || self.rma
    }
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
    pub buf: UserBuf,
    /// Bytes arrived so far (multi-fragment eager, rendezvous fragments).
    pub received: usize,
    /// Length of the matched message.
    pub total: usize,
    /// Zero-copy rendezvous state (from the worker's pool).
    pub zc: Option<PoolBox<ZcState>>,
    /// The sender's sync request to acknowledge when complete: (endpoint, request).
    pub sync: Option<(u64, u64)>,
    /// Set when the message was longer than the buffer; the data is dropped.
    pub truncated: bool,
    /// The memory-handle hint of the operation.
    pub hint: Option<Id>,
}

impl RecvReq {
    /// A receive into `buf`, nothing arrived yet.
    #[inline(always)]
    pub fn new(buf: UserBuf, hint: Option<Id>) -> RecvReq {
        RecvReq { buf, received: 0, total: 0, zc: None, sync: None, truncated: false, hint }
    }
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
    /// Remote memory access or atomic.
    Rma(crate::rma::RmaReq),
    /// Flush of an endpoint or the worker.
    Flush(crate::rma::flush::FlushReq),
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
    /// The operation's generic datatype state (`UserBuf::generic`): kept until the request
    /// completes, then dropped outside the engine (the user's `finish`).
    pub dt: Option<std::rc::Rc<crate::dt::GenState>>,
}

impl ReqState {
    /// A request of `kind`; one over a generic datatype's buffer takes a reference to its
    /// state (kept until it completes).
    #[inline]
    pub fn new(kind: ReqKind, callback: Option<Callback>, cb_fn: Option<(CallbackFn, usize)>, released: bool) -> Self {
        let dt = match &kind {
            ReqKind::Send(s) => s.buf.generic_ref(),
            ReqKind::Recv(r) => r.buf.generic_ref(),
            _ => None,
        };
        let ext = if callback.is_some() || dt.is_some() {
            Some(Box::new(ReqExt { callback, dt, ..Default::default() }))
        } else {
            None
        };
        ReqState {
            kind,
            exp: ExpEntry::NONE,
            status: Status::InProgress,
            info: RecvInfo::default(),
            released,
            cb_fn,
            ext,
        }
    }

    /// True when dropping this state would free nothing: no extension, no zero-copy state (a
    /// [`UserBuf`] owns nothing). A field added to the request that owns memory must be checked
    /// here too (else it leaks when a completed request is freed on the fast path).
    #[inline(always)]
    pub fn owns_nothing(&self) -> bool {
        self.ext.is_none()
            && match &self.kind {
                ReqKind::Recv(r) => r.zc.is_none(),
                ReqKind::Send(s) => s.zc.is_none(),
                ReqKind::Close(_) | ReqKind::Rma(_) | ReqKind::Flush(_) | ReqKind::Done => true,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_state_stays_small() {
        // Every posted receive and queued send is one of these, written into the request table:
        // rarely used parts stay boxed. A posted receive's queue entry (40 bytes) is part of it.
        // 208 since active messages: a send's message identity (`PackedMsg`) takes 16 bytes.
        // (Keeping it at 200 by packing the memory-handle hint into 8 bytes moved the enum's
        // niche and cost 30 instructions per 8-byte `tag_lat` iteration, `ucx-perf -l` over
        // `self` under callgrind.)
        let n = std::mem::size_of::<ReqState>();
        assert!(n <= 208, "{n}");
    }
}
