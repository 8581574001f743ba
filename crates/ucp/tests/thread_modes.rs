//! Thread modes: a single-threaded worker refuses other threads; a multi-threaded one is used
//! from several threads at once (sends from two threads, receives and progress from a third).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ucp::{block_on, Context, ContextParams, Features, Status, ThreadMode, Worker, WorkerParams, FULL_MASK};

/// Busy-polling tests of this file run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn worker(mode: ThreadMode) -> Worker {
    uct_shm::register();
    let ctx = Context::new(&ContextParams::new(Features::TAG).with_config("TLS", "self")).unwrap();
    Worker::new(&ctx, &WorkerParams::new("t").thread_mode(mode)).unwrap()
}

/// The handles are `Send + Sync` whatever the thread mode (the mode decides at run time who
/// may enter: a single-threaded worker refuses other threads, below); the futures over owned
/// buffers are `Send`, so a multi-threaded executor may move them.
#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Worker>();
    send_sync::<ucp::Endpoint>();
    send_sync::<Context>();
    send_sync::<ucp::EventSource>();
    send_sync::<ucp::ProgressDriver>();
    send::<ucp::RecvFuture<Vec<u8>>>();
    send::<ucp::SendFuture<Vec<u8>>>();
    send::<ucp::RequestParam>();
    send_sync::<ucp::RemoteKey>();
    send_sync::<ucp::MemHandle>();
    send::<ucp::AmoFuture>();
}

#[test]
fn single_mode_refuses_other_threads() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = worker(ThreadMode::Single);
    let ep = w.ep_create(w.address()).unwrap();
    ep.tag_send_blocking(b"x", 1).unwrap();
    let w2 = w.clone();
    let r = std::thread::spawn(move || w2.ep_create(w2.address()).map(|_| ())).join().unwrap();
    assert_eq!(r.unwrap_err(), Status::InvalidParam);
    // Still usable from its own thread.
    let (_, r) = block_on(w.tag_recv(vec![0u8; 4], 1, FULL_MASK));
    assert_eq!(r.unwrap().length, 1);
}

#[test]
fn multi_mode_from_several_threads() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for mode in [ThreadMode::Multi, ThreadMode::Serialized] {
        let w = worker(mode);
        let ep = Arc::new(w.ep_create(w.address()).unwrap());
        const PER: u64 = 2000;
        let senders: Vec<_> = (0..2u64)
            .map(|k| {
                let ep = ep.clone();
                std::thread::spawn(move || {
                    for i in 0..PER {
                        let tag = (k << 32) | i;
                        let len = [0usize, 8, 3000, 20_000][(i % 4) as usize];
                        let (_, r) = block_on(ep.tag_send(vec![k as u8; len], tag));
                        r.unwrap();
                    }
                })
            })
            .collect();
        let mut next = [0u64; 2];
        let t = Instant::now();
        for _ in 0..2 * PER {
            let (buf, r) = block_on(w.tag_recv(vec![0u8; 32 * 1024], 0, 0));
            let info = r.unwrap();
            let (k, i) = ((info.sender_tag >> 32) as usize, info.sender_tag & 0xffff_ffff);
            assert_eq!(i, next[k], "sender {k} overtaken");
            next[k] += 1;
            assert!(buf[..info.length].iter().all(|&b| b == k as u8));
            assert!(t.elapsed() < Duration::from_secs(60));
        }
        for s in senders {
            s.join().unwrap();
        }
        assert_eq!(w.stats().2, 0);
    }
}
