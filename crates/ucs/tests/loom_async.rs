//! Loom model of the async context's block/unblock protocol and missed-event queue
//! ([`ucs::async_::BlockState`], the exact code `AsyncContext` runs).
//!
//! Threads play the roles of the async thread (delivering signals through `dispatch`) and of
//! user threads (blocking, nesting, unblocking). Checked in every interleaving:
//! * a handler never runs while a user holds the block, and never concurrently with another;
//! * every signal is handled at least once after it was signalled (no lost event);
//! * a single signal is handled exactly once (no duplicate).
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" cargo test -p ucs --release --test loom_async --target-dir target/loom`
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use ucs::async_::{BlockState, Events};

const ASYNC: u64 = 1;
const USER: u64 = 2;
const POLLER: u64 = 3;

/// Shared observation state of one model run, for up to two handlers (ids 0 and 1).
#[derive(Default)]
struct Probe {
    /// A user currently holds the block (set after block() returns, cleared before unblock).
    user_blocked: AtomicBool,
    /// A handler is running.
    running: AtomicBool,
    signals: [AtomicUsize; 2],
    handled: [AtomicUsize; 2],
    /// Signals of the handler visible when it last ran.
    last_seen: [AtomicUsize; 2],
}

impl Probe {
    fn handler(&self) -> impl FnMut(u64, Events) + '_ {
        move |id, ev| {
            assert!(!self.user_blocked.load(SeqCst), "handler ran while blocked");
            assert!(!self.running.swap(true, SeqCst), "handlers ran concurrently");
            assert!(ev.contains(Events::READ));
            let i = id as usize;
            self.handled[i].fetch_add(1, SeqCst);
            self.last_seen[i].store(self.signals[i].load(SeqCst), SeqCst);
            self.running.store(false, SeqCst);
        }
    }

    fn signal(&self, b: &BlockState, token: u64, id: u64) {
        self.signals[id as usize].fetch_add(1, SeqCst);
        b.dispatch(token, id, Events::READ, self.handler());
    }

    fn user_block(&self, b: &BlockState) {
        b.block(USER);
        self.user_blocked.store(true, SeqCst);
    }

    fn user_unblock(&self, b: &BlockState) {
        self.user_blocked.store(false, SeqCst);
        b.unblock(USER, self.handler());
    }
}

#[test]
fn single_signal_vs_block() {
    loom::model(|| {
        let b = Arc::new(BlockState::new());
        let p = Arc::new(Probe::default());
        let t = {
            let (b, p) = (Arc::clone(&b), Arc::clone(&p));
            thread::spawn(move || p.signal(&b, ASYNC, 0))
        };
        p.user_block(&b);
        p.user_unblock(&b);
        t.join().unwrap();
        assert_eq!(p.handled[0].load(SeqCst), 1, "lost or duplicated");
        assert_eq!(p.last_seen[0].load(SeqCst), 1);
        assert!(!b.has_missed());
        assert!(!b.is_blocked());
    });
}

#[test]
fn two_signals_vs_nested_block_with_inner_dispatch() {
    loom::model(|| {
        let b = Arc::new(BlockState::new());
        let p = Arc::new(Probe::default());
        let t = {
            let (b, p) = (Arc::clone(&b), Arc::clone(&p));
            thread::spawn(move || {
                p.signal(&b, ASYNC, 0);
                p.signal(&b, ASYNC, 0);
            })
        };
        p.user_block(&b);
        b.block(USER);
        // A poll by the holder itself: must be queued, not run.
        p.signal(&b, USER, 1);
        assert_eq!(p.handled[1].load(SeqCst), 0);
        b.unblock(USER, |_, _| panic!("inner unblock must not replay"));
        p.user_unblock(&b);
        t.join().unwrap();
        // Merged signals of one handler may be handled once; the last handling saw both.
        let h0 = p.handled[0].load(SeqCst);
        assert!((1..=2).contains(&h0), "handled {h0} times for 2 signals");
        assert_eq!(p.last_seen[0].load(SeqCst), 2, "second signal lost");
        assert_eq!(p.handled[1].load(SeqCst), 1);
        assert!(!b.has_missed());
    });
}

#[test]
fn two_dispatchers_vs_block() {
    loom::model(|| {
        let b = Arc::new(BlockState::new());
        let p = Arc::new(Probe::default());
        let spawn_signal = |token: u64, id: u64| {
            let (b, p) = (Arc::clone(&b), Arc::clone(&p));
            thread::spawn(move || p.signal(&b, token, id))
        };
        // The async thread and a user thread inside poll() deliver different handlers.
        let t1 = spawn_signal(ASYNC, 0);
        let t2 = spawn_signal(POLLER, 1);
        p.user_block(&b);
        p.user_unblock(&b);
        t1.join().unwrap();
        t2.join().unwrap();
        for i in 0..2 {
            assert_eq!(p.handled[i].load(SeqCst), 1, "handler {i} lost or duplicated");
        }
        assert!(!b.has_missed());
        assert!(!b.is_blocked());
    });
}

#[test]
fn removed_handler_missed_event_is_dropped() {
    loom::model(|| {
        let b = Arc::new(BlockState::new());
        let p = Arc::new(Probe::default());
        p.user_block(&b);
        let t = {
            let (b, p) = (Arc::clone(&b), Arc::clone(&p));
            thread::spawn(move || p.signal(&b, ASYNC, 0))
        };
        t.join().unwrap();
        assert!(b.has_missed());
        b.remove_missed(0);
        p.user_unblock(&b);
        assert_eq!(p.handled[0].load(SeqCst), 0);
        assert!(!b.has_missed());
    });
}
