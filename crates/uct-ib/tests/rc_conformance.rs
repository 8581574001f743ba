//! The uct conformance kit against `rc_verbs`, in one process (two interfaces) and across two
//! processes (this test binary re-runs itself as the kit's agent, which holds the receiving
//! side). Needs an RDMA device: run with `tools/rdma-vm/test`. Without one the tests say so
//! and pass, unless `UCX_RS_REQUIRE_RDMA=1`.

use std::sync::Mutex;
use std::time::Duration;

use uct::conformance::{self as kit, AgentCommand, Options, Verdict};

static SERIAL: Mutex<()> = Mutex::new(());

/// The receiving side when the kit runs across processes; does nothing in a normal run.
#[test]
fn kit_agent() {
    if kit::agent_requested() {
        uct_ib::register();
        kit::serve_agent();
    }
}

/// The first `rc_verbs` resource, or `None` (and why) when there is no RDMA device.
fn resource() -> Option<String> {
    uct_ib::register();
    let found = uct::query_resources().into_iter().find(|r| r.tl.tl_name == "rc_verbs");
    match found {
        Some(r) => Some(r.tl.full_name()),
        None => {
            let why = uct_ib::unavailable_reason().unwrap_or_else(|| "no active port".into());
            assert!(
                std::env::var("UCX_RS_REQUIRE_RDMA").as_deref() != Ok("1"),
                "UCX_RS_REQUIRE_RDMA=1 but rc_verbs has no resource: {why}"
            );
            eprintln!("no rc_verbs resource here ({why}); run in tools/rdma-vm/test");
            None
        }
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

fn run(opts: Options) {
    if kit::agent_requested() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let remote = opts.agent.is_some();
    let results = kit::run_all(&opts);
    for (name, v) in &results {
        eprintln!("{} ({}): {name}: {v:?}", opts.resource, if remote { "two processes" } else { "one process" });
    }
    for (name, v) in &results {
        if let Verdict::Skipped(why) = v {
            assert!(*name == "peer_failure" && !remote, "{}: {name} skipped: {why}", opts.resource);
        }
    }
}

#[test]
fn rc_verbs_conformance() {
    if let Some(r) = resource() {
        run(opts(&r));
    }
}

#[test]
fn rc_verbs_conformance_across_processes() {
    if let Some(r) = resource() {
        run(opts(&r).across_processes(AgentCommand::this_test("kit_agent")));
    }
}
