//! Rendezvous (UCX's `src/ucp/rndv`): the sender announces the message with an RTS and keeps
//! its buffer; the receiver, once a receive matched, takes the data by one of three schemes
//! ([`super::select::rndv_scheme`]):
//!
//! * get: it reads the sender's buffer with the key of the RTS, then acknowledges (ATS);
//! * put: it answers with an RTR carrying its own key; the sender writes, then says so (ATP);
//! * active messages: it answers with an RTR without key; the sender sends data fragments.
//!
//! A receive that cannot take the message (too long, or empty) answers with an ATS at once.

use ucs::idtable::Id;
use ucs::Status;

use super::select::{rndv_scheme, RndvProto};
use crate::engine::{EpState, Lane, Mem, Next, Pending, Shared, Step, TxOf, TxOp, TxResult, TxStatus, ZcDone};
use crate::request::{zc_mut, PutTarget, ReqKind, ReqState, Reqs, Rts, SendPhase};
use crate::wire;
use crate::wire::Ctrl;

/// The receiver's scheme for receive `rr`'s matched RTS on an endpoint configured as `ep`.
fn scheme_of<L>(ep: &EpState<L>, rts: &Rts, recv_contig: bool) -> RndvProto {
    rndv_scheme(&ep.cfg, rts.size, !rts.rkey.is_empty(), rts.contig, recv_contig)
}

/// The RTR of receive `rid` (put scheme: with the registration of its buffer to expose).
pub(crate) fn rtr_next<L>(reqs: &mut Reqs, ep: &EpState<L>, rid: Id) -> Next {
    let Some(ReqState { kind: ReqKind::Recv(rr), status: Status::InProgress, .. }) = reqs.tab.get_mut(rid) else {
        return Next::Nothing;
    };
    let Some(rts) = rr.zc.as_ref().and_then(|z| z.rts) else { return Next::Nothing };
    let seg = rr.buf.contig_seg();
    let put = scheme_of(ep, &rts, seg.is_some()) == RndvProto::Put;
    let mem = seg.filter(|_| put).map(|seg| Mem { seg, memh: None, hint: rr.hint });
    let hdr = wire::RtrHdr {
        ep: ep.remote_id,
        sreq: rts.sreq,
        rreq: rid.raw(),
        addr: rr.buf.addr(),
        len: rts.size as u64,
        rkey: uct::PackedKey::new(),
    };
    Next::Tx(Lane::Am, TxOp::Rtr { hdr, mem }, TxOf::Req { rid, offset: 0, len: rts.size })
}

/// The get of receive `rid` on endpoint `ep_id`.
pub(crate) fn get_next<L>(reqs: &mut Reqs, _ep: &EpState<L>, ep_id: Id, rid: Id) -> Next {
    let Some(ReqState { kind: ReqKind::Recv(rr), status: Status::InProgress, .. }) = reqs.tab.get_mut(rid) else {
        return Next::Nothing;
    };
    let (Some(z), Some(seg)) = (rr.zc.as_mut(), rr.buf.contig_seg()) else { return Next::Fail(Status::InvalidParam) };
    let Some(rts) = z.rts else { return Next::Nothing };
    let size = seg.len.min(rr.total);
    z.rma = true;
    let mem = Mem { seg: seg.sub(0, size).unwrap_or(seg), memh: None, hint: rr.hint };
    let token = ZcDone::Get { ep: ep_id, rid, sreq: rts.sreq };
    Next::Tx(
        Lane::Rndv,
        TxOp::Get { mem, remote: rts.addr, rkey: rts.rkey, token },
        TxOf::Req { rid, offset: 0, len: size },
    )
}

/// The put of send `sreq` on endpoint `ep_id`.
pub(crate) fn put_next<L>(reqs: &mut Reqs, _ep: &EpState<L>, ep_id: Id, sreq: Id) -> Next {
    let Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) = reqs.tab.get_mut(sreq) else {
        return Next::Nothing;
    };
    let (Some(z), Some(seg)) = (s.zc.as_mut(), s.buf.contig_seg()) else { return Next::Fail(Status::InvalidParam) };
    let Some(target) = z.put else { return Next::Nothing };
    z.rma = true;
    let mem = Mem { seg, memh: z.memh.clone(), hint: s.hint() };
    let token = ZcDone::Put { ep: ep_id, sreq, rreq: target.rreq };
    let len = seg.len;
    Next::Tx(
        Lane::Rndv,
        TxOp::Put { mem, remote: target.addr, rkey: target.rkey, token },
        TxOf::Req { rid: sreq, offset: 0, len },
    )
}

