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

use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

pub use ucs::ThreadMode;

use crate::address::WorkerAddress;
use crate::context::{Context, Features};
use crate::core::Core;
use crate::ep::EpInfo;
use crate::mem::MemHandle;
use crate::request::{Buf, IoVec, RecvInfo, ReqKind, Request, RequestFlags, RequestParam, Seg};
use crate::tag::proto::RecvOut;
use crate::tag::Tag;
use crate::wakeup::Wakeup;

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

struct Shared {
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
    drivers: AtomicUsize,
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
        // Requests may hold callbacks and buffers; endpoints hold transport endpoints. Drop
        // them before the interfaces (the core's fields drop after this).
        let eps = std::mem::take(&mut *self.core.eps.borrow_mut());
        drop(eps);
    }
}

/// A per-thread address, cheap to read: tells threads apart.
#[inline]
fn thread_mark() -> usize {
    thread_local!(static MARK: u8 = const { 0 });
    MARK.with(|m| m as *const u8 as usize)
}

/// Entered state: the lock guard when there is one.
struct Entered<'a> {
    _guard: Option<parking_lot::ReentrantMutexGuard<'a, ()>>,
    core: &'a Core,
}

/// A UCP worker. Clones are handles on the same worker.
#[derive(Clone)]
pub struct Worker {
    shared: Arc<Shared>,
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
    fn enter(&self) -> UcsResult<Entered<'_>> {
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

    fn driven(&self) -> bool {
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
        unsafe { e.core.tag_recv(data.into_buf()?, tag, mask, param) }
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
    fn recv_result(&self, out: RecvOut) -> RecvResult<'_> {
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
        let seg = Seg { ptr: s.as_mut_ptr(), len: s.len() };
        let r = self.enter().and_then(|e| {
            // SAFETY: the buffer is boxed and handed to the worker below before any data can
            // arrive into it from progress; the worker frees or returns it only once the
            // request completed.
            unsafe { e.core.tag_recv(Buf::Contig(seg), tag, mask, RequestParam::new()) }
        });
        let state = match r {
            Ok(RecvOut::Done(info)) => FutState::Ready(Some(*boxed), Ok(info)),
            Err(e) => FutState::Ready(Some(*boxed), Err(e)),
            Ok(RecvOut::Req(id)) => {
                self.give(id, boxed);
                FutState::Pending(id)
            }
        };
        RecvFuture { worker: self.clone(), state }
    }

