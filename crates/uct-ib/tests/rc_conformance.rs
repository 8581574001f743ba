//! The uct conformance kit against `rc_verbs` in one process (two interfaces); the run across
//! two processes, with the same options, is in the `tests` package (`tests/kit_ib.rs`). Needs
//! an RDMA device: run with `tools/rdma-vm/test`. Without one the tests say so and pass, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

#[path = "common/kit.rs"]
mod kit_common;

#[test]
fn rc_verbs_conformance() {
    if let Some(r) = kit_common::resource("rc_verbs") {
        kit_common::run(kit_common::rc_verbs_options(&r), |name, remote| name == "peer_failure" && !remote);
    }
}

/// With tag matching on (emulated), every active message carries the `NO_TAG` prefix and goes
/// through the tag device: the whole kit again.
#[test]
fn rc_verbs_conformance_with_tag_matching() {
    if let Some(r) = kit_common::resource("rc_verbs") {
        let opts = kit_common::rc_verbs_options(&r)
            .with_config("TM_ENABLE", "y")
            .with_config("RX_QUEUE_LEN", "256")
            .with_tag_handlers();
        kit_common::run(opts, |name, remote| name == "peer_failure" && !remote);
    }
}
