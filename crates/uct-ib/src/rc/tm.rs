//! `rc_verbs`' tag matching over the emulated device ([`crate::tm::device`]): what UCX's
//! `rc_mlx5` does with a TM-SRQ, done against the software model, since Soft-RoCE (and any
//! verbs device without `IBV_SRQT_TM`) has no matching of its own. Active only with
//! `UCX_RC_TM_ENABLE=y` and both unexpected-message handlers given at open.
//!
//! * **Receive side.** Every message the shared receive queue takes goes through the device
//!   ([`TmDevice::arrive`]) in arrival order, then its completions are handled at once, also in
//!   order: untagged messages (the `NO_TAG` prefix) are active messages; a FIN completes an
//!   offloaded rendezvous send of this interface; an unexpected tagged message goes to the
//!   eager or rendezvous handler and counts in software's unexpected count; a matched eager
//!   message is copied from the receive buffer into the posted buffer ("placement", the CPU
//!   doing what the adapter would) and completes the receive; a matched rendezvous request has
//!   the interface read the sender's data with a real RDMA READ on the queue pair it came on,
//!   then send the FIN, then complete the receive.
//! * **List operations** ([`RcTm::recv_post`], [`RcTm::recv_cancel`]) run on the device when
//!   posted, carrying software's unexpected count (UCX's `SW_CNT`), so the device disables a
//!   receive posted before software saw every unexpected message (the race of
//!   `docs/notes/tm-offload-brief.md` section 4: the upper layer must search its unexpected
//!   messages and cancel such a receive itself). Their completions are handled in progress,
//!   never inside the call that posted them.
//! * **Send side.** Eager messages carry a TMH before the data (`SEND`, or `SEND_WITH_IMM`
//!   with the immediate's low half and the TMH's `app_ctx` its high half); a rendezvous
//!   request carries TMH, RVH and the user's header, and its operation waits in
//!   [`RcTm::sends`] for the receiver's FIN (`app_ctx` names it).
//!
//! Everything read from a peer is checked: headers by [`crate::tm::wire`]; a FIN must name a
//! live operation and repeat its address and length; a message that is neither an active
//! message nor a valid tagged message is dropped with a warning.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;

use rdma_core_sys as sys;
use ucs::mpool::PoolBuf;
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    AmRecv, Completion, IfaceFlags, Iov, OpCaps, TagCaps, TagHandlers, TagRecvContext, TagUnexpEager, TagUnexpRndv,
};

use super::config::RcConfig;
use super::iface::IfaceInner;
use crate::md::{pack_rkey, IbRegion};
use crate::tm::device::{CqeKind, CqeStatus, ListOp, PostError, TmAction, TmCaps, TmCqe, TmDevice};
use crate::tm::wire::{Rvh, TmMsg, Tmh, TmhOp, RVH_LEN, TMH_LEN};

/// The tag capabilities an interface with tag matching has (besides `TAG_EAGER_SHORT`, which
/// needs room for the TMH inline).
pub(crate) const FLAGS: IfaceFlags =
    IfaceFlags::TAG_EAGER_BCOPY.union(IfaceFlags::TAG_EAGER_ZCOPY).union(IfaceFlags::TAG_RNDV_ZCOPY);

/// A rendezvous request's headers (TMH, RVH and the user's) fit in this many bytes, as the
/// adapter's `max_rndv_hdr_size` bounds them (64 on the model: ConnectX's figure is not
/// documented).
pub(crate) const MAX_RNDV_HDR: usize = 64;

/// Software sends a SYNC after this many unexpected messages (UCX's
/// `IBV_DEVICE_MAX_UNEXP_COUNT`), so the device's count never runs 2^15 ahead.
const SYNC_EVERY: u16 = 1 << 14;

/// The largest rendezvous (the RVH's 32-bit length).
const MAX_RNDV: usize = u32::MAX as usize;

