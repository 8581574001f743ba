//! The steady state of ucp allocates nothing: after a warm-up, 8-byte tagged sends and
//! receives (eager short, detached and with request handles) and 64 KiB rendezvous transfers
//! between two workers over shared memory make no heap allocation on this thread.
//!
//! A counting global allocator counts the allocations of the thread that enabled it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use ucp::{
    Context, ContextParams, Endpoint, Features, RecvData, RequestParam, SendData, Worker, WorkerParams, FULL_MASK,
};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counting touches only a
// thread-local flag (const-initialized, no allocation) and an atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded; `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counter is one for the process: measuring tests run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Allocations `f` makes on this thread.
fn allocations_of(f: impl FnOnce()) -> usize {
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCS.load(Ordering::Relaxed) - before
}

/// Two workers over posix (AM) and cma (rendezvous) with the rendezvous scheme `scheme`,
/// connected both ways.
fn pair(scheme: &str) -> (Worker, Worker, Endpoint) {
    uct_shm::register();
    let params = ContextParams::new(Features::TAG)
        .with_config("TLS", "posix,cma")
        .with_config("RNDV_THRESH", "16384")
        .with_config("RNDV_SCHEME", scheme);
    let ctx = Context::new(&params).unwrap();
    let a = Worker::new(&ctx, &WorkerParams::new("a")).unwrap();
    let b = Worker::new(&ctx, &WorkerParams::new("b")).unwrap();
    let ab = a.ep_create(b.address()).unwrap();
    let ba = b.ep_create(a.address()).unwrap();
    // Wire up both ways.
    let msg = [1u8; 8];
    let mut back = [0u8; 8];
    for _ in 0..3 {
        exchange_handles(&a, &b, &ab, &msg, &mut back);
    }
    drop(ba);
    (a, b, ab)
}

fn done(status: ucp::Status, _info: ucp::RecvInfo, flag: usize) {
    assert!(!status.is_err(), "{status}");
    // SAFETY: `flag` is the address of a `Cell<bool>` on the stack of `exchange_detached`,
    // which waits for this callback before it returns.
    unsafe { &*(flag as *const Cell<bool>) }.set(true);
}

/// One message `a` -> `b` with detached operations.
fn exchange_detached(a: &Worker, b: &Worker, ab: &Endpoint, msg: &[u8], back: &mut [u8]) {
    let (sent, got) = (Cell::new(false), Cell::new(false));
    let p = |c: &Cell<bool>| RequestParam::new().callback_fn(done, c as *const Cell<bool> as usize);
    // SAFETY: `back` and `msg` outlive the operations: this function waits for both callbacks.
    unsafe {
        if b.tag_recv_nbx_detached(RecvData::Contig(back), 7, FULL_MASK, p(&got)).unwrap().is_some() {
            got.set(true);
        }
        if ab.tag_send_nbx_detached(SendData::Contig(msg), 7, p(&sent)).unwrap() {
            sent.set(true);
        }
    }
    let mut spins = 0u64;
    while !(sent.get() && got.get()) {
        a.progress();
        b.progress();
        spins += 1;
        assert!(spins < 100_000_000, "the exchange did not complete");
    }
}

/// One message `a` -> `b` with request handles.
fn exchange_handles(a: &Worker, b: &Worker, ab: &Endpoint, msg: &[u8], back: &mut [u8]) {
    // SAFETY: `back` and `msg` outlive the requests: both are waited for below.
    let r = unsafe { b.tag_recv_nbx(RecvData::Contig(back), 9, FULL_MASK, RequestParam::new()) }.unwrap();
    // SAFETY: as above.
    let s = unsafe { ab.tag_send_nbx(SendData::Contig(msg), 9, RequestParam::new()) }.unwrap();
    let mut spins = 0u64;
    if let Some(s) = s {
        while !s.is_completed() {
            a.progress();
            b.progress();
            spins += 1;
            assert!(spins < 100_000_000, "the send did not complete");
        }
    }
    let got = match r {
        ucp::RecvResult::Done(i) => i,
        ucp::RecvResult::Pending(r) => {
            while !r.is_completed() {
                a.progress();
                b.progress();
                spins += 1;
                assert!(spins < 100_000_000, "the receive did not complete");
            }
            r.recv_info().unwrap()
        }
    };
    assert_eq!(got.length, msg.len());
}

