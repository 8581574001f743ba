//! The worker's single-threaded core: interfaces, endpoints, requests, the tag matcher, and the
//! dispatch of UCP's active messages.
//!
//! Re-entrancy rules (the loop-back transport delivers inside the send call, and callbacks may
//! send): no `RefCell` borrow is held across a uct send, a uct progress call, or a user
//! callback. State is split into several cells so each operation borrows only what it needs,
//! briefly.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::{Rc, Weak};

use ucs::idtable::{Id, IdTable};
use ucs::{Outcome, Status, UcsResult};
use uct::{AmRecv, Iface, IfaceAttr, IfaceParams, Md, ProgressFlags};

use crate::address::{IfaceRecord, WorkerAddress};
use crate::config::TlUse;
use crate::context::{Context, Resource};
use crate::ep::{Ep, EpStatus, Pending};
use crate::request::{Callback, RecvInfo, ReqKind, ReqState, Reqs, ZcPool, ZcState, ZC_POOL_CHUNK};
use crate::tag::{Tag, UnexpHandle, UnexpQueue};
use crate::wire::{self, Msg};

/// Size of the buffers of [`Core::kept_msgs`]: the longest `am_short` message of posix/sysv
/// (120 bytes), rc and ud fits; a longer borrowed message (from `self`) is copied to the heap.
const KEPT_MSG_SIZE: usize = 256;

/// One opened interface of the worker.
pub struct WorkerIface {
    /// The resource it was opened on.
    pub resource: Resource,
    /// Its memory domain.
    pub md: Rc<dyn Md>,
    /// The interface.
    pub iface: Rc<dyn Iface>,
    /// Its attributes, queried once.
    pub attr: IfaceAttr,
}

/// Idle interfaces are polled once per this many progress calls.
const IDLE_POLL_EVERY: u32 = 32;

/// Free completions the worker keeps for reuse at most.
const ZC_COMPS_KEPT: usize = 256;

/// What a worker's reusable zero-copy completion reports when it fires.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ZcDone {
    /// Nothing (a free completion).
    Idle,
    /// Every eager zero-copy fragment of send `rid` completed.
    EagerSent { rid: Id },
    /// The rendezvous get of receive `rid` completed; the ATS goes to `sreq` over `ep`.
    Get { ep: Id, rid: Id, sreq: u64 },
    /// The rendezvous put of send `sreq` completed; the ATP goes to `rreq` over `ep`.
    Put { ep: Id, sreq: Id, rreq: u64 },
}

/// A free reusable completion, and what its callback reports when it fires.
pub(crate) struct ZcComp {
    comp: Rc<uct::Completion>,
    what: Rc<Cell<ZcDone>>,
}

/// A rendezvous request to send, as received.
#[derive(Debug)]
pub(crate) struct Rts {
    pub ep: u64,
    pub sreq: u64,
    pub size: usize,
    pub addr: u64,
    pub rkey: uct::PackedKey,
    /// The sender's buffer is contiguous.
    pub contig: bool,
}

/// An unexpected message.
pub(crate) enum Unexp {
    /// A whole eager message kept in its transport buffer (`offset` skips the header).
    Eager { desc: uct::AmDesc, offset: usize, sync: Option<(u64, u64)> },
    /// A multi-fragment eager message, possibly still arriving.
    Frag { key: (u64, u64), total: usize, data: Vec<u8>, sync: Option<(u64, u64)> },
    /// A rendezvous request.
    Rts(Rts),
}

impl Unexp {
    /// Length the sender sent.
    pub fn length(&self) -> usize {
        match self {
            Unexp::Eager { desc, offset, .. } => desc.len() - offset,
            Unexp::Frag { total, .. } => *total,
            Unexp::Rts(r) => r.size,
        }
    }
}

/// Where the fragments of a multi-fragment message go.
#[derive(Clone, Copy, Debug)]
pub(crate) enum FragTarget {
    Unexp(UnexpHandle),
    Probed(Id),
    Req(Id),
}

/// Matching of endpoints created towards each other (by remote uuid and connection number).
#[derive(Default)]
pub(crate) struct ConnMatch {
    /// Next connection number per remote worker.
    pub next_sn: HashMap<u64, u32>,
    /// Endpoints the user created, waiting for the peer's request.
    pub expected: HashMap<(u64, u32), Id>,
    /// Endpoints a peer's request created, not yet claimed by a local create.
    pub unexpected: HashMap<(u64, u32), Id>,
}

/// A registration made by `Worker::mem_map`: one handle per interface that needs one.
pub(crate) struct MemMap {
    pub addr: usize,
    pub len: usize,
    pub regs: Vec<Option<uct::MemH>>,
}

