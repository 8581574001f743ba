//! Active messages in one process: an endpoint to the same worker (`self`) and between two
//! workers over shared memory, every eager protocol (thresholds forced), headers from empty
//! to the limit, replies from inside the handler, kept data, handlers replaced or missing,
//! and the errors.

mod common;

use common::noop_waker;
use std::future::Future;
use std::sync::{Arc, Mutex};

use ucp::{
    AmHandlerFlags, AmMsg, AmSendFlags, Context, ContextParams, Endpoint, Features, IoVec, RecvData, RequestParam,
    SendData, Status, Worker, WorkerParams,
};

/// Busy-polling tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pair of workers (the same one twice for `self`) and an endpoint from the first to the
/// second, connected.
struct Pair {
    a: Worker,
    b: Worker,
    ep: Endpoint,
}

impl Pair {
    fn new(tls: &str, extra: &[(&str, &str)]) -> Pair {
        uct_shm::register();
        let mut p = ContextParams::new(Features::AM).with_config("TLS", tls);
        for (k, v) in extra {
            p = p.with_config(k, v);
        }
        let c = Context::new(&p).unwrap();
        let a = Worker::new(&c, &WorkerParams::new("a")).unwrap();
        let b = if tls == "self" { a.clone() } else { Worker::new(&c, &WorkerParams::new("b")).unwrap() };
        let ep = a.ep_create(b.address()).unwrap();
        let p = Pair { a, b, ep };
        if let Some(r) = p.ep.flush_nbx(RequestParam::new()).unwrap() {
            p.wait_until(|| r.is_completed());
            assert_eq!(r.status(), Status::Ok);
        }
        p
    }

    fn progress(&self) {
        self.a.progress();
        self.b.progress();
    }

    /// Progresses both workers until `done` (bounded).
    fn wait_until(&self, mut done: impl FnMut() -> bool) {
        let t0 = std::time::Instant::now();
        while !done() {
            self.progress();
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "timed out");
        }
    }

    /// Sends and waits for the send to complete.
    fn send(&self, id: u16, hdr: &[u8], data: &[u8], flags: AmSendFlags) -> Status {
        // SAFETY: header and data stay borrowed until the request completed (waited below).
        match unsafe { self.ep.am_send_nbx(id, hdr, SendData::Contig(data), flags, RequestParam::new()) } {
            Err(e) => e,
            Ok(None) => Status::Ok,
            Ok(Some(r)) => {
                self.wait_until(|| r.is_completed());
                r.status()
            }
        }
    }
}

/// What a handler saw.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    id: u16,
    hdr: Vec<u8>,
    data: Vec<u8>,
    reply: bool,
    persistent: bool,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Sets a handler on `w` for `id` that records every message.
fn record(w: &Worker, id: u16, flags: AmHandlerFlags) -> Log {
    let log: Log = Arc::default();
    let l = log.clone();
    w.set_am_recv_handler(
        id,
        Some(move |m: &mut AmMsg<'_>| {
            l.lock().unwrap().push(Seen {
                id: m.id(),
                hdr: m.header().to_vec(),
                data: m.data().to_vec(),
                reply: m.reply_ep().is_some(),
                persistent: m.data_persistent(),
            })
        }),
        flags,
    )
    .unwrap();
    log
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 8) as u8)).collect()
}

/// Sizes around every switch point of the eager protocols.
const SIZES: [usize; 12] = [0, 1, 8, 63, 64, 100, 1000, 4095, 8192, 8300, 70_000, 300_000];

