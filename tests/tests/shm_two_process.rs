//! `posix`, `sysv` and `cma` between two real processes: the other one is this package's
//! `shm-peer` program, and the two exchange addresses and keys over its stdin and stdout.
//! Scenarios that busy-poll hold a lock so they never run in parallel.

use std::cell::{Cell, RefCell};
use std::process::Command;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tests::peer::Peer;
use tests::text::{hex, unhex};
use uct::{AmRecv, EpParams, Iface, IfaceParams, Outcome, SendFlags, Status, Worker};

static SERIAL: Mutex<()> = Mutex::new(());
const TIMEOUT: Duration = Duration::from_secs(60);
/// Messages the `sender` peer sends.
const COUNT: u64 = 100_000;

fn open(tl: &str, worker: &Worker) -> Box<dyn Iface> {
    uct_shm::register();
    let (_md, iface) = uct::iface_open_by_name(worker, &format!("{tl}/memory"), IfaceParams::default()).unwrap();
    iface.progress_enable(uct::ProgressFlags::SEND | uct::ProgressFlags::RECV);
    iface
}

fn spawn_peer(role: &str, tl: &str) -> Peer {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shm-peer"));
    cmd.args([role, tl]);
    Peer::start(cmd, &format!("shm-peer {role} {tl}"))
}

/// The hex fields of a peer's line.
fn fields(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').map(|f| unhex(f).unwrap_or_else(|| panic!("not hex: {line}"))).collect()
}

fn no_progress() {}

fn stream_from_child(tl: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let worker = Worker::default();
    let iface = open(tl, &worker);
    let next = Rc::new(Cell::new(0u64));
    let bad = Rc::new(RefCell::new(None::<String>));
    let (n2, b2) = (next.clone(), bad.clone());
    iface
        .set_am_handler(
            1,
            Some(Rc::new(move |m: AmRecv<'_>| {
                let d = m.data();
                let seq = u64::from_ne_bytes(d[..8].try_into().unwrap());
                let ok = seq == n2.get()
                    && if seq % 2 == 0 {
                        d.len() == 16 && d[8..] == seq.to_le_bytes()
                    } else {
                        d.len() == 200 && d[8..].iter().all(|&x| x == seq as u8)
                    };
                if !ok && b2.borrow().is_none() {
                    *b2.borrow_mut() = Some(format!("message {seq} (expected {}), {} bytes", n2.get(), d.len()));
                }
                n2.set(seq + 1);
            })),
        )
        .unwrap();
    let mut peer = spawn_peer("sender", tl);
    peer.tell(&format!("addr {} {}", hex(&iface.device_address()), hex(&iface.iface_address())));
    let start = Instant::now();
    while next.get() < COUNT {
        worker.progress();
        assert!(start.elapsed() < TIMEOUT, "{tl}: received only {} of {COUNT}", next.get());
    }
    assert_eq!(peer.expect("sent", TIMEOUT, no_progress), COUNT.to_string());
    let status = peer.finish(TIMEOUT, no_progress);
    assert!(status.success(), "{tl}: sender failed: {status}");
    assert_eq!(*bad.borrow(), None, "{tl}: corrupted or reordered");
    for _ in 0..100 {
        worker.progress();
    }
    assert_eq!(next.get(), COUNT, "{tl}: extra messages");
}

