//! UCP tag matching over InfiniBand lanes, across processes, on a real verbs stack (Soft-RoCE in
//! the VM of `tools/rdma-vm/test`): the scenarios of `ucp_tag` under every forced
//! protocol path, over
//! - `UCX_TLS=rc_v,ud_v`: rc carries the data, its endpoints wired up through ud;
//! - `UCX_TLS=ud_v`: ud alone, reliability in software;
//! - `UCX_TLS=rc_v`: rc with ud as a wireup-only (`:aux`) transport;
//! - `UCX_TLS=posix,rc_verbs`: shared memory for messages, rc (wired up through shared memory)
//!   for rendezvous data.
//!
//! Without an RDMA device (outside the VM) the tests say so and pass, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

#[path = "common/tag_scenarios.rs"]
mod scenarios;

use scenarios::*;
use tests::text::pattern;
use ucp::{RecvData, RequestParam, SendData, Worker, WorkerParams, FULL_MASK};

/// Runs every scenario and configuration with peers over `tls`; `expect` checks the lanes the
/// first peer reports (`connected usage=transport ...`).
fn run(tls: &str, expect: &[&str], flood_per: usize) {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (name, cfg) in CONFIGS {
        let w: &'static Worker =
            Box::leak(Box::new(Worker::new(&context(tls, cfg), &WorkerParams::new("receiver")).unwrap()));
        let mut s = RemoteSender::spawn(w, tls, cfg);
        let lanes = s.lanes(w);
        eprintln!("{tls}, {name}: peer's lanes: {lanes}");
        assert!(lanes.starts_with("connected "), "{lanes}");
        for e in expect {
            assert!(lanes.split(' ').any(|l| l == *e), "{tls}: expected lane {e}, got {lanes}");
        }
        all_scenarios(w, &mut s, &format!("{tls}, {name}"));
        let mut s2 = RemoteSender::spawn(w, tls, cfg);
        flood(w, &mut [&mut s, &mut s2], flood_per);
        let c = w.proto_counts();
        let sent = s.counts(w);
        eprintln!("{tls}, {name}: {c:?}; first peer sent: {sent}");
        if *name == "eager zcopy" {
            // The AM lane is rc or ud, both with am_zcopy (posix: bcopy).
            let zcopy = !sent.contains("eager_zcopy: 0,");
            assert_eq!(zcopy, !tls.starts_with("posix"), "{tls}: {sent}");
            assert_eq!((c.rndv_get, c.rndv_put, c.rndv_am), (0, 0, 0), "{c:?}");
        }
        // The receiver counts the rendezvous it served. Without a zero-copy lane (ud) the
        // forced schemes fall back to data in active messages; the automatic threshold may
        // keep everything eager (shared memory copies faster than emulated rc moves data).
        let zcopy = expect.iter().any(|e| e.starts_with("rndv="));
        match *name {
            "rndv get_zcopy" if zcopy => assert!(c.rndv_get > 0, "{c:?}"),
            "rndv put_zcopy" if zcopy => assert!(c.rndv_put > 0, "{c:?}"),
            "rndv get_zcopy" | "rndv put_zcopy" | "rndv am" => assert!(c.rndv_am > 0, "{c:?}"),
            _ => {}
        }
    }
}

