//! A peer process that dies in the middle of a rendezvous: the receive waiting for its data
//! completes with an error (found by the keepalive round, also while the survivor sleeps in
//! `wait`), data that arrived whole before the death is still delivered, and the survivor
//! keeps working with new peers.
//!
//! The peer is this package's `ucp-peer dying`: it sends a small message and the rendezvous
//! request of a large one, says so, and exits without serving the rendezvous once this side,
//! having seen the request arrive, tells it to die.
//!
//! Over shared memory (posix + cma) here, and over InfiniBand lanes (rc wired up through ud)
//! where there is an RDMA device (the VM of `tools/rdma-vm/test`): there the dead peer's queue
//! pair stops answering and the survivor's keepalive write exhausts its retries.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tests::peer::start_ucp_peer;
use tests::tag::{DYING_BIG as BIG, DYING_BIG_LEN as BIG_LEN, DYING_SMALL as SMALL};
use ucp::{
    Context, ContextParams, Features, ProtoCounts, RecvData, RecvResult, Request, RequestParam, Status, Worker,
    WorkerParams, FULL_MASK,
};

static SERIAL: Mutex<()> = Mutex::new(());

const TIMEOUT: Duration = Duration::from_secs(30);

const SHM: &str = "posix,cma";

fn worker(tls: &str, scheme: &str, wakeup: bool) -> Worker {
    ucs::log::init();
    uct_shm::register();
    uct_ib::register();
    let f = if wakeup { Features::TAG | Features::WAKEUP } else { Features::TAG };
    let mut p = ContextParams::new(f);
    if tls != SHM {
        // Give up on a silent peer after 4 tries of ~130 ms (default: 8 of ~1 s).
        p = p.with_config("RC_TIMEOUT", "100ms").with_config("RC_RETRY_COUNT", "3");
    }
    let p = p
        .with_config("TLS", tls)
        .with_config("RNDV_THRESH", "1000")
        .with_config("RNDV_SCHEME", scheme)
        .with_config("KEEPALIVE_INTERVAL", "50ms");
    Worker::new(&Context::new(&p).unwrap(), &WorkerParams::new("survivor")).unwrap()
}

/// Rendezvous this worker served so far.
fn served(c: ProtoCounts) -> u64 {
    c.rndv_get + c.rndv_put + c.rndv_am
}

/// Runs a peer in `mode` (`die` or `ok`) to the end, progressing `w`. A dying peer is told to
/// die once its rendezvous request has arrived here: matched to the receive posted first (the
/// worker counts a rendezvous it started serving), or waiting unexpected.
fn run_peer(w: &Worker, tls: &str, mode: &str) {
    let mut peer = start_ucp_peer(env!("CARGO_BIN_EXE_ucp-peer"), "dying", &[mode], w, tls, &[("RNDV_THRESH", "1000")]);
    let progress = || {
        w.progress();
    };
    if mode == "die" {
        let before = served(w.proto_counts());
        assert_eq!(peer.line(TIMEOUT, progress), "rts");
        let t = Instant::now();
        while served(w.proto_counts()) == before && w.tag_probe(BIG, FULL_MASK, false).is_none() {
            w.progress();
            assert!(t.elapsed() < TIMEOUT, "the peer's rendezvous request never arrived");
        }
        peer.tell("die");
    }
    // Reap it: a zombie still looks alive.
    let st = peer.finish(TIMEOUT, progress);
    assert!(st.success(), "peer failed: {st}");
}

/// Waits for `req`, sleeping in `wait` when `sleep`.
fn complete(w: &Worker, req: &Request<'_>, sleep: bool) -> Status {
    let t = Instant::now();
    while !req.is_completed() {
        if w.progress() == 0 && sleep {
            w.wait_timeout(Some(TIMEOUT)).unwrap();
        }
        assert!(t.elapsed() < TIMEOUT, "the receive from the dead peer never completed");
    }
    req.status()
}

fn big_recv_fails(tls: &str, scheme: &str, posted_first: bool, sleep: bool) {
    let what = format!("{tls}, {scheme}, posted {}, sleeping {sleep}", if posted_first { "first" } else { "after" });
    let w = worker(tls, scheme, sleep);
    let mut small = [0u8; 64];
    let mut big = vec![0u8; BIG_LEN];
    // SAFETY: both buffers outlive their requests, waited for below.
    let rs = unsafe { w.tag_recv_nbx(RecvData::Contig(&mut small), SMALL, FULL_MASK, RequestParam::new()) }.unwrap();
    let post_big = |big: &mut Vec<u8>| {
        // SAFETY: as above.
        match unsafe { w.tag_recv_nbx(RecvData::Contig(big), BIG, FULL_MASK, RequestParam::new()) }.unwrap() {
            RecvResult::Pending(r) => r,
            RecvResult::Done(i) => panic!("{what}: a rendezvous receive completed at once: {i:?}"),
        }
    };
    let rb = if posted_first {
        let r = post_big(&mut big);
        run_peer(&w, tls, "die");
        r
    } else {
        run_peer(&w, tls, "die");
        post_big(&mut big)
    };
    let status = complete(&w, &rb, sleep);
    assert!(status.is_err(), "{what}: receive from a dead peer completed with {status}");
    eprintln!("{what}: {status}");
    drop(rb);
    // What arrived whole before the death is delivered.
    let info = match rs {
        RecvResult::Done(i) => i,
        RecvResult::Pending(r) => r.wait().unwrap(),
    };
    assert_eq!(&small[..info.length], b"whole before dying");

    // The survivor goes on with a new peer.
    let mut again = [0u8; 64];
    // SAFETY: `again` outlives the request, waited for below.
    let r = unsafe { w.tag_recv_nbx(RecvData::Contig(&mut again), SMALL, FULL_MASK, RequestParam::new()) }.unwrap();
    run_peer(&w, tls, "ok");
    let info = match r {
        RecvResult::Done(i) => i,
        RecvResult::Pending(r) => r.wait().unwrap(),
    };
    assert_eq!(&again[..info.length], b"whole before dying");
}

#[test]
fn rendezvous_receive_fails_when_the_sender_dies() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for scheme in ["put_zcopy", "am"] {
        for posted_first in [true, false] {
            big_recv_fails(SHM, scheme, posted_first, false);
        }
    }
    // With get_zcopy a receive posted first may read the data before the peer exits, which is
    // a success; matched after the death, the read itself fails.
    big_recv_fails(SHM, "get_zcopy", false, false);
}

#[test]
fn a_sleeping_survivor_is_woken_by_keepalive() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    big_recv_fails(SHM, "put_zcopy", true, true);
    big_recv_fails(SHM, "am", false, true);
}

#[test]
fn over_rc_a_dead_sender_fails_the_receive() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Each detection waits for rc's retries (UCX_RC_TIMEOUT x UCX_RC_RETRY_COUNT).
    big_recv_fails("rc_v,ud_v", "put_zcopy", true, false);
    big_recv_fails("rc_v,ud_v", "am", false, false);
    big_recv_fails("rc_v,ud_v", "get_zcopy", false, false);
    big_recv_fails("rc_v,ud_v", "put_zcopy", true, true);
}