/// Every size with headers of 0, 1, 40 bytes and the largest, with and without a reply
/// endpoint: what arrives is what was sent, byte for byte.
fn every_size_and_header(tls: &str, extra: &[(&str, &str)]) {
    let _g = serial();
    let p = Pair::new(tls, extra);
    let log = record(&p.b, 7, AmHandlerFlags::WHOLE_MSG);
    let max = p.a.am_max_header();
    assert!(max >= 64, "the largest header on {tls} is only {max} bytes");
    let mut expect = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        for (j, hlen) in [0, 1, 40, max].into_iter().enumerate() {
            for reply in [false, true] {
                let data = pattern(n, (i * 8 + j) as u8);
                let hdr = pattern(hlen, 200 - j as u8);
                let flags = if reply { AmSendFlags::REPLY } else { AmSendFlags::empty() };
                assert_eq!(p.send(7, &hdr, &data, flags), Status::Ok, "{n} bytes, {hlen}-byte header");
                expect.push(Seen { id: 7, hdr, data, reply, persistent: false });
            }
        }
    }
    p.wait_until(|| log.lock().unwrap().len() >= expect.len());
    let got = log.lock().unwrap().clone();
    assert_eq!(got.len(), expect.len());
    for (g, e) in got.iter().zip(&expect) {
        // (Whether the data was persistent depends on how it arrived: not checked here.)
        assert_eq!((g.id, &g.hdr, g.reply, g.data.len()), (e.id, &e.hdr, e.reply, e.data.len()));
        assert!(g.data == e.data, "data of a {}-byte message differs", e.data.len());
    }
}

#[test]
fn self_every_size_and_header() {
    every_size_and_header("self", &[]);
}

#[test]
fn posix_every_size_and_header() {
    every_size_and_header("posix", &[]);
}

#[test]
fn posix_without_short() {
    every_size_and_header("posix", &[("BCOPY_THRESH", "0")]);
}

#[test]
fn sysv_every_size_and_header() {
    every_size_and_header("sysv", &[]);
}

/// Multi-fragment messages are delivered whole, and their data is persistent.
#[test]
fn multi_fragment_data_is_persistent() {
    let _g = serial();
    let p = Pair::new("posix", &[]);
    let log = record(&p.b, 1, AmHandlerFlags::empty());
    let data = pattern(100_000, 3);
    assert_eq!(p.send(1, b"h", &data, AmSendFlags::empty()), Status::Ok);
    p.wait_until(|| !log.lock().unwrap().is_empty());
    let g = log.lock().unwrap()[0].clone();
    assert_eq!((g.hdr.as_slice(), g.data == data, g.persistent), (&b"h"[..], true, true));
}

/// A handler replies on the reply endpoint from inside its call; the replies arrive in order.
fn replies_from_the_handler(tls: &str) {
    let _g = serial();
    let p = Pair::new(tls, &[]);
    // b answers every request on id 1 with id 2, echoing the data and the header reversed.
    p.b.set_am_recv_handler(
        1,
        Some(|m: &mut AmMsg<'_>| {
            let ep = m.reply_ep().expect("a reply endpoint");
            let mut h = m.header().to_vec();
            h.reverse();
            // The data is lent for the call only: the owned form copies it; the send goes on
            // after its future is dropped.
            drop(ep.am_send(2, &h, m.data().to_vec(), AmSendFlags::empty()));
        }),
        AmHandlerFlags::empty(),
    )
    .unwrap();
    let log = record(&p.a, 2, AmHandlerFlags::empty());
    let n = 200;
    for i in 0..n {
        let data = pattern(i * 37 % 20_000, i as u8);
        assert_eq!(p.send(1, &[i as u8, 1, 2], &data, AmSendFlags::REPLY), Status::Ok);
    }
    p.wait_until(|| log.lock().unwrap().len() >= n);
    let got = log.lock().unwrap().clone();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.hdr, vec![2, 1, i as u8], "reply {i}");
        assert!(g.data == pattern(i * 37 % 20_000, i as u8), "reply {i}'s data");
        assert!(!g.reply);
    }
}

#[test]
fn self_replies_from_the_handler() {
    replies_from_the_handler("self");
}

#[test]
fn posix_replies_from_the_handler() {
    replies_from_the_handler("posix");
}

