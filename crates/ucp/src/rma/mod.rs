//! Remote memory access and atomics (UCX's `src/ucp/rma`), the engine's half: the state of an
//! operation that did not complete at once, how the queue of its endpoint serves it, and
//! flushes and fences.
//!
//! An operation starts in the driver (`core/rma.rs`), which resolves the remote key, checks
//! the bounds and asks [`select_rma`](crate::proto::select::select_rma) for the route. A
//! short or single-piece put, or a post atomic, on a ready endpoint goes straight to the
//! transport. Everything else - a get, a fetching atomic, a transfer in several pieces, an
//! endpoint still wiring up or with operations queued - becomes an [`RmaReq`] queued on the
//! endpoint ([`Pending::Rma`]): in order with everything else the endpoint sends, so a put
//! after a tag send, or after an earlier put, never overtakes it. Its pieces go out as
//! transmissions like any other ([`next`], [`done`]); pieces the transport completes later
//! report through a completion ([`zc_done`]).
//!
//! Flush ([`flush`]) waits in the same queue: once everything before it went out, the driver
//! flushes each lane of the endpoint in turn, which completes what the transports still hold.
//! A fence is a flush without a request on every endpoint that did remote memory access since
//! the last one: what comes after waits for what came before to complete.

use ucs::idtable::Id;
use ucs::Status;

use crate::dt::UserBuf;
use crate::engine::{EpState, Lane, Next, Pending, Shared, Step, TxOf, TxOp, TxResult, TxStatus, ZcDone};
use crate::proto::select::{RmaOpKind, RmaProto, RmaRoute};
use crate::request::{ReqKind, ReqState, Reqs};

pub(crate) mod flush;
pub(crate) mod sw;

/// An atomic's operands: the value, and for a compare-and-swap the value compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AmoArgs {
    pub value: u64,
    pub compare: u64,
}

/// A remote memory access or atomic in flight.
#[derive(Debug)]
pub(crate) struct RmaReq {
    pub ep: Id,
    pub kind: RmaOpKind,
    /// Local memory: the source of a put, the destination of a get, the result of a fetching
    /// atomic (4 or 8 bytes).
    pub buf: UserBuf,
    /// Remote address of the first byte.
    pub remote: u64,
    /// The remote key (the driver's table).
    pub rkey: Id,
    pub route: RmaRoute,
    pub amo: AmoArgs,
    /// Bytes handed to the transport so far; for an emulated get, once its request went, bytes
    /// of the target's replies arrived.
    pub offset: usize,
    /// Pieces the transport has not completed yet.
    pub inflight: u32,
    /// The first error a piece completed with.
    pub error: Option<Status>,
    /// The memory-handle hint of the operation.
    pub hint: Option<Id>,
}

impl RmaReq {
    /// Total bytes the operation moves.
    #[inline]
    pub fn total(&self) -> usize {
        match self.kind {
            RmaOpKind::Amo { .. } => 0,
            _ => self.buf.len(),
        }
    }
}

/// What a transmission of an RMA operation is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RmaTx {
    pub kind: RmaOpKind,
    pub proto: RmaProto,
    pub rkey: Id,
    /// Remote address of the piece.
    pub remote: u64,
    /// Local memory of the whole operation, and the piece of it.
    pub buf: UserBuf,
    pub offset: usize,
    pub len: usize,
    pub amo: AmoArgs,
    pub hint: Option<Id>,
    /// What the completion of a piece the transport finishes later reports.
    pub token: ZcDone,
}

impl<L: Clone> Shared<L> {
    /// Queues RMA operation `req` on its endpoint (a request from `param`); its id.
    pub(crate) fn rma_queue(&mut self, req: RmaReq, param: crate::request::RequestParam, blocked: bool) -> Id {
        let ep = req.ep;
        let released = param.detached;
        let rid = self.reqs.tab.insert(ReqState::new(ReqKind::Rma(req), param.callback, param.callback_fn, released));
        if let Some(e) = self.eps.get_mut(ep) {
            e.rma_dirty = true;
        }
        if blocked {
            self.enqueue_blocked(ep, Pending::Rma(rid));
        } else {
            self.enqueue(ep, Pending::Rma(rid));
        }
        rid
    }

    /// Records an operation the transport took and finishes later (started on the direct
    /// path, not queued); its id.
    pub(crate) fn rma_inflight(&mut self, req: RmaReq, param: crate::request::RequestParam) -> Id {
        let released = param.detached;
        self.reqs.tab.insert(ReqState::new(ReqKind::Rma(req), param.callback, param.callback_fn, released))
    }

    /// Marks endpoint `ep` as having done remote memory access since its last flush (a fence
    /// then waits for it).
    #[inline]
    pub(crate) fn rma_touched(&mut self, ep: Id) {
        if let Some(e) = self.eps.get_mut(ep) {
            e.rma_dirty = true;
        }
    }
}

