//! The UCP worker (`ucp_worker_h`) and its thread modes, the tag receive API, and endpoints.
//!
//! A [`Worker`] is a cheap handle (`Clone + Send + Sync`) on a single-threaded core that owns
//! the interfaces, endpoints and requests. The thread mode decides how the core is entered:
//!
//! * [`ThreadMode::Single`]: only the creating thread may use the worker; calls from any other
//!   thread fail with `InvalidParam` (nothing is locked, nothing races);
//! * [`ThreadMode::Serialized`] and [`ThreadMode::Multi`]: every call takes the worker's
//!   re-entrant lock, so the worker may be used from several threads, concurrently in `Multi`
//!   (callbacks run under the lock and may call the worker again).
//!
//! Nothing of the core (it is built on `Rc`) ever leaves it: the public types carry ids.

use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

pub use ucs::ThreadMode;

use crate::context::{Context, Features};
use crate::core::wakeup::Wakeup;
use crate::core::Core;
use crate::dt::UserBuf;
use crate::mem::MemHandle;
use crate::request::{RecvInfo, RequestParam};
use crate::tag::recv::RecvOut;
use crate::tag::Tag;
use crate::wireup::address::WorkerAddress;

mod am;
mod data;
mod endpoint;
mod future;
mod listener;
mod request;
mod rma;
mod stream;

pub use am::{AmData, AmHandlerFlags, AmMsg, AmRndv, AmSendFlags};
use data::detach;
pub use data::{RecvData, RecvResult, SendData};
pub use endpoint::{CloseMode, Endpoint, EpInfo, LaneInfo};
pub use future::{block_on, EventSource, ProgressDriver, RecvFuture, SendFuture};
pub use listener::{ConnRequest, ConnectFuture, Listener, CONNECT_TIMEOUT};
pub use request::Request;
pub use rma::{AmoFuture, AmoReply, AtomicOp, MemAttr, Operand, RemoteKey};
pub use stream::{StreamData, StreamRecvFlags};

/// Parameters of [`Worker::new`] (`ucp_worker_params_t`).
#[derive(Clone, Debug, Default)]
pub struct WorkerParams {
    /// A name for diagnostics (put in the address).
    pub name: String,
    /// Thread mode.
    pub thread_mode: ThreadMode,
}

impl WorkerParams {
    /// A worker called `name`, single-threaded.
    pub fn new(name: &str) -> Self {
        WorkerParams { name: name.into(), thread_mode: ThreadMode::Single }
    }

    /// Sets the thread mode.
    pub fn thread_mode(mut self, mode: ThreadMode) -> Self {
        self.thread_mode = mode;
        self
    }
}

pub(crate) struct Shared {
    mode: ThreadMode,
    owner: usize,
    lock: parking_lot::ReentrantMutex<()>,
    core: Rc<Core>,
    /// Immutable copies readable without entering.
    address: Vec<u8>,
    record: WorkerAddress,
    ctx: Context,
    /// Present when the context has the WAKEUP feature.
    wakeup: Option<Wakeup>,
    /// Live [`ProgressDriver`]s: while any exists, futures leave progress to them.
    pub(crate) drivers: AtomicUsize,
}

// SAFETY: the `Rc` graph inside `core` is only touched by a thread that entered the worker:
// in Single mode only the creating thread (checked on every entry), otherwise under the
// re-entrant lock, so no two threads touch it at once. The last handle's drop destroys it with
// no other handle left. The other fields are immutable after creation, or atomic, or (the
// wakeup descriptors) used only through system calls that are safe from any thread.
unsafe impl Send for Shared {}
// SAFETY: as above; shared references only read immutable fields or enter first.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        // Endpoints hold transport endpoints, requests callbacks, buffers and registrations:
        // they go before the interfaces (the core's fields drop after this), and outside the
        // engine (a callback's or buffer's drop may run user code).
        self.core.with_engine(|e| e.destroy_all());
        let (reqs, tag) = {
            let mut e = self.core.engine.borrow_mut();
            (std::mem::take(&mut e.sh.reqs), std::mem::take(&mut e.tag))
        };
        drop((reqs, tag));
    }
}

/// A per-thread address, cheap to read: tells threads apart.
#[inline]
fn thread_mark() -> usize {
    thread_local!(static MARK: u8 = const { 0 });
    MARK.with(|m| m as *const u8 as usize)
}