/// `IfaceAttr.tag` of an interface with tag matching.
pub(crate) fn caps(cfg: &RcConfig, max_inline: usize, max_send_sge: usize) -> TagCaps {
    let seg = cfg.ib.seg_size;
    TagCaps {
        recv_min_recv: 0,
        recv_max_zcopy: MAX_RNDV,
        recv_max_iov: 1,
        recv_max_outstanding: cfg.tm_num_tags() as usize,
        eager: OpCaps {
            max_short: max_inline.saturating_sub(TMH_LEN),
            max_bcopy: seg - TMH_LEN,
            min_zcopy: 0,
            max_zcopy: seg - TMH_LEN,
            opt_zcopy_align: 512,
            align_mtu: 0,
            max_iov: max_send_sge.saturating_sub(1).max(1),
            max_hdr: 0,
        },
        rndv: OpCaps {
            max_short: 0,
            max_bcopy: 0,
            min_zcopy: 0,
            max_zcopy: MAX_RNDV,
            opt_zcopy_align: 512,
            align_mtu: 0,
            max_iov: 1,
            max_hdr: MAX_RNDV_HDR - TMH_LEN - RVH_LEN,
        },
        emulated: true,
    }
}

/// A receive posted to the device.
struct TagRecv {
    ctx: Rc<TagRecvContext>,
    buf: *mut u8,
    len: usize,
    lkey: u32,
    /// The device's handle (its slot), for a DEL.
    handle: u32,
    /// The matched message's tag, immediate value, and whether it is a software rendezvous
    /// request (a `SEND_WITH_IMM` whose immediate value is 0), known once it matched.
    tag: u64,
    imm: u64,
    sw_rndv: bool,
    /// A software rendezvous request's header, whole (the buffer may be shorter).
    rndv_hdr: Option<Vec<u8>>,
    /// Matched: it can no longer be cancelled.
    consumed: bool,
    /// A cancel that waits for its DEL's completion.
    cancelling: bool,
}

/// The posted receives, named by `generation << 32 | index` in the device's `recv_wr_id`.
#[derive(Default)]
struct Recvs {
    slots: Vec<Option<(u32, TagRecv)>>,
    free: Vec<u32>,
    next_gen: u32,
    by_ctx: HashMap<*const TagRecvContext, u64>,
    addrs: HashSet<usize>,
}

impl Recvs {
    fn get(&mut self, id: u64) -> Option<&mut TagRecv> {
        let (g, i) = ((id >> 32) as u32, id as u32);
        match self.slots.get_mut(i as usize) {
            Some(Some((gen, r))) if *gen == g => Some(r),
            _ => None,
        }
    }

    fn insert(&mut self, r: TagRecv) -> u64 {
        let g = self.next_gen;
        self.next_gen = g.wrapping_add(1);
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        let id = (g as u64) << 32 | i as u64;
        self.by_ctx.insert(Rc::as_ptr(&r.ctx), id);
        self.addrs.insert(r.buf as usize);
        self.slots[i as usize] = Some((g, r));
        id
    }

    fn remove(&mut self, id: u64) -> Option<TagRecv> {
        self.get(id)?;
        let i = id as u32;
        let (_, r) = self.slots[i as usize].take()?;
        self.free.push(i);
        self.by_ctx.remove(&Rc::as_ptr(&r.ctx));
        self.addrs.remove(&(r.buf as usize));
        Some(r)
    }
}

/// An offloaded rendezvous send waiting for its FIN.
struct RndvSend {
    qpn: u32,
    va: u64,
    len: u32,
    comp: Option<Rc<Completion>>,
}

/// Work for the device that waits for send resources: a rendezvous READ or a FIN.
enum Work {
    Read { read: u64, qpn: u32, rvh: Rvh, buf: *mut u8, lkey: u32 },
    Fin { qpn: u32, msg: [u8; TMH_LEN + RVH_LEN] },
}

/// Counters of an interface's tag matching, with the names of UCX's `rc_mlx5` statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TmStats {
    /// Messages that matched a posted receive (eager and rendezvous requests).
    pub rx_exp: u64,
    /// Unexpected eager messages.
    pub rx_unexp_eager: u64,
    /// Unexpected offloaded rendezvous requests.
    pub rx_unexp_rndv: u64,
    /// Software rendezvous requests that matched a posted receive.
    pub rx_exp_rndv_req: u64,
    /// Unexpected software rendezvous requests.
    pub rx_unexp_rndv_req: u64,
    /// FINs that completed an offloaded rendezvous send.
    pub rx_rndv_fin: u64,
    /// Receives posted (ADD operations).
    pub tx_add_op: u64,
    /// Receives removed (DEL operations).
    pub tx_del_op: u64,
    /// Unexpected counts reported on their own (SYNC operations).
    pub tx_sync_op: u64,
}