/// Every scenario and configuration with rc's tag matching on (emulated; `UCX_RC_TM_ENABLE=y`):
/// tagged sends go through the tag lane (eager messages, synchronous ones acknowledged by tag,
/// rendezvous requests), and arrive through the transport's unexpected handlers.
#[test]
fn over_rc_with_tag_matching() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    let tls = "rc_v,ud_v";
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Each configuration with UCX's TM_THRESH (receives of 1 KiB and more may be posted to the
    // transport) and rendezvous as software requests (TM_SW_RNDV=y), and with every receive
    // eligible and rendezvous offloaded (the receiver's transport reads).
    // Then the races injected through the emulated device's knobs: list operations that run two
    // progress calls late (messages arrive between a tag add and its execution) and a list of 4
    // tags (full quickly: receives fall back to software).
    let mut runs: Vec<_> = CONFIGS
        .iter()
        .flat_map(|&(name, cfg)| [(name, cfg, "1024", "y", "0", "64"), (name, cfg, "0", "n", "0", "64")])
        .collect();
    runs.extend(CONFIGS[..2].iter().map(|&(name, cfg)| (name, cfg, "0", "n", "2", "4")));
    for (name, cfg, thresh, sw_rndv, delay, tags) in runs {
        let mut all: Vec<(&str, &str)> = vec![
            ("RC_TM_ENABLE", "y"),
            ("RC_RX_QUEUE_LEN", "512"),
            ("TM_THRESH", thresh),
            ("TM_SW_RNDV", sw_rndv),
            ("RC_TM_EMU_OP_DELAY", delay),
            ("RC_TM_EMU_NUM_TAGS", tags),
        ];
        all.extend_from_slice(cfg);
        let name = format!("{name}, TM_THRESH={thresh}, TM_SW_RNDV={sw_rndv}, delay {delay}, {tags} tags");
        let w: &'static Worker =
            Box::leak(Box::new(Worker::new(&context(tls, &all), &WorkerParams::new("receiver")).unwrap()));
        let mut s = RemoteSender::spawn(w, tls, &all);
        let lanes = s.lanes(w);
        eprintln!("{tls} with tag matching, {name}: peer's lanes: {lanes}");
        assert!(lanes.starts_with("connected "), "{lanes}");
        for e in ["am=rc_verbs", "tag=rc_verbs"] {
            assert!(lanes.split(' ').any(|l| l == e), "expected lane {e}, got {lanes}");
        }
        all_scenarios(w, &mut s, &format!("{tls} with tag matching, {name}"));
        let mut s2 = RemoteSender::spawn(w, tls, &all);
        flood(w, &mut [&mut s, &mut s2], 50);
        let c = w.proto_counts();
        let sent = s.counts(w);
        eprintln!("{tls} with tag matching, {name}: {c:?}; first peer sent: {sent}");
        assert!(c.offload_rx_eager > 0, "nothing came through tag matching: {c:?}");
        assert!(!sent.contains("offload_eager: 0,"), "the peer sent nothing through its tag lane: {sent}");
        assert!(sent.contains("eager_multi: 0,"), "no fragments through tag matching: {sent}");
        if name.starts_with("rndv") && sw_rndv == "y" {
            assert!(c.offload_rx_sw_rndv > 0, "no rendezvous request through tag matching: {c:?}");
        }
        if sw_rndv == "n" {
            assert!(!sent.contains("offload_hw_rndv: 0,"), "no offloaded rendezvous: {sent}");
        } else {
            assert!(sent.contains("offload_hw_rndv: 0,"), "offloaded rendezvous with TM_SW_RNDV=y: {sent}");
        }
        if thresh == "0" && delay == "0" {
            assert!(c.offload_posted > 0 && c.offload_matched > 0, "no receive matched in the transport: {c:?}");
        }
        assert!(c.offload_posted >= c.offload_matched + c.offload_sw_matched, "{c:?}");
    }
}

/// A receiving worker and a sender process over `rc_v,ud_v` with tag matching on (and
/// `extra` settings on both); the sender's lanes include rc's tag lane.
fn tm_receiver(extra: &[(&str, &str)]) -> (&'static Worker, RemoteSender) {
    let tls = "rc_v,ud_v";
    let mut cfg = vec![("RC_TM_ENABLE", "y"), ("RC_RX_QUEUE_LEN", "512")];
    cfg.extend_from_slice(extra);
    let w: &'static Worker =
        Box::leak(Box::new(Worker::new(&context(tls, &cfg), &WorkerParams::new("receiver")).unwrap()));
    let mut s = RemoteSender::spawn(w, tls, &cfg);
    let lanes = s.lanes(w);
    assert!(lanes.split(' ').any(|l| l == "tag=rc_verbs"), "{lanes}");
    (w, s)
}

/// Posts R1 (8 bytes, tag 1: below `UCX_TM_THRESH`, so software only) whose completion posts
/// R2 (4 KiB, tag 2: offloaded) with the completion `done`; R2's buffer (leaked).
fn r1_posts_r2(w: &'static Worker, done: impl FnOnce(ucs::Status, ucp::RecvInfo) + Send + 'static) -> usize {
    let r1: &'static mut [u8] = Box::leak(vec![0u8; 8].into_boxed_slice());
    let r2 = Box::leak(vec![0u8; 4096].into_boxed_slice()).as_mut_ptr() as usize;
    let param = RequestParam::new().callback(move |st, _| {
        assert_eq!(st, ucs::Status::Ok);
        // SAFETY: R2's buffer is leaked: valid for the rest of the process.
        let data = RecvData::Contig(unsafe { std::slice::from_raw_parts_mut(r2 as *mut u8, 4096) });
        // SAFETY: as above.
        let posted = unsafe { w.tag_recv_nbx(data, 2, FULL_MASK, RequestParam::new().callback(done)) };
        assert!(posted.is_ok(), "posting from a completion callback: {:?}", posted.err());
    });
    // SAFETY: R1's buffer is leaked.
    let first = unsafe { w.tag_recv_nbx(RecvData::Contig(r1), 1, FULL_MASK, param) };
    assert!(first.is_ok());
    r2
}

