//! Worker wakeup in one process: the event descriptor, arm (`Busy` while events are pending),
//! wait, signal from another thread, and futures progressed by another thread. Two processes
//! that sleep in `wait` between messages, and futures completed by a tokio task that sleeps on
//! the worker's descriptor, are in the `tests` package (`tests/ucp_wakeup.rs`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ucp::{
    Context, ContextParams, Features, RecvData, RecvResult, RequestParam, SendData, Status, Worker, WorkerParams,
    FULL_MASK,
};

/// The tests of this file run one at a time (two of them keep a second thread busy).
static SERIAL: Mutex<()> = Mutex::new(());

const TIMEOUT: Duration = Duration::from_secs(30);

/// Deterministic test data: `n` bytes depending on `seed`.
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n).map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed * 7 + 1) as u8).collect()
}

fn context(tls: &str, features: Features) -> Context {
    uct_shm::register();
    Context::new(&ContextParams::new(features).with_config("TLS", tls)).unwrap()
}

/// True when thread `tid` of this process is blocked in the kernel (state `S`, e.g. in
/// `epoll_wait`).
fn asleep(tid: libc::pid_t) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("S")
}

#[test]
fn needs_the_feature() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = Worker::new(&context("self", Features::TAG), &WorkerParams::new("no-wakeup")).unwrap();
    assert_eq!(w.event_fd(), Err(Status::InvalidParam));
    assert_eq!(w.arm(), Err(Status::InvalidParam));
    assert_eq!(w.wait(), Err(Status::InvalidParam));
    assert_eq!(w.signal(), Err(Status::InvalidParam));
}

#[test]
fn signal_wakes_a_waiter_on_another_thread() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = Worker::new(&context("self", Features::TAG | Features::WAKEUP), &WorkerParams::new("signal")).unwrap();
    assert!(w.event_fd().unwrap() >= 0);

    // A signal makes the next arm busy, once.
    w.signal().unwrap();
    assert_eq!(w.arm(), Err(Status::Busy));
    assert_eq!(w.arm(), Ok(()));
    // Nothing pending: a short wait runs out.
    assert_eq!(w.wait_timeout(Some(Duration::from_millis(20))), Ok(false));

    // A single-threaded worker still accepts signals from other threads.
    let other = w.clone();
    // SAFETY: gettid has no preconditions.
    let waiter = unsafe { libc::gettid() };
    let t = std::thread::spawn(move || {
        // Signal once the waiter sleeps (or after a while if it never seems to: the wait below
        // must return either way).
        let t = Instant::now();
        while !asleep(waiter) && t.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        other.signal().unwrap();
        // Everything else is refused from this thread.
        assert_eq!(other.arm(), Err(Status::InvalidParam));
    });
    assert_eq!(w.wait_timeout(Some(TIMEOUT)), Ok(true), "the signal did not wake the waiter");
    t.join().unwrap();
}

#[test]
fn arm_is_busy_while_a_message_waits() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = Features::TAG | Features::WAKEUP;
    let rx = Worker::new(&context("posix", f), &WorkerParams::new("rx")).unwrap();
    let tx = Worker::new(&context("posix", f), &WorkerParams::new("tx")).unwrap();
    let ep = tx.ep_create(rx.address()).unwrap();
    let fd = rx.event_fd().unwrap();
    let readable = || {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, count 1, no timeout.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r == 1 && p.revents & libc::POLLIN != 0
    };
    let mut buf = [0u8; 64];
    let mut first = true;
    for round in 0..3u64 {
        // Drain, arm: nothing pending, the descriptor is quiet.
        let t = Instant::now();
        while rx.arm() == Err(Status::Busy) {
            rx.progress();
            tx.progress();
            assert!(t.elapsed() < TIMEOUT);
        }
        assert!(!readable(), "round {round}: readable right after a successful arm");
        // SAFETY: the data outlives the send, waited for below.
        let s = unsafe { ep.tag_send_nbx(SendData::Contig(b"hello"), 7, RequestParam::new()) }.unwrap();
        if first {
            // The first send waits for wireup, which needs the receiver's progress.
            first = false;
            if let Some(req) = s {
                let t = Instant::now();
                while !req.is_completed() {
                    tx.progress();
                    rx.progress();
                    assert!(t.elapsed() < TIMEOUT);
                }
            }
            // SAFETY: `buf` outlives the request, waited for below.
            let r = unsafe { rx.tag_recv_nbx(RecvData::Contig(&mut buf), 7, FULL_MASK, RequestParam::new()) }.unwrap();
            if let RecvResult::Pending(r) = r {
                r.wait().unwrap();
            }
            continue;
        }
        assert!(s.is_none(), "an eager short send completes at once");
        assert!(readable(), "round {round}: a message arrived after arm but the descriptor is quiet");
        assert_eq!(rx.arm(), Err(Status::Busy), "round {round}: arm with a message waiting");
        // SAFETY: `buf` outlives the request, waited for below.
        let r = unsafe { rx.tag_recv_nbx(RecvData::Contig(&mut buf), 7, FULL_MASK, RequestParam::new()) }.unwrap();
        let info = match r {
            RecvResult::Done(i) => i,
            RecvResult::Pending(r) => r.wait().unwrap(),
        };
        assert_eq!(&buf[..info.length], b"hello");
    }
}

#[test]
fn futures_driven_by_another_thread() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    uct_shm::register();
    let p = ContextParams::new(Features::TAG | Features::WAKEUP)
        .with_config("TLS", "self")
        .with_config("RNDV_THRESH", "1000")
        .with_config("RNDV_SCHEME", "am");
    let w = Worker::new(&Context::new(&p).unwrap(), &WorkerParams::new("multi").thread_mode(ucp::ThreadMode::Multi))
        .unwrap();
    let ep = w.ep_create(w.address()).unwrap();
    let driver = w.progress_driver();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t = {
        let (w, stop) = (w.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                while w.progress() > 0 {}
                // Operations posted by the other thread do not signal: wake now and then.
                w.wait_timeout(Some(Duration::from_millis(1))).unwrap();
            }
        })
    };
    let t0 = Instant::now();
    for (i, n) in [8usize, 100_000, 3000, 250_000].into_iter().cycle().take(40).enumerate() {
        let data = pattern(n, i as u64);
        let recv = w.tag_recv(vec![0u8; n], i as u64, FULL_MASK);
        let send = ep.tag_send(data.clone(), i as u64);
        let ((back, r), (_, s)) = ucp::block_on(async { (recv.await, send.await) });
        s.unwrap();
        assert_eq!(r.unwrap().length, n);
        assert!(back == data, "round {i}: {n} bytes differ");
        assert!(t0.elapsed() < TIMEOUT, "stalled");
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    t.join().unwrap();
    drop(driver);
    ep.close(ucp::CloseMode::Flush).unwrap();
}
