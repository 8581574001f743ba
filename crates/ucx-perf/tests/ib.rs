//! `ucx-perf` over InfiniBand transports, two real processes (server and client over the
//! loopback bootstrap), on a real verbs stack (Soft-RoCE in the VM of `tools/rdma-vm/test`):
//! the UCT tests `am_lat`, `put_bw` and `get` over rc_verbs, `am_lat`, `am_bw` and `put_bw` over
//! ud_verbs (which has no get, as in UCX: the request is refused with an error naming it), and
//! the UCP tag tests and the RMA and atomic tests over `UCX_TLS=rc_v` and `ud_v`. Checks
//! behaviour, not speed: both sides exit successfully and the client's final report has every iteration and positive figures.
//!
//! Without an RDMA device (outside the VM) the tests say so and pass, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

mod common;

use common::{pair, run_ok};
use std::time::Duration;

#[test]
fn uct_tests_over_rc_and_ud() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    let dev = ["-d", "rxe0:1"];
    for (tl, tests) in [
        (
            "rc_verbs",
            &[
                &["-t", "am_lat", "-n", "2000"][..],
                &["-t", "put_bw", "-s", "65536", "-D", "zcopy", "-n", "100"],
                &["-t", "get", "-s", "65536", "-D", "zcopy", "-n", "100"],
            ][..],
        ),
        (
            "ud_verbs",
            &[
                &["-t", "am_lat", "-n", "2000"][..],
                &["-t", "am_bw", "-D", "bcopy", "-s", "1000", "-n", "2000"],
                &["-t", "put_bw", "-s", "8", "-n", "2000"],
            ],
        ),
    ] {
        for t in tests {
            let mut args = vec!["-x", tl];
            args.extend(dev);
            args.extend(*t);
            let iters: f64 = t[t.iter().position(|a| *a == "-n").unwrap() + 1].parse().unwrap();
            run_ok(&args, None, iters);
        }
    }
    // ud has no get: the client stops with an error naming it (the server, never contacted,
    // is stopped by the test).
    let (_, c) = pair(
        &["-x", "ud_verbs", "-d", "rxe0:1", "-t", "get", "-D", "bcopy", "-s", "64", "-n", "10"],
        None,
        Duration::ZERO,
    );
    let err = String::from_utf8_lossy(&c.stderr).to_string();
    assert!(!c.status.success(), "get over ud_verbs must fail");
    assert!(err.contains("ud_verbs") && err.to_lowercase().contains("get"), "{err}");
    eprintln!("get over ud_verbs: {}", err.trim());
}

#[test]
fn ucp_tag_tests_over_rc_and_ud() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    for tls in ["rc_v", "ud_v"] {
        run_ok(&["-t", "tag_lat", "-s", "8", "-n", "2000"], Some(tls), 2000.0);
        run_ok(&["-t", "tag_bw", "-s", "65536", "-n", "100"], Some(tls), 100.0);
    }
}

