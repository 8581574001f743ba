//! # ucx-perf - a drop-in for `ucx_perftest`
//!
//! The benchmark lands with the shared-memory transports it measures (`am_lat`, `put_lat`,
//! `am_bw`, ... over `posix`, `sysv`, `cma`, with `ucx_perftest`'s flags and output). Until then
//! this binary says so and exits with status 1 rather than pretending to measure anything.
//! The crate also builds `ucx_info` (`-d` resources, `-c`/`-cf` configuration).

use std::process::ExitCode;

// Command line, output and bootstrap of the benchmark; the driver that uses them comes next.
#[allow(dead_code)]
mod opts;
#[allow(dead_code)]
mod report;
#[allow(dead_code)]
mod rte;

fn main() -> ExitCode {
    eprintln!(
        "ucx-perf: no benchmark is implemented yet (it arrives with the shared-memory transports). \
         Try: cargo run -p uct-shm --example self_am, or ucx_info -d"
    );
    ExitCode::from(1)
}
