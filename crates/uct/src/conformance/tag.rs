//! The tag-matching offload check: receives posted with `tag_recv_zcopy`, the sender's
//! `tag_eager_*` and `tag_rndv_*` operations, and the unexpected handlers (UCX's `uct_tag_*`
//! contract, as `test/gtest/uct/test_tag.cc` exercises it).

use ucs::{Outcome, Status};

use super::peer::{TagReport, TagUnexp};
use super::setup::{pattern, Options, Pair};
use super::Verdict;
use crate::{Completion, IfaceFlags, Iov, MemAccess, MemH, SendFlags};

/// The eager operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eager {
    Short,
    Bcopy,
    Zcopy,
}

/// A registered send buffer.
struct SendBuf {
    data: Vec<u8>,
    memh: Option<MemH>,
}

impl SendBuf {
    fn new(pair: &Pair, data: Vec<u8>) -> SendBuf {
        let mut b = SendBuf { data, memh: None };
        if !b.data.is_empty() {
            // SAFETY: the buffer lives in `b`, which drops the registration first (field order
            // is irrelevant: `Drop` below takes it).
            b.memh = unsafe { pair.md.mem_reg(b.data.as_mut_ptr(), b.data.len(), MemAccess::ALL) }.ok();
        }
        b
    }

    fn iov(&mut self) -> [Iov<'_>; 1] {
        [Iov::new(self.data.as_mut_ptr(), self.data.len(), self.memh.as_ref())]
    }
}

impl Drop for SendBuf {
    fn drop(&mut self) {
        self.memh.take();
    }
}

/// Sends `data` tagged `tag` with `how`; the immediate value the receiver must see.
fn send_eager(pair: &Pair, how: Eager, tag: u64, imm: u64, data: &[u8]) -> u64 {
    let ep = &pair.eps[0];
    match how {
        Eager::Short => {
            let r = pair.retry("tag_eager_short", || ep.tag_eager_short(tag, data));
            assert_eq!(r, Ok(Outcome::Done(())), "tag_eager_short of {} bytes", data.len());
            0
        }
        Eager::Bcopy => {
            let r = pair.retry("tag_eager_bcopy", || {
                ep.tag_eager_bcopy(
                    tag,
                    imm,
                    &mut |b: &mut [u8]| {
                        b[..data.len()].copy_from_slice(data);
                        data.len()
                    },
                    SendFlags::empty(),
                )
            });
            assert_eq!(r, Ok(Outcome::Done(data.len())), "tag_eager_bcopy of {} bytes", data.len());
            imm
        }
        Eager::Zcopy => {
            let mut b = SendBuf::new(pair, data.to_vec());
            let comp = Completion::counter(1);
            let iov = b.iov();
            // SAFETY: the buffer stays alive and untouched until the operation completed
            // (waited for below).
            let r = pair.retry("tag_eager_zcopy", || unsafe {
                ep.tag_eager_zcopy(tag, imm, &iov, SendFlags::empty(), Some(&comp))
            });
            match r {
                Ok(Outcome::Done(())) => {}
                Ok(Outcome::InProgress) => pair.wait("tag_eager_zcopy completion", || comp.count() == 0),
                other => panic!("tag_eager_zcopy of {} bytes: {other:?}", data.len()),
            }
            assert_eq!(comp.status(), Status::Ok, "tag_eager_zcopy completion");
            imm
        }
    }
}

/// Progresses a while (for things that must not happen).
fn settle(pair: &Pair) {
    for _ in 0..2000 {
        pair.worker.progress();
    }
}

/// Waits for `n` unexpected messages; panics if more arrive.
fn unexpected(pair: &Pair, what: &str, n: usize) -> Vec<TagUnexp> {
    let mut got = Vec::new();
    pair.wait(what, || {
        got.extend(pair.rx.tag_unexpected());
        got.len() >= n
    });
    settle(pair);
    got.extend(pair.rx.tag_unexpected());
    assert_eq!(got.len(), n, "{what}: more unexpected tagged messages than sent: {got:?}");
    got
}

/// Waits until receive `r` completed (or handed a rendezvous back).
fn report(pair: &Pair, what: &str, r: u32) -> TagReport {
    let mut rep = TagReport::default();
    pair.wait(what, || {
        rep = pair.rx.tag_report(r);
        rep.completed.is_some() || rep.rndv.is_some()
    });
    settle(pair);
    pair.rx.tag_report(r)
}

/// A receive that matched: `tag_consumed` first, then one completion `(tag, imm, len, status)`.
fn assert_matched(rep: &TagReport, what: &str, want: (u64, u64, usize, Status)) {
    assert!(rep.consumed && rep.consumed_first, "{what}: tag_consumed did not run first: {rep:?}");
    assert_eq!(rep.calls, 2, "{what}: callbacks run: {rep:?}");
    assert_eq!(rep.completed, Some(want), "{what}: completion");
}

