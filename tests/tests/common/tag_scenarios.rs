//! The MPI tag-matching scenarios shared by the tag tests (`ucp_tag` over self and shared
//! memory, `ucp_tag_ib` over InfiniBand lanes): senders in this process or in peer processes
//! (this package's `ucp-peer tag`, driven by commands), receive helpers, and the scenarios
//! themselves. Include with `#[path = "common/tag_scenarios.rs"] mod scenarios;`.

#![allow(dead_code)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tests::peer::{start_ucp_peer, Peer};
use tests::tag::start_send;
use tests::text::{pattern, unhex};
use ucp::{
    Context, ContextParams, Endpoint, Features, RecvData, RecvInfo, RecvResult, Request, RequestParam, Status, Worker,
    FULL_MASK,
};

/// Busy-polling tests of this file run one at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub const TIMEOUT: Duration = Duration::from_secs(30);
pub const BIG: usize = 200_000;

/// A TAG context over `tls` with configuration overrides.
pub fn context(tls: &str, cfg: &[(&str, &str)]) -> Context {
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let mut p = ContextParams::new(Features::TAG).with_config("TLS", tls);
    for (k, v) in cfg {
        p = p.with_config(k, v);
    }
    Context::new(&p).unwrap()
}

/// Something that sends on request: the same worker (self), or a peer process.
pub trait Sender {
    /// Starts sending `pattern(len, seed)` with `tag`.
    fn send(&mut self, w: &Worker, tag: u64, len: usize, seed: u64, sync: bool);
    /// Sends not yet complete.
    fn pending(&mut self, w: &Worker) -> usize;
    /// Waits until every send completed (progressing `w`).
    fn flush(&mut self, w: &Worker) {
        let t = Instant::now();
        while self.pending(w) > 0 {
            w.progress();
            assert!(t.elapsed() < TIMEOUT, "sends did not complete");
        }
    }
}

/// Sends over an endpoint of the receiving worker to itself.
pub struct LocalSender {
    ep: &'static Endpoint,
    bufs: Vec<(Vec<u8>, Option<Request<'static>>)>,
}

impl LocalSender {
    pub fn new(w: &Worker) -> Self {
        // Leaked so requests can borrow it for the rest of the test process.
        LocalSender { ep: Box::leak(Box::new(w.ep_create(w.address()).unwrap())), bufs: Vec::new() }
    }
}

impl Sender for LocalSender {
    fn send(&mut self, _w: &Worker, tag: u64, len: usize, seed: u64, sync: bool) {
        self.bufs.push(start_send(self.ep, tag, len, seed, sync));
    }

    fn pending(&mut self, _w: &Worker) -> usize {
        self.bufs.retain(|(_, r)| r.as_ref().is_some_and(|r| !r.is_completed()));
        self.bufs.len()
    }
}

/// A sender process (`ucp-peer tag`).
pub struct RemoteSender {
    peer: Peer,
}

impl RemoteSender {
    /// Starts a peer process over transports `tls` with configuration `cfg`.
    pub fn spawn(w: &Worker, tls: &str, cfg: &[(&str, &str)]) -> Self {
        Self::start(w, tls, cfg, false)
    }

    /// Starts a peer that connects only on [`RemoteSender::connect`]; returns it and its
    /// worker address.
    pub fn spawn_deferred(w: &Worker, tls: &str, cfg: &[(&str, &str)]) -> (Self, Vec<u8>) {
        let mut s = Self::start(w, tls, cfg, true);
        let a = s.peer.expect("addr", TIMEOUT, || {});
        (s, unhex(&a).expect("an address in hex"))
    }

    /// The peer's protocol counts (`ProtoCounts` in Debug form): what its sends used.
    pub fn counts(&mut self, w: &Worker) -> String {
        self.ask(w, "counts")
    }

    /// Lets a deferred peer create its endpoint to us.
    pub fn connect(&mut self, w: &Worker) {
        assert_eq!(self.ask(w, "connect"), "connecting");
    }

    /// Asks the peer to receive `pattern(len, seed)` with `tag`; returns its answer
    /// (`received` when the data was right).
    pub fn recv(&mut self, w: &Worker, tag: u64, len: usize, seed: u64) -> String {
        self.ask(w, &format!("recv {tag} {len} {seed}"))
    }

