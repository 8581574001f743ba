//! Active messages (UCX's `src/ucp/core/ucp_am.c`), the engine's half: what arrives - a whole
//! message, or the fragments of a long one, reassembled - checked and handed to the driver,
//! which runs the user's handler for the message's id (the engine runs no user code).
//!
//! Sends go through the shared machinery (`proto::send`, the eager protocols) with an
//! active message's identity ([`crate::request::AmOut`]): it decides the headers
//! (`wire::am`). Messages from one endpoint travel its AM lane in order, and a multi-fragment
//! message is delivered when its last fragment arrived; a handler gets every message whole
//! (as UCX does, whatever `UCP_AM_FLAG_WHOLE_MSG` says).
//!
//! A rendezvous message arrives as an RTS: it waits in the table of descriptors until the
//! user receives its data into a buffer (`ucp_am_recv_data_nbx`: a receive request that the
//! shared rendezvous protocol completes, as for a matched tagged RTS) or drops it (an ATS with
//! the status tells the sender).

use std::collections::HashMap;

use ucs::idtable::{Id, IdTable};
use ucs::{Status, UcsResult};

use crate::dt::UserBuf;
use crate::engine::Shared;
use crate::request::{RecvInfo, RecvReq, ReqKind, ReqState, RequestParam, Rts};
use crate::wire::{self, Ctrl};

/// Reassembly buffers kept for reuse.
const AM_BUFS_KEPT: usize = 16;
/// Largest capacity of a kept reassembly buffer.
const AM_BUF_KEPT_MAX: usize = 256 * 1024;

/// An active message for the driver to deliver: the user's id, the reply endpoint when the
/// sender asked for one, and the bytes.
pub(crate) struct AmArrival<'a> {
    pub id: u16,
    pub reply: Option<Id>,
    pub bytes: AmBytes<'a>,
}

/// Where an arrived active message's user header and data are.
pub(crate) enum AmBytes<'a> {
    /// A whole message in the transport's buffer: the user header at `hdr` (start, length),
    /// the data from `data` to the end.
    Recv { m: uct::AmRecv<'a>, hdr: (usize, usize), data: usize },
    /// A reassembled message.
    Owned { hdr: Vec<u8>, data: Vec<u8> },
    /// A rendezvous message: the user header in the transport's buffer at `hdr`, and the
    /// descriptor of its data (`size` bytes) in the family's table.
    Rndv { m: uct::AmRecv<'a>, hdr: (usize, usize), desc: Id, size: usize },
}

/// A multi-fragment message in progress.
struct Asm {
    id: u16,
    reply: Option<Id>,
    hdr: Vec<u8>,
    data: Vec<u8>,
    total: usize,
}

/// The active-message family's state: messages being reassembled.
#[derive(Default)]
pub(crate) struct AmState {
    /// Multi-fragment messages in progress, by (endpoint, message id).
    frags: HashMap<(u64, u64), Asm>,
    /// Reassembly buffers kept for reuse.
    bufs: Vec<Vec<u8>>,
    /// Rendezvous messages whose data nobody received or dropped yet.
    rndv: IdTable<Rts>,
}

impl AmState {
    /// A message of the family arrived with AM id `id`: decoded (a malformed one is logged and
    /// dropped) and, when whole, returned for delivery.
    pub fn on_msg<'a, L>(&mut self, sh: &Shared<L>, id: u8, m: uct::AmRecv<'a>) -> Option<AmArrival<'a>> {
        let base = m.data().as_ptr() as usize;
        if id == wire::AM_AM_ONLY {
            return whole(m, |raw| reply_ep(sh, raw, "active message"));
        }
        let arrival = match wire::Msg::decode(id, m.data()) {
            Ok(wire::Msg::AmFirst(h, user, data)) => self.on_first(sh, h, user, data),
            Ok(wire::Msg::AmMiddle(h, data)) => self.on_middle(h, data),
            Ok(wire::Msg::AmRts(h, user)) => {
                // The reply endpoint, and the one an ATS goes back on.
                reply_ep(sh, h.rts.ep, "active message rts")?;
                let reply = h.w.reply().then_some(Id::from_raw(h.rts.ep));
                let hdr = (user.as_ptr() as usize - base, user.len());
                let size = h.rts.size;
                let desc = self.rndv.insert(Rts::from(h.rts));
                return Some(AmArrival { id: h.w.id, reply, bytes: AmBytes::Rndv { m, hdr, desc, size } });
            }
            Ok(_) => {
                tracing::warn!("ucp: {} on an active-message id; dropped", wire::am_name(id));
                None
            }
            Err(e) => {
                crate::engine::am::malformed(e);
                None
            }
        };
        arrival
    }

    fn on_first<'a>(
        &mut self,
        sh: &Shared<impl Sized>,
        h: wire::am::AmFirstHdr,
        user: &[u8],
        data: &[u8],
    ) -> Option<AmArrival<'a>> {
        let what = "active message first";
        // The endpoint names the message; it must be one of ours.
        let ep = reply_ep(sh, h.ep, what)?;
        let reply = h.w.reply().then_some(ep);
        if data.len() == h.total {
            // Everything came in the first fragment (a sender whose fragments are larger
            // than ours): whole already.
            let bytes = AmBytes::Owned { hdr: user.to_vec(), data: data.to_vec() };
            return Some(AmArrival { id: h.w.id, reply, bytes });
        }
        let key = (h.ep, h.msg_id);
        if self.frags.contains_key(&key) {
            tracing::warn!("{what}: message {:#x} is already in progress; dropped", h.msg_id);
            return None;
        }
        let mut buf = self.bufs.pop().unwrap_or_default();
        buf.extend_from_slice(data);
        self.frags.insert(key, Asm { id: h.w.id, reply, hdr: user.to_vec(), data: buf, total: h.total });
        None
    }

    fn on_middle<'a>(&mut self, h: wire::am::AmMiddleHdr, payload: &[u8]) -> Option<AmArrival<'a>> {
        let wire::EagerMiddleHdr { ep, msg_id, offset } = h.0;
        let key = (ep, msg_id);
        let Some(a) = self.frags.get_mut(&key) else {
            tracing::warn!("active message middle: no message {msg_id:#x} in progress; dropped");
            return None;
        };
        // Fragments continue the message in order, within its announced length: the buffer
        // grows with what arrives, never with what the peer announced.
        if offset != a.data.len() || payload.len() > a.total - offset {
            tracing::warn!(
                "active message middle: fragment at {offset} does not continue message {msg_id:#x}; dropped"
            );
            return None;
        }
        a.data.extend_from_slice(payload);
        if a.data.len() < a.total {
            return None;
        }
        let a = self.frags.remove(&key)?;
        Some(AmArrival { id: a.id, reply: a.reply, bytes: AmBytes::Owned { hdr: a.hdr, data: a.data } })
    }

    /// Gives a reassembly buffer back for reuse (the handler did not keep it).
    pub fn recycle(&mut self, mut v: Vec<u8>) {
        if self.bufs.len() < AM_BUFS_KEPT && v.capacity() <= AM_BUF_KEPT_MAX {
            v.clear();
            self.bufs.push(v);
        }
    }

    /// Receives the data of rendezvous descriptor `desc` into `buf` (`ucp_am_recv_data_nbx`):
    /// a receive request the rendezvous protocol completes; its id. `InvalidParam` for a
    /// descriptor already received or dropped.
    pub fn recv_data<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        desc: Id,
        buf: UserBuf,
        param: RequestParam,
    ) -> UcsResult<Id> {
        let Some(rts) = self.rndv.remove(desc) else {
            tracing::error!("am_recv_data_nbx: the descriptor was received or released already");
            return Err(Status::InvalidParam);
        };
        let hint = param.hint();
        let mut st =
            ReqState::new(ReqKind::Recv(RecvReq::new(buf, hint)), param.callback, param.callback_fn, param.detached);
        st.info = RecvInfo { length: rts.size, sender_tag: 0 };
        let rid = sh.reqs.tab.insert(st);
        crate::proto::rndv::matched(sh, rid, rts);
        Ok(rid)
    }

    /// Drops rendezvous descriptor `desc` without its data: the sender completes with `status`
    /// (an ATS).
    pub fn drop_rndv<L: Clone>(&mut self, sh: &mut Shared<L>, desc: Id, status: Status) {
        let Some(rts) = self.rndv.remove(desc) else { return };
        if let Some(ep) = sh.ep_from_wire(rts.ep, "active message rts") {
            sh.send_ctrl(ep, Ctrl::Ats(wire::Ats { sreq: rts.sreq, status }));
        }
    }

    /// Endpoint `ep` (raw id) failed or went: its partly arrived messages are dropped.
    pub fn ep_gone(&mut self, ep: u64, name: &str, status: ucs::Status) {
        let before = self.frags.len();
        self.frags.retain(|k, _| k.0 != ep);
        if self.frags.len() != before {
            tracing::warn!(
                "ucp: dropping {} partly arrived active messages from {name} ({status})",
                before - self.frags.len()
            );
        }
    }
}

