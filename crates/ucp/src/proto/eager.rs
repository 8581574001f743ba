//! Eager protocols, send side: the whole message in one `am_short` or `am_bcopy`, several
//! `am_bcopy` fragments (a first one with the total length, then middle ones), or `am_zcopy`
//! from the user's registered buffer; a synchronous send completes when the receiver's
//! acknowledgement came too. The receive side is the family's: tag matching decides where an
//! eager message goes ([`crate::tag`]).
//!
//! A send request sits at the front of its endpoint's queue while its pieces go out:
//! [`send_next`] describes the next piece for the driver, [`send_done`] advances the
//! request by what the driver reports.

use ucs::idtable::Id;
use ucs::Status;

use super::select::{rts_offer, Proto};
use crate::dt::UserBuf;
use crate::engine::{EpState, Lane, Mem, Next, Shared, Step, TxOf, TxOp, TxResult, TxStatus, ZcDone};
use crate::request::{zc_mut, ReqKind, ReqState, Reqs, SendMsg, SendPhase};
use crate::wire::DataHdr;
use crate::wire::{self, len, Header};

/// The header of a whole eager message: the tag, and for a synchronous send the endpoint and
/// request the receiver acknowledges to; or an active message's fixed fields (with the reply
/// endpoint `rep` when it asks for one) and user header.
#[inline]
pub(crate) fn whole_hdr(msg: SendMsg, sync: bool, rep: u64, sreq: u64) -> DataHdr {
    match msg {
        SendMsg::Tag(tag) if sync => DataHdr::EagerSync(wire::EagerSyncHdr { tag, ep: rep, sreq }),
        SendMsg::Tag(tag) => DataHdr::Eager(wire::EagerHdr { tag }),
        SendMsg::Am(a) => DataHdr::Am(wire::am::AmHdr { w: a.word(), ep: if a.reply { rep } else { 0 } }, a.hdr),
        SendMsg::Stream => DataHdr::Stream(wire::StreamHdr { ep: rep }),
    }
}

/// The header of a whole message sent with `am_short` (which carries 8 bytes of header): the
/// tag, an active message's fixed fields (one without user header or reply endpoint), or a
/// stream's endpoint `rep`.
#[inline]
pub(crate) fn short_hdr(msg: SendMsg, rep: u64) -> DataHdr {
    whole_hdr(msg, false, rep, 0)
}

/// The `am_short` of a whole message with header `hdr` (from [`short_hdr`]) and data `data`;
/// `None` for a header `am_short` cannot carry.
#[inline]
pub(crate) fn short_op(hdr: &DataHdr, data: UserBuf) -> Option<TxOp> {
    match hdr {
        DataHdr::Eager(h) => Some(TxOp::Short { id: wire::AM_EAGER_ONLY, hdr: h.tag, data }),
        DataHdr::Am(h, u) if !h.w.reply() && u.is_empty() => {
            Some(TxOp::Short { id: wire::AM_AM_ONLY, hdr: h.w.word(), data })
        }
        DataHdr::Stream(h) => Some(TxOp::Short { id: wire::AM_STREAM_DATA, hdr: h.ep, data }),
        _ => None,
    }
}

/// Length of the header of a whole eager message.
#[inline]
pub(crate) fn whole_hdr_len(msg: SendMsg, sync: bool) -> usize {
    match msg {
        SendMsg::Tag(_) if sync => len::EAGER_SYNC_ONLY,
        SendMsg::Tag(_) => len::EAGER_ONLY,
        SendMsg::Am(a) => len::AM_ONLY + if a.reply { 8 } else { 0 } + a.hdr.len(),
        SendMsg::Stream => len::STREAM,
    }
}

