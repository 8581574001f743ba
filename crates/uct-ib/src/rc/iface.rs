//! The `rc_verbs` interface: completion queues, the shared receive queue and its descriptors,
//! the endpoint table, pending requests and events.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};

use rdma_core_sys as sys;
use ucs::arbiter::GroupId;
use ucs::mpool::{MemPool, PoolBuf};
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    AmRecv, AtomicCaps, AtomicOps, BandwidthModel, BaseIface, Completion, Ep, EpConnect, EpParams, EventFlags,
    FlushFlags, Iface, IfaceAttr, IfaceFlags, IfaceParams, Iov, LinearFunc, OpCaps, ProgressFlags, Resources, Tag,
    TagRecvContext, Worker,
};

use super::config::RcConfig;
use super::ep::{EpShared, RcEp};
use super::tm::{RcTm, TmStats};
use super::{DevAddr, AM_ID_MASK, FC_HARD_REQ, FC_PURE_GRANT, FC_SOFT_REQ};
use crate::device::{GidChoice, IbDevice, LinkLayer, Port};
use crate::md::IbMd;
use crate::pool::{reg_pool, RecvSlots, RegChunks};
use crate::verbs::{CompChannel, Cq, Pd, Qp, Srq};

pub(crate) struct IfaceInner {
    /// Attributes, AM handlers, pending queue, progress registration, failure handler.
    pub base: BaseIface,
    /// Keeps the device open for as long as endpoints exist.
    pub _dev: Rc<IbDevice>,
    pub pd: Rc<Pd>,
    pub port: Port,
    pub gid: GidChoice,
    pub cfg: RcConfig,
    pub chan: Rc<CompChannel>,
    pub send_cq: Rc<Cq>,
    pub recv_cq: Rc<Cq>,
    pub srq: Rc<Srq>,
    pub tx_pool: Rc<MemPool>,
    pub tx_chunks: Rc<RegChunks>,
    rx_pool: Rc<MemPool>,
    rx_chunks: Rc<RegChunks>,
    rx: RefCell<RecvSlots>,
    /// Send CQ entries not yet claimed by signaled work requests.
    pub cq_available: Cell<i64>,
    /// Endpoints by local QP number, and by pending group.
    pub eps: RefCell<HashMap<u32, Weak<EpShared>>>,
    pub groups: RefCell<HashMap<GroupId, Weak<EpShared>>>,
    /// Endpoints that owe their peer a credit grant.
    pub grants: RefCell<Vec<Weak<EpShared>>>,
    /// Completions polled while arming, handled by the next progress.
    stash_tx: RefCell<Vec<sys::ibv_wc>>,
    stash_rx: RefCell<Vec<sys::ibv_wc>>,
    wc: RefCell<Vec<sys::ibv_wc>>,
    /// Largest inline send, and scatter/gather entries per send, as the provider granted.
    pub max_inline: usize,
    pub max_send_sge: usize,
    pub max_rd_atomic: u32,
    /// Bytes before an active message's header byte: 1 (the `NO_TAG` prefix) with tag
    /// matching on, else 0.
    pub am_off: usize,
    /// Tag matching (emulated), when on.
    pub tm: Option<RcTm>,
    closing: Cell<bool>,
}

/// Processes one send completion.
fn handle_tx(inner: &IfaceInner, wc: &sys::ibv_wc) {
    let ep = inner.eps.borrow().get(&wc.qp_num).and_then(Weak::upgrade);
    match ep {
        Some(ep) => ep.on_send_completion(wc),
        // A completion of an endpoint destroyed meanwhile: its credits were returned then.
        None => tracing::trace!(qpn = wc.qp_num, "send completion of a destroyed endpoint"),
    }
}

impl IfaceInner {
    pub(crate) fn ep_by_qpn(&self, qpn: u32) -> Option<Rc<EpShared>> {
        self.eps.borrow().get(&qpn).and_then(Weak::upgrade)
    }

