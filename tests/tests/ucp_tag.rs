//! MPI tag-matching semantics end to end, in one process over `self` and across two (and
//! more) processes over posix + cma, each under thresholds that force every protocol path:
//! non-overtaking (rendezvous then eager), exact and wildcard receives filled in posting order,
//! unexpected floods from several senders, probe for a message sent later, cancel, truncation,
//! 1 byte into a large receive, sync sends completing only after the match, zero length.
//!
//! The remote senders are this package's `ucp-peer tag`, driven over stdin/stdout.

#[path = "common/tag_scenarios.rs"]
mod scenarios;

use scenarios::*;
use ucp::{Worker, WorkerParams};

#[test]
fn over_self_in_one_process() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (name, cfg) in CONFIGS {
        let w: &'static Worker =
            Box::leak(Box::new(Worker::new(&context("self", cfg), &WorkerParams::new("self")).unwrap()));
        let mut s = LocalSender::new(w);
        all_scenarios(w, &mut s, &format!("self, {name}"));
        let mut s2 = LocalSender::new(w);
        let mut s3 = LocalSender::new(w);
        flood(w, &mut [&mut s, &mut s2, &mut s3], 300);
        let c = w.proto_counts();
        eprintln!("self, {name}: {c:?}");
        assert!(c.unexpected > 0);
    }
}

#[test]
fn across_processes_over_posix_and_cma() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (name, cfg) in CONFIGS {
        let w: &'static Worker =
            Box::leak(Box::new(Worker::new(&context("posix,cma", cfg), &WorkerParams::new("receiver")).unwrap()));
        let mut s = RemoteSender::spawn(w, "posix,cma", cfg);
        all_scenarios(w, &mut s, &format!("two processes, {name}"));
        eprintln!("two processes, {name}: probe-paced receiver");
        probe_paced(w, &mut s);
        let mut s2 = RemoteSender::spawn(w, "posix,cma", cfg);
        let mut s3 = RemoteSender::spawn(w, "posix,cma", cfg);
        flood(w, &mut [&mut s, &mut s2, &mut s3], 200);
        let c = w.proto_counts();
        eprintln!("two processes, {name}: {c:?}");
        match *name {
            "rndv get_zcopy" => assert!(c.rndv_get > 0, "{c:?}"),
            "rndv put_zcopy" => assert!(c.rndv_put > 0, "{c:?}"),
            "rndv am" => assert!(c.rndv_am > 0, "{c:?}"),
            // posix has no am_zcopy: everything stays eager bcopy.
            "eager zcopy" => assert_eq!((c.rndv_get, c.rndv_put, c.rndv_am), (0, 0, 0), "{c:?}"),
            _ => assert!(c.rndv_get > 0 || c.rndv_am > 0 || c.rndv_put > 0, "{c:?}"),
        }
    }
}