/// The header of the eager fragment at `offset` of a `total`-byte message: the first one
/// carries the tag or the active message's fields and user header, and the length (and a
/// synchronous send's request), the others the offset.
pub(crate) fn frag_hdr(msg: SendMsg, rep: u64, msg_id: u64, total: usize, offset: usize, sreq: Option<u64>) -> DataHdr {
    let middle = wire::EagerMiddleHdr { ep: rep, msg_id, offset };
    match msg {
        SendMsg::Tag(tag) if offset == 0 => DataHdr::First(wire::EagerFirstHdr { tag, ep: rep, msg_id, total, sreq }),
        SendMsg::Tag(_) => DataHdr::Middle(middle),
        SendMsg::Am(a) if offset == 0 => {
            DataHdr::AmFirst(wire::am::AmFirstHdr { w: a.word(), ep: rep, msg_id, total }, a.hdr)
        }
        SendMsg::Am(_) => DataHdr::AmMiddle(wire::am::AmMiddleHdr(middle)),
        // A stream has no message boundaries: every piece is stream data, in order.
        SendMsg::Stream => DataHdr::Stream(wire::StreamHdr { ep: rep }),
    }
}

/// The length of the piece from `offset` of a `total`-byte message that fits a `max`-byte
/// message after `hdr`; `None` when nothing fits.
#[inline]
pub(crate) fn piece_len(hdr: &DataHdr, total: usize, offset: usize, max: usize) -> Option<usize> {
    let room = max.saturating_sub(hdr.encoded_len());
    let n = (total - offset).min(room);
    (n > 0 || total <= offset).then_some(n)
}

/// The failure of a send whose lane leaves no room for data (logged).
#[cold]
#[inline(never)]
fn no_room(max: usize) -> Next {
    tracing::error!("ucp send: the AM lane's message size {max} leaves no room for data");
    Next::Fail(Status::InvalidParam)
}

/// The lane of a send's whole message or RTS: the tag lane for a tagged send on an endpoint
/// with one ([`EpConfig::tag`]), else the AM lane.
#[inline(always)]
pub(crate) fn tag_lane(cfg: &crate::proto::EpConfig, msg: SendMsg) -> Lane {
    if cfg.tag.is_some() && matches!(msg, SendMsg::Tag(_)) {
        Lane::Tag
    } else {
        Lane::Am
    }
}

