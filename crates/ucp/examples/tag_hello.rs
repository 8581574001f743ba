//! Context, worker, an endpoint to the same worker, and tagged messages three ways:
//! blocking, raw requests, and futures over owned buffers.
//!
//! `cargo run -p ucp --example tag_hello`

use ucp::{
    block_on, CloseMode, Context, ContextParams, Features, RecvData, RecvResult, RequestParam, Worker, WorkerParams,
    FULL_MASK,
};

fn main() -> Result<(), ucp::Status> {
    uct_shm::register();
    // Context: features and configuration (`UCX_*` from the environment, overrides here).
    let ctx = Context::new(&ContextParams::new(Features::TAG).with_config("TLS", "self"))?;
    // Worker: one interface per selected transport, and an address for peers.
    let worker = Worker::new(&ctx, &WorkerParams::new("hello"))?;
    // Endpoint: here to the worker itself (the `self` transport).
    let ep = worker.ep_create(worker.address())?;
    println!("lanes: {:?}", ep.query()?.lanes);

    // 1. Blocking send, raw receive with a request.
    let mut buf = [0u8; 64];
    // SAFETY: `buf` is neither moved nor read until the request completed (`wait`).
    let recv = unsafe { worker.tag_recv_nbx(RecvData::Contig(&mut buf), 7, FULL_MASK, RequestParam::new())? };
    ep.tag_send_blocking(b"hello, tag 7", 7)?;
    let info = recv.wait()?;
    println!("got {:?} (tag {})", std::str::from_utf8(&buf[..info.length]).unwrap(), info.sender_tag);

    // 2. Callbacks: the receive completes later, and its callback runs from progress.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut buf2 = vec![0u8; 64];
    // SAFETY: as above; we wait for the callback before touching `buf2`.
    let r = unsafe {
        worker.tag_recv_nbx(
            RecvData::Contig(&mut buf2),
            0x100,
            0xff00, // a mask: any tag 0x1XX
            RequestParam::new().callback(move |status, info| tx.send((status, info)).unwrap()),
        )?
    };
    assert!(matches!(r, RecvResult::Pending(_)));
    ep.tag_send_blocking(b"masked", 0x1ab)?;
    let (status, info) = loop {
        worker.progress();
        if let Ok(x) = rx.try_recv() {
            break x;
        }
    };
    println!("callback: {status}, {} bytes with tag {:#x}", info.length, info.sender_tag);

    // 3. Futures own their buffers: no unsafe, and dropping one cancels it safely.
    let (data, res) = block_on(async {
        let (_, sent) = ep.tag_send(b"over a future".to_vec(), 9).await;
        sent?;
        Ok::<_, ucp::Status>(worker.tag_recv(vec![0u8; 64], 9, FULL_MASK).await)
    })?;
    let info = res?;
    println!("future: {:?}", std::str::from_utf8(&data[..info.length]).unwrap());

    ep.close(CloseMode::Flush)
}
