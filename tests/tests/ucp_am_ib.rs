//! Active messages across processes over InfiniBand, on a real verbs stack (Soft-RoCE in the
//! VM of `tools/rdma-vm/test`): the scenarios of `ucp_am` over `UCX_TLS=rc_v` (wired up
//! through ud; eager zero-copy from the zero-copy threshold), `ud_v` and `rc_v,ud_v`.
//!
//! Without an RDMA device (outside the VM) the tests say so and pass, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

#[path = "common/am_scenarios.rs"]
mod scenarios;

use scenarios::across;

/// Smaller than over shared memory: the VM's CPUs are emulated.
const SIZES: [usize; 8] = [0, 1, 100, 2000, 4100, 9000, 40_000, 150_000];

#[test]
fn across_processes_over_ib() {
    if uct_ib::testing::rdma_available() {
        for tls in ["rc_v", "ud_v", "rc_v,ud_v"] {
            across(tls, &SIZES, 60);
        }
    }
}
