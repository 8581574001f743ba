//! The `ud_verbs` data path allocates nothing once warm: `am_short`, `am_bcopy`, receiving,
//! handler calls, acknowledgements and send completions over the real transport, measured with
//! a counting global allocator (with injected loss, so resends and NAKs are on the measured
//! path too). Needs an RDMA device: run with `tools/rdma-vm/test`.

mod ud_common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucs::Outcome;
use uct::{AmRecv, Iface, SendFlags, Worker};
use uct_ib::ud::LossConfig;
use ud_common::{connect, device, open};

#[global_allocator]
static GLOBAL: ucs::testing::CountingAlloc = ucs::testing::CountingAlloc;

const AM: u8 = 2;

#[test]
fn warm_data_path_allocates_nothing() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    // A bounded window, so the send windows reach their largest size during the warm-up.
    let cfg = [("MAX_WINDOW", "64"), ("RX_QUEUE_LEN", "1024")];
    let (a, _) = open(&md, port, &worker, &cfg);
    let (b, _) = open(&md, port, &worker, &cfg);
    let got = [Rc::new(Cell::new(0u64)), Rc::new(Cell::new(0u64))];
    for (iface, n) in [(&a, &got[0]), (&b, &got[1])] {
        let n = n.clone();
        let h = move |m: AmRecv<'_>| {
            let seq = u64::from_ne_bytes(m.data()[..8].try_into().unwrap());
            assert_eq!(seq, n.get(), "in order, exactly once");
            n.set(seq + 1);
        };
        iface.set_am_handler(AM, Some(Rc::new(h))).unwrap();
    }
    let eps = [connect(&a, &b, 0), connect(&b, &a, 0)];
    let payload = [0x5au8; 40];
    let mut sent = [0u64; 2];
    let mut run = |target: u64| {
        let start = Instant::now();
        while got[0].get() < target || got[1].get() < target {
            for (k, ep) in eps.iter().enumerate() {
                while sent[k] < target {
                    let seq = sent[k];
                    let r = if seq % 2 == 0 {
                        ep.am_short(AM, seq, &payload)
                    } else {
                        let mut pack = |buf: &mut [u8]| {
                            buf[..8].copy_from_slice(&seq.to_ne_bytes());
                            buf[8..500].fill(0xa5);
                            500
                        };
                        ep.am_bcopy(AM, &mut pack, SendFlags::empty()).map(|o| o.map(|_| ()))
                    };
                    match r.expect("send") {
                        Outcome::Done(()) => sent[k] += 1,
                        _ => break,
                    }
                }
            }
            worker.progress();
            assert!(start.elapsed() < Duration::from_secs(120), "stuck at {} / {}", got[0].get(), got[1].get());
        }
    };
    // Warm up: without loss the windows open to their ceiling and fill (a window never holds
    // more), then with loss; descriptor pools and queues reach their high-water marks.
    run(4000);
    let loss = LossConfig { drop_ppm: 20_000, seed: 3, ..LossConfig::default() };
    a.set_loss(loss);
    b.set_loss(LossConfig { seed: 4, ..loss });
    run(8000);
    let resent_before = a.stats().resent + b.stats().resent;

    let allocs = ucs::testing::count_allocations(|| {
        run(16_000);
    });

    let resent = a.stats().resent + b.stats().resent;
    assert!(resent > resent_before, "the measured run resent lost packets");
    assert_eq!(allocs, 0, "allocations on the warm data path");
}
