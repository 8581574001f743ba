//! The uct conformance kit against the `self` transport.

use uct::conformance::{self as kit, Options, Verdict};

fn opts() -> Options {
    uct_shm::register();
    // Handlers in the pending check keep every message; a small buffer limit makes sends run out.
    Options::new("self/memory0").with_scarce_config("RX_MAX_BUFS", "16")
}

fn must_pass(v: Verdict) {
    assert_eq!(v, Verdict::Passed, "self must support this check");
}

#[test]
fn am_sizes() {
    must_pass(kit::am_sizes(&opts()));
}

#[test]
fn am_invalid() {
    must_pass(kit::am_invalid(&opts()));
}

#[test]
fn am_keep_desc() {
    must_pass(kit::am_keep_desc(&opts()));
}

#[test]
fn am_reentrant() {
    must_pass(kit::am_reentrant(&opts()));
}

#[test]
fn am_zcopy_iov_skipped() {
    // self has no zero-copy active messages (as in UCX).
    assert!(matches!(kit::am_zcopy_iov(&opts()), Verdict::Skipped(_)));
}

#[test]
fn pending_fairness() {
    must_pass(kit::pending_fairness(&opts()));
}

#[test]
fn flush() {
    must_pass(kit::flush(&opts()));
}

#[test]
fn put_get() {
    must_pass(kit::put_get(&opts()));
}

#[test]
fn atomics() {
    must_pass(kit::atomics(&opts()));
}

#[test]
fn ep_check() {
    must_pass(kit::ep_check(&opts()));
}

#[test]
fn rkey_unpack_garbage() {
    must_pass(kit::rkey_unpack_garbage(&opts()));
}

#[test]
fn run_all_reports_every_check() {
    let results = kit::run_all(&opts());
    assert_eq!(results.len(), 13);
    let skipped: Vec<_> = results.iter().filter(|(_, v)| *v != Verdict::Passed).map(|(n, _)| *n).collect();
    // No zero-copy in `self`; no peer process to kill in a one-process run; no tag matching.
    assert_eq!(skipped, ["am_zcopy_iov", "peer_failure", "tag_matching"]);
}
