//! Integration tests of the async context with real eventfds, epoll and a real async thread.
//!
//! Every wait is bounded (channel `recv_timeout`, or a deadline loop that also yields); none
//! relies on sleeping for ordering.
#![cfg(not(loom))]

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ucs::async_::{AsyncContext, AsyncMode, EventFd, Events, HandlerId};
use ucs::Status;

const WAIT: Duration = Duration::from_secs(5);

/// Polls `cond` (calling `step` between tries) until it holds or `WAIT` elapses.
fn wait_until(mut cond: impl FnMut() -> bool, mut step: impl FnMut()) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        step();
        std::thread::yield_now();
    }
    cond()
}

/// A handler that drains `efd` and reports the events and its thread on `tx`.
fn reporting(efd: &Arc<EventFd>, tx: mpsc::Sender<(Events, std::thread::ThreadId)>) -> Box<dyn FnMut(Events) + Send> {
    let efd = Arc::clone(efd);
    Box::new(move |ev| {
        let _ = efd.drain();
        let _ = tx.send((ev, std::thread::current().id()));
    })
}

#[test]
fn send_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<AsyncContext>();
    send_sync::<ucs::async_::EventSet>();
    send_sync::<EventFd>();
    send_sync::<HandlerId>();
}

#[test]
fn thread_mode_eventfd_from_another_thread() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    assert_eq!(ctx.mode(), AsyncMode::Thread);
    assert!(!ctx.is_from_async());
    let efd = Arc::new(EventFd::new().unwrap());
    let (tx, rx) = mpsc::channel();
    let id = ctx.add_event_handler(efd.as_raw_fd(), Events::READ, reporting(&efd, tx)).unwrap();
    for _ in 0..3 {
        let e = Arc::clone(&efd);
        std::thread::spawn(move || e.signal().unwrap()).join().unwrap();
        let (ev, tid) = rx.recv_timeout(WAIT).expect("handler did not run");
        assert!(ev.contains(Events::READ));
        assert_ne!(tid, std::thread::current().id(), "runs on the async thread");
    }
    ctx.remove_handler(id, true).unwrap();
    // The handler box (and its sender) is gone once remove_handler(sync) returns.
    assert_eq!(rx.recv_timeout(WAIT), Err(RecvTimeoutError::Disconnected));
    assert_eq!(ctx.remove_handler(id, true), Err(Status::NoElem));
}

#[test]
fn poll_mode_eventfd_via_poll() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    let efd = Arc::new(EventFd::new().unwrap());
    let (tx, rx) = mpsc::channel();
    let id = ctx.add_event_handler(efd.as_raw_fd(), Events::READ, reporting(&efd, tx)).unwrap();
    assert_eq!(ctx.poll(), 0);
    for _ in 0..3 {
        let e = Arc::clone(&efd);
        std::thread::spawn(move || e.signal().unwrap()).join().unwrap();
        assert_eq!(ctx.poll(), 1);
        let (ev, tid) = rx.try_recv().expect("handler ran inside poll");
        assert!(ev.contains(Events::READ));
        assert_eq!(tid, std::thread::current().id());
        assert_eq!(ctx.poll(), 0, "drained: no further event");
    }
    ctx.remove_handler(id, false).unwrap();
    efd.signal().unwrap();
    assert_eq!(ctx.poll(), 0);
}

#[test]
fn level_triggered_rearms_until_drained() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    let efd = Arc::new(EventFd::new().unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let e = Arc::clone(&efd);
    ctx.add_event_handler(
        efd.as_raw_fd(),
        Events::READ,
        Box::new(move |_| {
            // Drain only on the second call: level-triggered must report again.
            if c.fetch_add(1, SeqCst) == 1 {
                let _ = e.drain();
            }
        }),
    )
    .unwrap();
    efd.signal().unwrap();
    assert_eq!(ctx.poll(), 1);
    assert_eq!(ctx.poll(), 1);
    assert_eq!(ctx.poll(), 0);
    assert_eq!(calls.load(SeqCst), 2);
}

