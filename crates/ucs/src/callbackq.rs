//! Progress callback queue (UCX `ucs_callbackq`).
//!
//! A worker's progress loop calls [`CallbackQueue::dispatch`], which calls every registered
//! callback once and sums what they return (the amount of work each one did). Two sides:
//!
//! * [`CallbackQueue`] belongs to the thread that dispatches. It is `!Sync` and uses interior
//!   mutability so a callback running inside `dispatch` may add or remove callbacks, including
//!   removing itself. Callbacks added during a pass first run in the next pass; a callback
//!   removed during a pass is not called again, even later in the same pass.
//! * [`RemoteCallbackQueue`] is a `Clone + Send + Sync` handle for every other thread. Its adds
//!   and removes go into a mutex-protected list and raise one atomic flag; the owner merges the
//!   list at the start of its next `dispatch`. While nothing is queued, `dispatch` reads that
//!   flag and takes no lock.
//!
//! Ids ([`CbId`]) come from one atomic counter shared by both sides, so an id names the same
//! callback whichever side added it, and a remote add may be cancelled before the owner ever
//! merges it.
//!
//! Once the element vector has grown to its high-water mark, dispatching allocates nothing:
//! each callback box is moved out of its slot while it runs and moved back afterwards, so the
//! queue stays borrowable (and mutable) from inside the callback.

use std::cell::{Cell, RefCell};
use std::fmt;

use crate::sync::{self, Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// A callback owned by the dispatching thread.
type LocalCb = Box<dyn FnMut() -> usize>;
/// A callback handed over from another thread.
type RemoteCb = Box<dyn FnMut() -> usize + Send>;

/// Identifies a callback in one queue (local and remote adds share the id space).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CbId(u64);

impl CbId {
    /// The raw id value.
    #[inline]
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

/// One registered callback.
struct Elem {
    id: u64,
    /// Key for [`CallbackQueue::remove_oneshot`]; only meaningful when `oneshot`.
    key: u64,
    oneshot: bool,
    /// False once removed; dead elements stay in place until the pass ends so indices taken at
    /// the start of a pass remain valid.
    live: bool,
    /// `None` while the callback is running (it is moved out) or after removal.
    cb: Option<LocalCb>,
}

/// Operations queued by other threads, merged by the owner.
#[derive(Default)]
struct RemoteOps {
    adds: Vec<(u64, RemoteCb)>,
    removes: Vec<u64>,
}

/// State shared between the owner and its remote handles.
struct Shared {
    /// Set (under `ops`) whenever `ops` holds something; cleared (under `ops`) by the merge.
    pending: AtomicBool,
    next_id: AtomicU64,
    ops: Mutex<RemoteOps>,
}

impl Shared {
    fn alloc_id(&self) -> u64 {
        // Only uniqueness matters, not ordering with other memory.
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// The owner side of a progress callback queue. See the [module docs](self).
pub struct CallbackQueue {
    shared: Arc<Shared>,
    elems: RefCell<Vec<Elem>>,
    /// Remote ops are swapped into these vectors so their buffers are reused between merges.
    spare: RefCell<RemoteOps>,
    dispatching: Cell<bool>,
    /// Some element died during the current pass and must be purged after it.
    dirty: Cell<bool>,
}

impl Default for CallbackQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for CallbackQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackQueue").field("len", &self.len()).field("dispatching", &self.dispatching.get()).finish()
    }
}

/// Ends a dispatch pass even if a callback unwinds, so the queue stays usable.
struct PassGuard<'a>(&'a CallbackQueue);

impl Drop for PassGuard<'_> {
    fn drop(&mut self) {
        self.0.dispatching.set(false);
        if self.0.dirty.replace(false) {
            self.0.elems.borrow_mut().retain(|e| e.live);
        }
    }
}

impl CallbackQueue {
    /// An empty queue.
    pub fn new() -> Self {
        CallbackQueue {
            shared: Arc::new(Shared {
                pending: AtomicBool::new(false),
                next_id: AtomicU64::new(1),
                ops: Mutex::new(RemoteOps::default()),
            }),
            elems: RefCell::new(Vec::new()),
            spare: RefCell::new(RemoteOps::default()),
            dispatching: Cell::new(false),
            dirty: Cell::new(false),
        }
    }

