//! Exactly-once, in-order delivery over the real `ud_verbs` transport while the interfaces'
//! fault injector (`UCX_UD_VERBS_LOSS`) drops 1%, 10% and 30% of the received datagrams (data
//! and acknowledgements alike), and with duplication and reordering on top. Two interfaces in
//! one process exchange thousands of active messages each way; every message is checked the
//! moment it arrives (the same to an interface in another process: `ten_percent_loss_across_processes`
//! in the `tests` package's `kit_ib`). Needs an RDMA device: run with `tools/rdma-vm/test`.

mod ud_common;

use std::time::{Duration, Instant};

use uct::{Completion, FlushFlags, Iface, Worker};
use ud_common::*;

const AM: u8 = 3;

/// `n` messages each way between two interfaces injecting `loss` (seeded differently).
fn exchange(loss: &str, n: u64, limit: Duration) {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let la = format!("{loss},seed=11");
    let lb = format!("{loss},seed=23");
    let (a, fa) = open(&md, port, &worker, &[("LOSS", &la)]);
    let (b, fb) = open(&md, port, &worker, &[("LOSS", &lb)]);
    let (ia, ib) = (listen(&a, AM), listen(&b, AM));
    let (ab, ba) = (connect(&a, &b, 1), connect(&b, &a, 2));
    let (max_short, max_bcopy) = (a.attr().am.max_short, a.attr().am.max_bcopy);
    let (mut na, mut nb) = (0u64, 0u64);
    let start = Instant::now();
    while ia.borrow().next < n || ib.borrow().next < n {
        for (ep, next) in [(&ab, &mut na), (&ba, &mut nb)] {
            while *next < n && send(&**ep, AM, *next, max_short, max_bcopy).expect("send") {
                *next += 1;
            }
        }
        worker.progress();
        assert!(
            start.elapsed() < limit,
            "{loss}: {} and {} of {n} delivered after {limit:?}",
            ib.borrow().next,
            ia.borrow().next
        );
        assert!(
            ia.borrow().errors.is_empty() && ib.borrow().errors.is_empty(),
            "{loss}: {:?} {:?}",
            ia.borrow().errors,
            ib.borrow().errors
        );
    }
    // Everything was acknowledged too: remote flushes complete.
    for ep in [&ab, &ba] {
        let c = Completion::counter(1);
        if ep.flush(FlushFlags::REMOTE, Some(&c)).expect("flush") != ucs::Outcome::Done(()) {
            wait(&worker, "flush", limit, || c.count() == 0);
        }
    }
    for _ in 0..100 {
        worker.progress();
    }
    let elapsed = start.elapsed();
    let (sa, sb) = (a.stats(), b.stats());
    eprintln!("{loss}: {n} messages each way in {elapsed:?}\n  a: {sa:?}\n  b: {sb:?}");
    assert_eq!((ia.borrow().next, ib.borrow().next), (n, n), "{loss}: a message arrived twice");
    assert!(
        fa.borrow().is_empty() && fb.borrow().is_empty(),
        "{loss}: endpoints failed: {:?} {:?}",
        fa.borrow(),
        fb.borrow()
    );
    let cfg = a.config().loss;
    for s in [sa, sb] {
        let rate = s.loss_dropped as f64 / s.rx_datagrams as f64;
        let want = cfg.drop_ppm as f64 / 1e6;
        assert!(
            (rate - want).abs() < want * 0.5 + 0.005,
            "{loss}: dropped {rate:.3} of the datagrams, configured {want}"
        );
        if cfg.drop_ppm > 0 {
            assert!(s.resent > 0, "{loss}: losses but no resends");
        }
        assert_eq!(s.rx_malformed, 0);
    }
}

#[test]
fn one_percent_loss() {
    exchange("drop=1%", 5000, Duration::from_secs(300));
}

#[test]
fn ten_percent_loss() {
    exchange("drop=10%", 3000, Duration::from_secs(300));
}

#[test]
fn thirty_percent_loss() {
    exchange("drop=30%", 2000, Duration::from_secs(600));
}

#[test]
fn loss_duplication_and_reordering() {
    exchange("drop=5%,dup=5%,reorder=10%", 2000, Duration::from_secs(300));
}