/// The core.
pub(crate) struct Core {
    pub ctx: Context,
    pub uct: uct::Worker,
    pub ifaces: Vec<WorkerIface>,
    /// Interfaces progressed on every call: those an endpoint uses or a peer sent to.
    /// The others are polled every `IDLE_POLL_EVERY` calls, so a first message still arrives.
    pub active: Box<[Cell<bool>]>,
    pub idle_polls: Cell<u32>,
    pub address: WorkerAddress,
    pub packed: Vec<u8>,
    pub weak: Weak<Core>,
    pub eps: RefCell<IdTable<Option<Rc<Ep>>>>,
    pub reqs: RefCell<Reqs>,
    /// Unexpected messages (the expected receives are in `reqs`).
    pub unexp: RefCell<UnexpQueue<Unexp>>,
    pub frags: RefCell<HashMap<(u64, u64), FragTarget>>,
    /// Reassembly buffers of unexpected multi-fragment messages, kept for reuse (see
    /// [`Core::frag_buf`]).
    pub frag_bufs: RefCell<Vec<Vec<u8>>>,
    pub probed: RefCell<IdTable<(Tag, Unexp)>>,
    pub conn: RefCell<ConnMatch>,
    /// Endpoints with queued operations to retry from progress.
    pub pending_eps: RefCell<Vec<Id>>,
    /// Close requests being flushed.
    pub closing: RefCell<Vec<Id>>,
    pub next_msg_id: Cell<u64>,
    /// How many messages each protocol carried (see [`crate::ProtoCounts`]).
    pub counts: Cell<crate::ProtoCounts>,
    pub mems: RefCell<IdTable<MemMap>>,
    /// Keepalive interval in ns (0: off) and endpoints per round.
    pub keepalive_ns: u64,
    pub keepalive_eps: usize,
    pub keepalive_due: Cell<u64>,
    pub keepalive_cursor: Cell<usize>,
    /// Zero-copy state of requests.
    pub zc_pool: ZcPool,
    /// Buffers for unexpected messages that arrived inline in a transport's receive buffer
    /// (`am_short`) and are too long for the descriptor itself: kept without allocating.
    pub kept_msgs: Rc<ucs::mpool::MemPool>,
    /// Completions of zero-copy operations that fired and nobody holds: reused by the next
    /// ones (see [`Core::zc_completion`]).
    zc_comps: RefCell<Vec<ZcComp>>,
}

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

/// What a completion leaves to do once the request table is released.
enum AfterCompletion {
    Nothing,
    /// The plain callback of a request freed already.
    Call(crate::request::CallbackFn, usize, Status, RecvInfo),
    /// Anything else ([`Core::complete_full`]).
    Full(Id, Status),
}

/// What remains of completing a request that had more than a plain callback, once the request
/// table is released: the callbacks to run, the future to wake, and a user's buffer to drop.
pub(crate) struct CompletedFull {
    status: Status,
    info: RecvInfo,
    cb_fn: Option<(crate::request::CallbackFn, usize)>,
    callback: Option<Callback>,
    waker: Option<std::task::Waker>,
    owned: Option<Box<dyn std::any::Any + Send>>,
}