    /// A handle through which other threads add and remove callbacks.
    pub fn remote(&self) -> RemoteCallbackQueue {
        RemoteCallbackQueue { shared: Arc::clone(&self.shared) }
    }

    fn push(&self, id: u64, key: u64, oneshot: bool, cb: LocalCb) {
        self.elems.borrow_mut().push(Elem { id, key, oneshot, live: true, cb: Some(cb) });
    }

    /// Adds a callback called on every dispatch until removed. When called from inside a
    /// callback, the new one first runs in the next dispatch.
    pub fn add(&self, cb: Box<dyn FnMut() -> usize>) -> CbId {
        let id = self.shared.alloc_id();
        self.push(id, 0, false, cb);
        CbId(id)
    }

    /// Adds a callback called once, by the next dispatch, then dropped. `key` groups one-shot
    /// callbacks for [`remove_oneshot`](Self::remove_oneshot); the returned id also works with
    /// [`remove`](Self::remove).
    pub fn add_oneshot(&self, key: u64, cb: Box<dyn FnMut() -> usize>) -> CbId {
        let id = self.shared.alloc_id();
        self.push(id, key, true, cb);
        CbId(id)
    }

    /// Removes callback `id`, whether it was added here or remotely (merged or not yet).
    /// Returns false if no such callback is registered.
    ///
    /// Safe from inside a callback, including the one being removed: it is not called again, and
    /// its box is dropped once it returns.
    pub fn remove(&self, id: CbId) -> bool {
        if self.kill_where(|e| e.id == id.0, true) {
            return true;
        }
        // Not merged yet: cancel it in the remote list.
        let cancelled = {
            let mut ops = sync::lock(&self.shared.ops);
            ops.adds.iter().position(|(i, _)| *i == id.0).map(|pos| ops.adds.remove(pos).1)
        };
        // Dropped outside the lock: its destructor may use the remote queue.
        cancelled.is_some()
    }

    /// Removes every one-shot callback registered with `key` that has not run yet.
    pub fn remove_oneshot(&self, key: u64) {
        self.kill_where(|e| e.oneshot && e.key == key, false);
    }

    /// Marks matching live elements dead (stopping after the first if `first_only`); returns
    /// whether any matched. Dead boxes are dropped after the `RefCell` borrow ends, since their
    /// destructors may call back into this queue.
    fn kill_where(&self, mut pred: impl FnMut(&Elem) -> bool, first_only: bool) -> bool {
        let mut found = false;
        loop {
            let victim = {
                let mut elems = self.elems.borrow_mut();
                let Some(pos) = elems.iter().position(|e| e.live && pred(e)) else {
                    break;
                };
                found = true;
                if self.dispatching.get() {
                    // Keep indices stable for the running pass; purge when it ends.
                    let e = &mut elems[pos];
                    e.live = false;
                    self.dirty.set(true);
                    e.cb.take()
                } else {
                    elems.remove(pos).cb
                }
            };
            drop(victim);
            if first_only {
                break;
            }
        }
        found
    }

    /// Number of registered callbacks, not counting remote adds not merged yet.
    pub fn len(&self) -> usize {
        self.elems.borrow().iter().filter(|e| e.live).count()
    }

    /// True when no callback is registered (remote adds not merged yet do not count).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Merges operations queued by remote handles.
    #[cold]
    fn merge_remote(&self) {
        let mut spare = self.spare.borrow_mut();
        {
            let mut ops = sync::lock(&self.shared.ops);
            // Cleared under the lock: a remote op after this point sets it again.
            self.shared.pending.store(false, Ordering::Relaxed);
            std::mem::swap(&mut ops.adds, &mut spare.adds);
            std::mem::swap(&mut ops.removes, &mut spare.removes);
        }
        for (id, cb) in spare.adds.drain(..) {
            self.push(id, 0, false, cb);
        }
        // Adds cancelled before the merge never reach this list (the remote side dropped them
        // from `adds`), so every id here was merged earlier or added locally.
        for id in spare.removes.drain(..) {
            self.kill_where(|e| e.id == id, true);
        }
    }

