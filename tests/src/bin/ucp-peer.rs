//! A ucp peer for the tests in `tests/ucp_*.rs`: `ucp-peer MODE ADDR ...` creates a worker
//! (transports and thresholds from the `UCX_*` environment the test sets), an endpoint to the
//! test's worker address `ADDR` (hex), and plays `MODE`:
//!
//! | mode | what it does |
//! |---|---|
//! | `tag ADDR [defer]` | sends and receives on command (see [`tag`]); with `defer` it says `addr A` first and connects only on `connect` |
//! | `dying ADDR die\|ok` | sends 18 bytes with tag 1; `ok`: closes and exits; `die`: starts a 256 KiB rendezvous with tag 2, says `rts`, and on `die` exits without serving it |
//! | `wakeup ADDR ROUNDS` | says `addr A`, echoes `ROUNDS` messages (tag 1 in, tag 2 out) sleeping in `Worker::wait`, says `sleeps N` |
//! | `rma ADDR` | remote memory access and atomics on command, on the test's memory and its own (see [`rma`]) |
//! | `am ADDR` | says `addr A`; echoes active messages (id 1 back as id 2 on the reply endpoint), and sends on command (see [`am`]) |
//! | `stream ADDR` | sends and receives its endpoint's stream on command, checked against `tests::stream` (see [`stream`]) |
//! | `sockaddr IP:PORT [flood]` | connects by socket address (no worker address), runs the client's side of `tests::sockaddr`'s echo, says `lanes ...` and `echo ok` or `echo failed WHY`; `connect failed STATUS` when it cannot connect; with `flood`, says `flooding` and streams until the endpoint fails: `ep error STATUS after N ms` |
//! | `sockaddr-server IP:PORT [flood]` | listens (says `listening IP:PORT`), serves one client's echo (`lanes ...`, `echo ok`); with `flood`, says `draining` and receives the stream until the endpoint fails: `ep error STATUS after N ms` |
//! | `generic ADDR` | says `addr A`; echoes tagged messages, active messages and stream bytes through generic datatypes (see [`generic`]) |
//!
//! Lines for the test start with `PEER< `; commands come on stdin.

use std::future::Future;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use tests::peer::{commands, say};
use tests::tag::{start_send, DYING_BIG as BIG, DYING_BIG_LEN as BIG_LEN, DYING_SMALL as SMALL};
use tests::text::{hex, pattern, unhex};
use tests::wakeup::{recv_sleeping, send_sleeping, PING, PONG, TIMEOUT};
use ucp::{
    AmHandlerFlags, AmMsg, AmSendFlags, AtomicOp, Context, ContextParams, Endpoint, Features, GenericBuf, Operand,
    RecvData, RecvResult, RemoteKey, Request, RequestParam, SendData, Status, Worker, WorkerParams, FULL_MASK,
};

fn worker(features: Features, name: &str) -> Worker {
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let ctx = Context::new(&ContextParams::new(features)).expect("context from the environment");
    Worker::new(&ctx, &WorkerParams::new(name)).expect("worker")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, addr, rest @ ..] = &args[..] {
        let flood = rest.first().map(String::as_str) == Some("flood");
        match mode.as_str() {
            "sockaddr" => return sockaddr_client(addr.parse().expect("IP:PORT"), flood),
            "sockaddr-server" => return sockaddr_server(addr.parse().expect("IP:PORT"), flood),
            _ => {}
        }
    }
    let (mode, addr) = match &args[..] {
        [mode, addr, ..] => (mode.as_str(), unhex(addr).expect("ADDR in hex")),
        _ => panic!("usage: ucp-peer MODE ADDR ..."),
    };
    let rest = &args[2..];
    match mode {
        "tag" => tag(&addr, rest.first().map(String::as_str) == Some("defer")),
        "dying" => dying(&addr, rest.first().map(String::as_str) == Some("die")),
        "wakeup" => wakeup(&addr, rest.first().and_then(|r| r.parse().ok()).expect("ROUNDS")),
        "rma" => rma(&addr),
        "am" => am(&addr),
        "stream" => stream(&addr),
        "generic" => generic(&addr),
        other => panic!("unknown mode {other}"),
    }
}

