//! The stream API across processes over InfiniBand, on a real verbs stack (Soft-RoCE in the
//! VM of `tools/rdma-vm/test`): the scenario of `ucp_stream` over `rc_v` and `ud_v`, with fewer
//! sends (the VM's CPUs are emulated).
//!
//! Without an RDMA device (outside the VM) the test says so and passes, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

#[path = "common/stream_scenarios.rs"]
mod scenarios;

#[test]
fn random_sends_over_ib() {
    if uct_ib::testing::rdma_available() {
        for tls in ["rc_v", "ud_v"] {
            scenarios::both_ways(tls, &[], 5_000, 100_000);
        }
    }
}
