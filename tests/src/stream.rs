//! Stream transfers checked against a model, for the stream peer (`ucp-peer stream`) and the
//! tests that drive it: the stream's byte `i` is [`byte_at`]`(i)`, sends and receives are
//! sized by a seeded generator, and a receiver checks every byte against its position.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ucp::{Endpoint, RecvFuture, SendFuture, StreamRecvFlags, Worker};

/// The stream's byte at position `i`.
pub fn byte_at(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 57) as u8 ^ (i as u8)
}

/// A small deterministic generator.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A size from 1 to `max`, mostly small (99 in 100 up to 64 bytes).
    pub fn size(&mut self, max: u64) -> usize {
        let cap = if self.next_u64() % 100 == 0 { max } else { max.min(64) };
        1 + (self.next_u64() % cap.max(1)) as usize
    }
}

/// Sends `count` pieces sized by `Rng(seed)` (up to `max` bytes) of the stream from position
/// `from`, at most 256 in flight, progressing `w`; the position after the last byte.
pub fn send_pieces(w: &Worker, ep: &Endpoint, from: u64, count: u64, seed: u64, max: u64, limit: Duration) -> u64 {
    let waker = crate::peer::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut rng = Rng(seed);
    let mut pos = from;
    let mut flying: Vec<Pin<Box<SendFuture<Vec<u8>>>>> = Vec::new();
    let t = Instant::now();
    let mut sent = 0;
    while sent < count || !flying.is_empty() {
        while sent < count && flying.len() < 256 {
            let n = rng.size(max) as u64;
            let piece: Vec<u8> = (pos..pos + n).map(byte_at).collect();
            flying.push(Box::pin(ep.stream_send(piece)));
            pos += n;
            sent += 1;
        }
        flying.retain_mut(|f| match f.as_mut().poll(&mut cx) {
            Poll::Ready((_, r)) => {
                r.expect("a stream send failed");
                false
            }
            Poll::Pending => true,
        });
        w.progress();
        assert!(t.elapsed() < limit, "stream sends did not complete");
    }
    pos
}

/// Receives `total` bytes of the stream from position `from` with receives sized by
/// `Rng(seed)` (up to `max` bytes; every third one `WAITALL`, every fifth a zero-copy piece),
/// checking each byte; `Err` names the first wrong one.
pub fn recv_checked(
    w: &Worker,
    ep: &Endpoint,
    from: u64,
    total: u64,
    seed: u64,
    max: u64,
    limit: Duration,
) -> Result<(), String> {
    let waker = crate::peer::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut rng = Rng(seed);
    let (mut pos, end) = (from, from + total);
    let check = |at: u64, bytes: &[u8]| -> Result<(), String> {
        match bytes.iter().enumerate().find(|&(k, &b)| b != byte_at(at + k as u64)) {
            Some((k, &b)) => Err(format!("byte {} is {b}, not {}", at + k as u64, byte_at(at + k as u64))),
            None => Ok(()),
        }
    };
    let t = Instant::now();
    let mut k = 0u64;
    while pos < end {
        k += 1;
        assert!(t.elapsed() < limit, "stream receives did not complete ({} of {total} bytes)", pos - from);
        if k % 5 == 0 {
            if let Some(d) = ep.stream_recv_data_nb().expect("stream_recv_data_nb") {
                if pos + d.len() as u64 > end {
                    return Err(format!("{} bytes more than sent", pos + d.len() as u64 - end));
                }
                check(pos, &d)?;
                pos += d.len() as u64;
                continue;
            }
        }
        let n = (rng.size(max) as u64).min(end - pos) as usize;
        let flags = if k % 3 == 0 { StreamRecvFlags::WAITALL } else { StreamRecvFlags::empty() };
        let mut f: Pin<Box<RecvFuture<Vec<u8>>>> = Box::pin(ep.stream_recv(vec![0u8; n], flags));
        let (buf, r) = loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                break v;
            }
            w.progress();
            assert!(t.elapsed() < limit, "a stream receive did not complete");
        };
        let got = r.map_err(|e| format!("a stream receive failed: {e}"))?.length;
        if got == 0 || got > n || (flags.contains(StreamRecvFlags::WAITALL) && got != n) {
            return Err(format!("a receive of {n} bytes ({flags:?}) got {got}"));
        }
        check(pos, &buf[..got])?;
        pos += got as u64;
    }
    Ok(())
}
