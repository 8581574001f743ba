//! The async context (UCX `ucs_async_context_t`): runs event and timer handlers outside the
//! user's progress calls, or from them, and lets the user block them.
//!
//! # Modes
//! * [`AsyncMode::Thread`]: each context owns one background thread ("ucs-async") waiting on the
//!   context's [`EventSet`] with a timeout taken from its [`TimerQueue`]. One thread per context
//!   (rather than UCX's single shared thread) keeps contexts independent: a long handler or a
//!   long block in one context never delays another, and dropping a context joins exactly its
//!   own thread.
//! * [`AsyncMode::Poll`]: no thread; [`AsyncContext::poll`] checks the descriptors (zero-timeout
//!   wait) and the timers in the caller.
//!
//! # Blocking and missed events
//! [`AsyncContext::block`] returns a guard; while any guard is alive no handler of the context
//! runs. Who runs what is decided by [`BlockState`]: an event that finds the context blocked is
//! queued as missed (once per handler) and replayed by the thread that drops the outermost guard,
//! or by the next [`AsyncContext::poll`].
//!
//! Descriptors are registered one-shot: the kernel disarms a descriptor when it reports it, and
//! the context re-arms it after the handler ran. Without that, a level-triggered descriptor whose
//! event was only queued as missed would wake the async thread again and again until the block
//! ends; with it the thread sleeps. The price is one `epoll_ctl` per handled event, acceptable
//! for async events (connection management, wakeups), which are not a data fast path.
//!
//! # Reference cycles
//! Handlers that capture an `Arc<AsyncContext>` of their own context keep it alive: remove them
//! (or capture a `Weak`) before dropping the last user reference.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{BlockState, EventFd, EventSet, Events, TimerQueue};
use crate::sync::{self, Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::time::{self, Time};
use crate::{Status, UcsResult};

/// Token of the async thread's wakeup eventfd in the event set; handler ids start above it.
const WAKE_TOKEN: u64 = 0;

/// How long dropping a context waits for its thread to exit before detaching it.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Where handlers run (UCX `ucs_async_mode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncMode {
    /// A background thread per context runs handlers as events arrive.
    Thread,
    /// Handlers run only inside [`AsyncContext::poll`] (and when a block ends).
    Poll,
}

/// Identifies an event or timer handler within its context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HandlerId(u64);

impl HandlerId {
    /// The raw id value.
    #[inline]
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

/// A small per-thread number identifying the caller to [`BlockState`].
fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TOKEN.with(|t| *t)
}

enum Callback {
    Event(Box<dyn FnMut(Events) + Send>),
    Timer(Box<dyn FnMut() + Send>),
}

#[derive(Clone, Copy)]
enum Kind {
    Fd { fd: RawFd, events: Events },
    Timer,
}

struct Handler {
    kind: Kind,
    /// Moved out while the handler runs, so the table lock is not held across the call.
    cb: Option<Callback>,
}

struct Inner {
    mode: AsyncMode,
    set: EventSet,
    /// Wakes the async thread (Thread mode only).
    wake: Option<EventFd>,
    core: BlockState,
    handlers: Mutex<HashMap<u64, Handler>>,
    timers: Mutex<TimerQueue>,
    /// `timers.next_expiry()`, or `Time::MAX`; lets idle polls skip the timer lock.
    next_deadline: AtomicU64,
    fd_count: AtomicUsize,
    next_id: AtomicU64,
    stop: AtomicBool,
    /// Token of the async thread, 0 until it starts (and in Poll mode).
    async_token: AtomicU64,
    /// Expired timer ids for `poll`, kept to reuse the buffer.
    scratch: Mutex<Vec<u64>>,
}

impl Inner {
    fn alloc_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn wake_thread(&self) {
        if let Some(w) = &self.wake {
            if let Err(s) = w.signal() {
                tracing::warn!("async: failed to wake the async thread: {s}");
            }
        }
    }

    fn publish_deadline(&self, tq: &TimerQueue) {
        self.next_deadline.store(tq.next_expiry().unwrap_or(Time::MAX), Ordering::Release);
    }

