//! Two processes that sleep in `Worker::wait` between messages (eager, rendezvous over cma,
//! wireup included), and futures completed by a tokio task that sleeps on the worker's
//! descriptor. The peer is this package's `ucp-peer wakeup`: it echoes every message back and
//! sleeps in `wait` whenever it has nothing to do; this side waits until the peer is asleep
//! (its state in `/proc`) before each message, so every message must wake it.

use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use tests::peer::{asleep, Peer};
use tests::text::{hex, pattern, unhex};
use tests::wakeup::{recv_sleeping, send_sleeping, PING, PONG, SIZES, TIMEOUT};
use ucp::{Context, ContextParams, Features, Status, Worker, WorkerParams, FULL_MASK};

/// The tests of this file run one at a time (the peers share two cores with them).
static SERIAL: Mutex<()> = Mutex::new(());

fn context(tls: &str, features: Features) -> Context {
    uct_shm::register();
    uct_tcp::register();
    Context::new(&ContextParams::new(features).with_config("TLS", tls).with_config("NET_DEVICES", "lo")).unwrap()
}

/// Starts an echoing peer for `rounds` messages over `tls`; returns it and its worker address.
fn spawn(w: &Worker, rounds: usize, tls: &str) -> (Peer, Vec<u8>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ucp-peer"));
    cmd.args(["wakeup", &hex(w.address()), &rounds.to_string()]).env("UCX_TLS", tls).env("UCX_NET_DEVICES", "lo");
    let mut peer = Peer::start(cmd, "ucp-peer wakeup");
    let addr = peer.expect("addr", TIMEOUT, || {});
    (peer, unhex(&addr).expect("an address in hex"))
}

/// The peer's report after the last round (how often it slept); it then exits.
fn finish(peer: &mut Peer) -> u64 {
    let n = peer.expect("sleeps", TIMEOUT, || {}).parse().expect("a count");
    let st = peer.finish(TIMEOUT, || {});
    assert!(st.success(), "peer failed: {st}");
    n
}

#[test]
fn two_processes_sleep_between_messages() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for tls in ["posix,cma", "tcp"] {
        sleep_between_messages(tls);
    }
}

fn sleep_between_messages(tls: &str) {
    let w = Worker::new(&context(tls, Features::TAG | Features::WAKEUP), &WorkerParams::new("main")).unwrap();
    let (mut peer, addr) = spawn(&w, SIZES.len(), tls);
    let ep = w.ep_create(&addr).unwrap();
    let mut sleeps = 0;
    for (i, &n) in SIZES.iter().enumerate() {
        // The peer falls asleep before each message: it has nothing to do.
        let t = Instant::now();
        while !asleep(peer.id(), peer.id()) {
            w.progress();
            assert!(t.elapsed() < TIMEOUT, "{tls}: the peer never fell asleep");
        }
        let data = pattern(n, i as u64);
        send_sleeping(&ep, &data, PING, &mut sleeps);
        let back = recv_sleeping(&w, PONG, &mut sleeps);
        assert!(back == data, "{tls}: {n} bytes came back different");
    }
    ep.close(ucp::CloseMode::Flush).unwrap();
    let peer_sleeps = finish(&mut peer);
    eprintln!("{tls}: slept: here {sleeps}, peer {peer_sleeps}");
    // A busy-polling peer would loop millions of times; one that sleeps wakes a few times per
    // message.
    assert!(peer_sleeps < 200 * SIZES.len() as u64, "{tls}: the peer did not sleep: {peer_sleeps} wakeups");
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
    let (mut peer, addr) = spawn(&w, SIZES.len(), "posix,cma");
    let ep = w.ep_create(&addr).unwrap();
    let pid = peer.id();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().unwrap();
    rt.block_on(async {
        // From here on the futures do not progress the worker: only `drive` does.
        let _driver = w.progress_driver();
        let work = async {
            for (i, &n) in SIZES.iter().enumerate() {
                // The peer falls asleep before each message: it has nothing to do.
                while !asleep(pid, pid) {
                    tokio::task::yield_now().await;
                }
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
    finish(&mut peer);
}
