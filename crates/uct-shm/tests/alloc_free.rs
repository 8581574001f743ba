//! Steady-state sends on `self` allocate nothing: am_short, am_bcopy, put_short.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use uct::{AmRecv, EpParams, IfaceParams, MemAccess, Outcome, SendFlags, Worker};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_sends_do_not_allocate() {
    uct_shm::register();
    let worker = Worker::default();
    let (md, iface) = uct::iface_open_by_name(&worker, "self/memory0", IfaceParams::default()).unwrap();
    let got = Rc::new(Cell::new(0u64));
    let g2 = got.clone();
    iface.set_am_handler(0, Some(Rc::new(move |m: AmRecv<'_>| g2.set(g2.get() + m.len() as u64)))).unwrap();
    let ep = iface.ep_create(&EpParams::to_iface(&iface.device_address(), &iface.iface_address())).unwrap();
    let mut target = vec![0u8; 64];
    // SAFETY: `target` outlives the registration, dropped at the end of the test.
    let memh = unsafe { md.mem_reg(target.as_mut_ptr(), 64, MemAccess::ALL) }.unwrap();
    let rkey = md.component().rkey_unpack(&md.mkey_pack(&memh).unwrap()).unwrap();
    let payload = [7u8; 32];
    let round = |i: u64| {
        assert_eq!(ep.am_short(0, i, &payload), Ok(Outcome::Done(())));
        let r = ep.am_bcopy(
            0,
            &mut |b: &mut [u8]| {
                b[..64].fill(1);
                64
            },
            SendFlags::empty(),
        );
        assert_eq!(r, Ok(Outcome::Done(64)));
        assert_eq!(ep.put_short(&payload, memh.address() as u64, &rkey), Ok(Outcome::Done(())));
        worker.progress();
    };
    for i in 0..1000 {
        round(i); // warm up pools
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    for i in 0..100_000 {
        round(i);
    }
    let after = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(after - before, 0, "heap allocations in 100k steady-state rounds");
    assert_eq!(got.get(), 101_000 * (40 + 64));
    drop(ep);
    drop(memh);
    drop(target);
}