/// Data taken in the handler stays valid, unchanged, until released, while more messages
/// arrive (inline ones copied: PERSISTENT_DATA).
#[test]
fn kept_data_lives_until_released() {
    let _g = serial();
    let p = Pair::new("posix", &[]);
    let kept: Arc<Mutex<Vec<ucp::AmData>>> = Arc::default();
    let k = kept.clone();
    p.b.set_am_recv_handler(
        3,
        Some(move |m: &mut AmMsg<'_>| {
            assert!(m.data_persistent());
            let d = m.take_data().expect("persistent data can be taken");
            assert!(m.take_data().is_none(), "taken twice");
            k.lock().unwrap().push(d);
        }),
        AmHandlerFlags::PERSISTENT_DATA,
    )
    .unwrap();
    let sizes = [0usize, 5, 40, 200, 1000, 9000, 50_000];
    for round in 0..20u8 {
        for (i, &n) in sizes.iter().enumerate() {
            assert_eq!(p.send(3, b"x", &pattern(n, round ^ i as u8), AmSendFlags::empty()), Status::Ok);
        }
    }
    let total = 20 * sizes.len();
    p.wait_until(|| kept.lock().unwrap().len() >= total);
    let mut all = std::mem::take(&mut *kept.lock().unwrap());
    for (j, d) in all.iter().enumerate() {
        let (round, i) = (j / sizes.len(), j % sizes.len());
        assert!(**d == pattern(sizes[i], round as u8 ^ i as u8), "kept message {j}");
    }
    // Released in any order: half now, half through the worker.
    let rest = all.split_off(total / 2);
    drop(all);
    for d in rest {
        p.b.am_data_release(d);
    }
}

/// Without PERSISTENT_DATA, a message that arrived in a transport descriptor (every one over
/// `self`; a bcopy one over posix) can still be kept: the handler that takes it gets the same
/// bytes, valid until released, while the descriptors of the messages it does not take go
/// back to the transport (more messages than the transport has descriptors arrive).
#[test]
fn descriptor_data_can_be_taken_without_persistent_flag() {
    let _g = serial();
    for tls in ["self", "posix"] {
        let p = Pair::new(tls, &[]);
        type Kept = Vec<(usize, Vec<u8>, ucp::AmData)>;
        let kept: Arc<Mutex<Kept>> = Arc::default();
        let seen = Arc::new(Mutex::new(0usize));
        let (k, s) = (kept.clone(), seen.clone());
        p.b.set_am_recv_handler(
            5,
            Some(move |m: &mut AmMsg<'_>| {
                let n = {
                    let mut s = s.lock().unwrap();
                    *s += 1;
                    *s - 1
                };
                if m.data_persistent() && n % 5 == 0 {
                    let copy = m.data().to_vec();
                    let d = m.take_data().expect("descriptor data can be taken");
                    assert!(m.take_data().is_none(), "taken twice");
                    assert_eq!(d.as_ptr(), m.data().as_ptr(), "kept where it was lent");
                    k.lock().unwrap().push((n, copy, d));
                }
            }),
            AmHandlerFlags::empty(),
        )
        .unwrap();
        let sizes = [100usize, 1000, 4000];
        let total = 600;
        for i in 0..total {
            let n = sizes[i % sizes.len()];
            assert_eq!(p.send(5, b"h", &pattern(n, i as u8), AmSendFlags::empty()), Status::Ok);
        }
        p.wait_until(|| *seen.lock().unwrap() >= total);
        let all = std::mem::take(&mut *kept.lock().unwrap());
        assert!(!all.is_empty(), "{tls}: no message arrived in a descriptor");
        for (n, copy, d) in &all {
            assert_eq!(**d, copy[..], "{tls}: kept message {n} changed");
            assert!(**d == pattern(sizes[n % sizes.len()], *n as u8), "{tls}: kept message {n}");
        }
    }
}

/// Without PERSISTENT_DATA an inline message cannot be kept: take_data says so.
#[test]
fn inline_data_is_lent_only_for_the_call() {
    let _g = serial();
    let p = Pair::new("self", &[]);
    let got: Arc<Mutex<Vec<(bool, bool)>>> = Arc::default();
    let g = got.clone();
    p.b.set_am_recv_handler(
        4,
        Some(move |m: &mut AmMsg<'_>| {
            let persistent = m.data_persistent();
            g.lock().unwrap().push((persistent, m.take_data().is_some()));
        }),
        AmHandlerFlags::empty(),
    )
    .unwrap();
    assert_eq!(p.send(4, b"", b"small", AmSendFlags::empty()), Status::Ok);
    p.wait_until(|| !got.lock().unwrap().is_empty());
    let (persistent, taken) = got.lock().unwrap()[0];
    assert_eq!(persistent, taken);
}

