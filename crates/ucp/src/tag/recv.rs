//! The receive side of tag matching: posting a receive (it takes the earliest matching
//! unexpected message, or waits on the expected queues), and what arrives - eager messages
//! whole or in fragments, synchronous ones (acknowledged once matched), rendezvous requests.

use ucs::idtable::Id;
use ucs::{Status, UcsResult};
use uct::AmRecv;

use super::{FragTarget, Tag, TagState, Unexp};
use crate::dt::UserBuf;
use crate::engine::am::malformed;
use crate::engine::{Action, Shared};
use crate::proto::rndv;
use crate::request::complete::{completed_at_once, Delivered, Done};
use crate::request::Rts;
use crate::request::{RecvInfo, RecvReq, ReqKind, ReqState, RequestFlags, RequestParam};
use crate::wire::Ctrl;
use crate::wire::{self, len};

/// Outcome of a receive call.
#[derive(Debug)]
pub(crate) enum RecvOut {
    /// Completed at once.
    Done(RecvInfo),
    /// In progress (or completed with NO_IMM_CMPL).
    Req(Id),
}

impl TagState {
    /// Posts a tagged receive into `buf`: the earliest matching unexpected message, if one
    /// waits, else a request on the expected queues.
    #[inline]
    pub fn tag_recv<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        buf: UserBuf,
        tag: Tag,
        mask: Tag,
        param: RequestParam,
    ) -> UcsResult<RecvOut> {
        if let Some((tag, msg)) = self.unexp.take_match(tag, mask) {
            return self.recv_matched(sh, buf, tag, msg, param);
        }
        if param.flags.contains(RequestFlags::FORCE_IMM_CMPL) {
            return Err(Status::NoResource);
        }
        let hint = param.hint();
        let reqs = &mut sh.reqs;
        // Queued first, by the slot it is about to take, so the slot is not looked up again.
        let at = reqs.tab.next_index();
        let exp = reqs.exp.post_at(&mut reqs.tab, tag, mask, at);
        let mut st =
            ReqState::new(ReqKind::Recv(RecvReq::new(buf, hint)), param.callback, param.callback_fn, param.detached);
        st.exp = exp;
        let rid = reqs.tab.insert(st);
        debug_assert_eq!(rid.index(), at, "the request took another slot than the queues were told");
        if self.offload.active() {
            self.try_offload(sh, rid, tag, mask, &buf, hint);
        }
        Ok(RecvOut::Req(rid))
    }

    /// A receive met an unexpected message (at posting, or from a probed handle).
    #[inline(never)]
    pub(crate) fn recv_matched<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        buf: UserBuf,
        tag: Tag,
        msg: Unexp,
        param: RequestParam,
    ) -> UcsResult<RecvOut> {
        let info = RecvInfo { length: msg.length(), sender_tag: tag };
        match msg {
            Unexp::Eager { desc, offset, sync } => self.recv_whole_now(sh, &buf, info, &desc[offset..], sync, param),
            Unexp::Frag { data, total, sync, .. } if data.len() == total => {
                let out = self.recv_whole_now(sh, &buf, info, &data, sync, param);
                self.recycle_frag_buf(data);
                out
            }
            Unexp::Frag { key, total, data, sync } => {
                let mut r = RecvReq::new(buf, param.hint());
                r.total = total;
                r.received = data.len();
                r.sync = sync;
                r.truncated = total > r.buf.len() || r.buf.copy_in(0, &data).is_err();
                self.recycle_frag_buf(data);
                let rid = self.req_with(sh, ReqKind::Recv(r), param, info);
                self.frags.insert(key, FragTarget::Req(rid));
                Ok(RecvOut::Req(rid))
            }
            Unexp::Rts(rts) => {
                let rid = self.req_with(sh, ReqKind::Recv(RecvReq::new(buf, param.hint())), param, info);
                rndv::matched(sh, rid, rts);
                Ok(RecvOut::Req(rid))
            }
        }
    }

    /// Registers a request with the callbacks of `param` and receive info `info`.
    fn req_with<L: Clone>(&mut self, sh: &mut Shared<L>, kind: ReqKind, param: RequestParam, info: RecvInfo) -> Id {
        let mut st = ReqState::new(kind, param.callback, param.callback_fn, param.detached);
        st.info = info;
        sh.reqs.tab.insert(st)
    }

    /// A whole unexpected message for a receive being posted: copy, acknowledge, and complete
    /// at once (or through a completed request with NO_IMM_CMPL).
    fn recv_whole_now<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        buf: &UserBuf,
        info: RecvInfo,
        payload: &[u8],
        sync: Option<(u64, u64)>,
        param: RequestParam,
    ) -> UcsResult<RecvOut> {
        let status = buf.fold_status(match buf.copy_in(0, payload) {
            Ok(()) => Status::Ok,
            Err(e) => e,
        });
        if let Some((ep, sreq)) = sync {
            self.sync_ack(sh, ep, sreq, info.sender_tag);
        }
        if param.flags.contains(RequestFlags::NO_IMM_CMPL) {
            let mut st = ReqState::new(ReqKind::Done, None, None, false);
            st.info = info;
            st.status = status;
            let rid = sh.reqs.tab.insert(st);
            // The callbacks of a request completed at creation run now.
            if param.callback.is_some() || param.callback_fn.is_some() {
                sh.push(Action::Full(completed_at_once(param.callback, param.callback_fn, status, info)));
            }
            return Ok(RecvOut::Req(rid));
        }
        if status.is_err() {
            Err(status)
        } else {
            Ok(RecvOut::Done(info))
        }
    }

    /// Takes the earliest receive posted for `tag` off the expected queues, cancelling it in
    /// the transport's tag matching if it was posted there too.
    fn take_expected<L: Clone>(&mut self, sh: &mut Shared<L>, tag: Tag) -> Option<Id> {
        let rid = sh.reqs.take_expected(tag)?;
        self.shadow_taken(sh, rid);
        Some(rid)
    }

    /// Tells the sender of a synchronous message of `tag` (endpoint `ep`, request `sreq`) that
    /// it matched. `sreq` 0 ([`OFFLOAD_SREQ`]): it came through the tag lane, which carries no
    /// request id; the acknowledgement names the tag.
    fn sync_ack<L: Clone>(&mut self, sh: &mut Shared<L>, ep: u64, sreq: u64, tag: Tag) {
        let Some(id) = sh.ep_from_wire(ep, "eager sync") else { return };
        if sreq == OFFLOAD_SREQ {
            let Some(remote) = sh.eps.get(id).map(|e| e.remote_id) else { return };
            sh.send_ctrl(id, Ctrl::OffloadSyncAck(wire::OffloadSyncAck { ep: remote, tag }));
        } else {
            sh.send_ctrl(id, Ctrl::SyncAck(wire::SyncAck { sreq }));
        }
    }

    /// A whole message for matched receive `rid`.
    fn deliver_whole<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        rid: Id,
        tag: Tag,
        payload: &[u8],
        sync: Option<(u64, u64)>,
    ) {
        // Matched: the sender's sync request may complete.
        if let Some((ep, sreq)) = sync {
            self.sync_ack(sh, ep, sreq, tag);
        }
        let r = sh.reqs.complete_with(rid, |r| crate::request::complete::fill_whole(r, tag, payload));
        sh.completed(rid, r);
    }

    /// An eager message (`AM_EAGER_ONLY`): delivered into the earliest matching receive, or
    /// kept as unexpected in its transport buffer. The completion of a matched receive is
    /// returned for the driver to run (the 8-byte receive path: no queue in between).
    #[inline(always)]
    pub fn on_eager<L: Clone>(&mut self, sh: &mut Shared<L>, m: AmRecv<'_>) -> Option<Done> {
        let tag = match wire::EagerHdr::decode(m.data()) {
            Ok((h, _)) => h.tag,
            Err(e) => {
                malformed(e);
                return None;
            }
        };
        self.eager_whole(sh, tag, m, len::EAGER_ONLY)
    }

    /// A whole eager message of `tag` (its data from `offset` in `m`): into the earliest
    /// matching receive (taken back from the transport first if it was offloaded there), or
    /// kept as unexpected; the completion to run, as [`TagState::on_eager`] says.
    #[inline(always)]
    fn eager_whole<L: Clone>(&mut self, sh: &mut Shared<L>, tag: Tag, m: AmRecv<'_>, offset: usize) -> Option<Done> {
        let payload = &m.data()[offset..];
        match sh.reqs.deliver_expected(tag, payload) {
            Delivered::Done(done) => done,
            Delivered::Full(id, status) => {
                sh.complete_full(id, status);
                None
            }
            Delivered::NoMatch => {
                self.unexpected_eager(sh, tag, m, offset, None);
                None
            }
            Delivered::Offloaded(rid) => {
                // (Posted to the transport with a stale unexpected count, or just now: the
                // transport left it unmatched; or the message came another way.)
                self.shadow_taken(sh, rid);
                self.deliver_whole(sh, rid, tag, payload, None);
                None
            }
        }
    }

    /// Keeps a whole eager message nobody waits for.
    #[inline(never)]
    fn unexpected_eager<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        tag: Tag,
        m: AmRecv<'_>,
        offset: usize,
        sync: Option<(u64, u64)>,
    ) {
        sh.counts.unexpected += 1;
        let desc = m.keep_in(&sh.kept_msgs);
        self.unexp.push(tag, Unexp::Eager { desc, offset, sync });
    }

    /// A synchronous eager message in one piece.
    pub(crate) fn on_eager_sync<L: Clone>(&mut self, sh: &mut Shared<L>, m: AmRecv<'_>) {
        let (wire::EagerSyncHdr { tag, ep, sreq }, payload) = match wire::EagerSyncHdr::decode(m.data()) {
            Ok(v) => v,
            Err(e) => return malformed(e),
        };
        match self.take_expected(sh, tag) {
            Some(rid) => self.deliver_whole(sh, rid, tag, payload, Some((ep, sreq))),
            None => self.unexpected_eager(sh, tag, m, len::EAGER_SYNC_ONLY, Some((ep, sreq))),
        }
    }

    /// The first fragment of a multi-fragment eager message.
    pub(crate) fn on_eager_first<L: Clone>(&mut self, sh: &mut Shared<L>, h: wire::EagerFirstHdr, payload: &[u8]) {
        let wire::EagerFirstHdr { tag, ep, msg_id, total, sreq } = h;
        let key = (ep, msg_id);
        let sync = sreq.map(|s| (ep, s));
        match self.take_expected(sh, tag) {
            Some(rid) if payload.len() == total => self.deliver_whole(sh, rid, tag, payload, sync),
            Some(rid) => {
                let Some(st) = sh.reqs.tab.get_mut(rid) else { return };
                st.info = RecvInfo { length: total, sender_tag: tag };
                let ReqKind::Recv(rr) = &mut st.kind else { return };
                rr.total = total;
                rr.received = payload.len();
                rr.sync = sync;
                rr.truncated = total > rr.buf.len() || rr.buf.copy_in(0, payload).is_err();
                self.frags.insert(key, FragTarget::Req(rid));
            }
            None => {
                sh.counts.unexpected += 1;
                let data = self.frag_buf(payload);
                let complete = payload.len() == total;
                let h = self.unexp.push(tag, Unexp::Frag { key, total, data, sync });
                if !complete {
                    self.frags.insert(key, FragTarget::Unexp(h));
                }
            }
        }
    }

    /// A later fragment of a multi-fragment eager message: appended where its message goes.
    pub(crate) fn on_eager_middle<L: Clone>(&mut self, sh: &mut Shared<L>, h: wire::EagerMiddleHdr, payload: &[u8]) {
        let wire::EagerMiddleHdr { ep, msg_id, offset } = h;
        let key = (ep, msg_id);
        let Some(target) = self.frags.get(&key).copied() else {
            tracing::warn!("eager middle: no message {msg_id:#x} in progress; dropped");
            return;
        };
        let append = |data: &mut Vec<u8>, total: usize| -> Option<bool> {
            if offset != data.len() || offset + payload.len() > total {
                return None;
            }
            data.extend_from_slice(payload);
            Some(data.len() == total)
        };
        let complete = match target {
            FragTarget::Unexp(h) => match self.unexp.get_mut(h) {
                Some(Unexp::Frag { data, total, .. }) => append(data, *total),
                _ => None,
            },
            FragTarget::Probed(id) => match self.probed.get_mut(id) {
                Some((_, Unexp::Frag { data, total, .. })) => append(data, *total),
                _ => None,
            },
            FragTarget::Req(rid) => match sh.reqs.tab.get_mut(rid) {
                Some(ReqState { kind: ReqKind::Recv(rr), .. })
                    if offset == rr.received && offset + payload.len() <= rr.total =>
                {
                    if !rr.truncated && rr.buf.copy_in(offset, payload).is_err() {
                        rr.truncated = true;
                    }
                    rr.received += payload.len();
                    Some(rr.received == rr.total)
                }
                _ => None,
            },
        };
        match complete {
            None => tracing::warn!("eager middle: fragment at {offset} does not continue message {msg_id:#x}; dropped"),
            Some(false) => {}
            Some(true) => {
                self.frags.remove(&key);
                if let FragTarget::Req(rid) = target {
                    self.recv_frags_done(sh, rid);
                }
            }
        }
    }

    /// All fragments of a matched message arrived.
    fn recv_frags_done<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id) {
        let (sync, truncated, tag) = match sh.reqs.tab.get_mut(rid) {
            Some(ReqState { kind: ReqKind::Recv(rr), info, .. }) => (rr.sync.take(), rr.truncated, info.sender_tag),
            _ => return,
        };
        if let Some((ep, sreq)) = sync {
            self.sync_ack(sh, ep, sreq, tag);
        }
        sh.finish(rid, if truncated { Status::MessageTruncated } else { Status::Ok });
    }

    /// A rendezvous request: matched now, or kept as unexpected.
    pub(crate) fn on_rts<L: Clone>(&mut self, sh: &mut Shared<L>, h: wire::RtsHdr) {
        let tag = h.tag;
        let rts = Rts::from(h);
        match self.take_expected(sh, tag) {
            Some(rid) => {
                if let Some(r) = sh.reqs.tab.get_mut(rid) {
                    r.info = RecvInfo { length: rts.size, sender_tag: tag };
                }
                rndv::matched(sh, rid, rts);
            }
            None => {
                sh.counts.unexpected += 1;
                self.unexp.push(tag, Unexp::Rts(rts));
            }
        }
    }

    /// An eager message that came through a transport's tag matching and matched no receive
    /// posted there (`uct::TagHandlers::eager`): its tag `stag`, immediate value `imm` (not 0:
    /// synchronous, naming this side's endpoint to the sender), the data alone. Matched
    /// against the receives posted in software, or kept as unexpected, as an eager message.
    pub fn on_offload_eager<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        stag: Tag,
        imm: u64,
        m: AmRecv<'_>,
    ) -> Option<Done> {
        sh.counts.offload_rx_eager += 1;
        if imm != 0 {
            let sync = Some((imm, OFFLOAD_SREQ));
            match self.take_expected(sh, stag) {
                Some(rid) => self.deliver_whole(sh, rid, stag, m.data(), sync),
                None => self.unexpected_eager(sh, stag, m, 0, sync),
            }
            return None;
        }
        self.eager_whole(sh, stag, m, 0)
    }

    /// A rendezvous request that came through a transport's tag matching
    /// (`uct::TagHandlers::rndv`). A software request (no remote address) carries an RTS as
    /// its header; an offloaded one ([`wire::OffloadRndvHdr`] as its header, the sender's
    /// address, length and key from the transport) becomes one. Either way the rendezvous
    /// goes on as one that came as an active message (the receiver gets the data, or asks for
    /// it, and answers in software: the sender then cancels its offloaded operation).
    pub fn on_offload_rndv<L: Clone>(&mut self, sh: &mut Shared<L>, u: &uct::TagUnexpRndv<'_>) {
        if u.remote_addr != 0 || u.length != 0 || !u.rkey_buf.is_empty() {
            let o = match wire::OffloadRndvHdr::decode(u.header) {
                Ok(o) if o.size == u.length => o,
                Ok(o) => {
                    tracing::warn!(
                        tag = u.stag,
                        size = o.size,
                        length = u.length,
                        "ucp: an offloaded rendezvous whose header and transport disagree on its size; dropped"
                    );
                    return;
                }
                Err(e) => return malformed(e),
            };
            let Ok(rkey) = uct::PackedKey::from_slice(u.rkey_buf) else {
                tracing::warn!(
                    tag = u.stag,
                    len = u.rkey_buf.len(),
                    "ucp: an offloaded rendezvous with an oversized key; dropped"
                );
                return;
            };
            sh.counts.offload_rx_hw_rndv += 1;
            let h = wire::RtsHdr {
                tag: u.stag,
                ep: o.ep,
                sreq: o.sreq,
                size: o.size,
                addr: u.remote_addr,
                contig: true,
                rkey,
            };
            return self.on_rts(sh, h);
        }
        let h = match wire::RtsHdr::decode(u.header) {
            Ok(h) => h,
            Err(e) => return malformed(e),
        };
        if h.tag != u.stag {
            tracing::warn!(
                tag = u.stag,
                rts_tag = h.tag,
                "ucp: a rendezvous request whose RTS names another tag; dropped"
            );
            return;
        }
        sh.counts.offload_rx_sw_rndv += 1;
        self.on_rts(sh, h);
    }
}

/// The `sreq` of a synchronous message that came through the tag lane (no request id).
pub(crate) const OFFLOAD_SREQ: u64 = 0;