    /// Processes one receive completion.
    pub(crate) fn handle_rx(&self, wc: &sys::ibv_wc) {
        let idx = wc.wr_id as usize;
        let mut buf = {
            let mut rx = self.rx.borrow_mut();
            rx.refill.push(idx as u32);
            match rx.slots.get_mut(idx).and_then(Option::take) {
                Some(b) => Some(b),
                None => {
                    tracing::error!(wr_id = wc.wr_id, "rc_verbs: receive completion for an empty slot");
                    return;
                }
            }
        };
        if wc.status != sys::IBV_WC_SUCCESS {
            if wc.status != sys::IBV_WC_WR_FLUSH_ERR {
                tracing::warn!("rc_verbs: receive completion with error: {}", sys::wc_status_str(wc.status));
            }
            self.rx.borrow_mut().slots[idx] = buf;
            return;
        }
        let len = (wc.byte_len as usize).min(self.cfg.ib.seg_size);
        if len == 0 {
            tracing::warn!("rc_verbs: dropped an empty message (no header byte)");
            self.rx.borrow_mut().slots[idx] = buf;
            return;
        }
        match &self.tm {
            None => self.am_rx(wc.qp_num, &mut buf, 0, len),
            Some(tm) => tm.rx(self, wc, idx, &mut buf, len),
        }
        // A kept descriptor left `buf` empty; the refill takes a fresh one.
        self.rx.borrow_mut().slots[idx] = buf;
    }

    /// An active message (or a credit grant) from queue pair `qpn`: its header byte at `off` in
    /// `buf`, `len` bytes from there (at least 1).
    pub(crate) fn am_rx(&self, qpn: u32, buf: &mut Option<PoolBuf>, off: usize, len: usize) {
        let hdr = buf.as_ref().map_or(0, |b| b[off]);
        if hdr & FC_PURE_GRANT != 0 {
            if let Some(ep) = self.ep_by_qpn(qpn) {
                ep.on_grant();
            }
        } else {
            if hdr & (FC_SOFT_REQ | FC_HARD_REQ) != 0 {
                if let Some(ep) = self.ep_by_qpn(qpn) {
                    ep.owe_grant();
                }
            }
            let _ = self.base.am.invoke(hdr & AM_ID_MASK, AmRecv::from_desc(buf, off + 1, len - 1));
        }
    }

    /// Posts receives for every slot that needs one, in batches; returns how many were posted.
    fn refill(&self) -> usize {
        let srq = self.srq.as_ptr();
        self.rx.borrow_mut().refill(&self.rx_pool, &self.rx_chunks, self.cfg.ib.seg_size, "ibv_post_srq_recv", |wrs| {
            let mut bad = std::ptr::null_mut();
            // SAFETY: the SRQ is live; the chain and its SGEs live in the slots' arrays for the
            // call; every buffer is a registered pool slot kept in its slot until completion.
            unsafe { sys::ibv_post_srq_recv(srq, wrs, &mut bad) }
        })
    }

    /// Sends the credit grants owed; keeps those that found no resources.
    fn send_grants(&self) {
        let owed = std::mem::take(&mut *self.grants.borrow_mut());
        let mut left = Vec::new();
        for w in owed {
            if let Some(ep) = w.upgrade() {
                if !ep.send_grant() {
                    left.push(w);
                }
            }
        }
        self.grants.borrow_mut().extend(left);
    }

    fn dispatch_pending(&self) -> usize {
        if self.base.pending.is_empty() {
            return 0;
        }
        self.base.pending.dispatch(|g| {
            if self.cq_available.get() <= 0 {
                return Resources::IfaceExhausted;
            }
            match self.groups.borrow().get(&g).and_then(Weak::upgrade) {
                Some(ep) if ep.has_send_resources() => Resources::Available,
                Some(ep) if ep.is_failed() => Resources::Available,
                _ => Resources::EpExhausted,
            }
        })
    }

    pub(crate) fn progress(&self) -> usize {
        let mut n = 0;
        if let Some(tm) = &self.tm {
            n += tm.progress(self);
        }
        let stash: Vec<sys::ibv_wc> = std::mem::take(&mut *self.stash_tx.borrow_mut());
        for wc in &stash {
            handle_tx(self, wc);
        }
        n += stash.len();
        let stash: Vec<sys::ibv_wc> = std::mem::take(&mut *self.stash_rx.borrow_mut());
        for wc in &stash {
            self.handle_rx(wc);
        }
        n += stash.len();

        // The completion array is taken out while handlers run (no copy, no allocation); a
        // nested call would find it empty and poll nothing.
        let mut wc = std::mem::take(&mut *self.wc.borrow_mut());
        let tx_n = self.cfg.ib.tx_max_poll.min(wc.len());
        let got = self.send_cq.poll(&mut wc[..tx_n]);
        for w in &wc[..got] {
            handle_tx(self, w);
        }
        n += got;
        let rx_n = self.cfg.ib.rx_max_poll.min(wc.len());
        let got = self.recv_cq.poll(&mut wc[..rx_n]);
        for w in &wc[..got] {
            self.handle_rx(w);
        }
        n += got;
        *self.wc.borrow_mut() = wc;
        if !self.rx.borrow().refill.is_empty() {
            self.refill();
        }
        if !self.grants.borrow().is_empty() {
            self.send_grants();
        }
        n + self.dispatch_pending()
    }

