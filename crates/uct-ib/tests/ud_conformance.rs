//! The uct conformance kit against `ud_verbs`, in one process (two interfaces) and across two
//! processes (this test binary re-runs itself as the kit's agent, which holds the receiving
//! side). Needs an RDMA device: run with `tools/rdma-vm/test`. Without one the tests say so
//! and pass, unless `UCX_RS_REQUIRE_RDMA=1`.

use std::time::Duration;

use uct::conformance::{self as kit, AgentCommand, Options};

#[path = "common/kit.rs"]
mod kit_common;

/// The receiving side when the kit runs across processes; does nothing in a normal run.
#[test]
fn kit_agent() {
    if kit::agent_requested() {
        uct_ib::register();
        kit::serve_agent();
    }
}

fn opts(res: &str) -> Options {
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

#[test]
fn ud_verbs_conformance() {
    if let Some(r) = kit_common::resource("ud_verbs") {
        kit_common::run(opts(&r), |name, remote| name == "atomics" || (name == "peer_failure" && !remote));
    }
}

#[test]
fn ud_verbs_conformance_across_processes() {
    if let Some(r) = kit_common::resource("ud_verbs") {
        kit_common::run(opts(&r).across_processes(AgentCommand::this_test("kit_agent")), |name, remote| {
            name == "atomics" || (name == "peer_failure" && !remote)
        });
    }
}