/// The tag tests with rc's tag matching on (emulated): eager and synchronous messages through
/// the tag lane, receives posted to the transport, offloaded rendezvous read by the receiver's
/// transport (and, with `UCX_TM_SW_RNDV=y`, software requests).
#[test]
fn ucp_tag_tests_over_rc_with_tag_matching() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    /// Sets `UCX_*` variables for the child processes while it lives.
    struct Env(&'static [(&'static str, &'static str)]);
    impl Drop for Env {
        fn drop(&mut self) {
            for (k, _) in self.0 {
                std::env::remove_var(k);
            }
        }
    }
    for vars in [
        &[("UCX_RC_TM_ENABLE", "y"), ("UCX_RC_RX_QUEUE_LEN", "512"), ("UCX_TM_THRESH", "0"), ("UCX_PROTO_INFO", "y")][..],
        &[("UCX_RC_TM_ENABLE", "y"), ("UCX_RC_RX_QUEUE_LEN", "512"), ("UCX_TM_SW_RNDV", "y"), ("UCX_PROTO_INFO", "y")],
    ] {
        let _env = Env(vars);
        for (k, v) in vars {
            // (The tests of this binary run one at a time in the VM; the variables go with
            // `_env`.)
            std::env::set_var(k, v);
        }
        run_ok(&["-t", "tag_lat", "-s", "8", "-n", "2000"], Some("rc_v"), 2000.0);
        run_ok(&["-t", "tag_sync_lat", "-s", "8", "-n", "500"], Some("rc_v"), 500.0);
        run_ok(&["-t", "tag_lat", "-s", "65536", "-n", "100"], Some("rc_v"), 100.0);
        run_ok(&["-t", "tag_bw", "-s", "65536", "-n", "100"], Some("rc_v"), 100.0);
        // Both sides print what went through tag matching; with every receive eligible, the
        // transport matched some.
        let (srv, cli) = pair(&["-t", "tag_lat", "-s", "4096", "-n", "200"], Some("rc_v"), Duration::from_secs(60));
        assert!(srv.status.success() && cli.status.success());
        let matched = |o: &std::process::Output| -> u64 {
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            let line = err
                .lines()
                .find(|l| l.starts_with("# tag offload:"))
                .unwrap_or_else(|| panic!("no offload line: {err}"));
            eprintln!("{line}");
            let at = line.find("), matched there ").expect("the matched count") + "), matched there ".len();
            line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        };
        let (m_srv, m_cli) = (matched(&srv), matched(&cli));
        // The protocol information names the tag lane and says the matching is emulated.
        let out = String::from_utf8_lossy(&cli.stdout).to_string();
        assert!(out.contains("through the tag lane rc_verbs, emulated tag matching"), "{out}");
        let offloaded = out.contains("offloaded rendezvous (the receiver's transport reads");
        assert_eq!(offloaded, !vars.contains(&("UCX_TM_SW_RNDV", "y")), "{out}");
        if vars.iter().any(|&(k, v)| k == "UCX_TM_THRESH" && v == "0") {
            assert!(m_srv + m_cli > 0, "no receive matched in the transport");
        }
    }
}

#[test]
fn ucp_am_and_stream_tests_over_rc_and_ud() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    for tls in ["rc_v", "ud_v"] {
        run_ok(&["-t", "ucp_am_lat", "-s", "8", "-n", "1000"], Some(tls), 1000.0);
        run_ok(&["-t", "ucp_am_bw", "-s", "65536", "-n", "100"], Some(tls), 100.0);
        run_ok(&["-t", "stream_lat", "-s", "8", "-n", "1000"], Some(tls), 1000.0);
        run_ok(&["-t", "stream_bw", "-s", "65536", "-n", "100"], Some(tls), 100.0);
        // Generic datatypes (an extension) on both sides, eager and rendezvous.
        run_ok(&["-t", "tag_bw", "-s", "200000", "-n", "50", "-D", "generic,generic"], Some(tls), 50.0);
        run_ok(&["-t", "ucp_am_lat", "-s", "8", "-n", "1000", "-D", "generic,generic"], Some(tls), 1000.0);
        run_ok(&["-t", "stream_lat", "-s", "65536", "-n", "100", "-D", "generic,generic"], Some(tls), 100.0);
    }
}

#[test]
fn ucp_rma_tests_over_rc_and_ud() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    // Over `ud_v` every operation is emulated over active messages (ud reaches no memory by
    // itself); the put ping-pong ends with both sides flushing at once, each waiting for the
    // other's reply (a deadlock until replies got a queue of their own).
    for tls in ["rc_v", "ud_v"] {
        run_ok(&["-t", "ucp_put_lat", "-s", "8", "-n", "1000"], Some(tls), 1000.0);
        run_ok(&["-t", "ucp_put_bw", "-s", "65536", "-n", "100"], Some(tls), 100.0);
        run_ok(&["-t", "ucp_get", "-s", "65536", "-n", "100"], Some(tls), 100.0);
        run_ok(&["-t", "ucp_fadd", "-s", "8", "-n", "1000"], Some(tls), 1000.0);
        run_ok(&["-t", "ucp_cswap", "-s", "8", "-n", "1000"], Some(tls), 1000.0);
    }
}