    fn start(w: &Worker, tls: &str, cfg: &[(&str, &str)], defer: bool) -> Self {
        let args: &[&str] = if defer { &["defer"] } else { &[] };
        RemoteSender { peer: start_ucp_peer(env!("CARGO_BIN_EXE_ucp-peer"), "tag", args, w, tls, cfg) }
    }

    /// Sends a command; returns the answer, progressing `w` meanwhile.
    fn ask(&mut self, w: &Worker, line: &str) -> String {
        self.peer.ask(line, TIMEOUT, || {
            w.progress();
        })
    }

    /// Makes the peer send `count` messages of `len` bytes tagged `tag`, `tag + 1`, ... back
    /// to back (the pattern seed of each is its tag). The peer starts once this returns, so
    /// nothing of the burst arrives while `w` is progressed here.
    pub fn burst(&mut self, w: &Worker, tag: u64, len: usize, count: u64) {
        assert_eq!(self.ask(w, &format!("burst {tag} {len} {count}")), "ready");
        self.peer.tell("go");
    }

    /// The peer's endpoint lanes once wired up: `connected usage=transport ...`.
    pub fn lanes(&mut self, w: &Worker) -> String {
        self.ask(w, "lanes")
    }
}

impl Sender for RemoteSender {
    fn send(&mut self, w: &Worker, tag: u64, len: usize, seed: u64, sync: bool) {
        let a = self.ask(w, &format!("send {tag} {len} {seed} {}", sync as u8));
        assert_eq!(a, "started");
    }

    fn pending(&mut self, w: &Worker) -> usize {
        self.ask(w, "pending").parse().unwrap()
    }
}

// ---- receive helpers ---------------------------------------------------------------------------

pub struct Recv {
    buf: Vec<u8>,
    req: Option<Request<'static>>,
    done: Option<Result<RecvInfo, Status>>,
}

/// Posts a receive into a `cap`-byte buffer (with 16 guard bytes after it).
pub fn post(w: &'static Worker, tag: u64, mask: u64, cap: usize) -> Recv {
    let mut buf = vec![0xa5u8; cap + 16];
    // SAFETY: the Vec's heap buffer is kept in `Recv` until the request completed (`wait`).
    let r = unsafe {
        w.tag_recv_nbx(
            RecvData::Contig(std::slice::from_raw_parts_mut(buf.as_mut_ptr(), cap)),
            tag,
            mask,
            RequestParam::new(),
        )
    };
    match r {
        Ok(RecvResult::Done(i)) => Recv { buf, req: None, done: Some(Ok(i)) },
        Ok(RecvResult::Pending(req)) => Recv { buf, req: Some(req), done: None },
        Err(e) => Recv { buf, req: None, done: Some(Err(e)) },
    }
}

impl Recv {
    fn poll(&mut self) -> bool {
        if self.done.is_none() {
            if let Some(r) = &self.req {
                if r.is_completed() {
                    self.done = Some(match r.status() {
                        Status::Ok => Ok(r.recv_info().unwrap()),
                        e => Err(e),
                    });
                    self.req = None;
                }
            }
        }
        self.done.is_some()
    }

    fn wait(&mut self, w: &Worker) -> Result<RecvInfo, Status> {
        let t = Instant::now();
        while !self.poll() {
            w.progress();
            assert!(t.elapsed() < TIMEOUT, "receive did not complete");
        }
        let cap = self.buf.len() - 16;
        assert!(self.buf[cap..].iter().all(|&b| b == 0xa5), "a receive wrote past its buffer");
        self.done.unwrap()
    }