/// The race of tag offload, resolved in software: a receive posted while software has not yet
/// counted an unexpected message that the transport's tag matching already saw (here: from
/// the completion callback of the receive that message matched in software) goes to the
/// transport with a stale count, which keeps it disabled; the next message for it comes through
/// the unexpected handler, software finds the offloaded receive on its queues, cancels it in the
/// transport and delivers into it.
#[test]
fn a_receive_the_transport_left_disabled_is_matched_in_software() {
    use std::sync::Mutex;
    static R2: Mutex<Option<(ucs::Status, usize, u64)>> = Mutex::new(None);
    if !uct_ib::testing::rdma_available() {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w, mut s) = tm_receiver(&[]);
    let r2 = r1_posts_r2(w, |st, info| *R2.lock().unwrap() = Some((st, info.length, info.sender_tag)));
    s.send(w, 1, 8, 1, false);
    s.send(w, 2, 4096, 2, false);
    let t = std::time::Instant::now();
    while R2.lock().unwrap().is_none() {
        w.progress();
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "the second receive did not complete");
    }
    s.flush(w);
    assert_eq!(*R2.lock().unwrap(), Some((ucs::Status::Ok, 4096, 2)));
    // SAFETY: the receive completed; nothing writes the buffer any more.
    let got = unsafe { std::slice::from_raw_parts(r2 as *const u8, 4096) };
    assert!(got == pattern(4096, 2).as_slice(), "the second message's data differs");
    let c = w.proto_counts();
    eprintln!("{c:?}");
    assert!(c.offload_posted >= 1, "the second receive was not offloaded: {c:?}");
    assert!(c.offload_sw_matched >= 1, "software did not take the offloaded receive: {c:?}");
}

/// MPI ordering across a receive the transport added at a stale phase: R2 is posted from a
/// completion callback while the transport has counted one unexpected message that software
/// has not (so the transport adds it disabled), R3 for the same tag after software caught up
/// (its count is current). The two messages for the tag then go to R2 and R3 in that order: R3
/// never overtakes R2, whichever of them the transport or software matched. (With entries
/// added at a stale phase left disabled for good, R3 took the first message.)
#[test]
fn a_receive_added_at_a_stale_phase_is_not_overtaken_by_a_later_one() {
    use std::sync::Mutex;
    static R2: Mutex<Option<(usize, usize)>> = Mutex::new(None);
    if !uct_ib::testing::rdma_available() {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w, mut s) = tm_receiver(&[]);
    let r2 = r1_posts_r2(w, |st, info| {
        assert_eq!(st, ucs::Status::Ok);
        *R2.lock().unwrap() = Some((info.length, info.sender_tag as usize));
    });
    let before = w.proto_counts();
    s.send(w, 1, 8, 1, false);
    let t = std::time::Instant::now();
    while w.proto_counts().offload_posted == before.offload_posted {
        w.progress();
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "R2 was not posted");
    }
    // Software has now counted the first message: R3's ADD carries the current count.
    let mut r3 = post(w, 2, FULL_MASK, 4096);
    assert_eq!(w.proto_counts().offload_posted - before.offload_posted, 2, "R3 was not offloaded");
    s.send(w, 2, 4096, 21, false);
    s.send(w, 2, 4096, 22, false);
    r3.check(w, 4096, 22, 2);
    let t = std::time::Instant::now();
    while R2.lock().unwrap().is_none() {
        w.progress();
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "R2 did not complete");
    }
    s.flush(w);
    assert_eq!(*R2.lock().unwrap(), Some((4096, 2)));
    // SAFETY: the receive completed; nothing writes the buffer any more.
    let got = unsafe { std::slice::from_raw_parts(r2 as *const u8, 4096) };
    assert!(got == pattern(4096, 21).as_slice(), "R2 did not get the first message for its tag");
    let c = w.proto_counts();
    eprintln!("{c:?}");
}

