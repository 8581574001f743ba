//! Remote memory access and atomics emulated over active messages (UCX's `rma_sw.c`,
//! `amo_sw.c`): for memory no lane of the endpoint reaches itself (a transport without
//! put/get/atomics, such as ud; atomics on user memory over cma; or an atomic lane that lacks
//! some operation, which would otherwise update one location by two mechanisms).
//!
//! The origin's half lives here: its puts go as data messages and complete locally once sent;
//! gets and fetching atomics wait for the target's replies. The target applies puts and
//! atomics to its own memory in the driver (`core/rma_target.rs`), after checking that the
//! peer named memory this worker mapped; this file queues the pieces of its get replies, and
//! answers flushes: a flush of an endpoint that sent emulated operations ends with a flush
//! message, which the target answers after everything before it (same lane, in order), with
//! the first error it met meanwhile.

use ucs::idtable::Id;
use ucs::Status;

use crate::engine::{EpState, Lane};
use crate::engine::{Next, Reply, Shared, Step, TxOf, TxOp, TxResult, TxStatus};
use crate::proto::select::RmaOpKind;
use crate::request::{ReqKind, ReqState};
use crate::wire::rma::{AmoRep, FlushMsg, GetRep};
use crate::wire::Ctrl;

/// A get the target answers: pieces of `[addr, addr + len)` of region `mem` (the driver's
/// table) to the origin's request `rreq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GetReply {
    pub rreq: u64,
    pub addr: u64,
    pub len: u64,
    /// Bytes sent so far.
    pub offset: u64,
    pub mem: Id,
}

/// The next piece of get reply `g` (`None`: all of it went).
pub(crate) fn reply_next<L>(ep: &EpState<L>, g: &GetReply) -> Option<TxOp> {
    if g.offset >= g.len {
        return None;
    }
    let room = ep.cfg.bcopy_max.saturating_sub(20).max(1) as u64;
    let n = (g.len - g.offset).min(room);
    Some(TxOp::RmaGetData { reply: *g, len: n as usize })
}

impl<L: Clone> Shared<L> {
    /// The driver sent (or could not send) a piece of the get reply at the front of `id`'s
    /// queue.
    pub(crate) fn reply_done(&mut self, id: Id, len: usize, res: TxResult) -> Step {
        let Some(ep) = self.eps.get_mut(id) else { return Step::Finished };
        let Some(Reply::Get(g)) = ep.reply_q.front_mut() else { return Step::Finished };
        match res.status {
            TxStatus::NoResource => Step::Blocked,
            TxStatus::Done | TxStatus::Started => {
                g.offset += len as u64;
                if g.offset >= g.len {
                    Step::Finished
                } else {
                    Step::More
                }
            }
            // The driver sent the refusal instead (the region went), or the lane failed.
            TxStatus::Failed(_) => Step::Finished,
        }
    }

    /// A peer asked for `len` bytes at `addr` (in region `mem`, checked by the driver) for its
    /// request `rreq`, over endpoint `id`.
    pub(crate) fn rma_get_reply(&mut self, id: Id, rreq: u64, addr: u64, len: u64, mem: Id) {
        self.enqueue_reply(id, Reply::Get(GetReply { rreq, addr, len, offset: 0, mem }));
    }

    /// The target refused a peer's emulated operation on endpoint `id` (the driver logged
    /// why): the peer's next flush reports it.
    pub(crate) fn rma_target_error(&mut self, id: Id, status: Status) {
        if let Some(ep) = self.eps.get_mut(id) {
            ep.sw_error.get_or_insert(status);
        }
    }

    /// A peer's emulated fetching atomic got `value` (or was refused with `status`): the reply
    /// goes back over endpoint `id`.
    pub(crate) fn rma_amo_reply(&mut self, id: Id, rreq: u64, value: u64, status: Status) {
        self.send_reply(id, Ctrl::AmoRep(AmoRep { rreq, value, status }));
    }

