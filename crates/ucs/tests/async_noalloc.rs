//! Once warm, the dispatch paths allocate nothing: callback queue dispatch, event set waits,
//! timer expiry, and a Poll-mode `AsyncContext::poll` that runs an event and a timer handler.
//!
//! `ucs::testing::CountingAlloc` counts per thread, so the test harness's own threads do not
//! disturb it.
#![cfg(not(loom))]

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ucs::async_::{AsyncContext, AsyncMode, EventFd, EventSet, Events, TimerQueue};
use ucs::callbackq::CallbackQueue;

#[global_allocator]
static GLOBAL: ucs::testing::CountingAlloc = ucs::testing::CountingAlloc;

/// Allocations made by `f` on this thread.
fn allocs_in(f: impl FnOnce()) -> usize {
    ucs::testing::count_allocations(f) as usize
}

#[test]
fn callbackq_dispatch_allocates_nothing() {
    let q = CallbackQueue::new();
    let hits = Arc::new(AtomicUsize::new(0));
    for _ in 0..8 {
        let h = Arc::clone(&hits);
        q.add(Box::new(move || {
            h.fetch_add(1, Relaxed);
            1
        }));
    }
    let r = q.remote();
    r.add(Box::new(|| 1));
    q.dispatch(); // warm: merges the remote add
    let n = allocs_in(|| {
        for _ in 0..1000 {
            assert_eq!(q.dispatch(), 9);
        }
    });
    assert_eq!(n, 0);
}

#[test]
fn event_set_and_timerq_allocate_nothing() {
    let set = EventSet::new().unwrap();
    let efd = EventFd::new().unwrap();
    set.add(efd.as_raw_fd(), Events::READ, 1).unwrap();
    let mut tq = TimerQueue::new();
    for id in 0..4 {
        tq.add(id, Duration::from_nanos(10 + id), 0);
    }
    let n = allocs_in(|| {
        for i in 0..100u64 {
            efd.signal().unwrap();
            let mut seen = 0;
            assert_eq!(set.wait(Some(Duration::ZERO), |_, _| seen += 1).unwrap(), 1);
            assert_eq!(seen, 1);
            assert_eq!(efd.drain().unwrap(), 1);
            tq.expire(i * 100, |_| {});
            assert!(tq.next_expiry().is_some());
        }
    });
    assert_eq!(n, 0);
}

#[test]
fn poll_mode_context_allocates_nothing_once_warm() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    let efd = Arc::new(EventFd::new().unwrap());
    let events = Arc::new(AtomicUsize::new(0));
    let ticks = Arc::new(AtomicUsize::new(0));
    let (e, c) = (Arc::clone(&efd), Arc::clone(&events));
    ctx.add_event_handler(
        efd.as_raw_fd(),
        Events::READ,
        Box::new(move |_| {
            let _ = e.drain();
            c.fetch_add(1, Relaxed);
        }),
    )
    .unwrap();
    let t = Arc::clone(&ticks);
    ctx.add_timer(
        Duration::from_micros(50),
        Box::new(move || {
            t.fetch_add(1, Relaxed);
        }),
    )
    .unwrap();
    // Warm up until both kinds ran, so every buffer reached its size.
    let deadline = Instant::now() + Duration::from_secs(5);
    while (events.load(Relaxed) < 2 || ticks.load(Relaxed) < 2) && Instant::now() < deadline {
        efd.signal().unwrap();
        ctx.poll();
    }
    assert!(events.load(Relaxed) >= 2 && ticks.load(Relaxed) >= 2);
    let (ev0, tk0) = (events.load(Relaxed), ticks.load(Relaxed));
    let n = allocs_in(|| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while ticks.load(Relaxed) < tk0 + 3 && Instant::now() < deadline {
            efd.signal().unwrap();
            ctx.poll();
        }
        // Idle polls (nothing ready, timer not due) too.
        let _ = ctx.poll();
    });
    assert!(events.load(Relaxed) > ev0);
    assert!(ticks.load(Relaxed) >= tk0 + 3);
    assert_eq!(n, 0);
}
