//! The driver (UCX's `src/ucp/core`: worker, endpoint lanes, requests' I/O): it owns the
//! interfaces and every endpoint's transport endpoints, and runs the [`Engine`]'s work -
//! progressing the transports, making transmissions, running completions, building and
//! connecting lanes, checking peers. All protocol decisions are the engine's.
//!
//! Re-entrancy: a loop-back transport delivers inside the send call, and callbacks may send.
//! The engine is borrowed only for the length of one of its calls: never across a uct call,
//! a progress call or a user callback.
//!
//! Files: `iface` (opening the interfaces, AM handlers), `lanes` (an endpoint's transport
//! endpoints), `exec` (a transmission's uct calls, zero-copy completions), `send` (the
//! direct paths of the tag API and the other calls the API makes), `wakeup` (the event
//! descriptor).

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use ucs::idtable::{Id, IdTable};
use ucs::UcsResult;
use uct::ProgressFlags;

use crate::context::Context;
use crate::engine::{Action, Engine, EpState, Flow, Lane, Local, TxResult};
use crate::proto::pending::Front;
use crate::wire;
use crate::wireup::address::WorkerAddress;
use crate::wireup::conn::AcceptReq;
use mem::MemMap;

pub(crate) mod am;
pub(crate) mod exec;
pub(crate) mod iface;
pub(crate) mod lanes;
mod mem;
mod offload;
pub(crate) mod rma;
mod rma_target;
mod send;
pub(crate) mod sockaddr;
mod stream;
pub(crate) mod wakeup;

pub(crate) use iface::WorkerIface;
use lanes::EpLanes;

/// Idle interfaces are polled once per this many progress calls.
const IDLE_POLL_EVERY: u32 = 32;

/// The engine as the driver has it: its handle on an endpoint is the endpoint's lanes.
pub(crate) type CoreEngine = Engine<Rc<EpLanes>>;

/// A worker id unique across processes on this machine and, with high probability, beyond.
pub(crate) fn new_uuid() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = ucs::time::now();
    let mut x = (std::process::id() as u64) << 32 ^ t ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(48);
    // splitmix64 finaliser: spreads the bits.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The driver of one worker.
pub(crate) struct Core {
    pub ctx: Context,
    pub uct: uct::Worker,
    pub ifaces: Vec<WorkerIface>,
    /// Interfaces progressed on every call: those an endpoint uses or a peer sent to.
    /// The others are polled every `IDLE_POLL_EVERY` calls, so a first message still arrives.
    active: Box<[Cell<bool>]>,
    idle_polls: Cell<u32>,
    pub address: WorkerAddress,
    pub packed: Vec<u8>,
    pub weak: Weak<Core>,
    /// The protocol engine.
    pub engine: RefCell<CoreEngine>,
    /// How many times the engine reached its endpoints' table mutably
    /// ([`EpTable`](crate::engine::EpTable)): the remote-memory fast path trusts an endpoint
    /// it found ready while this has not moved.
    pub ep_epoch: Rc<Cell<u64>>,
    /// Registrations made by `Worker::mem_map`.
    pub mems: RefCell<IdTable<MemMap>>,
    /// Remote keys unpacked on endpoints.
    pub rkeys: RefCell<IdTable<Rc<rma::Rkey>>>,
    /// Completions of zero-copy operations that fired and nobody holds: reused by the next
    /// ones (see [`Core::zc_completion`]).
    zc_comps: RefCell<Vec<exec::ZcComp>>,
    /// The completion lent to operations that usually complete within their call (fetching
    /// atomics on a shared-memory lane): see [`Core::zc_spare`].
    zc_spare: Cell<Option<exec::ZcComp>>,
    /// The largest active-message user header ([`Core::am_max_header`]).
    am_max_hdr: usize,
    /// Active-message handlers by id.
    am_handlers: RefCell<Vec<Option<am::AmEntry>>>,
    /// Active messages whose data a handler may keep or kept (see `core::am`).
    am_kept: RefCell<IdTable<am::AmKept>>,
    /// Receives posted to a transport's tag matching, by request (raw id).
    tm_posts: RefCell<std::collections::HashMap<u64, offload::TmPost>>,
    /// Bounce buffers for small offloaded receives, registered, not in use.
    tm_bounce: RefCell<Vec<offload::Bounce>>,
    /// The retry list, taken out of the engine while progress works through it.
    retry: RefCell<Vec<Id>>,
    /// Listeners and clients connecting by socket address.
    pub(crate) sockaddr: RefCell<sockaddr::Sockaddr>,
    /// Some listener or client exists (progress polls them).
    pub(crate) sockaddr_active: Cell<bool>,
    /// Listeners closed while their descriptor was still in the wakeup set.
    pub(crate) closing_listeners: RefCell<Vec<sockaddr::Listener>>,
}

