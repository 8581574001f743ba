//! Connecting by socket address where both workers have RDMA (Soft-RoCE in the VM of
//! `tools/rdma-vm/test`): the client process connects to the test's listener on the loopback
//! device (the connection manager is tcp's), and the endpoints then run every family over
//! the InfiniBand lanes: rc (wired up through ud) and ud alone.
//!
//! Without an RDMA device (outside the VM) the test says so and passes, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

use tests::sockaddr::serve_a_client_process;

#[test]
fn a_client_process_connects_by_address_over_ib() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    for (tls, am) in [("rc_v,ud_v", "am=rc_verbs/"), ("ud_v", "am=ud_verbs/")] {
        let lanes = serve_a_client_process(env!("CARGO_BIN_EXE_ucp-peer"), tls, &[]);
        assert!(lanes.split(' ').any(|l| l.starts_with(am)), "{tls}: {lanes}");
    }
}