    /// Reports an endpoint failure to the user's handler.
    pub(crate) fn report_failure(&self, user_data: u64, status: Status) {
        self.base.report_failure(user_data, status);
    }
}

/// An `rc_verbs` interface on one port.
pub struct RcIface {
    inner: Rc<IfaceInner>,
}

impl RcIface {
    /// Opens the interface on `port` of the memory domain's device.
    pub fn open(md: &IbMd, port: u8, worker: &Worker, params: &IfaceParams) -> UcsResult<RcIface> {
        let mut cfg = RcConfig::read(None, &params.config)?;
        let dev = md.dev.clone();
        // Tag matching needs both unexpected-message handlers (as UCX's rc_mlx5), and here the
        // emulated device: hardware tag matching is not driven yet.
        let hw_tags = dev.attr.tm_caps.max_num_tags;
        let tm_on = cfg.tm_enable && params.tag_handlers.is_some() && cfg.tm_emulate;
        if cfg.tm_enable && params.tag_handlers.is_none() {
            tracing::debug!("rc_verbs: TM_ENABLE without tag handlers: tag matching stays off");
        } else if cfg.tm_enable && !cfg.tm_emulate {
            tracing::warn!(
                "rc_verbs on {}: TM_EMULATE=n, and hardware tag matching ({hw_tags} tags reported) is not \
                 implemented: tag matching stays off",
                dev.name
            );
        } else if tm_on && hw_tags > 0 {
            tracing::info!(
                "rc_verbs on {}: the device reports hardware tag matching ({hw_tags} tags), which this \
                 implementation does not drive yet: using the emulated device",
                dev.name
            );
        }
        if tm_on {
            // The receive segment bounds an eager tagged message.
            cfg.ib.seg_size = cfg.tm_seg_size;
        }
        let am_off = tm_on as usize;
        let port = dev.port(port).ok_or(Status::NoDevice)?.clone();
        let gid = dev.select_gid(&port, cfg.ib.gid_index)?;
        let ctx = &dev.ctx;
        let chan = CompChannel::create(ctx)?;
        let send_cq = Cq::create(ctx, cfg.tx_cq_len as usize, Some(&chan))?;
        let recv_cq = Cq::create(ctx, cfg.ib.rx_queue_len as usize, Some(&chan))?;
        let srq = Srq::create(&md.pd, cfg.ib.rx_queue_len)?;

        // A probe QP tells what the provider grants for inline data and gather entries.
        let want = sys::ibv_qp_cap {
            max_send_wr: cfg.ib.tx_queue_len,
            max_recv_wr: 0,
            max_send_sge: 4.min(dev.attr.orig_attr.max_sge as u32).max(1),
            max_recv_sge: 1,
            max_inline_data: cfg.ib.tx_min_inline,
        };
        let probe = Qp::create(&md.pd, sys::IBV_QPT_RC, &send_cq, &recv_cq, Some(&srq), want)?;
        // Inline sends are assembled in a 1 KiB stack buffer.
        let max_inline = (probe.cap.max_inline_data as usize).min(1024);
        let max_send_sge = probe.cap.max_send_sge as usize;
        drop(probe);
        if max_inline < am_off + 1 + 8 {
            tracing::error!("{}: inline sends of {max_inline} bytes cannot carry an active message", dev.name);
            return Err(Status::Unsupported);
        }
        let dev_max_rd = (dev.attr.orig_attr.max_qp_rd_atom as u32).max(1);
        let max_rd_atomic = cfg.max_rd_atomic.map_or(dev_max_rd, |v| v.min(dev_max_rd)).min(16);

        let (tx_pool, tx_chunks) = reg_pool(&md.pd, cfg.ib.seg_size, 256, usize::MAX, "rc_verbs_tx")?;
        let (rx_pool, rx_chunks) =
            reg_pool(&md.pd, cfg.ib.seg_size, 1024, cfg.ib.rx_queue_len as usize * 2, "rc_verbs_rx")?;

        let mtu = port.mtu;
        let atomics = dev.has_atomics();
        let mut flags = IfaceFlags::AM_SHORT
            | IfaceFlags::AM_BCOPY
            | IfaceFlags::AM_ZCOPY
            | IfaceFlags::PUT_SHORT
            | IfaceFlags::PUT_BCOPY
            | IfaceFlags::PUT_ZCOPY
            | IfaceFlags::GET_BCOPY
            | IfaceFlags::GET_ZCOPY
            | IfaceFlags::PENDING
            | IfaceFlags::CONNECT_TO_EP
            | IfaceFlags::CB_SYNC
            | IfaceFlags::ERRHANDLE_PEER_FAILURE
            | IfaceFlags::EP_CHECK
            | IfaceFlags::INTER_NODE;
        if atomics {
            flags |= IfaceFlags::ATOMIC_DEVICE;
        }
        if tm_on {
            flags |= super::tm::FLAGS;
            if max_inline >= crate::tm::wire::TMH_LEN {
                flags |= IfaceFlags::TAG_EAGER_SHORT;
            }
        }
        let zcopy_max = 1usize << 30;
        let atomic64 = if atomics {
            AtomicCaps { op_flags: AtomicOps::ADD, fop_flags: AtomicOps::ADD | AtomicOps::CSWAP }
        } else {
            AtomicCaps::default()
        };
        let rma = OpCaps {
            max_short: 0,
            max_bcopy: cfg.ib.seg_size,
            min_zcopy: 0,
            max_zcopy: zcopy_max,
            opt_zcopy_align: 512,
            align_mtu: mtu,
            max_iov: max_send_sge,
            max_hdr: 0,
        };
        let attr = IfaceAttr {
            flags,
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::RECV_SIG | EventFlags::FD,
            // Put and get differ only in that put has an inline (short) form.
            put: OpCaps { max_short: max_inline, ..rma },
            get: rma,
            am: OpCaps {
                max_short: max_inline - 1 - am_off,
                max_bcopy: cfg.ib.seg_size - 1 - am_off,
                min_zcopy: 0,
                max_zcopy: cfg.ib.seg_size - 1 - am_off,
                opt_zcopy_align: 512,
                align_mtu: mtu,
                max_iov: max_send_sge.saturating_sub(1).max(1),
                max_hdr: cfg.max_am_hdr.min(cfg.ib.seg_size - 1 - am_off),
            },
            tag: if tm_on { super::tm::caps(&cfg, max_inline, max_send_sge) } else { Default::default() },
            atomic32: AtomicCaps::default(),
            atomic64,
            device_addr_len: super::DEV_ADDR_LEN,
            iface_addr_len: 0,
            ep_addr_len: super::EP_ADDR_LEN,
            max_conn_priv: 0,
            max_num_eps: 256,
            overhead: 75e-9,
            bandwidth: BandwidthModel { dedicated: 0.0, shared: port.bandwidth },
            latency: LinearFunc { c: port.latency, m: 1e-9 },
            priority: 0,
        };
        let rx_len = cfg.ib.rx_queue_len as usize;
        let batch = cfg.ib.rx_max_batch;
        let wc_len = cfg.ib.tx_max_poll.max(cfg.ib.rx_max_poll);
        let inner = Rc::new(IfaceInner {
            _dev: dev.clone(),
            pd: md.pd.clone(),
            port,
            gid,
            base: BaseIface::new(worker, params, attr),
            chan,
            send_cq,
            recv_cq,
            srq,
            tx_pool,
            tx_chunks,
            rx_pool,
            rx_chunks,
            rx: RefCell::new(RecvSlots::new(rx_len, batch)),
            cq_available: Cell::new(cfg.tx_cq_len as i64 - 1),
            eps: RefCell::new(HashMap::new()),
            groups: RefCell::new(HashMap::new()),
            grants: RefCell::new(Vec::new()),
            stash_tx: RefCell::new(Vec::new()),
            stash_rx: RefCell::new(Vec::new()),
            // SAFETY: zero is a valid bit pattern for a work completion.
            wc: RefCell::new(vec![unsafe { std::mem::zeroed() }; wc_len]),
            max_inline,
            max_send_sge,
            max_rd_atomic,
            am_off,
            tm: tm_on.then(|| RcTm::new(&cfg, params.tag_handlers.clone().expect("checked above"), &dev.name)),
            closing: Cell::new(false),
            cfg,
        });
        let posted = inner.refill();
        if posted < rx_len {
            tracing::warn!("rc_verbs: posted {posted} of {rx_len} receives");
        }
        Ok(RcIface { inner })
    }