/// An interface's tag matching.
pub(crate) struct RcTm {
    /// Counters.
    pub stats: Cell<TmStats>,
    dev: RefCell<TmDevice>,
    handlers: TagHandlers,
    /// Unexpected tagged messages software has handled (16 bits, wrapping, as the device's).
    sw_unexp: Cell<u16>,
    recvs: RefCell<Recvs>,
    /// Offloaded rendezvous sends by `app_ctx` (`generation << 16 | index`).
    sends: RefCell<Vec<Option<(u16, RndvSend)>>>,
    sends_free: RefCell<Vec<u16>>,
    sends_gen: Cell<u16>,
    work: RefCell<VecDeque<Work>>,
    /// `TM_EMU_OP_DELAY`, the progress calls so far, and when each delayed list operation is
    /// due (in posting order).
    op_delay: u32,
    tick: Cell<u64>,
    due: RefCell<VecDeque<u64>>,
}

impl RcTm {
    pub(crate) fn new(cfg: &RcConfig, handlers: TagHandlers, dev_name: &str) -> RcTm {
        let n = cfg.tm_num_tags();
        tracing::info!(
            "rc_verbs on {dev_name}: tag matching on, emulated (a software model of the adapter's matching, \
             {n} tags, list operations delayed by {} progress calls); performance is not that of hardware offload",
            cfg.tm_emu_op_delay
        );
        RcTm {
            stats: Cell::default(),
            dev: RefCell::new(TmDevice::new(TmCaps { max_num_tags: n, max_ops: 2 * n + 2 })),
            handlers,
            sw_unexp: Cell::new(0),
            recvs: RefCell::default(),
            sends: RefCell::default(),
            sends_free: RefCell::default(),
            sends_gen: Cell::new(0),
            work: RefCell::default(),
            op_delay: cfg.tm_emu_op_delay,
            tick: Cell::new(0),
            due: RefCell::default(),
        }
    }