    /// Hands an owned buffer to request `id`.
    fn give<B: Send + 'static>(&self, id: Id, b: Box<B>) {
        if let Ok(e) = self.enter() {
            if let Some(r) = e.core.reqs.borrow_mut().get_mut(id) {
                r.ext_mut().owned = Some(b);
                return;
            }
        }
        // The request vanished (cannot happen while we hold its id): keep the buffer alive
        // forever rather than risk a late write into freed memory.
        std::mem::forget(b);
    }

    /// Takes the owned buffer back from a completed request and frees the request.
    fn take_back<B: 'static>(&self, id: Id) -> (Option<B>, Status, RecvInfo) {
        let Ok(e) = self.enter() else { return (None, Status::InvalidParam, RecvInfo::default()) };
        let (status, info) = e.core.req_status(id);
        let owned = e.core.reqs.borrow_mut().get_mut(id).and_then(|r| r.ext.as_mut().and_then(|x| x.owned.take()));
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
        let out = unsafe { e.core.msg_recv(data.into_buf()?, msg.id, param)? };
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
    fn register_waker(&self, id: Id, w: &std::task::Waker) -> Status {
        let Ok(e) = self.enter() else { return Status::InvalidParam };
        let mut reqs = e.core.reqs.borrow_mut();
        let Some(r) = reqs.get_mut(id) else { return Status::NoElem };
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
                let reqs = e.core.reqs.borrow();
                (e.core.eps.borrow().len(), reqs.len(), e.core.unexp.borrow().len(), reqs.exp.len())
            }
            Err(_) => (0, 0, 0, 0),
        }
    }

    /// How many messages each protocol carried so far.
    pub fn proto_counts(&self) -> crate::ProtoCounts {
        self.enter().map(|e| e.core.counts.get()).unwrap_or_default()
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

/// Receive buffer of the raw API.
#[derive(Debug)]
pub enum RecvData<'a> {
    /// One buffer.
    Contig(&'a mut [u8]),
    /// Scattered buffers (`ucp_dt_iov_t`).
    Iov(&'a [IoVec]),
}

impl RecvData<'_> {
    #[inline]
    fn into_buf(self) -> UcsResult<Buf> {
        Ok(match self {
            RecvData::Contig(s) => Buf::Contig(Seg { ptr: s.as_mut_ptr(), len: s.len() }),
            // SAFETY: the caller of the raw API keeps the list valid until completion.
            RecvData::Iov(v) => unsafe { iov_buf(v)? },
        })
    }
}

/// Send buffer of the raw API.
#[derive(Debug)]
pub enum SendData<'a> {
    /// One buffer.
    Contig(&'a [u8]),
    /// Gathered buffers (`ucp_dt_iov_t`).
    Iov(&'a [IoVec]),
}

impl SendData<'_> {
    #[inline]
    fn into_buf(self) -> UcsResult<Buf> {
        Ok(match self {
            SendData::Contig(s) => Buf::Contig(Seg { ptr: s.as_ptr() as *mut u8, len: s.len() }),
            // SAFETY: the caller of the raw API keeps the list valid until completion.
            SendData::Iov(v) => unsafe { iov_buf(v)? },
        })
    }
}

/// Checks an iov list and views it as a buffer.
///
/// # Safety
/// As [`Buf::iov`]: `v` stays valid and unchanged while the buffer is used.
#[inline(never)]
unsafe fn iov_buf(v: &[IoVec]) -> UcsResult<Buf> {
    let mut total = 0usize;
    for x in v {
        if x.buffer.is_null() && x.length != 0 {
            tracing::error!("iov entry with a null buffer and length {}", x.length);
            return Err(Status::InvalidParam);
        }
        total = total.checked_add(x.length).ok_or_else(|| {
            tracing::error!("iov lengths overflow");
            Status::InvalidParam
        })?;
    }
    Ok(match v {
        // One piece is a contiguous buffer.
        [x] => Buf::Contig(Seg { ptr: x.buffer, len: x.length }),
        // SAFETY: forwarded from the caller.
        _ => unsafe { Buf::iov(v) },
    })
}

/// The parameters of a detached operation (no request handle), or the error of asking for
/// a handle with `NO_IMM_CMPL`.
#[inline]
fn detach(mut param: RequestParam, op: &str) -> UcsResult<RequestParam> {
    if param.flags.contains(RequestFlags::NO_IMM_CMPL) {
        return no_handle_for(op);
    }
    param.detached = true;
    Ok(param)
}

#[cold]
#[inline(never)]
fn no_handle_for<T>(op: &str) -> UcsResult<T> {
    tracing::error!("{op}: NO_IMM_CMPL asks for a request handle, which a detached operation does not give");
    Err(Status::InvalidParam)
}

/// Outcome of a receive: completed at once, or a request.
#[derive(Debug)]
pub enum RecvResult<'w> {
    /// Completed at once (no callback).
    Done(RecvInfo),
    /// In progress.
    Pending(Request<'w>),
}

impl RecvResult<'_> {
    /// Waits for completion (progressing the worker).
    pub fn wait(self) -> Result<RecvInfo, Status> {
        match self {
            RecvResult::Done(i) => Ok(i),
            RecvResult::Pending(r) => r.wait(),
        }
    }
}

/// How [`Endpoint::close`] ends an endpoint (`UCP_EP_CLOSE_MODE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseMode {
    /// Outstanding operations finish and the transports flush first.
    Flush,
    /// Outstanding operations complete with `Canceled` now.
    Force,
}

/// An endpoint (`ucp_ep_h`). Clones name the same endpoint; it lives until
/// [`Endpoint::close`] or until the worker goes.
#[derive(Clone)]
pub struct Endpoint {
    worker: Worker,
    id: Id,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("id", &self.id).finish()
    }
}