    /// The tag-matching counters (UCX's `rc_mlx5` names); `None` with tag matching off.
    pub fn tm_stats(&self) -> Option<TmStats> {
        self.inner.tm.as_ref().map(|t| t.stats.get())
    }

    fn dev_addr(&self) -> DevAddr {
        let i = &self.inner;
        DevAddr {
            eth: i.port.link_layer == LinkLayer::Ethernet,
            tm: i.tm.is_some(),
            mtu_enum: i.port.mtu_enum as u8,
            lid: i.port.lid,
            gid: i.gid.gid,
        }
    }
}

impl Iface for RcIface {
    fn base(&self) -> &BaseIface {
        &self.inner.base
    }

    fn progress(&self) -> usize {
        self.inner.progress()
    }

    fn progress_enable(&self, _flags: ProgressFlags) {
        self.inner.base.progress.enable_for(&self.inner, |i| i.progress());
    }

    fn device_address(&self) -> Vec<u8> {
        self.dev_addr().pack()
    }

    fn iface_address(&self) -> Vec<u8> {
        Vec::new()
    }

    fn is_reachable(&self, dev_addr: &[u8], _iface_addr: Option<&[u8]>) -> bool {
        match DevAddr::unpack(dev_addr) {
            // Tag matching changes the active messages' format: both sides alike.
            Some(peer) => {
                peer.eth == (self.inner.port.link_layer == LinkLayer::Ethernet) && peer.tm == self.inner.tm.is_some()
            }
            None => false,
        }
    }