#[test]
fn modify_event_and_bad_input() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    let efd = Arc::new(EventFd::new().unwrap());
    let (tx, rx) = mpsc::channel();
    let id = ctx.add_event_handler(efd.as_raw_fd(), Events::empty(), reporting(&efd, tx.clone())).unwrap();
    efd.signal().unwrap();
    assert_eq!(ctx.poll(), 0, "no events requested");
    ctx.modify_event(id, Events::READ).unwrap();
    assert_eq!(ctx.poll(), 1);
    assert!(rx.try_recv().is_ok());

    assert_eq!(
        ctx.add_event_handler(efd.as_raw_fd(), Events::READ, reporting(&efd, tx.clone())),
        Err(Status::AlreadyExists)
    );
    assert_eq!(ctx.add_event_handler(-1, Events::READ, Box::new(|_| {})).err(), Some(Status::InvalidParam));
    let timer = ctx.add_timer(Duration::from_secs(3600), Box::new(|| {})).unwrap();
    assert_eq!(ctx.modify_event(timer, Events::READ), Err(Status::InvalidParam));
    assert_eq!(ctx.add_timer(Duration::ZERO, Box::new(|| {})).err(), Some(Status::InvalidParam));
    ctx.remove_handler(id, false).unwrap();
    assert_eq!(ctx.modify_event(id, Events::READ), Err(Status::NoElem));
    ctx.remove_handler(timer, true).unwrap();
}

#[test]
fn thread_mode_timer_fires_and_stops() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let id = ctx
        .add_timer(
            Duration::from_millis(2),
            Box::new(move || {
                let _ = tx.send(Instant::now());
            }),
        )
        .unwrap();
    let mut last = start;
    for _ in 0..3 {
        let t = rx.recv_timeout(WAIT).expect("timer did not fire");
        assert!(t >= last);
        last = t;
    }
    assert!(last.duration_since(start) >= Duration::from_millis(6));
    ctx.remove_handler(id, true).unwrap();
    // Drain ticks sent before the removal; then the sender is gone.
    loop {
        match rx.recv_timeout(WAIT) {
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(e, RecvTimeoutError::Disconnected);
                break;
            }
        }
    }
}

#[test]
fn poll_mode_timer_fires_in_poll() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let t = Arc::clone(&ticks);
    let id = ctx
        .add_timer(
            Duration::from_millis(1),
            Box::new(move || {
                t.fetch_add(1, SeqCst);
            }),
        )
        .unwrap();
    assert!(wait_until(
        || ticks.load(SeqCst) >= 3,
        || {
            ctx.poll();
        }
    ));
    ctx.remove_handler(id, true).unwrap();
    let n = ticks.load(SeqCst);
    assert_eq!(ctx.poll(), 0);
    assert_eq!(ticks.load(SeqCst), n);
}

#[test]
fn thread_mode_block_defers_and_unblock_replays() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let efd = Arc::new(EventFd::new().unwrap());
    let (tx, rx) = mpsc::channel();
    ctx.add_event_handler(efd.as_raw_fd(), Events::READ, reporting(&efd, tx)).unwrap();
    {
        let outer = ctx.block();
        let inner = ctx.block();
        efd.signal().unwrap();
        // The async thread sees the event and records it instead of running the handler.
        assert!(wait_until(|| ctx.has_missed(), || {}));
        assert!(rx.try_recv().is_err(), "handler ran while blocked");
        drop(inner);
        assert!(ctx.has_missed(), "inner guard must not replay");
        assert!(rx.try_recv().is_err());
        drop(outer);
        // Replayed synchronously by this thread when the outermost guard dropped.
        let (ev, tid) = rx.try_recv().expect("missed event not replayed");
        assert!(ev.contains(Events::READ));
        assert_eq!(tid, std::thread::current().id());
        assert!(!ctx.has_missed());
    }
    // Re-armed after the replay: the async thread handles the next one.
    efd.signal().unwrap();
    let (_, tid) = rx.recv_timeout(WAIT).expect("not re-armed after replay");
    assert_ne!(tid, std::thread::current().id());
}

