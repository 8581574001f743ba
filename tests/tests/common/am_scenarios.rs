//! Active-message scenarios across real processes, shared by `ucp_am` (shared memory) and
//! `ucp_am_ib` (InfiniBand in the VM). The peers are this package's `ucp-peer am`.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::future::Future;
use tests::peer::{start_ucp_peer, Peer};
use tests::text::pattern;

use ucp::{
    AmData, AmHandlerFlags, AmMsg, AmSendFlags, Context, ContextParams, Endpoint, Features, RecvFuture, RequestParam,
    SendData, Status, Worker, WorkerParams,
};

/// Busy-polling tests run one at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub const TIMEOUT: Duration = Duration::from_secs(120);

/// The configurations: as they come (rendezvous from the automatic threshold), without eager
/// short, and rendezvous from 4 KiB in the fragment and get schemes.
pub const CONFIGS: [(&str, &[(&str, &str)]); 4] = [
    ("defaults", &[]),
    ("no short", &[("BCOPY_THRESH", "0")]),
    ("rndv am", &[("RNDV_THRESH", "4096"), ("RNDV_SCHEME", "am")]),
    ("rndv get_zcopy", &[("RNDV_THRESH", "4096"), ("RNDV_SCHEME", "get_zcopy")]),
];

pub fn worker(tls: &str, cfg: &[(&str, &str)]) -> Worker {
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let mut p = ContextParams::new(Features::AM).with_config("TLS", tls);
    for (k, v) in cfg {
        p = p.with_config(k, v);
    }
    Worker::new(&Context::new(&p).unwrap(), &WorkerParams::new("am-test")).unwrap()
}

/// A peer process and our endpoint to it.
pub struct AmPeer {
    peer: Peer,
    ep: Endpoint,
}

impl AmPeer {
    pub fn spawn(w: &Worker, tls: &str, cfg: &[(&str, &str)]) -> AmPeer {
        let mut peer = start_ucp_peer(env!("CARGO_BIN_EXE_ucp-peer"), "am", &[], w, tls, cfg);
        let ep = peer.connect(w, TIMEOUT);
        AmPeer { peer, ep }
    }

    fn ask(&mut self, w: &Worker, line: &str) -> String {
        self.peer.ask(line, TIMEOUT, || {
            w.progress();
        })
    }
}

fn wait_until(w: &Worker, what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        w.progress();
        assert!(t.elapsed() < TIMEOUT, "timed out waiting for {what}");
    }
}

/// What our handlers saw: id, header, data. A rendezvous message's data is received by the
/// handler into a future, resolved by [`resolve`].
type Log = Arc<Mutex<Vec<(u16, Vec<u8>, Got)>>>;

/// A message's data: there, or being received.
enum Got {
    Data(Vec<u8>),
    Rndv(RecvFuture<Vec<u8>>),
}

/// Data a handler kept, with the index of its message.
type Kept = Arc<Mutex<Vec<(usize, AmData)>>>;

fn record(w: &Worker, id: u16, keep: Option<Kept>) -> Log {
    let log: Log = Arc::default();
    let l = log.clone();
    let flags = if keep.is_some() { AmHandlerFlags::PERSISTENT_DATA } else { AmHandlerFlags::empty() };
    w.set_am_recv_handler(
        id,
        Some(move |m: &mut AmMsg<'_>| {
            if m.is_rndv() {
                let (len, w) = (m.length(), m.worker().expect("the worker"));
                let d = m.take_rndv().expect("a descriptor");
                // The message's place in the log is taken first; no lock is held across the
                // call into the worker (which may run this handler again).
                let n = {
                    let mut l = l.lock().unwrap();
                    l.push((m.id(), m.header().to_vec(), Got::Data(Vec::new())));
                    l.len() - 1
                };
                let f = w.am_recv_data(d, vec![0u8; len]);
                l.lock().unwrap()[n].2 = Got::Rndv(f);
                return;
            }
            let mut l = l.lock().unwrap();
            let n = l.len();
            l.push((m.id(), m.header().to_vec(), Got::Data(m.data().to_vec())));
            if let Some(k) = &keep {
                // Every seventh message's data is kept and checked at the end.
                if n % 7 == 0 {
                    k.lock().unwrap().push((n, m.take_data().expect("persistent data")));
                }
            }
        }),
        flags,
    )
    .unwrap();
    log
}

