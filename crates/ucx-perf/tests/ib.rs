//! `ucx-perf` over InfiniBand transports, two real processes (server and client over the
//! loopback bootstrap), on a real verbs stack (Soft-RoCE in the VM of `tools/rdma-vm/test`):
//! the UCT tests `am_lat`, `put_bw` and `get` over rc_verbs, `am_lat`, `am_bw` and `put_bw` over
//! ud_verbs (which has no get, as in UCX: the request is refused with an error naming it), and
//! the UCP tag tests over `UCX_TLS=rc_v` and `ud_v`. Checks behaviour, not speed: both sides
//! exit successfully and the client's final report has every iteration and positive figures.
//!
//! Without an RDMA device (outside the VM) the tests say so and pass, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

static PORT: AtomicU16 = AtomicU16::new(0);

fn next_port() -> u16 {
    let base = 20_000 + (std::process::id() % 20_000) as u16;
    base + PORT.fetch_add(1, Ordering::Relaxed)
}

/// Runs server and client with `args` (and `tls` as `UCX_TLS` when given); returns both outputs.
/// A server still running `server_grace` after the client ended is killed (a client that fails
/// before connecting leaves it waiting).
fn pair(args: &[&str], tls: Option<&str>, server_grace: Duration) -> (Output, Output) {
    let port = next_port().to_string();
    let cmd = |client: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ucx-perf"));
        c.args(args).args(["-p", &port, "-f"]);
        if client {
            c.arg("127.0.0.1");
        }
        if let Some(t) = tls {
            c.env("UCX_TLS", t);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    // No pause before the client: it retries a refused connection (`rte::CONNECT_RETRY`).
    let server = cmd(false).spawn().expect("start the server");
    let client = finish(cmd(true).spawn().expect("start the client"), Duration::from_secs(300));
    (finish(server, server_grace), client)
}

/// Waits for `child`, killing it if it still runs after `limit`; returns its output.
fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("child status").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("child output")
}

/// The final report line's numbers: iterations, then latency (typical, average, overall),
/// bandwidth (average, overall), message rate (average, overall).
fn final_numbers(out: &Output) -> Vec<f64> {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.split_whitespace().count() == 8).unwrap_or("");
    line.split_whitespace().filter_map(|w| w.parse().ok()).collect()
}

fn run_ok(args: &[&str], tls: Option<&str>, iters: f64) {
    let (s, c) = pair(args, tls, Duration::from_secs(60));
    let what = format!("{args:?} (UCX_TLS={tls:?})");
    assert!(
        c.status.success() && s.status.success(),
        "{what}: client {} / server {}\nclient: {}\nserver: {}",
        c.status,
        s.status,
        String::from_utf8_lossy(&c.stderr),
        String::from_utf8_lossy(&s.stderr)
    );
    let n = final_numbers(&c);
    assert_eq!(n.len(), 8, "{what}: no final report in {}", String::from_utf8_lossy(&c.stdout));
    assert_eq!(n[0], iters, "{what}: iterations");
    assert!(n[1..].iter().all(|&v| v > 0.0), "{what}: {n:?}");
    eprintln!("{what}: latency {} us, bandwidth {} MB/s, {} msg/s", n[3], n[5], n[7]);
}

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
