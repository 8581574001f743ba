//! Remote memory access and atomics across two and three processes over shared memory: this
//! process's worker is the target (and sometimes the origin), `ucp-peer rma` the other side,
//! over posix + cma, sysv + cma, and posix alone (where the peers' own memory is reached by
//! emulation over active messages), both kinds of memory (allocated by `mem_map_alloc`, or the
//! process's own buffer mapped):
//!
//! - puts and gets of 0 B .. 4 MiB, patterns checked byte for byte, both directions;
//! - a put flushed by the origin is in the target's memory when the flush completes;
//! - fence: a target that sees the flag sees the data;
//! - two processes each doing 100 000 fetch-and-adds on one counter: the exact sum, and no
//!   value fetched twice;
//! - compare-and-swap as a lock around a non-atomic get/increment/put.
//!
//! The scenarios are in `common/rma_scenarios.rs`; `ucp_rma_ib` runs them over InfiniBand.

#[path = "common/rma_scenarios.rs"]
mod scenarios;

use scenarios::*;

const TLS: [&str; 3] = ["posix,cma", "sysv,cma", "posix"];

#[test]
fn put_and_get_across_processes_both_ways() {
    put_and_get_both_ways(&TLS);
}

#[test]
fn fence_orders_the_flag_after_the_data_across_processes() {
    fence_orders_the_flag_after_the_data(&TLS);
}

#[test]
fn two_processes_fetch_and_add_one_counter() {
    // posix + cma: allocated memory takes the peers' CPU atomics, user memory emulation.
    two_processes_fetch_and_add("posix,cma", 100_000);
}

#[test]
fn both_sides_flushing_at_once_answer_each_other() {
    // posix alone reaches no user memory: every operation emulated.
    flushes_at_once("posix", 200);
}

#[test]
fn compare_and_swap_locks_a_non_atomic_update() {
    compare_and_swap_lock(&[("posix,cma", true), ("posix,cma", false), ("posix", false)], 2_000);
}