/// A message to an id without a handler is dropped; a handler set later gets later messages;
/// a handler that replaces itself mid-stream hands the rest to its successor.
#[test]
fn handlers_missing_replaced_and_removed() {
    let _g = serial();
    let p = Pair::new("posix", &[]);
    assert_eq!(p.send(9, b"", b"lost", AmSendFlags::empty()), Status::Ok);
    for _ in 0..100 {
        p.progress();
    }
    let second: Log = Arc::default();
    let first_count = Arc::new(Mutex::new(0usize));
    let (s2, c1, wb) = (second.clone(), first_count.clone(), p.b.clone());
    p.b.set_am_recv_handler(
        9,
        Some(move |_m: &mut AmMsg<'_>| {
            let mut c = c1.lock().unwrap();
            *c += 1;
            if *c == 10 {
                // Replaced from inside its own call: the next message goes to the new one.
                let s2 = s2.clone();
                wb.set_am_recv_handler(
                    9,
                    Some(move |m: &mut AmMsg<'_>| {
                        s2.lock().unwrap().push(Seen {
                            id: m.id(),
                            hdr: m.header().to_vec(),
                            data: m.data().to_vec(),
                            reply: false,
                            persistent: false,
                        })
                    }),
                    AmHandlerFlags::empty(),
                )
                .unwrap();
            }
        }),
        AmHandlerFlags::empty(),
    )
    .unwrap();
    for i in 0..30u8 {
        assert_eq!(p.send(9, &[i], &[i; 3], AmSendFlags::empty()), Status::Ok);
    }
    p.wait_until(|| second.lock().unwrap().len() >= 20);
    assert_eq!(*first_count.lock().unwrap(), 10, "the lost message never reached a handler");
    let s = second.lock().unwrap().clone();
    assert_eq!(s.iter().map(|x| x.hdr[0]).collect::<Vec<_>>(), (10..30).collect::<Vec<u8>>());
    // Removed: later messages are dropped.
    p.b.set_am_recv_handler(9, None::<fn(&mut AmMsg<'_>)>, AmHandlerFlags::empty()).unwrap();
    assert_eq!(p.send(9, b"", b"gone", AmSendFlags::empty()), Status::Ok);
    for _ in 0..100 {
        p.progress();
    }
    assert_eq!(second.lock().unwrap().len(), 20);
}

/// Iov data, a header longer than the limit, and contradicting flags.
#[test]
fn iov_data_and_errors() {
    let _g = serial();
    let p = Pair::new("posix", &[]);
    let log = record(&p.b, 5, AmHandlerFlags::empty());
    let (mut x, mut y) = (pattern(3000, 1), pattern(9000, 2));
    let iov = [IoVec { buffer: x.as_mut_ptr(), length: x.len() }, IoVec { buffer: y.as_mut_ptr(), length: y.len() }];
    // SAFETY: the buffers and the list outlive the send (waited for below).
    let r = unsafe { p.ep.am_send_nbx(5, b"iov", SendData::Iov(&iov), AmSendFlags::empty(), RequestParam::new()) };
    if let Some(req) = r.unwrap() {
        p.wait_until(|| req.is_completed());
        assert_eq!(req.status(), Status::Ok);
    }
    p.wait_until(|| !log.lock().unwrap().is_empty());
    let mut want = x.clone();
    want.extend_from_slice(&y);
    assert!(log.lock().unwrap()[0].data == want);
    let big = vec![0u8; p.a.am_max_header() + 1];
    assert_eq!(p.send(5, &big, b"", AmSendFlags::empty()), Status::InvalidParam);
    assert_eq!(p.send(5, b"", b"data", AmSendFlags::RNDV | AmSendFlags::EAGER), Status::InvalidParam);
}

/// The owned-buffer form: the future resolves to the data; the header is copied.
#[test]
fn owned_send_future() {
    let _g = serial();
    let p = Pair::new("posix", &[]);
    let log = record(&p.b, 6, AmHandlerFlags::empty());
    let mut futs = Vec::new();
    for i in 0..50usize {
        let hdr = vec![i as u8; 10];
        futs.push(p.ep.am_send(6, &hdr, pattern(i * 1000, i as u8), AmSendFlags::empty()));
        drop(hdr);
    }
    for (i, f) in futs.into_iter().enumerate() {
        let mut f = std::pin::pin!(f);
        let waker = noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let t0 = std::time::Instant::now();
        let (buf, r) = loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                break v;
            }
            p.progress();
            assert!(t0.elapsed() < std::time::Duration::from_secs(30));
        };
        assert_eq!(r, Ok(()));
        assert!(buf == pattern(i * 1000, i as u8));
    }
    p.wait_until(|| log.lock().unwrap().len() >= 50);
    for (i, g) in log.lock().unwrap().iter().enumerate() {
        assert_eq!(g.hdr, vec![i as u8; 10]);
        assert!(g.data == pattern(i * 1000, i as u8));
    }
}

