//! Remote memory access and atomics in one process: an endpoint to the same worker (`self`)
//! and between two workers over shared memory (posix for memory the peer allocated, cma for
//! its user memory), every size class of every route, both kinds of memory, and the errors.

mod common;

use common::noop_waker;
use ucp::{
    AtomicOp, Context, ContextParams, Endpoint, Features, IoVec, MemHandle, Operand, RecvData, RemoteKey, RequestParam,
    SendData, Status, Worker, WorkerParams,
};

/// Busy-polling tests of this file run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn ctx(tls: &str, extra: &[(&str, &str)]) -> Context {
    uct_shm::register();
    let mut p = ContextParams::new(Features::RMA | Features::AMO32 | Features::AMO64).with_config("TLS", tls);
    for (k, v) in extra {
        p = p.with_config(k, v);
    }
    Context::new(&p).unwrap()
}

/// A pair of workers (the same one twice for `self`) and an endpoint from the first to the
/// second, connected.
struct Pair {
    a: Worker,
    b: Worker,
    ep: Endpoint,
}

impl Pair {
    fn new(tls: &str, extra: &[(&str, &str)]) -> Pair {
        let c = ctx(tls, extra);
        let a = Worker::new(&c, &WorkerParams::new("a")).unwrap();
        let b = if tls == "self" { a.clone() } else { Worker::new(&c, &WorkerParams::new("b")).unwrap() };
        let ep = a.ep_create(b.address()).unwrap();
        let p = Pair { a, b, ep };
        // Wire up: a flush completes once the endpoint is connected and idle.
        {
            let r = p.ep.flush_nbx(RequestParam::new()).unwrap();
            if let Some(r) = r {
                p.wait_until(|| r.is_completed());
                assert_eq!(r.status(), Status::Ok);
            }
        }
        p
    }

    fn progress(&self) {
        self.a.progress();
        self.b.progress();
    }

    /// Progresses both workers until `done` (bounded).
    fn wait_until(&self, mut done: impl FnMut() -> bool) {
        let t0 = std::time::Instant::now();
        while !done() {
            self.progress();
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "timed out");
        }
    }

    /// Waits for an operation's request, if it has one; its status.
    fn finish(&self, r: Result<Option<ucp::Request<'_>>, Status>) -> Status {
        match r {
            Err(e) => e,
            Ok(None) => Status::Ok,
            Ok(Some(req)) => {
                self.wait_until(|| req.is_completed());
                req.status()
            }
        }
    }

    /// Runs a future to completion, progressing both workers (emulated operations need the
    /// target's progress).
    fn run<F: std::future::Future>(&self, f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let waker = noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let t0 = std::time::Instant::now();
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            self.progress();
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "timed out");
        }
    }

    /// The key of region `h` of worker `b`, unpacked on the endpoint.
    fn key(&self, h: &MemHandle) -> RemoteKey {
        let packed = self.b.rkey_pack(h).unwrap();
        self.ep.rkey_unpack(&packed).unwrap()
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 8) as u8)).collect()
}

/// The target's region: allocated by the worker, or the test's own buffer mapped.
enum Region {
    Alloc(MemHandle),
    /// The mapping, and the memory it maps (kept alive until unmapped).
    User(MemHandle, #[allow(dead_code)] Vec<u8>),
}

impl Region {
    fn new(w: &Worker, len: usize, alloc: bool) -> Region {
        if alloc {
            Region::Alloc(w.mem_map_alloc(len).unwrap())
        } else {
            let mut v = vec![0u8; len];
            // SAFETY: `v` lives in the region until unmapped (drop order in `unmap`).
            let h = unsafe { w.mem_map(v.as_mut_ptr(), len) }.unwrap();
            Region::User(h, v)
        }
    }

    fn handle(&self) -> &MemHandle {
        match self {
            Region::Alloc(h) | Region::User(h, _) => h,
        }
    }

