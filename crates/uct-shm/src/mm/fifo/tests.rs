use super::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Region {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the region is plain memory shared between test threads only through the FIFO
// protocol (atomics and published elements).
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    fn new(len: usize) -> Arc<Region> {
        let layout = std::alloc::Layout::from_size_align(len, 64).unwrap();
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).unwrap();
        Arc::new(Region { ptr, layout })
    }

    fn fifo(&self, fl: FifoLayout) -> Fifo {
        // SAFETY: the region outlives every Fifo made from it in these tests (threads joined
        // before the Arc drops) and is used only through the FIFO protocol.
        unsafe { Fifo::from_raw(self.ptr, self.layout.size(), fl).unwrap() }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[test]
fn layout_validation() {
    assert!(FifoLayout::new(64, 128).is_ok());
    assert_eq!(FifoLayout::new(63, 128), Err(Status::InvalidParam));
    assert_eq!(FifoLayout::new(1, 128), Err(Status::InvalidParam));
    assert_eq!(FifoLayout::new(64, 12), Err(Status::InvalidParam));
    assert_eq!(FifoLayout::new(64, 100), Err(Status::InvalidParam));
    let fl = FifoLayout::new(8, 64).unwrap();
    assert_eq!(fl.total_len(), 128 + 8 * 64);
    assert_eq!(fl.max_inline(), 56);
    let r = Region::new(fl.total_len());
    // SAFETY: too-short length is rejected before any access.
    let short = unsafe { Fifo::from_raw(r.ptr, fl.total_len() - 1, fl) };
    assert!(short.is_err());
}

#[test]
fn single_thread_wraps_and_reports_full() {
    let fl = FifoLayout::new(4, 32).unwrap();
    let r = Region::new(fl.total_len());
    r.fifo(fl).init(1, |i| i * 100);
    let p = Producer::new(r.fifo(fl));
    let mut c = Consumer::new(r.fifo(fl), 2).unwrap();
    let mut sent = 0u64;
    for round in 0..10 {
        while let Some(claim) = p.claim() {
            // SAFETY: claimed element; 8 bytes fit inline.
            unsafe { claim.inline_ptr().cast::<u64>().write_unaligned(sent) };
            p.publish(claim, 3, 8, true);
            sent += 1;
        }
        assert_eq!(sent, 4 * (round + 1), "4 slots per round");
        let mut got = 0;
        while let Some(e) = c.peek() {
            assert_eq!((e.am_id, e.length, e.inline), (3, 8, true));
            // SAFETY: published inline element at the read index.
            let v = unsafe { c.inline_ptr().cast::<u64>().read_unaligned() };
            assert_eq!(v, sent - 4 + got);
            c.advance();
            got += 1;
        }
        assert_eq!(got, 4);
    }
}

#[test]
fn arm_is_busy_when_elements_wait_and_signals_once() {
    let fl = FifoLayout::new(8, 32).unwrap();
    let r = Region::new(fl.total_len());
    r.fifo(fl).init(1, |_| 0);
    let p = Producer::new(r.fifo(fl));
    let mut c = Consumer::new(r.fifo(fl), 1).unwrap();
    assert_eq!(c.arm(), Ok(()));
    let a = p.claim().unwrap();
    assert!(a.armed, "first producer after arm must signal");
    p.publish(a, 1, 0, true);
    let b = p.claim().unwrap();
    assert!(!b.armed, "only one signal per arm");
    p.publish(b, 1, 0, true);
    assert_eq!(c.arm(), Err(Status::Busy));
    c.peek().unwrap();
    c.advance();
    c.peek().unwrap();
    c.advance();
    assert_eq!(c.arm(), Ok(()));
}

/// Several producer threads and one consumer through a small FIFO: every message arrives
/// exactly once, in order per producer, across many wrap-arounds.
#[test]
fn multi_producer_exactly_once_in_order() {
    const PRODUCERS: u64 = 3;
    const PER: u64 = 20_000;
    let fl = FifoLayout::new(16, 32).unwrap();
    let r = Region::new(fl.total_len());
    r.fifo(fl).init(1, |_| 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let handles: Vec<_> = (0..PRODUCERS)
        .map(|pid| {
            let r = r.clone();
            std::thread::spawn(move || {
                let p = Producer::new(r.fifo(fl));
                for seq in 0..PER {
                    let claim = loop {
                        if let Some(c) = p.claim() {
                            break c;
                        }
                        assert!(Instant::now() < deadline, "producer {pid} stuck");
                        std::thread::yield_now();
                    };
                    // SAFETY: claimed element; 16 bytes fit inline.
                    unsafe {
                        claim.inline_ptr().cast::<u64>().write_unaligned(pid);
                        claim.inline_ptr().add(8).cast::<u64>().write_unaligned(seq);
                    }
                    p.publish(claim, pid as u8, 16, true);
                }
            })
        })
        .collect();
    let mut c = Consumer::new(r.fifo(fl), 4).unwrap();
    let mut next = [0u64; PRODUCERS as usize];
    let mut total = 0;
    while total < PRODUCERS * PER {
        match c.peek() {
            Some(e) => {
                // SAFETY: published inline element at the read index.
                let (pid, seq) = unsafe {
                    (
                        c.inline_ptr().cast::<u64>().read_unaligned(),
                        c.inline_ptr().add(8).cast::<u64>().read_unaligned(),
                    )
                };
                assert_eq!(e.am_id as u64, pid);
                assert_eq!(seq, next[pid as usize], "producer {pid} out of order");
                next[pid as usize] += 1;
                c.advance();
                total += 1;
            }
            None => {
                assert!(Instant::now() < deadline, "consumer stuck at {total}");
                std::thread::yield_now();
            }
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    assert!(c.peek().is_none(), "no extra elements");
}