// ---- rendezvous -----------------------------------------------------------------------------

type Futs = Arc<Mutex<Vec<(u16, Vec<u8>, ucp::RecvFuture<Vec<u8>>)>>>;

/// Polls every future of `futs` to completion, progressing the pair; the buffers and outcomes.
/// A received rendezvous message: id, header, the buffer and the outcome.
type Received = (u16, Vec<u8>, Vec<u8>, Result<ucp::RecvInfo, Status>);

fn finish_all(p: &Pair, futs: &Futs, n: usize) -> Vec<Received> {
    p.wait_until(|| futs.lock().unwrap().len() >= n);
    let waker = noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut out = Vec::new();
    let all = std::mem::take(&mut *futs.lock().unwrap());
    for (id, hdr, f) in all {
        let mut f = std::pin::pin!(f);
        let t0 = std::time::Instant::now();
        let (buf, r) = loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                break v;
            }
            p.progress();
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "a receive did not complete");
        };
        out.push((id, hdr, buf, r));
    }
    out
}

/// A handler that receives every rendezvous message's data from inside the call.
fn receive_in_handler(w: &Worker, id: u16) -> Futs {
    let futs: Futs = Arc::default();
    let f = futs.clone();
    w.set_am_recv_handler(
        id,
        Some(move |m: &mut AmMsg<'_>| {
            assert!(m.is_rndv(), "an eager message of {} bytes", m.length());
            assert!(m.data().is_empty());
            let (len, hdr) = (m.length(), m.header().to_vec());
            let w = m.worker().expect("the worker");
            let d = m.take_rndv().expect("a descriptor");
            assert!(m.take_rndv().is_none(), "taken twice");
            f.lock().unwrap().push((m.id(), hdr, w.am_recv_data(d, vec![0u8; len])));
        }),
        AmHandlerFlags::empty(),
    )
    .unwrap();
    futs
}

/// Rendezvous active messages in every scheme, received from inside the handler: sizes from
/// the threshold to 1 MiB, headers and reply endpoints; the sender completes once the
/// receiver has the data.
#[test]
fn rendezvous_in_every_scheme() {
    let _g = serial();
    for (tls, scheme) in [("posix,cma", "am"), ("posix,cma", "get_zcopy"), ("posix,cma", "put_zcopy"), ("self", "auto")]
    {
        let p = Pair::new(tls, &[("RNDV_THRESH", "1024"), ("RNDV_SCHEME", scheme)]);
        let futs = receive_in_handler(&p.b, 11);
        let sizes = [1024usize, 5000, 65_536, 1 << 20];
        let mut sent = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            for (hlen, flags) in [(0usize, AmSendFlags::empty()), (40, AmSendFlags::REPLY)] {
                let data = pattern(n, i as u8);
                let hdr = pattern(hlen, 100 + i as u8);
                assert_eq!(p.send(11, &hdr, &data, flags), Status::Ok, "{tls} {scheme}: {n} bytes");
                sent.push((hdr, data));
            }
        }
        let got = finish_all(&p, &futs, sent.len());
        for ((id, h, buf, r), (hdr, data)) in got.iter().zip(&sent) {
            assert_eq!((*id, h), (11, hdr));
            assert_eq!(r.as_ref().map(|i| i.length), Ok(data.len()), "{tls} {scheme}");
            assert!(buf == data, "{tls} {scheme}: {} bytes", data.len());
        }
        let c = p.b.proto_counts();
        let ran = match scheme {
            "get_zcopy" => c.rndv_get,
            "put_zcopy" => c.rndv_put,
            _ => c.rndv_am + c.rndv_get + c.rndv_put,
        };
        assert!(ran > 0, "{tls} {scheme}: {c:?}");
    }
}

