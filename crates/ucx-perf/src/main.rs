//! ucx-perf (in progress)
fn main() {}
