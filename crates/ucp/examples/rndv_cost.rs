//! Software cost of one rendezvous message between two workers of one process, driven from one
//! thread (no peer to wait for): `cargo run --release -p ucp --example rndv_cost -- [size] [n]`.
use ucp::{Context, ContextParams, Features, RecvData, RequestParam, SendData, Worker, WorkerParams, FULL_MASK};

thread_local! {
    static LEFT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Completion callback, as `ucx_perftest` and `ucx-perf` use: counts down.
fn done(status: ucp::Status, _info: ucp::RecvInfo, _user_data: usize) {
    assert_eq!(status, ucp::Status::Ok);
    LEFT.with(|l| l.set(l.get() - 1));
}

fn one(a: &Worker, b: &Worker, ep: &ucp::Endpoint, src: &[u8], dst: &mut [u8]) -> Result<(), ucp::Status> {
    LEFT.with(|l| l.set(2));
    let param = || RequestParam::new().callback_fn(done, 0);
    // SAFETY: both buffers outlive the requests: this function waits for both.
    match unsafe { b.tag_recv_nbx(RecvData::Contig(dst), 1, FULL_MASK, param())? } {
        ucp::RecvResult::Done(_) => LEFT.with(|l| l.set(l.get() - 1)),
        ucp::RecvResult::Pending(r) => drop(r),
    }
    // SAFETY: as above.
    match unsafe { ep.tag_send_nbx(SendData::Contig(src), 1, param())? } {
        None => LEFT.with(|l| l.set(l.get() - 1)),
        Some(r) => drop(r),
    }
    while LEFT.with(|l| l.get()) > 0 {
        a.progress();
        b.progress();
    }
    Ok(())
}

fn main() -> Result<(), ucp::Status> {
    uct_shm::register();
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(65536);
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let ctx = Context::new(&ContextParams::new(Features::TAG).with_config("TLS", "posix,cma"))?;
    let a = Worker::new(&ctx, &WorkerParams::new("a"))?;
    let b = Worker::new(&ctx, &WorkerParams::new("b"))?;
    let ep = a.ep_create(b.address())?;
    let src = vec![7u8; size];
    let mut dst = vec![0u8; size];
    for _ in 0..1000 {
        one(&a, &b, &ep, &src, &mut dst)?;
    }
    for _ in 0..3 {
        let t = std::time::Instant::now();
        for _ in 0..n {
            one(&a, &b, &ep, &src, &mut dst)?;
        }
        println!("{:.1} ns per {size}-byte message", t.elapsed().as_nanos() as f64 / n as f64);
    }
    Ok(())
}