    /// Calls every registered callback once, in the order they were added, and returns the sum
    /// of their results (saturating). Remote adds and removes queued before this call are
    /// applied first.
    ///
    /// A nested call from inside a callback does nothing and returns 0.
    pub fn dispatch(&self) -> usize {
        if self.dispatching.get() {
            return 0;
        }
        // Acquire pairs with the remote side's release so a set flag means the list is visible;
        // the list itself is read under the mutex anyway.
        if self.shared.pending.load(Ordering::Acquire) {
            self.merge_remote();
        }
        self.dispatching.set(true);
        let guard = PassGuard(self);
        let n = self.elems.borrow().len();
        let mut count = 0usize;
        for i in 0..n {
            let taken = {
                let mut elems = self.elems.borrow_mut();
                let e = &mut elems[i];
                if e.live {
                    e.cb.take()
                } else {
                    None
                }
            };
            let Some(mut cb) = taken else { continue };
            count = count.saturating_add(cb());
            let finished = {
                let mut elems = self.elems.borrow_mut();
                let e = &mut elems[i];
                if e.live && !e.oneshot {
                    e.cb = Some(cb);
                    None
                } else {
                    e.live = false;
                    self.dirty.set(true);
                    Some(cb)
                }
            };
            drop(finished);
        }
        drop(guard);
        count
    }
}

/// A thread-safe handle that adds and removes callbacks of a [`CallbackQueue`] from any thread.
///
/// Changes take effect at the start of the owner's next [`CallbackQueue::dispatch`].
#[derive(Clone)]
pub struct RemoteCallbackQueue {
    shared: Arc<Shared>,
}

impl fmt::Debug for RemoteCallbackQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteCallbackQueue").finish_non_exhaustive()
    }
}

impl RemoteCallbackQueue {
    /// Queues `cb` to be added by the owner's next dispatch, which also calls it.
    pub fn add(&self, cb: Box<dyn FnMut() -> usize + Send>) -> CbId {
        let id = self.shared.alloc_id();
        let mut ops = sync::lock(&self.shared.ops);
        ops.adds.push((id, cb));
        self.shared.pending.store(true, Ordering::Release);
        CbId(id)
    }

