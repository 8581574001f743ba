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
    cb: LocalCb,
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
    /// Held mutably for a whole dispatch pass; changes made meanwhile go to `deferred`.
    elems: RefCell<Vec<Elem>>,
    /// Remote ops are swapped into these vectors so their buffers are reused between merges.
    spare: RefCell<RemoteOps>,
    dispatching: Cell<bool>,
    /// Ids of live callbacks (including deferred adds), for `remove` during a pass.
    live_ids: RefCell<std::collections::HashSet<u64>>,
    /// Adds and removals made while a pass holds `elems`.
    deferred: RefCell<Deferred>,
    /// Removals waiting in `deferred`: the pass checks ids only while this is non-zero.
    pending_kills: Cell<usize>,
    /// Something waits in `deferred` (an add or a removal made during the pass).
    dirty: Cell<bool>,
}

#[derive(Default)]
struct Deferred {
    adds: Vec<Elem>,
    /// Removed ids.
    kills: Vec<u64>,
    /// Removed one-shot keys.
    oneshot_kills: Vec<u64>,
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
/// Ends a dispatch pass: clears the flag and applies changes callbacks made, also when a
/// callback unwinds.
struct PassEnd<'a>(&'a CallbackQueue);

impl Drop for PassEnd<'_> {
    fn drop(&mut self) {
        let q = self.0;
        q.dispatching.set(false);
        // Elements of a panicking pass may still be marked live: nothing is lost, the panic
        // only skipped the rest of the pass.
        if q.dirty.get() {
            q.apply_deferred();
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
            live_ids: RefCell::default(),
            deferred: RefCell::default(),
            pending_kills: Cell::new(0),
            dirty: Cell::new(false),
        }
    }

    /// A handle through which other threads add and remove callbacks.
    pub fn remote(&self) -> RemoteCallbackQueue {
        RemoteCallbackQueue { shared: Arc::clone(&self.shared) }
    }

    fn push(&self, id: u64, key: u64, oneshot: bool, cb: LocalCb) {
        self.live_ids.borrow_mut().insert(id);
        let e = Elem { id, key, oneshot, live: true, cb };
        if self.dispatching.get() {
            self.deferred.borrow_mut().adds.push(e);
            self.dirty.set(true);
        } else {
            self.elems.borrow_mut().push(e);
        }
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
        if self.live_ids.borrow_mut().remove(&id.0) {
            if self.dispatching.get() {
                // The running pass holds the list: record it; the pass skips it from now on.
                self.deferred.borrow_mut().kills.push(id.0);
                self.pending_kills.set(self.pending_kills.get() + 1);
                self.dirty.set(true);
            } else {
                let victim = {
                    let mut elems = self.elems.borrow_mut();
                    elems.iter().position(|e| e.id == id.0).map(|pos| elems.remove(pos))
                };
                // Dropped after the borrow: its destructor may use this queue.
                drop(victim);
            }
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
        if self.dispatching.get() {
            self.deferred.borrow_mut().oneshot_kills.push(key);
            self.pending_kills.set(self.pending_kills.get() + 1);
            self.dirty.set(true);
            return;
        }
        let victims: Vec<Elem> = {
            let mut elems = self.elems.borrow_mut();
            let (gone, keep): (Vec<Elem>, Vec<Elem>) =
                std::mem::take(&mut *elems).into_iter().partition(|e| e.oneshot && e.key == key);
            *elems = keep;
            gone
        };
        let mut ids = self.live_ids.borrow_mut();
        for v in &victims {
            ids.remove(&v.id);
        }
        drop(ids);
        drop(victims);
    }

    /// True when a removal recorded during this pass applies to `e`.
    #[cold]
    fn killed(&self, e: &Elem) -> bool {
        let d = self.deferred.borrow();
        d.kills.contains(&e.id) || (e.oneshot && d.oneshot_kills.contains(&e.key))
    }

    /// Applies what callbacks changed during the pass that just ended.
    #[cold]
    fn apply_deferred(&self) {
        let (adds, kills, oneshot_kills) = {
            let mut d = self.deferred.borrow_mut();
            (std::mem::take(&mut d.adds), std::mem::take(&mut d.kills), std::mem::take(&mut d.oneshot_kills))
        };
        self.pending_kills.set(0);
        self.dirty.set(false);
        let dead: Vec<Elem> = {
            let mut elems = self.elems.borrow_mut();
            let all = std::mem::take(&mut *elems);
            let (keep, dead): (Vec<Elem>, Vec<Elem>) = all
                .into_iter()
                .partition(|e| e.live && !kills.contains(&e.id) && !(e.oneshot && oneshot_kills.contains(&e.key)));
            *elems = keep;
            for a in adds {
                if kills.contains(&a.id) || (a.oneshot && oneshot_kills.contains(&a.key)) {
                    continue;
                }
                elems.push(a);
            }
            dead
        };
        let mut ids = self.live_ids.borrow_mut();
        for d in &dead {
            ids.remove(&d.id);
        }
        drop(ids);
        drop(dead);
    }

    /// Marks matching live elements dead (stopping after the first if `first_only`); returns
    /// whether any matched. Used by remote removals merged outside a pass.
    fn kill_where(&self, mut pred: impl FnMut(&Elem) -> bool, first_only: bool) -> bool {
        let mut found = false;
        loop {
            let victim = {
                let mut elems = self.elems.borrow_mut();
                let Some(pos) = elems.iter().position(|e| e.live && pred(e)) else {
                    break;
                };
                found = true;
                elems.remove(pos)
            };
            self.live_ids.borrow_mut().remove(&victim.id);
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
    #[inline]
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
        // Ends the pass even if a callback panics: the queue stays usable.
        let end = PassEnd(self);
        let mut count = 0usize;
        let mut oneshots = false;
        {
            // Held for the whole pass: callbacks that add or remove go through `deferred`.
            let mut elems = self.elems.borrow_mut();
            for e in elems.iter_mut() {
                if !e.live || (self.pending_kills.get() != 0 && self.killed(e)) {
                    continue;
                }
                count = count.saturating_add((e.cb)());
                if e.oneshot {
                    e.live = false;
                    oneshots = true;
                }
            }
        }
        if oneshots {
            self.dirty.set(true);
        }
        drop(end);
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
