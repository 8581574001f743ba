//! Receives posted to a transport's tag matching (UCX's `src/ucp/tag/offload.c`): the engine's
//! half, sans-IO. Which receives may go ([`TagState::try_offload`]), the transport's reports
//! (matched, completed, handed back as a rendezvous, cancelled), and the shadow rule: an
//! offloaded receive stays on the software expected queues, and a software match of it (a
//! message that came another way, or one the transport left unexpected) cancels it in the
//! transport first ([`TagState::shadow_taken`]). The driver posts and cancels
//! ([`Action::TagPost`], [`Action::TagCancel`]) and reports back.
//!
//! A receive may be posted when, as UCX's rules (`ucp_tag_offload_try_post`) require:
//! * a tagged message came through the interface's tag matching already (activation; until
//!   then the transport passes every tagged message to software);
//! * it is at least `UCX_TM_THRESH` bytes, one contiguous buffer, with a full mask;
//! * every receive posted before it that is still waiting is offloaded too: the transport
//!   matches before software sees a message, so it must never hold a receive that a
//!   software-only receive posted earlier should take first (UCX counts per hash bucket and
//!   lets partial masks that name a sender through; this is the conservative form);
//! * the transport has room (its `recv_max_outstanding`).
//!
//! Receives shorter than `UCX_TM_MAX_BB_SIZE` go through the driver's bounce buffers; a receive
//! of `UCX_TM_FORCE_THRESH` or more posts the software receives waiting before it first.
//! A receive the transport refuses stays in software, and takes the receives queued to be
//! posted after it back with it (a forced batch is all or none from the refused one on).

use ucs::idtable::Id;
use ucs::Status;

use super::{Tag, TagState};
use crate::dt::UserBuf;
use crate::engine::{Action, Shared};
use crate::proto::rndv;
use crate::request::{RecvInfo, ReqKind, ReqState, Rts};
use crate::tag::matcher::FULL_MASK;
use crate::wire;

/// The offload state of a worker.
#[derive(Debug, Default)]
pub(crate) struct Offload {
    /// The interface receives go to, and how many it takes at most: set when the first
    /// tagged message comes through its tag matching.
    iface: Option<(usize, usize)>,
    /// Receives posted there now (reported neither completed nor cancelled).
    posted: usize,
    /// `UCX_TM_THRESH`, `UCX_TM_MAX_BB_SIZE`, `UCX_TM_FORCE_THRESH`.
    thresh: usize,
    max_bb: usize,
    force_thresh: usize,
}

/// The settings of offload, from the context's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OffloadCfg {
    /// `UCX_TM_THRESH`.
    pub thresh: usize,
    /// `UCX_TM_MAX_BB_SIZE`.
    pub max_bb: usize,
    /// `UCX_TM_FORCE_THRESH`.
    pub force_thresh: usize,
}

impl Offload {
    /// Whether receives may be offloaded (a tagged message came through a transport's tag
    /// matching): the one check the receive path makes without it.
    #[inline(always)]
    pub fn active(&self) -> bool {
        self.iface.is_some()
    }
}

impl TagState {
    /// A tagged message came through the tag matching of interface `iface`, which takes up to
    /// `max` receives: receives may be offloaded from now on (the first such interface).
    pub fn offload_activate(&mut self, iface: usize, max: usize, cfg: OffloadCfg) {
        if self.offload.iface.is_none() && max > 0 {
            tracing::debug!(iface, max, ?cfg, "ucp: tag offload activated");
            self.offload.iface = Some((iface, max));
            self.offload.thresh = cfg.thresh;
            self.offload.max_bb = cfg.max_bb;
            self.offload.force_thresh = cfg.force_thresh;
        }
    }

