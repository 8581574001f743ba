//! Transmissions: what the engine asks the driver to send, and what the driver reports back.
//!
//! The engine keeps, per endpoint, a queue of what waits to go out ([`Pending`]). The driver
//! pulls one transmission at a time ([`Shared::next_tx`](super::Shared::next_tx)), makes it
//! with the transport - without holding the engine, since a loop-back transport delivers inside
//! the send call - and reports the outcome
//! ([`Shared::tx_done`](super::Shared::tx_done)); the engine then advances the operation,
//! gives a refused message back to the queue, or fails the operation.

use ucs::idtable::Id;
use ucs::Status;

use crate::dt::{Seg, UserBuf};
use crate::proto::select::RtsOffer;
use crate::wire;
use crate::wire::{Ctrl, DataHdr};

/// Which lane of an endpoint a transmission uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Active messages: eager data, protocol control.
    Am,
    /// Wireup messages (the AM lane, unless that one connects endpoint to endpoint).
    Wireup,
    /// Rendezvous zero-copy operations.
    Rndv,
    /// Tagged sends through the transport's tag matching (the AM lane if the endpoint has no
    /// tag lane).
    Tag,
    /// The endpoint's transport endpoint of this index (remote memory access, atomics,
    /// flush).
    Uct(u8),
}

/// A zero-copy operation's completion, reported with
/// [`Shared::zc_done`](super::Shared::zc_done) when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZcDone {
    /// An eager zero-copy fragment of send `rid`.
    EagerFrag { rid: Id },
    /// The rendezvous get of receive `rid`; the ATS goes to `sreq` over `ep`.
    Get { ep: Id, rid: Id, sreq: u64 },
    /// The rendezvous put of send `sreq`; the ATP goes to `rreq` over `ep`.
    Put { ep: Id, sreq: Id, rreq: u64 },
    /// A piece of remote memory access or an atomic of request `rid`.
    Rma { rid: Id },
    /// The flush of the current lane of endpoint `ep`.
    Flush { ep: Id },
    /// The offloaded rendezvous of send `rid` (the receiver's transport read the data and
    /// sent its FIN, or it failed).
    TagRndv { rid: Id },
}

/// Memory a transmission exposes or uses zero-copy: the user buffer (what a registration
/// covers), the registration the operation already holds, and the operation's memory-handle
/// hint.
#[derive(Clone, Debug)]
pub(crate) struct Mem {
    pub seg: Seg,
    pub memh: Option<uct::MemH>,
    pub hint: Option<Id>,
}

/// What to send.
#[derive(Debug)]
pub(crate) enum TxOp {
    /// `am_short(id, hdr, data)`: a whole eager message (the tag as header) or active message
    /// (its fixed fields as header).
    Short { id: u8, hdr: u64, data: UserBuf },
    /// `am_bcopy`: the header, then `len` bytes of `data` from `offset`.
    Bcopy { hdr: DataHdr, data: UserBuf, offset: usize, len: usize },
    /// `am_bcopy` of a control message.
    Ctrl(Ctrl),
    /// The RTS of a rendezvous: register `mem` on the rendezvous lane as `offer` says (and
    /// pack the key into the header), then `am_bcopy`; with `user`, an active message's RTS
    /// (the header's tag holds its fixed fields) followed by its user header.
    Rts { hdr: wire::RtsHdr, offer: RtsOffer, mem: Option<Mem>, user: Option<wire::UserHdr> },
    /// The RTR of a rendezvous: register `mem` on the rendezvous lane and pack its key into the
    /// header (the put scheme; without `mem`, fragments), then `am_bcopy`.
    Rtr { hdr: wire::RtrHdr, mem: Option<Mem> },
    /// `am_zcopy` of bytes `[offset, offset + len)` of `mem` after the header (registering the
    /// whole of `mem` if the operation holds no registration yet); the completion reports
    /// `token`.
    AmZcopy { hdr: DataHdr, mem: Mem, offset: usize, len: usize, token: ZcDone },
    /// `get_zcopy` into `mem` from `remote` with the packed key `rkey` (on the rendezvous lane).
    Get { mem: Mem, remote: u64, rkey: uct::PackedKey, token: ZcDone },
    /// `put_zcopy` from `mem` to `remote` with the packed key `rkey` (on the rendezvous lane).
    Put { mem: Mem, remote: u64, rkey: uct::PackedKey, token: ZcDone },
    /// A piece of remote memory access, or an atomic (on the transmission's lane).
    Rma(crate::rma::RmaTx),
    /// Flush the transmission's lane; the completion reports `token`.
    Flush { token: ZcDone },
    /// `len` bytes of an emulated get's reply, from the target's mapped memory (the driver
    /// checks the region is still mapped, else sends the refusal).
    RmaGetData { reply: crate::rma::sw::GetReply, len: usize },
    /// An offloaded rendezvous through the tag lane (`tag_rndv_zcopy`): `hdr` for software
    /// at the receiver, the data in `mem` (registered on the tag lane), read by the receiver's
    /// transport; the completion (its FIN) reports `token`, the started operation comes back
    /// in [`TxResult::tm_op`].
    TagRndv { tag: crate::tag::Tag, hdr: wire::OffloadRndvHdr, mem: Mem, token: ZcDone },
}

