//! Unit tests of the cache logic, with a backend that records every call and touches no
//! memory (addresses are made up; events are ignored unless a test asks for them).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use super::*;

#[derive(Debug, PartialEq, Eq)]
struct TestReg {
    id: u64,
}

#[derive(Default)]
struct Log {
    next_id: u64,
    /// Live registrations: id -> request.
    live: BTreeMap<u64, RegRequest>,
    registered: Vec<RegRequest>,
    deregistered: Vec<u64>,
    /// Registrations whose length exceeds this fail.
    fail_above: Option<usize>,
    fail_all: bool,
}

#[derive(Clone, Default)]
struct Counting(Rc<RefCell<Log>>);

impl RegBackend for Counting {
    type Reg = TestReg;

    fn register(&self, req: &RegRequest) -> Result<TestReg, Status> {
        let mut log = self.0.borrow_mut();
        if log.fail_all || log.fail_above.is_some_and(|max| req.len > max) {
            return Err(Status::IoError);
        }
        log.next_id += 1;
        let id = log.next_id;
        log.live.insert(id, *req);
        log.registered.push(*req);
        Ok(TestReg { id })
    }

    fn deregister(&self, reg: TestReg) {
        let mut log = self.0.borrow_mut();
        assert!(log.live.remove(&reg.id).is_some(), "deregistered {} twice", reg.id);
        log.deregistered.push(reg.id);
    }
}

impl Counting {
    fn regs(&self) -> usize {
        self.0.borrow().registered.len()
    }
    fn deregs(&self) -> Vec<u64> {
        self.0.borrow().deregistered.clone()
    }
    fn live(&self) -> usize {
        self.0.borrow().live.len()
    }
}

const PAGE: usize = 4096;
const BASE: usize = 0x10_0000;

fn cache_with(params: RcacheParams) -> (Rcache<Counting>, Counting) {
    let backend = Counting::default();
    let cache = Rcache::new(backend.clone(), RcacheParams { events: UnmapEvents::Ignore, ..params }).unwrap();
    (cache, backend)
}

fn cache() -> (Rcache<Counting>, Counting) {
    cache_with(RcacheParams { alignment: PAGE, ..Default::default() })
}

#[test]
fn hit_on_a_sub_range() {
    let (c, b) = cache();
    let h = c.get(BASE + 100, 3 * PAGE, 1).unwrap();
    assert_eq!((h.address(), h.len()), (BASE, 4 * PAGE), "aligned out to pages");
    let h2 = c.get(BASE + PAGE + 10, 100, 1).unwrap();
    assert_eq!(h2.reg(), h.reg());
    assert_eq!(b.regs(), 1);
    let s = c.stats();
    assert_eq!((s.gets, s.hits, s.misses), (2, 1, 1));
}

#[test]
fn alignment_is_configurable() {
    let (c, _) = cache_with(RcacheParams { alignment: 64, ..Default::default() });
    let h = c.get(BASE + 100, 10, 0).unwrap();
    assert_eq!((h.address(), h.end()), (BASE + 64, BASE + 128));
    for bad in [0, 8, 48, 1 << 20] {
        let r = Rcache::new(Counting::default(), RcacheParams { alignment: bad, ..Default::default() });
        assert_eq!(r.err(), Some(Status::InvalidParam), "alignment {bad}");
    }
}

#[test]
fn bad_ranges() {
    let (c, b) = cache();
    assert_eq!(c.get(BASE, 0, 0).err(), Some(Status::InvalidParam));
    assert_eq!(c.get(usize::MAX - 10, 100, 0).err(), Some(Status::InvalidParam));
    assert_eq!(c.get(usize::MAX - 10, 5, 0).err(), Some(Status::InvalidParam), "aligning up wraps");
    assert_eq!(b.regs(), 0);
}

#[test]
fn overlapping_and_adjacent_regions_merge() {
    let (c, b) = cache();
    let a = c.get(BASE, 2 * PAGE, 1).unwrap();
    let d = c.get(BASE + 4 * PAGE, PAGE, 1).unwrap();
    drop(d);
    // Overlaps `a`'s second page and is adjacent to `d`.
    let m = c.get(BASE + PAGE, 3 * PAGE, 1).unwrap();
    assert_eq!((m.address(), m.end()), (BASE, BASE + 5 * PAGE));
    assert!(b.0.borrow().registered[2].merged);
    assert_eq!(c.num_regions(), 1);
    assert_eq!(c.stats().merges, 2);
    // `d` was unused: deregistered at once; `a` is in use: still registered.
    assert_eq!(b.deregs(), [2]);
    assert!(!a.is_cached());
    // Everything now hits the merged region.
    for (addr, len) in [(BASE, 1), (BASE + 4 * PAGE, PAGE), (BASE + 100, 5 * PAGE - 200)] {
        assert_eq!(c.get(addr, len, 1).unwrap().reg(), m.reg());
    }
    drop(a);
    assert_eq!(b.deregs(), [2, 1], "the old region goes with its last user");
    assert_eq!(b.regs(), 3);
}

