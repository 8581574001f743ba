//! The registration cache against a naive model: random sequences of get / release / clone /
//! invalidate / failing registration, with random alignment and limits.
//!
//! Checked after every step: a returned region covers the request with at least the requested
//! access, is registered, and was not invalidated; a failing registration leaves the cache
//! as it was; no registration is deregistered while the test holds a handle to it (the
//! backend asserts it); every unused registration is in the cache's LRU (no leak); the cache
//! is over a limit only while every region in it is in use. At the end every registration has
//! been deregistered exactly once.

mod rcache_support;

use std::collections::BTreeSet;

use proptest::prelude::*;
use rcache_support::{Counting, Held, PAGE};
use ucs::rcache::{Rcache, RcacheParams, UnmapEvents};
use ucs::Status;

const BASE: usize = 0x40_0000;

#[derive(Clone, Debug)]
enum Op {
    Get { page: usize, off: usize, len: usize, access: u32 },
    Release(usize),
    Clone(usize),
    Invalidate { page: usize, pages: usize },
    InvalidateHandle(usize),
    FailingGet { page: usize, len: usize },
}

/// Offsets and lengths near alignment boundaries (16 bytes to a page), plus anything.
fn off() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0), Just(1), Just(15), Just(16), Just(17), Just(PAGE - 16), Just(PAGE - 1), 0..PAGE]
}

fn len() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1), Just(15), Just(16), Just(PAGE), Just(PAGE + 16), Just(2 * PAGE - 16), 1..4 * PAGE]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..12usize, off(), len(), 0..8u32).prop_map(|(page, off, len, access)| Op::Get { page, off, len, access }),
        3 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Clone),
        1 => (0..12usize, 1..6usize).prop_map(|(page, pages)| Op::Invalidate { page, pages }),
        1 => any::<usize>().prop_map(Op::InvalidateHandle),
        1 => (0..12usize, len()).prop_map(|(page, len)| Op::FailingGet { page, len }),
    ]
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn run(ops: Vec<Op>, align_shift: u32, max_regions: usize, max_size: usize) -> Result<(), TestCaseError> {
    let backend = Counting::default();
    let params = RcacheParams {
        alignment: 1 << align_shift,
        max_regions,
        max_size,
        events: UnmapEvents::Ignore,
        ..Default::default()
    };
    let cache = Rcache::new(backend.clone(), params).unwrap();
    let mut held: Vec<Held> = Vec::new();
    let mut invalidated: BTreeSet<u64> = BTreeSet::new();

    for op in ops {
        match op {
            Op::Get { page, off, len, access } => {
                let addr = BASE + page * PAGE + off;
                let h = backend.hold(cache.get(addr, len, access).map_err(|e| TestCaseError::fail(format!("{e:?}")))?);
                let id = h.id();
                prop_assert!(h.h().address() <= addr && h.h().end() >= addr + len, "{:?} does not cover", h.h());
                prop_assert_eq!(h.h().access() & access, access);
                prop_assert!(backend.is_live(id), "returned a deregistered region {}", id);
                prop_assert!(!invalidated.contains(&id), "returned invalidated region {}", id);
                let req = backend.0.borrow().live[&id];
                prop_assert_eq!((req.addr, req.len, req.access), (h.h().address(), h.h().len(), h.h().access()));
                prop_assert_eq!(req.addr % (1 << align_shift), 0);
                held.push(h);
            }
            Op::Release(i) => {
                if !held.is_empty() {
                    let n = held.len();
                    drop(held.swap_remove(i % n));
                }
            }
            Op::Clone(i) => {
                if !held.is_empty() {
                    let h = held[i % held.len()].clone();
                    held.push(h);
                }
            }
            Op::Invalidate { page, pages } => {
                let range = (BASE + page * PAGE, BASE + (page + pages) * PAGE);
                for (&id, req) in backend.0.borrow().live.iter() {
                    if overlaps(range, (req.addr, req.addr + req.len)) {
                        invalidated.insert(id);
                    }
                }
                cache.invalidate(range.0, range.1 - range.0);
            }
            Op::InvalidateHandle(i) => {
                if !held.is_empty() {
                    let h = &held[i % held.len()];
                    invalidated.insert(h.id());
                    h.h().invalidate();
                }
            }
            Op::FailingGet { page, len } => {
                let before = (cache.num_regions(), cache.total_size(), cache.unused_regions(), backend.regs());
                backend.0.borrow_mut().fail = Some(Status::NoMemory);
                let r = cache.get(BASE + page * PAGE, len, 0);
                backend.0.borrow_mut().fail = None;
                // A cached region may serve it without registering.
                if let Err(e) = r {
                    prop_assert_eq!(e, Status::NoMemory);
                    let after = (cache.num_regions(), cache.total_size(), cache.unused_regions(), backend.regs());
                    prop_assert_eq!(before, after);
                }
            }
        }

        // No leak: every live registration nobody holds is an unused cached region.
        let log = backend.0.borrow();
        let unheld = log.live.keys().filter(|id| log.held.get(id).copied().unwrap_or(0) == 0).count();
        prop_assert_eq!(unheld, cache.unused_regions());
        if cache.num_regions() > max_regions || cache.total_size() > max_size {
            prop_assert_eq!(cache.unused_regions(), 0, "over a limit with unused regions");
        }
    }

    drop(held);
    drop(cache);
    let log = backend.0.borrow();
    prop_assert!(log.live.is_empty(), "still registered: {:?}", log.live);
    let mut registered: Vec<u64> = log.registered.iter().map(|(id, _)| *id).collect();
    let mut deregistered = log.deregistered.clone();
    registered.sort_unstable();
    deregistered.sort_unstable();
    prop_assert_eq!(registered, deregistered);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn cache_against_model(
        ops in prop::collection::vec(op(), 1..120),
        align_shift in 4u32..=12,
        max_regions in prop_oneof![Just(usize::MAX), 1usize..8],
        max_pages in prop_oneof![Just(usize::MAX / PAGE), 1usize..16],
    ) {
        run(ops, align_shift, max_regions, max_pages * PAGE)?;
    }
}

/// A case that exercises merge, eviction and invalidation together, kept as a plain test.
#[test]
fn fixed_sequence() {
    let ops = vec![
        Op::Get { page: 0, off: 10, len: PAGE, access: 1 },
        Op::Get { page: 1, off: 0, len: 2 * PAGE, access: 2 },
        Op::Release(0),
        Op::Get { page: 5, off: 0, len: 100, access: 0 },
        Op::Invalidate { page: 1, pages: 1 },
        Op::Get { page: 0, off: 0, len: 3 * PAGE, access: 3 },
        Op::FailingGet { page: 10, len: 100 },
        Op::Clone(1),
        Op::InvalidateHandle(0),
        Op::Release(0),
        Op::Get { page: 20, off: 0, len: 4 * PAGE - 1, access: 7 },
    ];
    run(ops, 12, 2, 6 * PAGE).unwrap();
}