    /// The target's bytes (read while no operation runs).
    fn bytes(&self) -> &[u8] {
        let h = self.handle();
        // SAFETY: the region is mapped and no operation on it is in flight when tests read it.
        unsafe { std::slice::from_raw_parts(h.address as *const u8, h.length) }
    }

    fn fill(&self, b: u8) {
        let h = self.handle();
        // SAFETY: as in `bytes`.
        unsafe { std::ptr::write_bytes(h.address as *mut u8, b, h.length) }
    }

    fn unmap(self, w: &Worker) {
        let h = *self.handle();
        w.mem_unmap(h).unwrap();
        drop(self);
    }
}

const SIZES: [usize; 12] = [0, 1, 8, 100, 101, 4095, 8256, 8257, 65536, 100_000, 1 << 20, 4 << 20];

/// Puts then gets every size at an odd offset, checks the bytes on the target and back.
fn put_get_all_sizes(p: &Pair, alloc: bool) {
    let len = (4 << 20) + 64;
    let region = Region::new(&p.b, len, alloc);
    let key = p.key(region.handle());
    let base = region.handle().address as u64;
    for (i, &n) in SIZES.iter().enumerate() {
        region.fill(0);
        let data = pattern(n, i as u8);
        let at = base + 7;
        // SAFETY: `data` outlives the request (`finish` waits).
        let st = p.finish(unsafe { p.ep.put_nbx(SendData::Contig(&data), at, &key, RequestParam::new()) });
        assert_eq!(st, Status::Ok, "put {n}");
        assert_eq!(p.finish(p.ep.flush_nbx(RequestParam::new())), Status::Ok);
        assert_eq!(&region.bytes()[7..7 + n], &data[..], "put {n} alloc={alloc}");
        assert!(region.bytes()[..7].iter().all(|&b| b == 0) && region.bytes()[7 + n..].iter().all(|&b| b == 0));
        let mut back = vec![0u8; n];
        // SAFETY: `back` outlives the request.
        let st = p.finish(unsafe { p.ep.get_nbx(RecvData::Contig(&mut back), at, &key, RequestParam::new()) });
        assert_eq!(st, Status::Ok, "get {n}");
        assert_eq!(back, data, "get {n} alloc={alloc}");
    }
    // An iov list, both ways.
    let (mut x, mut y) = (pattern(3000, 1), pattern(9000, 2));
    let iov = [IoVec { buffer: x.as_mut_ptr(), length: x.len() }, IoVec { buffer: y.as_mut_ptr(), length: y.len() }];
    // SAFETY: the buffers and the list outlive the request.
    let st = p.finish(unsafe { p.ep.put_nbx(SendData::Iov(&iov), base, &key, RequestParam::new()) });
    {
        assert_eq!(st, Status::Ok);
        p.finish(p.ep.flush_nbx(RequestParam::new()));
        assert_eq!(&region.bytes()[..3000], &x[..]);
        assert_eq!(&region.bytes()[3000..12000], &y[..]);
        let (mut u, mut v) = (vec![0u8; 5000], vec![0u8; 7000]);
        let iov2 =
            [IoVec { buffer: u.as_mut_ptr(), length: u.len() }, IoVec { buffer: v.as_mut_ptr(), length: v.len() }];
        // SAFETY: as above.
        let st = p.finish(unsafe { p.ep.get_nbx(RecvData::Iov(&iov2), base, &key, RequestParam::new()) });
        assert_eq!(st, Status::Ok);
        assert_eq!(&u[..], &region.bytes()[..5000]);
        assert_eq!(&v[..], &region.bytes()[5000..12000]);
    }
    drop(key);
    region.unmap(&p.b);
}

#[test]
fn self_put_get_every_size_both_memory_kinds() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pair::new("self", &[]);
    put_get_all_sizes(&p, true);
    put_get_all_sizes(&p, false);
}

