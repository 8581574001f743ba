//! `ucx-perf`'s UCP tag, active-message, stream, RMA and atomic tests over shared memory (`UCX_TLS=shm,self`: posix and cma), two real
//! processes, with the options `ucx_perftest` has for them: datatypes (`-D contig|iov`, and
//! the extension `generic`),
//! wildcard receives (`-C`), forced unexpected messages (`-U`), thread modes (`-M`) and
//! sleeping on the worker's events (`-E sleep`), at sizes on both sides of the rendezvous
//! threshold. Checks behaviour, not speed: both sides exit successfully and the client's final
//! report has every iteration and positive figures.
//!
//! Both processes busy-poll (except under `-E sleep`), so the runs are serialized and short.

mod common;

use common::run_ok;
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

fn run_all(runs: &[&[&str]]) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for args in runs {
        let iters: f64 = args[args.iter().position(|a| *a == "-n").unwrap() + 1].parse().unwrap();
        run_ok(args, Some("shm,self"), iters);
    }
}

#[test]
fn tag_tests_eager_and_rendezvous() {
    run_all(&[
        &["-t", "tag_lat", "-s", "8", "-n", "5000"],
        &["-t", "tag_bw", "-s", "8", "-n", "20000"],
        &["-t", "tag_lat", "-s", "65536", "-n", "500"],
        &["-t", "tag_bw", "-s", "1048576", "-n", "100"],
        &["-t", "tag_sync_lat", "-s", "8", "-n", "5000"],
        &["-t", "tag_sync_bw", "-s", "100000", "-n", "200"],
    ]);
}

#[test]
fn tag_tests_with_the_ucp_options() {
    run_all(&[
        &["-t", "tag_lat", "-s", "8", "-n", "5000", "-C"],
        &["-t", "tag_bw", "-s", "1000", "-n", "20000", "-U"],
        &["-t", "tag_bw", "-s", "65536", "-n", "500", "-U", "-D", "iov"],
        &["-t", "tag_lat", "-s", "300,70000", "-n", "500", "-D", "iov,contig"],
        &["-t", "tag_bw", "-s", "8", "-n", "20000", "-M", "multi"],
        &["-t", "tag_sync_lat", "-s", "70000", "-n", "500", "-M", "serialized"],
    ]);
}

#[test]
fn tag_tests_sleeping_on_events() {
    run_all(&[
        &["-t", "tag_lat", "-s", "8", "-n", "2000", "-E", "sleep"],
        &["-t", "tag_bw", "-s", "8", "-n", "20000", "-E", "sleep"],
        &["-t", "tag_lat", "-s", "1048576", "-n", "50", "-E", "sleep"],
        &["-t", "tag_sync_bw", "-s", "70000", "-n", "200", "-E", "sleep"],
    ]);
}

#[test]
fn rma_and_atomic_tests() {
    run_all(&[
        &["-t", "ucp_put_lat", "-s", "8", "-n", "5000"],
        &["-t", "ucp_put_lat", "-s", "100000", "-n", "200"],
        &["-t", "ucp_put_bw", "-s", "8", "-n", "20000"],
        &["-t", "ucp_put_bw", "-s", "1048576", "-n", "100"],
        &["-t", "ucp_get", "-s", "8", "-n", "20000"],
        &["-t", "ucp_get", "-s", "65536", "-n", "500"],
        &["-t", "ucp_add", "-s", "8", "-n", "20000"],
        &["-t", "ucp_add", "-s", "4", "-n", "20000"],
        &["-t", "ucp_fadd", "-s", "8", "-n", "20000"],
        &["-t", "ucp_swap", "-s", "4", "-n", "20000"],
        &["-t", "ucp_cswap", "-s", "8", "-n", "20000"],
        &["-t", "ucp_put_bw", "-s", "8", "-n", "20000", "-E", "sleep"],
    ]);
}

#[test]
fn active_message_tests() {
    run_all(&[
        &["-t", "ucp_am_lat", "-s", "8", "-n", "5000"],
        &["-t", "ucp_am_bw", "-s", "8", "-n", "20000"],
        &["-t", "ucp_am_lat", "-s", "100000", "-n", "200"],
        &["-t", "ucp_am_bw", "-s", "1048576", "-n", "100"],
        &["-t", "ucp_am_bw", "-s", "1000", "-n", "20000", "-H", "64"],
        &["-t", "ucp_am_lat", "-s", "300,70000", "-n", "500", "-D", "iov,contig"],
    ]);
}

#[test]
fn stream_tests() {
    run_all(&[
        &["-t", "stream_lat", "-s", "8", "-n", "5000"],
        &["-t", "stream_bw", "-s", "8", "-n", "20000"],
        &["-t", "stream_lat", "-s", "100000", "-n", "200", "-r", "recv_data"],
        &["-t", "stream_bw", "-s", "1048576", "-n", "100"],
        &["-t", "stream_bw", "-s", "1000", "-n", "20000", "-r", "recv_data"],
    ]);
}

/// `-D generic` (an extension): tag, active-message and stream data through a generic
/// datatype's callbacks on either side, eager and rendezvous.
#[test]
fn generic_datatype_tests() {
    run_all(&[
        &["-t", "tag_lat", "-s", "8", "-n", "5000", "-D", "generic"],
        &["-t", "tag_bw", "-s", "1048576", "-n", "100", "-D", "generic,generic"],
        &["-t", "tag_lat", "-s", "70000", "-n", "500", "-D", "contig,generic"],
        &["-t", "ucp_am_lat", "-s", "100000", "-n", "200", "-D", "generic,generic"],
        &["-t", "ucp_am_bw", "-s", "8", "-n", "20000", "-D", "generic"],
        &["-t", "stream_lat", "-s", "100000", "-n", "200", "-D", "generic,generic"],
        &["-t", "stream_bw", "-s", "8", "-n", "20000", "-D", "generic,generic"],
    ]);
}

/// Remote memory access reads and writes in place: `-D generic` is refused with a reason.
#[test]
fn rma_tests_refuse_generic() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ucx-perf"))
        .args(["-l", "-t", "ucp_put_lat", "-D", "generic", "-n", "10"])
        .env("UCX_TLS", "self")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("do not take -D generic"), "{err}");
}