/// The first `n` messages of `log`, with their data received.
fn resolve(w: &Worker, log: &Log, n: usize, what: &str) -> Vec<(u16, Vec<u8>, Vec<u8>)> {
    wait_until(w, what, || log.lock().unwrap().len() >= n);
    let all = std::mem::take(&mut *log.lock().unwrap());
    let waker = tests::peer::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    all.into_iter()
        .map(|(id, h, g)| match g {
            Got::Data(d) => (id, h, d),
            Got::Rndv(f) => {
                let mut f = std::pin::pin!(f);
                let t = Instant::now();
                loop {
                    if let std::task::Poll::Ready((d, r)) = f.as_mut().poll(&mut cx) {
                        r.unwrap_or_else(|e| panic!("{what}: a rendezvous receive failed: {e}"));
                        break (id, h, d);
                    }
                    w.progress();
                    assert!(t.elapsed() < TIMEOUT, "{what}: a rendezvous receive did not complete");
                }
            }
        })
        .collect()
}

/// Requests of every size class with headers up to the limit, answered by the peer's handler
/// on the reply endpoint: the answers arrive in order, byte for byte.
pub fn requests_and_replies(w: &Worker, p: &mut AmPeer, sizes: &[usize], what: &str) {
    let replies = record(w, 2, None);
    let max = w.am_max_header();
    let mut sent = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        for hlen in [0, 1, 33, max] {
            let hdr = pattern(hlen, i as u64);
            let data = pattern(n, 1000 + i as u64);
            // SAFETY: header and data outlive the request (waited for below).
            let r =
                unsafe { p.ep.am_send_nbx(1, &hdr, SendData::Contig(&data), AmSendFlags::REPLY, RequestParam::new()) };
            if let Some(r) = r.unwrap() {
                wait_until(w, "a send", || r.is_completed());
                assert_eq!(r.status(), Status::Ok, "{what}: {n} bytes, {hlen}-byte header");
            }
            sent.push((hdr, data));
        }
    }
    let got = resolve(w, &replies, sent.len(), "the replies");
    assert_eq!(got.len(), sent.len(), "{what}");
    for (k, ((id, h, d), (hdr, data))) in got.iter().zip(&sent).enumerate() {
        let mut rev = hdr.clone();
        rev.reverse();
        assert_eq!(*id, 2);
        assert!(*h == rev, "{what}: reply {k}'s header");
        assert!(d == data, "{what}: reply {k}'s data ({} bytes)", data.len());
    }
    assert_eq!(p.ask(w, "echoed"), sent.len().to_string());
}

/// Three peers flood id 3 at once: every message arrives, in order per sender; kept data stays
/// right while more arrives.
pub fn flood(w: &Worker, peers: &mut [AmPeer], count: u64, what: &str) {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let log = record(w, 3, Some(kept.clone()));
    for (k, p) in peers.iter_mut().enumerate() {
        // Header: the sequence number, then 8 bytes naming the sender (its seed).
        assert_eq!(p.ask(w, &format!("send 3 {count} {} 12 {}", 100 + k * 3000, 10_000 * (k + 1))), "started");
    }
    let total = count as usize * peers.len();
    let got = resolve(w, &log, total, "the flood");
    assert_eq!(got.len(), total, "{what}");
    let mut next = vec![0u64; peers.len()];
    for (n, (id, h, d)) in got.iter().enumerate() {
        assert_eq!(*id, 3);
        let seq = u32::from_le_bytes(h[..4].try_into().unwrap()) as u64;
        let k = (0..peers.len()).find(|&k| h[4..] == pattern(8, 10_000 * (k as u64 + 1))[..]).expect("a sender");
        assert_eq!(seq, next[k], "{what}: sender {k} out of order at message {n}");
        next[k] += 1;
        let seed = 10_000 * (k as u64 + 1);
        let len = 100 + k * 3000 + (seq % 7) as usize * 1000;
        assert!(*d == pattern(len, seed + seq), "{what}: sender {k} message {seq}");
    }
    for (n, data) in kept.lock().unwrap().drain(..) {
        assert!(*data == got[n].2[..], "{what}: kept message {n} changed");
    }
    // Every send of every peer completes.
    for p in peers.iter_mut() {
        let t = Instant::now();
        while p.ask(w, "pending") != "0" {
            assert!(t.elapsed() < TIMEOUT, "{what}: a peer's sends did not complete");
        }
    }
}

/// Every scenario over `tls` in each configuration: requests of `sizes` with replies, then
/// three peers flooding `count` messages each.
pub fn across(tls: &str, sizes: &[usize], count: u64) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (name, cfg) in CONFIGS {
        let what = format!("{tls}, {name}");
        let w = worker(tls, cfg);
        let mut p = AmPeer::spawn(&w, tls, cfg);
        requests_and_replies(&w, &mut p, sizes, &what);
        let mut peers = vec![p, AmPeer::spawn(&w, tls, cfg), AmPeer::spawn(&w, tls, cfg)];
        flood(&w, &mut peers, count, &what);
        let c = w.proto_counts();
        eprintln!("{what}: {c:?}");
        if name.starts_with("rndv") {
            assert!(c.rndv_am + c.rndv_get + c.rndv_put > 0, "{what}: no rendezvous: {c:?}");
        }
    }
}