#[test]
fn shm_put_get_every_size_both_memory_kinds() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Without cma, user memory is reached by emulation over active messages.
    for tls in ["posix,cma", "sysv,cma", "posix"] {
        let p = Pair::new(tls, &[]);
        put_get_all_sizes(&p, true);
        put_get_all_sizes(&p, false);
    }
}

/// Every atomic on 32 and 64 bits against the model, on memory the target allocated or its
/// own (over cma: emulated).
fn atomics_match_the_model(p: &Pair, alloc: bool) {
    let region = Region::new(&p.b, 64, alloc);
    let key = p.key(region.handle());
    let base = region.handle().address as u64;
    let values: [u64; 4] = [0, 1, 0xdead_beef_0123_4567, u64::MAX];
    for bits in [32u32, 64] {
        let size = bits as usize / 8;
        for op in AtomicOp::ALL {
            for &v in &values {
                let at = base + 8;
                let old: u64 = 0x5555_aaaa_f0f0_0f0f & if bits == 32 { u32::MAX as u64 } else { u64::MAX };
                region.fill(0);
                // SAFETY: the location is in the mapped region and nothing else accesses it now.
                unsafe { std::ptr::copy_nonoverlapping(old.to_le_bytes().as_ptr(), (at) as *mut u8, size) };
                let operand = if bits == 32 { Operand::U32(v as u32) } else { Operand::U64(v) };
                // Compare with the old value half the time (a swap that happens), else not.
                let compare = if v % 2 == 0 { old } else { !old };
                let r = if op == AtomicOp::Cswap {
                    let c = if bits == 32 { Operand::U32(compare as u32) } else { Operand::U64(compare) };
                    p.run(p.ep.atomic_cswap(c, operand, at, &key))
                } else {
                    p.run(p.ep.atomic(op, operand, at, &key))
                };
                let got = r.unwrap_or_else(|e| panic!("{op:?}/{bits}: {e}"));
                if op.fetches() {
                    let fetched = match got {
                        Operand::U32(x) => x as u64,
                        Operand::U64(x) => x,
                    };
                    assert_eq!(fetched, old, "{op:?}/{bits} fetched");
                }
                p.finish(p.ep.flush_nbx(RequestParam::new()));
                let mut now = [0u8; 8];
                now[..size].copy_from_slice(&region.bytes()[8..8 + size]);
                let want = op.apply(old, v, compare, bits);
                assert_eq!(u64::from_le_bytes(now), want, "{op:?}/{bits} v={v:#x}");
                // The neighbours are untouched.
                assert!(region.bytes()[..8].iter().chain(&region.bytes()[8 + size..]).all(|&b| b == 0));
            }
        }
    }
    drop(key);
    region.unmap(&p.b);
}

#[test]
fn atomics_over_self_and_shared_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for tls in ["self", "posix,cma", "sysv"] {
        let p = Pair::new(tls, &[]);
        atomics_match_the_model(&p, true);
        atomics_match_the_model(&p, false);
    }
}

