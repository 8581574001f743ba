//! # ucx-perf - the measurement engine of the `ucx_perftest`-compatible benchmark
//!
//! [`uct_tests`] runs the UCT tests (`am_lat`, `put_lat`, `add_lat`, `get`, `fadd`, `swap`,
//! `cswap`, `am_bw`, `put_bw`, `add_mr`) and [`ucp_tests`] the UCP tag tests (`tag_lat`,
//! `tag_bw`, `tag_sync_lat`, `tag_sync_bw`) with the reference's algorithms; [`meter`] times them
//! as the reference does; [`params`] is what both take, as the command line sets it. The
//! `ucx-perf` binary adds the command line, the TCP bootstrap and the output format.

pub mod meter;
pub mod params;
pub mod ucp_tests;
pub mod uct_tests;