/// What a transmission advances, so the engine can check it still applies when it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxOf {
    /// A message of the wireup queue.
    Wireup,
    /// A control message of the data queue.
    Ctrl,
    /// A control message of the reply queue ([`EpState::reply_q`](super::EpState::reply_q)).
    ReplyCtrl,
    /// The front operation of the data queue: request `rid`'s piece `[offset, offset + len)`.
    Req { rid: Id, offset: usize, len: usize },
    /// The flush (or fence) at the front of the data queue.
    Flush,
    /// A piece of the get reply at the front of the reply queue.
    Reply,
}

/// One transmission: the endpoint's lanes (the driver's), which lane, what to send, and what
/// it advances.
#[derive(Debug)]
pub(crate) struct Tx<L> {
    pub io: L,
    pub lane: Lane,
    pub op: TxOp,
    pub of: TxOf,
}

/// How a transmission went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxStatus {
    /// Sent (complete locally).
    Done,
    /// Started; its completion ([`ZcDone`]) fires later.
    Started,
    /// The lane had no resources: nothing was sent.
    NoResource,
    /// Failed.
    Failed(Status),
}

/// The driver's report of a transmission.
#[derive(Debug)]
pub(crate) struct TxResult {
    pub status: TxStatus,
    /// A registration the driver made for the transmission (it belongs to the operation now).
    pub memh: Option<uct::MemH>,
    /// For an RTS or RTR: whether a key went with it.
    pub keyed: bool,
    /// For an offloaded rendezvous: the transport's handle of the operation (to cancel it).
    pub tm_op: Option<u64>,
}

impl TxResult {
    /// A result without registration.
    pub fn of(status: TxStatus) -> TxResult {
        TxResult { status, memh: None, keyed: false, tm_op: None }
    }

    /// The result of a uct operation.
    pub fn from_uct<T>(r: ucs::UcsResult<ucs::Outcome<T>>) -> TxResult {
        TxResult::of(match r {
            Ok(ucs::Outcome::Done(_)) => TxStatus::Done,
            Ok(ucs::Outcome::InProgress) => TxStatus::Started,
            Ok(ucs::Outcome::NoResource) => TxStatus::NoResource,
            Err(e) => TxStatus::Failed(e),
        })
    }
}

/// What the front operation of a queue has for the driver (a return value, consumed at once:
/// its size does not matter).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Next {
    /// A transmission.
    Tx(Lane, TxOp, TxOf),
    /// Nothing now (finished, or waiting for the peer): it leaves the queue.
    Nothing,
    /// Nothing now, and it stays at the front (waiting for a completion).
    Wait,
    /// It cannot go on: fail it with this status.
    Fail(Status),
}

/// What happened to the front operation of a queue after a transmission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// More of it to send.
    More,
    /// It needs nothing more from the queue.
    Finished,
    /// The lane refused; it stays at the front.
    Blocked,
}

/// What the driver does after reporting a transmission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Ask for the next one.
    Continue,
    /// The lane refused: stop, and park the endpoint on `lane` until it has resources.
    Blocked(Lane),
}

/// An operation waiting on an endpoint's queue.
#[derive(Debug)]
pub(crate) enum Pending {
    /// A send request to start or continue.
    Send(Id),
    /// A control message.
    Ctrl(Ctrl),
    /// The RTR of receive request `rid`.
    Rtr(Id),
    /// The rendezvous get of receive request `rid`.
    Get(Id),
    /// The rendezvous put of send request `sreq`.
    Put(Id),
    /// Remote memory access or atomic request `rid`.
    Rma(Id),
    /// A flush or fence.
    Flush(crate::rma::flush::FlushPos),
}

/// What waits in an endpoint's reply queue ([`EpState::reply_q`](super::EpState::reply_q)).
#[derive(Debug)]
pub(crate) enum Reply {
    /// A control message: an answer to the peer, or a direct one a lane refused.
    Ctrl(Ctrl),
    /// The data of a peer's emulated get, in pieces.
    Get(crate::rma::sw::GetReply),
}
