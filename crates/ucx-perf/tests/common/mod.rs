//! Running `ucx-perf` as two real processes (server and client over the loopback bootstrap).

#![allow(dead_code)]

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
pub fn pair(args: &[&str], tls: Option<&str>, server_grace: Duration) -> (Output, Output) {
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
pub fn finish(mut child: Child, limit: Duration) -> Output {
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
pub fn final_numbers(out: &Output) -> Vec<f64> {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.split_whitespace().count() == 8).unwrap_or("");
    line.split_whitespace().filter_map(|w| w.parse().ok()).collect()
}

pub fn run_ok(args: &[&str], tls: Option<&str>, iters: f64) {
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
    // Latencies and the overall message rate positive; the bandwidth columns are printed with
    // two decimals in MB/s, so a slow 8-byte run (600 msg/s: 0.005 MB/s) shows 0.00, and the
    // last interval's message rate with none, so an interval slower than 0.5 msg/s (a 200 KB
    // rendezvous over ud in the emulated VM) shows 0.
    assert!(n[1..4].iter().chain(&n[7..8]).all(|&v| v > 0.0), "{what}: {n:?}");
    assert!(n[4..7].iter().all(|&v| v >= 0.0), "{what}: {n:?}");
    eprintln!("{what}: latency {} us, bandwidth {} MB/s, {} msg/s", n[3], n[5], n[7]);
}
