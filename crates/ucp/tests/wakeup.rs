//! Worker wakeup: the event descriptor, arm (`Busy` while events are pending), wait, and signal
//! from another thread; two processes that sleep in `wait` between messages (eager,
//! rendezvous over cma, wireup included); and futures completed by a tokio task that sleeps
//! on the worker's descriptor.
//!
//! The peer is this test binary run again (`wakeup_peer`): it echoes every message back and
//! sleeps in `Worker::wait` whenever it has nothing to do.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{hex, pattern, unhex};
use ucp::{
    Context, ContextParams, Endpoint, Features, RecvData, RecvResult, RequestParam, SendData, Status, Worker,
    WorkerParams, FULL_MASK,
};

/// The tests of this file run one at a time (the peers share two cores with them).
static SERIAL: Mutex<()> = Mutex::new(());

const PEER_ENV: &str = "UCP_WAKEUP_PEER_ADDR";
const TIMEOUT: Duration = Duration::from_secs(30);
const PING: u64 = 1;
const PONG: u64 = 2;
/// Sizes that take eager short, eager bcopy, multi-fragment eager and rendezvous.
const SIZES: [usize; 5] = [8, 3000, 20_000, 300_000, 1 << 20];

fn context(tls: &str, features: Features) -> Context {
    uct_shm::register();
    Context::new(&ContextParams::new(features).with_config("TLS", tls)).unwrap()
}

/// Progresses until `done`, sleeping in `wait` whenever progress finds nothing; returns how
/// many times it slept (or found events pending at arm time).
fn wait_until(w: &Worker, mut done: impl FnMut() -> bool) -> u64 {
    let t = Instant::now();
    let mut sleeps = 0;
    loop {
        while w.progress() > 0 {}
        if done() {
            return sleeps;
        }
        assert!(t.elapsed() < TIMEOUT, "nothing completed in {TIMEOUT:?}");
        // Every wait here ends with an event: running out means a wakeup was lost.
        assert!(w.wait_timeout(Some(TIMEOUT)).unwrap(), "slept {TIMEOUT:?} through an event");
        sleeps += 1;
    }
}

/// Receives one message of up to 1 MiB with `tag`, sleeping while it waits.
fn recv_sleeping(w: &Worker, tag: u64, sleeps: &mut u64) -> Vec<u8> {
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: `buf` outlives the request, which is waited for below.
    let r = unsafe { w.tag_recv_nbx(RecvData::Contig(&mut buf), tag, FULL_MASK, RequestParam::new()) }.unwrap();
    let len = match r {
        RecvResult::Done(info) => info.length,
        RecvResult::Pending(req) => {
            *sleeps += wait_until(w, || req.is_completed());
            assert_eq!(req.status(), Status::Ok);
            req.recv_info().unwrap().length
        }
    };
    buf.truncate(len);
    buf
}

/// Sends `data` with `tag`, sleeping until the send completed.
fn send_sleeping(ep: &Endpoint, data: &[u8], tag: u64, sleeps: &mut u64) {
    // SAFETY: `data` outlives the request, which is waited for below.
    let r = unsafe { ep.tag_send_nbx(SendData::Contig(data), tag, RequestParam::new()) }.unwrap();
    if let Some(req) = r {
        *sleeps += wait_until(ep.worker(), || req.is_completed());
        assert_eq!(req.status(), Status::Ok);
    }
}

