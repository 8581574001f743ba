//! The stream API in one process (over `self` and between two workers over posix, with and
//! without eager short and with eager zero-copy thresholds that do not apply there): bytes
//! arrive exactly once and in order however sends and receives are sized; `WAITALL`;
//! zero-copy receive and release; poll; a dropped receive future gives its bytes back; and a
//! property test of random sends against random receives.

mod common;

use common::noop_waker;
use std::future::Future;
use std::sync::Mutex;

use proptest::prelude::*;
use ucp::{
    Context, ContextParams, Endpoint, Features, RecvData, RecvResult, RequestParam, SendData, Status, StreamRecvFlags,
    Worker, WorkerParams,
};

/// Busy-polling tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Two workers (one for `self`), an endpoint each way.
struct Pair {
    a: Worker,
    b: Worker,
    ab: Endpoint,
    /// `b`'s endpoint to `a` (the one `a`'s bytes arrive on).
    ba: Endpoint,
}

impl Pair {
    fn new(tls: &str, extra: &[(&str, &str)]) -> Pair {
        uct_shm::register();
        let mut p = ContextParams::new(Features::STREAM).with_config("TLS", tls);
        for (k, v) in extra {
            p = p.with_config(k, v);
        }
        let c = Context::new(&p).unwrap();
        let a = Worker::new(&c, &WorkerParams::new("a")).unwrap();
        if tls == "self" {
            let ab = a.ep_create(a.address()).unwrap();
            let p = Pair { b: a.clone(), ba: ab.clone(), a, ab };
            p.wire_up();
            return p;
        }
        let b = Worker::new(&c, &WorkerParams::new("b")).unwrap();
        let ab = a.ep_create(b.address()).unwrap();
        p_wire(&a, &b, &ab);
        // b's endpoint to a: the one wireup made for a's (found by poll once bytes came).
        let probe = [0x5au8];
        send_all(&a, &b, &ab, &probe);
        let t0 = std::time::Instant::now();
        let ba = loop {
            a.progress();
            b.progress();
            if let Some(e) = b.stream_poll(8).unwrap().into_iter().next() {
                break e;
            }
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "no stream data arrived");
        };
        let mut one = [0u8; 1];
        // SAFETY: `one` outlives the receive (completed at once: the byte is there).
        match unsafe { ba.stream_recv_nbx(RecvData::Contig(&mut one), StreamRecvFlags::empty(), RequestParam::new()) }
            .unwrap()
        {
            RecvResult::Done(i) => assert_eq!((i.length, one), (1, probe)),
            RecvResult::Pending(_) => panic!("the probe byte is queued"),
        }
        Pair { a, b, ab, ba }
    }

    fn wire_up(&self) {
        p_wire(&self.a, &self.b, &self.ab);
    }

    fn progress(&self) {
        self.a.progress();
        if !std::ptr::eq(&self.a, &self.b) {
            self.b.progress();
        }
    }

    fn wait_until(&self, mut done: impl FnMut() -> bool) {
        let t0 = std::time::Instant::now();
        while !done() {
            self.progress();
            assert!(t0.elapsed() < std::time::Duration::from_secs(60), "timed out");
        }
    }
}

fn p_wire(a: &Worker, b: &Worker, ab: &Endpoint) {
    if let Some(r) = ab.flush_nbx(RequestParam::new()).unwrap() {
        let t0 = std::time::Instant::now();
        while !r.is_completed() {
            a.progress();
            b.progress();
            assert!(t0.elapsed() < std::time::Duration::from_secs(30));
        }
    }
}