#[test]
fn raw_atomic_replies_and_cswap_compare_in_the_reply() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pair::new("posix,cma", &[]);
    let region = Region::new(&p.b, 64, true);
    let key = p.key(region.handle());
    let at = region.handle().address as u64;
    let mut reply = 0u64;
    // SAFETY: `reply` outlives the request.
    let st = p.finish(unsafe {
        p.ep.atomic_op_nbx(
            AtomicOp::Fadd,
            Operand::U64(5),
            at,
            &key,
            Some((&mut reply as *mut u64).cast()),
            RequestParam::new(),
        )
    });
    assert_eq!((st, reply), (Status::Ok, 0));
    reply = 5; // compare
               // SAFETY: as above.
    let st = p.finish(unsafe {
        p.ep.atomic_op_nbx(
            AtomicOp::Cswap,
            Operand::U64(9),
            at,
            &key,
            Some((&mut reply as *mut u64).cast()),
            RequestParam::new(),
        )
    });
    assert_eq!((st, reply), (Status::Ok, 5));
    assert_eq!(&region.bytes()[..8], &9u64.to_le_bytes());
    // A fetching operation without a reply buffer, or with a misaligned one, is refused.
    // SAFETY: refused before any access.
    let r = unsafe { p.ep.atomic_op_nbx(AtomicOp::Swap, Operand::U64(1), at, &key, None, RequestParam::new()) };
    assert_eq!(r.err(), Some(Status::InvalidParam));
    let mut b = [0u8; 16];
    // SAFETY: as above.
    let r = unsafe {
        p.ep.atomic_op_nbx(
            AtomicOp::Swap,
            Operand::U64(1),
            at,
            &key,
            Some(b.as_mut_ptr().wrapping_add(1)),
            RequestParam::new(),
        )
    };
    assert_eq!(r.err(), Some(Status::InvalidParam));
    // A misaligned remote location too.
    let r = p.run(p.ep.atomic(AtomicOp::Add, Operand::U64(1), at + 4, &key));
    assert_eq!(r, Err(Status::InvalidParam));
    drop(key);
    region.unmap(&p.b);
}

#[test]
fn accesses_outside_the_region_are_refused_at_the_origin() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for tls in ["self", "posix,cma"] {
        let p = Pair::new(tls, &[]);
        for alloc in [true, false] {
            let region = Region::new(&p.b, 4096, alloc);
            region.fill(0x11);
            let key = p.key(region.handle());
            let base = region.handle().address as u64;
            let data = [0xffu8; 16];
            for at in [base - 1, base + 4096 - 15, base + 4096, u64::MAX - 4] {
                // SAFETY: refused before any access.
                let r = unsafe { p.ep.put_nbx(SendData::Contig(&data), at, &key, RequestParam::new()) };
                assert_eq!(r.err(), Some(Status::OutOfRange), "{tls} put at {:#x}", at.wrapping_sub(base));
                let mut back = [0u8; 16];
                // SAFETY: as above.
                let r = unsafe { p.ep.get_nbx(RecvData::Contig(&mut back), at, &key, RequestParam::new()) };
                assert_eq!(r.err(), Some(Status::OutOfRange));
            }
            let r = p.run(p.ep.atomic(AtomicOp::Fadd, Operand::U64(1), base + 4096, &key));
            assert_eq!(r, Err(Status::OutOfRange));
            assert!(region.bytes().iter().all(|&b| b == 0x11), "nothing was written");
            // The last byte is inside.
            let at = base + 4095;
            // SAFETY: `data` outlives the request.
            let r = unsafe { p.ep.put_nbx(SendData::Contig(&data[..1]), at, &key, RequestParam::new()) };
            assert_eq!(p.finish(r), Status::Ok);
            drop(key);
            region.unmap(&p.b);
        }
    }
}