    /// Receive `rid` for `tag`/`mask` into `buf` was just queued: posts it to the transport
    /// too when the rules allow.
    #[inline(never)]
    pub(crate) fn try_offload<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        rid: Id,
        tag: Tag,
        mask: Tag,
        buf: &UserBuf,
        hint: Option<Id>,
    ) {
        let Some((iface, max)) = self.offload.iface else { return };
        if mask != FULL_MASK || buf.len() < self.offload.thresh || self.offload.posted >= max {
            return;
        }
        let Some(seg) = buf.contig_seg() else { return };
        // It is the only receive waiting that is not offloaded; or, large enough, it pushes
        // the software receives before it to the transport first (in their order).
        if sh.reqs.exp.sw_only() != 1
            && !(buf.len() >= self.offload.force_thresh && self.force_earlier(sh, rid, iface, max))
        {
            return;
        }
        self.post(sh, rid, iface, tag, seg, hint);
    }

    /// Marks receive `rid` offloaded and has the driver post it.
    fn post<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        rid: Id,
        iface: usize,
        tag: Tag,
        seg: crate::dt::Seg,
        hint: Option<Id>,
    ) {
        let reqs = &mut sh.reqs;
        reqs.exp.set_offloaded(&mut reqs.tab, rid.index(), true);
        self.offload.posted += 1;
        sh.counts.offload_posted += 1;
        let bounce = seg.len < self.offload.max_bb && self.offload.max_bb > self.offload.thresh;
        sh.counts.offload_bounce += bounce as u64;
        sh.push(Action::TagPost { rid, iface, tag, seg, hint, bounce });
    }

    /// `UCX_TM_FORCE_THRESH`: posts every software receive waiting before `rid` to the
    /// transport, if each can go (full mask, one contiguous buffer) and the transport has room
    /// for them and `rid`; false (nothing posted) otherwise.
    fn force_earlier<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id, iface: usize, max: usize) -> bool {
        let reqs = &mut sh.reqs;
        let slots: Vec<u32> = reqs.exp.sw_only_slots(&mut reqs.tab).into_iter().filter(|&i| i != rid.index()).collect();
        if self.offload.posted + slots.len() + 1 > max {
            return false;
        }
        let mut posts = Vec::with_capacity(slots.len());
        for i in slots {
            let Some(mut e) = reqs.tab.occupied_at(i) else { return false };
            let id = e.id();
            let r = e.get_mut();
            let (tag, mask) = r.exp.tag_mask();
            let ReqKind::Recv(rr) = &r.kind else { return false };
            let Some(seg) = rr.buf.contig_seg().filter(|_| mask == FULL_MASK) else { return false };
            posts.push((id, tag, seg, rr.hint));
        }
        sh.counts.offload_forced += posts.len() as u64;
        for (id, tag, seg, hint) in posts {
            self.post(sh, id, iface, tag, seg, hint);
        }
        true
    }

    /// The transport refused receive `rid`: it stays a software receive, and so do the
    /// receives still queued to be posted after it (the rest of a forced batch, or receives
    /// posted since): in the transport they would match ahead of it. (Posts run in the order
    /// they were queued, so every queued one is later than `rid`.)
    pub fn offload_post_failed<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id) {
        if !self.unpost(sh, rid) {
            return;
        }
        let mut i = 0;
        while i < sh.actions.len() {
            match sh.actions[i] {
                Action::TagPost { rid: later, .. } => {
                    sh.actions.remove(i);
                    self.unpost(sh, later);
                }
                _ => i += 1,
            }
        }
    }

    /// Receive `rid`, marked offloaded, is not in the transport after all: a software receive
    /// again (counted as refused). False if it was not marked.
    fn unpost<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id) -> bool {
        let reqs = &mut sh.reqs;
        if !reqs.tab.get(rid).is_some_and(|r| r.exp.is_offloaded()) {
            return false;
        }
        reqs.exp.set_offloaded(&mut reqs.tab, rid.index(), false);
        self.offload.posted = self.offload.posted.saturating_sub(1);
        sh.counts.offload_posted -= 1;
        sh.counts.offload_refused += 1;
        true
    }

    /// Software took receive `rid` off the expected queues (a message matched it): if it was
    /// offloaded, the transport's copy is cancelled first, forced (no report).
    pub(crate) fn shadow_taken<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id) {
        if sh.reqs.tab.get(rid).is_some_and(|r| r.exp.is_offloaded()) {
            if let Some(r) = sh.reqs.tab.get_mut(rid) {
                r.exp = clear_offloaded(r.exp);
            }
            self.offload.posted = self.offload.posted.saturating_sub(1);
            sh.counts.offload_sw_matched += 1;
            sh.push(Action::TagCancel { rid, force: true });
        }
    }

    /// The transport matched offloaded receive `rid` (`tag_consumed`): it leaves the software
    /// queues; its data completes it ([`TagState::offload_completed`], [`TagState::offload_rndv`]).
    pub fn offload_consumed<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id) {
        let reqs = &mut sh.reqs;
        if reqs.tab.get(rid).is_some_and(|r| r.exp.is_offloaded() && r.exp.is_posted()) {
            reqs.exp.remove(&mut reqs.tab, rid.index());
            sh.counts.offload_matched += 1;
        }
    }

    /// Offloaded receive `rid` completed in the transport: a message of `len` bytes tagged
    /// `tag` with immediate value `imm` (not 0: synchronous, naming the endpoint to
    /// acknowledge on) is in the buffer; or `status` says it was cancelled or failed.
    #[allow(clippy::too_many_arguments)]
    pub fn offload_completed<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        rid: Id,
        tag: Tag,
        imm: u64,
        len: usize,
        status: Status,
    ) {
        if !self.offload_done(sh, rid) {
            return;
        }
        if status == Status::Canceled {
            sh.finish(rid, Status::Canceled);
            return;
        }
        if matches!(status, Status::Ok | Status::MessageTruncated) && imm != 0 {
            self.sync_ack_offload(sh, imm, tag);
        }
        if let Some(r) = sh.reqs.tab.get_mut(rid) {
            r.info = RecvInfo { length: len, sender_tag: tag };
        }
        sh.finish(rid, status);
    }

    /// Offloaded receive `rid` met a rendezvous the transport leaves to software: a software
    /// request (`header` is the sender's RTS), or an offloaded one larger than the buffer
    /// (`header` is a [`wire::OffloadRndvHdr`]: software finishes it with the truncation).
    pub fn offload_rndv<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id, tag: Tag, header: &[u8]) {
        if !self.offload_done(sh, rid) {
            return;
        }
        if header.len() == wire::OffloadRndvHdr::LEN {
            let Ok(o) = wire::OffloadRndvHdr::decode(header) else { return sh.finish(rid, Status::IoError) };
            let h = wire::RtsHdr {
                tag,
                ep: o.ep,
                sreq: o.sreq,
                size: o.size,
                addr: 0,
                contig: true,
                rkey: uct::PackedKey::new(),
            };
            if let Some(r) = sh.reqs.tab.get_mut(rid) {
                r.info = RecvInfo { length: o.size, sender_tag: tag };
            }
            return rndv::matched(sh, rid, Rts::from(h));
        }
        let h = match wire::RtsHdr::decode(header) {
            Ok(h) if h.tag == tag => h,
            Ok(h) => {
                tracing::warn!(tag, rts_tag = h.tag, "ucp: an offloaded rendezvous whose RTS names another tag");
                return sh.finish(rid, Status::IoError);
            }
            Err(e) => {
                tracing::warn!("ucp: an offloaded rendezvous request: {e}");
                return sh.finish(rid, Status::IoError);
            }
        };
        sh.counts.offload_rx_sw_rndv += 1;
        let rts = Rts::from(h);
        if let Some(r) = sh.reqs.tab.get_mut(rid) {
            r.info = RecvInfo { length: rts.size, sender_tag: tag };
        }
        rndv::matched(sh, rid, rts);
    }

    /// The user cancels receive `rid`: true when it is offloaded (the transport cancels it and
    /// reports; or it matched there already and completes), false for a software receive.
    pub fn offload_cancel<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id) -> bool {
        let Some(r) = sh.reqs.tab.get(rid) else { return false };
        if !r.exp.is_offloaded() || r.status != Status::InProgress {
            return false;
        }
        if r.exp.is_posted() {
            sh.push(Action::TagCancel { rid, force: false });
        }
        true
    }

    /// A report ends offloaded receive `rid`: false when it names no such receive.
    fn offload_done<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id) -> bool {
        match sh.reqs.tab.get(rid) {
            Some(ReqState { kind: ReqKind::Recv(_), status: Status::InProgress, exp, .. }) if exp.is_offloaded() => {}
            _ => {
                tracing::warn!("ucp: a tag-offload report for a receive that is not offloaded; ignored");
                return false;
            }
        }
        // (Off the queues, if the cancel or the match did not take it off yet.)
        let reqs = &mut sh.reqs;
        reqs.exp.remove(&mut reqs.tab, rid.index());
        if let Some(r) = reqs.tab.get_mut(rid) {
            r.exp = clear_offloaded(r.exp);
        }
        self.offload.posted = self.offload.posted.saturating_sub(1);
        true
    }

    /// Acknowledges a synchronous message that matched in the transport (`imm`: this side's
    /// endpoint to its sender).
    fn sync_ack_offload<L: Clone>(&mut self, sh: &mut Shared<L>, imm: u64, tag: Tag) {
        let Some(id) = sh.ep_from_wire(imm, "offloaded eager sync") else { return };
        let Some(remote) = sh.eps.get(id).map(|e| e.remote_id) else { return };
        sh.send_ctrl(id, wire::Ctrl::OffloadSyncAck(wire::OffloadSyncAck { ep: remote, tag }));
    }
}

/// `e` without its offloaded mark (for an entry off the queues: the queues' count is not
/// concerned).
fn clear_offloaded(e: crate::tag::matcher::ExpEntry) -> crate::tag::matcher::ExpEntry {
    e.without_offload()
}