impl Core {
    /// Opens an interface on every resource of `ctx` and builds the address and the engine.
    pub fn new(ctx: &Context, name: &str) -> UcsResult<Rc<Core>> {
        let uuid = new_uuid();
        let cfg = ctx.config();
        let keepalive_ns = cfg.keepalive_interval.as_nanos().min(u64::MAX as u128) as u64;
        let local = Local { uuid, packed: Rc::from(&[][..]) };
        let engine = Engine::new(local, keepalive_ns, cfg.keepalive_num_eps, ucs::time::now())?;
        let mut result = Ok(());
        let core = Rc::new_cyclic(|weak: &Weak<Core>| {
            let uct = uct::Worker::default();
            let ifaces = iface::open_all(ctx, &uct, weak).unwrap_or_else(|e| {
                result = Err(e);
                Vec::new()
            });
            let address = WorkerAddress {
                uuid,
                name: name.chars().take(64).collect(),
                ifaces: ifaces.iter().map(iface::record_of).collect(),
            };
            let packed = address.pack().unwrap_or_else(|e| {
                result = result.and(Err(e));
                Vec::new()
            });
            let am_max_hdr = am::max_header(&ifaces);
            let mut engine = engine;
            engine.sh.local.packed = Rc::from(&packed[..]);
            Core {
                ctx: ctx.clone(),
                uct,
                active: ifaces.iter().map(|_| Cell::new(false)).collect(),
                idle_polls: Cell::new(0),
                ifaces,
                address,
                packed,
                weak: weak.clone(),
                ep_epoch: engine.sh.eps.epoch(),
                engine: RefCell::new(engine),
                mems: RefCell::new(IdTable::new()),
                rkeys: RefCell::new(IdTable::new()),
                zc_comps: RefCell::new(Vec::new()),
                zc_spare: Cell::new(None),
                am_max_hdr,
                am_handlers: RefCell::new(Vec::new()),
                am_kept: RefCell::new(IdTable::new()),
                tm_posts: RefCell::default(),
                tm_bounce: RefCell::default(),
                retry: RefCell::new(Vec::new()),
                sockaddr: RefCell::default(),
                sockaddr_active: Cell::new(false),
                closing_listeners: RefCell::default(),
            }
        });
        result.map(|()| core)
    }

    /// Runs `f` on the engine, then the work it left.
    #[inline(always)]
    pub fn with_engine<T>(&self, f: impl FnOnce(&mut CoreEngine) -> T) -> T {
        let (r, more) = {
            let mut e = self.engine.borrow_mut();
            let r = f(&mut e);
            (r, e.has_actions())
        };
        if more {
            self.drain();
        }
        r
    }

    /// Runs the engine's work until none is left.
    #[inline(never)]
    pub fn drain(&self) {
        loop {
            let a = self.engine.borrow_mut().pop_action();
            let Some(a) = a else { break };
            self.run(a);
        }
    }

