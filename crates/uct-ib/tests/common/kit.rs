//! Running the uct conformance kit against an InfiniBand transport: the resource, the options
//! of each transport, the run. Include with `#[path = "common/kit.rs"] mod kit_common;` (the
//! `tests` package's `kit_ib` includes it too, for the runs across processes).

#![allow(dead_code)]

use std::time::Duration;

use uct::conformance::{self as kit, Options};

/// The first resource of transport `tl`, or `None` (and why, on stderr) when there is no RDMA
/// device; with `UCX_RS_REQUIRE_RDMA=1` (set in the VM) no device is a failure.
pub fn resource(tl: &str) -> Option<String> {
    if !uct_ib::testing::rdma_available() {
        return None;
    }
    let found = uct::query_resources().into_iter().find(|r| r.tl.tl_name == tl);
    Some(found.unwrap_or_else(|| panic!("no {tl} resource on an active port")).tl.full_name())
}

/// Runs every check (one at a time across the binary's tests) and fails on any check that
/// skipped unless `may_skip(check, across_processes)`.
pub fn run(opts: Options, may_skip: impl Fn(&str, bool) -> bool) {
    kit::run_checked(&opts, |name, _why, remote| may_skip(name, remote));
}

/// The kit's options for `rc_verbs` resource `res`.
pub fn rc_verbs_options(res: &str) -> Options {
    let mut o = Options::new(res)
        // A dead peer is noticed after timeout x retries: keep that short for the test.
        .with_config("TIMEOUT", "20ms")
        .with_config("RETRY_COUNT", "3")
        // Small queues, so the pending checks meet exhaustion quickly.
        .with_scarce_config("TX_QUEUE_LEN", "16")
        .with_scarce_config("FC_WND_SIZE", "8");
    o.timeout = Duration::from_secs(60);
    o
}

/// The kit's options for `ud_verbs` resource `res`.
pub fn ud_verbs_options(res: &str) -> Options {
    let mut o = Options::new(res)
        // A dead peer is noticed when nothing is acknowledged for this long: keep it short for
        // peer_failure, long enough for an emulated machine's scheduling hiccups.
        .with_config("TIMEOUT", "3s")
        // Few receive buffers per interface keep the emulated machine's memory small.
        .with_config("RX_QUEUE_LEN", "1024")
        // For pending_fairness: endpoints that start with a window wide enough that none of
        // them waits for acknowledgements while the others send, so the pending requests are
        // served round robin (from UCX's window of 2, endpoints whose acknowledgements arrive
        // later lose turns until their windows have grown, which the check counts against
        // them), and no resend timer during the receiver's hold (a timer cuts each endpoint's
        // window at a different moment, so they would reach the hold's end unevenly).
        .with_scarce_config("INITIAL_WINDOW", "64")
        .with_scarce_config("TIMER_TICK", "1s");
    o.timeout = Duration::from_secs(60);
    o
}
