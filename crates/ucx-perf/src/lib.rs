//! # ucx-perf - the measurement engine of the `ucx_perftest`-compatible benchmark
//!
//! [`uct_tests`] runs the UCT tests (`am_lat`, `put_lat`, `add_lat`, `get`, `fadd`, `swap`,
//! `cswap`, `am_bw`, `put_bw`, `add_mr`), [`ucp_tests`] the UCP tag tests (`tag_lat`,
//! `tag_bw`, `tag_sync_lat`, `tag_sync_bw`) and [`ucp_rma_tests`] the UCP RMA and atomic tests
//! (`ucp_put_lat`, `ucp_put_bw`, `ucp_get`, `ucp_add`, `ucp_fadd`, `ucp_swap`, `ucp_cswap`)
//! with the reference's algorithms; [`meter`] times them
//! as the reference does; [`params`] is what both take, as the command line sets it. The
//! `ucx-perf` binary adds the command line, the TCP bootstrap and the output format.

pub mod meter;
pub mod params;
pub mod ucp_rma_tests;
pub mod ucp_tests;
pub mod uct_tests;