    /// Runs handler `id` (the caller holds the block), then re-arms its descriptor.
    fn run_handler(&self, id: u64, events: Events) {
        let taken = sync::lock(&self.handlers).get_mut(&id).and_then(|h| h.cb.take());
        // Removed since the event was queued, or (never, given the block) already running.
        let Some(mut cb) = taken else { return };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &mut cb {
            Callback::Event(f) => f(events),
            Callback::Timer(f) => f(),
        }));
        if outcome.is_err() {
            tracing::error!("async: handler {id} panicked; it stays registered");
        }
        let mut table = sync::lock(&self.handlers);
        match table.get_mut(&id) {
            Some(h) => {
                h.cb = Some(cb);
                if let Kind::Fd { fd, events } = h.kind {
                    if let Err(s) = self.set.modify(fd, events | Events::ONESHOT, id) {
                        // The user closed the descriptor without removing the handler.
                        tracing::debug!("async: cannot re-arm fd {fd} of handler {id}: {s}");
                    }
                }
            }
            None => {
                // Removed while running: drop it here, outside the table lock, since its
                // destructor may call back into the context.
                drop(table);
                drop(cb);
            }
        }
    }

    fn on_event(&self, token: u64, id: u64, events: Events) -> usize {
        if id == WAKE_TOKEN {
            if let Some(w) = &self.wake {
                let _ = w.drain();
            }
            return 0;
        }
        self.core.dispatch(token, id, events, |h, e| self.run_handler(h, e))
    }

    /// Runs the handlers of expired timers; `scratch` carries their ids out of the timer lock so
    /// handlers may add or remove timers.
    fn expire_timers(&self, token: u64, scratch: &mut Vec<u64>) -> usize {
        let now = time::now();
        if now < self.next_deadline.load(Ordering::Acquire) {
            return 0;
        }
        {
            let mut tq = sync::lock(&self.timers);
            tq.expire(now, |id| scratch.push(id));
            self.publish_deadline(&tq);
        }
        let mut ran = 0;
        for id in scratch.drain(..) {
            ran += self.core.dispatch(token, id, Events::empty(), |h, e| self.run_handler(h, e));
        }
        ran
    }

    fn thread_timeout(&self) -> Option<Duration> {
        match self.next_deadline.load(Ordering::Acquire) {
            Time::MAX => None,
            d => Some(time::to_duration(d.saturating_sub(time::now()))),
        }
    }
}

fn thread_main(inner: Arc<Inner>, _exited: mpsc::Sender<()>) {
    // `_exited` is dropped when this returns, which is what `AsyncContext::drop` waits for.
    let token = thread_token();
    inner.async_token.store(token, Ordering::Release);
    let mut scratch = Vec::with_capacity(8);
    while !inner.stop.load(Ordering::Acquire) {
        let timeout = inner.thread_timeout();
        if let Err(s) = inner.set.wait(timeout, |id, ev| {
            inner.on_event(token, id, ev);
        }) {
            tracing::error!("async: event set wait failed, async thread exits: {s}");
            break;
        }
        inner.expire_timers(token, &mut scratch);
    }
}

/// Runs event and timer handlers for one user of the async machinery (a worker, an interface).
/// See the [module docs](self). `Send + Sync`; share it through the returned `Arc`.
pub struct AsyncContext {
    inner: Arc<Inner>,
    thread: Mutex<Option<(JoinHandle<()>, mpsc::Receiver<()>)>>,
}

impl fmt::Debug for AsyncContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncContext")
            .field("mode", &self.inner.mode)
            .field("epoll_fd", &self.inner.set.as_raw_fd())
            .finish_non_exhaustive()
    }
}

impl AsyncContext {
    /// Creates a context; in [`AsyncMode::Thread`] also starts its thread.
    pub fn new(mode: AsyncMode) -> UcsResult<Arc<AsyncContext>> {
        let set = EventSet::new()?;
        let wake = match mode {
            AsyncMode::Thread => {
                let w = EventFd::new()?;
                set.add(w.as_raw_fd(), Events::READ, WAKE_TOKEN)?;
                Some(w)
            }
            AsyncMode::Poll => None,
        };
        let inner = Arc::new(Inner {
            mode,
            set,
            wake,
            core: BlockState::new(),
            handlers: Mutex::new(HashMap::new()),
            timers: Mutex::new(TimerQueue::new()),
            next_deadline: AtomicU64::new(Time::MAX),
            fd_count: AtomicUsize::new(0),
            next_id: AtomicU64::new(WAKE_TOKEN + 1),
            stop: AtomicBool::new(false),
            async_token: AtomicU64::new(0),
            scratch: Mutex::new(Vec::new()),
        });
        let thread = match mode {
            AsyncMode::Thread => {
                let (tx, rx) = mpsc::channel();
                let for_thread = Arc::clone(&inner);
                let handle =
                    std::thread::Builder::new().name("ucs-async".into()).spawn(move || thread_main(for_thread, tx))?;
                Some((handle, rx))
            }
            AsyncMode::Poll => None,
        };
        Ok(Arc::new(AsyncContext { inner, thread: Mutex::new(thread) }))
    }