/// Receive `rid` matched the rendezvous `rts`: take the data by the scheme the endpoint
/// and both buffers allow, or answer at once when there is nothing to take.
pub(crate) fn matched<L: Clone>(sh: &mut Shared<L>, rid: Id, rts: Rts) {
    let Some(ep_id) = sh.ep_from_wire(rts.ep, "rndv rts") else {
        sh.finish(rid, Status::ConnectionReset);
        return;
    };
    let Some(ep) = sh.eps.get(ep_id) else { return };
    if let Some(e) = ep.error() {
        // The sender's endpoint failed after the RTS arrived: no data will come.
        sh.finish(rid, e);
        return;
    }
    let (contig, buflen) = match sh.reqs.tab.get_mut(rid) {
        Some(ReqState { kind: ReqKind::Recv(rr), .. }) => {
            rr.total = rts.size;
            (rr.buf.contig_seg().is_some(), rr.buf.len())
        }
        _ => return,
    };
    if rts.size > buflen || rts.size == 0 {
        let status = if rts.size > buflen { Status::MessageTruncated } else { Status::Ok };
        sh.send_ctrl(ep_id, Ctrl::Ats(wire::Ats { sreq: rts.sreq, status }));
        sh.finish(rid, status);
        return;
    }
    let get = scheme_of(ep, &rts, contig) == RndvProto::Get;
    if let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = sh.reqs.tab.get_mut(rid) {
        // Kept also so a failure of the sender's endpoint fails this receive.
        zc_mut(&sh.zc_pool, &mut rr.zc).rts = Some(rts);
    }
    if get {
        sh.counts.rndv_get += 1;
        sh.enqueue(ep_id, Pending::Get(rid));
    } else {
        sh.enqueue(ep_id, Pending::Rtr(rid));
    }
}

/// The driver sent receive `rid`'s RTR (with a key: the put scheme; without: fragments).
pub(crate) fn rtr_done<L: Clone>(sh: &mut Shared<L>, rid: Id, res: TxResult) -> Step {
    match res.status {
        TxStatus::NoResource => Step::Blocked,
        TxStatus::Failed(e) => {
            sh.finish(rid, e);
            Step::Finished
        }
        TxStatus::Done | TxStatus::Started => {
            if res.keyed {
                sh.counts.rndv_put += 1;
            } else {
                sh.counts.rndv_am += 1;
            }
            if let (Some(m), Some(ReqState { kind: ReqKind::Recv(rr), .. })) = (res.memh, sh.reqs.tab.get_mut(rid)) {
                zc_mut(&sh.zc_pool, &mut rr.zc).memh = Some(m);
            }
            Step::Finished
        }
    }
}

/// The driver issued receive `rid`'s get (or could not).
pub(crate) fn get_done<L: Clone>(sh: &mut Shared<L>, ep_id: Id, rid: Id, res: TxResult) -> Step {
    let sreq = match sh.reqs.tab.get_mut(rid) {
        Some(ReqState { kind: ReqKind::Recv(rr), .. }) => match rr.zc.as_mut() {
            Some(z) => {
                z.rma = res.status == TxStatus::Started;
                z.rts.map(|r| r.sreq).unwrap_or(0)
            }
            None => return Step::Finished,
        },
        _ => return Step::Finished,
    };
    match res.status {
        TxStatus::NoResource => Step::Blocked,
        TxStatus::Failed(e) => {
            tracing::warn!("rndv get failed: {e}");
            get_complete(sh, ep_id, rid, sreq, e);
            Step::Finished
        }
        TxStatus::Done => {
            get_complete(sh, ep_id, rid, sreq, Status::Ok);
            Step::Finished
        }
        TxStatus::Started => Step::Finished,
    }
}

/// Receive `rid`'s get completed: acknowledge to the sender, complete the receive.
pub(crate) fn get_complete<L: Clone>(sh: &mut Shared<L>, ep_id: Id, rid: Id, sreq: u64, status: Status) {
    if let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = sh.reqs.tab.get_mut(rid) {
        if let Some(z) = rr.zc.as_mut() {
            z.rma = false;
        }
    }
    if sh.eps.contains(ep_id) {
        sh.send_ctrl(ep_id, Ctrl::Ats(wire::Ats { sreq, status }));
    }
    sh.finish(rid, status);
}

/// The driver issued send `sreq`'s put (or could not).
pub(crate) fn put_done<L: Clone>(sh: &mut Shared<L>, ep_id: Id, sreq: Id, res: TxResult) -> Step {
    let rreq = match sh.reqs.tab.get_mut(sreq) {
        Some(ReqState { kind: ReqKind::Send(s), .. }) => {
            let z = zc_mut(&sh.zc_pool, &mut s.zc);
            if let Some(m) = res.memh {
                z.memh = Some(m);
            }
            z.rma = res.status == TxStatus::Started;
            if res.status == TxStatus::Started {
                s.phase = SendPhase::Put { started: true };
            }
            z.put.map(|t| t.rreq).unwrap_or(0)
        }
        _ => return Step::Finished,
    };
    match res.status {
        TxStatus::NoResource => Step::Blocked,
        TxStatus::Failed(e) => {
            sh.finish(sreq, e);
            Step::Finished
        }
        TxStatus::Done => {
            put_complete(sh, ep_id, sreq, rreq, Status::Ok);
            Step::Finished
        }
        TxStatus::Started => Step::Finished,
    }
}