/// Tag matching, for transports that advertise it: unexpected eager messages of every size
/// class with their immediate values; eager messages placed in posted receives (wildcard
/// masks, posting order, truncation); cancels reported and forced; the limits (a context posted
/// twice, the list's size); and, with `TAG_RNDV_ZCOPY`, rendezvous completed by the
/// transport, left to software (unexpected, larger than the buffer, software requests) and
/// cancelled by the sender. Needs interfaces opened with tag handlers
/// ([`Options::with_tag_handlers`]).
pub fn tag_matching(opts: &Options) -> Verdict {
    let pair =
        Pair::open(opts, false, 1).unwrap_or_else(|e| panic!("{}: cannot open a connected pair: {e}", opts.resource));
    let attr = pair.sender().attr().clone();
    let f = attr.flags;
    let kinds: Vec<Eager> = [
        (IfaceFlags::TAG_EAGER_SHORT, Eager::Short),
        (IfaceFlags::TAG_EAGER_BCOPY, Eager::Bcopy),
        (IfaceFlags::TAG_EAGER_ZCOPY, Eager::Zcopy),
    ]
    .into_iter()
    .filter(|(flag, _)| f.contains(*flag))
    .map(|(_, k)| k)
    .collect();
    if kinds.is_empty() {
        return Verdict::Skipped(if opts.tag_handlers {
            "no TAG_EAGER_* capability".into()
        } else {
            "no TAG_EAGER_* capability (interfaces opened without tag handlers)".into()
        });
    }
    assert!(opts.tag_handlers, "{}: TAG_* advertised by an interface opened without tag handlers", opts.resource);
    let caps = attr.tag;
    let size = |k: Eager, want: usize| match k {
        Eager::Short => caps.eager.max_short.min(want),
        Eager::Bcopy => caps.eager.max_bcopy.min(want),
        Eager::Zcopy => caps.eager.max_zcopy.min(want),
    };
    let imm = 0x0123_4567_89ab_cdef_u64;

    // Unexpected: every eager kind, with and without an immediate value, in sending order.
    let mut sent = Vec::new();
    for (k, &how) in kinds.iter().enumerate() {
        for (j, imm) in [imm, 0].into_iter().enumerate() {
            let tag = 0x1000 + (k * 2 + j) as u64;
            let data = pattern(tag, size(how, 100));
            let imm = send_eager(&pair, how, tag, imm, &data);
            sent.push(TagUnexp::Eager { stag: tag, imm, data });
        }
    }
    let got = unexpected(&pair, "unexpected eager messages", sent.len());
    assert_eq!(got, sent, "unexpected eager messages (tag, immediate value, data) in sending order");

    // Expected: placed in the posted buffer.
    let slot = 1024usize;
    let region = pair.target_region(4 * slot).unwrap_or_else(|e| panic!("a region for tagged receives: {e}"));
    let rid = region.id();
    for (k, &how) in kinds.iter().enumerate() {
        let tag = 0x2000 + k as u64;
        let r = pair.rx.tag_post(tag, u64::MAX, rid, k * slot, slot).unwrap_or_else(|e| panic!("tag_recv_zcopy: {e}"));
        let data = pattern(tag, size(how, 200));
        let imm = send_eager(&pair, how, tag, imm, &data);
        let rep = report(&pair, &format!("expected {how:?}"), r);
        assert_matched(&rep, &format!("expected {how:?}"), (tag, imm, data.len(), Status::Ok));
        assert_eq!(region.read(k * slot, data.len()), data, "expected {how:?}: data in the posted buffer");
    }
    let bcopy = kinds.iter().copied().find(|&k| k != Eager::Short).unwrap_or(Eager::Short);
    let n = size(bcopy, 64);

    // A wildcard mask: the receive reports the sender's tag; a tag outside it is unexpected.
    let r = pair.rx.tag_post(0x3000, !0xff, rid, 0, slot).unwrap();
    let data = pattern(1, n);
    let imm_sent = send_eager(&pair, bcopy, 0x30ab, imm, &data);
    assert_matched(&report(&pair, "masked receive", r), "masked receive", (0x30ab, imm_sent, n, Status::Ok));
    let imm_sent = send_eager(&pair, bcopy, 0x3100, imm, &data);
    let got = unexpected(&pair, "a tag outside the mask", 1);
    assert_eq!(got, [TagUnexp::Eager { stag: 0x3100, imm: imm_sent, data: data.clone() }]);

    // Two receives for one tag take two messages in posting order.
    let r1 = pair.rx.tag_post(0x4000, u64::MAX, rid, 0, slot).unwrap();
    let r2 = pair.rx.tag_post(0x4000, u64::MAX, rid, slot, slot).unwrap();
    let (d1, d2) = (pattern(41, n), pattern(42, n));
    let i1 = send_eager(&pair, bcopy, 0x4000, 1, &d1);
    let i2 = send_eager(&pair, bcopy, 0x4000, 2, &d2);
    assert_matched(&report(&pair, "first of two", r1), "first of two", (0x4000, i1, n, Status::Ok));
    assert_matched(&report(&pair, "second of two", r2), "second of two", (0x4000, i2, n, Status::Ok));
    assert_eq!((region.read(0, n), region.read(slot, n)), (d1, d2), "posting order");

    // Truncation: the receive says so, and nothing is written past its buffer.
    let long = size(bcopy, 256);
    let short = caps.recv_min_recv.max(long / 4);
    if short < long {
        region.write(0, &vec![0xee; slot]);
        let r = pair.rx.tag_post(0x5000, u64::MAX, rid, 0, short).unwrap();
        let data = pattern(5, long);
        let i = send_eager(&pair, bcopy, 0x5000, imm, &data);
        let rep = report(&pair, "truncated receive", r);
        assert!(rep.consumed && rep.calls == 2, "truncated receive: {rep:?}");
        let (tag, imm_got, _, st) = rep.completed.expect("completed");
        assert_eq!((tag, imm_got, st), (0x5000, i, Status::MessageTruncated), "truncated receive: {rep:?}");
        assert_eq!(region.read(0, short), data[..short], "truncated receive: the part that fits");
        assert!(region.read(short, slot - short).iter().all(|&b| b == 0xee), "truncated receive wrote past its buffer");
    }

    // Cancels: reported from progress, or forced (never reported); their tags then arrive
    // unexpected.
    let rc = pair.rx.tag_post(0x6000, u64::MAX, rid, 0, slot).unwrap();
    let rf = pair.rx.tag_post(0x6001, u64::MAX, rid, slot, slot).unwrap();
    // (UCX refuses a second receive into the same buffer: the two would share it.)
    let twice = pair.rx.tag_post(0x6002, u64::MAX, rid, 0, slot);
    assert_eq!(twice.err(), Some(Status::AlreadyExists), "a second receive into a posted buffer");
    pair.rx.tag_cancel(rc, false).unwrap();
    pair.rx.tag_cancel(rf, true).unwrap();
    let rep = report(&pair, "cancelled receive", rc);
    assert!(!rep.consumed && rep.calls == 1, "cancelled receive: {rep:?}");
    assert_eq!(rep.completed.map(|c| c.3), Some(Status::Canceled), "cancelled receive: {rep:?}");
    settle(&pair);
    assert_eq!(pair.rx.tag_report(rf), TagReport::default(), "a forced cancel was reported");
    let ia = send_eager(&pair, bcopy, 0x6000, imm, &data);
    let ib = send_eager(&pair, bcopy, 0x6001, imm, &data);
    let got = unexpected(&pair, "messages for cancelled receives", 2);
    assert_eq!(
        got,
        [
            TagUnexp::Eager { stag: 0x6000, imm: ia, data: data.clone() },
            TagUnexp::Eager { stag: 0x6001, imm: ib, data: data.clone() }
        ]
    );

    // The list's size: one more receive than it takes is refused; forced cancels free it.
    let max = caps.recv_max_outstanding;
    if max > 0 && max <= 4096 {
        let each = caps.recv_min_recv.max(1);
        let many = pair.target_region(each * max).unwrap();
        let mid = many.id();
        let posted: Vec<u32> = (0..max)
            .map(|i| {
                pair.rx
                    .tag_post(0x8000 + i as u64, u64::MAX, mid, i * each, each)
                    .unwrap_or_else(|e| panic!("receive {i} of the {max} recv_max_outstanding allows: {e}"))
            })
            .collect();
        let extra = pair.rx.tag_post(0x9000, u64::MAX, rid, 0, slot);
        assert_eq!(extra.err(), Some(Status::ExceedsLimit), "a receive beyond recv_max_outstanding ({max})");
        for r in posted {
            pair.rx.tag_cancel(r, true).unwrap();
        }
        settle(&pair);
        let r = pair.rx.tag_post(0x9001, u64::MAX, rid, 0, slot).expect("a receive after the list was emptied");
        let i = send_eager(&pair, bcopy, 0x9001, imm, &data);
        assert_matched(&report(&pair, "receive after a full list", r), "after a full list", (0x9001, i, n, Status::Ok));
    }

    if f.contains(IfaceFlags::TAG_RNDV_ZCOPY) {
        rendezvous(&pair, &caps);
    }
    let stray = pair.rx.tag_unexpected();
    assert!(stray.is_empty(), "stray unexpected tagged messages: {stray:?}");
    Verdict::Passed
}

