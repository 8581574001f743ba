//! The `ud_verbs` interface: one UD queue pair, its completion queues and receive buffers,
//! the reliability core ([`UdIface`]) that turns datagrams into reliable endpoint-to-endpoint
//! channels, address handles per peer, pending requests, timers and events.
//!
//! ## Data path
//! * Sending: an operation has the core append the packet to the endpoint's send window
//!   ([`UdIface::send_with`]) and posts the bytes it returns: inline when they fit the QP's
//!   inline size, else copied into a registered send descriptor released at the send
//!   completion. Control packets, resends and acknowledgements come from
//!   [`UdIface::poll_transmit`] and are posted the same way.
//! * Receiving: receive buffers of `MTU + 40` bytes (UD puts a 40-byte GRH area in front of
//!   every datagram) are posted to the QP's receive queue; each completion, after the optional
//!   loss injector, goes to [`UdIface::on_packet`]. In-order active messages go to the
//!   handler, which may keep the buffer; puts are written to memory after checking them
//!   against the live registrations with remote write access.
//! * Time: timers run from progress (`ucs::time::now`); `event_arm` sets a timer descriptor to
//!   the core's next deadline, so a sleeping process wakes for resends and peer timeouts.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::rc::Rc;

use rdma_core_sys as sys;
use ucs::arbiter::GroupId;
use ucs::fraglist::Sn16;
use ucs::mpool::MemPool;
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    BandwidthModel, BaseIface, Completion, Ep, EpConnect, EpParams, EventFlags, FlushFlags, Iface, IfaceAttr,
    IfaceFlags, IfaceParams, LinearFunc, OpCaps, ProgressFlags, Resources, Worker,
};

use super::conn::{IfaceEvent, UdIface};
use super::loss::{LossConfig, LossHook};
use super::verbs_config::UdVerbsConfig;
use super::verbs_ep::UdVerbsEp;
use super::wakeup::Wakeup;
use super::wire::{self, PeerAddr, NETH_LEN};
use crate::device::{GidChoice, IbDevice, LinkLayer, Port};
use crate::md::IbMd;
use crate::pool::{reg_pool, RecvSlots, RegChunks};
use crate::rc::{unpack_ep_addr, DevAddr, DEV_ADDR_LEN};
use crate::verbs::{Ah, CompChannel, Cq, Pd, Qp};

mod rx;
mod tx;

use rx::Rx;
pub(crate) use rx::RxDesc;
use tx::Tx;

/// Bytes UD reserves in front of every received datagram for the global route header.
pub const GRH_LEN: usize = 40;

/// Queue key of every `ud_verbs` QP (UCX `UCT_IB_KEY`).
pub const QKEY: u32 = 0x1ee7_a330;

/// Bytes of the put header after the network header: remote address (u64) and remote key
/// (u32), little-endian.
pub const PUT_HDR_LEN: usize = 12;

/// Bytes of an interface address: the UD QP number (24 bits) in 4 bytes, little-endian.
pub const IFACE_ADDR_LEN: usize = 4;

/// Largest user header of a zero-copy active message (at most half the datagram payload).
const MAX_AM_HDR: usize = 128;

/// What the uct layer keeps per core endpoint.
pub(crate) struct EpState {
    /// A [`UdVerbsEp`] object exists for this endpoint.
    pub user: bool,
    pub user_data: u64,
    /// Pending group while a user object exists.
    pub group: Option<GroupId>,
    /// When the user object was dropped (or the unclaimed endpoint failed): the endpoint is
    /// destroyed `LINGER_TIMEOUT` later, once idle.
    pub closed_at: Option<u64>,
    /// The failure was reported to the error handler.
    pub reported: bool,
    /// Flush completions, each fired when the peer acknowledged everything up to its number.
    pub flushes: Vec<(Sn16, Rc<Completion>)>,
}

impl EpState {
    fn passive() -> EpState {
        EpState { user: false, user_data: 0, group: None, closed_at: None, reported: false, flushes: Vec::new() }
    }
}