fn send_all(a: &Worker, b: &Worker, ab: &Endpoint, data: &[u8]) {
    // SAFETY: `data` outlives the request (waited for).
    if let Some(r) = unsafe { ab.stream_send_nbx(SendData::Contig(data), RequestParam::new()) }.unwrap() {
        let t0 = std::time::Instant::now();
        while !r.is_completed() {
            a.progress();
            b.progress();
            assert!(t0.elapsed() < std::time::Duration::from_secs(30));
        }
        assert_eq!(r.status(), Status::Ok);
    }
}

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Sends `sends` (sizes) of a running byte pattern while receiving with `recvs` (sizes, and
/// WAITALL or not) in turn, interleaved; checks every byte arrived once and in order.
fn transfer(p: &Pair, sends: &[usize], recvs: &[(usize, bool)], what: &str) {
    let total: usize = sends.iter().sum();
    let stream: Vec<u8> = (0..total).map(|i| (i as u64).wrapping_mul(2654435761).wrapping_shr(7) as u8).collect();
    let mut got: Vec<u8> = Vec::with_capacity(total);
    let mut sent = 0usize;
    let mut pending_sends = Vec::new();
    let mut si = 0;
    let mut ri = 0;
    let waker = noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut recv: Option<std::pin::Pin<Box<ucp::RecvFuture<Vec<u8>>>>> = None;
    let t0 = std::time::Instant::now();
    while got.len() < total {
        // Up to 64 sends in flight.
        while si < sends.len() && pending_sends.len() < 64 {
            let n = sends[si];
            pending_sends.push(Box::pin(p.ab.stream_send(stream[sent..sent + n].to_vec())));
            sent += n;
            si += 1;
        }
        pending_sends.retain_mut(|f| match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready((_, r)) => {
                r.unwrap_or_else(|e| panic!("{what}: a send failed: {e}"));
                false
            }
            std::task::Poll::Pending => true,
        });
        if recv.is_none() {
            let (n, waitall) = recvs[ri % recvs.len()];
            ri += 1;
            let n = n.min(total - got.len()).max(1);
            let flags = if waitall { StreamRecvFlags::WAITALL } else { StreamRecvFlags::empty() };
            recv = Some(Box::pin(p.ba.stream_recv(vec![0u8; n], flags)));
        }
        if let Some(f) = recv.as_mut() {
            if let std::task::Poll::Ready((buf, r)) = f.as_mut().poll(&mut cx) {
                let info = r.unwrap_or_else(|e| panic!("{what}: a receive failed: {e}"));
                assert!(
                    info.length > 0 && info.length <= buf.len(),
                    "{what}: {} bytes into {}",
                    info.length,
                    buf.len()
                );
                got.extend_from_slice(&buf[..info.length]);
                recv = None;
            }
        }
        p.progress();
        assert!(t0.elapsed() < std::time::Duration::from_secs(120), "{what}: {} of {total} bytes", got.len());
    }
    let first_bad = got.iter().zip(&stream).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "{what}: the stream differs");
    assert_eq!(got.len(), total);
}

fn random_sizes(seed: u64, n: usize, max: u64) -> Vec<usize> {
    let mut r = Rng(seed);
    (0..n)
        .map(|_| {
            // Mostly small, some up to `max`.
            if r.below(10) == 0 {
                1 + r.below(max) as usize
            } else {
                1 + r.below(200) as usize
            }
        })
        .collect()
}

#[test]
fn random_sends_against_random_receives() {
    let _g = serial();
    for (tls, extra) in
        [("self", &[][..]), ("posix", &[][..]), ("posix", &[("BCOPY_THRESH", "0")][..]), ("sysv", &[][..])]
    {
        let p = Pair::new(tls, extra);
        let what = format!("{tls} {extra:?}");
        let sends = random_sizes(1, 6_000, 300_000);
        let mut r = Rng(2);
        let recvs: Vec<(usize, bool)> = (0..500).map(|_| (1 + r.below(100_000) as usize, r.below(2) == 0)).collect();
        transfer(&p, &sends, &recvs, &what);
        // Tiny receives against large sends, and the other way round.
        transfer(&p, &[1 << 20, 3, 1 << 18], &[(1, false), (7, true), (4096, false)], &what);
        transfer(&p, &random_sizes(3, 5000, 50), &[(1 << 20, true), (1 << 16, false)], &what);
    }
}

/// `recv_data` hands out the queued pieces in order without a copy; poll names the endpoint
/// once until more comes; receives take from the queue first.
#[test]
fn recv_data_release_and_poll() {
    let _g = serial();
    let p = Pair::new("posix", &[]);
    assert!(p.ba.stream_recv_data_nb().unwrap().is_none(), "nothing queued yet");
    assert!(p.b.stream_poll(8).unwrap().is_empty());
    let pieces: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + i as usize * 1000]).collect();
    for x in &pieces {
        send_all(&p.a, &p.b, &p.ab, x);
    }
    let all: Vec<u8> = pieces.concat();
    p.wait_until(|| !p.b.stream_poll(8).unwrap().is_empty());
    assert!(p.b.stream_poll(8).unwrap().is_empty(), "polled once until more comes");
    // A receive of 50 bytes, then zero-copy pieces, kept and released out of order.
    let mut head = [0u8; 50];
    // SAFETY: `head` outlives the receive (completed at once).
    let r = unsafe { p.ba.stream_recv_nbx(RecvData::Contig(&mut head), StreamRecvFlags::WAITALL, RequestParam::new()) };
    assert!(matches!(r.unwrap(), RecvResult::Done(i) if i.length == 50));
    let mut got = head.to_vec();
    let mut kept = Vec::new();
    while got.len() + kept.iter().map(|d: &ucp::StreamData| d.len()).sum::<usize>() < all.len() {
        match p.ba.stream_recv_data_nb().unwrap() {
            Some(d) => kept.push(d),
            None => p.progress(),
        }
    }
    for d in &kept {
        got.extend_from_slice(d);
    }
    assert!(got == all, "the zero-copy pieces");
    let half = kept.split_off(kept.len() / 2);
    drop(half);
    for d in kept {
        p.b.stream_data_release(d);
    }
}