    /// Runs one piece of the engine's work.
    fn run(&self, a: Action<Rc<EpLanes>>) {
        match a {
            Action::Done(d) => d.run(),
            Action::Full(c) => c.run(),
            Action::Transmit(id) => {
                self.flush(id);
            }
            Action::Ctrl { ep, io, ctrl } => {
                if self.engine.borrow_mut().sh.ctrl_dropped_if_gone(ep) {
                    return;
                }
                self.send_front_now(ep, Front::Ctrl { io, ctrl });
            }
            Action::Accept(req) => self.accept(*req),
            Action::ConnectP2p { ep, addrs } => {
                let found = {
                    let e = self.engine.borrow();
                    e.sh.eps.get(ep).map(|s| (s.io.clone(), s.remote.clone()))
                };
                if let Some((io, remote)) = found {
                    let r = self.connect_p2p(&io, &remote, &addrs);
                    self.with_engine(|e| match r {
                        Ok(()) => e.conn.p2p_connected(&mut e.sh, ep),
                        Err(err) => e.on_ep_error(ep, err),
                    });
                }
            }
            Action::Release { io, parked } => {
                if parked {
                    io.unpark();
                }
                drop(io);
            }
            Action::Unpark(io) => io.unpark(),
            Action::CheckPeer(id) => {
                let io = self.engine.borrow().sh.eps.get(id).map(|s| s.io.clone());
                if let Some(io) = io {
                    if let Some(status) = io.uct_eps.iter().find_map(|l| l.ep.check(None).err()) {
                        self.on_ep_error(id, status);
                    }
                }
            }
            Action::Drop(ext) => drop(ext),
            Action::TagPost { rid, iface, tag, seg, hint, bounce } => self.tag_post(rid, iface, tag, seg, hint, bounce),
            Action::TagCancel { rid, force } => self.tag_cancel(rid, force),
            Action::TagRndvCancel { ep, op } => {
                let io = self.engine.borrow().sh.eps.get(ep).map(|s| s.io.clone());
                if let Some(io) = io {
                    if let Err(e) = io.uct(crate::engine::Lane::Tag).tag_rndv_cancel(uct::RndvOp(op)) {
                        tracing::debug!("ucp: offloaded rendezvous {op:#x} was not outstanding: {e}");
                    }
                }
            }
        }
    }

    /// Makes the transmissions endpoint `id` has; parks it when a lane refuses. The number
    /// made.
    pub fn flush(&self, id: Id) -> usize {
        let mut n = 0;
        loop {
            if let Some(flow) = self.replay_front(id) {
                match flow {
                    Flow::Continue => {
                        n += 1;
                        continue;
                    }
                    Flow::Blocked(_) => return n,
                }
            }
            let tx = self.engine.borrow_mut().sh.next_tx(id);
            let Some(tx) = tx else { return n };
            let res = self.exec(&tx);
            let io = tx.io.clone();
            // Not through `with_engine`: a closure would capture the transmission by value, a
            // copy of its 240 bytes per message on the queued path.
            let (flow, more) = {
                let mut e = self.engine.borrow_mut();
                let flow = e.sh.tx_done(id, tx, res);
                (flow, e.has_actions())
            };
            if more {
                self.drain();
            }
            match flow {
                Flow::Continue => n += 1,
                Flow::Blocked(lane) => {
                    self.park(id, &io, lane);
                    return n;
                }
            }
        }
    }

    /// Sends what is at the front of endpoint `id`'s queue straight to the AM lane when it is
    /// a whole eager message or a control message
    /// ([`Shared::front`](crate::engine::Shared::front)); `None` when it is anything else.
    #[inline]
    fn replay_front(&self, id: Id) -> Option<Flow> {
        let f = self.engine.borrow_mut().sh.front(id)?;
        Some(self.send_front(id, f))
    }

    /// [`Core::send_front`] outside a flush: then what queued meanwhile (over a loop-back lane,
    /// the answer to this very message) is kicked.
    pub(crate) fn send_front_now(&self, id: Id, f: Front<Rc<EpLanes>>) {
        if self.send_front(id, f) == Flow::Continue {
            let more = {
                let mut e = self.engine.borrow_mut();
                e.sh.kick(id);
                e.has_actions()
            };
            if more {
                self.drain();
            }
        }
    }

    /// Sends `f` (the front of endpoint `id`'s queue, which is busy until reported) straight
    /// to the AM lane, as the direct path does; parks the endpoint when the lane refuses.
    pub(crate) fn send_front(&self, id: Id, f: Front<Rc<EpLanes>>) -> Flow {
        let (flow, more, io) = match f {
            Front::Data { io, rid, short, hdr, buf, offset, len } => {
                let status = TxResult::from_uct(send::data(&io, short, &hdr, &buf, offset, len)).status;
                let mut e = self.engine.borrow_mut();
                let flow = e.sh.data_replayed(id, rid, short, hdr, buf, offset, len, status);
                (flow, e.has_actions(), io)
            }
            Front::Ctrl { io, ctrl } => self.send_ctrl(id, io, ctrl),
        };
        if more {
            self.drain();
        }
        if let Flow::Blocked(lane) = flow {
            self.park(id, &io, lane);
        }
        flow
    }