/// Counters of a `ud_verbs` interface (see [`UdVerbsIface::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdVerbsStats {
    /// Datagrams received (before loss injection).
    pub rx_datagrams: u64,
    /// Datagrams dropped as malformed (bad length, undecodable header, bad CREQ address).
    pub rx_malformed: u64,
    /// Datagrams the loss injector dropped.
    pub loss_dropped: u64,
    /// Datagrams the loss injector duplicated.
    pub loss_duplicated: u64,
    /// Datagrams the loss injector delayed behind later ones.
    pub loss_reordered: u64,
    /// Puts refused because no live registration with remote write access covers them.
    pub put_rejected: u64,
    /// Datagrams posted (fresh, control, resend and acknowledgement).
    pub tx_posted: u64,
    /// Retransmissions, summed over the live endpoints.
    pub resent: u64,
    /// Resend-timer expiries that resent, summed over the live endpoints.
    pub timeouts: u64,
    /// NAKs sent, summed over the live endpoints.
    pub naks_sent: u64,
    /// Duplicates received, summed over the live endpoints.
    pub duplicates: u64,
    /// Out-of-order packets received, summed over the live endpoints.
    pub out_of_order: u64,
    /// Active messages and puts delivered, summed over the live endpoints.
    pub delivered: u64,
    /// Endpoints that failed.
    pub failed_eps: u64,
    /// Live endpoints in the core (user, passive and lingering ones).
    pub num_eps: u64,
}

pub(crate) struct IfaceInner {
    /// Attributes, AM handlers, pending queue, progress registration, failure handler.
    pub base: BaseIface,
    /// Keeps the device open for as long as endpoints exist.
    _dev: Rc<IbDevice>,
    pd: Rc<Pd>,
    pub port: Port,
    gid: GidChoice,
    pub cfg: UdVerbsConfig,
    /// The QP comes before everything its posted requests point at (receive slots, send
    /// descriptors, address handles), so it is destroyed first.
    qp: Qp,
    chan: Rc<CompChannel>,
    send_cq: Rc<Cq>,
    recv_cq: Rc<Cq>,
    wakeup: Wakeup,
    rx: RefCell<Rx>,
    tx: RefCell<Tx>,
    pub core: RefCell<UdIface<RxDesc>>,
    pub eps: RefCell<Vec<Option<EpState>>>,
    pub groups: RefCell<HashMap<GroupId, u32>>,
    ahs: RefCell<HashMap<wire::DevAddr, Rc<Ah>>>,
    tx_pool: Rc<MemPool>,
    tx_chunks: Rc<RegChunks>,
    rx_pool: Rc<MemPool>,
    rx_chunks: Rc<RegChunks>,
    loss: RefCell<Option<LossHook>>,
    /// Core timers are run when the clock passes this (kept at or before the real deadline).
    next_timer: Cell<u64>,
    /// Completions polled while arming, handled by the next progress.
    stash_tx: RefCell<Vec<sys::ibv_wc>>,
    stash_rx: RefCell<Vec<sys::ibv_wc>>,
    wc: RefCell<Vec<sys::ibv_wc>>,
    /// Largest inline send the provider granted.
    max_inline: usize,
    /// Largest packet (header included): min(port MTU, SEG_SIZE).
    pub max_packet: usize,
    rx_buf_len: usize,
    stats: Cell<UdVerbsStats>,
    warned_put: Cell<bool>,
    warned_creq: Cell<bool>,
}

fn bump(stats: &Cell<UdVerbsStats>, f: impl FnOnce(&mut UdVerbsStats)) {
    let mut s = stats.get();
    f(&mut s);
    stats.set(s);
}

fn zeroed_wc() -> sys::ibv_wc {
    // SAFETY: zero is a valid bit pattern for a work completion.
    unsafe { std::mem::zeroed() }
}

impl IfaceInner {
    /// Smallest distance from an event to a core timer it may start (see `note_activity`).
    fn min_timer_step(&self) -> u64 {
        self.cfg.rel.timer_tick.min(self.cfg.rel.peer_timeout).max(1)
    }

