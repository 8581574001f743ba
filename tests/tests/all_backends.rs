//! Runs the whole uct conformance kit against every resource discovery finds.

use uct::conformance::{run_all, Verdict};

#[test]
fn conformance_on_every_discovered_resource() {
    tests::register_all_transports();
    let resources = uct::query_resources();
    assert!(resources.iter().any(|r| r.tl.full_name() == "self/memory0"), "self/memory0 must always be found");
    for (name, reason) in uct::unavailable_components() {
        eprintln!("component {name} unavailable here: {reason}");
    }
    for r in resources {
        let name = r.tl.full_name();
        let results = run_all(&tests::options_for(&name));
        let mut passed = 0;
        for (check, verdict) in &results {
            match verdict {
                Verdict::Passed => passed += 1,
                Verdict::Skipped(why) => {
                    // Skips are only for capabilities the transport does not advertise.
                    assert!(
                        why.starts_with("no "),
                        "{name}: {check} skipped for a reason other than a capability: {why}"
                    );
                    eprintln!("{name}: {check} skipped: {why}");
                }
            }
        }
        eprintln!("{name}: {passed}/{} checks passed", results.len());
        // Every skip named a missing capability (asserted above); at least one check must apply.
        assert!(passed > 0, "{name}: no check applicable");
    }
}

#[test]
fn unknown_resource_is_reported_not_fatal() {
    tests::register_all_transports();
    assert_eq!(uct::find_resource("nosuch/dev").err(), Some(uct::Status::NoDevice));
    assert_eq!(uct::find_resource("self/nosuchdev").err(), Some(uct::Status::NoDevice));
    assert!(uct::find_resource("self").is_ok(), "transport name alone picks the first device");
}