    /// Sends control message `ctrl` on endpoint `id` (busy until reported) and reports it.
    fn send_ctrl(&self, id: Id, io: Rc<EpLanes>, ctrl: crate::wire::Ctrl) -> (Flow, bool, Rc<EpLanes>) {
        let status = TxResult::from_uct(exec::send_ctrl(io.am(), &ctrl)).status;
        let mut e = self.engine.borrow_mut();
        let flow = e.sh.ctrl_replayed(id, ctrl, status);
        (flow, e.has_actions(), io)
    }

    /// Parks endpoint `id` on `lane` after a refusal: its wake goes into the lane's pending
    /// queue, unless it is replaying from that wake already (which stays queued) or the lane
    /// has resources by now (then progress retries it).
    fn park(&self, id: Id, io: &EpLanes, lane: Lane) {
        if self.engine.borrow().sh.waking(id) {
            return;
        }
        if io.park(lane, &self.weak) {
            self.engine.borrow_mut().sh.parked(id);
        }
    }

    /// The lane a parked endpoint waits on has resources again: replays its queue. True when
    /// the endpoint stays parked.
    pub fn unpark(&self, id: Id) -> bool {
        if !self.engine.borrow_mut().sh.wake_begin(id) {
            return false;
        }
        self.flush(id);
        self.with_engine(|e| e.sh.wake_end(id))
    }

    /// A transport reported a failed endpoint.
    pub fn on_ep_error(&self, id: Id, status: ucs::Status) {
        self.with_engine(|e| e.on_ep_error(id, status));
    }

    /// A peer's request names no endpoint here: builds one for it.
    fn accept(&self, req: AcceptReq) {
        let id = self.engine.borrow().sh.eps.next_id();
        match self.build_lanes(&req.remote, id) {
            Ok(b) => {
                let st =
                    EpState::new(Rc::new(b.lanes), req.remote.clone(), req.conn_sn, b.cfg, b.selection, b.p2p_addrs);
                self.with_engine(|e| {
                    let got = e.conn.accept(&mut e.sh, req, st);
                    debug_assert_eq!(got, id, "the endpoint took another id than its lanes were given");
                });
            }
            Err(e) => tracing::warn!("wireup: cannot create an endpoint for a peer's request: {e}"),
        }
    }

    /// Progresses the interfaces, then retries refused transmissions and flushes closes.
    #[inline]
    pub fn progress(&self) -> usize {
        let mut n = self.uct.progress();
        let k = self.idle_polls.get().wrapping_add(1);
        self.idle_polls.set(k);
        if k % IDLE_POLL_EVERY == 0 {
            n += self.poll_idle();
            self.timers();
            if self.sockaddr_active.get() {
                n += self.progress_sockaddr();
            }
        }
        if self.engine.borrow().sh.needs_progress() {
            n += self.progress_queues();
        }
        n
    }

    /// Progresses the interfaces not (yet) active.
    #[cold]
    fn poll_idle(&self) -> usize {
        let mut n = 0;
        for (i, wi) in self.ifaces.iter().enumerate() {
            if !self.active[i].get() {
                n += wi.iface.progress();
            }
        }
        n
    }

    /// Gives the engine the time, when it waits for some.
    #[cold]
    fn timers(&self) {
        let due = self.engine.borrow().sh.keepalive.next_timeout();
        if let Some(due) = due {
            let now = ucs::time::now();
            if now >= due {
                self.with_engine(|e| e.sh.on_timer(now));
            }
        }
    }

    /// Makes the next progress call run a keepalive round (the wakeup timer fired).
    pub fn keepalive_now(&self) {
        self.engine.borrow_mut().sh.keepalive.force();
        self.idle_polls.set(IDLE_POLL_EVERY - 1);
    }