/// `UCX_TM_FORCE_THRESH` and `UCX_TM_MAX_BB_SIZE`: receives below `UCX_TM_THRESH` stay in
/// software until a large receive posted after them pushes them to the transport (in their
/// order, before itself), the small ones through bounce buffers; every message then matches
/// in the transport, the bounced data copied into the user's buffers.
#[test]
fn a_large_receive_forces_the_small_ones_through_bounce_buffers() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w, mut s) = tm_receiver(&[("TM_THRESH", "4096"), ("TM_MAX_BB_SIZE", "8192"), ("TM_FORCE_THRESH", "8192")]);
    // Activation: a first tagged message through the transport's tag matching.
    s.send(w, 9, 10, 9, false);
    post(w, 9, FULL_MASK, 10).check(w, 10, 9, 9);
    let before = w.proto_counts();
    let mut small1 = post(w, 1, FULL_MASK, 100);
    let mut small2 = post(w, 2, FULL_MASK, 3000);
    let mid = w.proto_counts();
    assert_eq!(mid.offload_posted, before.offload_posted, "receives below TM_THRESH were offloaded");
    let mut large = post(w, 3, FULL_MASK, 16384);
    let c = w.proto_counts();
    assert_eq!(c.offload_posted - before.offload_posted, 3, "{c:?}");
    assert_eq!((c.offload_forced - before.offload_forced, c.offload_bounce - before.offload_bounce), (2, 2), "{c:?}");
    s.send(w, 1, 100, 11, false);
    s.send(w, 2, 3000, 12, false);
    s.send(w, 3, 16384, 13, false);
    small1.check(w, 100, 11, 1);
    small2.check(w, 3000, 12, 2);
    large.check(w, 16384, 13, 3);
    s.flush(w);
    let c = w.proto_counts();
    eprintln!("{c:?}");
    assert_eq!(c.offload_matched - before.offload_matched, 3, "not every message matched in the transport: {c:?}");
}

#[test]
fn over_rc_wired_up_through_ud() {
    run("rc_v,ud_v", &["am=rc_verbs", "wireup=ud_verbs", "rndv=rc_verbs"], 100);
}

#[test]
fn over_ud() {
    run("ud_v", &["am=ud_verbs"], 100);
}

#[test]
fn over_rc_with_ud_for_wireup_only() {
    run("rc_v", &["am=rc_verbs", "wireup=ud_verbs", "rndv=rc_verbs"], 50);
}

#[test]
fn shared_memory_wires_up_rc_for_rendezvous() {
    run("posix,rc_verbs", &["am=posix", "rndv=rc_verbs"], 50);
}

/// Both sides create their endpoint before either has read the other's wireup request; the
/// endpoint-to-endpoint lanes still connect once, and data flows both ways on them.
#[test]
fn simultaneous_connect() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (tls, am) in [("ib", "rc_verbs"), ("posix,rc_verbs", "posix")] {
        let cfg: &[(&str, &str)] = &[("RNDV_THRESH", "1000")];
        let w = Worker::new(&context(tls, cfg), &WorkerParams::new("receiver")).unwrap();
        let (mut s, addr) = RemoteSender::spawn_deferred(&w, tls, cfg);
        // Our request goes out now; the peer is not progressing until it created its own.
        let ep = w.ep_create(&addr).unwrap();
        s.connect(&w);
        for (tag, len) in [(7u64, 100usize), (8, 5000)] {
            let data = pattern(len, tag);
            // SAFETY: `data` outlives the request, waited for below.
            let r = unsafe { ep.tag_send_nbx(SendData::Contig(&data), tag, RequestParam::new()) }.unwrap();
            assert_eq!(s.recv(&w, tag, len, tag), "received", "{tls}: {len} B to the peer");
            if let Some(r) = r {
                let t = std::time::Instant::now();
                while !r.is_completed() {
                    w.progress();
                    assert!(t.elapsed() < TIMEOUT, "{tls}: the send to the peer never completed");
                }
                assert_eq!(r.status(), ucp::Status::Ok);
            }
        }
        for (tag, len) in [(9u64, 100usize), (10, 5000)] {
            s.send(&w, tag, len, tag, false);
            let mut buf = vec![0u8; len];
            // SAFETY: `buf` outlives the request, waited for below.
            let r = unsafe { w.tag_recv_nbx(RecvData::Contig(&mut buf), tag, FULL_MASK, RequestParam::new()) }.unwrap();
            let info = r.wait().unwrap();
            assert_eq!(info.length, len);
            assert!(buf == pattern(len, tag), "{tls}: {len} B from the peer");
            s.flush(&w);
        }
        let lanes = s.lanes(&w);
        assert!(lanes.contains(&format!("am={am}")) && lanes.contains("rndv=rc_verbs"), "{tls}: {lanes}");
        let q = ep.query().unwrap();
        assert!(q.connected);
        assert_eq!(q.lanes[0].transport, am, "{tls}: {q:?}");
        assert_eq!(w.stats().0, 1, "{tls}: both requests ended in one endpoint");
        eprintln!("{tls}: simultaneous connect: peer's lanes {lanes}");
    }
}