#[test]
fn repeated_overlapping_buffers_converge() {
    let (c, b) = cache();
    let mut handles = Vec::new();
    for i in 0..10 {
        handles.push(c.get(BASE + i * PAGE, 2 * PAGE, 0).unwrap());
    }
    assert_eq!(c.num_regions(), 1);
    let last = handles.last().unwrap();
    assert_eq!((last.address(), last.end()), (BASE, BASE + 11 * PAGE));
    drop(handles);
    assert_eq!(b.live(), 1);
    assert!(c.get(BASE + 5 * PAGE, 3 * PAGE, 0).is_ok());
    assert_eq!(b.regs(), 10);
}

#[test]
fn no_deregistration_while_used() {
    let (c, b) = cache();
    let h = c.get(BASE, PAGE, 0).unwrap();
    let h2 = h.clone();
    let h3 = c.get(BASE, PAGE, 0).unwrap();
    drop(h);
    drop(h3);
    assert_eq!(c.unused_regions(), 0);
    drop(h2);
    assert_eq!(c.unused_regions(), 1);
    assert!(b.deregs().is_empty(), "released regions stay registered");
    drop(c);
    assert_eq!(b.deregs(), [1], "the cache deregisters what is left");
}

#[test]
fn handles_outlive_the_cache() {
    let (c, b) = cache();
    let h = c.get(BASE, PAGE, 0).unwrap();
    let unused = c.get(BASE + 8 * PAGE, PAGE, 0).unwrap();
    drop(unused);
    drop(c);
    assert_eq!(b.deregs(), [2]);
    assert!(!h.is_cached());
    assert_eq!(h.reg().id, 1);
    drop(h);
    assert_eq!(b.deregs(), [2, 1]);
}

#[test]
fn lru_eviction_by_count() {
    let (c, b) = cache_with(RcacheParams { alignment: PAGE, max_regions: 2, ..Default::default() });
    let r1 = c.get(BASE, PAGE, 0).unwrap();
    let r2 = c.get(BASE + 2 * PAGE, PAGE, 0).unwrap();
    let r3 = c.get(BASE + 4 * PAGE, PAGE, 0).unwrap();
    assert_eq!(c.num_regions(), 3, "all in use: over the limit, nothing evicted");
    assert!(b.deregs().is_empty());
    drop(r2);
    assert_eq!(b.deregs(), [2], "the first released goes");
    drop(r1);
    drop(r3);
    assert_eq!(c.num_regions(), 2);
    // Touch region 1 (hit), then add a new one: region 3, least recently released, goes.
    drop(c.get(BASE, PAGE, 0).unwrap());
    drop(c.get(BASE + 6 * PAGE, PAGE, 0).unwrap());
    assert_eq!(b.deregs(), [2, 3]);
    assert_eq!(c.stats().evictions, 2);
}

#[test]
fn lru_eviction_by_bytes() {
    let (c, b) = cache_with(RcacheParams { alignment: PAGE, max_size: 4 * PAGE, ..Default::default() });
    drop(c.get(BASE, 2 * PAGE, 0).unwrap()); // id 1
    drop(c.get(BASE + 3 * PAGE, PAGE, 0).unwrap()); // id 2
    drop(c.get(BASE + 5 * PAGE, PAGE, 0).unwrap()); // id 3
    assert_eq!(c.total_size(), 4 * PAGE);
    assert!(b.deregs().is_empty());
    drop(c.get(BASE + 7 * PAGE, 2 * PAGE, 0).unwrap()); // id 4: 6 pages, evict 1 (2 pages)
    assert_eq!(b.deregs(), [1]);
    assert_eq!(c.total_size(), 4 * PAGE);
    let big = c.get(BASE + 10 * PAGE, 8 * PAGE, 0).unwrap(); // bigger than the limit
    assert_eq!(b.deregs(), [1, 2, 3, 4], "every unused region goes, the used one stays");
    assert_eq!(c.total_size(), 8 * PAGE);
    drop(big);
    assert_eq!(b.deregs(), [1, 2, 3, 4, 5], "over the limit on its own: evicted when released");
}