    /// Something happened at `now` that may have started a core timer: every timer an event
    /// starts is at least a tick (or the peer timeout) away, so run the timers no later than
    /// that.
    pub(crate) fn note_activity(&self, now: u64) {
        let t = now.saturating_add(self.min_timer_step());
        if t < self.next_timer.get() {
            self.next_timer.set(t);
        }
    }

    /// The address handle for a peer's device address, created on first use.
    pub(crate) fn ah_for(&self, dev: &wire::DevAddr) -> UcsResult<Rc<Ah>> {
        if let Some(ah) = self.ahs.borrow().get(dev) {
            return Ok(ah.clone());
        }
        let peer = DevAddr::unpack(dev.as_bytes()).ok_or_else(|| {
            tracing::debug!(?dev, "ud_verbs: malformed device address");
            Status::InvalidAddr
        })?;
        let eth = self.port.link_layer == LinkLayer::Ethernet;
        if peer.eth != eth {
            tracing::debug!(?dev, "ud_verbs: device address of another link layer");
            return Err(Status::Unreachable);
        }
        // SAFETY: zero is a valid bit pattern for the attribute struct.
        let mut a: sys::ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.dlid = peer.lid;
        a.sl = self.cfg.ib.sl;
        a.port_num = self.port.num;
        if eth || peer.gid[..8] != self.gid.gid[..8] {
            a.is_global = 1;
            a.grh.dgid.raw = peer.gid;
            a.grh.sgid_index = self.gid.index;
            a.grh.hop_limit = self.cfg.ib.hop_limit;
            a.grh.traffic_class = self.cfg.ib.traffic_class;
        }
        let ah = Rc::new(Ah::create(&self.pd, &mut a)?);
        self.ahs.borrow_mut().insert(*dev, ah.clone());
        Ok(ah)
    }

    /// After packets for endpoint `ep`: fire the flushes its acknowledgements completed, and
    /// let its pending requests run when it can send again.
    fn after_ep_activity(&self, ep: u32) {
        let (acked, status, can_send) = {
            let core = self.core.borrow();
            match core.ep(ep) {
                Some(r) => (r.acked_psn(), r.status(), r.can_send()),
                None => return,
            }
        };
        let (done, group) = {
            let mut eps = self.eps.borrow_mut();
            let Some(st) = eps.get_mut(ep as usize).and_then(Option::as_mut) else { return };
            let mut done = Vec::new();
            if !st.flushes.is_empty() {
                let mut i = 0;
                while i < st.flushes.len() {
                    if status.is_err() || st.flushes[i].0.le(acked) {
                        done.push(st.flushes.swap_remove(i).1);
                    } else {
                        i += 1;
                    }
                }
            }
            (done, st.group)
        };
        let result = status.err().unwrap_or(Status::Ok);
        for c in done {
            c.complete(result);
        }
        if let Some(g) = group {
            if (can_send || status.is_err()) && !self.base.pending.group_is_empty(g) {
                self.base.pending.schedule(g);
            }
        }
    }

    /// The state slot of endpoint `ep`, created for a passive endpoint.
    pub(crate) fn with_state<T>(&self, ep: u32, f: impl FnOnce(&mut EpState) -> T) -> T {
        let mut eps = self.eps.borrow_mut();
        let i = ep as usize;
        if eps.len() <= i {
            eps.resize_with(i + 1, || None);
        }
        f(eps[i].get_or_insert_with(EpState::passive))
    }