/// The next piece of send `rid`, the front operation of endpoint `ep`'s queue.
pub(crate) fn send_next<L>(reqs: &mut Reqs, ep: &EpState<L>, rid: Id) -> Next {
    let Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) = reqs.tab.get_mut(rid) else {
        return Next::Nothing;
    };
    let total = s.buf.len();
    let cfg = &ep.cfg;
    let (rep, sreq) = (ep.remote_id, rid.raw());
    let of = |offset, n| TxOf::Req { rid, offset, len: n };
    // A tagged send's whole message or RTS goes through the tag lane if the endpoint has one.
    let lane = tag_lane(cfg, s.msg.get());
    match s.phase {
        SendPhase::Queued => match s.proto {
            Proto::EagerShort => match short_op(&short_hdr(s.msg.get(), rep), s.buf) {
                Some(op) => Next::Tx(lane, op, of(0, total)),
                None => Next::Fail(Status::InvalidParam),
            },
            Proto::EagerBcopy => {
                let hdr = whole_hdr(s.msg.get(), s.sync, rep, sreq);
                Next::Tx(lane, TxOp::Bcopy { hdr, data: s.buf, offset: 0, len: total }, of(0, total))
            }
            Proto::Rndv => {
                // An active message's RTS carries its fixed fields in the tag's place, and its
                // user header after the RTS.
                let (tag, user) = match s.msg.get() {
                    SendMsg::Tag(tag) => (tag, None),
                    SendMsg::Am(a) => (a.word().word(), Some(a.hdr)),
                    // (A stream never selects rendezvous.)
                    SendMsg::Stream => return Next::Fail(Status::Unsupported),
                };
                let seg = s.buf.contig_seg();
                let offer = rts_offer(cfg, total, seg.is_some());
                let mem = seg.filter(|_| offer.register).map(|seg| Mem {
                    seg,
                    memh: s.zc.as_ref().and_then(|z| z.memh.clone()),
                    hint: s.hint(),
                });
                // Set before the RTS goes: over a loop-back transport the answer arrives
                // inside the send call.
                s.phase = SendPhase::Rts { sent: false };
                if let (Lane::Tag, Some(seg), Some(t)) = (lane, seg, cfg.tag) {
                    if total > 0 && total <= t.hw_rndv_max {
                        // Offloaded: the receiver's transport reads, or its software answers.
                        let hdr = wire::OffloadRndvHdr { ep: rep, sreq, size: total };
                        let mem = Mem { seg, memh: s.zc.as_ref().and_then(|z| z.memh.clone()), hint: s.hint() };
                        let op = TxOp::TagRndv { tag, hdr, mem, token: ZcDone::TagRndv { rid } };
                        return Next::Tx(lane, op, of(0, total));
                    }
                }
                let hdr = wire::RtsHdr {
                    tag,
                    ep: rep,
                    sreq,
                    size: total,
                    addr: s.buf.addr(),
                    contig: seg.is_some(),
                    rkey: uct::PackedKey::new(),
                };
                Next::Tx(lane, TxOp::Rts { hdr, offer, mem, user }, of(0, total))
            }
            // They start in their own phases.
            Proto::EagerMulti | Proto::EagerZcopy => Next::Fail(Status::InvalidParam),
        },
        SendPhase::Frags { offset, msg_id } => {
            let hdr = frag_hdr(s.msg.get(), rep, msg_id, total, offset, s.sync.then_some(sreq));
            let Some(n) = piece_len(&hdr, total, offset, cfg.bcopy_max) else { return no_room(cfg.bcopy_max) };
            Next::Tx(Lane::Am, TxOp::Bcopy { hdr, data: s.buf, offset, len: n }, of(offset, n))
        }
        SendPhase::Zcopy { offset, msg_id } => {
            if offset >= total {
                return Next::Nothing;
            }
            let Some(seg) = s.buf.contig_seg() else { return Next::Fail(Status::InvalidParam) };
            let single = total + whole_hdr_len(s.msg.get(), s.sync) <= cfg.zcopy_max;
            let hdr = if single {
                whole_hdr(s.msg.get(), s.sync, rep, sreq)
            } else {
                frag_hdr(s.msg.get(), rep, msg_id, total, offset, s.sync.then_some(sreq))
            };
            let Some(n) = piece_len(&hdr, total, offset, cfg.zcopy_max) else { return no_room(cfg.zcopy_max) };
            let mem = Mem { seg, memh: s.zc.as_ref().and_then(|z| z.memh.clone()), hint: s.hint() };
            let token = ZcDone::EagerFrag { rid };
            Next::Tx(Lane::Am, TxOp::AmZcopy { hdr, mem, offset, len: n, token }, of(offset, n))
        }
        SendPhase::RndvFrags { rreq, offset } => {
            if offset >= total {
                return Next::Nothing;
            }
            let hdr = DataHdr::RndvData(wire::RndvDataHdr { rreq, offset });
            let Some(n) = piece_len(&hdr, total, offset, cfg.bcopy_max) else { return no_room(cfg.bcopy_max) };
            Next::Tx(Lane::Am, TxOp::Bcopy { hdr, data: s.buf, offset, len: n }, of(offset, n))
        }
        SendPhase::WaitAck | SendPhase::Rts { .. } | SendPhase::Put { .. } => Next::Nothing,
    }
}