    /// The mode given at creation.
    pub fn mode(&self) -> AsyncMode {
        self.inner.mode
    }

    /// True when events that found the context blocked wait to be replayed (UCX
    /// `ucs_async_check_miss`'s cheap test; [`poll`](Self::poll) replays them). One atomic load.
    pub fn has_missed(&self) -> bool {
        self.inner.core.has_missed()
    }

    /// True when called from this context's async thread (inside one of its handlers).
    pub fn is_from_async(&self) -> bool {
        self.inner.async_token.load(Ordering::Acquire) == thread_token()
    }

    /// Calls `handler(events)` whenever `fd` reports any of `events` ([`Events::EDGE`] makes it
    /// edge-triggered). One handler per descriptor: a second registration of the same `fd`
    /// fails with [`Status::AlreadyExists`].
    pub fn add_event_handler(
        &self,
        fd: RawFd,
        events: Events,
        handler: Box<dyn FnMut(Events) + Send>,
    ) -> UcsResult<HandlerId> {
        if fd < 0 {
            return Err(Status::InvalidParam);
        }
        let id = self.inner.alloc_id();
        let mut table = sync::lock(&self.inner.handlers);
        // In the table before epoll knows the descriptor, so an immediate event finds it.
        table.insert(id, Handler { kind: Kind::Fd { fd, events }, cb: Some(Callback::Event(handler)) });
        if let Err(s) = self.inner.set.add(fd, events | Events::ONESHOT, id) {
            let failed = table.remove(&id);
            drop(table);
            drop(failed);
            return Err(s);
        }
        drop(table);
        self.inner.fd_count.fetch_add(1, Ordering::Relaxed);
        Ok(HandlerId(id))
    }

    /// Calls `handler()` every `interval` (first after one interval). A zero interval is
    /// [`Status::InvalidParam`]. Resolution is one millisecond in Thread mode; in Poll mode the
    /// handler runs at the first `poll` after each deadline.
    pub fn add_timer(&self, interval: Duration, handler: Box<dyn FnMut() + Send>) -> UcsResult<HandlerId> {
        if interval.is_zero() {
            return Err(Status::InvalidParam);
        }
        let id = self.inner.alloc_id();
        sync::lock(&self.inner.handlers).insert(id, Handler { kind: Kind::Timer, cb: Some(Callback::Timer(handler)) });
        {
            let mut tq = sync::lock(&self.inner.timers);
            tq.add(id, interval, time::now());
            self.inner.publish_deadline(&tq);
        }
        // The thread may be sleeping with a timeout computed before this timer existed.
        self.inner.wake_thread();
        Ok(HandlerId(id))
    }

    /// Removes a handler; [`Status::NoElem`] if `id` is unknown. The handler's box is dropped
    /// once it is not running. With `sync`, also waits until it has finished running on another
    /// thread; called from inside a handler of this context (or while holding a block guard of
    /// it) nothing can be running, so it returns at once.
    ///
    /// Waiting means taking the context's block for a moment, which replays missed events in
    /// the caller.
    pub fn remove_handler(&self, id: HandlerId, sync: bool) -> UcsResult<()> {
        let removed = {
            let mut table = sync::lock(&self.inner.handlers);
            let h = table.remove(&id.0);
            // Under the table lock so a concurrent re-arm (which looks the handler up under the
            // same lock) cannot resurrect the registration.
            if let Some(Handler { kind: Kind::Fd { fd, .. }, .. }) = &h {
                if let Err(s) = self.inner.set.remove(*fd) {
                    tracing::debug!("async: fd {fd} of handler {} already gone: {s}", id.0);
                }
            }
            h
        };
        let Some(handler) = removed else {
            return Err(Status::NoElem);
        };
        match handler.kind {
            Kind::Fd { .. } => {
                self.inner.fd_count.fetch_sub(1, Ordering::Relaxed);
            }
            Kind::Timer => {
                let mut tq = sync::lock(&self.inner.timers);
                tq.remove(id.0);
                self.inner.publish_deadline(&tq);
            }
        }
        self.inner.core.remove_missed(id.0);
        drop(handler);
        if sync && !self.inner.core.is_held_by(thread_token()) {
            // A running handler holds the block; getting it means the handler has returned.
            drop(self.block());
        }
        Ok(())
    }