/// The endpoint a message names (the receiver's endpoint to its sender, raw id), if it is one
/// of this worker's and not failed; logged otherwise.
/// A whole active message (AM id `AM_AM_ONLY`, the common case), decoded on its own rather
/// than by the general decoder: the arrival, or `None` (logged) for a malformed message or
/// one whose reply endpoint `reply_ep` refuses (called only when the sender asked for one, so
/// that the driver enters the engine only then).
#[inline]
pub(crate) fn whole<'a>(m: uct::AmRecv<'a>, reply_ep: impl FnOnce(u64) -> Option<Id>) -> Option<AmArrival<'a>> {
    let bytes = m.data();
    let base = bytes.as_ptr() as usize;
    let (h, user, data) = match wire::am::AmHdr::decode(bytes) {
        Ok(d) => d,
        Err(e) => {
            crate::engine::am::malformed(e);
            return None;
        }
    };
    let hdr = (user.as_ptr() as usize - base, user.len());
    let data = data.as_ptr() as usize - base;
    let reply = if h.w.reply() { Some(reply_ep(h.ep)?) } else { None };
    Some(AmArrival { id: h.w.id, reply, bytes: AmBytes::Recv { m, hdr, data } })
}

/// The endpoint a message names (`raw`), when it is one of ours and usable; else `None`,
/// logged.
pub(crate) fn reply_ep<L>(sh: &Shared<L>, raw: u64, what: &str) -> Option<Id> {
    let id = Id::from_raw(raw);
    match sh.eps.get(id) {
        Some(ep) if ep.error().is_none() => Some(id),
        Some(_) => {
            tracing::warn!("{what}: from a failed or closed endpoint; dropped");
            None
        }
        None => {
            tracing::warn!("{what}: names endpoint {raw:#x}, which this worker does not have; dropped");
            None
        }
    }
}
