//! The stream API across real processes (`ucp-peer stream`) over posix + cma and over sysv
//! (with and without eager short): a million sends of random sizes (99 in 100 up to 64
//! bytes, the others up to 4 KiB; over sysv 20,000 up to 300 KB) received with random sizes - with and without `WAITALL`, and as
//! zero-copy pieces - and checked byte for byte, in both directions at once. Over rc/ud in the
//! VM: `ucp_stream_ib`.

#[path = "common/stream_scenarios.rs"]
mod scenarios;

#[test]
fn a_million_random_sends_over_posix_and_cma() {
    scenarios::both_ways("posix,cma", &[], 1_000_000, 4096);
}

#[test]
fn random_sends_over_sysv_without_short() {
    scenarios::both_ways("sysv", &[("BCOPY_THRESH", "0")], 20_000, 300_000);
}