    /// Reacts to the core's events: connections, failures.
    fn handle_events(&self, now: u64) -> usize {
        let mut n = 0;
        loop {
            let ev = self.core.borrow_mut().poll_event();
            let Some(ev) = ev else { return n };
            n += 1;
            match ev {
                IfaceEvent::Accepted { ep, .. } => {
                    self.with_state(ep, |_| ());
                }
                IfaceEvent::Connected { ep, .. } => self.after_ep_activity(ep),
                IfaceEvent::Failed { ep, status } => {
                    bump(&self.stats, |s| s.failed_eps += 1);
                    let report = self.with_state(ep, |st| {
                        if !st.user && st.closed_at.is_none() {
                            st.closed_at = Some(now);
                        }
                        let report = st.user && !st.reported;
                        st.reported |= report;
                        report.then_some(st.user_data)
                    });
                    tracing::debug!(ep, %status, "ud_verbs: endpoint failed");
                    self.after_ep_activity(ep);
                    if let Some(ud) = report {
                        self.base.report_failure(ud, status);
                    }
                }
            }
        }
    }

    /// Runs the core's timers, and destroys closed endpoints whose linger time is over.
    fn run_timers(&self, now: u64) {
        self.core.borrow_mut().handle_timeout(now);
        let linger = self.cfg.linger_timeout;
        let mut expired = Vec::new();
        let mut next_linger = u64::MAX;
        {
            let core = self.core.borrow();
            let eps = self.eps.borrow();
            for (id, st) in eps.iter().enumerate() {
                let Some(closed) = st.as_ref().and_then(|s| if s.user { None } else { s.closed_at }) else { continue };
                let due = closed.saturating_add(linger);
                let quiet = core.ep(id as u32).is_none_or(|r| r.is_idle() || r.status().is_err());
                if now >= due && quiet {
                    expired.push(id as u32);
                } else {
                    next_linger = next_linger.min(due.max(now.saturating_add(self.min_timer_step())));
                }
            }
        }
        for id in expired {
            let mut sink = Vec::new();
            self.core.borrow_mut().destroy_ep(id, |d| sink.push(d));
            if let Some(slot) = self.eps.borrow_mut().get_mut(id as usize) {
                *slot = None;
            }
            tracing::trace!(ep = id, "ud_verbs: lingering endpoint destroyed");
            drop(sink);
        }
        self.drain_transmits(now);
        let core_next = self.core.borrow().poll_timeout().unwrap_or(u64::MAX);
        self.next_timer.set(core_next.min(next_linger));
    }

    fn dispatch_pending(&self) -> usize {
        if self.base.pending.is_empty() {
            return 0;
        }
        self.base.pending.dispatch(|g| {
            if !self.tx_available() {
                return Resources::IfaceExhausted;
            }
            let Some(ep) = self.groups.borrow().get(&g).copied() else { return Resources::EpExhausted };
            let core = self.core.borrow();
            match core.ep(ep) {
                Some(r) if r.status().is_err() || r.can_send() => Resources::Available,
                Some(_) => Resources::EpExhausted,
                None => Resources::Available,
            }
        })
    }

    pub(crate) fn progress(&self) -> usize {
        let now = ucs::time::now();
        let mut n = 0;
        let stash: Vec<sys::ibv_wc> = std::mem::take(&mut *self.stash_tx.borrow_mut());
        for wc in &stash {
            self.handle_tx(wc);
        }
        n += stash.len();
        let stash: Vec<sys::ibv_wc> = std::mem::take(&mut *self.stash_rx.borrow_mut());
        for wc in &stash {
            n += self.handle_rx(now, wc);
        }

        // The completion array is taken out while handlers run (no copy, no allocation); a
        // nested call would find it empty and poll nothing.
        let mut wc = std::mem::take(&mut *self.wc.borrow_mut());
        let tx_n = self.cfg.ib.tx_max_poll.min(wc.len());
        let got = self.send_cq.poll(&mut wc[..tx_n]);
        for w in &wc[..got] {
            self.handle_tx(w);
        }
        n += got;
        let delayed = std::mem::take(&mut self.rx.borrow_mut().delayed);
        let rx_n = self.cfg.ib.rx_max_poll.min(wc.len());
        let got = self.recv_cq.poll(&mut wc[..rx_n]);
        for w in &wc[..got] {
            n += self.handle_rx(now, w);
        }
        *self.wc.borrow_mut() = wc;
        // Datagrams the loss injector held back arrive after those polled now.
        for d in delayed {
            n += self.on_datagram(now, d);
        }
        if !self.rx.borrow().ring.refill.is_empty() {
            self.refill();
        }
        if now >= self.next_timer.get() {
            self.run_timers(now);
        }
        n += self.drain_transmits(now);
        n += self.handle_events(now);
        n + self.dispatch_pending()
    }

