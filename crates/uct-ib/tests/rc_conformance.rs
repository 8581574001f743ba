//! The uct conformance kit against `rc_verbs`, in one process (two interfaces) and across two
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
        // A dead peer is noticed after timeout x retries: keep that short for the test.
        .with_config("TIMEOUT", "20ms")
        .with_config("RETRY_COUNT", "3")
        // Small queues, so the pending checks meet exhaustion quickly.
        .with_scarce_config("TX_QUEUE_LEN", "16")
        .with_scarce_config("FC_WND_SIZE", "8");
    o.timeout = Duration::from_secs(60);
    o
}

#[test]
fn rc_verbs_conformance() {
    if let Some(r) = kit_common::resource("rc_verbs") {
        kit_common::run(opts(&r), |name, remote| name == "peer_failure" && !remote);
    }
}

#[test]
fn rc_verbs_conformance_across_processes() {
    if let Some(r) = kit_common::resource("rc_verbs") {
        kit_common::run(opts(&r).across_processes(AgentCommand::this_test("kit_agent")), |name, remote| {
            name == "peer_failure" && !remote
        });
    }
}