/// The tag sender. Commands, each answered with one line:
///
/// | command | answer |
/// |---|---|
/// | `send TAG LEN SEED SYNC` | starts sending `pattern(LEN, SEED)` (synchronous if SYNC is 1): `started` |
/// | `burst TAG LEN COUNT` | `ready`; on `go`, sends COUNT messages tagged TAG, TAG+1, ... back to back |
/// | `recv TAG LEN SEED` | receives and checks `pattern(LEN, SEED)`: `received`, `wrong data (N B)` or `failed STATUS` |
/// | `counts` | the worker's protocol counts (Debug form) |
/// | `lanes` | once wired up: `connected usage=transport ...` |
/// | `pending` | how many sends are not complete |
/// | `connect` | (deferred) creates the endpoint: `connecting` |
///
/// `quit` or the end of input: waits for the sends to complete, then exits.
fn tag(addr: &[u8], defer: bool) {
    let w = worker(Features::TAG, "peer");
    let rx = commands();
    if defer {
        // Simultaneous connect: hand out our address, then connect on command without
        // progressing in between, so the test's wireup request is still unread.
        say(&format!("addr {}", hex(w.address())));
        assert_eq!(rx.recv().as_deref(), Ok("connect"));
    }
    let ep = w.ep_create(addr).expect("endpoint to the test");
    if defer {
        say("connecting");
    }
    let mut sends: Vec<(Vec<u8>, Option<Request<'_>>)> = Vec::new();
    while let Some(line) = next_command(&w, &rx) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { f.get(i).and_then(|x| x.parse().ok()).unwrap_or_else(|| panic!("'{line}'")) };
        match f.first().copied() {
            Some("send") => {
                sends.push(start_send(&ep, num(1), num(2) as usize, num(3), num(4) == 1));
                say("started");
            }
            Some("burst") => {
                let (tag, len, count) = (num(1), num(2) as usize, num(3));
                // Nothing is sent before the test says "go": it stops progressing first.
                say("ready");
                if rx.recv().as_deref() != Ok("go") {
                    return;
                }
                for i in 0..count {
                    sends.push(start_send(&ep, tag + i, len, tag + i, false));
                }
            }
            Some("counts") => say(&format!("{:?}", w.proto_counts())),
            Some("recv") => say(&recv_checked(&w, num(1), num(2) as usize, num(3))),
            Some("lanes") => {
                let t = Instant::now();
                while !ep.query().unwrap().connected && t.elapsed() < TIMEOUT {
                    w.progress();
                }
                let q = ep.query().unwrap();
                let lanes: Vec<String> = q.lanes.iter().map(|l| format!("{}={}", l.usage, l.transport)).collect();
                say(&format!("{} {}", if q.connected { "connected" } else { "connecting" }, lanes.join(" ")));
            }
            Some("pending") => {
                sends.retain(|(_, r)| {
                    r.as_ref().is_some_and(|r| {
                        let s = r.status();
                        assert!(s == Status::InProgress || s == Status::Ok, "send failed: {s}");
                        s == Status::InProgress
                    })
                });
                say(&sends.len().to_string());
            }
            _ => break,
        }
    }
    let t = Instant::now();
    while sends.iter().any(|(_, r)| r.as_ref().is_some_and(|r| !r.is_completed())) && t.elapsed() < TIMEOUT {
        w.progress();
    }
}

/// The next command, progressing `w` while there is none; `None` when the input closed.
fn next_command(w: &Worker, rx: &Receiver<String>) -> Option<String> {
    loop {
        match rx.try_recv() {
            Ok(l) => return Some(l),
            Err(TryRecvError::Empty) => {
                w.progress();
            }
            Err(TryRecvError::Disconnected) => return None,
        }
    }
}

