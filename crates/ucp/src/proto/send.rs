//! Sends that need a request, for every family that sends a message (tagged sends, active
//! messages): the engine's side of `ucp_tag_send_nbx` and `ucp_am_send_nbx` when the driver
//! could not send the message directly (it is not eager short or single-fragment bcopy, the
//! endpoint is not ready, the lane was full, or the caller wants a request). What the family
//! adds is the message's identity ([`SendMsg`]), which decides its headers.

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use crate::dt::UserBuf;
use crate::engine::{Lane, Pending, Shared};
use crate::proto::eager::{short_hdr, whole_hdr};
use crate::proto::pending::Front;
use crate::proto::Proto;
use crate::request::{RecvInfo, ReqKind, ReqState, RequestFlags, RequestParam, SendMsg, SendPhase, SendReq};

/// A send of message `msg` with data `buf` on endpoint `ep` with the protocol `proto` that
/// [`select`](crate::proto::select::select) chose, with a request (its id is returned).
/// `FORCE_IMM_CMPL` refuses it (`NoResource`), since it cannot complete at once. On a ready
/// endpoint a whole eager message (synchronous, or one that must not complete at once) is
/// queued at the front with the endpoint busy, and the driver gets it to send straight away
/// ([`Front::Data`], reported with [`Shared::data_replayed`]); anything else is queued and
/// the endpoint kicked.
pub(crate) fn send_req<L: Clone>(
    sh: &mut Shared<L>,
    ep: Id,
    buf: UserBuf,
    msg: SendMsg,
    sync: bool,
    param: RequestParam,
    proto: Proto,
) -> UcsResult<(Id, Option<Front<L>>)> {
    let rid = new_send_req(sh, ep, buf, msg, sync, param, proto)?;
    let whole = matches!(proto, Proto::EagerShort | Proto::EagerBcopy);
    match sh.eps.get_mut(ep) {
        // (A send through a tag lane takes the queue's transmission, `Lane::Tag`.)
        Some(e) if whole && e.ready() && e.wireup_q.is_empty() && super::eager::tag_lane(&e.cfg, msg) == Lane::Am => {
            e.queue.push_back(Pending::Send(rid));
            e.busy = true;
            let short = proto == Proto::EagerShort;
            let hdr = if short { short_hdr(msg, e.remote_id) } else { whole_hdr(msg, sync, e.remote_id, rid.raw()) };
            let len = buf.len();
            Ok((rid, Some(Front::Data { io: e.io.clone(), rid, short, hdr, buf, offset: 0, len })))
        }
        _ => {
            sh.enqueue(ep, Pending::Send(rid));
            Ok((rid, None))
        }
    }
}

/// A direct send the AM lane refused: queued as a request without another attempt now
/// (the driver parks the endpoint on the lane).
pub(crate) fn send_req_blocked<L: Clone>(
    sh: &mut Shared<L>,
    ep: Id,
    buf: UserBuf,
    msg: SendMsg,
    param: RequestParam,
    proto: Proto,
) -> UcsResult<Id> {
    let rid = new_send_req(sh, ep, buf, msg, false, param, proto)?;
    sh.enqueue_blocked(ep, Pending::Send(rid));
    Ok(rid)
}

/// The request of a send, not queued yet.
fn new_send_req<L: Clone>(
    sh: &mut Shared<L>,
    ep: Id,
    buf: UserBuf,
    msg: SendMsg,
    sync: bool,
    param: RequestParam,
    proto: Proto,
) -> UcsResult<Id> {
    if param.flags.contains(RequestFlags::FORCE_IMM_CMPL) {
        return Err(Status::NoResource);
    }
    let phase = match proto {
        Proto::EagerMulti => SendPhase::Frags { offset: 0, msg_id: sh.msg_id() },
        Proto::EagerZcopy => SendPhase::Zcopy { offset: 0, msg_id: sh.msg_id() },
        Proto::EagerShort | Proto::EagerBcopy | Proto::Rndv => SendPhase::Queued,
    };
    let len = buf.len();
    let req = SendReq {
        ep,
        msg: crate::request::PackedMsg::new(msg),
        buf,
        sync,
        acked: false,
        proto,
        phase,
        zc: None,
        hint_id: param.hint(),
    };
    let mut st = ReqState::new(ReqKind::Send(req), param.callback, param.callback_fn, param.detached);
    st.info = RecvInfo { length: len, sender_tag: msg.tag() };
    Ok(sh.reqs.tab.insert(st))
}