impl Endpoint {
    /// The worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Sends a tagged message (`ucp_tag_send_nbx`). `Ok(None)`: completed at once.
    ///
    /// # Safety
    /// The send buffer (every iov entry) must stay valid and unmodified until the request
    /// completes, and so must an iov list itself (read in place, as in UCX).
    #[inline]
    pub unsafe fn tag_send_nbx(
        &self,
        data: SendData<'_>,
        tag: Tag,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.send_nbx(data, tag, false, param) }
    }

    /// Synchronous send (`ucp_tag_send_sync_nbx`): completes once the receiver matched it.
    ///
    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline]
    pub unsafe fn tag_send_sync_nbx(
        &self,
        data: SendData<'_>,
        tag: Tag,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.send_nbx(data, tag, true, param) }
    }

    /// [`tag_send_nbx`](Self::tag_send_nbx) without a request handle, for a caller that learns
    /// of the completion from the parameters' callback alone (see
    /// [`Worker::tag_recv_nbx_detached`]). `Ok(true)`: completed at once, and no callback runs;
    /// `Ok(false)`: the callback reports the completion, possibly already inside this call (a
    /// message sent whole from the request path, or a synchronous send over `self`).
    /// `NO_IMM_CMPL` is refused (`InvalidParam`).
    ///
    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline]
    pub unsafe fn tag_send_nbx_detached(&self, data: SendData<'_>, tag: Tag, param: RequestParam) -> UcsResult<bool> {
        let param = detach(param, "tag_send_nbx_detached")?;
        // SAFETY: forwarded from the caller.
        Ok(unsafe { self.send_raw(data, tag, false, param)? }.is_none())
    }

    /// [`tag_send_sync_nbx`](Self::tag_send_sync_nbx) without a request handle, as
    /// [`tag_send_nbx_detached`](Self::tag_send_nbx_detached).
    ///
    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline]
    pub unsafe fn tag_send_sync_nbx_detached(
        &self,
        data: SendData<'_>,
        tag: Tag,
        param: RequestParam,
    ) -> UcsResult<bool> {
        let param = detach(param, "tag_send_sync_nbx_detached")?;
        // SAFETY: forwarded from the caller.
        Ok(unsafe { self.send_raw(data, tag, true, param)? }.is_none())
    }

    /// A tagged send entered into the core; the id of its request, if it did not complete at
    /// once.
    ///
    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline(always)]
    unsafe fn send_raw(&self, data: SendData<'_>, tag: Tag, sync: bool, param: RequestParam) -> UcsResult<Option<Id>> {
        let e = self.worker.enter()?;
        // SAFETY: forwarded from the caller.
        unsafe { e.core.tag_send(self.id, data.into_buf()?, tag, sync, param) }
    }

    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline]
    unsafe fn send_nbx(
        &self,
        data: SendData<'_>,
        tag: Tag,
        sync: bool,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.send_raw(data, tag, sync, param)? };
        Ok(r.map(|id| Request { worker: &self.worker, id }))
    }

    /// Sends `data` and progresses the worker until the send completed.
    pub fn tag_send_blocking(&self, data: &[u8], tag: Tag) -> UcsResult<()> {
        // SAFETY: `data` stays borrowed until the request completed (the wait below).
        match unsafe { self.tag_send_nbx(SendData::Contig(data), tag, RequestParam::new())? } {
            None => Ok(()),
            Some(r) => r.wait().map(|_| ()),
        }
    }

    /// Sends an owned buffer; resolves to the buffer and the outcome.
    pub fn tag_send<B: AsRef<[u8]> + Send + 'static>(&self, buf: B, tag: Tag) -> SendFuture<B> {
        self.send_owned(buf, tag, false)
    }

    /// Synchronous send of an owned buffer: resolves once the receiver matched it.
    pub fn tag_send_sync<B: AsRef<[u8]> + Send + 'static>(&self, buf: B, tag: Tag) -> SendFuture<B> {
        self.send_owned(buf, tag, true)
    }

    fn send_owned<B: AsRef<[u8]> + Send + 'static>(&self, buf: B, tag: Tag, sync: bool) -> SendFuture<B> {
        let boxed = Box::new(buf);
        let s = boxed.as_ref().as_ref();
        let seg = Seg { ptr: s.as_ptr() as *mut u8, len: s.len() };
        let r = self.worker.enter().and_then(|e| {
            // SAFETY: the buffer is boxed and handed to the worker below; it is returned or
            // freed only after the request completed.
            unsafe { e.core.tag_send(self.id, Buf::Contig(seg), tag, sync, RequestParam::new()) }
        });
        let state = match r {
            Ok(None) => FutState::Ready(Some(*boxed), Ok(RecvInfo { length: seg.len, sender_tag: tag })),
            Err(e) => FutState::Ready(Some(*boxed), Err(e)),
            Ok(Some(id)) => {
                self.worker.give(id, boxed);
                FutState::Pending(id)
            }
        };
        SendFuture { inner: RecvFuture { worker: self.worker.clone(), state } }
    }

    /// Names the transport of each lane (`ucp_ep_query`).
    pub fn query(&self) -> UcsResult<EpInfo> {
        self.worker.enter()?.core.ep_query(self.id)
    }

    /// Starts closing (`ucp_ep_close_nbx`); the request completes when the endpoint is gone.
    pub fn close_nbx(&self, mode: CloseMode) -> UcsResult<Request<'_>> {
        let e = self.worker.enter()?;
        let force = mode == CloseMode::Force;
        let rid = e.core.req_new(ReqKind::Close(crate::request::CloseReq { ep: self.id }), None);
        e.core.ep_close(self.id, force, rid);
        Ok(Request { worker: &self.worker, id: rid })
    }

    /// Closes and waits.
    pub fn close(self, mode: CloseMode) -> UcsResult<()> {
        self.close_nbx(mode)?.wait().map(|_| ())
    }
}

