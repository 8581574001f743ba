//! Steady-state sends allocate nothing: am_short, am_bcopy, put_short on `self`, `posix` and
//! `sysv`, including the receive path.

use std::cell::Cell;
use std::rc::Rc;

use uct::{AmRecv, EpParams, IfaceParams, MemAccess, Outcome, SendFlags, Worker};

#[global_allocator]
static GLOBAL: ucs::testing::CountingAlloc = ucs::testing::CountingAlloc;

/// Sends am_short, am_bcopy and put_short from a sender to a receiver on `resource` and checks
/// that 100k rounds after warm-up make no heap allocation (send and receive paths both).
fn steady_state(resource: &str) {
    uct_shm::register();
    let worker = Worker::default();
    let (md, rx) = uct::iface_open_by_name(&worker, resource, IfaceParams::default()).unwrap();
    rx.progress_enable(uct::ProgressFlags::RECV | uct::ProgressFlags::SEND);
    let loopback = resource.starts_with("self");
    let tx_iface = if loopback {
        None
    } else {
        Some(uct::iface_open_by_name(&worker, resource, IfaceParams::default()).unwrap().1)
    };
    let tx = tx_iface.as_deref().unwrap_or(&*rx);
    let got = Rc::new(Cell::new(0u64));
    let g2 = got.clone();
    rx.set_am_handler(0, Some(Rc::new(move |m: AmRecv<'_>| g2.set(g2.get() + m.len() as u64)))).unwrap();
    let ep = tx.ep_create(&EpParams::to_iface(&rx.device_address(), &rx.iface_address())).unwrap();
    let mut heap = vec![0u8; 64];
    let memh = if md.attr().flags.contains(uct::MdFlags::ALLOC) {
        md.mem_alloc(64, MemAccess::ALL, "alloc_free").unwrap()
    } else {
        // SAFETY: `heap` outlives the registration, dropped at the end of the test.
        unsafe { md.mem_reg(heap.as_mut_ptr(), 64, MemAccess::ALL) }.unwrap()
    };
    let rkey = md.component().rkey_unpack(&md.mkey_pack(&memh).unwrap()).unwrap();
    let payload = [7u8; 32];
    let retry = |f: &mut dyn FnMut() -> uct::OpResult<usize>| loop {
        match f() {
            Ok(Outcome::Done(n)) => return n,
            Ok(Outcome::NoResource) => {
                worker.progress();
            }
            other => panic!("{resource}: {other:?}"),
        }
    };
    let round = |i: u64| {
        retry(&mut || ep.am_short(0, i, &payload).map(|o| o.map(|_| 0)));
        let n = retry(&mut || {
            ep.am_bcopy(
                0,
                &mut |b: &mut [u8]| {
                    b[..64].fill(1);
                    64
                },
                SendFlags::empty(),
            )
        });
        assert_eq!(n, 64);
        assert_eq!(ep.put_short(&payload, memh.address() as u64, &rkey), Ok(Outcome::Done(())));
        worker.progress();
    };
    for i in 0..1000 {
        round(i); // warm up pools and lazily created buffers
    }
    let before = ucs::testing::allocations();
    for i in 0..100_000 {
        round(i);
    }
    let after = ucs::testing::allocations();
    while worker.progress() > 0 {}
    assert_eq!(after - before, 0, "{resource}: heap allocations in 100k steady-state rounds");
    assert_eq!(got.get(), 101_000 * (40 + 64), "{resource}: every message delivered");
    drop(ep);
    drop(memh);
    drop(heap);
}

/// One test, so the resources run one after another (the global counter is shared).
#[test]
fn steady_state_sends_do_not_allocate() {
    for r in ["self/memory0", "posix/memory", "sysv/memory"] {
        steady_state(r);
    }
}