    /// Counters, with the reliability counters of the live endpoints summed.
    fn stats(&self) -> UdVerbsStats {
        let mut s = self.stats.get();
        let core = self.core.borrow();
        let ids: Vec<u32> = core.ep_ids().collect();
        s.num_eps = ids.len() as u64;
        for id in ids {
            if let Some(r) = core.ep(id) {
                let st = r.stats();
                s.resent += st.resent;
                s.timeouts += st.timeouts;
                s.naks_sent += st.naks_sent;
                s.duplicates += st.duplicates;
                s.out_of_order += st.out_of_order;
                s.delivered += st.delivered;
            }
        }
        s
    }

    /// Flushes endpoint `ep`: `Done` when everything it sent was acknowledged (or it failed),
    /// else asks the peer for an acknowledgement and completes `comp` when it arrives.
    pub(crate) fn flush_ep(&self, ep: u32, flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        let now = ucs::time::now();
        let (idle, failed, last) = {
            let core = self.core.borrow();
            let Some(r) = core.ep(ep) else { return Ok(Outcome::Done(())) };
            (r.is_idle(), r.status().is_err(), Sn16(r.next_psn().0.wrapping_sub(1)))
        };
        if failed || idle {
            return Ok(Outcome::Done(()));
        }
        if flags.contains(FlushFlags::CANCEL) {
            // Give up on what is outstanding: the endpoint cannot recover the gap it leaves
            // in its sequence, so it fails (without a call to the error handler: the user
            // asked for this). Waiting flushes complete with `Canceled`.
            self.core.borrow_mut().fail_ep(ep, Status::Canceled);
            self.with_state(ep, |st| st.reported = true);
            self.after_ep_activity(ep);
            return Ok(Outcome::Done(()));
        }
        self.core.borrow_mut().request_ack(now, ep);
        self.drain_transmits(now);
        self.note_activity(now);
        if let Some(c) = comp {
            self.with_state(ep, |st| st.flushes.push((last, c.clone())));
        }
        Ok(Outcome::InProgress)
    }
}

/// A `ud_verbs` interface on one port.
pub struct UdVerbsIface {
    inner: Rc<IfaceInner>,
}