#[test]
fn bad_remote_keys_and_memory_handles_are_errors() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pair::new("self", &[]);
    let region = Region::new(&p.b, 4096, false);
    let packed = p.b.rkey_pack(region.handle()).unwrap();
    // Every truncation, and a byte flipped in the header.
    for cut in 0..packed.len() {
        assert_eq!(p.ep.rkey_unpack(&packed[..cut]).err(), Some(Status::InvalidParam), "cut at {cut}");
    }
    for i in 0..4 {
        let mut bad = packed.clone();
        bad[i] ^= 0x80;
        assert!(p.ep.rkey_unpack(&bad).is_err(), "byte {i}");
    }
    // Random bytes never panic.
    let mut x = 0x1234_5678u32;
    for n in 0..200 {
        let bytes: Vec<u8> = (0..n % 90)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let _ = p.ep.rkey_unpack(&bytes);
    }
    // A key of memory unmapped since.
    let h = *region.handle();
    region.unmap(&p.b);
    assert!(p.ep.rkey_unpack(&packed).is_err());
    // Unmapped handles: query, pack and unmap say so.
    assert_eq!(p.b.mem_query(&h).err(), Some(Status::InvalidParam));
    assert_eq!(p.b.rkey_pack(&h).err(), Some(Status::InvalidParam));
    assert_eq!(p.b.mem_unmap(h).err(), Some(Status::InvalidParam));
    // Another worker's handle.
    let other = Worker::new(&ctx("self", &[]), &WorkerParams::new("other")).unwrap();
    let h2 = other.mem_map_alloc(64).unwrap();
    assert_eq!(p.b.mem_query(&h2).err(), Some(Status::InvalidParam));
    assert_eq!(other.mem_query(&h2).unwrap().length, 64);
    other.mem_unmap(h2).unwrap();
    // A key of a posix segment that was unmapped: the segment is gone.
    let q = Pair::new("posix", &[]);
    let r = Region::new(&q.b, 4096, true);
    let packed = q.b.rkey_pack(r.handle()).unwrap();
    r.unmap(&q.b);
    assert!(q.ep.rkey_unpack(&packed).is_err());
    // A key packed by another worker than the endpoint's peer.
    let r = Region::new(&q.a, 64, true);
    let packed = q.a.rkey_pack(r.handle()).unwrap();
    assert_eq!(q.ep.rkey_unpack(&packed).err(), Some(Status::InvalidParam));
    r.unmap(&q.a);
}

#[test]
fn rkey_ptr_maps_allocated_shared_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pair::new("posix,cma", &[]);
    let region = Region::new(&p.b, 4096, true);
    let key = p.key(region.handle());
    let base = region.handle().address as u64;
    let ptr = key.ptr(base + 100).unwrap();
    // SAFETY: the mapping is live while `key` is, and nothing else accesses the byte now.
    unsafe { ptr.write(0x42) };
    assert_eq!(region.bytes()[100], 0x42);
    assert_eq!(key.ptr(base + 4096).err(), Some(Status::OutOfRange));
    drop(key);
    region.unmap(&p.b);
    // User memory over shared memory is reached through cma: not mapped here.
    let user = Region::new(&p.b, 4096, false);
    let key = p.key(user.handle());
    assert_eq!(key.ptr(user.handle().address as u64).err(), Some(Status::Unreachable));
    drop(key);
    user.unmap(&p.b);
}

#[test]
fn fence_orders_data_before_flag() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for tls in ["self", "posix,cma"] {
        let p = Pair::new(tls, &[]);
        for alloc in [true, false] {
            let region = Region::new(&p.b, (1 << 20) + 8, alloc);
            let key = p.key(region.handle());
            let base = region.handle().address as u64;
            for round in 1..=20u8 {
                let data = vec![round; 1 << 20];
                let flag = [round; 8];
                // SAFETY: both buffers outlive their requests (waited below).
                let r1 = unsafe { p.ep.put_nbx(SendData::Contig(&data), base + 8, &key, RequestParam::new()) }.unwrap();
                p.a.fence().unwrap();
                // SAFETY: as above.
                let r2 = unsafe { p.ep.put_nbx(SendData::Contig(&flag), base, &key, RequestParam::new()) }.unwrap();
                // Whenever the flag is seen, the data is there.
                p.wait_until(|| {
                    if region.bytes()[0] == round {
                        assert!(region.bytes()[8..].iter().all(|&b| b == round), "flag before data");
                        true
                    } else {
                        false
                    }
                });
                for r in [r1, r2].into_iter().flatten() {
                    p.wait_until(|| r.is_completed());
                }
            }
            drop(key);
            region.unmap(&p.b);
        }
    }
}

#[test]
fn dropped_get_and_fetch_futures_never_write_into_the_callers_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pair::new("posix,cma", &[]);
    let region = Region::new(&p.b, 1 << 20, false);
    let key = p.key(region.handle());
    let base = region.handle().address as u64;
    for _ in 0..50 {
        drop(p.ep.get(vec![0u8; 1 << 20], base, &key));
        drop(p.ep.atomic(AtomicOp::Fadd, Operand::U64(1), base, &key));
    }
    p.a.flush().unwrap();
    // The worker kept the buffers until done, then freed them: nothing leaks or waits.
    p.wait_until(|| p.a.stats().1 == 0);
    drop(key);
    region.unmap(&p.b);
}