/// Entered state: the lock guard when there is one.
pub(crate) struct Entered<'a> {
    _guard: Option<parking_lot::ReentrantMutexGuard<'a, ()>>,
    pub(crate) core: &'a Core,
}

/// A UCP worker. Clones are handles on the same worker.
#[derive(Clone)]
pub struct Worker {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.shared.record.name)
            .field("uuid", &format_args!("{:#x}", self.shared.record.uuid))
            .field("thread_mode", &self.shared.mode)
            .finish()
    }
}

impl Worker {
    /// Opens an interface on every resource of `ctx` (resources that fail to open are skipped
    /// with a warning; none at all is `NoDevice`) and builds the worker's address.
    pub fn new(ctx: &Context, params: &WorkerParams) -> UcsResult<Worker> {
        let core = Core::new(ctx, &params.name)?;
        let address = core.packed.clone();
        let record = core.address.clone();
        let wakeup = if ctx.features().contains(Features::WAKEUP) { Some(Wakeup::new(&core)?) } else { None };
        Ok(Worker {
            shared: Arc::new(Shared {
                mode: params.thread_mode,
                owner: thread_mark(),
                lock: parking_lot::ReentrantMutex::new(()),
                core,
                address,
                record,
                ctx: ctx.clone(),
                wakeup,
                drivers: AtomicUsize::new(0),
            }),
        })
    }

