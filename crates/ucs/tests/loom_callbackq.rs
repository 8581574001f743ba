//! Loom model of the callback queue's remote add/remove path racing the owner's dispatch.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" cargo test -p ucs --release --test loom_callbackq --target-dir target/loom`
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use ucs::callbackq::{CallbackQueue, CbId};

/// A remote callback counting its runs; it checks that its registration started before it ran.
fn counting(started: &Arc<AtomicBool>, runs: &Arc<AtomicUsize>) -> Box<dyn FnMut() -> usize + Send> {
    let (started, runs) = (Arc::clone(started), Arc::clone(runs));
    Box::new(move || {
        assert!(started.load(SeqCst), "ran before it was added");
        runs.fetch_add(1, SeqCst);
        1
    })
}

#[test]
fn remote_add_races_dispatch() {
    loom::model(|| {
        let q = CallbackQueue::new();
        let r = q.remote();
        let started = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicUsize::new(0));
        let t = {
            let cb = counting(&started, &runs);
            let started = Arc::clone(&started);
            thread::spawn(move || {
                started.store(true, SeqCst);
                r.add(cb)
            })
        };
        let first = q.dispatch();
        assert_eq!(first, runs.load(SeqCst));
        assert!(first <= 1);
        t.join().unwrap();
        // Merged by now: exactly one run per dispatch.
        for _ in 0..2 {
            let before = runs.load(SeqCst);
            assert_eq!(q.dispatch(), 1);
            assert_eq!(runs.load(SeqCst), before + 1);
        }
        assert_eq!(q.len(), 1);
    });
}

#[test]
fn remote_remove_races_dispatch() {
    loom::model(|| {
        let q = CallbackQueue::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let id = {
            let runs = Arc::clone(&runs);
            q.add(Box::new(move || {
                runs.fetch_add(1, SeqCst);
                1
            }))
        };
        let r = q.remote();
        let t = thread::spawn(move || r.remove(id));
        let first = q.dispatch();
        assert!(first <= 1);
        t.join().unwrap();
        // The removal happened before this dispatch started: it must not run any more.
        let after = runs.load(SeqCst);
        assert_eq!(after, first);
        assert_eq!(q.dispatch(), 0);
        assert_eq!(q.dispatch(), 0);
        assert_eq!(runs.load(SeqCst), after);
        assert!(q.is_empty());
    });
}

#[test]
fn remote_add_then_remove_races_dispatch() {
    loom::model(|| {
        let q = CallbackQueue::new();
        let r = q.remote();
        let started = Arc::new(AtomicBool::new(true));
        let runs = Arc::new(AtomicUsize::new(0));
        let t = {
            let cb = counting(&started, &runs);
            thread::spawn(move || {
                let id = r.add(cb);
                r.remove(id);
            })
        };
        // Runs only if this merge fell between the add and the remove.
        let first = q.dispatch();
        assert!(first <= 1);
        t.join().unwrap();
        let after = runs.load(SeqCst);
        assert_eq!(after, first);
        assert_eq!(q.dispatch(), 0);
        assert_eq!(runs.load(SeqCst), after);
        assert!(q.is_empty());
    });
}

#[test]
fn cancel_before_merge_never_runs() {
    loom::model(|| {
        let q = CallbackQueue::new();
        let started = Arc::new(AtomicBool::new(true));
        let cancelled_runs = Arc::new(AtomicUsize::new(0));
        let kept_runs = Arc::new(AtomicUsize::new(0));
        // Two remote threads: one add that is cancelled by the owner before any merge, one add
        // that is cancelled remotely, racing each other on the remote list.
        let t1 = {
            let r = q.remote();
            let cb = counting(&started, &cancelled_runs);
            thread::spawn(move || r.add(cb))
        };
        let t2 = {
            let r = q.remote();
            let cb = counting(&started, &cancelled_runs);
            let kept = counting(&started, &kept_runs);
            thread::spawn(move || {
                let id = r.add(cb);
                let keep = r.add(kept);
                r.remove(id);
                keep
            })
        };
        let id1: CbId = t1.join().unwrap();
        assert!(q.remove(id1), "pending remote add must be cancellable by the owner");
        let keep = t2.join().unwrap();
        assert_ne!(id1, keep);
        assert_eq!(q.dispatch(), 1);
        assert_eq!(q.dispatch(), 1);
        assert_eq!(cancelled_runs.load(SeqCst), 0);
        assert_eq!(kept_runs.load(SeqCst), 2);
    });
}

#[test]
fn concurrent_remote_adds_unique_and_once_per_dispatch() {
    loom::model(|| {
        let q = CallbackQueue::new();
        let started = Arc::new(AtomicBool::new(true));
        let runs = Arc::new(AtomicUsize::new(0));
        let spawn_add = |q: &CallbackQueue| {
            let r = q.remote();
            let cb = counting(&started, &runs);
            thread::spawn(move || r.add(cb))
        };
        let t1 = spawn_add(&q);
        let t2 = spawn_add(&q);
        let first = q.dispatch();
        assert!(first <= 2);
        let (a, b) = (t1.join().unwrap(), t2.join().unwrap());
        assert_ne!(a, b);
        let before = runs.load(SeqCst);
        assert_eq!(before, first);
        assert_eq!(q.dispatch(), 2);
        assert_eq!(runs.load(SeqCst), before + 2);
    });
}
