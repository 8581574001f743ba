//! Active messages across real processes (this package's `ucp-peer am`) over posix + cma and
//! over sysv, each with eager short disabled once so that every message goes bcopy:
//! requests with a reply endpoint answered from inside the peer's handler (every size class,
//! headers from empty to the limit), floods from three peers at once delivered in order per
//! sender, and data kept beyond the handler while more arrives.

#[path = "common/am_scenarios.rs"]
mod scenarios;

use scenarios::across;

const SIZES: [usize; 10] = [0, 1, 7, 100, 2000, 8000, 8200, 20_000, 100_000, 400_000];

#[test]
fn across_processes_over_posix_and_cma() {
    across("posix,cma", &SIZES, 150);
}

#[test]
fn across_processes_over_sysv() {
    across("sysv", &SIZES, 150);
}
