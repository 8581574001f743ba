//! Active messages and the stream API across processes over the tcp transport alone
//! (`UCX_TLS=tcp`, loopback device): the scenarios the shared-memory and InfiniBand runs use.
//! One test, so that its busy-polling pairs run one after the other.

#[path = "common/am_scenarios.rs"]
mod am;
#[path = "common/stream_scenarios.rs"]
mod stream;

const SIZES: [usize; 8] = [0, 1, 100, 2000, 4100, 9000, 40_000, 150_000];

#[test]
fn active_messages_and_stream_over_tcp() {
    // (The peers inherit it.)
    std::env::set_var("UCX_NET_DEVICES", "lo");
    am::across("tcp", &SIZES, 60);
    stream::both_ways("tcp", &[], 5_000, 100_000);
}