    /// Enters the worker: the owner thread of a single-threaded worker at once, the others
    /// through [`Self::enter_slow`].
    #[inline(always)]
    pub(crate) fn enter(&self) -> UcsResult<Entered<'_>> {
        let s = &*self.shared;
        if s.mode == ThreadMode::Single && thread_mark() == s.owner {
            return Ok(Entered { _guard: None, core: &s.core });
        }
        self.enter_slow()
    }

    /// The lock of a serialized or multi-threaded worker, or the error of a single-threaded
    /// worker entered from another thread.
    #[cold]
    #[inline(never)]
    fn enter_slow(&self) -> UcsResult<Entered<'_>> {
        let s = &*self.shared;
        match s.mode {
            ThreadMode::Single => {
                if thread_mark() != s.owner {
                    tracing::error!(
                        "ucp worker '{}' is single-threaded and was called from another thread; \
                         create it with ThreadMode::Serialized or Multi",
                        s.record.name
                    );
                    return Err(Status::InvalidParam);
                }
                Ok(Entered { _guard: None, core: &s.core })
            }
            ThreadMode::Serialized | ThreadMode::Multi => Ok(Entered { _guard: Some(s.lock.lock()), core: &s.core }),
        }
    }

    /// The thread mode.
    pub fn thread_mode(&self) -> ThreadMode {
        self.shared.mode
    }

    /// Progresses every interface and the protocols once; returns the number of events.
    #[inline]
    pub fn progress(&self) -> usize {
        match self.enter() {
            Ok(e) => e.core.progress(),
            Err(_) => 0,
        }
    }

    fn wakeup(&self) -> UcsResult<&Wakeup> {
        self.shared.wakeup.as_ref().ok_or_else(|| {
            tracing::error!(
                "ucp worker '{}': wakeup needs the WAKEUP feature in the context parameters",
                self.shared.record.name
            );
            Status::InvalidParam
        })
    }

    /// The worker's event descriptor (`ucp_worker_get_efd`): it becomes readable when the
    /// worker, once [armed](Self::arm), has events to progress or was [signalled](Self::signal).
    /// It is an epoll descriptor, so it can be added to the caller's own poll set or async
    /// reactor. Needs [`Features::WAKEUP`]; `InvalidParam` otherwise.
    pub fn event_fd(&self) -> UcsResult<RawFd> {
        Ok(self.wakeup()?.fd())
    }

    /// The event descriptor kept open by a handle on the worker: for reactors that take
    /// ownership of something with a descriptor, such as tokio's `AsyncFd`. The descriptor
    /// stays open, and the same, for as long as the returned value lives.
    pub fn event_source(&self) -> UcsResult<EventSource> {
        let fd = self.event_fd()?;
        Ok(EventSource { worker: self.clone(), fd })
    }

    /// Arms the event descriptor for the next event (`ucp_worker_arm`). `Err(Busy)` means
    /// events are already pending, or the worker was signalled: progress, then arm again.
    /// `Ok` means sleeping on [`event_fd`](Self::event_fd) is safe: any later event wakes it.
    pub fn arm(&self) -> UcsResult<()> {
        let w = self.wakeup()?;
        let e = self.enter()?;
        if w.take_timer()? {
            // A keepalive round is due: the next progress runs it.
            e.core.keepalive_now();
            return Err(Status::Busy);
        }
        if w.take_signals()? {
            return Err(Status::Busy);
        }
        e.core.arm()
    }

    /// Arms and, unless events are pending, sleeps until one arrives or another thread
    /// calls [`signal`](Self::signal) (`ucp_worker_wait`). Call [`progress`](Self::progress)
    /// afterwards. The worker is not locked while sleeping.
    pub fn wait(&self) -> UcsResult<()> {
        self.wait_timeout(None).map(|_| ())
    }

    /// [`wait`](Self::wait) for at most `timeout`; `Ok(false)` when it ran out with nothing
    /// to do.
    pub fn wait_timeout(&self, timeout: Option<std::time::Duration>) -> UcsResult<bool> {
        let w = self.wakeup()?;
        match self.arm() {
            Err(Status::Busy) => return Ok(true),
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        let (woke, fired) = w.sleep(timeout)?;
        if fired != 0 {
            // Interfaces that woke us get polled on every progress call from now on.
            if let Ok(e) = self.enter() {
                (0..64).filter(|i| fired & (1 << i) != 0).for_each(|i| e.core.activate(i));
            }
        }
        Ok(woke)
    }

    /// Wakes a thread sleeping in [`wait`](Self::wait) or on [`event_fd`](Self::event_fd)
    /// (`ucp_worker_signal`). Safe from any thread, whatever the thread mode; the next
    /// [`arm`](Self::arm) returns `Busy` once.
    pub fn signal(&self) -> UcsResult<()> {
        self.wakeup()?.signal()
    }

    /// Declares that something else progresses this worker - a task that sleeps on
    /// [`event_fd`](Self::event_fd), or a thread looping on [`wait`](Self::wait) - for as long
    /// as the returned guard lives. Meanwhile the futures of this worker (from
    /// [`tag_recv`](Self::tag_recv), [`Endpoint::tag_send`], ...) no longer progress the worker
    /// and re-poll themselves; they sleep until the completion wakes their task.
    pub fn progress_driver(&self) -> ProgressDriver {
        self.shared.drivers.fetch_add(1, Ordering::AcqRel);
        ProgressDriver { worker: self.clone() }
    }

    pub(crate) fn driven(&self) -> bool {
        self.shared.drivers.load(Ordering::Acquire) > 0
    }

    /// The packed address to give peers.
    pub fn address(&self) -> &[u8] {
        &self.shared.address
    }

    /// The worker's own address, unpacked.
    pub fn address_record(&self) -> &WorkerAddress {
        &self.shared.record
    }

    /// Unique id of this worker.
    pub fn uuid(&self) -> u64 {
        self.shared.record.uuid
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.shared.ctx
    }

    /// Creates an endpoint to the worker whose packed address is `address` (`ucp_ep_create`).
    /// Sends may start at once; they are queued until wireup completes.
    pub fn ep_create(&self, address: &[u8]) -> UcsResult<Endpoint> {
        let e = self.enter()?;
        let id = e.core.ep_create(address)?;
        Ok(Endpoint { worker: self.clone(), id })
    }

    /// Posts a tagged receive (`ucp_tag_recv_nbx`): a message matches when
    /// `(sender_tag ^ tag) & mask == 0`.
    ///
    /// # Safety
    /// The receive buffer (every iov entry) must stay valid and must not be accessed until the
    /// request completes (a cancelled receive completes with `Canceled`). An iov list itself
    /// must stay valid and unchanged until then too, as UCX requires of `ucp_dt_iov_t` lists:
    /// it is read in place, not copied.
    #[inline]
    pub unsafe fn tag_recv_nbx(
        &self,
        data: RecvData<'_>,
        tag: Tag,
        mask: Tag,
        param: RequestParam,
    ) -> UcsResult<RecvResult<'_>> {
        // SAFETY: forwarded from the caller.
        let out = unsafe { self.recv_raw(data, tag, mask, param)? };
        Ok(self.recv_result(out))
    }

    /// A tagged receive entered into the core; the core's outcome.
    ///
    /// # Safety
    /// As [`tag_recv_nbx`](Self::tag_recv_nbx).
    #[inline(always)]
    unsafe fn recv_raw(&self, data: RecvData<'_>, tag: Tag, mask: Tag, param: RequestParam) -> UcsResult<RecvOut> {
        let e = self.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else { return data::invalid_data() };
        let r = e.core.tag_recv(buf, tag, mask, param);
        data::end_call(buf, r, |o| matches!(o, RecvOut::Done(_)))
    }

    /// [`tag_recv_nbx`](Self::tag_recv_nbx) without a request handle, for a caller that learns
    /// of the completion from the parameters' callback alone (in C, a request freed right
    /// away or in its callback with `ucp_request_free`): no handle to look up and release
    /// afterwards. `Ok(Some(info))`: completed at once, and no callback runs; `Ok(None)`: the
    /// callback reports the completion, which may already have happened inside this call (a
    /// rendezvous that completed at once, say). Such a receive cannot be cancelled on its own; one
    /// still waiting when the worker goes is dropped without its callback. `NO_IMM_CMPL`
    /// asks for a handle, so it is refused (`InvalidParam`).
    ///
    /// # Safety
    /// As [`tag_recv_nbx`](Self::tag_recv_nbx).
    #[inline]
    pub unsafe fn tag_recv_nbx_detached(
        &self,
        data: RecvData<'_>,
        tag: Tag,
        mask: Tag,
        param: RequestParam,
    ) -> UcsResult<Option<RecvInfo>> {
        let param = detach(param, "tag_recv_nbx_detached")?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { self.recv_raw(data, tag, mask, param)? };
        Ok(match out {
            RecvOut::Done(i) => Some(i),
            RecvOut::Req(_) => None,
        })
    }

    #[inline]
    pub(crate) fn recv_result(&self, out: RecvOut) -> RecvResult<'_> {
        match out {
            RecvOut::Done(i) => RecvResult::Done(i),
            RecvOut::Req(id) => RecvResult::Pending(Request { worker: self, id }),
        }
    }

    /// Receives into an owned buffer; resolves to the buffer and what arrived. Dropping the
    /// future before it resolves cancels the receive; a receive whose data is already on its
    /// way keeps the buffer inside the worker until the transport is done with it.
    pub fn tag_recv<B>(&self, buf: B, tag: Tag, mask: Tag) -> RecvFuture<B>
    where
        B: AsMut<[u8]> + Send + 'static,
    {
        let mut boxed = Box::new(buf);
        let s = boxed.as_mut().as_mut();
        // SAFETY: the buffer is boxed and handed to the worker below before any data can arrive
        // into it from progress; the worker frees or returns it only once the request completed.
        let ub = unsafe { UserBuf::contig(s.as_mut_ptr(), s.len()) };
        let r = self.enter().and_then(|e| e.core.tag_recv(ub, tag, mask, RequestParam::new()));
        let (r, info) = match r {
            Ok(RecvOut::Done(info)) => (Ok(None), info),
            Ok(RecvOut::Req(id)) => (Ok(Some(id)), RecvInfo::default()),
            Err(e) => (Err(e), RecvInfo::default()),
        };
        RecvFuture::owned(self, boxed, r, info)
    }

    /// Hands an owned buffer to request `id`.
    pub(crate) fn give<B: Send + 'static>(&self, id: Id, b: Box<B>) {
        if let Ok(e) = self.enter() {
            if let Some(r) = e.core.engine.borrow_mut().sh.reqs.tab.get_mut(id) {
                r.ext_mut().owned = Some(b);
                return;
            }
        }
        // The request vanished (cannot happen while we hold its id): keep the buffer alive
        // forever rather than risk a late write into freed memory.
        std::mem::forget(b);
    }

    /// Takes the owned buffer back from a completed request and frees the request.
    pub(crate) fn take_back<B: 'static>(&self, id: Id) -> (Option<B>, Status, RecvInfo) {
        let Ok(e) = self.enter() else { return (None, Status::InvalidParam, RecvInfo::default()) };
        let (status, info) = e.core.req_status(id);
        let owned = e
            .core
            .engine
            .borrow_mut()
            .sh
            .reqs
            .tab
            .get_mut(id)
            .and_then(|r| r.ext.as_mut().and_then(|x| x.owned.take()));
        e.core.req_release(id);
        let b = owned.and_then(|o| o.downcast::<B>().ok()).map(|b| *b);
        (b, status, info)
    }

    /// Looks for an unexpected message matching `(tag, mask)` (`ucp_tag_probe_nb`). With
    /// `remove`, the message is taken out for [`Worker::tag_msg_recv_nbx`].
    ///
    /// Like UCX's probe it only looks: messages reach the unexpected queue through
    /// [`Worker::progress`], so a loop waiting for a message progresses between probes. (A
    /// probe that progressed itself would let a sender flood the queue: every probe would
    /// drain the transport into it, however few messages the caller takes out.)
    pub fn tag_probe(&self, tag: Tag, mask: Tag, remove: bool) -> Option<(RecvInfo, Option<Message>)> {
        let e = self.enter().ok()?;
        let (info, id) = e.core.probe(tag, mask, remove)?;
        Some((info, id.map(|id| Message { id })))
    }

    /// Receives a message taken out by [`Worker::tag_probe`] (`ucp_tag_msg_recv_nbx`).
    ///
    /// # Safety
    /// As [`Worker::tag_recv_nbx`].
    pub unsafe fn tag_msg_recv_nbx(
        &self,
        data: RecvData<'_>,
        msg: Message,
        param: RequestParam,
    ) -> UcsResult<RecvResult<'_>> {
        let e = self.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else { return data::invalid_data() };
        let r = e.core.msg_recv(buf, msg.id, param);
        let out = data::end_call(buf, r, |o| matches!(o, RecvOut::Done(_)))?;
        Ok(self.recv_result(out))
    }

    /// Registers memory for zero-copy protocols (`ucp_mem_map`).
    ///
    /// # Safety
    /// The region must stay mapped until [`Worker::mem_unmap`].
    pub unsafe fn mem_map(&self, addr: *mut u8, len: usize) -> UcsResult<MemHandle> {
        let e = self.enter()?;
        // SAFETY: forwarded from the caller.
        unsafe { e.core.mem_map(addr, len) }
    }

    /// Releases a registration (`ucp_mem_unmap`).
    pub fn mem_unmap(&self, h: MemHandle) -> UcsResult<()> {
        self.enter()?.core.mem_unmap(h)
    }

    #[inline]
    pub(crate) fn request_status(&self, id: Id) -> (Status, RecvInfo) {
        match self.enter() {
            Ok(e) => e.core.req_status(id),
            Err(s) => (s, RecvInfo::default()),
        }
    }

    pub(crate) fn request_cancel(&self, id: Id) {
        if let Ok(e) = self.enter() {
            e.core.req_cancel(id);
        }
    }

    #[inline]
    pub(crate) fn request_release(&self, id: Id) {
        if let Ok(e) = self.enter() {
            e.core.req_release(id);
        }
    }

    /// Registers `w` to be woken when request `id` completes, if it is still in progress;
    /// returns the status seen under the same entry (so a completion on another thread between
    /// a status check and the registration is not missed).
    pub(crate) fn register_waker(&self, id: Id, w: &std::task::Waker) -> Status {
        let Ok(e) = self.enter() else { return Status::InvalidParam };
        let mut eng = e.core.engine.borrow_mut();
        let Some(r) = eng.sh.reqs.tab.get_mut(id) else { return Status::NoElem };
        if r.status != Status::InProgress {
            return r.status;
        }
        let x = r.ext_mut();
        match &x.waker {
            Some(old) if old.will_wake(w) => {}
            _ => x.waker = Some(w.clone()),
        }
        Status::InProgress
    }

    /// Counts of the worker's tables, for tests and diagnostics: (endpoints, requests,
    /// unexpected messages, posted receives).
    pub fn stats(&self) -> (usize, usize, usize, usize) {
        match self.enter() {
            Ok(e) => {
                let eng = e.core.engine.borrow();
                (eng.sh.eps.len(), eng.sh.reqs.tab.len(), eng.tag.unexp.len(), eng.sh.reqs.exp.len())
            }
            Err(_) => (0, 0, 0, 0),
        }
    }

    /// How many messages each protocol carried so far.
    pub fn proto_counts(&self) -> crate::engine::ProtoCounts {
        self.enter().map(|e| e.core.engine.borrow().sh.counts).unwrap_or_default()
    }

    /// Names of the interfaces, in address order (`transport/device`).
    pub fn iface_names(&self) -> Vec<String> {
        self.shared.record.ifaces.iter().map(|r| format!("{}/{}", r.tl_name, r.dev_name)).collect()
    }
}

/// A message taken out of the unexpected queue by [`Worker::tag_probe`].
#[derive(Debug)]
pub struct Message {
    id: Id,
}