impl UdVerbsIface {
    /// Opens the interface on `port` of the memory domain's device.
    pub fn open(md: &IbMd, port: u8, worker: &Worker, params: &IfaceParams) -> UcsResult<UdVerbsIface> {
        let mut cfg = UdVerbsConfig::read(None, &params.config)?;
        let dev = md.dev.clone();
        let port = dev.port(port).ok_or(Status::NoDevice)?.clone();
        let gid = dev.select_gid(&port, cfg.ib.gid_index)?;
        let max_packet = cfg.ib.seg_size.min(port.mtu);
        cfg.rel.max_packet = max_packet;
        cfg.rel.validate()?;
        let ctx = &dev.ctx;
        let chan = CompChannel::create(ctx)?;
        let send_cq = Cq::create(ctx, cfg.ib.tx_queue_len as usize, Some(&chan))?;
        let recv_cq = Cq::create(ctx, cfg.ib.rx_queue_len as usize, Some(&chan))?;
        let cap = sys::ibv_qp_cap {
            max_send_wr: cfg.ib.tx_queue_len,
            max_recv_wr: cfg.ib.rx_queue_len,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cfg.ib.tx_min_inline,
        };
        let qp = Qp::create(&md.pd, sys::IBV_QPT_UD, &send_cq, &recv_cq, None, cap)?;
        let max_inline = qp.cap.max_inline_data as usize;
        // SAFETY: zero is a valid bit pattern for the attribute struct.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port.num;
        a.qkey = QKEY;
        qp.modify(&mut a, sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_QKEY, "INIT")?;
        // SAFETY: as above.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::IBV_QPS_RTR;
        qp.modify(&mut a, sys::IBV_QP_STATE, "RTR")?;
        // SAFETY: as above.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::IBV_QPS_RTS;
        a.sq_psn = 0;
        qp.modify(&mut a, sys::IBV_QP_STATE | sys::IBV_QP_SQ_PSN, "RTS")?;

        // Receive buffers hold the largest datagram the fabric can carry, whatever SEG_SIZE
        // says, so that no peer can overflow one.
        let rx_buf_len = port.mtu + GRH_LEN;
        let (tx_pool, tx_chunks) = reg_pool(&md.pd, max_packet, 256, usize::MAX, "ud_verbs_tx")?;
        let (rx_pool, rx_chunks) = reg_pool(&md.pd, rx_buf_len, 1024, cfg.ib.rx_queue_len as usize * 2, "ud_verbs_rx")?;

        let eth = port.link_layer == LinkLayer::Ethernet;
        let dev_addr = DevAddr { eth, tm: false, mtu_enum: port.mtu_enum as u8, lid: port.lid, gid: gid.gid };
        let local =
            PeerAddr { dev_addr: wire::DevAddr::new(&dev_addr.pack()).map_err(Status::from)?, qp_num: qp.qp_num() };
        let core = UdIface::new(local, cfg.rel.clone())?;
        let short_max = max_inline.min(max_packet);
        let mut flags = IfaceFlags::AM_BCOPY
            | IfaceFlags::AM_ZCOPY
            | IfaceFlags::PENDING
            | IfaceFlags::CONNECT_TO_IFACE
            | IfaceFlags::CB_SYNC
            | IfaceFlags::ERRHANDLE_PEER_FAILURE
            | IfaceFlags::EP_CHECK
            | IfaceFlags::INTER_NODE;
        if short_max >= NETH_LEN + 8 {
            flags |= IfaceFlags::AM_SHORT;
        }
        if short_max > NETH_LEN + PUT_HDR_LEN {
            flags |= IfaceFlags::PUT_SHORT;
        }
        let mtu = port.mtu;
        let max_am_hdr = MAX_AM_HDR.min((max_packet - NETH_LEN) / 2);
        let attr = IfaceAttr {
            flags,
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::RECV_SIG | EventFlags::FD,
            put: OpCaps {
                max_short: short_max.saturating_sub(NETH_LEN + PUT_HDR_LEN),
                align_mtu: mtu,
                max_iov: 1,
                ..OpCaps::default()
            },
            get: OpCaps::default(),
            // A zero-copy header and payload share one datagram: any header up to `max_hdr`
            // leaves room for `max_zcopy` bytes of payload.
            am: OpCaps {
                max_short: short_max.saturating_sub(NETH_LEN),
                max_bcopy: max_packet - NETH_LEN,
                min_zcopy: 0,
                max_zcopy: max_packet - NETH_LEN - max_am_hdr,
                opt_zcopy_align: 512,
                align_mtu: mtu,
                max_iov: 8,
                max_hdr: max_am_hdr,
            },
            tag: Default::default(),
            atomic32: Default::default(),
            atomic64: Default::default(),
            device_addr_len: DEV_ADDR_LEN,
            iface_addr_len: IFACE_ADDR_LEN,
            ep_addr_len: 0,
            max_conn_priv: 0,
            max_num_eps: wire::EP_NULL_ID as usize,
            overhead: 105e-9,
            bandwidth: BandwidthModel { dedicated: 0.0, shared: port.bandwidth },
            // UD lacks scatter-to-CQE (UCX adds 30 ns).
            latency: LinearFunc { c: port.latency + 30e-9, m: 1e-9 },
            priority: 0,
        };
        let wakeup = Wakeup::new(chan.fd())?;
        let rx_len = cfg.ib.rx_queue_len as usize;
        let batch = cfg.ib.rx_max_batch;
        let wc_len = cfg.ib.tx_max_poll.max(cfg.ib.rx_max_poll);
        let loss = cfg.loss.is_active().then(|| {
            tracing::warn!("ud_verbs: injecting faults into received datagrams: {:?}", cfg.loss);
            LossHook::new(cfg.loss)
        });
        let inner = Rc::new(IfaceInner {
            _dev: dev.clone(),
            pd: md.pd.clone(),
            port,
            gid,
            base: BaseIface::new(worker, params, attr),
            qp,
            chan,
            send_cq,
            recv_cq,
            wakeup,
            rx: RefCell::new(Rx { ring: RecvSlots::new(rx_len, batch), delayed: Vec::new() }),
            tx: RefCell::new(Tx {
                available: cfg.ib.tx_queue_len as i64,
                unsignaled: 0,
                sn: 0,
                done_sn: 0,
                outstanding: VecDeque::new(),
            }),
            core: RefCell::new(core),
            eps: RefCell::new(Vec::new()),
            groups: RefCell::new(HashMap::new()),
            ahs: RefCell::new(HashMap::new()),
            tx_pool,
            tx_chunks,
            rx_pool,
            rx_chunks,
            loss: RefCell::new(loss),
            next_timer: Cell::new(u64::MAX),
            stash_tx: RefCell::new(Vec::new()),
            stash_rx: RefCell::new(Vec::new()),
            wc: RefCell::new(vec![zeroed_wc(); wc_len]),
            max_inline,
            max_packet,
            rx_buf_len,
            stats: Cell::new(UdVerbsStats::default()),
            warned_put: Cell::new(false),
            warned_creq: Cell::new(false),
            cfg,
        });
        let posted = inner.refill();
        if posted < rx_len {
            tracing::warn!("ud_verbs: posted {posted} of {rx_len} receives");
        }
        tracing::debug!(
            qpn = inner.qp.qp_num(),
            max_packet,
            max_inline,
            "ud_verbs: opened {}:{}",
            dev.name,
            inner.port.num
        );
        Ok(UdVerbsIface { inner })
    }

