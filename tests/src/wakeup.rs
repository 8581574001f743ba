//! Sending and receiving while sleeping in `Worker::wait`: what the wakeup test and its echoing
//! peer share.

use std::time::{Duration, Instant};

use ucp::{Endpoint, RecvData, RecvResult, RequestParam, SendData, Status, Worker, FULL_MASK};

/// Bound on every wait.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// Tag of the messages to the echoing peer.
pub const PING: u64 = 1;
/// Tag of its answers.
pub const PONG: u64 = 2;
/// Sizes that take eager short, eager bcopy, multi-fragment eager and rendezvous.
pub const SIZES: [usize; 5] = [8, 3000, 20_000, 300_000, 1 << 20];

/// Progresses until `done`, sleeping in `wait` whenever progress finds nothing; returns how
/// many times it slept (or found events pending at arm time).
pub fn wait_until(w: &Worker, mut done: impl FnMut() -> bool) -> u64 {
    let t = Instant::now();
    let mut sleeps = 0;
    loop {
        while w.progress() > 0 {}
        if done() {
            return sleeps;
        }
        assert!(t.elapsed() < TIMEOUT, "nothing completed in {TIMEOUT:?}");
        // Every wait here ends with an event: running out means a wakeup was lost.
        assert!(w.wait_timeout(Some(TIMEOUT)).unwrap(), "slept {TIMEOUT:?} through an event");
        sleeps += 1;
    }
}

/// Receives one message of up to 1 MiB with `tag`, sleeping while it waits.
pub fn recv_sleeping(w: &Worker, tag: u64, sleeps: &mut u64) -> Vec<u8> {
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: `buf` outlives the request, which is waited for below.
    let r = unsafe { w.tag_recv_nbx(RecvData::Contig(&mut buf), tag, FULL_MASK, RequestParam::new()) }.unwrap();
    let len = match r {
        RecvResult::Done(info) => info.length,
        RecvResult::Pending(req) => {
            *sleeps += wait_until(w, || req.is_completed());
            assert_eq!(req.status(), Status::Ok);
            req.recv_info().unwrap().length
        }
    };
    buf.truncate(len);
    buf
}

/// Sends `data` with `tag`, sleeping until the send completed.
pub fn send_sleeping(ep: &Endpoint, data: &[u8], tag: u64, sleeps: &mut u64) {
    // SAFETY: `data` outlives the request, which is waited for below.
    let r = unsafe { ep.tag_send_nbx(SendData::Contig(data), tag, RequestParam::new()) }.unwrap();
    if let Some(req) = r {
        *sleeps += wait_until(ep.worker(), || req.is_completed());
        assert_eq!(req.status(), Status::Ok);
    }
}
