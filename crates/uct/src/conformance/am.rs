//! Active message checks.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use ucs::{Outcome, Status};

use super::peer::Listen;
use super::setup::{pattern, Options, Pair};
use super::Verdict;
use crate::{AmRecv, Ep, IfaceFlags, Iov, MemAccess, PendingOutcome, PendingReq, SendFlags, AM_ID_MAX};
use std::rc::Weak;

const AM_ID: u8 = 5;

/// Makes the receiver collect the messages of `id`; returns `id`.
fn collecting_handler(pair: &Pair, id: u8) -> u8 {
    pair.rx.listen(id, Listen::default()).unwrap_or_else(|e| panic!("receiver: set_am_handler({id}): {e}"));
    id
}

fn open(opts: &Options, scarce: bool, n: usize) -> Pair {
    Pair::open(opts, scarce, n).unwrap_or_else(|e| panic!("{}: cannot open a connected pair: {e}", opts.resource))
}

/// Waits for exactly one message on `id` (anything else on its way must not be there).
fn expect_one(pair: &Pair, id: u8, what: &str) -> Vec<u8> {
    pair.collect_as(what, id, 1).pop().unwrap_or_default()
}

/// Active messages at sizes 0, 1 and the largest short/bcopy size arrive intact; one byte over
/// the limit is rejected with an error.
pub fn am_sizes(opts: &Options) -> Verdict {
    let pair = open(opts, false, 1);
    let attr = pair.sender().attr().clone();
    if !attr.flags.intersects(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY) {
        return Verdict::Skipped("no AM_SHORT/AM_BCOPY".into());
    }
    let inbox = collecting_handler(&pair, AM_ID);
    let ep = &pair.eps[0];
    if attr.flags.contains(IfaceFlags::AM_SHORT) {
        let max_payload = attr.am.max_short.checked_sub(8).expect("am.max_short must cover the 8-byte header");
        for (i, len) in [0, 1, max_payload].into_iter().enumerate() {
            let header = 0xC0FF_EE00_0000_0000u64 | i as u64;
            let payload = pattern(i as u64, len);
            let r = pair.retry("am_short", || ep.am_short(AM_ID, header, &payload));
            assert_eq!(r, Ok(Outcome::Done(())), "am_short of {len} payload bytes");
            let got = expect_one(&pair, inbox, "am_short delivery");
            assert_eq!(got.len(), len + 8, "am_short length");
            assert_eq!(got[..8], header.to_ne_bytes(), "am_short header");
            assert_eq!(got[8..], payload[..], "am_short payload of {len} bytes");
        }
        let over = pattern(99, max_payload + 1);
        let r = ep.am_short(AM_ID, 0, &over);
        assert_eq!(r, Err(Status::InvalidParam), "am_short one byte over max_short");
        // The highest valid id works; short iov gathers its parts in order.
        let inbox31 = collecting_handler(&pair, AM_ID_MAX - 1);
        let parts: [&[u8]; 3] = [b"head", b"", b"-tail"];
        let r = pair.retry("am_short to id 31", || ep.am_short(AM_ID_MAX - 1, 31, b"x"));
        assert_eq!(r, Ok(Outcome::Done(())), "am_short to the last valid id");
        assert_eq!(expect_one(&pair, inbox31, "id 31 delivery")[8..], *b"x");
        match ep.am_short_iov(AM_ID, &parts) {
            Err(Status::Unsupported) => {}
            r => {
                let r = if r == Ok(Outcome::NoResource) {
                    pair.retry("am_short_iov", || ep.am_short_iov(AM_ID, &parts))
                } else {
                    r
                };
                assert_eq!(r, Ok(Outcome::Done(())), "am_short_iov");
                assert_eq!(expect_one(&pair, inbox, "am_short_iov delivery"), b"head-tail");
            }
        }
        let big = vec![0u8; attr.am.max_short];
        assert_eq!(
            ep.am_short_iov(AM_ID, &[&big, b"x"]).err().map(|e| e == Status::InvalidParam || e == Status::Unsupported),
            Some(true),
            "am_short_iov over max_short"
        );
        pair.worker.progress();
        assert!(pair.rx.take(inbox).is_empty(), "a rejected am_short was delivered");
    }
    if attr.flags.contains(IfaceFlags::AM_BCOPY) {
        for (i, len) in [0usize, 1, attr.am.max_bcopy].into_iter().enumerate() {
            let data = pattern(100 + i as u64, len);
            let r = pair.retry("am_bcopy", || {
                ep.am_bcopy(
                    AM_ID,
                    &mut |buf: &mut [u8]| {
                        assert!(buf.len() >= len, "bcopy buffer {} shorter than max_bcopy {len}", buf.len());
                        buf[..len].copy_from_slice(&data);
                        len
                    },
                    SendFlags::empty(),
                )
            });
            assert_eq!(r, Ok(Outcome::Done(len)), "am_bcopy of {len} bytes");
            let got = expect_one(&pair, inbox, "am_bcopy delivery");
            assert_eq!(got, data, "am_bcopy payload of {len} bytes");
        }
        let r = ep.am_bcopy(AM_ID, &mut |buf: &mut [u8]| buf.len() + 1, SendFlags::empty());
        assert_eq!(r, Err(Status::InvalidParam), "am_bcopy packing more than its buffer");
        pair.worker.progress();
        assert!(pair.rx.take(inbox).is_empty(), "a rejected am_bcopy was delivered");
    }
    Verdict::Passed
}

