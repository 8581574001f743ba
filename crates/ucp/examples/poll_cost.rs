//! Cost of one idle `Worker::progress` call with posix and cma lanes active.
use ucp::{Context, ContextParams, Features, RecvData, RequestParam, SendData, Worker, WorkerParams, FULL_MASK};

fn main() -> Result<(), ucp::Status> {
    uct_shm::register();
    let ctx = Context::new(&ContextParams::new(Features::TAG).with_config("TLS", "posix,cma"))?;
    let a = Worker::new(&ctx, &WorkerParams::new("a"))?;
    let b = Worker::new(&ctx, &WorkerParams::new("b"))?;
    let ep = a.ep_create(b.address())?;
    let back = b.ep_create(a.address())?;
    let big: Vec<u8> = vec![7u8; 1 << 20];
    let mut into = vec![0u8; 1 << 20];
    for (from, to, e) in [(&a, &b, &ep), (&b, &a, &back)] {
        // SAFETY: buffers outlive the requests.
        let r = unsafe { to.tag_recv_nbx(RecvData::Contig(&mut into), 1, FULL_MASK, RequestParam::new())? };
        // SAFETY: as above.
        let s = unsafe { e.tag_send_nbx(SendData::Contig(&big), 1, RequestParam::new())? };
        if let ucp::RecvResult::Pending(r) = r {
            while !r.is_completed() {
                from.progress();
                to.progress();
            }
        }
        while s.as_ref().is_some_and(|s| !s.is_completed()) {
            from.progress();
            to.progress();
        }
    }
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20_000_000);
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let mut ev = 0;
        for _ in 0..n {
            ev += a.progress();
        }
        let dt = t.elapsed();
        println!("{:.2} ns per idle progress ({ev} events)", dt.as_nanos() as f64 / n as f64);
    }
    Ok(())
}