enum FutState<B> {
    Ready(Option<B>, Result<RecvInfo, Status>),
    Pending(Id),
    Gone,
}

/// A receive into an owned buffer; resolves to `(buffer, outcome)`. Polling progresses the
/// worker once; while pending it asks to be polled again at once (busy polling), so it runs
/// under any executor without a separate progress task.
pub struct RecvFuture<B: 'static> {
    worker: Worker,
    state: FutState<B>,
}

impl<B: 'static> Unpin for RecvFuture<B> {}

impl<B: 'static> Future for RecvFuture<B> {
    type Output = (B, Result<RecvInfo, Status>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match std::mem::replace(&mut self.state, FutState::Gone) {
            FutState::Ready(Some(b), r) => Poll::Ready((b, r)),
            FutState::Pending(id) => {
                let driven = self.worker.driven();
                if !driven && self.worker.request_status(id).0 == Status::InProgress {
                    self.worker.progress();
                }
                if self.worker.register_waker(id, cx.waker()) == Status::InProgress {
                    self.state = FutState::Pending(id);
                    if !driven {
                        cx.waker().wake_by_ref();
                    }
                    return Poll::Pending;
                }
                let (b, status, info) = self.worker.take_back::<B>(id);
                match b {
                    Some(b) => Poll::Ready((b, if status.is_err() { Err(status) } else { Ok(info) })),
                    None => {
                        // Only if the worker refused entry (wrong thread): nothing to return.
                        self.state = FutState::Gone;
                        Poll::Pending
                    }
                }
            }
            FutState::Ready(None, _) | FutState::Gone => Poll::Pending,
        }
    }
}

impl<B: 'static> Drop for RecvFuture<B> {
    fn drop(&mut self) {
        if let FutState::Pending(id) = self.state {
            // Cancel a receive still waiting for a match; anything further along keeps its
            // buffer inside the worker until the transport is done.
            self.worker.request_cancel(id);
            self.worker.request_release(id);
        }
    }
}

/// A send of an owned buffer; resolves to `(buffer, outcome)`. Dropping it does not stop the
/// send: the worker keeps the buffer until the transport is done with it.
pub struct SendFuture<B: 'static> {
    inner: RecvFuture<B>,
}

impl<B: 'static> Future for SendFuture<B> {
    type Output = (B, Result<(), Status>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner).poll(cx).map(|(b, r)| (b, r.map(|_| ())))
    }
}

impl<B: 'static> Drop for SendFuture<B> {
    fn drop(&mut self) {
        if let FutState::Pending(id) = self.inner.state {
            self.inner.state = FutState::Gone;
            self.inner.worker.request_release(id);
        }
    }
}

/// A worker's event descriptor together with a handle that keeps it open (see
/// [`Worker::event_source`]).
#[derive(Debug, Clone)]
pub struct EventSource {
    worker: Worker,
    fd: RawFd,
}

impl EventSource {
    /// The worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }
}

impl std::os::fd::AsRawFd for EventSource {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl std::os::fd::AsFd for EventSource {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the worker's wakeup set, which the worker handle in
        // `self` keeps open (it closes only when the last handle drops), so it is valid for the
        // borrow of `self`.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) }
    }
}

/// Keeps the futures of a worker from progressing it while alive; see
/// [`Worker::progress_driver`].
#[derive(Debug)]
pub struct ProgressDriver {
    worker: Worker,
}

impl ProgressDriver {
    /// The driven worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }
}

impl Drop for ProgressDriver {
    fn drop(&mut self) {
        self.worker.shared.drivers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs a future to completion on this thread (a minimal executor for examples and tests).
pub fn block_on<F: Future>(fut: F) -> F::Output {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    fn clone(_: *const ()) -> RawWaker {
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    // SAFETY: the vtable's functions ignore the data pointer and do nothing.
    let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
    let mut cx = TaskContext::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
}