/// Receives `pattern(len, seed)` with `tag`; the answer line.
fn recv_checked(w: &Worker, tag: u64, len: usize, seed: u64) -> String {
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` outlives the request, completed (or timed out and then dropped, which
    // cancels it) before `buf` goes.
    let r = unsafe { w.tag_recv_nbx(RecvData::Contig(&mut buf), tag, FULL_MASK, RequestParam::new()) };
    let got = match r.unwrap() {
        RecvResult::Done(i) => Ok(i),
        RecvResult::Pending(r) => {
            let t = Instant::now();
            while !r.is_completed() && t.elapsed() < TIMEOUT {
                w.progress();
            }
            if r.is_completed() {
                r.recv_info().ok_or(r.status())
            } else {
                Err(Status::TimedOut)
            }
        }
    };
    match got {
        Ok(i) if i.length == len && buf == pattern(len, seed) => "received".into(),
        Ok(i) => format!("wrong data ({} B)", i.length),
        Err(e) => format!("failed {e}"),
    }
}

/// The peer that dies in a rendezvous (or, `die == false`, sends its small message and closes).
fn dying(addr: &[u8], die: bool) {
    let w = worker(Features::TAG, "dying");
    let ep = w.ep_create(addr).expect("endpoint to the test");
    ep.tag_send_blocking(b"whole before dying", SMALL).unwrap();
    if !die {
        ep.close(ucp::CloseMode::Flush).unwrap();
        return;
    }
    let rx = commands();
    let big = vec![7u8; BIG_LEN];
    // SAFETY: the process exits below without touching `big` again; the buffer is never freed
    // before exit.
    let r = unsafe { ep.tag_send_nbx(SendData::Contig(&big), BIG, RequestParam::new()) }.unwrap();
    assert!(r.is_some(), "a rendezvous send cannot complete at once");
    std::mem::forget(r);
    // The request is out (shared memory: in the peer's FIFO; rc: handed to the device, which
    // sends it on its own). No progress from here on: the rendezvous is never served. The test
    // says `die` once the request has arrived.
    say("rts");
    let _ = rx.recv();
    std::process::exit(0);
}

/// The echoing peer that sleeps in `wait` whenever it has nothing to do.
fn wakeup(addr: &[u8], rounds: usize) {
    let w = worker(Features::TAG | Features::WAKEUP, "wakeup-peer");
    say(&format!("addr {}", hex(w.address())));
    let ep: Endpoint = w.ep_create(addr).expect("endpoint to the test");
    let mut sleeps = 0;
    for _ in 0..rounds {
        let m = recv_sleeping(&w, PING, &mut sleeps);
        send_sleeping(&ep, &m, PONG, &mut sleeps);
    }
    say(&format!("sleeps {sleeps}"));
    ep.close(ucp::CloseMode::Flush).unwrap();
}

/// Progresses `w` until `r` (an operation's request, if it has one) completes; its status.
fn wait_op(w: &Worker, r: Result<Option<Request<'_>>, Status>) -> Status {
    match r {
        Err(e) => e,
        Ok(None) => Status::Ok,
        Ok(Some(r)) => {
            let t = Instant::now();
            while !r.is_completed() && t.elapsed() < TIMEOUT {
                w.progress();
            }
            r.status()
        }
    }
}

/// Runs `f` to completion, progressing `w`.
fn run<F: std::future::Future>(w: &Worker, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = tests::peer::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let t = Instant::now();
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        w.progress();
        assert!(t.elapsed() < TIMEOUT, "an operation did not complete");
    }
}

/// The RMA peer. Commands (addresses in decimal), each answered with one line:
///
/// | command | answer |
/// |---|---|
/// | `map LEN alloc\|user SEED` | maps `LEN` bytes (allocated by the worker, or its own) filled with `pattern(LEN, SEED)`: `key HEX ADDR` |
/// | `check ADDR LEN SEED` | compares its own memory at `ADDR` with the pattern: `ok` or `wrong` |
/// | `unpack HEX` | unpacks the test's packed key: `unpacked` |
/// | `put ADDR LEN SEED` | puts the pattern at the test's `ADDR`, flushes: `done STATUS` |
/// | `get ADDR LEN SEED` | gets `LEN` bytes and compares: `ok`, `wrong` or `failed STATUS` |
/// | `fadd ADDR N FILE` | `N` 64-bit fetch-and-adds of 1, the values fetched written to `FILE`: `done` |
/// | `lock LOCK DATA N` | `N` times: takes the lock word at `LOCK` with compare-and-swap, increments the word at `DATA` with a get and a put (not atomic), flushes, releases: `done` |
/// | `fence DATA FLAG LEN ROUNDS` | each round `r` from 1: puts `LEN` bytes of `r` at `DATA`, fences, puts `r` at `FLAG` (8 bytes): `done` |
/// | `address` | its worker address: `address HEX` |
///
/// `quit` or the end of input ends it.
fn rma(addr: &[u8]) {
    let w = worker(Features::RMA | Features::AMO32 | Features::AMO64, "rma-peer");
    let rx = commands();
    let ep = w.ep_create(addr).expect("endpoint to the test");
    let mut key: Option<RemoteKey> = None;
    let mut regions: Vec<(ucp::MemHandle, Vec<u8>)> = Vec::new();
    while let Some(line) = next_command(&w, &rx) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { f.get(i).and_then(|x| x.parse().ok()).unwrap_or_else(|| panic!("'{line}'")) };
        let k = || key.as_ref().expect("unpack first");
        match f.first().copied() {
            Some("map") => {
                let (len, seed) = (num(1) as usize, num(3));
                let (h, keep) = if f.get(2) == Some(&"alloc") {
                    (w.mem_map_alloc(len).expect("mem_map_alloc"), Vec::new())
                } else {
                    let mut v = vec![0u8; len];
                    // SAFETY: `v` stays in `regions` (its heap buffer never moves) until exit.
                    (unsafe { w.mem_map(v.as_mut_ptr(), len) }.expect("mem_map"), v)
                };
                // SAFETY: the region is mapped and no peer operation targets it yet.
                unsafe { std::ptr::copy_nonoverlapping(pattern(len, seed).as_ptr(), h.address as *mut u8, len) };
                let packed = w.rkey_pack(&h).expect("rkey_pack");
                say(&format!("key {} {}", hex(&packed), h.address));
                regions.push((h, keep));
            }
            Some("address") => say(&format!("address {}", hex(w.address()))),
            Some("check") => {
                let (at, len, seed) = (num(1) as usize, num(2) as usize, num(3));
                // SAFETY: the test names memory this peer mapped, which nothing writes now
                // (the test's operations on it are flushed).
                let got = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
                say(if got == pattern(len, seed) { "ok" } else { "wrong" });
            }
            Some("unpack") => {
                key = Some(ep.rkey_unpack(&unhex(f[1]).expect("hex")).expect("rkey_unpack"));
                say("unpacked");
            }
            Some("put") => {
                let data = pattern(num(2) as usize, num(3));
                // SAFETY: `data` outlives the request (waited for).
                let st = wait_op(&w, unsafe { ep.put_nbx(SendData::Contig(&data), num(1), k(), RequestParam::new()) });
                let fl = wait_op(&w, ep.flush_nbx(RequestParam::new()));
                say(&format!("done {:?}", if st == Status::Ok { fl } else { st }));
            }
            Some("get") => {
                let (len, seed) = (num(2) as usize, num(3));
                let mut buf = vec![0u8; len];
                // SAFETY: `buf` outlives the request (waited for).
                let st =
                    wait_op(&w, unsafe { ep.get_nbx(RecvData::Contig(&mut buf), num(1), k(), RequestParam::new()) });
                say(&match st {
                    Status::Ok if buf == pattern(len, seed) => "ok".to_string(),
                    Status::Ok => "wrong".to_string(),
                    e => format!("failed {e}"),
                });
            }
            Some("fadd") => {
                let (at, n) = (num(1), num(2) as usize);
                let mut fetched = Vec::with_capacity(n * 8);
                for _ in 0..n {
                    match run(&w, ep.atomic(AtomicOp::Fadd, Operand::U64(1), at, k())) {
                        Ok(Operand::U64(v)) => fetched.extend_from_slice(&v.to_le_bytes()),
                        other => panic!("fadd: {other:?}"),
                    }
                }
                std::fs::write(f[3], &fetched).expect("write the fetched values");
                say("done");
            }
            Some("lock") => {
                let (lock, data, n) = (num(1), num(2), num(3));
                for _ in 0..n {
                    while run(&w, ep.atomic_cswap(Operand::U64(0), Operand::U64(1), lock, k())) != Ok(Operand::U64(0)) {
                    }
                    let mut v = [0u8; 8];
                    // SAFETY: `v` outlives the request (waited for).
                    let r = unsafe { ep.get_nbx(RecvData::Contig(&mut v), data, k(), RequestParam::new()) };
                    assert_eq!(wait_op(&w, r), Status::Ok);
                    let next = (u64::from_le_bytes(v) + 1).to_le_bytes();
                    // SAFETY: as above.
                    let r = unsafe { ep.put_nbx(SendData::Contig(&next), data, k(), RequestParam::new()) };
                    assert_eq!(wait_op(&w, r), Status::Ok);
                    assert_eq!(wait_op(&w, ep.flush_nbx(RequestParam::new())), Status::Ok);
                    assert_eq!(run(&w, ep.atomic(AtomicOp::Swap, Operand::U64(0), lock, k())), Ok(Operand::U64(1)));
                }
                say("done");
            }
            Some("fence") => {
                let (data, flag, len, rounds) = (num(1), num(2), num(3) as usize, num(4));
                for r in 1..=rounds {
                    let d = vec![r as u8; len];
                    let fl = [r as u8; 8];
                    // SAFETY: both buffers outlive their requests (waited for below).
                    let a = unsafe { ep.put_nbx(SendData::Contig(&d), data, k(), RequestParam::new()) };
                    w.fence().expect("fence");
                    // SAFETY: as above.
                    let b = unsafe { ep.put_nbx(SendData::Contig(&fl), flag, k(), RequestParam::new()) };
                    assert_eq!(wait_op(&w, a), Status::Ok);
                    assert_eq!(wait_op(&w, b), Status::Ok);
                }
                assert_eq!(wait_op(&w, ep.flush_nbx(RequestParam::new())), Status::Ok);
                say("done");
            }
            _ => break,
        }
    }
    drop(key);
    for (h, keep) in regions {
        let _ = w.mem_unmap(h);
        drop(keep);
    }
}

/// The active-message peer. Its handler of id 1 answers every message on the reply endpoint
/// with id 2: the header reversed, the data echoed (copied: the data is lent for the call
/// only; a rendezvous message's data is received first, and answered once it is there).
/// Commands, each answered with one line:
///
/// | command | answer |
/// |---|---|
/// | `send ID COUNT LEN HLEN SEED` | starts COUNT sends to id ID: message `i` has header `[i as u32 LE] + pattern(HLEN - 4, SEED)` and data `pattern(LEN + i % 7 * 1000, SEED + i)`: `started` |
/// | `pending` | how many sends are not complete |
/// | `echoed` | how many messages the handler answered |
///
/// `quit` or the end of input: waits for the sends to complete, then exits.
fn am(addr: &[u8]) {
    type Rndv = (Vec<u8>, ucp::Endpoint, ucp::RecvFuture<Vec<u8>>);
    let w = worker(Features::AM, "am-peer");
    let rx = commands();
    say(&format!("addr {}", hex(w.address())));
    let echoed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rndv: std::sync::Arc<std::sync::Mutex<Vec<Rndv>>> = Default::default();
    let (e2, r2) = (echoed.clone(), rndv.clone());
    w.set_am_recv_handler(
        1,
        Some(move |m: &mut AmMsg<'_>| {
            let Some(ep) = m.reply_ep() else {
                eprintln!("am-peer: a message without a reply endpoint");
                return;
            };
            let mut h = m.header().to_vec();
            h.reverse();
            if m.is_rndv() {
                let (len, ep) = (m.length(), ep.clone());
                let w = m.worker().expect("worker");
                let d = m.take_rndv().expect("descriptor");
                // (The receive is started before the lock is taken.)
                let f = w.am_recv_data(d, vec![0u8; len]);
                r2.lock().unwrap().push((h, ep, f));
                return;
            }
            // The send goes on after its future is dropped.
            drop(ep.am_send(2, &h, m.data().to_vec(), AmSendFlags::empty()));
            e2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }),
        AmHandlerFlags::WHOLE_MSG,
    )
    .expect("handler");
    let ep = w.ep_create(addr).expect("endpoint to the test");
    // Answers the rendezvous messages whose data arrived. No lock is held across a call into
    // the worker: a send may run handlers (which take the lock).
    let serve = || {
        let waker = tests::peer::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut list = std::mem::take(&mut *rndv.lock().unwrap());
        let mut done = Vec::new();
        list.retain_mut(|(h, ep, f)| match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready((data, r)) => {
                r.expect("rendezvous receive");
                done.push((std::mem::take(h), ep.clone(), data));
                false
            }
            std::task::Poll::Pending => true,
        });
        rndv.lock().unwrap().splice(0..0, list);
        for (h, ep, data) in done {
            drop(ep.am_send(2, &h, data, AmSendFlags::empty()));
            echoed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    };
    type Send<'a> = (Vec<u8>, Vec<u8>, Option<Request<'a>>);
    let mut sends: Vec<Send<'_>> = Vec::new();
    loop {
        let line = match rx.try_recv() {
            Ok(l) => l,
            Err(TryRecvError::Empty) => {
                w.progress();
                serve();
                continue;
            }
            Err(TryRecvError::Disconnected) => break,
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { f.get(i).and_then(|x| x.parse().ok()).unwrap_or_else(|| panic!("'{line}'")) };
        match f.first().copied() {
            Some("send") => {
                let (id, count, len, hlen, seed) = (num(1) as u16, num(2), num(3) as usize, num(4) as usize, num(5));
                for i in 0..count {
                    let mut hdr = (i as u32).to_le_bytes().to_vec();
                    hdr.extend_from_slice(&pattern(hlen.saturating_sub(4), seed));
                    let data = pattern(len + (i % 7) as usize * 1000, seed + i);
                    // SAFETY: header and data live in `sends` until the request completed (or
                    // the process ends after waiting for it).
                    let r = unsafe {
                        ep.am_send_nbx(id, &hdr, SendData::Contig(&data), AmSendFlags::empty(), RequestParam::new())
                    }
                    .expect("am_send_nbx");
                    sends.push((hdr, data, r));
                }
                say("started");
            }
            Some("pending") => {
                sends.retain(|(_, _, r)| {
                    r.as_ref().is_some_and(|r| {
                        let s = r.status();
                        assert!(s == Status::InProgress || s == Status::Ok, "send failed: {s}");
                        s == Status::InProgress
                    })
                });
                say(&sends.len().to_string());
            }
            Some("echoed") => say(&echoed.load(std::sync::atomic::Ordering::Relaxed).to_string()),
            _ => break,
        }
    }
    let t = Instant::now();
    while sends.iter().any(|(_, _, r)| r.as_ref().is_some_and(|r| !r.is_completed())) && t.elapsed() < TIMEOUT {
        w.progress();
    }
}

/// The stream peer: its endpoint to the test carries the stream both ways. Commands, each
/// answered with one line:
///
/// | command | answer |
/// |---|---|
/// | `send COUNT SEED MAX` | sends COUNT pieces (sizes from `Rng(SEED)`, up to MAX bytes) of the stream from where its last send ended; `sent END` once all completed |
/// | `recv TOTAL SEED MAX` | receives TOTAL bytes from where its last receive ended (sizes from `Rng(SEED)`), checking each: `ok` or `wrong WHAT` |
fn stream(addr: &[u8]) {
    let w = worker(Features::STREAM, "stream-peer");
    let rx = commands();
    let ep = w.ep_create(addr).expect("endpoint to the test");
    let limit = std::time::Duration::from_secs(300);
    let (mut sent, mut received) = (0u64, 0u64);
    while let Some(line) = next_command(&w, &rx) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> u64 { f.get(i).and_then(|x| x.parse().ok()).unwrap_or_else(|| panic!("'{line}'")) };
        match f.first().copied() {
            Some("send") => {
                sent = tests::stream::send_pieces(&w, &ep, sent, num(1), num(2), num(3), limit);
                say(&format!("sent {sent}"));
            }
            Some("recv") => {
                let total = num(1);
                match tests::stream::recv_checked(&w, &ep, received, total, num(2), num(3), limit) {
                    Ok(()) => {
                        received += total;
                        say("ok");
                    }
                    Err(e) => say(&format!("wrong {e}")),
                }
            }
            _ => break,
        }
    }
}

/// The largest tagged message the generic peer echoes.
const GENERIC_TAG_CAP: usize = 1 << 20;
/// The most stream bytes one receive of the generic peer takes.
const GENERIC_STREAM_CAP: usize = 64 << 10;

/// Where a receive's callback leaves its outcome: status and length.
type Outcome = std::sync::Arc<std::sync::Mutex<Option<(Status, usize)>>>;

/// Parameters whose callback leaves the outcome in `o`.
fn noting(o: &Outcome) -> RequestParam {
    let o = o.clone();
    RequestParam::new().callback(move |s, i| *o.lock().unwrap() = Some((s, i.length)))
}

/// A receive started with [`noting`]: its outcome now if it completed at once (the handle of a
/// pending one is let go: the callback reports it).
fn noted(r: Result<RecvResult<'_>, Status>, o: &Outcome) {
    match r.expect("generic receive") {
        RecvResult::Done(i) => *o.lock().unwrap() = Some((Status::Ok, i.length)),
        RecvResult::Pending(r) => drop(r),
    }
}

/// The generic-datatype echo: everything it receives lands in strided destinations through a
/// generic datatype (`tests::generic::Strided`, 4-byte blocks every 7 bytes) and goes back
/// packed by the same datatype:
///
/// * tagged messages with tag 1 come back with tag 2;
/// * active messages with id 3 come back as id 4 on the reply endpoint (a rendezvous one is
///   received with `am_recv_data_nbx` first);
/// * stream bytes come back on the endpoint they arrived on, piece by piece.
///
/// Sends are detached: the callback owns the source and reports a failure. It runs until
/// stdin closes, then waits for its sends.
fn generic(addr: &[u8]) {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};
    type AmIn = (ucp::Endpoint, Vec<u8>, Option<ucp::AmRndv>, usize);
    let w = worker(Features::TAG | Features::AM | Features::STREAM, "generic-peer");
    let rx = commands();
    let ops = tests::generic::Strided::new(4, 7);
    let dt = ops.datatype();
    let am_in: Arc<Mutex<Vec<AmIn>>> = Default::default();
    let a2 = am_in.clone();
    w.set_am_recv_handler(
        3,
        Some(move |m: &mut AmMsg<'_>| {
            let Some(ep) = m.reply_ep().cloned() else {
                eprintln!("generic-peer: an active message without a reply endpoint");
                return;
            };
            let len = m.length();
            let (data, rndv) = if m.is_rndv() { (Vec::new(), m.take_rndv()) } else { (m.data().to_vec(), None) };
            a2.lock().unwrap().push((ep, data, rndv, len));
        }),
        AmHandlerFlags::WHOLE_MSG,
    )
    .expect("handler");
    let ep = w.ep_create(addr).expect("endpoint to the test");
    say(&format!("addr {}", hex(w.address())));
    let inflight = Arc::new(AtomicUsize::new(0));
    // A detached send's parameters: the callback keeps the source until the send completed.
    let echo_param = |src: Vec<u8>| {
        let n = inflight.clone();
        n.fetch_add(1, SeqCst);
        RequestParam::new().callback(move |s, _| {
            let _source = &src;
            assert_eq!(s, Status::Ok, "generic echo send");
            n.fetch_sub(1, SeqCst);
        })
    };
    // A detached send completed at once: no callback runs.
    let at_once = |done: bool| {
        if done {
            inflight.fetch_sub(1, SeqCst);
        }
    };
    let tag_o: Outcome = Default::default();
    let post_tag = |buf: &mut Vec<u8>| {
        // SAFETY: `buf` is not touched until the receive completed (its heap bytes stay put).
        noted(
            unsafe {
                w.tag_recv_nbx(
                    RecvData::Generic(&GenericBuf::recv(&dt, buf.as_mut_ptr(), GENERIC_TAG_CAP)),
                    1,
                    FULL_MASK,
                    noting(&tag_o),
                )
            },
            &tag_o,
        )
    };
    let mut tag_buf = vec![0xeeu8; ops.span(GENERIC_TAG_CAP)];
    post_tag(&mut tag_buf);
    // Rendezvous active messages being received: reply endpoint, destination, outcome.
    let mut am_rx: Vec<(ucp::Endpoint, Vec<u8>, Outcome)> = Vec::new();
    // Stream receives: endpoint, destination, outcome (`None`: none posted).
    let mut st_rx: Vec<(ucp::Endpoint, Vec<u8>, Option<Outcome>)> = Vec::new();
    let mut closed_at = None::<Instant>;
    while closed_at.is_none() || inflight.load(SeqCst) > 0 {
        if closed_at.is_none() && matches!(rx.try_recv(), Err(TryRecvError::Disconnected)) {
            closed_at = Some(Instant::now());
        }
        if closed_at.is_some_and(|t| t.elapsed() > TIMEOUT) {
            eprintln!("generic-peer: {} sends did not complete", inflight.load(SeqCst));
            break;
        }
        w.progress();
        // Tagged: echo what arrived, post again.
        while let Some((status, n)) = tag_o.lock().unwrap().take() {
            let src = std::mem::replace(&mut tag_buf, vec![0xeeu8; ops.span(GENERIC_TAG_CAP)]);
            post_tag(&mut tag_buf);
            assert_eq!(status, Status::Ok, "generic tagged receive");
            let p = src.as_ptr();
            // SAFETY: the callback owns the source until the send completed.
            let r = unsafe {
                ep.tag_send_nbx_detached(SendData::Generic(&GenericBuf::send(&dt, p, n)), 2, echo_param(src))
            };
            at_once(r.expect("generic tag send"));
        }
        // Active messages: eager data goes back at once, rendezvous data once received.
        let arrived = std::mem::take(&mut *am_in.lock().unwrap());
        let am_echo = |ep: &ucp::Endpoint, src: Vec<u8>, n: usize| {
            let p = src.as_ptr();
            // SAFETY: the callback owns the source until the send completed.
            let r = unsafe {
                ep.am_send_nbx_detached(
                    4,
                    &[],
                    SendData::Generic(&GenericBuf::send(&dt, p, n)),
                    AmSendFlags::empty(),
                    echo_param(src),
                )
            };
            at_once(r.expect("generic am send"));
        };
        for (rep, data, rndv, n) in arrived {
            match rndv {
                None => am_echo(&rep, ops.scatter(&data), n),
                Some(d) => {
                    let mut buf = vec![0xeeu8; ops.span(n)];
                    let o: Outcome = Default::default();
                    // SAFETY: `buf` moves into `am_rx` (its heap bytes stay put) until the
                    // receive completed.
                    let r = unsafe {
                        w.am_recv_data_nbx(
                            d,
                            RecvData::Generic(&GenericBuf::recv(&dt, buf.as_mut_ptr(), n)),
                            noting(&o),
                        )
                    };
                    drop(r.expect("generic am_recv_data_nbx"));
                    am_rx.push((rep, buf, o));
                }
            }
        }
        let mut i = 0;
        while i < am_rx.len() {
            let Some((status, n)) = *am_rx[i].2.lock().unwrap() else {
                i += 1;
                continue;
            };
            let (rep, buf, _) = am_rx.swap_remove(i);
            assert_eq!(status, Status::Ok, "rendezvous active message");
            am_echo(&rep, buf, n);
        }
        // Stream: endpoints with bytes get a receive; completed receives are echoed.
        for e in w.stream_poll(8).expect("stream_poll") {
            if !st_rx.iter().any(|(x, _, _)| *x == e) {
                st_rx.push((e, vec![0xeeu8; ops.span(GENERIC_STREAM_CAP)], None));
            }
        }
        for (e, buf, slot) in st_rx.iter_mut() {
            loop {
                if slot.is_none() {
                    let o: Outcome = Default::default();
                    // SAFETY: `buf` is not touched until the receive completed.
                    let r = unsafe {
                        e.stream_recv_nbx(
                            RecvData::Generic(&GenericBuf::recv(&dt, buf.as_mut_ptr(), GENERIC_STREAM_CAP)),
                            ucp::StreamRecvFlags::empty(),
                            noting(&o),
                        )
                    };
                    noted(r, &o);
                    *slot = Some(o);
                }
                let Some((status, n)) = slot.as_ref().and_then(|o| o.lock().unwrap().take()) else { break };
                *slot = None;
                assert_eq!(status, Status::Ok, "generic stream receive");
                let echo = ops.scatter(&ops.gather(buf, n));
                let p = echo.as_ptr();
                // SAFETY: the callback owns the source until the send completed.
                let r = unsafe {
                    e.stream_send_nbx_detached(SendData::Generic(&GenericBuf::send(&dt, p, n)), echo_param(echo))
                };
                at_once(r.expect("generic stream send"));
            }
        }
    }
}

/// The client of the socket-address tests: connects to `server`, runs the echo; with
/// `flood`, then streams bytes until the endpoint fails.
fn sockaddr_client(server: std::net::SocketAddr, flood: bool) {
    let w = worker(Features::TAG | Features::STREAM | Features::AM, "sockaddr-client");
    let inbox = tests::sockaddr::Inbox::install(&w);
    let ep = match w.ep_create_sockaddr(server) {
        Ok(ep) => ep,
        Err(e) => return say(&format!("connect failed {e:?}")),
    };
    if !sockaddr_echo(&ep, tests::sockaddr::client(&w, &ep, &inbox)) {
        return;
    }
    if flood {
        say("flooding");
        let t = Instant::now();
        let chunk = vec![0x5au8; 64 << 10];
        let status = loop {
            if let Err(e) = ucp::block_on(ep.stream_send(chunk.clone())).1 {
                break e;
            }
            if t.elapsed() > tests::sockaddr::FLOOD_LIMIT {
                return say("no error");
            }
        };
        say(&format!("ep error {status:?} after {} ms", t.elapsed().as_millis()));
        return;
    }
    let _ = ep.close(ucp::CloseMode::Flush);
}

/// Says how the echo went; whether it went well.
fn sockaddr_echo(ep: &Endpoint, r: Result<(), String>) -> bool {
    match r {
        Ok(()) => {
            say(&format!("lanes {}", tests::sockaddr::lanes(ep)));
            say("echo ok");
            true
        }
        Err(why) => {
            say(&format!("echo failed {why}"));
            false
        }
    }
}

/// The server of the socket-address tests across network namespaces: listens on `addr`,
/// says `listening IP:PORT`, serves one client's echo; with `flood`, then receives the
/// client's stream until the endpoint fails.
fn sockaddr_server(addr: std::net::SocketAddr, flood: bool) {
    let w = worker(Features::TAG | Features::STREAM | Features::AM, "sockaddr-server");
    let inbox = tests::sockaddr::Inbox::install(&w);
    let reqs: std::sync::Arc<std::sync::Mutex<Vec<ucp::ConnRequest>>> = Default::default();
    let r = reqs.clone();
    let l = w.listener(addr, move |req| r.lock().unwrap().push(req)).expect("a listener");
    say(&format!("listening {}", l.query()));
    let t = Instant::now();
    let req = loop {
        if let Some(req) = reqs.lock().unwrap().pop() {
            break req;
        }
        assert!(t.elapsed() < tests::sockaddr::LIMIT, "no client");
        w.progress();
    };
    let ep = w.ep_create_conn_request(req).expect("accepted");
    if !sockaddr_echo(&ep, tests::sockaddr::server(&w, &ep, &inbox)) {
        return;
    }
    if flood {
        say("draining");
        let t = Instant::now();
        let status = loop {
            let (_, r) = ucp::block_on(ep.stream_recv(vec![0u8; 1 << 20], ucp::StreamRecvFlags::WAITALL));
            if let Err(e) = r {
                break e;
            }
            if t.elapsed() > tests::sockaddr::FLOOD_LIMIT {
                return say("no error");
            }
        };
        say(&format!("ep error {status:?} after {} ms", t.elapsed().as_millis()));
    }
}