fn receiver_killed(tl: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut peer = spawn_peer("receiver", tl);
    let addr = fields(&peer.expect("addr", TIMEOUT, no_progress));
    let worker = Worker::default();
    uct_shm::register();
    let failures: Rc<RefCell<Vec<(u64, Status)>>> = Rc::default();
    let f2 = failures.clone();
    let params =
        IfaceParams { err_handler: Some(Rc::new(move |ud, st| f2.borrow_mut().push((ud, st)))), ..Default::default() };
    let (_md, iface) = uct::iface_open_by_name(&worker, &format!("{tl}/memory"), params).unwrap();
    let ep = iface.ep_create(&EpParams::to_iface(&addr[0], &addr[1]).with_user_data(77)).unwrap();
    // Stream until the receiver stops progressing and the FIFO is full.
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < 1000 || ep.am_short(1, sent, &[]) != Ok(Outcome::NoResource) {
        if ep.am_short(1, sent, &[]) == Ok(Outcome::Done(())) {
            sent += 1;
        }
        assert!(start.elapsed() < TIMEOUT, "{tl}: receiver never filled up");
    }
    let _ = peer.expect("received", TIMEOUT, no_progress);
    assert_eq!(ep.check(None), Ok(Outcome::Done(())), "{tl}: a live peer passes the check");
    peer.kill();
    // The survivor keeps going: sends fail with an endpoint error, the handler hears of it once.
    let start = Instant::now();
    let err = loop {
        match ep.am_short(1, 0, &[]) {
            // The receiver may have freed a few slots before it stopped: those sends succeed,
            // then the FIFO is full for good and the peer check finds the process gone.
            Ok(Outcome::NoResource | Outcome::Done(())) => {
                assert!(start.elapsed() < TIMEOUT, "{tl}: dead peer never detected")
            }
            Err(e) => break e,
            other => panic!("{tl}: unexpected {other:?}"),
        }
    };
    assert_eq!(err, Status::ConnectionReset);
    assert_eq!(*failures.borrow(), [(77, Status::ConnectionReset)]);
    assert_eq!(ep.check(None), Err(Status::ConnectionReset));
    let r = ep.am_bcopy(1, &mut |_: &mut [u8]| 0, SendFlags::empty());
    assert_eq!(r, Err(Status::ConnectionReset));
    drop(ep);
    drop(iface);
}

/// cma against a peer process that is killed: queued and later operations complete with
/// `ConnectionReset`, the error handler hears of it once, the survivor goes on.
#[test]
fn cma_peer_killed() {
    uct_shm::register();
    if uct::unavailable_components().iter().any(|(n, _)| *n == "cma") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut peer = spawn_peer("cma-target", "cma");
    let parts = fields(&peer.expect("addr", TIMEOUT, no_progress));
    let worker = Worker::default();
    let failures: Rc<RefCell<Vec<(u64, Status)>>> = Rc::default();
    let f2 = failures.clone();
    let params =
        IfaceParams { err_handler: Some(Rc::new(move |ud, st| f2.borrow_mut().push((ud, st)))), ..Default::default() };
    let (md, iface) = uct::iface_open_by_name(&worker, "cma/memory", params).unwrap();
    iface.progress_enable(uct::ProgressFlags::SEND);
    let ep = iface.ep_create(&EpParams::to_iface(&parts[0], &parts[1]).with_user_data(5)).unwrap();
    let rkey = md.component().rkey_unpack(&parts[2]).unwrap();
    let mut src = vec![7u8; 4096];
    let iov = [uct::Iov::new(src.as_mut_ptr(), src.len(), None)];
    let put = |comp: &Rc<uct::Completion>| {
        // SAFETY: `src` outlives every operation (waited for below).
        unsafe { ep.put_zcopy(&iov, rkey.base(), &rkey, Some(comp)) }
    };
    let wait = |comp: &Rc<uct::Completion>| {
        let start = Instant::now();
        while comp.count() > 0 {
            worker.progress();
            assert!(start.elapsed() < TIMEOUT, "cma operation never completed");
        }
        comp.status()
    };
    let comp = uct::Completion::counter(1);
    assert_eq!(put(&comp), Ok(Outcome::InProgress));
    assert_eq!(wait(&comp), Status::Ok, "a put to a live peer succeeds");
    // Out of the peer's region: refused before reaching the kernel.
    // SAFETY: refused before anything is queued; `src` outlives the call anyway.
    let r = unsafe { ep.put_zcopy(&iov, rkey.base() + (1 << 16) - 100, &rkey, None) };
    assert_eq!(r, Err(Status::OutOfRange));
    peer.kill();
    let comp = uct::Completion::counter(1);
    assert_eq!(put(&comp), Ok(Outcome::InProgress));
    assert_eq!(wait(&comp), Status::ConnectionReset, "a put to a dead peer fails the endpoint");
    assert_eq!(*failures.borrow(), [(5, Status::ConnectionReset)]);
    assert_eq!(put(&uct::Completion::counter(1)), Err(Status::ConnectionReset));
    assert_eq!(ep.check(None), Err(Status::ConnectionReset));
}

