//! The uct conformance kit against `cma` (zero-copy put/get only), in one process and across two
//! processes (this test binary re-runs itself as the kit's agent, which owns the target memory).

use uct::conformance::{self as kit, AgentCommand, Options, Verdict};

/// The receiving side when the kit runs across processes; does nothing in a normal run.
#[test]
fn kit_agent() {
    if kit::agent_requested() {
        uct_shm::register();
        kit::serve_agent();
    }
}

fn run(opts: Options) {
    if kit::agent_requested() {
        return;
    }
    uct_shm::register();
    if let Some((_, why)) = uct::unavailable_components().into_iter().find(|(n, _)| *n == "cma") {
        eprintln!("cma unavailable here: {why}");
        return;
    }
    let results = kit::run_checked(&opts, |_, why, _| why.starts_with("no "));
    let remote = opts.agent.is_some();
    let passed: Vec<_> = results.iter().filter(|(_, v)| *v == Verdict::Passed).map(|(n, _)| *n).collect();
    let mut must = vec!["put_get", "flush", "ep_check", "rkey_unpack_garbage"];
    if remote {
        must.push("peer_failure");
    }
    for m in must {
        assert!(passed.contains(&m), "cma: {m} must run and pass (passed: {passed:?})");
    }
}

#[test]
fn cma_conformance() {
    run(Options::new("cma/memory"));
}

#[test]
fn cma_conformance_across_processes() {
    run(Options::new("cma/memory").across_processes(AgentCommand::this_test("kit_agent")));
}
