//! Remote memory access and atomics across processes over InfiniBand, on a real verbs stack
//! (Soft-RoCE in the VM of `tools/rdma-vm/test`): the scenarios of `ucp_rma` over
//! - `UCX_TLS=rc_v`: RDMA write and read on rc (wired up through ud); atomics emulated over
//!   active messages, since Soft-RoCE's device atomics lack the 32-bit and bitwise operations
//!   (one location is never updated by two mechanisms);
//! - `UCX_TLS=ud_v`: ud alone: every operation emulated over its active messages;
//! - `UCX_TLS=rc_v,ud_v`.
//!
//! Without an RDMA device (outside the VM) the tests say so and pass, unless
//! `UCX_RS_REQUIRE_RDMA=1`.

#[path = "common/rma_scenarios.rs"]
mod scenarios;

use scenarios::*;

const TLS: [&str; 3] = ["rc_v", "ud_v", "rc_v,ud_v"];

#[test]
fn put_and_get_across_processes_both_ways_over_ib() {
    if uct_ib::testing::rdma_available() {
        put_and_get_both_ways(&TLS);
    }
}

#[test]
fn fence_orders_the_flag_after_the_data_over_ib() {
    if uct_ib::testing::rdma_available() {
        fence_orders_the_flag_after_the_data(&TLS);
    }
}

#[test]
fn two_processes_fetch_and_add_one_counter_over_ib() {
    if uct_ib::testing::rdma_available() {
        two_processes_fetch_and_add("rc_v", 20_000);
        // Emulated over ud, under the VM's emulated CPUs, each fetch-and-add is a round trip of
        // hundreds of microseconds: 20,000 per peer (with rc's) took 268 s; 5,000 keeps the
        // test well inside the peers' time limit.
        two_processes_fetch_and_add("ud_v", 5_000);
    }
}

#[test]
fn both_sides_flushing_at_once_answer_each_other_over_ud() {
    if uct_ib::testing::rdma_available() {
        flushes_at_once("ud_v", 50);
    }
}

#[test]
fn compare_and_swap_locks_a_non_atomic_update_over_ib() {
    if uct_ib::testing::rdma_available() {
        compare_and_swap_lock(&[("rc_v", true), ("ud_v", false)], 500);
    }
}