/// The rendezvous half of [`tag_matching`].
fn rendezvous(pair: &Pair, caps: &crate::TagCaps) {
    let ep = &pair.eps[0];
    let n = caps.rndv.max_zcopy.min(256 * 1024);
    let header = pattern(77, caps.rndv.max_hdr.min(16));
    let mut src = SendBuf::new(pair, pattern(70, n));
    let dst = pair.target_region(n).unwrap_or_else(|e| panic!("a region for rendezvous receives: {e}"));
    let did = dst.id();
    let start = |tag: u64, comp: &std::rc::Rc<Completion>, src: &mut SendBuf| {
        let iov = src.iov();
        // SAFETY: `src` outlives the operation: it completes or is cancelled before the end of
        // `rendezvous`, which owns it.
        let r = pair.retry("tag_rndv_zcopy", || unsafe {
            ep.tag_rndv_zcopy(tag, &header, &iov, SendFlags::empty(), Some(comp))
        });
        match r {
            Ok(Outcome::Done(op)) => op,
            other => panic!("tag_rndv_zcopy of {n} bytes: {other:?}"),
        }
    };

    // Expected: the transport moves the data and completes both sides.
    let r = pair.rx.tag_post(0x7000, u64::MAX, did, 0, n).unwrap();
    let comp = Completion::counter(1);
    let _op = start(0x7000, &comp, &mut src);
    pair.wait("the sender's rendezvous completion", || comp.count() == 0);
    assert_eq!(comp.status(), Status::Ok, "the sender's rendezvous completion");
    let rep = report(pair, "expected rendezvous", r);
    assert!(rep.consumed && rep.consumed_first && rep.calls == 2 && rep.rndv.is_none(), "expected rendezvous: {rep:?}");
    let (tag, _, len, st) = rep.completed.expect("completed");
    assert_eq!((tag, len, st), (0x7000, n, Status::Ok), "expected rendezvous: {rep:?}");
    assert!(dst.read(0, n) == src.data, "expected rendezvous: the data");

    // Unexpected: software gets the header, the sender's address, length and key; the sender
    // then cancels (the completion does not run).
    let comp = Completion::counter(1);
    let op = start(0x7001, &comp, &mut src);
    let got = unexpected(pair, "an unexpected rendezvous", 1);
    let TagUnexp::Rndv { stag, header: h, remote_addr, length, rkey } = &got[0] else {
        panic!("an unexpected rendezvous came as {got:?}")
    };
    assert_eq!((*stag, h, *length), (0x7001, &header, n), "unexpected rendezvous");
    assert_eq!(*remote_addr, src.data.as_ptr() as u64, "unexpected rendezvous: the sender's address");
    let key = pair.md.component().rkey_unpack(rkey).unwrap_or_else(|e| panic!("the rendezvous key: {e}"));
    drop(key);
    ep.tag_rndv_cancel(op).unwrap_or_else(|e| panic!("tag_rndv_cancel: {e}"));
    settle(pair);
    assert_eq!(comp.count(), 1, "a cancelled rendezvous ran its completion");

    // Larger than the posted buffer: handed back to software with the header.
    let r = pair.rx.tag_post(0x7002, u64::MAX, did, 0, n / 2).unwrap();
    let comp = Completion::counter(1);
    let op = start(0x7002, &comp, &mut src);
    let rep = report(pair, "a rendezvous larger than its receive", r);
    assert!(rep.consumed && rep.consumed_first && rep.calls == 2, "larger rendezvous: {rep:?}");
    assert_eq!(rep.rndv, Some((0x7002, header.clone())), "larger rendezvous: {rep:?}");
    ep.tag_rndv_cancel(op).unwrap();
    settle(pair);
    assert_eq!(comp.count(), 1, "a cancelled rendezvous ran its completion");

    // A software request: expected, then unexpected.
    let r = pair.rx.tag_post(0x7003, u64::MAX, did, 0, n).unwrap();
    let sw = pair.retry("tag_rndv_request", || ep.tag_rndv_request(0x7003, &header, SendFlags::empty()));
    assert_eq!(sw, Ok(Outcome::Done(())), "tag_rndv_request");
    let rep = report(pair, "an expected rendezvous request", r);
    assert!(rep.consumed && rep.consumed_first && rep.calls == 2, "rendezvous request: {rep:?}");
    assert_eq!(rep.rndv, Some((0x7003, header.clone())), "rendezvous request: {rep:?}");
    let sw = pair.retry("tag_rndv_request", || ep.tag_rndv_request(0x7004, &header, SendFlags::empty()));
    assert_eq!(sw, Ok(Outcome::Done(())), "tag_rndv_request");
    let got = unexpected(pair, "an unexpected rendezvous request", 1);
    assert!(
        matches!(&got[0], TagUnexp::Rndv { stag: 0x7004, header: h, .. } if *h == header),
        "an unexpected rendezvous request came as {got:?}"
    );
}