    /// The emulated-operations phase of a flush: the flush message to send, if the endpoint
    /// sent emulated operations since its last flush.
    pub(crate) fn sw_flush_next(ep: &mut EpState<L>) -> Option<Next> {
        if !ep.sw_unacked {
            return None;
        }
        let msg = FlushMsg { reply: false, ep: ep.remote_id, status: Status::Ok };
        Some(Next::Tx(Lane::Am, TxOp::Ctrl(Ctrl::RmaFlush(msg)), TxOf::Flush))
    }
}

/// The RMA request a peer's reply names, if it is a live emulated operation of the right
/// kind (`get`: a get; else a fetching atomic).
fn req_of<L>(sh: &mut Shared<L>, raw: u64, get: bool, what: &str) -> Option<Id> {
    let id = Id::from_raw(raw);
    let ok = match sh.reqs.tab.get(id) {
        Some(ReqState { kind: ReqKind::Rma(r), status: Status::InProgress, .. }) => match r.kind {
            RmaOpKind::Get => get,
            RmaOpKind::Amo { fetch: true, .. } => !get,
            _ => false,
        },
        _ => false,
    };
    if !ok {
        tracing::warn!("{what}: no such operation {raw:#x} waits; dropped");
    }
    ok.then_some(id)
}

/// A piece of an emulated get's data arrived (or the target's refusal).
pub(crate) fn on_get_rep<L: Clone>(sh: &mut Shared<L>, h: GetRep, payload: &[u8]) {
    let Some(rid) = req_of(sh, h.rreq, true, "rma get reply") else { return };
    let Some(ReqState { kind: ReqKind::Rma(r), .. }) = sh.reqs.tab.get_mut(rid) else { return };
    let status = if h.status.is_err() {
        Some(h.status)
    } else {
        let end = usize::try_from(h.offset).ok().and_then(|o| o.checked_add(payload.len()));
        match end {
            Some(e) if e <= r.buf.len() => {
                // Bounds checked: it lands in the request's own buffer.
                let _ = r.buf.copy_in(h.offset as usize, payload);
                r.offset += payload.len();
                (r.offset >= r.buf.len()).then_some(Status::Ok)
            }
            _ => {
                tracing::warn!(
                    "rma get reply: {} bytes at {} past the {}-byte request",
                    payload.len(),
                    h.offset,
                    r.buf.len()
                );
                Some(Status::InvalidParam)
            }
        }
    };
    if let Some(st) = status {
        r.inflight = 0;
        sh.finish(rid, st);
    }
}

/// The old value of an emulated fetching atomic arrived (or the target's refusal).
pub(crate) fn on_amo_rep<L: Clone>(sh: &mut Shared<L>, h: AmoRep) {
    let Some(rid) = req_of(sh, h.rreq, false, "atomic reply") else { return };
    let Some(ReqState { kind: ReqKind::Rma(r), .. }) = sh.reqs.tab.get_mut(rid) else { return };
    let st = if !h.status.is_err() {
        let bytes = h.value.to_ne_bytes();
        let n = r.buf.len().min(8);
        // The value's low bytes, in the machine's order (both ends are this machine's kind).
        let src = if cfg!(target_endian = "little") { &bytes[..n] } else { &bytes[8 - n..] };
        r.buf.copy_in(0, src).err().unwrap_or(Status::Ok)
    } else {
        h.status
    };
    r.inflight = 0;
    sh.finish(rid, st);
}

/// A flush message arrived: a request is answered with the first error since the last one;
/// a reply ends the waiting flush of its endpoint.
pub(crate) fn on_flush<L: Clone>(sh: &mut Shared<L>, h: FlushMsg) {
    let what = if h.reply { "rma flush reply" } else { "rma flush" };
    let Some(id) = sh.ep_from_wire(h.ep, what) else { return };
    if h.reply {
        sh.flush_lane_complete(id, h.status);
        return;
    }
    let Some(ep) = sh.eps.get_mut(id) else { return };
    let status = ep.sw_error.take().unwrap_or(Status::Ok);
    let reply = FlushMsg { reply: true, ep: ep.remote_id, status };
    sh.send_reply(id, Ctrl::RmaFlush(reply));
}
