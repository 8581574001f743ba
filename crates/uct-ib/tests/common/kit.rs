//! Running the uct conformance kit against an InfiniBand transport. Include with
//! `#[path = "common/kit.rs"] mod kit_common;`; the including test binary keeps its own
//! `kit_agent` test (the entry the agent process is started with).

use uct::conformance::{self as kit, Options};

/// The first resource of transport `tl`, or `None` (and why, on stderr) when there is no RDMA
/// device; with `UCX_RS_REQUIRE_RDMA=1` (set in the VM) no device is a failure.
pub fn resource(tl: &str) -> Option<String> {
    if !uct_ib::testing::rdma_available() {
        return None;
    }
    let found = uct::query_resources().into_iter().find(|r| r.tl.tl_name == tl);
    Some(found.unwrap_or_else(|| panic!("no {tl} resource on an active port")).tl.full_name())
}

/// Runs every check (one at a time across the binary's tests) and fails on any check that
/// skipped unless `may_skip(check, across_processes)`.
pub fn run(opts: Options, may_skip: impl Fn(&str, bool) -> bool) {
    kit::run_checked(&opts, |name, _why, remote| may_skip(name, remote));
}