/// The driver sent piece `[offset, offset + n)` of send `rid` (`op`), or could not.
pub(crate) fn send_done<L: Clone>(
    sh: &mut Shared<L>,
    rid: Id,
    offset: usize,
    n: usize,
    op: &TxOp,
    res: TxResult,
) -> Step {
    let Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) = sh.reqs.tab.get_mut(rid) else {
        return Step::Finished;
    };
    if let Some(m) = res.memh {
        zc_mut(&sh.zc_pool, &mut s.zc).memh = Some(m);
    }
    let started = match res.status {
        TxStatus::NoResource => {
            if matches!(op, TxOp::Rts { .. } | TxOp::TagRndv { .. }) && s.phase == (SendPhase::Rts { sent: false }) {
                s.phase = SendPhase::Queued;
            }
            return Step::Blocked;
        }
        TxStatus::Failed(e) => {
            sh.finish(rid, e);
            return Step::Finished;
        }
        TxStatus::Done => false,
        TxStatus::Started => true,
    };
    let (total, sync, first) = (s.buf.len(), s.sync, offset == 0);
    let end = offset + n;
    let (msg, ep) = (s.msg.get(), s.ep);
    // Whether the send went through the tag lane (looked up only where it counts).
    let offloaded = |eps: &crate::engine::EpTable<L>| eps.get(ep).is_some_and(|e| tag_lane(&e.cfg, msg) == Lane::Tag);
    match (op, s.phase) {
        (TxOp::Short { .. }, SendPhase::Queued) => {
            sh.counts.eager_short += 1;
            sh.counts.offload_eager += offloaded(&sh.eps) as u64;
            sent_all(sh, rid);
            Step::Finished
        }
        (TxOp::Bcopy { .. }, SendPhase::Queued) => {
            if sync {
                sh.counts.eager_sync += 1;
            } else {
                sh.counts.eager_bcopy += 1;
            }
            if offloaded(&sh.eps) {
                sh.counts.offload_eager += 1;
                if let (true, SendMsg::Tag(tag)) = (sync, msg) {
                    // Its acknowledgement will name the tag, not the request.
                    if let Some(e) = sh.eps.get_mut(ep) {
                        e.offload_syncs.push_back((tag, rid));
                    }
                }
            }
            sent_all(sh, rid);
            Step::Finished
        }
        (TxOp::TagRndv { .. }, phase) => {
            sh.counts.offload_hw_rndv += 1;
            if let Some(op) = res.tm_op {
                zc_mut(&sh.zc_pool, &mut s.zc).tm_op = Some(op);
            }
            if phase == (SendPhase::Rts { sent: false }) {
                s.phase = SendPhase::Rts { sent: true };
            }
            Step::Finished
        }
        (TxOp::Rts { .. }, phase) => {
            sh.counts.offload_sw_rndv += offloaded(&sh.eps) as u64;
            // The answer may have come during the send, and moved the phase on.
            if phase == (SendPhase::Rts { sent: false }) {
                s.phase = SendPhase::Rts { sent: true };
            }
            Step::Finished
        }
        (TxOp::Bcopy { .. }, SendPhase::Frags { msg_id, .. }) => {
            if first {
                sh.counts.eager_multi += 1;
                sh.counts.eager_sync += sync as u64;
            }
            if end >= total {
                sent_all(sh, rid);
                return Step::Finished;
            }
            s.phase = SendPhase::Frags { offset: end, msg_id };
            Step::More
        }
        (TxOp::AmZcopy { .. }, SendPhase::Zcopy { msg_id, .. }) => {
            let z = zc_mut(&sh.zc_pool, &mut s.zc);
            z.inflight += started as u32;
            let idle = z.inflight == 0;
            s.phase = SendPhase::Zcopy { offset: end, msg_id };
            if first {
                sh.counts.eager_zcopy += 1;
                sh.counts.eager_sync += sync as u64;
            }
            if end < total {
                return Step::More;
            }
            if idle {
                zcopy_sent(sh, rid);
            }
            Step::Finished
        }
        (TxOp::Bcopy { .. }, SendPhase::RndvFrags { rreq, .. }) => {
            if end >= total {
                sh.finish(rid, Status::Ok);
                return Step::Finished;
            }
            s.phase = SendPhase::RndvFrags { rreq, offset: end };
            Step::More
        }
        _ => Step::Finished,
    }
}

