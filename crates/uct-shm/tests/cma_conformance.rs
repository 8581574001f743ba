//! The uct conformance kit against `cma` (zero-copy put/get only) in one process. The run
//! across two processes, where the target memory belongs to another process, is in the `tests`
//! package (`tests/kit_shm.rs`).

use uct::conformance::{self as kit, Options, Verdict};

#[test]
fn cma_conformance() {
    uct_shm::register();
    if let Some((_, why)) = uct::unavailable_components().into_iter().find(|(n, _)| *n == "cma") {
        eprintln!("cma unavailable here: {why}");
        return;
    }
    let results = kit::run_checked(&Options::new("cma/memory"), |_, why, _| why.starts_with("no "));
    let passed: Vec<_> = results.iter().filter(|(_, v)| *v == Verdict::Passed).map(|(n, _)| *n).collect();
    for m in ["put_get", "flush", "ep_check", "rkey_unpack_garbage"] {
        assert!(passed.contains(&m), "cma: {m} must run and pass (passed: {passed:?})");
    }
}
