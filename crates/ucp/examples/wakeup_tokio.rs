//! Two workers in one process exchange tagged messages under tokio, without busy polling:
//! a task per worker sleeps on the worker's event descriptor and progresses it when it becomes
//! readable; the send and receive futures are woken by their completions.
//!
//! `cargo run -p ucp --example wakeup_tokio`

use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use ucp::{Context, ContextParams, Features, Status, Worker, WorkerParams, FULL_MASK};

/// Progresses `w` whenever its descriptor says there is something to do; never returns.
async fn drive(w: Worker) -> Result<(), Status> {
    // SAFETY: the event source keeps the worker, and so its descriptor, open while registered.
    let fd = unsafe { AsyncFd::register_with_interest(w.event_source()?, Interest::READABLE) }
        .map_err(|_| Status::IoError)?;
    loop {
        while w.progress() > 0 {}
        match w.arm() {
            // Armed: nothing to do until the descriptor becomes readable.
            Ok(()) => fd.readable().await.map_err(|_| Status::IoError)?.clear_ready(),
            // Events arrived meanwhile: progress again, letting other tasks run first.
            Err(Status::Busy) => tokio::task::yield_now().await,
            Err(e) => return Err(e),
        }
    }
}

fn main() -> Result<(), Status> {
    uct_shm::register();
    let ctx = Context::new(&ContextParams::new(Features::TAG | Features::WAKEUP).with_config("TLS", "posix,cma"))?;
    let a = Worker::new(&ctx, &WorkerParams::new("a"))?;
    let b = Worker::new(&ctx, &WorkerParams::new("b"))?;
    let ep = a.ep_create(b.address())?;

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|_| Status::IoError)?;
    rt.block_on(async {
        // While the drivers exist, the futures leave progress to the drive tasks.
        let (_da, _db) = (a.progress_driver(), b.progress_driver());
        let drivers = async { tokio::try_join!(drive(a.clone()), drive(b.clone())).map(|_| ()) };
        let work = async {
            for (i, n) in [5usize, 40_000, 1 << 20].into_iter().enumerate() {
                let tag = 100 + i as u64;
                let recv = b.tag_recv(vec![0u8; n], tag, FULL_MASK);
                tokio::time::sleep(Duration::from_millis(20)).await;
                let (_, sent) = ep.tag_send(vec![i as u8; n], tag).await;
                sent?;
                let (buf, info) = recv.await;
                let info = info?;
                assert!(buf.iter().all(|&x| x == i as u8));
                println!("received {} bytes with tag {:#x}", info.length, info.sender_tag);
            }
            Ok::<(), Status>(())
        };
        tokio::select! {
            r = drivers => r,
            r = work => r,
        }
    })?;
    ep.close(ucp::CloseMode::Flush)
}