    fn ep_create(&self, params: &EpParams<'_>) -> UcsResult<Box<dyn Ep>> {
        match params.connect {
            EpConnect::ToEp => Ok(Box::new(RcEp::create(&self.inner, params.user_data)?)),
            EpConnect::ToIface { .. } => {
                tracing::debug!("rc_verbs connects to endpoints only");
                Err(Status::Unsupported)
            }
        }
    }

    fn flush(&self, flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        let eps: Vec<Rc<EpShared>> = self.inner.eps.borrow().values().filter_map(Weak::upgrade).collect();
        let mut busy = 0;
        let agg = comp.map(|c| {
            let c = c.clone();
            Completion::new(1, move |st| c.complete(st))
        });
        for ep in eps {
            match ep.flush(flags, agg.as_ref())? {
                Outcome::Done(()) => {}
                Outcome::InProgress => busy += 1,
                Outcome::NoResource => return Ok(Outcome::NoResource),
            }
        }
        if busy == 0 {
            return Ok(Outcome::Done(()));
        }
        if let Some(a) = &agg {
            // `busy` flushes hold the aggregate; it fires once all of them completed.
            a.set_count(busy);
        }
        Ok(Outcome::InProgress)
    }

    unsafe fn tag_recv_zcopy(
        &self,
        tag: Tag,
        tag_mask: Tag,
        iov: &[Iov<'_>],
        ctx: Rc<TagRecvContext>,
    ) -> UcsResult<()> {
        let Some(tm) = &self.inner.tm else { return Err(Status::Unsupported) };
        // SAFETY: forwarded from the caller.
        unsafe { tm.recv_post(tag, tag_mask, iov, ctx) }
    }

    fn tag_recv_cancel(&self, ctx: &Rc<TagRecvContext>, force: bool) -> UcsResult<()> {
        let Some(tm) = &self.inner.tm else { return Err(Status::Unsupported) };
        tm.recv_cancel(ctx, force)
    }

    fn event_fd(&self) -> UcsResult<RawFd> {
        Ok(self.inner.chan.fd())
    }

    fn event_arm(&self, events: EventFlags) -> UcsResult<()> {
        let i = &self.inner;
        if i.chan.drain() > 0 || !i.stash_tx.borrow().is_empty() || !i.stash_rx.borrow().is_empty() {
            return Err(Status::Busy);
        }
        if !i.grants.borrow().is_empty() || !i.rx.borrow().refill.is_empty() {
            return Err(Status::Busy);
        }
        if events.contains(EventFlags::SEND_COMP) {
            i.send_cq.arm(false)?;
        }
        if events.intersects(EventFlags::RECV | EventFlags::RECV_SIG) {
            i.recv_cq.arm(!events.contains(EventFlags::RECV))?;
        }
        // Completions that arrived before arming raise no event: collect them now.
        let mut wc = i.wc.borrow_mut();
        let n = i.send_cq.poll(&mut wc);
        i.stash_tx.borrow_mut().extend_from_slice(&wc[..n]);
        let m = i.recv_cq.poll(&mut wc);
        i.stash_rx.borrow_mut().extend_from_slice(&wc[..m]);
        if n + m > 0 {
            return Err(Status::Busy);
        }
        Ok(())
    }
}

impl Drop for RcIface {
    fn drop(&mut self) {
        self.inner.closing.set(true);
        self.inner.base.close();
    }
}