    fn count(&self, f: impl FnOnce(&mut TmStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// A list operation was posted: the device runs it now, or, with `TM_EMU_OP_DELAY`, that
    /// many progress calls later (in posting order), as an adapter that is not done yet.
    fn op_posted(&self) {
        if self.op_delay == 0 {
            let mut d = self.dev.borrow_mut();
            while d.step() {}
        } else {
            self.due.borrow_mut().push_back(self.tick.get() + self.op_delay as u64);
        }
    }

    /// Runs the delayed list operations that are due.
    fn run_due(&self) {
        let tick = self.tick.get() + 1;
        self.tick.set(tick);
        loop {
            let due = self.due.borrow().front().copied();
            match due {
                Some(t) if t <= tick => {
                    self.due.borrow_mut().pop_front();
                    self.dev.borrow_mut().step();
                }
                _ => break,
            }
        }
    }

    /// Posts a receive of `iov` (one contiguous buffer) for `tag` under `mask`
    /// (`uct_iface_tag_recv_zcopy`).
    ///
    /// # Safety
    /// The buffer stays valid until `ctx.completed` (or `ctx.rndv`) runs or a cancel succeeds.
    pub(crate) unsafe fn recv_post(
        &self,
        tag: u64,
        mask: u64,
        iov: &[Iov<'_>],
        ctx: Rc<TagRecvContext>,
    ) -> UcsResult<()> {
        let [e] = iov else {
            tracing::debug!("rc_verbs: a tagged receive takes one buffer, not {}", iov.len());
            return Err(Status::InvalidParam);
        };
        if e.count != 1 {
            tracing::debug!("rc_verbs: a tagged receive takes one contiguous buffer");
            return Err(Status::InvalidParam);
        }
        let (buf, len) = (e.buffer, e.length);
        if len > MAX_RNDV {
            return Err(Status::InvalidParam);
        }
        let lkey = match e.memh.and_then(|m| m.downcast_ref::<IbRegion>()) {
            Some(r) if e.memh.is_some_and(|m| m.contains(buf, len)) => r.lkey(),
            _ if len == 0 => 0,
            _ => {
                tracing::debug!("rc_verbs: a tagged receive's buffer needs an ib registration that covers it");
                return Err(Status::InvalidParam);
            }
        };
        {
            let r = self.recvs.borrow();
            if r.by_ctx.contains_key(&Rc::as_ptr(&ctx)) {
                tracing::debug!("rc_verbs: this tagged receive's context is posted already");
                return Err(Status::InvalidParam);
            }
            if len > 0 && r.addrs.contains(&(buf as usize)) {
                // (UCX refuses the same address twice: two receives would share one buffer.)
                return Err(Status::AlreadyExists);
            }
        }
        let id = {
            let mut r = self.recvs.borrow_mut();
            let rv = TagRecv {
                ctx,
                buf,
                len,
                lkey,
                handle: 0,
                tag: 0,
                imm: 0,
                sw_rndv: false,
                rndv_hdr: None,
                consumed: false,
                cancelling: false,
            };
            r.insert(rv)
        };
        let op = ListOp::Add {
            wr_id: id,
            recv_wr_id: id,
            tag,
            mask,
            len,
            signaled: true,
            unexpected_cnt: Some(self.sw_unexp.get()),
        };
        let posted = self.dev.borrow_mut().post(&[op]);
        match posted {
            Ok(h) => {
                if let Some(r) = self.recvs.borrow_mut().get(id) {
                    r.handle = h[0].expect("an ADD has a handle");
                }
                self.count(|s| s.tx_add_op += 1);
                self.op_posted();
                Ok(())
            }
            Err(e) => {
                self.recvs.borrow_mut().remove(id);
                if self.dev.borrow().free_slots() == 0 {
                    Err(Status::ExceedsLimit)
                } else {
                    tracing::trace!("rc_verbs: tag list operations full: {e}");
                    Err(Status::NoResource)
                }
            }
        }
    }

    /// Cancels a posted receive (`uct_iface_tag_recv_cancel`): with `force` at once and without
    /// a callback, else its `completed` runs with `Canceled` from progress. A receive that
    /// matched already cannot be cancelled (`Busy`): it completes through its callbacks.
    pub(crate) fn recv_cancel(&self, ctx: &Rc<TagRecvContext>, force: bool) -> UcsResult<()> {
        let id = {
            let mut r = self.recvs.borrow_mut();
            let Some(&id) = r.by_ctx.get(&Rc::as_ptr(ctx)) else {
                tracing::debug!("rc_verbs: cancel of a tagged receive that is not posted");
                return Err(Status::NoElem);
            };
            let rv = r.get(id).expect("indexed");
            if rv.consumed {
                return Err(Status::Busy);
            }
            if rv.cancelling {
                if force {
                    // Its DEL is queued already: the receive is software's again at once (a
                    // message the device still matches before the DEL runs goes to software,
                    // `unclaimed`; the DEL's completion finds nothing to report).
                    r.remove(id);
                }
                return Ok(());
            }
            rv.cancelling = true;
            id
        };
        let handle = self.recvs.borrow_mut().get(id).map(|r| r.handle).unwrap_or(0);
        let op = ListOp::Del { wr_id: id, handle, signaled: !force, unexpected_cnt: Some(self.sw_unexp.get()) };
        let posted = self.dev.borrow_mut().post(&[op]);
        if let Err(e) = posted {
            if let Some(r) = self.recvs.borrow_mut().get(id) {
                r.cancelling = false;
            }
            return match e {
                PostError::Full => Err(Status::NoResource),
                PostError::BadHandle(_) => Err(Status::Busy),
            };
        }
        self.count(|s| s.tx_del_op += 1);
        self.op_posted();
        if force {
            // The receive is software's again (the DEL ran, or runs before anything else the
            // device does with it: a message it still matches meanwhile goes to software).
            self.recvs.borrow_mut().remove(id);
        }
        Ok(())
    }

    /// A message arrived in shared receive queue buffer `idx` (`len` bytes in `buf`): through
    /// the device, then its completions.
    pub(crate) fn rx(&self, iface: &IfaceInner, wc: &sys::ibv_wc, idx: usize, buf: &mut Option<PoolBuf>, len: usize) {
        let Some(b) = buf.as_ref() else { return };
        let msg = &b[..len];
        let action = self.dev.borrow_mut().arrive(msg, idx as u64, wc.qp_num);
        // The receive the device matched: reported consumed at once, before the callbacks of
        // completions the device queued earlier run (one of them could otherwise have software
        // take the receive that now holds this message).
        let mut consumed = None;
        match action {
            Some(TmAction::Place { recv_wr_id, from, len: n }) => {
                let (tag, app_ctx) = Tmh::decode(msg).map_or((0, 0), |(t, _)| (t.tag, t.app_ctx));
                let (with_imm, imm) = imm_value(wc, app_ctx);
                let mut r = self.recvs.borrow_mut();
                match r.get(recv_wr_id) {
                    Some(rv) if n <= rv.len && from + n <= msg.len() => {
                        rv.tag = tag;
                        rv.imm = imm;
                        rv.sw_rndv = with_imm && rv.imm == 0;
                        if rv.sw_rndv {
                            // Software gets the whole request, however short the buffer.
                            rv.rndv_hdr = msg.get(from..).map(<[u8]>::to_vec);
                        } else if let Ok(TmMsg::Rndv(_, _, user)) = TmMsg::decode(msg) {
                            // A rendezvous too large for the buffer: software gets its user
                            // header whole (the buffer holds what of the headers fits).
                            rv.rndv_hdr = Some(user.to_vec());
                        }
                        rv.consumed = true;
                        consumed = Some(rv.ctx.clone());
                        // SAFETY: the posted buffer is valid for `rv.len >= n` bytes until the
                        // receive completes (the caller of `recv_post` promised); the source
                        // lies within the received message (checked).
                        unsafe { ucs::memory::copy(msg.as_ptr().add(from), rv.buf, n) };
                    }
                    Some(_) => tracing::error!("rc_verbs: the tag device placed data outside a receive's buffer"),
                    None => {
                        drop(r);
                        self.unclaimed(wc, buf, len);
                    }
                }
            }
            Some(TmAction::Read { read, qp, recv_wr_id, rvh }) => {
                let target = self.recvs.borrow_mut().get(recv_wr_id).map(|rv| {
                    rv.consumed = true;
                    rv.tag = Tmh::decode(msg).map_or(0, |(t, _)| t.tag);
                    (rv.buf, rv.lkey, rv.ctx.clone())
                });
                match target {
                    Some((dst, lkey, ctx)) => {
                        consumed = Some(ctx);
                        self.start_read(iface, Work::Read { read, qpn: qp, rvh, buf: dst, lkey })
                    }
                    None => {
                        // No read: the device completes it as failed, without a FIN.
                        self.read_finished(iface, read, false);
                        self.unclaimed(wc, buf, len);
                    }
                }
            }
            Some(TmAction::Fin { .. }) | None => {}
        }
        if let Some(ctx) = consumed {
            self.count(|s| s.rx_exp += 1);
            (ctx.tag_consumed)();
        }
        self.drain(iface, Some((wc, idx, buf, len)));
    }

    /// The device matched a message to a receive that software took back meanwhile (a forced
    /// cancel whose DEL had not run yet: with `TM_EMU_OP_DELAY`, as on an adapter that runs
    /// list operations later): software gets the message as unexpected, so it is not lost.
    /// (Not counted as unexpected: the device did not count it.)
    fn unclaimed(&self, wc: &sys::ibv_wc, buf: &mut Option<PoolBuf>, len: usize) {
        self.to_software(wc, buf, len, false);
    }

    /// Hands the tagged message in `buf` to the unexpected handlers: an eager message with its
    /// immediate value, a software rendezvous request (a `SEND_WITH_IMM` of 0) or an offloaded
    /// one with its address and packed key. `counted`: the device counted it as unexpected
    /// (the statistics say so too).
    fn to_software(&self, wc: &sys::ibv_wc, buf: &mut Option<PoolBuf>, len: usize, counted: bool) {
        let Some(b) = buf.as_ref() else { return };
        match TmMsg::decode(&b[..len]) {
            Ok(TmMsg::Eager(tmh, payload)) => match imm_value(wc, tmh.app_ctx) {
                (true, 0) => {
                    if counted {
                        self.count(|s| s.rx_unexp_rndv_req += 1);
                    }
                    let u = TagUnexpRndv { stag: tmh.tag, header: payload, remote_addr: 0, length: 0, rkey_buf: &[] };
                    (self.handlers.rndv)(u);
                }
                (_, imm) => {
                    if counted {
                        self.count(|s| s.rx_unexp_eager += 1);
                    }
                    let n = payload.len();
                    (self.handlers.eager)(TagUnexpEager {
                        stag: tmh.tag,
                        imm,
                        msg: AmRecv::from_desc(buf, TMH_LEN, n),
                    });
                }
            },
            Ok(TmMsg::Rndv(tmh, rvh, header)) => {
                if counted {
                    self.count(|s| s.rx_unexp_rndv += 1);
                }
                let rkey = pack_rkey(rvh.rkey, rvh.va, rvh.len as u64);
                (self.handlers.rndv)(TagUnexpRndv {
                    stag: tmh.tag,
                    header,
                    remote_addr: rvh.va,
                    length: rvh.len as usize,
                    rkey_buf: &rkey,
                });
            }
            _ => tracing::error!("rc_verbs: the tag device passed on a message that is not tagged"),
        }
    }

    /// Handles the device's completions in order. `cur` is the message that just arrived (its
    /// completion is among them); without one, completions of messages are not expected.
    fn drain(&self, iface: &IfaceInner, mut cur: Option<(&sys::ibv_wc, usize, &mut Option<PoolBuf>, usize)>) {
        loop {
            let Some(c) = self.dev.borrow_mut().poll() else { break };
            match c.kind {
                CqeKind::Add | CqeKind::Sync => {}
                CqeKind::Del => self.del_done(&c),
                CqeKind::Recv if c.matched || c.data_valid => self.expected(&c),
                CqeKind::Recv | CqeKind::NoTag => match cur.as_mut() {
                    Some((wc, idx, buf, len)) if c.wr_id == *idx as u64 => {
                        if c.kind == CqeKind::NoTag {
                            self.untagged(iface, wc, buf, *len);
                        } else {
                            self.unexpected(wc, buf, *len);
                        }
                    }
                    _ => {
                        tracing::error!(wr_id = c.wr_id, "rc_verbs: a tag-device completion for a message not at hand")
                    }
                },
            }
        }
    }

    /// A DEL completed: a cancel that was in time completes its receive with `Canceled`; one
    /// that came after the match does nothing (the match completes the receive; UCX would
    /// complete it twice).
    fn del_done(&self, c: &TmCqe) {
        if c.status != CqeStatus::Success {
            if let Some(r) = self.recvs.borrow_mut().get(c.wr_id) {
                r.cancelling = false;
            }
            return;
        }
        let r = self.recvs.borrow_mut().remove(c.wr_id);
        if let Some(r) = r {
            (r.ctx.completed)(0, 0, 0, Status::Canceled);
        }
    }

    /// A completion of a matched message: the match (reported when the device placed the
    /// message or started its read, see [`RcTm::rx`]), the data, or both.
    fn expected(&self, c: &TmCqe) {
        if !self.recvs.borrow_mut().get(c.wr_id).is_some_and(|rv| rv.consumed) {
            // (A receive taken back by a forced cancel: its message went to software.)
            tracing::debug!("rc_verbs: a tag-device completion for a receive taken back");
            return;
        }
        if !c.data_valid {
            return;
        }
        let Some(rv) = self.recvs.borrow_mut().remove(c.wr_id) else { return };
        let n = c.byte_len.min(rv.len);
        // SAFETY: the posted buffer is valid for `rv.len` bytes until this completion, and
        // its first `n <= rv.len` bytes were written (placed or read) before it.
        let placed = || unsafe { std::slice::from_raw_parts(rv.buf as *const u8, n) };
        match c.status {
            CqeStatus::Success | CqeStatus::LocLenErr if rv.sw_rndv => {
                self.count(|s| s.rx_exp_rndv_req += 1);
                (rv.ctx.rndv)(rv.tag, rv.rndv_hdr.as_deref().unwrap_or_else(placed), Status::Ok)
            }
            CqeStatus::Success => (rv.ctx.completed)(rv.tag, rv.imm, n, Status::Ok),
            CqeStatus::LocLenErr => (rv.ctx.completed)(rv.tag, rv.imm, n, Status::MessageTruncated),
            CqeStatus::RndvIncomplete => {
                // The request's headers are in the buffer, as far as they fit: software takes
                // over with the user's header (kept whole at placement).
                let h = match rv.rndv_hdr.as_deref() {
                    Some(u) => u,
                    None => placed().get(TMH_LEN + RVH_LEN..).unwrap_or(&[]),
                };
                (rv.ctx.rndv)(rv.tag, h, Status::Ok)
            }
            CqeStatus::ReadErr => (rv.ctx.completed)(rv.tag, 0, 0, Status::IoError),
            CqeStatus::TmErr => {}
        }
    }

    /// An untagged message: an active message, or the FIN of one of this interface's
    /// rendezvous sends.
    fn untagged(&self, iface: &IfaceInner, wc: &sys::ibv_wc, buf: &mut Option<PoolBuf>, len: usize) {
        let Some(b) = buf.as_ref() else { return };
        match b[0] {
            op if op == TmhOp::NoTag as u8 => {
                if len < 2 {
                    tracing::warn!("rc_verbs: dropped an empty active message (no header byte)");
                    return;
                }
                iface.am_rx(wc.qp_num, buf, 1, len - 1);
            }
            op if op == TmhOp::Fin as u8 => match TmMsg::decode(&b[..len]) {
                Ok(TmMsg::Fin(tmh, rvh)) => self.fin(wc.qp_num, tmh, rvh),
                Ok(_) => unreachable!("a FIN opcode decodes as a FIN"),
                Err(e) => tracing::warn!("rc_verbs: dropped a malformed FIN: {e}"),
            },
            _ => match TmMsg::decode(&b[..len]) {
                Err(e) => tracing::warn!("rc_verbs: dropped a malformed tagged message: {e}"),
                Ok(_) => tracing::warn!("rc_verbs: dropped a message the tag device did not classify"),
            },
        }
    }

    /// An unexpected tagged message: to the eager or the rendezvous handler, counted.
    fn unexpected(&self, wc: &sys::ibv_wc, buf: &mut Option<PoolBuf>, len: usize) {
        self.to_software(wc, buf, len, true);
        let n = self.sw_unexp.get().wrapping_add(1);
        self.sw_unexp.set(n);
        if n % SYNC_EVERY == 0 {
            let op = ListOp::Sync { wr_id: 0, signaled: false, unexpected_cnt: Some(n) };
            if self.dev.borrow_mut().post(&[op]).is_ok() {
                self.count(|s| s.tx_sync_op += 1);
                self.op_posted();
            } else {
                tracing::debug!("rc_verbs: tag list operations full; the count goes with the next one");
            }
        }
    }

    /// A FIN for rendezvous send `app_ctx`: it completes, if it names a live one.
    fn fin(&self, qpn: u32, tmh: Tmh, rvh: Rvh) {
        let (g, i) = ((tmh.app_ctx >> 16) as u16, tmh.app_ctx as u16);
        let done = {
            let mut s = self.sends.borrow_mut();
            s.get_mut(i as usize)
                .filter(|e| {
                    e.as_ref().is_some_and(|(gen, r)| *gen == g && r.qpn == qpn && r.va == rvh.va && r.len == rvh.len)
                })
                .and_then(|e| e.take().map(|(_, r)| r))
        };
        match done {
            Some(r) => {
                self.count(|s| s.rx_rndv_fin += 1);
                self.sends_free.borrow_mut().push(i);
                if let Some(c) = r.comp {
                    c.complete(Status::Ok);
                }
            }
            None => tracing::warn!(
                app_ctx = tmh.app_ctx,
                "rc_verbs: dropped a FIN that names no rendezvous of this queue pair"
            ),
        }
    }

    /// Registers an offloaded rendezvous send of `len` bytes at `va` on queue pair `qpn`: its
    /// `app_ctx`. `None` when 65536 are outstanding.
    pub(crate) fn send_start(&self, qpn: u32, va: u64, len: u32, comp: Option<Rc<Completion>>) -> Option<u32> {
        let mut s = self.sends.borrow_mut();
        let i = match self.sends_free.borrow_mut().pop() {
            Some(i) => i,
            None if s.len() < 1 << 16 => {
                s.push(None);
                (s.len() - 1) as u16
            }
            None => return None,
        };
        let g = self.sends_gen.get();
        self.sends_gen.set(g.wrapping_add(1));
        s[i as usize] = Some((g, RndvSend { qpn, va, len, comp }));
        Some((g as u32) << 16 | i as u32)
    }

    /// Forgets rendezvous send `app_ctx` (not posted after all, or cancelled): no completion.
    /// False when it was not outstanding.
    pub(crate) fn send_forget(&self, app_ctx: u32) -> bool {
        let (g, i) = ((app_ctx >> 16) as u16, app_ctx as u16);
        let mut s = self.sends.borrow_mut();
        match s.get_mut(i as usize) {
            Some(e) if e.as_ref().is_some_and(|(gen, _)| *gen == g) => {
                *e = None;
                self.sends_free.borrow_mut().push(i);
                true
            }
            _ => false,
        }
    }

    /// Queue pair `qpn` failed or went: its rendezvous sends complete with `status` (no FIN
    /// will come), its queued device work is dropped (the reads complete as failed).
    pub(crate) fn ep_gone(&self, iface: &IfaceInner, qpn: u32, status: Status) {
        let mut done = Vec::new();
        {
            let mut s = self.sends.borrow_mut();
            for (i, e) in s.iter_mut().enumerate() {
                if e.as_ref().is_some_and(|(_, r)| r.qpn == qpn) {
                    if let Some((_, r)) = e.take() {
                        self.sends_free.borrow_mut().push(i as u16);
                        done.extend(r.comp);
                    }
                }
            }
        }
        for c in done {
            c.complete(status);
        }
        let mut failed_reads = Vec::new();
        self.work.borrow_mut().retain(|w| match *w {
            Work::Read { read, qpn: q, .. } if q == qpn => {
                failed_reads.push(read);
                false
            }
            Work::Fin { qpn: q, .. } => q != qpn,
            Work::Read { .. } => true,
        });
        for r in failed_reads {
            self.read_finished(iface, r, false);
        }
    }

    /// Starts (or queues, without send resources) the device's READ or FIN.
    fn start_read(&self, iface: &IfaceInner, w: Work) {
        if !self.work.borrow().is_empty() {
            // (In order behind what waits already.)
            self.work.borrow_mut().push_back(w);
            return;
        }
        if let Some(w) = self.try_work(iface, w) {
            self.work.borrow_mut().push_back(w);
        }
    }

    /// Posts `w`; gives it back when it has to wait for send resources.
    fn try_work(&self, iface: &IfaceInner, w: Work) -> Option<Work> {
        let qpn = match &w {
            Work::Read { qpn, .. } | Work::Fin { qpn, .. } => *qpn,
        };
        let Some(ep) = iface.ep_by_qpn(qpn) else {
            if let Work::Read { read, .. } = w {
                self.read_finished(iface, read, false);
            }
            return None;
        };
        let r: OpResult = match &w {
            Work::Read { read, rvh, buf, lkey, .. } => ep.tm_read(*read, rvh, *buf, *lkey),
            Work::Fin { msg, .. } => ep.tm_fin(msg),
        };
        match r {
            Ok(Outcome::NoResource) => Some(w),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(
                    "rc_verbs: the tag device's {} failed: {e}",
                    if matches!(w, Work::Read { .. }) { "read" } else { "FIN" }
                );
                if let Work::Read { read, .. } = w {
                    self.read_finished(iface, read, false);
                }
                None
            }
        }
    }

    /// The device's rendezvous READ `read` finished (`ok`: the data is in the buffer): the
    /// device completes the receive and has the FIN sent.
    pub(crate) fn read_finished(&self, iface: &IfaceInner, read: u64, ok: bool) {
        let fin = self.dev.borrow_mut().read_done(read, ok);
        match fin {
            Some(TmAction::Fin { qp, tmh, rvh }) => {
                let mut msg = [0u8; TMH_LEN + RVH_LEN];
                msg[..TMH_LEN].copy_from_slice(&tmh.to_bytes());
                msg[TMH_LEN..].copy_from_slice(&rvh.to_bytes());
                self.start_read(iface, Work::Fin { qpn: qp, msg });
            }
            Some(_) => unreachable!("read_done returns a FIN"),
            None if ok => tracing::error!(read, "rc_verbs: the tag device knows no such read"),
            None => {}
        }
    }

    /// Progress: device work that waited for send resources, then completions (of list
    /// operations and reads) not handled yet.
    pub(crate) fn progress(&self, iface: &IfaceInner) -> usize {
        let mut n = 0;
        if self.op_delay > 0 {
            self.run_due();
        }
        loop {
            let w = self.work.borrow_mut().pop_front();
            let Some(w) = w else { break };
            match self.try_work(iface, w) {
                Some(w) => {
                    self.work.borrow_mut().push_front(w);
                    break;
                }
                None => n += 1,
            }
        }
        self.drain(iface, None);
        n
    }
}

/// Whether a receive completion carries an immediate value, and the 64-bit value UCX makes of
/// it: the TMH's `app_ctx` above the IB immediate (0 without one).
fn imm_value(wc: &sys::ibv_wc, app_ctx: u32) -> (bool, u64) {
    if wc.wc_flags & sys::IBV_WC_WITH_IMM != 0 {
        // SAFETY: both members of the union are 32-bit integers; with `IBV_WC_WITH_IMM` the
        // provider wrote `imm_data` (network order).
        let lo = u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data });
        (true, (app_ctx as u64) << 32 | lo as u64)
    } else {
        (false, 0)
    }
}
