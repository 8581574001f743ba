//! Remote memory access and atomics between two workers (as two processes would be, here in
//! one): `b` maps memory (allocated where `a` can reach it, and a buffer of its own), packs
//! the remote keys; `a` unpacks them on its endpoint, puts, gets, fetch-adds and flushes.
//!
//! `cargo run -p ucp --example rma_two_workers`
//! `UCX_PROTO_INFO=y UCX_TLS=posix cargo run -p ucp --example rma_two_workers` (the user
//! buffer is then reached by emulation over active messages: `b` must progress)

use ucp::{block_on, AtomicOp, Context, ContextParams, Features, Operand, RequestParam, Worker, WorkerParams};

/// Runs `f` to completion, progressing both workers (emulated operations need the target's
/// progress; in two processes each would progress its own).
fn run<F: std::future::Future + Unpin>(a: &Worker, b: &Worker, mut f: F) -> F::Output {
    loop {
        // One poll (`block_on` of a future that is ready at once), then progress both.
        if let std::task::Poll::Ready(v) =
            block_on(std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut f).poll(cx))))
        {
            return v;
        }
        a.progress();
        b.progress();
    }
}

fn main() -> Result<(), ucp::Status> {
    uct_shm::register();
    let features = Features::RMA | Features::AMO64;
    let ctx = Context::new(&ContextParams::new(features))?;
    let a = Worker::new(&ctx, &WorkerParams::new("a"))?;
    let b = Worker::new(&ctx, &WorkerParams::new("b"))?;
    let ep = a.ep_create(b.address())?;

    // b: memory allocated by the worker (a shared segment over shared memory: `a` stores into
    // it directly), and a buffer of its own mapped.
    let shared = b.mem_map_alloc(4096)?;
    let mut own = vec![0u8; 1 << 20];
    // SAFETY: `own` stays alive (and is not read or written by this thread while operations
    // may target it) until it is unmapped below.
    let own_h = unsafe { b.mem_map(own.as_mut_ptr(), own.len())? };
    // The packed keys go to `a` out of band (a socket, a file, MPI...).
    let (k1, k2) = (b.rkey_pack(&shared)?, b.rkey_pack(&own_h)?);
    let shared_key = ep.rkey_unpack(&k1)?;
    let own_key = ep.rkey_unpack(&k2)?;

    // Put into each region, then flush: the data is at the target when the flush completes.
    let (_, r) = run(&a, &b, ep.put(b"hello, shared memory".to_vec(), shared.address as u64, &shared_key));
    r?;
    let data: Vec<u8> = (0..own.len()).map(|i| i as u8).collect();
    let (data, r) = run(&a, &b, ep.put(data, own_h.address as u64, &own_key));
    r?;
    let flush = ep.flush_nbx(RequestParam::new())?;
    if let Some(f) = flush {
        while !f.is_completed() {
            a.progress();
            b.progress();
        }
    }
    println!("b's shared segment: {:?}", String::from_utf8_lossy(&run_view(&shared)[..20]));

    // Get it back.
    let (back, r) = run(&a, &b, ep.get(vec![0u8; data.len()], own_h.address as u64, &own_key));
    r?;
    assert_eq!(back, data);
    println!("got {} bytes back from b's buffer", back.len());

    // A counter at offset 64 of the shared segment: fetch-and-add.
    let at = shared.address as u64 + 64;
    for _ in 0..3 {
        let old = run(&a, &b, ep.atomic(AtomicOp::Fadd, Operand::U64(10), at, &shared_key))?;
        println!("fetch-and-add 10: was {old:?}");
    }
    // Outside the region: refused at the origin.
    let out = run(&a, &b, ep.atomic(AtomicOp::Fadd, Operand::U64(1), shared.address as u64 + 4096, &shared_key));
    println!("fetch-and-add past the region: {out:?}");

    drop((shared_key, own_key));
    b.mem_unmap(shared)?;
    b.mem_unmap(own_h)?;
    drop(own);
    Ok(())
}

/// The bytes of a mapped region (read while no operation targets it).
fn run_view(h: &ucp::MemHandle) -> Vec<u8> {
    // SAFETY: the region is mapped, and the flush completed: nothing writes it now.
    unsafe { std::slice::from_raw_parts(h.address as *const u8, h.length).to_vec() }
}