#[test]
fn the_counter_counts() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(allocations_of(|| drop(std::hint::black_box(Box::new(1u64)))), 1);
    assert_eq!(allocations_of(|| ()), 0);
}

#[test]
fn steady_state_allocates_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for scheme in ["am", "get_zcopy", "put_zcopy"] {
        steady_state(scheme);
    }
}

fn steady_state(scheme: &str) {
    let (a, b, ab) = pair(scheme);
    for (len, what) in [(8usize, "8-byte eager short"), (65536, "64 KiB rendezvous")] {
        let what = format!("{what} ({scheme})");
        let msg: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut back = vec![0u8; len];
        // Warm-up: pools and tables grow to their working size.
        for _ in 0..200 {
            exchange_detached(&a, &b, &ab, &msg, &mut back);
            exchange_handles(&a, &b, &ab, &msg, &mut back);
        }
        let n = allocations_of(|| {
            for _ in 0..1000 {
                exchange_detached(&a, &b, &ab, &msg, &mut back);
            }
        });
        assert_eq!(n, 0, "{what}, detached operations: {n} allocations in 1000 messages");
        let n = allocations_of(|| {
            for _ in 0..1000 {
                exchange_handles(&a, &b, &ab, &msg, &mut back);
            }
        });
        assert_eq!(n, 0, "{what}, request handles: {n} allocations in 1000 messages");
        assert!(back == msg, "{what}: the data");
    }
    let c = b.proto_counts();
    let ran = match scheme {
        "am" => c.rndv_am,
        "get_zcopy" => c.rndv_get,
        _ => c.rndv_put,
    };
    assert!(ran > 0, "no {scheme} rendezvous ran: {c:?}");
    assert!(a.proto_counts().eager_short > 0);
}

/// Waits for an operation's request (if any), progressing both workers.
fn finish(a: &Worker, b: &Worker, r: Result<Option<ucp::Request<'_>>, ucp::Status>) {
    if let Some(r) = r.unwrap() {
        let mut spins = 0u64;
        while !r.is_completed() {
            a.progress();
            b.progress();
            spins += 1;
            assert!(spins < 100_000_000, "the operation did not complete");
        }
        assert_eq!(r.status(), ucp::Status::Ok);
    }
}

#[test]
fn rma_steady_state_allocates_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    uct_shm::register();
    let params = ContextParams::new(Features::RMA | Features::AMO64).with_config("TLS", "posix,cma");
    let ctx = Context::new(&params).unwrap();
    let a = Worker::new(&ctx, &WorkerParams::new("a")).unwrap();
    let b = Worker::new(&ctx, &WorkerParams::new("b")).unwrap();
    let ep = a.ep_create(b.address()).unwrap();
    finish(&a, &b, ep.flush_nbx(RequestParam::new()));
    // Allocated memory (posix stores, CPU atomics) and user memory (cma, emulated atomics).
    let alloc = b.mem_map_alloc(1 << 17).unwrap();
    let mut own = vec![0u8; 1 << 17];
    // SAFETY: `own` outlives the mapping (unmapped below).
    let own_h = unsafe { b.mem_map(own.as_mut_ptr(), own.len()) }.unwrap();
    let keys = [
        ep.rkey_unpack(&b.rkey_pack(&alloc).unwrap()).unwrap(),
        ep.rkey_unpack(&b.rkey_pack(&own_h).unwrap()).unwrap(),
    ];
    let bases = [alloc.address as u64, own_h.address as u64];
    let data: Vec<u8> = (0..65536).map(|i| i as u8).collect();
    let mut back = vec![0u8; 65536];
    let mut reply = 0u64;
    let mut round = |a: &Worker, b: &Worker| {
        for (key, &base) in keys.iter().zip(&bases) {
            for len in [8usize, 65536] {
                // SAFETY: the buffers outlive the requests (`finish` waits).
                finish(a, b, unsafe { ep.put_nbx(SendData::Contig(&data[..len]), base, key, RequestParam::new()) });
                // SAFETY: as above.
                finish(a, b, unsafe { ep.get_nbx(RecvData::Contig(&mut back[..len]), base, key, RequestParam::new()) });
            }
            // SAFETY: as above.
            finish(a, b, unsafe {
                ep.atomic_op_nbx(ucp::AtomicOp::Add, ucp::Operand::U64(1), base + 64, key, None, RequestParam::new())
            });
            // SAFETY: as above.
            finish(a, b, unsafe {
                ep.atomic_op_nbx(
                    ucp::AtomicOp::Fadd,
                    ucp::Operand::U64(1),
                    base + 64,
                    key,
                    Some((&mut reply as *mut u64).cast()),
                    RequestParam::new(),
                )
            });
            finish(a, b, ep.flush_nbx(RequestParam::new()));
        }
    };
    for _ in 0..200 {
        round(&a, &b);
    }
    let n = allocations_of(|| {
        for _ in 0..500 {
            round(&a, &b);
        }
    });
    assert_eq!(n, 0, "puts, gets, atomics and flushes: {n} allocations in 500 rounds");
    assert_eq!(back, data);
    drop(keys);
    b.mem_unmap(alloc).unwrap();
    b.mem_unmap(own_h).unwrap();
}

