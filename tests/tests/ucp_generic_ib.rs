//! Generic datatypes across processes over InfiniBand, on a real verbs stack (Soft-RoCE in the
//! VM of `tools/rdma-vm/test`): the echo scenarios of `ucp_generic` (tagged, active-message and
//! stream data packed and unpacked by callbacks, every size from empty to rendezvous, failing
//! callbacks) over `rc_v` and `ud_v`, as they come and with rendezvous from 4 KiB.
//!
//! Without an RDMA device (outside the VM) the test says so and passes, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

#[path = "common/generic_scenarios.rs"]
mod sc;

#[test]
fn generic_datatypes_across_processes_over_ib() {
    if !uct_ib::testing::rdma_available() {
        return;
    }
    for tls in ["rc_v", "ud_v"] {
        for (name, cfg) in [sc::CONFIGS[0], sc::CONFIGS[2]] {
            let w = sc::worker(tls, cfg);
            let mut p = sc::GenPeer::spawn(&w, tls, cfg);
            sc::round_trips(&w, &mut p, &format!("{tls}, {name}"));
            sc::failing_callbacks(&w, &mut p, &format!("{tls}, {name}"));
            p.finish(&w);
        }
    }
}