    /// Changes the events a descriptor handler waits for. [`Status::NoElem`] for an unknown id,
    /// [`Status::InvalidParam`] for a timer.
    pub fn modify_event(&self, id: HandlerId, events: Events) -> UcsResult<()> {
        let mut table = sync::lock(&self.inner.handlers);
        let h = table.get_mut(&id.0).ok_or(Status::NoElem)?;
        match &mut h.kind {
            Kind::Fd { fd, events: cur } => {
                self.inner.set.modify(*fd, events | Events::ONESHOT, id.0)?;
                *cur = events;
                Ok(())
            }
            Kind::Timer => Err(Status::InvalidParam),
        }
    }

    /// Blocks this context's handlers until the guard drops, waiting for a running handler to
    /// finish first. Nests on one thread; handlers of the context may block it too. Dropping the
    /// outermost guard replays, in the dropping thread, the events missed meanwhile.
    pub fn block(&self) -> BlockGuard<'_> {
        let token = thread_token();
        self.inner.core.block(token);
        BlockGuard { ctx: self, token, _not_send: PhantomData }
    }

    /// Poll mode: runs handlers of ready descriptors and expired timers now, in the caller.
    /// Both modes: replays missed events (a single atomic load when there are none). Does
    /// nothing while the caller holds a block of this context (events are kept as missed).
    /// Returns how many handlers ran.
    pub fn poll(&self) -> usize {
        let inner = &*self.inner;
        let token = thread_token();
        let mut ran = 0;
        if inner.mode == AsyncMode::Poll {
            if inner.fd_count.load(Ordering::Relaxed) > 0 {
                let waited = inner.set.wait(Some(Duration::ZERO), |id, ev| {
                    ran += inner.on_event(token, id, ev);
                });
                if let Err(s) = waited {
                    tracing::warn!("async: poll of the event set failed: {s}");
                }
            }
            // No clock read at all while no timer exists.
            let deadline = inner.next_deadline.load(Ordering::Acquire);
            if deadline != Time::MAX && time::now() >= deadline {
                let mut scratch = std::mem::take(&mut *sync::lock(&inner.scratch));
                ran += inner.expire_timers(token, &mut scratch);
                *sync::lock(&inner.scratch) = scratch;
            }
        }
        if inner.core.has_missed() {
            ran += inner.core.replay_missed(token, |h, e| inner.run_handler(h, e));
        }
        ran
    }
}

impl Drop for AsyncContext {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake_thread();
        let Some((handle, exited)) = sync::lock(&self.thread).take() else {
            return;
        };
        if self.is_from_async() {
            // Last reference dropped by one of our own handlers: the thread stops when the
            // handler returns; joining here would wait for ourselves.
            return;
        }
        match exited.recv_timeout(JOIN_TIMEOUT) {
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if handle.join().is_err() {
                    tracing::warn!("async: async thread panicked");
                }
            }
            _ => tracing::warn!(
                "async: async thread did not stop within {JOIN_TIMEOUT:?} (a handler is stuck); detaching it"
            ),
        }
    }
}

/// Keeps an [`AsyncContext`]'s handlers from running while alive. `!Send`: the block belongs to
/// the thread that took it.
#[must_use = "the context is unblocked as soon as the guard is dropped"]
pub struct BlockGuard<'a> {
    ctx: &'a AsyncContext,
    token: u64,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for BlockGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockGuard").finish_non_exhaustive()
    }
}

impl Drop for BlockGuard<'_> {
    fn drop(&mut self) {
        let inner = &*self.ctx.inner;
        inner.core.unblock(self.token, |h, e| inner.run_handler(h, e));
    }
}