/// Active messages: after a warm-up, sends of every eager kind (short; bcopy with a header and
/// a reply endpoint; multi-fragment, reassembled on arrival) and their delivery to a handler
/// make no heap allocation.
#[test]
fn am_steady_state_allocates_nothing() {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use ucp::{AmHandlerFlags, AmMsg, AmSendFlags};

    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    uct_shm::register();
    let ctx = Context::new(&ContextParams::new(Features::AM).with_config("TLS", "posix")).unwrap();
    let a = Worker::new(&ctx, &WorkerParams::new("a")).unwrap();
    let b = Worker::new(&ctx, &WorkerParams::new("b")).unwrap();
    let ab = a.ep_create(b.address()).unwrap();
    let arrived = Arc::new(AtomicUsize::new(0));
    let n = arrived.clone();
    b.set_am_recv_handler(
        1,
        Some(move |m: &mut AmMsg<'_>| {
            assert!(m.length() > 0);
            n.fetch_add(1, Ordering::Relaxed);
        }),
        AmHandlerFlags::empty(),
    )
    .unwrap();
    let one = |len: usize, hdr: &[u8], flags: AmSendFlags| {
        let msg = vec![5u8; len];
        let sent = Cell::new(false);
        let before = arrived.load(Ordering::Relaxed);
        let p = RequestParam::new().callback_fn(done, &sent as *const Cell<bool> as usize);
        // SAFETY: `msg` and `hdr` outlive the send: waited for below.
        if unsafe { ab.am_send_nbx_detached(1, hdr, SendData::Contig(&msg), flags, p) }.unwrap() {
            sent.set(true);
        }
        let mut spins = 0u64;
        while !sent.get() || arrived.load(Ordering::Relaxed) == before {
            a.progress();
            b.progress();
            spins += 1;
            assert!(spins < 100_000_000, "the active message did not arrive");
        }
    };
    let kinds: [(usize, &[u8], AmSendFlags, &str); 3] = [
        (8, b"", AmSendFlags::empty(), "8-byte eager short"),
        (8, &[7u8; 16], AmSendFlags::REPLY, "8 bytes with a 16-byte header and a reply endpoint"),
        (20_000, b"", AmSendFlags::empty(), "20,000 bytes in fragments"),
    ];
    for (len, hdr, flags, what) in kinds {
        // The buffer of the message is allocated outside the counted part.
        for _ in 0..200 {
            one(len, hdr, flags);
        }
        let msgs = 1000;
        let mut bufs: Vec<Vec<u8>> = (0..msgs).map(|_| vec![5u8; len]).collect();
        let n = allocations_of(|| {
            for m in bufs.iter_mut() {
                let sent = Cell::new(false);
                let before = arrived.load(Ordering::Relaxed);
                let p = RequestParam::new().callback_fn(done, &sent as *const Cell<bool> as usize);
                // SAFETY: `m` and `hdr` outlive the send: waited for below.
                if unsafe { ab.am_send_nbx_detached(1, hdr, SendData::Contig(m), flags, p) }.unwrap() {
                    sent.set(true);
                }
                while !sent.get() || arrived.load(Ordering::Relaxed) == before {
                    a.progress();
                    b.progress();
                }
            }
        });
        assert_eq!(n, 0, "{what}: {n} allocations in {msgs} messages");
    }
}