/// The next piece of RMA request `rid` on endpoint `ep_id`.
pub(crate) fn next<L>(reqs: &mut Reqs, ep: &EpState<L>, rid: Id) -> Next {
    let Some(ReqState { kind: ReqKind::Rma(r), status: Status::InProgress, .. }) = reqs.tab.get(rid) else {
        return Next::Nothing;
    };
    let total = r.total();
    let is_amo = matches!(r.kind, RmaOpKind::Amo { .. });
    // An atomic is one piece; a transfer has pieces left while `offset < total` (an empty
    // one never queues: it completes at once).
    if (is_amo && r.offset > 0) || (!is_amo && r.offset >= total) {
        return Next::Nothing;
    }
    let mut len = if is_amo { 0 } else { (total - r.offset).min(r.route.piece) };
    if r.route.proto == RmaProto::Sw {
        return sw_next(r, ep, rid, len);
    }
    if r.route.proto == RmaProto::Zcopy || (r.kind == RmaOpKind::Get && r.route.proto == RmaProto::Bcopy) {
        // The transport writes one contiguous run per operation.
        len = len.min(r.buf.run_at(r.offset).map_or(len, |s| s.len));
    }
    let tx = RmaTx {
        kind: r.kind,
        proto: r.route.proto,
        rkey: r.rkey,
        remote: r.remote.wrapping_add(r.offset as u64),
        buf: r.buf,
        offset: r.offset,
        len,
        amo: r.amo,
        hint: r.hint,
        token: ZcDone::Rma { rid },
    };
    Next::Tx(Lane::Uct(r.route.lane), TxOp::Rma(tx), TxOf::Req { rid, offset: r.offset, len })
}

/// The next message of emulated operation `r` (request `rid`): a piece of a put, or the
/// request of a get or an atomic.
fn sw_next<L>(r: &RmaReq, ep: &EpState<L>, rid: Id, len: usize) -> Next {
    use crate::wire::rma::{AmoReq, GetReq, PutHdr};
    use crate::wire::{Ctrl, DataHdr};
    let of = TxOf::Req { rid, offset: r.offset, len };
    let op = match r.kind {
        RmaOpKind::Put => TxOp::Bcopy {
            hdr: DataHdr::RmaPut(PutHdr { ep: ep.remote_id, addr: r.remote.wrapping_add(r.offset as u64) }),
            data: r.buf,
            offset: r.offset,
            len,
        },
        RmaOpKind::Get => TxOp::Ctrl(Ctrl::RmaGet(GetReq {
            ep: ep.remote_id,
            rreq: rid.raw(),
            addr: r.remote,
            len: r.total() as u64,
        })),
        RmaOpKind::Amo { op, fetch, size } => TxOp::Ctrl(Ctrl::Amo(AmoReq {
            ep: ep.remote_id,
            rreq: rid.raw(),
            addr: r.remote,
            value: r.amo.value,
            compare: r.amo.compare,
            op,
            size,
            fetch,
        })),
    };
    let of = if r.kind == RmaOpKind::Get { TxOf::Req { rid, offset: 0, len: r.total() } } else { of };
    Next::Tx(Lane::Am, op, of)
}

/// The driver made (or could not make) piece `[offset, offset + len)` of RMA request `rid`.
pub(crate) fn done<L: Clone>(sh: &mut Shared<L>, rid: Id, offset: usize, len: usize, res: TxResult) -> Step {
    let Some(ReqState { kind: ReqKind::Rma(r), status: Status::InProgress, .. }) = sh.reqs.tab.get_mut(rid) else {
        return Step::Finished;
    };
    let sw = r.route.proto == RmaProto::Sw;
    // An emulated get or fetching atomic waits for the target's reply once its request went.
    let waits = sw && matches!(r.kind, RmaOpKind::Get | RmaOpKind::Amo { fetch: true, .. });
    match res.status {
        TxStatus::NoResource => return Step::Blocked,
        TxStatus::Failed(e) => {
            r.error.get_or_insert(e);
            // Pieces in flight still report; the request completes after the last of them.
            r.offset = usize::MAX;
        }
        TxStatus::Done | TxStatus::Started if waits => {
            // The reply completes it; `offset` now counts the bytes of the replies.
            r.inflight = 1;
            r.offset = 0;
            return Step::Finished;
        }
        TxStatus::Done => r.offset = offset + len.max(1),
        TxStatus::Started => {
            r.inflight += 1;
            r.offset = offset + len.max(1);
        }
    }
    let finished = r.offset >= r.total();
    if sw && !waits && res.status == TxStatus::Done {
        // Applied by the peer later: a flush waits for its answer.
        let ep = r.ep;
        if let Some(e) = sh.eps.get_mut(ep) {
            e.sw_unacked = true;
        }
    }
    let Some(ReqState { kind: ReqKind::Rma(r), .. }) = sh.reqs.tab.get_mut(rid) else { return Step::Finished };
    if finished && r.inflight == 0 {
        let status = r.error.unwrap_or(Status::Ok);
        sh.finish(rid, status);
    }
    if finished {
        Step::Finished
    } else {
        Step::More
    }
}

/// A piece of RMA request `rid` that the transport finished later completed with `status`.
pub(crate) fn zc_done<L: Clone>(sh: &mut Shared<L>, rid: Id, status: Status) {
    let Some(ReqState { kind: ReqKind::Rma(r), status: Status::InProgress, .. }) = sh.reqs.tab.get_mut(rid) else {
        return;
    };
    r.inflight = r.inflight.saturating_sub(1);
    if status.is_err() {
        r.error.get_or_insert(status);
    }
    if r.inflight == 0 && r.offset >= r.total() {
        let status = r.error.unwrap_or(Status::Ok);
        sh.finish(rid, status);
    }
}