#[test]
fn invalidation_while_unused_and_while_used() {
    let (c, b) = cache();
    let used = c.get(BASE, PAGE, 0).unwrap();
    drop(c.get(BASE + 2 * PAGE, PAGE, 0).unwrap());
    drop(c.get(BASE + 4 * PAGE, PAGE, 0).unwrap());
    assert_eq!(c.invalidate(BASE + 100, 2 * PAGE + 1), 2, "overlap by one byte is enough");
    assert_eq!(b.deregs(), [2], "unused: at once");
    assert_eq!(c.num_regions(), 1);
    // The invalidated region is never returned again.
    let again = c.get(BASE, PAGE, 0).unwrap();
    assert_ne!(again.reg(), used.reg());
    assert!(!used.is_cached() && again.is_cached());
    drop(used);
    assert_eq!(b.deregs(), [2, 1], "used: when released");
    assert_eq!(c.invalidate(BASE + 3 * PAGE, PAGE), 0, "no overlap");
    assert_eq!(c.invalidate(BASE + 10, 0), 0, "empty range");
    again.invalidate();
    assert_eq!(c.num_regions(), 1);
    drop(again);
    assert_eq!(b.deregs(), [2, 1, 4]);
    assert_eq!(c.invalidate_all(), 1);
    assert_eq!(b.live(), 0);
}

#[test]
fn access_superset_serves() {
    let (c, b) = cache();
    const R: u32 = 1;
    const W: u32 = 2;
    const A: u32 = 4;
    let rw = c.get(BASE, 2 * PAGE, R | W).unwrap();
    assert_eq!(c.get(BASE, PAGE, R).unwrap().reg(), rw.reg());
    assert_eq!(c.get(BASE, PAGE, 0).unwrap().reg(), rw.reg());
    // More access than cached: a new region with the union replaces it.
    let rwa = c.get(BASE + PAGE, PAGE, A).unwrap();
    assert_eq!(rwa.access(), R | W | A);
    assert_eq!((rwa.address(), rwa.end()), (BASE, BASE + 2 * PAGE));
    assert_eq!(c.get(BASE, 2 * PAGE, W | A).unwrap().reg(), rwa.reg());
    assert_eq!(b.regs(), 2);
}

#[test]
fn registration_failure_leaves_the_cache_unchanged() {
    let (c, b) = cache();
    drop(c.get(BASE, PAGE, 0).unwrap());
    b.0.borrow_mut().fail_all = true;
    let before = (c.num_regions(), c.total_size(), c.unused_regions());
    // Adjacent to the cached region: the merged span fails, then the request alone.
    assert_eq!(c.get(BASE + PAGE, PAGE, 0).err(), Some(Status::IoError));
    assert_eq!(c.get(BASE + 8 * PAGE, PAGE, 0).err(), Some(Status::IoError));
    assert_eq!((c.num_regions(), c.total_size(), c.unused_regions()), before);
    assert_eq!(c.stats().reg_failures, 3);
    b.0.borrow_mut().fail_all = false;
    assert!(c.get(BASE, PAGE, 0).is_ok());
    assert_eq!(b.regs(), 1, "the cached region is still there");
}

#[test]
fn failed_merge_retries_the_request_alone() {
    let (c, b) = cache();
    let far = c.get(BASE, 2 * PAGE, 1).unwrap();
    drop(c.get(BASE + 3 * PAGE, PAGE, 1).unwrap());
    b.0.borrow_mut().fail_above = Some(2 * PAGE);
    // Overlaps `far` and is adjacent to the other: the merged span (4 pages) fails.
    let h = c.get(BASE + PAGE, 2 * PAGE, 1).unwrap();
    assert_eq!((h.address(), h.end()), (BASE + PAGE, BASE + 3 * PAGE));
    let reqs = b.0.borrow().registered.clone();
    assert_eq!(reqs.len(), 3);
    assert!(!reqs[2].merged);
    // The overlapped region left the index; the adjacent one stayed.
    assert!(!far.is_cached());
    assert_eq!(c.num_regions(), 2);
    assert_eq!(c.stats().reg_failures, 1);
    assert!(b.deregs().is_empty());
}

#[test]
fn config_defaults_are_ucx_defaults() {
    let config = RcacheConfig::default();
    let params = RcacheParams::from_config("ib", &config);
    assert_eq!(params.max_regions, usize::MAX);
    assert_eq!(params.max_size, usize::MAX);
    assert_eq!(params.alignment, 16);
    assert_eq!(params.events, UnmapEvents::Required);
    let env = std::collections::HashMap::from([
        ("UCX_IB_RCACHE_MAX_REGIONS", "100"),
        ("UCX_RCACHE_MAX_SIZE", "1g"),
        ("UCX_RCACHE_ADDR_ALIGN", "4096"),
        ("UCX_RCACHE_UNSAFE_NO_EVENTS", "y"),
    ]);
    let config = <RcacheConfig as crate::config::Config>::read_from(&env, &["IB_", ""]).unwrap();
    let params = RcacheParams::from_config("ib", &config);
    assert_eq!((params.max_regions, params.max_size, params.alignment), (100, 1 << 30, 4096));
    assert_eq!(params.events, UnmapEvents::BestEffort);
}