    /// Retries the endpoints whose lanes refused, and flushes closing endpoints.
    #[inline(never)]
    fn progress_queues(&self) -> usize {
        let mut n = 0;
        let mut list = std::mem::take(&mut *self.retry.borrow_mut());
        self.engine.borrow_mut().sh.take_retry(&mut list);
        for &id in &list {
            n += self.flush(id);
        }
        *self.retry.borrow_mut() = list;
        let closing = std::mem::take(&mut self.engine.borrow_mut().sh.closing);
        for rid in closing {
            let polled = self.with_engine(|e| e.close_poll(rid));
            match polled {
                None => n += 1,
                Some((ep, Some(io))) if flushed(&io) => {
                    self.with_engine(|e| e.close_flushed(ep, rid));
                    n += 1;
                }
                Some(_) => self.engine.borrow_mut().sh.closing.push(rid),
            }
        }
        n
    }

    /// Makes interface `i` progress on every call.
    #[inline]
    pub fn activate(&self, i: usize) {
        if let Some(a) = self.active.get(i) {
            if !a.get() {
                a.set(true);
                self.ifaces[i].iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
            }
        }
    }

    /// An active message other than eager arrived.
    pub fn on_am(&self, id: u8, m: uct::AmRecv<'_>) {
        if rma_target::is_target_id(id) {
            return self.rma_target(id, m.data());
        }
        if matches!(id, wire::AM_AM_ONLY | wire::AM_AM_FIRST | wire::AM_AM_MIDDLE | wire::AM_AM_RTS) {
            return self.on_user_am(id, m);
        }
        if id == wire::AM_STREAM_DATA {
            return self.arrival(|e| e.stream.on_data(&mut e.sh, m));
        }
        let d = self.with_engine(|e| e.on_am(id, m));
        if let Some(d) = d {
            d.run();
        }
    }

    /// An eager message arrived: the 8-byte receive path.
    #[inline(always)]
    pub fn on_eager(&self, m: uct::AmRecv<'_>) {
        self.arrival(|e| e.tag.on_eager(&mut e.sh, m));
    }

    /// An eager message came through a transport's tag matching without meeting a receive
    /// posted there.
    pub(crate) fn on_offload_eager(&self, iface: usize, u: uct::TagUnexpEager<'_>) {
        let (max, thresh) = self.offload_limits(iface);
        self.arrival(|e| {
            e.tag.offload_activate(iface, max, thresh);
            e.tag.on_offload_eager(&mut e.sh, u.stag, u.imm, u.msg)
        });
    }

    /// A rendezvous request came through a transport's tag matching without meeting a
    /// receive posted there.
    pub(crate) fn on_offload_rndv(&self, iface: usize, u: &uct::TagUnexpRndv<'_>) {
        let (max, thresh) = self.offload_limits(iface);
        self.with_engine(|e| {
            e.tag.offload_activate(iface, max, thresh);
            e.tag.on_offload_rndv(&mut e.sh, u)
        });
    }

    /// How many receives interface `iface`'s tag matching takes, and the offload settings.
    fn offload_limits(&self, iface: usize) -> (usize, crate::tag::offload::OffloadCfg) {
        let max = self.ifaces.get(iface).map_or(0, |i| i.attr.tag.recv_max_outstanding);
        let c = self.ctx.config();
        (
            max,
            crate::tag::offload::OffloadCfg {
                thresh: c.tm_thresh,
                max_bb: c.tm_max_bb_size,
                force_thresh: c.tm_force_thresh,
            },
        )
    }

    /// Runs an arrival's engine work `f`, then, outside the engine, the plain callback of the
    /// first request it completed (returned by `f`, freed already) before the actions it queued
    /// (later completions).
    #[inline(always)]
    fn arrival(&self, f: impl FnOnce(&mut CoreEngine) -> Option<crate::request::complete::Done>) {
        let (d, more) = {
            let mut e = self.engine.borrow_mut();
            let d = f(&mut e);
            (d, e.sh.has_actions())
        };
        if let Some(d) = d {
            d.run();
        }
        if more {
            self.drain();
        }
    }
}

/// Whether every transport endpoint of `io` flushed (a failed one counts as flushed).
fn flushed(io: &EpLanes) -> bool {
    io.uct_eps.iter().all(|l| matches!(l.ep.flush(uct::FlushFlags::LOCAL, None), Ok(ucs::Outcome::Done(_)) | Err(_)))
}