/// A WAITALL receive that got part of its bytes and is dropped gives them back: the next
/// receive gets them, in order.
#[test]
fn dropped_receive_gives_its_bytes_back() {
    let _g = serial();
    let p = Pair::new("posix", &[]);
    let waker = noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    {
        let mut f = Box::pin(p.ba.stream_recv(vec![0u8; 1000], StreamRecvFlags::WAITALL));
        send_all(&p.a, &p.b, &p.ab, &[1u8; 300]);
        for _ in 0..1000 {
            p.progress();
            assert!(f.as_mut().poll(&mut cx).is_pending(), "300 bytes cannot fill 1000");
        }
    }
    send_all(&p.a, &p.b, &p.ab, &[2u8; 10]);
    let mut f = Box::pin(p.ba.stream_recv(vec![0u8; 310], StreamRecvFlags::WAITALL));
    let t0 = std::time::Instant::now();
    let (buf, r) = loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            break v;
        }
        p.progress();
        assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    };
    assert_eq!(r.unwrap().length, 310);
    assert!(buf[..300].iter().all(|&b| b == 1) && buf[300..].iter().all(|&b| b == 2), "{buf:?}");
}

/// What the detached receives' callback saw: (status, length) per completion.
static DETACHED: Mutex<Vec<(Status, usize)>> = Mutex::new(Vec::new());

fn detached_done(status: Status, info: ucp::RecvInfo, user_data: usize) {
    assert_eq!(user_data, 77);
    DETACHED.lock().unwrap().push((status, info.length));
}

/// Detached receives (no handle): one that finds bytes completes at once without its
/// callback; waiting ones complete in order through the callback with their lengths (one
/// partly filled, one WAITALL); `NO_IMM_CMPL` is refused; one still waiting when its endpoint
/// closes completes with an error, through the callback.
#[test]
fn detached_receives() {
    let _g = serial();
    DETACHED.lock().unwrap().clear();
    let p = Pair::new("posix", &[]);
    let param = || RequestParam::new().callback_fn(detached_done, 77);
    let (mut b1, mut b2, mut b3) = (vec![0u8; 64], vec![0u8; 100], vec![0u8; 50]);
    // SAFETY: (every receive below) the buffers outlive the receives, which complete (or fail)
    // before the test ends and are not touched meanwhile.
    unsafe {
        let r = p.ba.stream_recv_nbx_detached(RecvData::Contig(&mut b1), StreamRecvFlags::empty(), param());
        assert_eq!(r.unwrap(), None, "nothing has arrived");
        let r = p.ba.stream_recv_nbx_detached(RecvData::Contig(&mut b2), StreamRecvFlags::WAITALL, param());
        assert_eq!(r.unwrap(), None);
        let nic = RequestParam::new().flags(ucp::RequestFlags::NO_IMM_CMPL);
        let r = p.ba.stream_recv_nbx_detached(RecvData::Contig(&mut b3), StreamRecvFlags::empty(), nic);
        assert_eq!(r.unwrap_err(), Status::InvalidParam);
    }
    // 40 bytes complete the first receive (partly filled); 130 more fill the second (100,
    // WAITALL) and leave 30 queued.
    send_all(&p.a, &p.b, &p.ab, &[3u8; 40]);
    p.wait_until(|| DETACHED.lock().unwrap().len() == 1);
    send_all(&p.a, &p.b, &p.ab, &[4u8; 130]);
    p.wait_until(|| DETACHED.lock().unwrap().len() == 2);
    assert_eq!(*DETACHED.lock().unwrap(), [(Status::Ok, 40), (Status::Ok, 100)]);
    assert!(b1[..40].iter().all(|&b| b == 3) && b1[40..].iter().all(|&b| b == 0));
    assert!(b2.iter().all(|&b| b == 4));
    // SAFETY: as above.
    let r = unsafe { p.ba.stream_recv_nbx_detached(RecvData::Contig(&mut b3), StreamRecvFlags::empty(), param()) };
    assert_eq!(r.unwrap().map(|i| i.length), Some(30), "the queued bytes, at once");
    assert_eq!(DETACHED.lock().unwrap().len(), 2, "no callback for an immediate completion");
    // A receive still waiting when its endpoint closes fails through its callback.
    let mut b4 = vec![0u8; 10];
    // SAFETY: as above.
    let r = unsafe { p.ba.stream_recv_nbx_detached(RecvData::Contig(&mut b4), StreamRecvFlags::empty(), param()) };
    assert_eq!(r.unwrap(), None);
    let close = p.ba.close_nbx(ucp::CloseMode::Force).unwrap();
    p.wait_until(|| DETACHED.lock().unwrap().len() == 3 && close.is_completed());
    let (status, _) = DETACHED.lock().unwrap()[2];
    assert!(status.is_err(), "{status}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Random sends against random receives (sizes and WAITALL), against the model: the
    /// concatenation of the sends.
    #[test]
    fn stream_reassembly_matches_the_model(
        sends in proptest::collection::vec(1usize..20_000, 1..60),
        recvs in proptest::collection::vec((1usize..30_000, any::<bool>()), 1..20),
    ) {
        let _g = serial();
        thread_local!(static PAIR: Pair = Pair::new("posix", &[]));
        PAIR.with(|p| transfer(p, &sends, &recvs, "proptest"));
    }
}