    /// Removes callback `id`. If the owner has not merged it yet it is cancelled here and never
    /// runs; otherwise the owner removes it at the start of its next dispatch.
    pub fn remove(&self, id: CbId) {
        let cancelled = {
            let mut ops = sync::lock(&self.shared.ops);
            match ops.adds.iter().position(|(i, _)| *i == id.0) {
                Some(pos) => Some(ops.adds.remove(pos).1),
                None => {
                    ops.removes.push(id.0);
                    self.shared.pending.store(true, Ordering::Release);
                    None
                }
            }
        };
        drop(cancelled);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn counter(c: &Rc<Cell<usize>>, ret: usize) -> Box<dyn FnMut() -> usize> {
        let c = Rc::clone(c);
        Box::new(move || {
            c.set(c.get() + 1);
            ret
        })
    }

    #[test]
    fn add_dispatch_remove() {
        let q = CallbackQueue::new();
        let a = Rc::new(Cell::new(0));
        let b = Rc::new(Cell::new(0));
        let ia = q.add(counter(&a, 1));
        let ib = q.add(counter(&b, 2));
        assert_ne!(ia, ib);
        assert_eq!(q.len(), 2);
        assert_eq!(q.dispatch(), 3);
        assert!(q.remove(ia));
        assert!(!q.remove(ia));
        assert_eq!(q.dispatch(), 2);
        assert_eq!((a.get(), b.get()), (1, 2));
        assert!(q.remove(ib));
        assert!(q.is_empty());
        assert_eq!(q.dispatch(), 0);
    }

    #[test]
    fn remove_self_and_others_inside_dispatch() {
        let q = Rc::new(CallbackQueue::new());
        let later = Rc::new(Cell::new(0));
        let self_id = Rc::new(Cell::new(None));
        let later_id = Rc::new(Cell::new(None));
        let runs = Rc::new(Cell::new(0));
        {
            let (q2, sid, lid, runs) = (Rc::clone(&q), Rc::clone(&self_id), Rc::clone(&later_id), Rc::clone(&runs));
            self_id.set(Some(q.add(Box::new(move || {
                runs.set(runs.get() + 1);
                assert!(q2.remove(sid.get().unwrap()));
                assert!(q2.remove(lid.get().unwrap()));
                1
            }))));
        }
        later_id.set(Some(q.add(counter(&later, 10))));
        assert_eq!(q.dispatch(), 1);
        assert_eq!(later.get(), 0, "removed later in the same pass: not called");
        assert!(q.is_empty());
        assert_eq!(q.dispatch(), 0);
        assert_eq!(runs.get(), 1);
    }

    #[test]
    fn add_inside_dispatch_runs_next_pass() {
        let q = Rc::new(CallbackQueue::new());
        let inner = Rc::new(Cell::new(0));
        let (q2, inner2) = (Rc::clone(&q), Rc::clone(&inner));
        let mut added = false;
        q.add(Box::new(move || {
            if !added {
                added = true;
                q2.add(counter(&inner2, 5));
            }
            assert_eq!(q2.dispatch(), 0, "nested dispatch is a no-op");
            0
        }));
        assert_eq!(q.dispatch(), 0);
        assert_eq!(inner.get(), 0);
        assert_eq!(q.dispatch(), 5);
        assert_eq!(inner.get(), 1);
    }

    #[test]
    fn oneshot_runs_once_and_remove_by_key() {
        let q = CallbackQueue::new();
        let a = Rc::new(Cell::new(0));
        q.add_oneshot(7, counter(&a, 1));
        q.add_oneshot(7, counter(&a, 1));
        q.add_oneshot(8, counter(&a, 100));
        q.remove_oneshot(8);
        assert_eq!(q.len(), 2);
        assert_eq!(q.dispatch(), 2);
        assert_eq!(q.dispatch(), 0);
        assert!(q.is_empty());
        let id = q.add_oneshot(9, counter(&a, 1));
        assert!(q.remove(id));
        assert_eq!(q.dispatch(), 0);
        assert_eq!(a.get(), 2);
    }

    #[test]
    fn remote_add_remove_and_cancel() {
        let q = CallbackQueue::new();
        let r = q.remote();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = std::sync::Arc::clone(&hits);
        let id = std::thread::spawn(move || {
            r.add(Box::new(move || {
                h.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                1
            }))
        })
        .join()
        .unwrap();
        assert_eq!(q.len(), 0, "not merged before dispatch");
        assert_eq!(q.dispatch(), 1);
        assert_eq!(q.dispatch(), 1);
        q.remote().remove(id);
        assert_eq!(q.dispatch(), 0);
        assert_eq!(hits.load(std::sync::atomic::Ordering::Relaxed), 2);

        // Cancel before merge, from either side.
        let r = q.remote();
        let a = r.add(Box::new(|| 100));
        r.remove(a);
        let b = r.add(Box::new(|| 100));
        assert!(q.remove(b));
        assert_eq!(q.dispatch(), 0);
        assert!(q.is_empty());

        // A local id removed through the remote handle.
        let c = q.add(Box::new(|| 3));
        r.remove(c);
        assert_eq!(q.dispatch(), 0);
        assert!(q.is_empty());
    }

    #[test]
    fn survives_panicking_callback() {
        let q = CallbackQueue::new();
        let id = q.add(Box::new(|| panic!("boom")));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| q.dispatch()));
        assert!(r.is_err());
        // The panicking box was lost mid-call; the queue itself still works.
        assert!(q.remove(id) || q.is_empty());
        q.add(Box::new(|| 4));
        assert_eq!(q.dispatch(), 4);
    }

    #[test]
    fn ids_unique_across_sides() {
        let q = CallbackQueue::new();
        let r = q.remote();
        let mut ids = std::collections::HashSet::new();
        for _ in 0..50 {
            assert!(ids.insert(q.add(Box::new(|| 0))));
            assert!(ids.insert(r.add(Box::new(|| 0))));
        }
        q.dispatch();
        assert_eq!(q.len(), 100);
    }

    #[test]
    fn send_sync_bounds() {
        fn is_send_sync<T: Send + Sync + Clone>() {}
        is_send_sync::<RemoteCallbackQueue>();
    }
}