/// Every byte of an eager send went out: done, or wait for the acknowledgement of a
/// synchronous one (unless it came already, which a loop-back transport makes possible).
pub(crate) fn sent_all<L: Clone>(sh: &mut Shared<L>, rid: Id) {
    if let Some(ReqState { kind: ReqKind::Send(s), .. }) = sh.reqs.tab.get_mut(rid) {
        if s.sync && !s.acked {
            s.phase = SendPhase::WaitAck;
            return;
        }
    }
    sh.finish(rid, Status::Ok);
}

/// Every eager zero-copy fragment of send `rid` completed.
fn zcopy_sent<L: Clone>(sh: &mut Shared<L>, rid: Id) {
    let error = match sh.reqs.tab.get(rid) {
        Some(ReqState { kind: ReqKind::Send(s), .. }) => s.zc.as_ref().and_then(|z| z.error),
        _ => return,
    };
    match error {
        Some(e) => sh.finish(rid, e),
        None => sent_all(sh, rid),
    }
}

/// An eager zero-copy fragment of send `rid` completed with `status`. The send completes
/// once every fragment was posted and completed - or, when its endpoint failed (which
/// leaves a send with fragments in flight to them), once the last one in flight completed.
pub(crate) fn frag_done<L: Clone>(sh: &mut Shared<L>, rid: Id, status: Status) {
    let Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) = sh.reqs.tab.get_mut(rid) else {
        return;
    };
    let total = s.buf.len();
    let posted_all = matches!(s.phase, SendPhase::Zcopy { offset, .. } if offset >= total);
    let ep_error = match sh.eps.get(s.ep) {
        Some(ep) => ep.error(),
        None => Some(Status::Canceled),
    };
    let z = zc_mut(&sh.zc_pool, &mut s.zc);
    z.inflight = z.inflight.saturating_sub(1);
    if status.is_err() && z.error.is_none() {
        z.error = Some(status);
    }
    if z.inflight > 0 {
        return;
    }
    if let (false, Some(e)) = (posted_all, ep_error) {
        z.error.get_or_insert(e);
    } else if !posted_all {
        return;
    }
    zcopy_sent(sh, rid);
}

/// The receiver matched synchronous send `h.sreq`.
pub(crate) fn on_sync_ack<L: Clone>(sh: &mut Shared<L>, h: wire::SyncAck) {
    let Some(id) = sh.sreq_from_wire(h.sreq, "sync ack") else { return };
    ack_sync(sh, id);
}

/// The receiver matched a synchronous send of `h.tag` that went through the tag lane of
/// endpoint `h.ep`: the oldest such send still waiting is acknowledged (the receiver matches
/// one sender's messages of one tag in the order they were sent).
pub(crate) fn on_offload_sync_ack<L: Clone>(sh: &mut Shared<L>, h: wire::OffloadSyncAck) {
    let Some(ep) = sh.ep_from_wire(h.ep, "offload sync ack") else { return };
    let sreq = {
        let Some(e) = sh.eps.get_mut(ep) else { return };
        match e.offload_syncs.iter().position(|&(t, _)| t == h.tag) {
            Some(i) => e.offload_syncs.remove(i).map(|(_, r)| r),
            None => None,
        }
    };
    match sreq {
        Some(id) => ack_sync(sh, id),
        None => tracing::warn!(tag = h.tag, "offload sync ack: no synchronous send of that tag waits; dropped"),
    }
}

/// Synchronous send `id` was matched: it completes if it was sent whole already.
fn ack_sync<L: Clone>(sh: &mut Shared<L>, id: Id) {
    let done = match sh.reqs.tab.get_mut(id) {
        Some(ReqState { kind: ReqKind::Send(s), .. }) if s.sync && !s.acked => {
            s.acked = true;
            s.phase == SendPhase::WaitAck
        }
        _ => false,
    };
    if done {
        sh.finish(id, Status::Ok);
    }
}
