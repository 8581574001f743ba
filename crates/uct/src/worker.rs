//! The transport worker (`uct_worker_h`): a progress engine grouping interfaces.

use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use ucs::async_::AsyncContext;
use ucs::callbackq::{CallbackQueue, CbId};
use ucs::ThreadMode;

struct Inner {
    progress: CallbackQueue,
    async_ctx: Option<Arc<AsyncContext>>,
    thread_mode: ThreadMode,
}

/// Groups interfaces and progresses them. Cheap to clone (a shared handle).
///
/// Interfaces register their progress function when progress is enabled on them;
/// [`Worker::progress`] calls every registered function once.
#[derive(Clone)]
pub struct Worker {
    inner: Rc<Inner>,
}

impl Worker {
    /// A worker for `thread_mode`, optionally with an async context for event and timer handlers.
    pub fn new(async_ctx: Option<Arc<AsyncContext>>, thread_mode: ThreadMode) -> Self {
        Worker { inner: Rc::new(Inner { progress: CallbackQueue::new(), async_ctx, thread_mode }) }
    }

    /// Calls every registered progress function once; returns the number of events processed.
    #[inline]
    pub fn progress(&self) -> usize {
        self.inner.progress.dispatch()
    }

    /// Registers a progress function (used by transports).
    pub fn progress_register(&self, f: Box<dyn FnMut() -> usize>) -> CbId {
        self.inner.progress.add(f)
    }

    /// Removes a progress function (safe from inside progress).
    pub fn progress_unregister(&self, id: CbId) {
        self.inner.progress.remove(id);
    }

    /// The async context, if the worker has one.
    pub fn async_context(&self) -> Option<&Arc<AsyncContext>> {
        self.inner.async_ctx.as_ref()
    }

    /// The thread mode the worker was created with.
    pub fn thread_mode(&self) -> ThreadMode {
        self.inner.thread_mode
    }
}

/// An interface's registration with its worker's progress, for transport implementations:
/// [`ProgressRegistration::enable`] registers once, [`ProgressRegistration::disable`] and `Drop`
/// unregister.
pub struct ProgressRegistration {
    worker: Worker,
    id: std::cell::Cell<Option<CbId>>,
    /// False while [paused](Self::pause): the registered function is skipped.
    running: Rc<std::cell::Cell<bool>>,
}

impl ProgressRegistration {
    /// Not registered yet, for `worker`.
    pub fn new(worker: &Worker) -> Self {
        ProgressRegistration {
            worker: worker.clone(),
            id: std::cell::Cell::new(None),
            running: Rc::new(std::cell::Cell::new(true)),
        }
    }

    /// Registers `progress` unless already registered. Capture the interface weakly, so the
    /// worker does not keep it alive.
    pub fn enable(&self, mut progress: impl FnMut() -> usize + 'static) {
        if self.id.get().is_none() {
            let running = self.running.clone();
            let f = move || if running.get() { progress() } else { 0 };
            self.id.set(Some(self.worker.progress_register(Box::new(f))));
        }
    }

    /// Skips the registered function until [`resume`](Self::resume), while staying
    /// registered: for a transport with nothing to do most of the time (no operation
    /// queued), which would otherwise cost every progress call a call of its own, and whose
    /// work comes too often to unregister and register again (the callback queue allocates).
    #[inline]
    pub fn pause(&self) {
        self.running.set(false);
    }

    /// Runs the registered function again on every progress call.
    #[inline]
    pub fn resume(&self) {
        self.running.set(true);
    }

    /// Registers `progress(&target)` for an interface's shared state, holding it weakly (the
    /// worker must not keep the interface alive); once the interface is gone it reports 0.
    pub fn enable_for<T: 'static>(&self, target: &Rc<T>, progress: impl Fn(&T) -> usize + 'static) {
        if self.is_enabled() {
            return;
        }
        let weak = Rc::downgrade(target);
        self.enable(move || weak.upgrade().map_or(0, |t| progress(&t)));
    }

    /// True while registered.
    pub fn is_enabled(&self) -> bool {
        self.id.get().is_some()
    }

    /// Unregisters, if registered.
    pub fn disable(&self) {
        if let Some(id) = self.id.take() {
            self.worker.progress_unregister(id);
        }
    }
}

impl Drop for ProgressRegistration {
    fn drop(&mut self) {
        self.disable();
    }
}

impl fmt::Debug for ProgressRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgressRegistration").field("enabled", &self.id.get().is_some()).finish()
    }
}

impl Default for Worker {
    fn default() -> Self {
        Worker::new(None, ThreadMode::Single)
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker").field("thread_mode", &self.inner.thread_mode).finish()
    }
}
