//! Proves the steady-state paths allocate nothing: a counting global allocator (counts kept per
//! thread, so the test harness's other threads do not disturb them) watches 100k get/put cycles
//! of `MemPool`, `PoolBuf` and `ObjPool` after warm-up, and the push/pop paths of the other
//! single-thread structures.

use std::hint::black_box;
use std::ptr::NonNull;
use std::rc::Rc;

use ucs::arbiter::{ArbResult, Arbiter};
use ucs::fraglist::{FragInsert, FragList, Sn16};
use ucs::idtable::IdTable;
use ucs::mpool::{HeapChunkAlloc, MemPool, MpoolParams, ObjPool, PoolBox};
use ucs::queue::Queue;

#[global_allocator]
static GLOBAL: ucs::testing::CountingAlloc = ucs::testing::CountingAlloc;

/// Runs `f` and returns how many allocations it made on this thread.
fn count(f: impl FnOnce()) -> u64 {
    ucs::testing::count_allocations(f)
}

// Miri runs the same paths, just fewer times.
const CYCLES: usize = if cfg!(miri) { 500 } else { 100_000 };

#[test]
fn counter_sees_growth() {
    let pool = MemPool::new(MpoolParams::new(64), Box::new(HeapChunkAlloc)).unwrap();
    let mut slot = None;
    assert!(count(|| slot = pool.get()) >= 1, "first get allocates a chunk");
    // SAFETY: the slot came from this pool's get and is put once.
    unsafe { pool.put(slot.unwrap()) };
}

#[test]
fn mempool_get_put_allocates_nothing_once_warm() {
    let params = MpoolParams { elems_per_chunk: 16, ..MpoolParams::new(200) };
    let pool = MemPool::new(params, Box::new(HeapChunkAlloc)).unwrap();
    assert!(pool.grow(64).unwrap() >= 64, "extra room from the allocator is used too");
    let mut held: [Option<NonNull<u8>>; 8] = [None; 8];
    let n = count(|| {
        for i in 0..CYCLES {
            let k = i % held.len();
            if let Some(p) = held[k].take() {
                // SAFETY: p came from this pool's get and is put once.
                unsafe { pool.put(p) };
            }
            let p = pool.get().unwrap();
            // SAFETY: the slot is ours and at least elem_size bytes long.
            unsafe { p.as_ptr().write(i as u8) };
            held[k] = Some(p);
        }
    });
    assert_eq!(n, 0);
    for p in held.into_iter().flatten() {
        // SAFETY: p came from this pool's get and is put once.
        unsafe { pool.put(p) };
    }
    assert_eq!(pool.num_free(), pool.num_elems());
}

#[test]
fn poolbuf_allocates_nothing_once_warm() {
    let pool = Rc::new(MemPool::new(MpoolParams::new(128), Box::new(HeapChunkAlloc)).unwrap());
    drop(pool.get_buf());
    let n = count(|| {
        for i in 0..CYCLES {
            let mut a = pool.get_buf().unwrap();
            let mut b = pool.get_buf().unwrap();
            a.as_mut_slice()[0] = i as u8;
            b[127] = a[0];
            black_box((&a, &b));
        }
    });
    assert_eq!(n, 0);
}

#[test]
fn objpool_allocates_nothing_once_warm() {
    let pool = ObjPool::<(u64, [u8; 40], Rc<()>)>::new(32, 1024).unwrap();
    let token = Rc::new(());
    drop(pool.get((0, [0; 40], Rc::clone(&token))));
    let n = count(|| {
        for i in 0..CYCLES {
            let mut a = pool.get((i as u64, [1; 40], Rc::clone(&token))).ok().unwrap();
            a.0 += 1;
            let b = pool.get((a.0, [2; 40], Rc::clone(&token))).ok().unwrap();
            let (v, _, _) = PoolBox::into_inner(b);
            black_box((v, &a));
        }
    });
    assert_eq!(n, 0);
    assert_eq!(Rc::strong_count(&token), 1, "every value was dropped");
}

#[test]
fn other_structures_allocate_nothing_once_warm() {
    let mut q = Queue::with_capacity(16);
    let mut arb = Arbiter::new();
    let groups: Vec<_> = (0..4).map(|_| arb.add_group()).collect();
    let mut ids = IdTable::with_capacity(16);
    let mut fl = FragList::new(Sn16(65000), 64);
    let mut round = |i: usize| {
        for k in 0..8 {
            q.push(k);
            arb.push(groups[k % 4], k);
        }
        q.extract_if(|e| *e % 3 == 0, drop);
        while q.pop().is_some() {}
        arb.dispatch(|_, _| ArbResult::RemoveElem);
        let (g, e) = (groups[i % 4], i);
        arb.push(g, e);
        let (g, e) = arb.pop_next().unwrap();
        arb.resolve(g, Some(e), ArbResult::NextGroup);
        arb.purge(g, drop);
        let id = ids.insert(i);
        assert_eq!(ids.remove(id), Some(i));
        // Two out of order, then the gap closes.
        let base = fl.head_sn();
        assert!(matches!(fl.insert(base.add(3), 3), FragInsert::Held));
        assert!(matches!(fl.insert(base.add(2), 2), FragInsert::Held));
        assert!(matches!(fl.insert(base.add(1), 1), FragInsert::Ready(1)));
        while fl.pull().is_some() {}
    };
    for i in 0..16 {
        round(i);
    }
    assert_eq!(count(|| (16..CYCLES / 10).for_each(&mut round)), 0);
}