impl CompletedFull {
    #[inline(never)]
    fn run(self) {
        let CompletedFull { status, info, cb_fn, callback, waker, owned } = self;
        drop(owned);
        if let Some(cb) = callback {
            cb(status, info);
        }
        if let Some((f, data)) = cb_fn {
            f(status, info, data);
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

fn record_of(i: &WorkerIface) -> IfaceRecord {
    let a = &i.attr;
    let bw = a.bandwidth.dedicated + a.bandwidth.shared;
    IfaceRecord {
        tl_name: i.resource.desc.tl.tl_name.clone(),
        dev_name: i.resource.desc.tl.dev_name.clone(),
        dev_type: i.resource.desc.tl.dev_type,
        aux: i.resource.usage == TlUse::AuxOnly,
        flags: a.flags,
        latency_ns: (a.latency.c * 1e9).max(0.0),
        // A transport without a model still gets a positive bandwidth.
        bandwidth: if bw.is_finite() && bw > 0.0 { bw } else { 1.0 },
        overhead_ns: (a.overhead * 1e9).max(0.0),
        dev_addr: i.iface.device_address(),
        iface_addr: i.iface.iface_address(),
    }
}

/// Runs an active-message handler's work on the core it was made for, unless the core is
/// being dropped (then the message is dropped), without taking a reference count per message.
#[inline(always)]
fn with_core(w: &Weak<Core>, f: impl FnOnce(&Core)) {
    if w.strong_count() > 0 {
        // SAFETY: the core is alive (a non-zero strong count: it is not being dropped). It
        // stays alive for the whole handler. Handlers run inside a call on this core (its
        // progress, or a send on its `self` lane), reached through a `Worker` or `Endpoint`
        // handle whose `Arc` keeps the worker, and so the core's `Rc`, alive until the call
        // returns (nothing a handler or a user callback does can drop the caller's handle), or
        // while the worker goes: while `Shared::drop` drops the endpoints its `Rc` still holds
        // the core, and once the core itself is dropped the strong count is zero.
        f(unsafe { &*w.as_ptr() })
    }
}

impl Core {
    /// Opens an interface on every resource of `ctx` and builds the address.
    pub fn new(ctx: &Context, name: &str) -> UcsResult<Rc<Core>> {
        let mut result = Ok(());
        let keepalive_ns = ctx.config().keepalive_interval.as_nanos().min(u64::MAX as u128) as u64;
        let zc_pool = ucs::mpool::ObjPool::<ZcState>::new(ZC_POOL_CHUNK, usize::MAX)?;
        let mut kp = ucs::mpool::MpoolParams::new(KEPT_MSG_SIZE);
        kp.elems_per_chunk = 64;
        kp.name = "ucp_kept_msgs";
        let kept_msgs = Rc::new(ucs::mpool::MemPool::new(kp, Box::new(ucs::mpool::HeapChunkAlloc))?);
        let core = Rc::new_cyclic(|weak: &Weak<Core>| {
            let uct = uct::Worker::default();
            let mut ifaces = Vec::new();
            for r in ctx.resources() {
                let w = weak.clone();
                let err: uct::ErrHandler = Rc::new(move |user_data, status| {
                    if let Some(core) = w.upgrade() {
                        core.on_ep_error(Id::from_raw(user_data), status);
                    }
                });
                let opened = uct::component(r.desc.component).and_then(|c| {
                    let md = c.md_open(&r.desc.md_name)?;
                    let mut params = IfaceParams::new(&r.desc.tl.tl_name, &r.desc.tl.dev_name);
                    params.err_handler = Some(err);
                    params.config = r.config.clone();
                    let iface: Rc<dyn Iface> = md.iface_open(&uct, &params)?.into();
                    Ok((md, iface))
                });
                match opened {
                    Ok((md, iface)) => {
                        let attr = iface.attr().clone();
                        let index = ifaces.len();
                        if attr.flags.contains(uct::IfaceFlags::AM_BCOPY) {
                            for id in wire::ALL_AM_IDS {
                                let w = weak.clone();
                                // Eager messages, the common case, skip the dispatch by id.
                                let h: uct::AmHandler = if id == wire::AM_EAGER_ONLY {
                                    Rc::new(move |m: AmRecv<'_>| {
                                        with_core(&w, |core| {
                                            core.activate(index);
                                            core.on_eager_only(m);
                                        })
                                    })
                                } else {
                                    Rc::new(move |m: AmRecv<'_>| {
                                        with_core(&w, |core| {
                                            core.activate(index);
                                            core.on_am(id, m);
                                        })
                                    })
                                };
                                if let Err(e) = iface.set_am_handler(id, Some(h)) {
                                    tracing::warn!("{}: cannot set AM handler {id}: {e}", r.desc.tl.full_name());
                                }
                            }
                        }
                        ifaces.push(WorkerIface { resource: r.clone(), md, iface, attr });
                    }
                    Err(e) => tracing::warn!("{}: cannot open an interface: {e}", r.desc.tl.full_name()),
                }
            }
            if !ifaces.iter().any(|i| i.resource.usage == TlUse::Full) {
                tracing::error!("ucp worker: no interface could be opened");
                result = Err(Status::NoDevice);
            }
            let address = WorkerAddress {
                uuid: new_uuid(),
                name: name.chars().take(64).collect(),
                ifaces: ifaces.iter().map(record_of).collect(),
            };
            let packed = match address.pack() {
                Ok(p) => p,
                Err(e) => {
                    result = Err(e);
                    Vec::new()
                }
            };
            Core {
                ctx: ctx.clone(),
                uct,
                active: ifaces.iter().map(|_| Cell::new(false)).collect(),
                idle_polls: Cell::new(0),
                ifaces,
                packed,
                weak: weak.clone(),
                eps: RefCell::new(IdTable::new()),
                reqs: RefCell::new(Reqs::default()),
                unexp: RefCell::new(UnexpQueue::new()),
                frags: RefCell::new(HashMap::new()),
                frag_bufs: RefCell::new(Vec::new()),
                probed: RefCell::new(IdTable::new()),
                conn: RefCell::new(ConnMatch::default()),
                pending_eps: RefCell::new(Vec::new()),
                closing: RefCell::new(Vec::new()),
                next_msg_id: Cell::new(address.uuid.rotate_left(17)),
                counts: Cell::new(crate::ProtoCounts::default()),
                mems: RefCell::new(IdTable::new()),
                keepalive_ns,
                keepalive_eps: ctx.config().keepalive_num_eps,
                keepalive_due: Cell::new(ucs::time::now().saturating_add(keepalive_ns)),
                keepalive_cursor: Cell::new(0),
                zc_pool,
                kept_msgs,
                zc_comps: RefCell::new(Vec::new()),
                address,
            }
        });
        result.map(|()| core)
    }

    /// Progresses the interfaces, then retries queued operations and pending closes.
    #[inline]
    pub fn progress(&self) -> usize {
        let mut n = self.uct.progress();
        let k = self.idle_polls.get().wrapping_add(1);
        self.idle_polls.set(k);
        if k % IDLE_POLL_EVERY == 0 {
            n += self.poll_idle();
            self.keepalive();
        }
        if !self.pending_eps.borrow().is_empty() {
            n += self.progress_pending();
        }
        if !self.closing.borrow().is_empty() {
            n += self.progress_closing();
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

    /// The endpoint `id`, if it exists.
    #[inline]
    pub fn ep(&self, id: Id) -> Option<Rc<Ep>> {
        self.eps.borrow().get(id).and_then(|e| e.clone())
    }

    /// The endpoint named by a peer's header, or a warning.
    pub fn ep_from_wire(&self, raw: u64, what: &str) -> Option<Rc<Ep>> {
        let ep = self.ep(Id::from_raw(raw));
        if ep.is_none() {
            tracing::warn!("{what}: no endpoint with id {raw:#x}; message dropped");
        }
        ep
    }

    /// Counts a protocol use.
    #[inline]
    pub fn count(&self, f: impl FnOnce(&mut crate::ProtoCounts) -> &mut u64) {
        let mut c = self.counts.get();
        *f(&mut c) += 1;
        self.counts.set(c);
    }

    /// A fresh message id for multi-fragment sends.
    pub fn msg_id(&self) -> u64 {
        let v = self.next_msg_id.get();
        self.next_msg_id.set(v.wrapping_add(1));
        v
    }

    // ---- requests ---------------------------------------------------------------------------

    /// Registers a request; returns its id.
    #[inline]
    pub fn req_new(&self, kind: ReqKind, callback: Option<Callback>) -> Id {
        self.reqs.borrow_mut().insert(ReqState::new(kind, callback, None, false))
    }

    /// Registers a request with both kinds of callback from `param`.
    #[inline]
    pub fn req_with(&self, kind: ReqKind, param: crate::RequestParam) -> Id {
        self.reqs.borrow_mut().insert(ReqState::new(kind, param.callback, param.callback_fn, param.detached))
    }

    /// Completes request `id` with `status` (once; later calls are ignored), runs its callback
    /// and wakes its future. Nothing is borrowed while they run.
    #[inline]
    pub fn finish(&self, id: Id, status: Status) {
        self.complete_with(id, |_| Some(status));
    }

    /// [`Self::finish`] with the status from `fill`, which sees the request first (to deliver
    /// data into it) under the same lookup; `fill` returning `None` leaves the request as it
    /// was. The protocol state (registrations, keys) is dropped with the request; callbacks,
    /// the waker and a user's buffer only once the request table is released.
    #[inline(always)]
    pub fn complete_with(&self, id: Id, fill: impl FnOnce(&mut ReqState) -> Option<Status>) {
        let after = {
            let mut reqs = self.reqs.borrow_mut();
            match reqs.tab.occupied(id) {
                Some(entry) => Self::complete_entry(entry, fill),
                None => return,
            }
        };
        self.after_completion(after);
    }

    /// Takes the earliest receive posted for `tag` off the expected queues and delivers the
    /// whole message `payload` into it, under one borrow of the table; false (nothing changed)
    /// when no receive waits for `tag`.
    #[inline(always)]
    pub fn deliver_expected(&self, tag: Tag, payload: &[u8]) -> bool {
        let after = {
            let mut guard = self.reqs.borrow_mut();
            let reqs = &mut *guard;
            let Some(i) = reqs.exp.take(&mut reqs.tab, tag) else { return false };
            let Some(mut entry) = reqs.tab.occupied_at(i) else { return true };
            // `complete_entry` written out with the fill called directly: through a closure,
            // the copy into the buffer stays out of line (555 against 536 instructions per
            // message for the `tag_bw -s 8` receiver).
            let r = entry.get_mut();
            if r.status != Status::InProgress {
                return true;
            }
            let Some(status) = Self::fill_whole(r, tag, payload) else { return true };
            Self::complete_entry_with(entry, status)
        };
        self.after_completion(after);
        true
    }

    /// Takes the earliest receive posted for `tag` off the expected queues; its id.
    #[inline]
    pub fn take_expected(&self, tag: Tag) -> Option<Id> {
        let mut guard = self.reqs.borrow_mut();
        let reqs = &mut *guard;
        let i = reqs.exp.take(&mut reqs.tab, tag)?;
        reqs.tab.occupied_at(i).map(|mut e| e.id())
    }

    /// The part of a completion done under the table's borrow: `fill`, then, for a request the
    /// user let go of with at most a plain callback (the common case), freeing it.
    #[inline(always)]
    fn complete_entry(
        mut entry: ucs::idtable::Occupied<'_, ReqState>,
        fill: impl FnOnce(&mut ReqState) -> Option<Status>,
    ) -> AfterCompletion {
        let r = entry.get_mut();
        if r.status != Status::InProgress {
            return AfterCompletion::Nothing;
        }
        let Some(status) = fill(r) else { return AfterCompletion::Nothing };
        Self::complete_entry_with(entry, status)
    }

    /// [`Self::complete_entry`] once the request in progress has its status.
    #[inline(always)]
    fn complete_entry_with(mut entry: ucs::idtable::Occupied<'_, ReqState>, status: Status) -> AfterCompletion {
        let r = entry.get_mut();
        if !(r.released && r.ext.is_none()) || r.exp.is_posted() {
            return AfterCompletion::Full(entry.id(), status);
        }
        let (info, cb_fn) = (r.info, r.cb_fn);
        if r.owns_nothing() {
            entry.discard_owning_nothing();
        } else {
            entry.discard();
        }
        match cb_fn {
            Some((f, data)) => AfterCompletion::Call(f, data, status, info),
            None => AfterCompletion::Nothing,
        }
    }

    /// The part of a completion done once the table is released.
    #[inline(always)]
    fn after_completion(&self, after: AfterCompletion) {
        match after {
            AfterCompletion::Nothing => {}
            AfterCompletion::Call(f, data, status, info) => f(status, info, data),
            AfterCompletion::Full(id, status) => self.complete_full(id, status),
        }
    }

    /// [`Self::complete_with`] for a request still held, or with a callback, waker or owned
    /// buffer: marks it complete with `status` and frees it if the user released it; the
    /// callbacks, waker and a user's buffer are handled once the table is released.
    #[inline(never)]
    fn complete_full(&self, id: Id, status: Status) {
        let done = {
            let mut reqs = self.reqs.borrow_mut();
            // A receive completed while still posted (not by a match or a cancel, which take
            // it off first) leaves the queues now, before its slot can be freed.
            reqs.unpost(id);
            let Some(r) = reqs.get_mut(id) else { return };
            r.status = status;
            let info = r.info;
            let cb_fn = r.cb_fn.take();
            let (callback, waker, owned) = if r.released {
                let taken = r.take_ext();
                reqs.discard(id);
                taken
            } else {
                r.kind = ReqKind::Done;
                // An owned buffer stays for the future to take back.
                match &mut r.ext {
                    Some(e) => (e.callback.take(), e.waker.take(), None),
                    None => (None, None, None),
                }
            };
            CompletedFull { status, info, cb_fn, callback, waker, owned }
        };
        done.run();
    }

    /// A completion expecting `count` operations that reports `what` when they are done: a
    /// free one of the worker's, or a new one. A completion goes back to the free list when it
    /// fired, and is reused only once nobody else holds it (the transport that completed it,
    /// or the finished request that kept it), so a late completion can never hit a new
    /// operation.
    pub fn zc_completion(&self, count: i32, what: ZcDone) -> Rc<uct::Completion> {
        let free = {
            let mut comps = self.zc_comps.borrow_mut();
            comps.pop().filter(|z| Rc::strong_count(&z.comp) == 1)
        };
        let z = free.unwrap_or_else(|| self.new_zc_comp());
        z.comp.set_count(count);
        z.what.set(what);
        z.comp
    }

    #[cold]
    fn new_zc_comp(&self) -> ZcComp {
        let what = Rc::new(Cell::new(ZcDone::Idle));
        let (core, w) = (self.weak.clone(), what.clone());
        let comp = uct::Completion::new_cyclic(1, move |me| {
            move |st| {
                let done = w.replace(ZcDone::Idle);
                let Some(core) = core.upgrade() else { return };
                core.zc_fired(done, st);
                if let Some(comp) = me.upgrade() {
                    let mut comps = core.zc_comps.borrow_mut();
                    if comps.len() < ZC_COMPS_KEPT {
                        comps.push(ZcComp { comp, what: w.clone() });
                    }
                }
            }
        });
        ZcComp { comp, what }
    }

    /// Status and receive info of a request.
    #[inline]
    pub fn req_status(&self, id: Id) -> (Status, RecvInfo) {
        match self.reqs.borrow().get(id) {
            Some(r) => (r.status, r.info),
            None => (Status::NoElem, RecvInfo::default()),
        }
    }

    /// The user dropped the handle: free now if complete, else when it completes.
    #[inline]
    pub fn req_release(&self, id: Id) {
        // The common case first: a pending request without callback, waker or owned buffer.
        if let Some(r) = self.reqs.borrow_mut().get_mut(id) {
            if r.status == Status::InProgress && r.ext.is_none() {
                r.released = true;
                return;
            }
        }
        self.req_release_rest(id);
    }

    /// [`Self::req_release`] for a completed request or one with extras.
    #[inline(never)]
    fn req_release_rest(&self, id: Id) {
        let dropped = {
            let mut reqs = self.reqs.borrow_mut();
            match reqs.get_mut(id) {
                Some(r) if r.status != Status::InProgress => {
                    let ext = r.ext.take();
                    reqs.discard(id);
                    ext
                }
                Some(r) => {
                    r.released = true;
                    if let Some(e) = &mut r.ext {
                        e.waker = None;
                    }
                    None
                }
                None => None,
            }
        };
        drop(dropped);
    }

    /// Cancels a posted receive that has not matched.
    pub fn req_cancel(&self, id: Id) {
        let cancelled = self.reqs.borrow_mut().unpost(id);
        if cancelled {
            self.finish(id, Status::Canceled);
        }
    }

    // ---- sending helpers ---------------------------------------------------------------------

    /// Sends a control message on the endpoint's AM lane (wireup messages: its wireup lane),
    /// or queues it. Wireup messages have their own queue and go out in any state but failed
    /// or closed; the others queue behind what the endpoint already queued.
    pub fn send_ctrl(&self, ep: &Rc<Ep>, ctrl: crate::ep::Ctrl) {
        if matches!(ctrl, crate::ep::Ctrl::Wireup(_)) {
            if ep.error().is_none() && !(ep.wireup_q.borrow().is_empty() && self.ctrl_attempt(ep, &ctrl)) {
                self.queue(ep, Pending::Ctrl(ctrl));
            }
            return;
        }
        if ep.pending.borrow().is_empty()
            && matches!(ep.status.get(), EpStatus::Connecting | EpStatus::Connected)
            && self.ctrl_attempt(ep, &ctrl)
        {
            return;
        }
        self.queue(ep, Pending::Ctrl(ctrl));
    }

    /// One attempt that settles the message: true when it went out or failed (logged, not
    /// retried), false when the lane had no resources.
    fn ctrl_attempt(&self, ep: &Ep, ctrl: &crate::ep::Ctrl) -> bool {
        self.try_ctrl(ep, ctrl).unwrap_or_else(|e| {
            tracing::warn!("ucp: sending {} failed: {e}", ctrl.name());
            true
        })
    }

    /// One attempt; `Ok(false)` is "no resources, retry".
    pub fn try_ctrl(&self, ep: &Ep, ctrl: &crate::ep::Ctrl) -> UcsResult<bool> {
        let lane = if matches!(ctrl, crate::ep::Ctrl::Wireup(_)) { ep.wireup() } else { ep.am() };
        let r = lane.am_bcopy(ctrl.am_id(), &mut |buf| ctrl.pack(buf), uct::SendFlags::empty());
        match r {
            Ok(Outcome::NoResource) => Ok(false),
            Ok(_) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Queues an operation on an endpoint, to be retried from progress (or, on a parked
    /// endpoint, by its lane's wake); wireup messages go to the endpoint's wireup queue.
    pub fn queue(&self, ep: &Rc<Ep>, p: Pending) {
        let wireup = match p {
            Pending::Ctrl(c @ crate::ep::Ctrl::Wireup(_)) => {
                ep.wireup_q.borrow_mut().push_back(c);
                true
            }
            p => {
                ep.pending.borrow_mut().push_back(p);
                false
            }
        };
        // Data waits for the AM lane's wake if the endpoint can park there, else for progress.
        if wireup || !self.park(ep) {
            self.list(ep);
        }
    }

    /// Puts an endpoint on the list progress retries.
    fn list(&self, ep: &Ep) {
        if !ep.listed.replace(true) {
            self.pending_eps.borrow_mut().push(ep.id.get());
        }
    }

    /// Parks a connected endpoint whose queue waits for its AM lane: the lane's pending queue
    /// holds the endpoint's wake until the transport has resources, so neither progress nor
    /// new sends retry the queue meanwhile (UCX's transports tell "still full" from a cached
    /// tail the same way). False when the lane has resources now or keeps no pending queue;
    /// then progress keeps retrying.
    pub fn park(&self, ep: &Rc<Ep>) -> bool {
        if ep.parked.get() {
            return true;
        }
        if ep.status.get() != EpStatus::Connected || ep.pending.borrow().is_empty() {
            return false;
        }
        let wake =
            ep.wake.get_or_init(|| Rc::new(crate::ep::LaneWake { core: self.weak.clone(), ep: Rc::downgrade(ep) }));
        let parked = ep.am().pending_add(wake.clone()).is_ok();
        if parked {
            ep.parked.set(true);
            self.count(|c| &mut c.parked);
        }
        parked
    }

    /// The AM lane of a parked endpoint has resources again: replays its queue. True when
    /// the endpoint stays parked (something is left: its wake stays in the lane's queue and is
    /// called again when the transport sees resources; UCX's pending callbacks retry the same
    /// way). The endpoint stays marked parked while replaying, so a send issued from a
    /// completion callback queues behind the replayed ones instead of replaying recursively.
    pub fn unpark(&self, ep: &Rc<Ep>) -> bool {
        if !ep.parked.get() {
            return false;
        }
        if ep.status.get() == EpStatus::Connected {
            self.replay(ep);
        }
        // Unparked meanwhile (the endpoint failed or closed) or drained: the wake is done.
        if !ep.parked.get() || ep.pending.borrow().is_empty() {
            ep.parked.set(false);
            return false;
        }
        true
    }

    /// Removes a failed or closed endpoint's wake from its AM lane.
    pub fn unpark_dropped(&self, ep: &Ep) {
        if ep.parked.replace(false) {
            ep.am().pending_purge(&mut drop);
        }
    }

    /// Retries queued operations in order, per endpoint, until one does not fit; an endpoint
    /// whose queue then waits for its AM lane parks there and leaves the list.
    fn progress_pending(&self) -> usize {
        let mut n = 0;
        let mut i = 0;
        loop {
            // Re-borrowed every step: replaying may queue on other endpoints.
            let Some(id) = self.pending_eps.borrow().get(i).copied() else { break };
            let keep = match self.ep(id) {
                Some(ep) => {
                    n += self.replay_wireup(&ep);
                    if ep.status.get() == EpStatus::Connected && !ep.parked.get() {
                        n += self.replay(&ep);
                    }
                    let keep = !ep.wireup_q.borrow().is_empty() || !(ep.parked.get() || ep.pending.borrow().is_empty());
                    ep.listed.set(keep);
                    keep
                }
                None => false,
            };
            if keep {
                i += 1;
            } else {
                self.pending_eps.borrow_mut().swap_remove(i);
            }
        }
        n
    }

    /// Whether a new operation may go out on `ep` now: a connected endpoint with queued
    /// operations replays them first, so the new one need not queue behind operations that
    /// fit by now; a parked one waits for its wake.
    #[inline]
    pub fn ready_after_replay(&self, ep: &Rc<Ep>) -> bool {
        if !ep.ready() && !ep.parked.get() && ep.status.get() == EpStatus::Connected {
            self.replay(ep);
        }
        ep.ready()
    }

    /// Sends the queued wireup messages of an endpoint; stops at the first "no resources".
    fn replay_wireup(&self, ep: &Rc<Ep>) -> usize {
        let mut n = 0;
        loop {
            if ep.error().is_some() {
                ep.wireup_q.borrow_mut().clear();
                break;
            }
            let Some(c) = ep.wireup_q.borrow_mut().pop_front() else { break };
            if !self.ctrl_attempt(ep, &c) {
                ep.wireup_q.borrow_mut().push_front(c);
                break;
            }
            n += 1;
        }
        n
    }

    /// Sends what an endpoint has queued, in order; stops at the first "no resources", and
    /// then parks the endpoint (see [`Self::park`]).
    pub fn replay(&self, ep: &Rc<Ep>) -> usize {
        let mut n = 0;
        loop {
            let Some(p) = ep.pending.borrow_mut().pop_front() else { break };
            let done = match &p {
                Pending::Ctrl(c) => self.ctrl_attempt(ep, c),
                Pending::Send(rid) => self.send_progress(ep, *rid),
                Pending::Get(rid) => self.rndv_get_start(ep, *rid),
            };
            if !done {
                ep.pending.borrow_mut().push_front(p);
                self.park(ep);
                break;
            }
            n += 1;
        }
        n
    }

    // ---- active messages ---------------------------------------------------------------------

    /// Dispatches one of UCP's active messages: decodes its header (a malformed one is logged
    /// with what was wrong, and dropped) and hands it to its protocol.
    pub fn on_am(&self, id: u8, m: AmRecv<'_>) {
        match id {
            // Eager messages keep their transport buffer when unexpected: they take `m`.
            wire::AM_EAGER_ONLY => return self.on_eager_only(m),
            wire::AM_EAGER_SYNC_ONLY => return self.on_eager_sync_only(m),
            _ => {}
        }
        match Msg::decode(id, m.data()) {
            Ok(Msg::EagerFirst(h, payload)) => self.on_eager_first(h, payload),
            Ok(Msg::EagerMiddle(h, payload)) => self.on_eager_middle(h, payload),
            Ok(Msg::SyncAck(h)) => self.on_sync_ack(h),
            Ok(Msg::Rts(h)) => self.on_rts(h),
            Ok(Msg::Ats(h)) => self.on_ats(h),
            Ok(Msg::Rtr(h)) => self.on_rtr(h),
            Ok(Msg::RndvData(h, payload)) => self.on_rndv_data(h, payload),
            Ok(Msg::Atp(h)) => self.on_atp(h),
            Ok(Msg::Wireup(w)) => self.on_wireup(&w),
            Ok(Msg::Eager(..) | Msg::EagerSync(..)) => unreachable!("handled above"),
            Err(e) => tracing::warn!("ucp: {e}; message dropped"),
        }
    }

    /// A send request named by a peer, if it is a live send; `what` is for the log.
    pub fn sreq_from_wire(&self, raw: u64, what: &str) -> Option<Id> {
        self.req_from_wire(raw, what, "send", |k| matches!(k, ReqKind::Send(_)))
    }

    /// A receive request named by a peer, if it is a live receive.
    pub fn rreq_from_wire(&self, raw: u64, what: &str) -> Option<Id> {
        self.req_from_wire(raw, what, "receive", |k| matches!(k, ReqKind::Recv(_)))
    }

    fn req_from_wire(&self, raw: u64, what: &str, kind: &str, is: fn(&ReqKind) -> bool) -> Option<Id> {
        let id = Id::from_raw(raw);
        if self.reqs.borrow().get(id).is_some_and(|r| is(&r.kind)) {
            return Some(id);
        }
        tracing::warn!("{what}: no {kind} request {raw:#x}; dropped");
        None
    }

    fn on_sync_ack(&self, h: wire::SyncAck) {
        let Some(id) = self.sreq_from_wire(h.sreq, "sync ack") else { return };
        let done = {
            let mut reqs = self.reqs.borrow_mut();
            match reqs.get_mut(id) {
                Some(ReqState { kind: ReqKind::Send(s), .. }) if s.sync => {
                    let sent = matches!(s.phase, crate::request::SendPhase::WaitAck);
                    s.sync = false; // acknowledged
                    sent
                }
                _ => false,
            }
        };
        if done {
            self.finish(id, Status::Ok);
        }
    }

    // ---- endpoint errors ---------------------------------------------------------------------

    /// A transport reported a failed endpoint: the UCP endpoint fails, and its requests with it.
    pub fn on_ep_error(&self, id: Id, status: Status) {
        let Some(ep) = self.ep(id) else { return };
        if matches!(ep.status.get(), EpStatus::Failed(_) | EpStatus::Closed) {
            return;
        }
        tracing::warn!("ucp endpoint to {} failed: {status}", ep.remote.name);
        ep.status.set(EpStatus::Failed(status));
        self.fail_ep_requests(&ep, status);
    }

    /// Completes every request of endpoint `ep` with `status`: its sends, and the receives
    /// that wait for more data from its peer (rendezvous after the match, unless a get is in
    /// flight - the transport completes that one -, and partly arrived multi-fragment
    /// messages). Partly arrived unexpected messages from the peer are dropped.
    pub fn fail_ep_requests(&self, ep: &Ep, status: Status) {
        self.unpark_dropped(ep);
        let queued: VecDeque<Pending> = std::mem::take(&mut *ep.pending.borrow_mut());
        drop(queued);
        let id = ep.id.get();
        let mut mine: Vec<Id> =
            self.reqs
                .borrow()
                .iter()
                .filter(|(_, r)| {
                    r.status == Status::InProgress
                        && match &r.kind {
                            ReqKind::Send(s) => s.ep == id,
                            ReqKind::Recv(rr) => rr.zc.as_ref().is_some_and(|z| {
                                z.rkey.is_none() && z.rts.as_ref().is_some_and(|rts| rts.ep == id.raw())
                            }),
                            _ => false,
                        }
                })
                .map(|(rid, _)| rid)
                .collect();
        let partial: Vec<((u64, u64), FragTarget)> =
            self.frags.borrow().iter().filter(|(k, _)| k.0 == id.raw()).map(|(k, t)| (*k, *t)).collect();
        for (key, target) in partial {
            self.frags.borrow_mut().remove(&key);
            match target {
                FragTarget::Req(rid) => mine.push(rid),
                FragTarget::Unexp(h) => {
                    tracing::warn!("ucp: dropping a partly arrived message from {} ({status})", ep.remote.name);
                    drop(self.unexp.borrow_mut().take(h));
                }
                FragTarget::Probed(pid) => {
                    tracing::warn!("ucp: dropping a partly arrived probed message from {} ({status})", ep.remote.name);
                    drop(self.probed.borrow_mut().remove(pid));
                }
            }
        }
        for rid in mine {
            self.finish(rid, status);
        }
    }

    /// Checks, every `UCX_KEEPALIVE_INTERVAL`, that the peers of up to
    /// `UCX_KEEPALIVE_NUM_EPS` connected endpoints (round robin) are alive; a dead one fails
    /// its endpoint. Called from the infrequent branch of progress.
    #[cold]
    fn keepalive(&self) {
        if self.keepalive_ns == 0 {
            return;
        }
        let now = ucs::time::now();
        if now < self.keepalive_due.get() {
            return;
        }
        self.keepalive_due.set(now.saturating_add(self.keepalive_ns));
        let ids: Vec<Id> = self
            .eps
            .borrow()
            .iter()
            .filter(|(_, e)| e.as_ref().is_some_and(|e| e.status.get() == EpStatus::Connected))
            .map(|(id, _)| id)
            .collect();
        if ids.is_empty() {
            return;
        }
        let start = self.keepalive_cursor.get() % ids.len();
        let count = self.keepalive_eps.min(ids.len());
        self.keepalive_cursor.set(start + count);
        for &id in ids.iter().cycle().skip(start).take(count) {
            let Some(ep) = self.ep(id) else { continue };
            let failed = ep.uct_eps.iter().find_map(|l| l.ep.check(None).err());
            if let Some(status) = failed {
                self.on_ep_error(id, status);
            }
        }
    }

    /// Makes the next progress call run a keepalive round (the wakeup timer fired).
    pub fn keepalive_now(&self) {
        self.keepalive_due.set(0);
        self.idle_polls.set(IDLE_POLL_EVERY - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ContextParams, Features};

    fn core() -> Rc<Core> {
        uct_shm::register();
        let ctx = Context::new(&ContextParams::new(Features::TAG).with_config("TLS", "self")).unwrap();
        Core::new(&ctx, "zc").unwrap()
    }

    #[test]
    fn a_completion_is_reused_only_once_nobody_holds_it() {
        let core = core();
        let a = core.zc_completion(1, ZcDone::Idle);
        // Fired while a transport (here: `a`) still holds it: back on the free list, but not
        // handed out again while held.
        a.complete(Status::Ok);
        let b = core.zc_completion(2, ZcDone::Idle);
        assert!(!Rc::ptr_eq(&a, &b));
        assert_eq!(b.count(), 2);
        // Fired and let go of: the next operation gets it, re-armed.
        b.complete(Status::Ok);
        b.complete(Status::IoError);
        let b_ptr = Rc::as_ptr(&b);
        drop(b);
        let c = core.zc_completion(1, ZcDone::Idle);
        assert_eq!(Rc::as_ptr(&c), b_ptr);
        assert_eq!((c.count(), c.status()), (1, Status::Ok));
        // One that never fired (the operation was refused) is simply freed.
        drop(c);
        let d = core.zc_completion(1, ZcDone::Idle);
        assert_eq!(d.count(), 1);
        drop(a);
    }

    fn words(ws: &[u64], payload: &[u8]) -> Vec<u8> {
        let mut m: Vec<u8> = ws.iter().flat_map(|w| w.to_le_bytes()).collect();
        m.extend_from_slice(payload);
        m
    }

    #[test]
    fn unexpected_fragments_reuse_their_buffer() {
        use crate::request::{Buf, RequestParam, Seg};
        use crate::tag::proto::RecvOut;
        let core = core();
        // A first fragment announcing 1 TiB: queued, with a buffer for what arrived only.
        core.on_am(wire::AM_EAGER_FIRST, AmRecv::borrowed(&words(&[5, 1, 100, 1 << 40], &[1; 10])));
        assert_eq!(core.probe(5, u64::MAX, false).map(|(i, _)| i.length), Some(1 << 40));
        // Two-fragment messages, each received after it arrived: the second one reassembles in
        // the buffer the first one gave back.
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 13 % 251) as u8).collect();
        let mut kept = None;
        for (tag, msg_id) in [(6u64, 200u64), (7, 201)] {
            core.on_am(wire::AM_EAGER_FIRST, AmRecv::borrowed(&words(&[tag, 1, msg_id, 3000], &data[..2000])));
            core.on_am(wire::AM_EAGER_MIDDLE, AmRecv::borrowed(&words(&[1, msg_id, 2000], &data[2000..])));
            assert!(core.frag_bufs.borrow().is_empty(), "the buffer is in use");
            let mut out = vec![0u8; 3000];
            let buf = Buf::Contig(Seg { ptr: out.as_mut_ptr(), len: out.len() });
            // SAFETY: `out` outlives the call, which completes at once (the message is here).
            let r = unsafe { core.tag_recv(buf, tag, u64::MAX, RequestParam::new()) }.unwrap();
            assert!(matches!(r, RecvOut::Done(i) if i.length == 3000), "{r:?}");
            assert!(out == data);
            let bufs = core.frag_bufs.borrow();
            assert_eq!(bufs.len(), 1);
            assert_eq!(*kept.get_or_insert(bufs[0].as_ptr()), bufs[0].as_ptr(), "a new buffer");
        }
    }

    /// An RTS as a peer would send it, with a key of `klen` bytes.
    fn rts(tag: u64, klen: usize) -> Vec<u8> {
        let mut m = Vec::new();
        for word in [tag, 1, 2, 65536, 0x1000] {
            m.extend_from_slice(&word.to_le_bytes());
        }
        m.push(wire::RTS_FLAG_CONTIG);
        m.extend_from_slice(&(klen as u16).to_le_bytes());
        m.extend(std::iter::repeat_n(0xab, klen));
        m
    }

    #[test]
    fn malformed_protocol_headers_are_dropped() {
        let core = core();
        // A well-formed RTS waits as an unexpected message; one whose key is longer than any
        // transport packs, or that is cut short, is dropped.
        core.on_am(wire::AM_RNDV_RTS, AmRecv::borrowed(&rts(7, 24)));
        assert_eq!(core.probe(7, u64::MAX, false).map(|(i, _)| i.length), Some(65536));
        core.on_am(wire::AM_RNDV_RTS, AmRecv::borrowed(&rts(8, uct::PackedKey::MAX + 1)));
        assert!(core.probe(8, u64::MAX, false).is_none());
        let short = rts(9, 24);
        core.on_am(wire::AM_RNDV_RTS, AmRecv::borrowed(&short[..short.len() - 1]));
        assert!(core.probe(9, u64::MAX, false).is_none());
        // Truncated or garbage headers of every protocol message: dropped or taken as data,
        // never a panic.
        let noise: Vec<u8> = (0..96u32).map(|i| (i.wrapping_mul(151) >> 2) as u8).collect();
        for id in wire::AM_WIREUP..=wire::AM_RNDV_ATP {
            for len in 0..noise.len() {
                core.on_am(id, AmRecv::borrowed(&noise[..len]));
            }
        }
    }
}