/// A peer process that echoes messages back.
struct Peer {
    child: Child,
    addr: Vec<u8>,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Peer {
    fn spawn(w: &Worker, rounds: usize) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "wakeup_peer", "--nocapture", "--test-threads", "1"])
            .env(PEER_ENV, format!("{} {rounds}", hex(w.address())))
            .env("UCX_TLS", "posix,cma")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = loop {
            let l = lines.next().expect("peer exited before printing its address").unwrap();
            if let Some(at) = l.find("PEER< addr ") {
                break unhex(&l[at + 11..]);
            }
        };
        Peer { child, addr, lines }
    }

    /// The peer's report line after the last round: how often it slept.
    fn finish(mut self) -> u64 {
        for l in self.lines.by_ref() {
            let l = l.unwrap();
            if let Some(at) = l.find("PEER< sleeps ") {
                let n = l[at + 13..].trim().parse().unwrap();
                let st = self.child.wait().unwrap();
                assert!(st.success(), "peer failed: {st}");
                return n;
            }
        }
        panic!("peer exited without a report: {:?}", self.child.wait());
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The peer process: echoes `rounds` messages (PING in, PONG out), sleeping in `wait`.
#[test]
fn wakeup_peer() {
    let Ok(env) = std::env::var(PEER_ENV) else { return };
    let (addr, rounds) = env.split_once(' ').unwrap();
    let rounds: usize = rounds.parse().unwrap();
    let ctx = context("posix,cma", Features::TAG | Features::WAKEUP);
    let w = Worker::new(&ctx, &WorkerParams::new("wakeup-peer")).unwrap();
    println!("PEER< addr {}", hex(w.address()));
    let ep = w.ep_create(&unhex(addr)).unwrap();
    let mut sleeps = 0;
    for _ in 0..rounds {
        let m = recv_sleeping(&w, PING, &mut sleeps);
        send_sleeping(&ep, &m, PONG, &mut sleeps);
    }
    println!("PEER< sleeps {sleeps}");
    ep.close(ucp::CloseMode::Flush).unwrap();
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
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
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
fn two_processes_sleep_between_messages() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = Worker::new(&context("posix,cma", Features::TAG | Features::WAKEUP), &WorkerParams::new("main")).unwrap();
    let peer = Peer::spawn(&w, SIZES.len());
    let ep = w.ep_create(&peer.addr).unwrap();
    let mut sleeps = 0;
    for (i, &n) in SIZES.iter().enumerate() {
        // Let the peer fall asleep first.
        std::thread::sleep(Duration::from_millis(100));
        let data = pattern(n, i as u64);
        send_sleeping(&ep, &data, PING, &mut sleeps);
        let back = recv_sleeping(&w, PONG, &mut sleeps);
        assert!(back == data, "{n} bytes came back different");
    }
    ep.close(ucp::CloseMode::Flush).unwrap();
    let peer_sleeps = peer.finish();
    eprintln!("slept: here {sleeps}, peer {peer_sleeps}");
    // A busy-polling peer would have looped millions of times in the pauses above; one that
    // sleeps wakes a few times per message.
    assert!(peer_sleeps < 200 * SIZES.len() as u64, "the peer did not sleep: {peer_sleeps} wakeups");
    assert!(sleeps > 0);
}

/// Sleeps on the worker's descriptor and progresses it whenever it becomes readable.
async fn drive(w: &Worker) -> ! {
    let src = w.event_source().unwrap();
    // SAFETY: the event source keeps the worker, and so its descriptor, open while registered.
    let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(src, tokio::io::Interest::READABLE) }.unwrap();
    loop {
        while w.progress() > 0 {}
        match w.arm() {
            Ok(()) => fd.readable().await.unwrap().clear_ready(),
            Err(Status::Busy) => tokio::task::yield_now().await,
            Err(e) => panic!("arm: {e}"),
        }
    }
}

#[test]
fn futures_driven_by_a_task_on_the_descriptor() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = Worker::new(&context("posix,cma", Features::TAG | Features::WAKEUP), &WorkerParams::new("tokio")).unwrap();
    let peer = Peer::spawn(&w, SIZES.len());
    let ep = w.ep_create(&peer.addr).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().unwrap();
    rt.block_on(async {
        // From here on the futures do not progress the worker: only `drive` does.
        let _driver = w.progress_driver();
        let work = async {
            for (i, &n) in SIZES.iter().enumerate() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let data = pattern(n, 100 + i as u64);
                let pong = w.tag_recv(vec![0u8; 1 << 20], PONG, FULL_MASK);
                let (data, r) = ep.tag_send(data, PING).await;
                r.unwrap();
                let (mut back, r) = pong.await;
                back.truncate(r.unwrap().length);
                assert!(back == data, "{n} bytes came back different");
            }
        };
        tokio::select! {
            _ = drive(&w) => {}
            r = tokio::time::timeout(TIMEOUT, work) => r.expect("the exchange timed out"),
        }
    });
    ep.close(ucp::CloseMode::Flush).unwrap();
    peer.finish();
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