    pub fn check(&mut self, w: &Worker, len: usize, seed: u64, tag: u64) {
        let info = self.wait(w).unwrap_or_else(|e| panic!("receive of {len} B (seed {seed}) failed: {e}"));
        assert_eq!((info.length, info.sender_tag), (len, tag), "seed {seed}");
        assert!(self.buf[..len] == pattern(len, seed)[..], "{len} B (seed {seed}): wrong data");
    }
}

// ---- scenarios ---------------------------------------------------------------------------------

pub fn non_overtaking(w: &'static Worker, s: &mut dyn Sender) {
    // Unexpected: both arrive before the receives.
    s.send(w, 1, BIG, 1, false);
    s.send(w, 1, 100, 2, false);
    let t = Instant::now();
    while w.stats().2 < 2 {
        w.progress();
        assert!(t.elapsed() < TIMEOUT);
    }
    let mut a = post(w, 1, FULL_MASK, BIG);
    let mut b = post(w, 1, FULL_MASK, BIG);
    a.check(w, BIG, 1, 1);
    b.check(w, 100, 2, 1);
    // Expected: receives first.
    let mut a = post(w, 1, FULL_MASK, BIG);
    let mut b = post(w, 1, FULL_MASK, BIG);
    s.send(w, 1, BIG, 3, false);
    s.send(w, 1, 100, 4, false);
    a.check(w, BIG, 3, 1);
    b.check(w, 100, 4, 1);
    s.flush(w);
}

pub fn posting_order(w: &'static Worker, s: &mut dyn Sender) {
    let mut r1 = post(w, 5, FULL_MASK, BIG);
    let mut r2 = post(w, 0, 0, BIG);
    let mut r3 = post(w, 5, FULL_MASK, BIG);
    let mut r4 = post(w, 0x700, 0xf00, BIG);
    let mut r5 = post(w, 0, 0, BIG);
    for (i, (tag, len)) in [(5u64, 10usize), (5, 20_000), (5, 30), (0x712, BIG), (9, 0)].into_iter().enumerate() {
        s.send(w, tag, len, 10 + i as u64, false);
    }
    r1.check(w, 10, 10, 5);
    r2.check(w, 20_000, 11, 5);
    r3.check(w, 30, 12, 5);
    r4.check(w, BIG, 13, 0x712);
    r5.check(w, 0, 14, 9);
    s.flush(w);
}

pub fn probe_cancel_truncate(w: &'static Worker, s: &mut dyn Sender) {
    // Probe for a message sent later, eager and rendezvous.
    for (len, seed) in [(100usize, 20u64), (BIG, 21)] {
        assert!(w.tag_probe(30, FULL_MASK, false).is_none());
        s.send(w, 30, len, seed, false);
        let t = Instant::now();
        let (info, msg) = loop {
            if let Some(x) = w.tag_probe(30, FULL_MASK, true) {
                break x;
            }
            assert!(t.elapsed() < TIMEOUT, "probe never saw the message");
            w.progress();
        };
        assert_eq!(info.length, len);
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` outlives the wait below.
        let r = unsafe { w.tag_msg_recv_nbx(RecvData::Contig(&mut buf), msg.unwrap(), RequestParam::new()) }.unwrap();
        assert_eq!(r.wait().unwrap().length, len);
        assert!(buf == pattern(len, seed));
    }
    s.flush(w);
    // Cancel exact and wildcard receives: the message goes to the receive posted after them.
    let mut exact = post(w, 40, FULL_MASK, 64);
    let mut wild = post(w, 0, 0, 64);
    exact.req.as_ref().unwrap().cancel();
    wild.req.as_ref().unwrap().cancel();
    assert_eq!(exact.wait(w), Err(Status::Canceled));
    assert_eq!(wild.wait(w), Err(Status::Canceled));
    s.send(w, 40, 50, 22, false);
    let mut r = post(w, 40, FULL_MASK, 64);
    r.check(w, 50, 22, 40);
    // Truncation, eager and rendezvous, expected and unexpected; then 1 B into a large buffer.
    for len in [1000usize, BIG] {
        let mut r = post(w, 41, FULL_MASK, 10);
        s.send(w, 41, len, 23, false);
        assert_eq!(r.wait(w), Err(Status::MessageTruncated));
        s.send(w, 41, len, 24, false);
        let t = Instant::now();
        while w.stats().2 == 0 {
            w.progress();
            assert!(t.elapsed() < TIMEOUT, "the message never arrived");
        }
        let mut r = post(w, 41, FULL_MASK, 10);
        assert_eq!(r.wait(w), Err(Status::MessageTruncated));
    }
    s.send(w, 42, 1, 25, false);
    let mut r = post(w, 42, FULL_MASK, 1 << 20);
    r.check(w, 1, 25, 42);
    s.flush(w);
}

pub fn sync_and_zero(w: &'static Worker, s: &mut dyn Sender) {
    for len in [0usize, 100, 20_000, BIG] {
        s.send(w, 50, len, 30, true);
        // The message (or its rendezvous request) arrives and waits unexpected; the send must
        // stay incomplete until a receive matches it.
        let t = Instant::now();
        while w.stats().2 == 0 {
            w.progress();
            assert!(t.elapsed() < TIMEOUT, "the sync send of {len} B never arrived");
        }
        for _ in 0..100 {
            w.progress();
        }
        assert_eq!(s.pending(w), 1, "sync send of {len} B completed before a receive matched it");
        let mut r = post(w, 50, FULL_MASK, BIG);
        r.check(w, len, 30, 50);
        s.flush(w);
    }
    s.send(w, 51, 0, 31, false);
    let mut r = post(w, 51, FULL_MASK, 0);
    r.check(w, 0, 31, 51);
    s.flush(w);
}

/// Many senders, many messages, nothing posted yet: everything arrives, in order per sender.
pub fn flood(w: &'static Worker, senders: &mut [&mut dyn Sender], per: usize) {
    let sizes = [0usize, 8, 300, 9000, 40_000];
    for i in 0..per {
        for (k, s) in senders.iter_mut().enumerate() {
            let len = sizes[(i + k) % sizes.len()];
            s.send(w, ((k as u64) << 32) | i as u64, len, (k * 100_000 + i) as u64, false);
        }
    }
    let mut next = vec![0usize; senders.len()];
    for _ in 0..per * senders.len() {
        let mut r = post(w, 0, 0, 64 * 1024);
        let info = r.wait(w).unwrap();
        let (k, i) = ((info.sender_tag >> 32) as usize, (info.sender_tag & 0xffff_ffff) as usize);
        assert_eq!(i, next[k], "sender {k}: message {i} overtook {}", next[k]);
        next[k] += 1;
        let len = sizes[(i + k) % sizes.len()];
        r.check(w, len, (k * 100_000 + i) as u64, info.sender_tag);
    }
    for s in senders.iter_mut() {
        s.flush(w);
    }
    assert_eq!(w.stats().2, 0, "unexpected messages left");
}

/// A receiver that probes before each receive and progresses only when the probe finds
/// nothing (the probe itself does not progress, as in UCX) keeps its unexpected queue short
/// however fast the sender is: a progress call moves at most a poll batch into it. (A probe that
/// progressed drained the transport on every call and the queue grew without bound, the way
/// `ucx-perf -U` runs.)
pub fn probe_paced(w: &'static Worker, s: &mut RemoteSender) {
    const N: u64 = 20_000;
    const TAG0: u64 = 7 << 40;
    assert_eq!(w.stats().2, 0, "unexpected messages left by an earlier scenario");
    s.burst(w, TAG0, 8, N);
    let mut drained = false;
    let mut most = 0;
    for i in 0..N {
        let t = Instant::now();
        let info = loop {
            if let Some((info, _)) = w.tag_probe(TAG0 + i, FULL_MASK, false) {
                break info;
            }
            // Messages of one sender arrive in order: nothing of this burst is queued now.
            drained = true;
            w.progress();
            assert!(t.elapsed() < TIMEOUT, "probe never saw message {i}");
        };
        assert_eq!((info.length, info.sender_tag), (8, TAG0 + i));
        if drained {
            most = most.max(w.stats().2);
        }
        let mut r = post(w, TAG0 + i, FULL_MASK, 8);
        r.check(w, 8, TAG0 + i, TAG0 + i);
    }
    s.flush(w);
    assert!(drained, "the receiver never caught up with the sender");
    assert!(most <= 64, "{most} unexpected messages queued at once behind a paced probe");
}

pub fn all_scenarios(w: &'static Worker, s: &mut dyn Sender, what: &str) {
    eprintln!("{what}: non-overtaking");
    non_overtaking(w, s);
    eprintln!("{what}: posting order");
    posting_order(w, s);
    eprintln!("{what}: probe, cancel, truncation");
    probe_cancel_truncate(w, s);
    eprintln!("{what}: sync and zero length");
    sync_and_zero(w, s);
}

/// Configurations forcing every protocol path.
pub const CONFIGS: &[(&str, &[(&str, &str)])] = &[
    ("default", &[]),
    ("rndv get_zcopy", &[("RNDV_THRESH", "1000"), ("RNDV_SCHEME", "get_zcopy")]),
    ("rndv put_zcopy", &[("RNDV_THRESH", "1000"), ("RNDV_SCHEME", "put_zcopy")]),
    ("rndv am", &[("RNDV_THRESH", "1000"), ("RNDV_SCHEME", "am")]),
    ("no eager short", &[("BCOPY_THRESH", "0")]),
    ("eager zcopy", &[("ZCOPY_THRESH", "1000"), ("RNDV_THRESH", "inf")]),
];
