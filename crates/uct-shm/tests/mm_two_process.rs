//! `posix`, `sysv` and `cma` between two real processes: this test binary re-runs itself as the peer
//! (selected by `UCX_RS_TEST_PEER`), and the two exchange addresses over the child's stdin and
//! stdout. Scenarios that busy-poll hold a lock so they never run in parallel.

use std::cell::{Cell, RefCell};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uct::{AmRecv, EpParams, Iface, IfaceParams, Outcome, SendFlags, Status, Worker};

static SERIAL: Mutex<()> = Mutex::new(());
const TIMEOUT: Duration = Duration::from_secs(60);
const COUNT: u64 = 100_000;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()).collect()
}

fn open(tl: &str, worker: &Worker) -> Box<dyn Iface> {
    uct_shm::register();
    let (_md, iface) = uct::iface_open_by_name(worker, &format!("{tl}/memory"), IfaceParams::default()).unwrap();
    iface.progress_enable(uct::ProgressFlags::SEND | uct::ProgressFlags::RECV);
    iface
}

fn spawn_peer(role: &str, tl: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_entry", "--nocapture", "--test-threads=1"])
        .env("UCX_RS_TEST_PEER", format!("{role}:{tl}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the peer's line starting with `tag`, skipping test-harness output.
fn read_tagged(r: &mut impl BufRead, tag: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "peer closed its output before {tag}");
        // The test harness may print its own text before ours on the same line.
        if let Some(at) = line.find(tag) {
            return line[at + tag.len()..].trim().to_string();
        }
    }
}

/// The peer side; does nothing unless this process was started as a peer.
#[test]
fn peer_entry() {
    let Ok(spec) = std::env::var("UCX_RS_TEST_PEER") else { return };
    let (role, tl) = spec.split_once(':').unwrap();
    let worker = Worker::default();
    let iface = open(tl, &worker);
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    match role {
        // Sends COUNT messages (short and bcopy alternating) to the address read from stdin.
        "sender" => {
            let addr = read_tagged(&mut input, "ADDR ");
            let (dev, ifa) = addr.split_once(' ').unwrap();
            let ep = iface.ep_create(&EpParams::to_iface(&unhex(dev), &unhex(ifa))).unwrap();
            for seq in 0..COUNT {
                loop {
                    let r = if seq % 2 == 0 {
                        ep.am_short(1, seq, &seq.to_le_bytes())
                    } else {
                        ep.am_bcopy(
                            1,
                            &mut |b: &mut [u8]| {
                                b[..8].copy_from_slice(&seq.to_ne_bytes());
                                b[8..200].fill(seq as u8);
                                200
                            },
                            SendFlags::empty(),
                        )
                        .map(|o| o.map(|_| ()))
                    };
                    match r {
                        Ok(Outcome::Done(())) => break,
                        Ok(Outcome::NoResource) => {
                            worker.progress();
                        }
                        other => panic!("send {seq}: {other:?}"),
                    }
                }
            }
            println!("SENT {COUNT}");
        }
        // Prints its address, counts messages, and waits to be killed.
        "receiver" => {
            let got = Rc::new(Cell::new(0u64));
            let g2 = got.clone();
            iface.set_am_handler(1, Some(Rc::new(move |_m: AmRecv<'_>| g2.set(g2.get() + 1)))).unwrap();
            println!("ADDR {} {}", hex(&iface.device_address()), hex(&iface.iface_address()));
            std::io::stdout().flush().unwrap();
            let start = Instant::now();
            // Receive a little, then stop progressing: the sender's FIFO fills up.
            while got.get() < 1000 && start.elapsed() < TIMEOUT {
                worker.progress();
            }
            println!("RECEIVED {}", got.get());
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            let _ = input.read_line(&mut line); // until killed
        }
        // Registers a buffer, prints its address and key, and waits to be killed.
        "cma-target" => {
            let (md, tl_res) = uct::find_resource("cma/memory").unwrap();
            let _ = tl_res;
            let mut buf = vec![0u8; 1 << 16];
            // SAFETY: `buf` lives until this process is killed.
            let memh = unsafe { md.mem_reg(buf.as_mut_ptr(), buf.len(), uct::MemAccess::ALL) }.unwrap();
            let key = md.mkey_pack(&memh).unwrap();
            println!("ADDR {} {} {}", hex(&iface.device_address()), hex(&iface.iface_address()), hex(&key));
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            let _ = input.read_line(&mut line);
            drop(memh);
            drop(buf);
        }
        // Allocates a region, prints its key, and checks what the peer wrote when told to.
        "rma-target" => {
            let (md, _) = uct::find_resource(&format!("{tl}/memory")).unwrap();
            let memh = md.mem_alloc(4096, uct::MemAccess::ALL, "rma-target").unwrap();
            // SAFETY: 4096 bytes of our own allocation; the peer writes only while we wait.
            let region = unsafe { std::slice::from_raw_parts_mut(memh.address(), 4096) };
            region[2048..2056].copy_from_slice(&0x1122_3344_5566_7788u64.to_ne_bytes());
            println!("KEY {}", hex(&md.mkey_pack(&memh).unwrap()));
            std::io::stdout().flush().unwrap();
            let _ = read_tagged(&mut input, "CHECK");
            // SAFETY: as above; the peer is done writing (it said CHECK).
            let region = unsafe { std::slice::from_raw_parts(memh.address(), 4096) };
            let ok = region[..100].iter().enumerate().all(|(i, &b)| b == i as u8)
                && u64::from_ne_bytes(region[1024..1032].try_into().unwrap()) == 1000 + 5
                && u32::from_ne_bytes(region[1040..1044].try_into().unwrap()) == 0xffff_0000 ^ 0x0f0f;
            println!("VERDICT {}", if ok { "ok" } else { "bad" });
            std::io::stdout().flush().unwrap();
            let _ = read_tagged(&mut input, "BYE");
        }
        // Streams to the address read from stdin until killed.
        "endless-sender" => {
            let addr = read_tagged(&mut input, "ADDR ");
            let (dev, ifa) = addr.split_once(' ').unwrap();
            let ep = iface.ep_create(&EpParams::to_iface(&unhex(dev), &unhex(ifa))).unwrap();
            let start = Instant::now();
            let mut seq = 0u64;
            while start.elapsed() < TIMEOUT {
                if ep.am_short(1, seq, &[0u8; 32]) == Ok(Outcome::Done(())) {
                    seq += 1;
                } else {
                    worker.progress();
                }
            }
        }
        other => panic!("unknown peer role {other}"),
    }
}

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
    let mut child = spawn_peer("sender", tl);
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "ADDR {} {}", hex(&iface.device_address()), hex(&iface.iface_address())).unwrap();
    let start = Instant::now();
    while next.get() < COUNT {
        worker.progress();
        assert!(start.elapsed() < TIMEOUT, "{tl}: received only {} of {COUNT}", next.get());
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{tl}: sender failed: {status}");
    assert_eq!(*bad.borrow(), None, "{tl}: corrupted or reordered");
    for _ in 0..100 {
        worker.progress();
    }
    assert_eq!(next.get(), COUNT, "{tl}: extra messages");
}

fn receiver_killed(tl: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = spawn_peer("receiver", tl);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr = read_tagged(&mut out, "ADDR ");
    let (dev, ifa) = addr.split_once(' ').unwrap();
    let worker = Worker::default();
    uct_shm::register();
    let failures: Rc<RefCell<Vec<(u64, Status)>>> = Rc::default();
    let f2 = failures.clone();
    let params =
        IfaceParams { err_handler: Some(Rc::new(move |ud, st| f2.borrow_mut().push((ud, st)))), ..Default::default() };
    let (_md, iface) = uct::iface_open_by_name(&worker, &format!("{tl}/memory"), params).unwrap();
    let ep = iface.ep_create(&EpParams::to_iface(&unhex(dev), &unhex(ifa)).with_user_data(77)).unwrap();
    // Stream until the receiver stops progressing and the FIFO is full.
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < 1000 || ep.am_short(1, sent, &[]) != Ok(Outcome::NoResource) {
        if ep.am_short(1, sent, &[]) == Ok(Outcome::Done(())) {
            sent += 1;
        }
        assert!(start.elapsed() < TIMEOUT, "{tl}: receiver never filled up");
    }
    let _ = read_tagged(&mut out, "RECEIVED ");
    assert_eq!(ep.check(None), Ok(Outcome::Done(())), "{tl}: a live peer passes the check");
    child.kill().unwrap();
    child.wait().unwrap();
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
    if std::env::var("UCX_RS_TEST_PEER").is_ok() {
        return;
    }
    uct_shm::register();
    if uct::unavailable_components().iter().any(|(n, _)| *n == "cma") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = spawn_peer("cma-target", "cma");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let line = read_tagged(&mut out, "ADDR ");
    let parts: Vec<&str> = line.split(' ').collect();
    let worker = Worker::default();
    let failures: Rc<RefCell<Vec<(u64, Status)>>> = Rc::default();
    let f2 = failures.clone();
    let params =
        IfaceParams { err_handler: Some(Rc::new(move |ud, st| f2.borrow_mut().push((ud, st)))), ..Default::default() };
    let (md, iface) = uct::iface_open_by_name(&worker, "cma/memory", params).unwrap();
    iface.progress_enable(uct::ProgressFlags::SEND);
    let ep = iface.ep_create(&EpParams::to_iface(&unhex(parts[0]), &unhex(parts[1])).with_user_data(5)).unwrap();
    let rkey = md.component().rkey_unpack(&unhex(parts[2])).unwrap();
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
    child.kill().unwrap();
    child.wait().unwrap();
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
    let mut child = spawn_peer("rma-target", tl);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let key = unhex(&read_tagged(&mut out, "KEY "));
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
    writeln!(stdin, "CHECK").unwrap();
    assert_eq!(read_tagged(&mut out, "VERDICT "), "ok", "{tl}: the peer saw our writes");
    writeln!(stdin, "BYE").unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn posix_rma_into_peer() {
    if std::env::var("UCX_RS_TEST_PEER").is_err() {
        rma_into_peer("posix");
    }
}

#[test]
fn sysv_rma_into_peer() {
    if std::env::var("UCX_RS_TEST_PEER").is_err() {
        rma_into_peer("sysv");
    }
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
    let mut child = spawn_peer("endless-sender", tl);
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "ADDR {} {}", hex(&rx.device_address()), hex(&rx.iface_address())).unwrap();
    let start = Instant::now();
    while got.get() < 10_000 {
        worker.progress();
        assert!(start.elapsed() < TIMEOUT, "{tl}: the sender never got going");
    }
    child.kill().unwrap();
    child.wait().unwrap();
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
    if std::env::var("UCX_RS_TEST_PEER").is_err() {
        sender_killed("posix");
    }
}

#[test]
fn sysv_sender_killed_midstream() {
    if std::env::var("UCX_RS_TEST_PEER").is_err() {
        sender_killed("sysv");
    }
}

#[test]
fn posix_stream_between_processes() {
    if std::env::var("UCX_RS_TEST_PEER").is_err() {
        stream_from_child("posix");
    }
}

#[test]
fn sysv_stream_between_processes() {
    if std::env::var("UCX_RS_TEST_PEER").is_err() {
        stream_from_child("sysv");
    }
}

#[test]
fn posix_receiver_killed_midstream() {
    if std::env::var("UCX_RS_TEST_PEER").is_err() {
        receiver_killed("posix");
    }
}

#[test]
fn sysv_receiver_killed_midstream() {
    if std::env::var("UCX_RS_TEST_PEER").is_err() {
        receiver_killed("sysv");
    }
}
