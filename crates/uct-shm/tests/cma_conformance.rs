//! The uct conformance kit against `cma` (zero-copy put/get only), in one process.

use uct::conformance::{self as kit, Options, Verdict};

#[test]
fn cma_conformance() {
    uct_shm::register();
    if let Some((_, why)) = uct::unavailable_components().into_iter().find(|(n, _)| *n == "cma") {
        eprintln!("cma unavailable here: {why}");
        return;
    }
    let results = kit::run_all(&Options::new("cma/memory"));
    let mut passed = Vec::new();
    for (name, v) in &results {
        match v {
            Verdict::Passed => passed.push(*name),
            Verdict::Skipped(why) => assert!(why.starts_with("no "), "cma: {name} skipped: {why}"),
        }
    }
    for must in ["put_get", "flush", "ep_check", "rkey_unpack_garbage"] {
        assert!(passed.contains(&must), "cma: {must} must run and pass (passed: {passed:?})");
    }
}