#[test]
fn poll_mode_block_defers_and_unblock_replays() {
    let ctx = AsyncContext::new(AsyncMode::Poll).unwrap();
    let efd = Arc::new(EventFd::new().unwrap());
    let (tx, rx) = mpsc::channel();
    ctx.add_event_handler(efd.as_raw_fd(), Events::READ, reporting(&efd, tx)).unwrap();
    let guard = ctx.block();
    efd.signal().unwrap();
    assert_eq!(ctx.poll(), 0, "poll respects the caller's own block");
    assert!(ctx.has_missed());
    assert!(rx.try_recv().is_err());
    drop(guard);
    assert!(rx.try_recv().is_ok());
    assert!(!ctx.has_missed());
    assert_eq!(ctx.poll(), 0);
}

#[test]
fn thread_mode_missed_replayed_by_poll_after_block_from_other_thread() {
    // A blocked timer tick is replayed by whoever ends the block; poll() then finds nothing.
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let blocked = Arc::new(AtomicBool::new(false));
    let violation = Arc::new(AtomicBool::new(false));
    let (t, b, v) = (Arc::clone(&ticks), Arc::clone(&blocked), Arc::clone(&violation));
    let id = ctx
        .add_timer(
            Duration::from_millis(1),
            Box::new(move || {
                // Handler panics are caught and logged by the context, so record instead.
                if b.load(SeqCst) {
                    v.store(true, SeqCst);
                }
                t.fetch_add(1, SeqCst);
            }),
        )
        .unwrap();
    let guard = ctx.block();
    blocked.store(true, SeqCst);
    let before = ticks.load(SeqCst);
    assert!(wait_until(|| ctx.has_missed(), || {}));
    assert_eq!(ticks.load(SeqCst), before);
    blocked.store(false, SeqCst);
    drop(guard);
    assert!(ticks.load(SeqCst) > before);
    ctx.remove_handler(id, true).unwrap();
    assert_eq!(ctx.poll(), 0);
    assert!(!violation.load(SeqCst), "timer ran while blocked");
}

#[test]
fn remove_handler_sync_from_inside_handlers() {
    for mode in [AsyncMode::Thread, AsyncMode::Poll] {
        let ctx = AsyncContext::new(mode).unwrap();
        let efd = Arc::new(EventFd::new().unwrap());
        let (tx, rx) = mpsc::channel();

        // An event handler removing itself.
        let own_id = Arc::new(OnceLock::<HandlerId>::new());
        let (c, me, e, tx1) = (Arc::clone(&ctx), Arc::clone(&own_id), Arc::clone(&efd), tx.clone());
        let id = ctx
            .add_event_handler(
                efd.as_raw_fd(),
                Events::READ,
                Box::new(move |_| {
                    let _ = e.drain();
                    let r = c.remove_handler(*me.get().unwrap(), true);
                    let _ = tx1.send(("event", r));
                }),
            )
            .unwrap();
        own_id.set(id).unwrap();

        // A timer removing itself.
        let timer_id = Arc::new(OnceLock::<HandlerId>::new());
        let (c, me, tx2) = (Arc::clone(&ctx), Arc::clone(&timer_id), tx);
        let tid = ctx
            .add_timer(
                Duration::from_millis(1),
                Box::new(move || {
                    let r = c.remove_handler(*me.get().unwrap(), true);
                    let _ = tx2.send(("timer", r));
                }),
            )
            .unwrap();
        timer_id.set(tid).unwrap();

        efd.signal().unwrap();
        let mut got = Vec::new();
        let ok = wait_until(
            || {
                while let Ok(m) = rx.try_recv() {
                    got.push(m);
                }
                got.len() >= 2
            },
            || {
                ctx.poll();
            },
        );
        assert!(ok, "{mode:?}: handlers did not run: {got:?}");
        got.sort_by_key(|m| m.0);
        assert_eq!(got, vec![("event", Ok(())), ("timer", Ok(()))], "{mode:?}");
        // Both boxes (holding the senders and context clones) are dropped once they returned.
        assert!(wait_until(|| matches!(rx.try_recv(), Err(mpsc::TryRecvError::Disconnected)), || {}));
        assert_eq!(Arc::strong_count(&ctx), 1, "{mode:?}: handler captures released");
    }
}