/// Invalid AM ids are rejected with `InvalidParam`, at send and at handler registration.
pub fn am_invalid(opts: &Options) -> Verdict {
    let pair = open(opts, false, 1);
    let attr = pair.sender().attr().clone();
    let ep = &pair.eps[0];
    assert_eq!(pair.rx.unlisten(32), Err(Status::InvalidParam), "set_am_handler(32)");
    assert_eq!(pair.rx.unlisten(255), Err(Status::InvalidParam), "set_am_handler(255)");
    assert_eq!(pair.sender.set_am_handler(32, None), Err(Status::InvalidParam), "set_am_handler(32)");
    let mut ran = false;
    if attr.flags.contains(IfaceFlags::AM_SHORT) {
        for id in [32u8, 200, 255] {
            assert_eq!(ep.am_short(id, 0, b"x"), Err(Status::InvalidParam), "am_short with id {id}");
        }
        ran = true;
    }
    if attr.flags.contains(IfaceFlags::AM_BCOPY) {
        let r = ep.am_bcopy(32, &mut |_: &mut [u8]| 0, SendFlags::empty());
        assert_eq!(r, Err(Status::InvalidParam), "am_bcopy with id 32");
        ran = true;
    }
    if ran {
        Verdict::Passed
    } else {
        Verdict::Skipped("no AM_SHORT/AM_BCOPY".into())
    }
}

/// A handler keeps descriptors and releases them later; kept data stays intact while more
/// messages flow.
pub fn am_keep_desc(opts: &Options) -> Verdict {
    let pair = open(opts, false, 1);
    let attr = pair.sender().attr().clone();
    if !attr.flags.intersects(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY) {
        return Verdict::Skipped("no AM_SHORT/AM_BCOPY".into());
    }
    pair.rx.listen(AM_ID, Listen { keep_first: 8, reply: None }).unwrap();
    let ep = &pair.eps[0];
    let len = if attr.flags.contains(IfaceFlags::AM_BCOPY) { attr.am.max_bcopy.min(256) } else { 0 };
    let send = |seq: u64| {
        let data = pattern(seq, len);
        let r = if attr.flags.contains(IfaceFlags::AM_BCOPY) {
            pair.retry("am_bcopy", || {
                ep.am_bcopy(
                    AM_ID,
                    &mut |b: &mut [u8]| {
                        b[..8].copy_from_slice(&seq.to_ne_bytes());
                        b[8..len].copy_from_slice(&data[8..]);
                        len
                    },
                    SendFlags::empty(),
                )
            })
            .map(|o| o.map(|_| ()))
        } else {
            pair.retry("am_short", || ep.am_short(AM_ID, seq, &[]))
        };
        assert_eq!(r, Ok(Outcome::Done(())), "send {seq}");
    };
    for seq in 0..64u64 {
        send(seq);
    }
    pair.wait("64 messages", || pair.rx.count(AM_ID) == 64);
    let check = |kept: &[Vec<u8>]| {
        for (seq, d) in kept.iter().enumerate() {
            assert_eq!(d[..8], (seq as u64).to_ne_bytes(), "kept descriptor {seq} was overwritten");
            if len > 8 {
                assert_eq!(d[8..], pattern(seq as u64, len)[8..], "kept descriptor {seq} payload changed");
            }
        }
    };
    let kept = pair.rx.kept();
    assert_eq!(kept.len(), 8);
    check(&kept);
    pair.rx.release_kept(4); // release half
    for seq in 64..128u64 {
        send(seq);
    }
    pair.wait("128 messages", || pair.rx.count(AM_ID) == 128);
    let kept = pair.rx.kept();
    assert_eq!(kept.len(), 4, "released descriptors still listed");
    check(&kept);
    // Descriptors may outlive the interface that lent them.
    let rx = pair.rx.clone();
    drop(pair);
    rx.close();
    check(&rx.kept());
    rx.release_kept(0);
    Verdict::Passed
}