/// Put, get and atomics into memory a peer process allocated.
fn rma_into_peer(tl: &str) {
    use uct::AtomicOp;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut peer = spawn_peer("rma-target", tl);
    let key = fields(&peer.expect("key", TIMEOUT, no_progress)).remove(0);
    let worker = Worker::default();
    let iface = open(tl, &worker);
    let (md, _) = uct::find_resource(&format!("{tl}/memory")).unwrap();
    let rkey = md.component().rkey_unpack(&key).unwrap();
    let ep = iface.ep_create(&EpParams::to_iface(&iface.device_address(), &iface.iface_address())).unwrap();
    let base = rkey.base();
    let data: Vec<u8> = (0..100u8).collect();
    assert_eq!(ep.put_short(&data, base, &rkey), Ok(Outcome::Done(())));
    let mut back = [0u8; 8];
    assert_eq!(ep.get_short(&mut back, base + 2048, &rkey), Ok(Outcome::Done(())));
    assert_eq!(u64::from_ne_bytes(back), 0x1122_3344_5566_7788, "{tl}: get of the peer's value");
    assert_eq!(ep.put_short(&1000u64.to_ne_bytes(), base + 1024, &rkey), Ok(Outcome::Done(())));
    let mut old = 0u64;
    // SAFETY: `old` lives across the call; shared-memory atomics complete immediately.
    let r = unsafe { ep.atomic64_fetch(AtomicOp::Add, 5, &mut old, base + 1024, &rkey, None) };
    assert_eq!((r, old), (Ok(Outcome::Done(())), 1000), "{tl}: fetch-add in the peer's memory");
    assert_eq!(ep.put_short(&0xffff_0000u32.to_ne_bytes(), base + 1040, &rkey), Ok(Outcome::Done(())));
    assert_eq!(ep.atomic32_post(AtomicOp::Xor, 0x0f0f, base + 1040, &rkey), Ok(Outcome::Done(())));
    assert_eq!(ep.put_short(&data, base + 4096 - 50, &rkey), Err(Status::OutOfRange), "{tl}: past the region");
    assert_eq!(peer.ask("check", TIMEOUT, no_progress), "verdict ok", "{tl}: the peer saw our writes");
    peer.tell("bye");
    assert!(peer.finish(TIMEOUT, no_progress).success());
}

#[test]
fn posix_rma_into_peer() {
    rma_into_peer("posix");
}

#[test]
fn sysv_rma_into_peer() {
    rma_into_peer("sysv");
}

/// A sender killed mid-stream: the receiver survives, keeps progressing, and keeps working with
/// other peers.
fn sender_killed(tl: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let worker = Worker::default();
    let rx = open(tl, &worker);
    let got = Rc::new(Cell::new(0u64));
    let g2 = got.clone();
    rx.set_am_handler(1, Some(Rc::new(move |_m: AmRecv<'_>| g2.set(g2.get() + 1)))).unwrap();
    let mut peer = spawn_peer("endless-sender", tl);
    peer.tell(&format!("addr {} {}", hex(&rx.device_address()), hex(&rx.iface_address())));
    let start = Instant::now();
    while got.get() < 10_000 {
        worker.progress();
        assert!(start.elapsed() < TIMEOUT, "{tl}: the sender never got going");
    }
    peer.kill();
    for _ in 0..100_000 {
        worker.progress();
    }
    // Still usable: another interface of ours reaches a fresh receiver, and we can send.
    let other = open(tl, &worker);
    let hits = Rc::new(Cell::new(0u32));
    let h2 = hits.clone();
    other.set_am_handler(2, Some(Rc::new(move |_m: AmRecv<'_>| h2.set(h2.get() + 1)))).unwrap();
    let ep = rx.ep_create(&EpParams::to_iface(&other.device_address(), &other.iface_address())).unwrap();
    assert_eq!(ep.am_short(2, 0, b"alive"), Ok(Outcome::Done(())));
    let start = Instant::now();
    while hits.get() == 0 {
        worker.progress();
        assert!(start.elapsed() < TIMEOUT, "{tl}: the survivor cannot talk to a new peer");
    }
}

#[test]
fn posix_sender_killed_midstream() {
    sender_killed("posix");
}

#[test]
fn sysv_sender_killed_midstream() {
    sender_killed("sysv");
}

#[test]
fn posix_stream_between_processes() {
    stream_from_child("posix");
}

#[test]
fn sysv_stream_between_processes() {
    stream_from_child("sysv");
}

#[test]
fn posix_receiver_killed_midstream() {
    receiver_killed("posix");
}

#[test]
fn sysv_receiver_killed_midstream() {
    receiver_killed("sysv");
}