    /// Counters: traffic, injected faults, refused puts, and the reliability counters of the
    /// live endpoints.
    pub fn stats(&self) -> UdVerbsStats {
        self.inner.stats()
    }

    /// Changes the fault injection on received datagrams at run time (`UCX_UD_VERBS_LOSS` sets
    /// it at open); the generator keeps its position, so a seeded run stays reproducible.
    pub fn set_loss(&self, loss: LossConfig) {
        let mut hook = self.inner.loss.borrow_mut();
        match hook.as_mut() {
            Some(h) => h.set_config(loss),
            None if loss.is_active() => *hook = Some(LossHook::new(loss)),
            None => {}
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &UdVerbsConfig {
        &self.inner.cfg
    }

    /// The UD QP number (the interface address).
    pub fn qp_num(&self) -> u32 {
        self.inner.qp.qp_num()
    }

    /// Testing hook: processes `packet` (network header first) as if it had just been
    /// received, through the same validation and delivery as a real datagram (loss injection
    /// aside). Lets tests feed malformed or forged datagrams without a raw queue pair. False
    /// when no receive buffer was free or `packet` is larger than a datagram can be.
    #[doc(hidden)]
    pub fn inject_datagram(&self, packet: &[u8]) -> bool {
        let i = &self.inner;
        if GRH_LEN + packet.len() > i.rx_buf_len {
            return false;
        }
        let Some(mut buf) = i.rx_pool.get_buf() else { return false };
        buf[..GRH_LEN].fill(0);
        buf[GRH_LEN..GRH_LEN + packet.len()].copy_from_slice(packet);
        bump(&i.stats, |s| s.rx_datagrams += 1);
        i.on_datagram(ucs::time::now(), RxDesc { buf: Some(buf), len: packet.len() });
        true
    }

    /// Waits up to `timeout` for the event descriptor to become readable (after a successful
    /// [`event_arm`](Iface::event_arm)); true when it did. A convenience for tests and simple
    /// loops; a real application polls [`event_fd`](Iface::event_fd) with its other
    /// descriptors.
    pub fn wait_event(&self, timeout: Option<std::time::Duration>) -> UcsResult<bool> {
        self.inner.wakeup.wait(timeout)
    }
}

impl Iface for UdVerbsIface {
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
        self.inner.core.borrow().local_addr().dev_addr.as_bytes().to_vec()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.inner.qp.qp_num().to_le_bytes().to_vec()
    }

    fn is_reachable(&self, dev_addr: &[u8], iface_addr: Option<&[u8]>) -> bool {
        let Some(peer) = DevAddr::unpack(dev_addr) else { return false };
        if peer.eth != (self.inner.port.link_layer == LinkLayer::Ethernet) {
            return false;
        }
        // Datagrams are as large as this port's MTU allows: a peer on a smaller MTU would
        // drop the largest ones.
        if crate::device::mtu_bytes(u32::from(peer.mtu_enum)) < self.inner.max_packet {
            tracing::debug!(peer_mtu = peer.mtu_enum, "ud_verbs: peer MTU smaller than our datagrams");
            return false;
        }
        iface_addr.is_none_or(|a| unpack_ep_addr(a).is_some())
    }

    fn ep_create(&self, params: &EpParams<'_>) -> UcsResult<Box<dyn Ep>> {
        match params.connect {
            EpConnect::ToIface { dev_addr, iface_addr } => {
                Ok(Box::new(UdVerbsEp::create(&self.inner, dev_addr, iface_addr, params.user_data)?))
            }
            EpConnect::ToEp => {
                tracing::debug!("ud_verbs connects to interfaces only");
                Err(Status::Unsupported)
            }
        }
    }

    fn flush(&self, flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        let ids: Vec<u32> = self.inner.core.borrow().ep_ids().collect();
        let agg = comp.map(|c| {
            let c = c.clone();
            Completion::new(1, move |st| c.complete(st))
        });
        let mut busy = 0;
        for id in ids {
            match self.inner.flush_ep(id, flags, agg.as_ref())? {
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

    fn event_fd(&self) -> UcsResult<RawFd> {
        Ok(self.inner.wakeup.fd())
    }

    fn event_arm(&self, events: EventFlags) -> UcsResult<()> {
        let i = &self.inner;
        let now = ucs::time::now();
        let fired = i.chan.drain() + i.wakeup.drain_timer() as usize;
        if fired > 0 || !i.stash_tx.borrow().is_empty() || !i.stash_rx.borrow().is_empty() {
            return Err(Status::Busy);
        }
        if !i.rx.borrow().delayed.is_empty() {
            return Err(Status::Busy);
        }
        if !i.rx.borrow().ring.refill.is_empty() {
            i.refill();
        }
        // Anything the core owes the network goes now; what cannot go waits for a send
        // completion, which raises an event.
        i.drain_transmits(now);
        match i.core.borrow().poll_timeout() {
            Some(t) if t <= now => return Err(Status::Busy),
            deadline => i.wakeup.set_timer(deadline)?,
        }
        if events.contains(EventFlags::SEND_COMP) {
            i.send_cq.arm(false)?;
        }
        // Acknowledgements arrive as receives, so sends need the receive CQ armed too.
        if events.intersects(EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::RECV_SIG) {
            let solicited = !events.intersects(EventFlags::SEND_COMP | EventFlags::RECV);
            i.recv_cq.arm(solicited)?;
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

impl Drop for UdVerbsIface {
    fn drop(&mut self) {
        tracing::debug!(stats = ?self.stats(), "ud_verbs: closing the interface");
        self.inner.base.close();
    }
}

impl std::fmt::Debug for UdVerbsIface {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdVerbsIface").field("qpn", &self.qp_num()).field("max_packet", &self.inner.max_packet).finish()
    }
}