#[test]
fn remove_sync_waits_for_running_handler() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let efd = Arc::new(EventFd::new().unwrap());
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let finished = Arc::new(AtomicBool::new(false));
    let (e, f) = (Arc::clone(&efd), Arc::clone(&finished));
    let id = ctx
        .add_event_handler(
            efd.as_raw_fd(),
            Events::READ,
            Box::new(move |_| {
                let _ = e.drain();
                let _ = entered_tx.send(());
                let _ = release_rx.recv_timeout(WAIT);
                f.store(true, SeqCst);
            }),
        )
        .unwrap();
    efd.signal().unwrap();
    entered_rx.recv_timeout(WAIT).expect("handler did not start");
    // Release the handler only once remove_handler has taken it out of the table, i.e. while
    // remove_handler is (about to be) waiting for it.
    let releaser = {
        let ctx = Arc::clone(&ctx);
        std::thread::spawn(move || {
            assert!(wait_until(|| ctx.modify_event(id, Events::READ) == Err(Status::NoElem), || {}));
            let _ = release_tx.send(());
        })
    };
    ctx.remove_handler(id, true).unwrap();
    assert!(finished.load(SeqCst), "remove_handler(sync) returned while the handler ran");
    releaser.join().unwrap();
}

#[test]
fn handlers_never_overlap_and_no_event_is_lost() {
    const ROUNDS: usize = 300;
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let running = Arc::new(AtomicBool::new(false));
    let blocked = Arc::new(AtomicBool::new(false));
    let violation = Arc::new(AtomicBool::new(false));
    let fds: Vec<Arc<EventFd>> = (0..2).map(|_| Arc::new(EventFd::new().unwrap())).collect();
    let handled: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    for (efd, count) in fds.iter().zip(&handled) {
        let (e, c, r, b, v) =
            (Arc::clone(efd), Arc::clone(count), Arc::clone(&running), Arc::clone(&blocked), Arc::clone(&violation));
        ctx.add_event_handler(
            efd.as_raw_fd(),
            Events::READ,
            Box::new(move |_| {
                // Handler panics are caught and logged by the context, so record instead.
                if b.load(SeqCst) || r.swap(true, SeqCst) {
                    v.store(true, SeqCst);
                }
                let n = e.drain().unwrap_or(0);
                c.fetch_add(n as usize, SeqCst);
                r.store(false, SeqCst);
            }),
        )
        .unwrap();
    }
    let signaller = {
        let fds = fds.clone();
        std::thread::spawn(move || {
            for i in 0..ROUNDS {
                fds[i % 2].signal().unwrap();
            }
        })
    };
    for i in 0..ROUNDS {
        let g = ctx.block();
        blocked.store(true, SeqCst);
        if i % 3 == 0 {
            let _nested = ctx.block();
        }
        blocked.store(false, SeqCst);
        drop(g);
    }
    signaller.join().unwrap();
    // Every signal's count is eventually consumed by a handler.
    assert!(wait_until(
        || handled.iter().map(|h| h.load(SeqCst)).sum::<usize>() == ROUNDS,
        || {
            ctx.poll();
        }
    ));
    assert!(!violation.load(SeqCst), "handler overlapped or ran while blocked");
}

#[test]
fn drop_joins_thread_promptly() {
    for _ in 0..20 {
        let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
        let efd = Arc::new(EventFd::new().unwrap());
        let (tx, _rx) = mpsc::channel();
        ctx.add_event_handler(efd.as_raw_fd(), Events::READ, reporting(&efd, tx)).unwrap();
        ctx.add_timer(Duration::from_millis(1), Box::new(|| {})).unwrap();
        let start = Instant::now();
        drop(ctx);
        assert!(start.elapsed() < WAIT);
    }
}

#[test]
fn drop_last_reference_from_own_handler() {
    let ctx = AsyncContext::new(AsyncMode::Thread).unwrap();
    let (tx, rx) = mpsc::channel();
    let holder = Arc::new(std::sync::Mutex::new(Some(Arc::clone(&ctx))));
    let h = Arc::clone(&holder);
    ctx.add_timer(
        Duration::from_millis(1),
        Box::new(move || {
            // Drop the last user reference inside the handler: must not self-join.
            let last = h.lock().unwrap().take();
            drop(last);
            let _ = tx.send(());
        }),
    )
    .unwrap();
    drop(ctx);
    rx.recv_timeout(WAIT).expect("timer did not run");
    assert!(holder.lock().unwrap().is_none());
}