/// A handler that sends: each message on id A makes the handler send a reply on id B through
/// an endpoint back to the sender, which must arrive.
pub fn am_reentrant(opts: &Options) -> Verdict {
    let pair = open(opts, false, 1);
    let attr = pair.sender().attr().clone();
    if !attr.flags.contains(IfaceFlags::AM_SHORT) {
        return Verdict::Skipped("no AM_SHORT".into());
    }
    pair.enable_replies().unwrap_or_else(|e| panic!("cannot create a reply endpoint: {e}"));
    let replies: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let r2 = replies.clone();
    // Replies arrive at the sender's interface (the receiver itself for loopback transports).
    let reply_iface = pair.sender();
    reply_iface.set_am_handler(7, Some(Rc::new(move |m: AmRecv<'_>| r2.borrow_mut().push(m.data().to_vec())))).unwrap();
    pair.rx.listen(AM_ID, Listen { keep_first: 0, reply: Some(7) }).unwrap();
    for seq in 0..32u64 {
        let r = pair.retry("am_short", || pair.eps[0].am_short(AM_ID, seq, &[]));
        assert_eq!(r, Ok(Outcome::Done(())));
        pair.wait("reply", || (replies.borrow().len() + pair.rx.reply_failures()) as u64 > seq);
    }
    let got = replies.borrow();
    assert!(got.len() >= 16, "only {} of 32 replies sent from handlers arrived", got.len());
    let mut last = None;
    for (i, r) in got.iter().enumerate() {
        let h = u64::from_ne_bytes(r[..8].try_into().expect("8-byte header"));
        assert!((1000..1032).contains(&h) && last < Some(h), "reply {i}: header {h} out of order");
        last = Some(h);
        assert_eq!(r[8..], *b"reply", "reply {i} payload");
    }
    reply_iface.set_am_handler(7, None).unwrap();
    pair.rx.unlisten(AM_ID).unwrap();
    Verdict::Passed
}

/// A zero-copy active message gathering several iov entries arrives intact.
pub fn am_zcopy_iov(opts: &Options) -> Verdict {
    let pair = open(opts, false, 1);
    let attr = pair.sender().attr().clone();
    if !attr.flags.contains(IfaceFlags::AM_ZCOPY) {
        return Verdict::Skipped("no AM_ZCOPY".into());
    }
    let inbox = collecting_handler(&pair, AM_ID);
    let n_iov = attr.am.max_iov.clamp(1, 4);
    let each = (attr.am.max_zcopy / n_iov).clamp(1, 1024);
    let mut bufs: Vec<Vec<u8>> = (0..n_iov).map(|i| pattern(500 + i as u64, each)).collect();
    let memhs: Vec<_> = bufs
        .iter_mut()
        // SAFETY: the buffers outlive the registrations (dropped at the end of this function,
        // after the operation completed).
        .map(|b| unsafe { pair.md.mem_reg(b.as_mut_ptr(), b.len(), MemAccess::ALL) }.ok())
        .collect();
    let iov: Vec<Iov<'_>> =
        bufs.iter_mut().zip(&memhs).map(|(b, m)| Iov::new(b.as_mut_ptr(), b.len(), m.as_ref())).collect();
    let header = pattern(7, attr.am.max_hdr.min(8));
    let comp = crate::Completion::counter(1);
    // SAFETY: buffers stay alive and untouched until the completion fires (waited below).
    let r = pair
        .retry("am_zcopy", || unsafe { pair.eps[0].am_zcopy(AM_ID, &header, &iov, SendFlags::empty(), Some(&comp)) });
    match r {
        Ok(Outcome::Done(())) => {}
        Ok(Outcome::InProgress) => pair.wait("am_zcopy completion", || comp.count() == 0),
        other => panic!("am_zcopy failed: {other:?}"),
    }
    assert_eq!(comp.status(), Status::Ok);
    let got = expect_one(&pair, inbox, "am_zcopy delivery");
    let mut expect = header.clone();
    bufs.iter().for_each(|b| expect.extend_from_slice(b));
    assert_eq!(got, expect, "am_zcopy data ({n_iov} iov entries)");
    Verdict::Passed
}

/// A sender that queues itself as a pending request after `NoResource`.
struct Sender {
    ep_index: u64,
    ep: Weak<dyn Ep>,
    next: Cell<u64>,
    total: u64,
    short: bool,
    /// The endpoints whose pending requests sent, in the order they did (shared).
    dispatched: Rc<RefCell<Vec<u64>>>,
}

impl Sender {
    /// Sends the next message; `Ok(true)` when sent, `Ok(false)` on NoResource.
    fn send_one(&self) -> Result<bool, Status> {
        let ep = self.ep.upgrade().expect("pending request called after its endpoint was destroyed");
        let seq = self.next.get();
        let header = self.ep_index << 32 | seq;
        let r = if self.short {
            ep.am_short(AM_ID, header, &[])
        } else {
            ep.am_bcopy(
                AM_ID,
                &mut |b: &mut [u8]| {
                    b[..8].copy_from_slice(&header.to_ne_bytes());
                    8
                },
                SendFlags::empty(),
            )
            .map(|o| o.map(|_| ()))
        };
        match r? {
            Outcome::Done(()) => {
                self.next.set(seq + 1);
                Ok(true)
            }
            Outcome::NoResource => Ok(false),
            Outcome::InProgress => panic!("short/bcopy returned InProgress"),
        }
    }

    fn finished(&self) -> bool {
        self.next.get() == self.total
    }
}

impl PendingReq for Sender {
    fn progress(&self) -> PendingOutcome {
        let r = self.send_one();
        if r == Ok(true) {
            self.dispatched.borrow_mut().push(self.ep_index);
        }
        match r {
            Ok(true) if self.finished() => PendingOutcome::Done,
            Ok(true) => PendingOutcome::KeepContinue,
            Ok(false) => PendingOutcome::KeepStop,
            Err(e) => panic!("send from pending callback failed: {e}"),
        }
    }
}

/// With send resources exhausted, messages queued as pending requests on several endpoints are
/// all delivered exactly once and in order per endpoint, and endpoints are served fairly.
pub fn pending_fairness(opts: &Options) -> Verdict {
    const EPS: usize = 4;
    const PER_EP: u64 = 200;
    let pair = open(opts, true, EPS);
    let attr = pair.sender().attr().clone();
    if !attr.flags.contains(IfaceFlags::PENDING) {
        return Verdict::Skipped("no PENDING".into());
    }
    if !attr.flags.intersects(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY) {
        return Verdict::Skipped("no AM_SHORT/AM_BCOPY".into());
    }
    // While held, the receiver keeps every message, so transports whose send resources are the
    // receiver's buffers run out; transports with a FIFO run out because nothing progresses (a
    // receiver in another process stops progressing while held).
    pair.rx.listen(AM_ID, Listen::default()).unwrap();
    pair.rx.hold(true);
    let order: RefCell<Vec<u64>> = RefCell::default();
    let collect = || {
        let msgs = pair.rx.take(AM_ID);
        let mut o = order.borrow_mut();
        for m in msgs {
            o.push(u64::from_ne_bytes(m[..8].try_into().expect("8-byte header")));
        }
        o.len()
    };
    let short = attr.flags.contains(IfaceFlags::AM_SHORT);
    let dispatched: Rc<RefCell<Vec<u64>>> = Rc::default();
    let senders: Vec<Rc<Sender>> = pair
        .eps
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            Rc::new(Sender {
                ep_index: i as u64,
                ep: Rc::downgrade(ep),
                next: Cell::new(0),
                total: PER_EP,
                short,
                dispatched: dispatched.clone(),
            })
        })
        .collect();
    // Phase 1: send round robin without progress until every endpoint is queued as pending.
    let mut queued = [false; EPS];
    let mut sends = 0u64;
    while queued.iter().any(|q| !q) {
        for (i, s) in senders.iter().enumerate() {
            if queued[i] {
                continue;
            }
            assert!(
                !s.finished(),
                "PENDING is advertised but {sends} sends never returned NoResource: give Options::scarce_config \
                 overrides that limit send resources (now {:?})",
                opts.scarce_config
            );
            match s.send_one() {
                Ok(true) => sends += 1,
                Ok(false) => match pair.eps[i].pending_add(s.clone()) {
                    Ok(()) => queued[i] = true,
                    Err(Status::Busy) => {}
                    Err(e) => panic!("pending_add failed: {e}"),
                },
                Err(e) => panic!("send failed: {e}"),
            }
        }
    }
    // Progress while still exhausted must neither lose nor stall requests.
    for _ in 0..64 {
        pair.worker.progress();
    }
    // While requests are queued on an endpoint, a direct send on it must not overtake them.
    let n_kept = pair.rx.kept().len();
    pair.rx.release_kept(n_kept.saturating_sub(1));
    for (i, s) in senders.iter().enumerate() {
        if !s.finished() {
            assert_eq!(s.send_one(), Ok(false), "endpoint {i}: a send overtook queued pending requests");
        }
    }
    collect();
    let sent_before: Vec<u64> = senders.iter().map(|s| s.next.get()).collect();
    dispatched.borrow_mut().clear();
    // Phase 2: release, progress until everything arrives.
    pair.rx.hold(false);
    let total = EPS as u64 * PER_EP;
    pair.wait("all pending messages", || collect() as u64 >= total);
    for _ in 0..16 {
        pair.worker.progress();
    }
    collect();
    let order = order.borrow();
    assert_eq!(order.len() as u64, total, "messages delivered more than once");
    // Exactly once, in order, per endpoint.
    let mut next = [0u64; EPS];
    for &h in order.iter() {
        let (ep, seq) = ((h >> 32) as usize, h & 0xffff_ffff);
        assert!(ep < EPS, "header from unknown endpoint {ep}");
        assert_eq!(seq, next[ep], "endpoint {ep}: expected message {} got {seq}", next[ep]);
        next[ep] += 1;
    }
    // Fairness: after the release, while every endpoint still had requests queued, the pending
    // queue served no endpoint more than two rounds ahead of another (counted where it
    // dispatches: transports with one connection per endpoint deliver the connections' bytes
    // in the order the network gives them, which says nothing of the dispatch).
    let mut count = [0u64; EPS];
    for &ep in dispatched.borrow().iter() {
        let ep = ep as usize;
        count[ep] += 1;
        let all_busy = (0..EPS).all(|e| sent_before[e] + count[e] < PER_EP);
        if all_busy {
            let (min, max) = (count.iter().min().copied().unwrap_or(0), count.iter().max().copied().unwrap_or(0));
            assert!(max - min <= 2 + 1, "unfair pending dispatch: per-endpoint counts {count:?}");
        }
    }
    for ep in &pair.eps {
        ep.pending_purge(&mut drop);
    }
    drop(senders);
    Verdict::Passed
}