/// Send `sreq`'s put completed: tell the receiver (ATP), complete the send.
pub(crate) fn put_complete<L: Clone>(sh: &mut Shared<L>, ep_id: Id, sreq: Id, rreq: u64, status: Status) {
    if let Some(ReqState { kind: ReqKind::Send(s), .. }) = sh.reqs.tab.get_mut(sreq) {
        if let Some(z) = s.zc.as_mut() {
            z.rma = false;
        }
    }
    if !status.is_err() && sh.eps.contains(ep_id) {
        sh.send_ctrl(ep_id, Ctrl::Atp(wire::Atp { rreq }));
    }
    sh.finish(sreq, status);
}

/// ATS: the receiver is done with our buffer (or gave up).
pub(crate) fn on_ats<L: Clone>(sh: &mut Shared<L>, h: wire::Ats) {
    let Some(rid) = sh.sreq_from_wire(h.sreq, "rndv ats") else { return };
    forget_offloaded(sh, rid);
    sh.finish(rid, if h.status == Status::MessageTruncated { Status::Ok } else { h.status });
}

/// The receiver of offloaded rendezvous `rid` answered in software (ATS, RTR): the
/// transport's operation is cancelled, its FIN will not come (UCX's
/// `ucp_tag_offload_cancel_rndv`).
fn forget_offloaded<L: Clone>(sh: &mut Shared<L>, rid: Id) {
    let Some(ReqState { kind: ReqKind::Send(s), .. }) = sh.reqs.tab.get_mut(rid) else { return };
    let Some(op) = s.zc.as_mut().and_then(|z| z.tm_op.take()) else { return };
    let ep = s.ep;
    sh.push(crate::engine::Action::TagRndvCancel { ep, op });
}

/// The offloaded rendezvous of send `rid` completed in the transport: the receiver's
/// transport read the data and sent the FIN (or the operation failed with `status`).
pub(crate) fn tag_rndv_done<L: Clone>(sh: &mut Shared<L>, rid: Id, status: Status) {
    let Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) = sh.reqs.tab.get_mut(rid) else {
        return;
    };
    if let Some(z) = s.zc.as_mut() {
        z.tm_op = None;
    }
    sh.finish(rid, status);
}

/// RTR: the receiver is ready; put the data (with its key) or send it in fragments.
pub(crate) fn on_rtr<L: Clone>(sh: &mut Shared<L>, h: wire::RtrHdr) {
    let Some(ep_id) = sh.ep_from_wire(h.ep, "rndv rtr") else { return };
    let Some(rid) = sh.sreq_from_wire(h.sreq, "rndv rtr") else { return };
    forget_offloaded(sh, rid);
    let can_put = sh.eps.get(ep_id).and_then(|e| e.cfg.rndv).is_some_and(|l| l.put);
    let verdict = match sh.reqs.tab.get_mut(rid) {
        Some(ReqState { kind: ReqKind::Send(s), .. }) if matches!(s.phase, SendPhase::Rts { .. }) => {
            let len = s.buf.len();
            if h.len != len as u64 {
                tracing::warn!("rndv rtr: peer asked for {} bytes of a {len}-byte message; failing the send", h.len);
                Err(Status::InvalidParam)
            } else if h.rkey.is_empty() {
                s.phase = SendPhase::RndvFrags { rreq: h.rreq, offset: 0 };
                Ok(Pending::Send(rid))
            } else if !can_put || s.buf.contig_seg().is_none() {
                tracing::warn!("rndv rtr: a key for a put this endpoint cannot do; failing the send");
                Err(Status::Unsupported)
            } else {
                zc_mut(&sh.zc_pool, &mut s.zc).put = Some(PutTarget { addr: h.addr, rkey: h.rkey, rreq: h.rreq });
                s.phase = SendPhase::Put { started: false };
                Ok(Pending::Put(rid))
            }
        }
        _ => {
            tracing::warn!("rndv rtr: request {:#x} is not waiting for one; dropped", h.sreq);
            return;
        }
    };
    match verdict {
        Ok(p) => sh.enqueue(ep_id, p),
        Err(e) => sh.finish(rid, e),
    }
}

/// A rendezvous data fragment (AM scheme).
pub(crate) fn on_data<L: Clone>(sh: &mut Shared<L>, h: wire::RndvDataHdr, payload: &[u8]) {
    let Some(rid) = sh.rreq_from_wire(h.rreq, "rndv data") else { return };
    let done = {
        let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = sh.reqs.tab.get_mut(rid) else { return };
        let fits = h.offset.checked_add(payload.len()).is_some_and(|e| e <= rr.total);
        if !fits || rr.buf.copy_in(h.offset, payload).is_err() {
            tracing::warn!(
                "rndv data: {} bytes at {} outside the {}-byte message; dropped",
                payload.len(),
                h.offset,
                rr.total
            );
            return;
        }
        rr.received += payload.len();
        rr.received >= rr.total
    };
    if done {
        sh.finish(rid, Status::Ok);
    }
}

/// ATP: the sender's put into our buffer completed.
pub(crate) fn on_atp<L: Clone>(sh: &mut Shared<L>, h: wire::Atp) {
    if let Some(rid) = sh.rreq_from_wire(h.rreq, "rndv atp") {
        sh.finish(rid, Status::Ok);
    }
}