#[test]
fn rma_before_wireup_completes_queues_and_goes() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = ctx("posix,cma", &[]);
    let a = Worker::new(&c, &WorkerParams::new("a")).unwrap();
    let b = Worker::new(&c, &WorkerParams::new("b")).unwrap();
    let region = b.mem_map_alloc(4096).unwrap();
    let packed = b.rkey_pack(&region).unwrap();
    let ep = a.ep_create(b.address()).unwrap();
    // The endpoint is not connected yet: the operations queue.
    let key = ep.rkey_unpack(&packed).unwrap();
    let data = pattern(3000, 9);
    // SAFETY: `data` outlives the request.
    let r = unsafe { ep.put_nbx(SendData::Contig(&data), region.address as u64, &key, RequestParam::new()) }.unwrap();
    let f = ep.flush_nbx(RequestParam::new()).unwrap();
    let t0 = std::time::Instant::now();
    while !(r.as_ref().is_none_or(|r| r.is_completed()) && f.as_ref().is_none_or(|f| f.is_completed())) {
        a.progress();
        b.progress();
        assert!(t0.elapsed().as_secs() < 30);
    }
    // SAFETY: mapped, and no operation runs.
    let got = unsafe { std::slice::from_raw_parts(region.address as *const u8, 3000) };
    assert_eq!(got, &data[..]);
    drop((r, f, key));
    b.mem_unmap(region).unwrap();
}

#[test]
fn emulated_operations_on_memory_the_target_unmapped_are_refused_by_the_target() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // posix alone: the target's user memory is reached by emulation only.
    let p = Pair::new("posix", &[]);
    let region = Region::new(&p.b, 4096, false);
    let key = p.key(region.handle());
    let base = region.handle().address as u64;
    // While mapped: a put, flushed, is there.
    let data = pattern(100, 3);
    // SAFETY: `data` outlives the request.
    let r = unsafe { p.ep.put_nbx(SendData::Contig(&data), base, &key, RequestParam::new()) };
    assert_eq!(p.finish(r), Status::Ok);
    assert_eq!(p.finish(p.ep.flush_nbx(RequestParam::new())), Status::Ok);
    assert_eq!(&region.bytes()[..100], &data[..]);
    // The target unmaps it; the origin still has the key.
    region.unmap(&p.b);
    // A put completes locally, and the flush reports the target's refusal.
    // SAFETY: as above.
    let r = unsafe { p.ep.put_nbx(SendData::Contig(&data), base, &key, RequestParam::new()) };
    assert_eq!(p.finish(r), Status::Ok);
    assert_eq!(p.finish(p.ep.flush_nbx(RequestParam::new())), Status::OutOfRange);
    // A get and a fetching atomic fail with the target's refusal.
    let mut back = vec![0u8; 100];
    // SAFETY: `back` outlives the request.
    let r = unsafe { p.ep.get_nbx(RecvData::Contig(&mut back), base, &key, RequestParam::new()) };
    assert_eq!(p.finish(r), Status::OutOfRange);
    let got = p.run(p.ep.atomic(AtomicOp::Fadd, Operand::U64(1), base, &key));
    assert_eq!(got, Err(Status::OutOfRange));
    // A post atomic: refused, reported at the next flush; the flush after that is clean.
    let f = p.ep.atomic(AtomicOp::Add, Operand::U64(1), base, &key);
    assert_eq!(p.run(f), Ok(Operand::U64(1)));
    assert_eq!(p.finish(p.ep.flush_nbx(RequestParam::new())), Status::OutOfRange);
    assert_eq!(p.finish(p.ep.flush_nbx(RequestParam::new())), Status::Ok);
}