/// Descriptors kept past the handler are received later, in any order; one dropped in the
/// handler completes its sender with `Ok`, one dropped after being taken with `Canceled`; a
/// message with no handler fails its sender with `InvalidParam`; a short buffer truncates.
#[test]
fn rendezvous_kept_dropped_and_truncated() {
    let _g = serial();
    let p = Pair::new("posix,cma", &[("RNDV_THRESH", "1024")]);
    let kept: Arc<Mutex<Vec<(usize, ucp::AmRndv)>>> = Arc::default();
    let k = kept.clone();
    p.b.set_am_recv_handler(
        12,
        Some(move |m: &mut AmMsg<'_>| {
            // Header byte 0: 1 keeps the descriptor, 0 drops it.
            if m.header()[0] == 1 {
                k.lock().unwrap().push((m.length(), m.take_rndv().unwrap()));
            }
        }),
        AmHandlerFlags::empty(),
    )
    .unwrap();
    // The sender's request, waited for below.
    let send = |hdr: &[u8], data: &[u8]| -> Status { p.send(12, hdr, data, AmSendFlags::empty()) };
    // Dropped in the handler: the sender completes with Ok.
    assert_eq!(send(&[0], &pattern(3000, 1)), Status::Ok);
    // Kept: the sends complete only once the data is received; start them, then receive.
    let datas: Vec<Vec<u8>> = (0..4).map(|i| pattern(2000 + i * 10_000, i as u8)).collect();
    let mut reqs = Vec::new();
    for d in &datas {
        // SAFETY: `datas` outlives the requests (all waited for below).
        let r = unsafe { p.ep.am_send_nbx(12, &[1], SendData::Contig(d), AmSendFlags::empty(), RequestParam::new()) };
        reqs.push(r.unwrap().expect("a rendezvous send waits for the receiver"));
    }
    p.wait_until(|| kept.lock().unwrap().len() >= 4);
    for _ in 0..1000 {
        p.progress();
    }
    assert!(reqs.iter().all(|r| !r.is_completed()), "a sender completed before its data was received");
    let mut ds = std::mem::take(&mut *kept.lock().unwrap());
    // Received in reverse order; the third into a short buffer; the last dropped.
    let (len3, last) = ds.pop().unwrap();
    drop(last);
    p.wait_until(|| reqs[3].is_completed());
    assert_eq!((len3, reqs[3].status()), (datas[3].len(), Status::Canceled));
    let (len2, d2) = ds.pop().unwrap();
    let mut short = vec![0u8; len2 - 1];
    // SAFETY: `short` outlives the request (waited for).
    let r = unsafe { p.b.am_recv_data_nbx(d2, RecvData::Contig(&mut short), RequestParam::new()) }.unwrap();
    p.wait_until(|| r.is_completed());
    assert_eq!(r.status(), Status::MessageTruncated);
    p.wait_until(|| reqs[2].is_completed());
    drop(r);
    for (i, (len, d)) in ds.into_iter().enumerate().rev() {
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` outlives the request (waited for).
        let r = unsafe { p.b.am_recv_data_nbx(d, RecvData::Contig(&mut buf), RequestParam::new()) }.unwrap();
        p.wait_until(|| r.is_completed());
        assert_eq!(r.status(), Status::Ok);
        drop(r);
        assert!(buf == datas[i], "message {i}");
        p.wait_until(|| reqs[i].is_completed());
        assert_eq!(reqs[i].status(), Status::Ok);
    }
    // No handler for the id: the sender fails.
    assert_eq!(p.send(13, b"", &pattern(5000, 9), AmSendFlags::empty()), Status::InvalidParam);
    // The protocol flags: rendezvous for 10 bytes, eager for 100,000.
    let futs = receive_in_handler(&p.b, 14);
    let before = p.a.proto_counts();
    assert_eq!(p.send(14, b"", &pattern(10, 3), AmSendFlags::RNDV), Status::Ok);
    let got = finish_all(&p, &futs, 1);
    assert!(got[0].2 == pattern(10, 3));
    let eager = record(&p.b, 15, AmHandlerFlags::empty());
    assert_eq!(p.send(15, b"", &pattern(100_000, 4), AmSendFlags::EAGER), Status::Ok);
    p.wait_until(|| !eager.lock().unwrap().is_empty());
    assert!(eager.lock().unwrap()[0].data == pattern(100_000, 4));
    let after = p.a.proto_counts();
    assert!(after.eager_multi > before.eager_multi, "{after:?}");
}
