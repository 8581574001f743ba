//! Runs the whole uct conformance kit against every resource discovery finds: in one process, and
//! for every transport that reaches other processes, across two processes (the receiving side
//! in this package's `kit-agent` program). The tests busy-poll, so they take turns.

use std::sync::Mutex;

use uct::conformance::{self as kit, run_all, AgentCommand, Verdict};

static SERIAL: Mutex<()> = Mutex::new(());

fn check_all(name: &str, opts: &kit::Options) -> Vec<(&'static str, Verdict)> {
    let results = run_all(opts);
    let mut passed = 0;
    for (check, verdict) in &results {
        match verdict {
            Verdict::Passed => passed += 1,
            Verdict::Skipped(why) => {
                // Skips are only for capabilities the transport (or the set-up) does not have.
                assert!(why.starts_with("no "), "{name}: {check} skipped for a reason other than a capability: {why}");
                eprintln!("{name}: {check} skipped: {why}");
            }
        }
    }
    eprintln!("{name}: {passed}/{} checks passed", results.len());
    // Every skip named a missing capability (asserted above); at least one check must apply.
    assert!(passed > 0, "{name}: no check applicable");
    results
}

#[test]
fn conformance_on_every_discovered_resource() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    tests::register_all_transports();
    let resources = uct::query_resources();
    assert!(resources.iter().any(|r| r.tl.full_name() == "self/memory0"), "self/memory0 must always be found");
    for (name, reason) in uct::unavailable_components() {
        eprintln!("component {name} unavailable here: {reason}");
    }
    for r in resources {
        let name = r.tl.full_name();
        check_all(&name, &tests::options_for(&name));
    }
}

#[test]
fn conformance_across_processes_on_every_discovered_resource() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    tests::register_all_transports();
    let mut ran = 0;
    for r in uct::query_resources() {
        let name = r.tl.full_name();
        if r.tl.dev_type == uct::DeviceType::SelfDev {
            eprintln!("{name}: loopback only, not run across processes");
            continue;
        }
        let opts = tests::options_for(&name).across_processes(AgentCommand::program(env!("CARGO_BIN_EXE_kit-agent")));
        let results = check_all(&format!("{name} (two processes)"), &opts);
        assert!(
            results.iter().any(|(c, v)| *c == "peer_failure" && *v == Verdict::Passed),
            "{name}: a killed peer must be noticed across processes"
        );
        ran += 1;
    }
    assert!(ran > 0, "shared memory (posix, sysv) must be found on every Linux machine");
}

#[test]
fn unknown_resource_is_reported_not_fatal() {
    tests::register_all_transports();
    assert_eq!(uct::find_resource("nosuch/dev").err(), Some(uct::Status::NoDevice));
    assert_eq!(uct::find_resource("self/nosuchdev").err(), Some(uct::Status::NoDevice));
    assert!(uct::find_resource("self").is_ok(), "transport name alone picks the first device");
}
