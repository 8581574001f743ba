//! Flush, remote memory access, atomics, endpoint check and remote-key validation checks.

use ucs::{Outcome, Status};

use super::setup::{pattern, Options, Pair, Target};
use super::Verdict;
use crate::{AtomicOp, Completion, FlushFlags, IfaceFlags, Iov, MemAccess, SendFlags};

fn open(opts: &Options) -> Pair {
    Pair::open(opts, false, 1).unwrap_or_else(|e| panic!("{}: cannot open a connected pair: {e}", opts.resource))
}

/// Waits for an operation started with a fresh `Completion::counter(1)`.
fn finish(pair: &Pair, what: &str, r: Result<Outcome<()>, Status>, comp: &std::rc::Rc<Completion>) {
    match r {
        Ok(Outcome::Done(())) => {
            // Done means no callback: the completion must be untouched, now and later.
            pair.worker.progress();
            assert_eq!(comp.count(), 1, "{what}: returned Done but also signalled its completion");
        }
        Ok(Outcome::InProgress) => pair.wait(what, || comp.count() == 0),
        other => panic!("{what}: {other:?}"),
    }
    assert_eq!(comp.status(), Status::Ok, "{what}: completion status");
}

/// Flush of endpoint and interface, with and without a completion, after traffic.
pub fn flush(opts: &Options) -> Verdict {
    let pair = open(opts);
    let attr = pair.sender().attr().clone();
    let ep = &pair.eps[0];
    if attr.flags.contains(IfaceFlags::AM_SHORT) {
        pair.rx.listen(1, Default::default()).unwrap();
        for i in 0..16 {
            let _ = pair.retry("am_short", || ep.am_short(1, i, &[]));
        }
    }
    for flags in [FlushFlags::LOCAL, FlushFlags::REMOTE, FlushFlags::CANCEL] {
        // Without a completion: retry until Done.
        let start = std::time::Instant::now();
        loop {
            match ep.flush(flags, None) {
                Ok(Outcome::Done(())) => break,
                Ok(Outcome::InProgress | Outcome::NoResource) => {
                    pair.worker.progress();
                    assert!(start.elapsed() < opts.timeout, "ep flush without completion never finished");
                }
                Err(e) => panic!("ep flush {flags:?}: {e}"),
            }
        }
        // With a completion whose callback records the status.
        let fired = std::rc::Rc::new(std::cell::Cell::new(None));
        let f2 = fired.clone();
        let comp = Completion::new(1, move |s| f2.set(Some(s)));
        match pair.retry("ep flush", || ep.flush(flags, Some(&comp))) {
            Ok(Outcome::Done(())) => {
                pair.worker.progress();
                assert_eq!(fired.get(), None, "ep flush returned Done but also ran the callback");
            }
            Ok(Outcome::InProgress) => {
                pair.wait("ep flush callback", || fired.get().is_some());
                assert_eq!(fired.get(), Some(Status::Ok), "ep flush callback status");
            }
            other => panic!("ep flush with completion: {other:?}"),
        }
        let comp = Completion::counter(1);
        let r = pair.retry("iface flush", || pair.sender().flush(flags, Some(&comp)));
        finish(&pair, "iface flush completion", r, &comp);
    }
    Verdict::Passed
}

fn target(pair: &Pair, len: usize) -> Option<Target> {
    pair.target_region(len).ok()
}

/// Put and get of every advertised kind round-trip through a registered region; accesses
/// outside the region fail with an error and change nothing.
pub fn put_get(opts: &Options) -> Verdict {
    let pair = open(opts);
    let attr = pair.sender().attr().clone();
    let f = attr.flags;
    let any = IfaceFlags::PUT_SHORT | IfaceFlags::PUT_BCOPY | IfaceFlags::PUT_ZCOPY;
    if !f.intersects(any | IfaceFlags::GET_SHORT | IfaceFlags::GET_BCOPY | IfaceFlags::GET_ZCOPY) {
        return Verdict::Skipped("no put/get".into());
    }
    const LEN: usize = 4096;
    let Some(t) = target(&pair, LEN) else {
        return Verdict::Skipped("no ALLOC or REG in the memory domain".into());
    };
    let ep = &pair.eps[0];
    let base = t.addr();
    let mut size = 64usize;
    if f.contains(IfaceFlags::PUT_SHORT) {
        size = size.min(attr.put.max_short);
        let data = pattern(1, size);
        assert_eq!(pair.retry("put_short", || ep.put_short(&data, base + 8, &t.rkey)), Ok(Outcome::Done(())));
        flush_all(&pair);
        assert_eq!(t.read(8, size), data, "put_short data");
        // Out of range: the last byte would be past the end.
        let r = ep.put_short(&data, base + LEN as u64 - size as u64 + 1, &t.rkey);
        assert_eq!(r, Err(Status::OutOfRange), "put_short past the region");
        let r = ep.put_short(&data, base.wrapping_sub(8), &t.rkey);
        assert_eq!(r, Err(Status::OutOfRange), "put_short before the region");
        let r = ep.put_short(&data, u64::MAX - 2, &t.rkey);
        assert_eq!(r, Err(Status::OutOfRange), "put_short at the top of the address space");
        assert!(t.guards_intact(), "a rejected put_short wrote outside the region");
    }
    if f.contains(IfaceFlags::PUT_BCOPY) {
        let data = pattern(2, 1000.min(attr.put.max_bcopy));
        let r = pair.retry("put_bcopy", || {
            ep.put_bcopy(
                &mut |b: &mut [u8]| {
                    b[..data.len()].copy_from_slice(&data);
                    data.len()
                },
                base + 100,
                &t.rkey,
            )
        });
        assert_eq!(r, Ok(Outcome::Done(data.len())), "put_bcopy");
        flush_all(&pair);
        assert_eq!(t.read(100, data.len()), data, "put_bcopy data");
        // A transport without a bcopy limit (`max_bcopy` unlimited: shared memory packs straight
        // into the peer's region) hands `pack` a buffer that ends with the region; packing past
        // it is then out of range as much as more than the buffer.
        let r = ep.put_bcopy(
            &mut |b: &mut [u8]| {
                let n = b.len().min(8);
                b[..n].fill(0xee);
                8
            },
            base + LEN as u64 - 4,
            &t.rkey,
        );
        assert!(matches!(r, Err(Status::OutOfRange | Status::InvalidParam)), "put_bcopy past the region: {r:?}");
        let r = ep.put_bcopy(&mut |b: &mut [u8]| b.len() + 1, base, &t.rkey);
        assert!(
            matches!(r, Err(Status::InvalidParam | Status::OutOfRange)),
            "put_bcopy packing more than its buffer: {r:?}"
        );
        assert!(t.guards_intact(), "a rejected put_bcopy wrote outside the region");
    }
    if f.contains(IfaceFlags::GET_SHORT) {
        let data = pattern(3, size.min(attr.get.max_short));
        t.write(2000, &data);
        let mut got = vec![0u8; data.len()];
        assert_eq!(pair.retry("get_short", || ep.get_short(&mut got, base + 2000, &t.rkey)), Ok(Outcome::Done(())));
        assert_eq!(got, data, "get_short data");
        let r = ep.get_short(&mut got, base + LEN as u64 - 1, &t.rkey);
        assert_eq!(r, Err(Status::OutOfRange), "get_short past the region");
    }
    if f.contains(IfaceFlags::GET_BCOPY) {
        let data = pattern(4, 777.min(attr.get.max_bcopy));
        t.write(3000, &data);
        let mut got = vec![0u8; data.len()];
        let comp = Completion::counter(1);
        // SAFETY: `got` lives until the completion has fired (waited for in `finish`).
        let r = pair.retry("get_bcopy", || unsafe {
            ep.get_bcopy(got.as_mut_ptr(), got.len(), base + 3000, &t.rkey, Some(&comp))
        });
        finish(&pair, "get_bcopy", r, &comp);
        assert_eq!(got, data, "get_bcopy data");
    }
    if f.intersects(IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY) {
        zcopy_round_trip(&pair, &t, &attr);
    }
    assert!(t.guards_intact(), "put/get wrote outside the region");
    // A key whose registration ended must not reach the memory any more. (Memory the domain
    // allocated is different: a key may keep its own mapping of it, and writing there after
    // the owner freed it reaches pages nobody uses - harmless, as in UCX.)
    let mut t = t;
    let registered = t.is_registered_heap();
    t.deregister();
    if registered && f.contains(IfaceFlags::PUT_SHORT) {
        let r = ep.put_short(&[1u8; 8], base, &t.rkey);
        assert!(r.is_err(), "put_short through the key of a deregistered region must fail, got {r:?}");
    }
    if registered && f.contains(IfaceFlags::GET_SHORT) {
        let mut b = [0u8; 8];
        let r = ep.get_short(&mut b, base, &t.rkey);
        assert!(r.is_err(), "get_short through the key of a deregistered region must fail, got {r:?}");
    }
    assert!(t.guards_intact());
    Verdict::Passed
}

fn zcopy_round_trip(pair: &Pair, t: &Target, attr: &crate::IfaceAttr) {
    let ep = &pair.eps[0];
    let base = t.addr();
    let mut bufs: Vec<Vec<u8>> = (0..4).map(|i| pattern(600 + i, 256)).collect();
    // SAFETY: buffers outlive their registrations (both dropped at the end of this function).
    let memhs: Vec<_> =
        bufs.iter_mut().map(|b| unsafe { pair.md.mem_reg(b.as_mut_ptr(), b.len(), MemAccess::ALL) }.ok()).collect();
    if attr.flags.contains(IfaceFlags::PUT_ZCOPY) {
        let n = attr.put.max_iov.clamp(1, 4);
        let iov: Vec<Iov<'_>> =
            bufs.iter_mut().zip(&memhs).take(n).map(|(b, m)| Iov::new(b.as_mut_ptr(), b.len(), m.as_ref())).collect();
        let comp = Completion::counter(1);
        // SAFETY: buffers stay alive and unmodified until completion.
        let r = pair.retry("put_zcopy", || unsafe { ep.put_zcopy(&iov, base, &t.rkey, Some(&comp)) });
        finish(pair, "put_zcopy", r, &comp);
        flush_all(pair);
        let expect: Vec<u8> = bufs.iter().take(n).flatten().copied().collect();
        assert_eq!(t.read(0, expect.len()), expect, "put_zcopy data ({n} iov entries)");
    }
    if attr.flags.contains(IfaceFlags::GET_ZCOPY) {
        let n = attr.get.max_iov.clamp(1, 4);
        let src = pattern(700, 256 * n);
        t.write(1024, &src);
        let mut dst: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 256]).collect();
        // SAFETY: as above.
        let dmem: Vec<_> =
            dst.iter_mut().map(|b| unsafe { pair.md.mem_reg(b.as_mut_ptr(), b.len(), MemAccess::ALL) }.ok()).collect();
        let iov: Vec<Iov<'_>> =
            dst.iter_mut().zip(&dmem).map(|(b, m)| Iov::new(b.as_mut_ptr(), b.len(), m.as_ref())).collect();
        let comp = Completion::counter(1);
        // SAFETY: destination buffers stay alive and untouched until completion.
        let r = pair.retry("get_zcopy", || unsafe { ep.get_zcopy(&iov, base + 1024, &t.rkey, Some(&comp)) });
        finish(pair, "get_zcopy", r, &comp);
        drop(iov);
        let got: Vec<u8> = dst.iter().flatten().copied().collect();
        assert_eq!(got, src, "get_zcopy data ({n} iov entries)");
    }
}

fn flush_all(pair: &Pair) {
    let comp = Completion::counter(1);
    let r = pair.retry("flush", || pair.eps[0].flush(FlushFlags::REMOTE, Some(&comp)));
    finish(pair, "flush", r, &comp);
}

/// Every advertised atomic operation, 32 and 64 bit, post and fetch, against a CPU model.
pub fn atomics(opts: &Options) -> Verdict {
    let pair = open(opts);
    let attr = pair.sender().attr().clone();
    if attr.atomic32 == Default::default() && attr.atomic64 == Default::default() {
        return Verdict::Skipped("no atomics".into());
    }
    let Some(t) = target(&pair, 64) else {
        return Verdict::Skipped("no ALLOC or REG in the memory domain".into());
    };
    let ep = &pair.eps[0];
    let (a64, a32) = (t.addr() + 16, t.addr() + 32);
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut tested = 0;
    for op in AtomicOp::ALL {
        // 64-bit.
        let (init, val) = (rnd(), rnd());
        if op != AtomicOp::Cswap && attr.atomic64.op_flags.has(op) {
            t.write(16, &init.to_ne_bytes());
            assert_eq!(
                pair.retry("atomic64_post", || ep.atomic64_post(op, val, a64, &t.rkey)),
                Ok(Outcome::Done(())),
                "{op:?}/64 post"
            );
            flush_all(&pair);
            assert_eq!(t.read(16, 8), op.apply64(init, val).to_ne_bytes(), "{op:?}/64 post result");
            tested += 1;
        }
        if attr.atomic64.fop_flags.has(op) {
            for matching in [true, false] {
                t.write(16, &init.to_ne_bytes());
                let mut old = 0u64;
                let comp = Completion::counter(1);
                let compare = if matching { init } else { init ^ 1 };
                // SAFETY: `old` outlives the operation (completion waited for in `finish`).
                let r = pair.retry("atomic64 fetch", || unsafe {
                    if op == AtomicOp::Cswap {
                        ep.atomic_cswap64(compare, val, a64, &t.rkey, &mut old, Some(&comp))
                    } else {
                        ep.atomic64_fetch(op, val, &mut old, a64, &t.rkey, Some(&comp))
                    }
                });
                finish(&pair, "atomic64 fetch", r, &comp);
                assert_eq!(old, init, "{op:?}/64 fetched value");
                let expect = if op == AtomicOp::Cswap && !matching { init } else { op.apply64(init, val) };
                assert_eq!(t.read(16, 8), expect.to_ne_bytes(), "{op:?}/64 fetch result");
                tested += 1;
                if op != AtomicOp::Cswap {
                    break;
                }
            }
        }
        // 32-bit.
        let (init, val) = (rnd() as u32, rnd() as u32);
        if op != AtomicOp::Cswap && attr.atomic32.op_flags.has(op) {
            t.write(32, &init.to_ne_bytes());
            assert_eq!(
                pair.retry("atomic32_post", || ep.atomic32_post(op, val, a32, &t.rkey)),
                Ok(Outcome::Done(())),
                "{op:?}/32 post"
            );
            flush_all(&pair);
            assert_eq!(t.read(32, 4), op.apply32(init, val).to_ne_bytes(), "{op:?}/32 post result");
            tested += 1;
        }
        if attr.atomic32.fop_flags.has(op) {
            for matching in [true, false] {
                t.write(32, &init.to_ne_bytes());
                let mut old = 0u32;
                let comp = Completion::counter(1);
                let compare = if matching { init } else { init ^ 1 };
                // SAFETY: `old` outlives the operation (completion waited for in `finish`).
                let r = pair.retry("atomic32 fetch", || unsafe {
                    if op == AtomicOp::Cswap {
                        ep.atomic_cswap32(compare, val, a32, &t.rkey, &mut old, Some(&comp))
                    } else {
                        ep.atomic32_fetch(op, val, &mut old, a32, &t.rkey, Some(&comp))
                    }
                });
                finish(&pair, "atomic32 fetch", r, &comp);
                assert_eq!(old, init, "{op:?}/32 fetched value");
                let expect = if op == AtomicOp::Cswap && !matching { init } else { op.apply32(init, val) };
                assert_eq!(t.read(32, 4), expect.to_ne_bytes(), "{op:?}/32 fetch result");
                tested += 1;
                if op != AtomicOp::Cswap {
                    break;
                }
            }
        }
    }
    // Misaligned and out-of-range targets are errors.
    if attr.atomic64.op_flags.has(AtomicOp::Add) {
        let r = ep.atomic64_post(AtomicOp::Add, 1, t.addr() + 4, &t.rkey);
        assert_eq!(r, Err(Status::InvalidParam), "misaligned 64-bit atomic");
        let r = ep.atomic64_post(AtomicOp::Add, 1, t.addr() + 64, &t.rkey);
        assert_eq!(r, Err(Status::OutOfRange), "out-of-range 64-bit atomic");
    }
    if attr.atomic32.op_flags.has(AtomicOp::Add) {
        let r = ep.atomic32_post(AtomicOp::Add, 1, t.addr() + 2, &t.rkey);
        assert_eq!(r, Err(Status::InvalidParam), "misaligned 32-bit atomic");
        let r = ep.atomic32_post(AtomicOp::Add, 1, t.addr() + 62, &t.rkey);
        assert_eq!(r, Err(Status::OutOfRange), "out-of-range 32-bit atomic");
    }
    assert!(t.guards_intact(), "atomics wrote outside the region");
    assert!(tested > 0);
    Verdict::Passed
}

/// `Ep::check` on a live peer succeeds.
pub fn ep_check(opts: &Options) -> Verdict {
    let pair = open(opts);
    if !pair.sender().attr().flags.contains(IfaceFlags::EP_CHECK) {
        return Verdict::Skipped("no EP_CHECK".into());
    }
    let comp = Completion::counter(1);
    let r = pair.retry("ep check", || pair.eps[0].check(Some(&comp)));
    finish(&pair, "ep check", r, &comp);
    let _ = SendFlags::empty();
    Verdict::Passed
}

/// Remote-key unpacking rejects truncated, extended and corrupted keys without panicking, and
/// a key for one region never reaches outside it.
pub fn rkey_unpack_garbage(opts: &Options) -> Verdict {
    let pair = open(opts);
    let Some(t) = target(&pair, 128) else {
        return Verdict::Skipped("no ALLOC or REG in the memory domain".into());
    };
    let comp = pair.md.component();
    let good = &t.packed;
    assert!(comp.rkey_unpack(good).is_ok(), "the key packed by the domain must unpack");
    for cut in 0..good.len() {
        assert!(comp.rkey_unpack(&good[..cut]).is_err(), "truncated key ({cut} of {} bytes) accepted", good.len());
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(comp.rkey_unpack(&longer).is_err(), "key with a trailing byte accepted");
    // Flip every bit in turn: either rejected, or (for fields the transport cannot check, such
    // as bounds) harmless - any access through it stays in bounds or fails.
    t.write(0, &[0u8; 128]);
    for bit in 0..good.len() * 8 {
        let mut bad = good.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        if let Ok(k) = comp.rkey_unpack(&bad) {
            if pair.sender().attr().flags.contains(IfaceFlags::PUT_SHORT) {
                for addr in [k.base(), k.base().wrapping_add(k.length()).wrapping_sub(8), t.addr() + 120] {
                    let _ = pair.eps[0].put_short(&[0xa5u8; 8], addr, &k);
                }
            }
        }
    }
    assert!(t.guards_intact(), "a corrupted key wrote outside the region");
    for seed in 0..256u64 {
        let junk = pattern(seed, (seed as usize) % 64);
        let _ = comp.rkey_unpack(&junk);
    }
    Verdict::Passed
}

/// A peer process killed after traffic flowed: the survivor's endpoint reports a peer-failure
/// status (from an operation or from `Ep::check`), the error handler hears of it exactly once
/// with the endpoint's user data, later operations fail too, and nothing crashes. Runs only when
/// the receiver is in another process ([`Options::across_processes`]).
pub fn peer_failure(opts: &Options) -> Verdict {
    if opts.agent.is_none() {
        return Verdict::Skipped("no peer process to kill: the receiver runs in this process".into());
    }
    let pair = open(opts);
    let attr = pair.sender().attr().clone();
    let am = attr.flags.contains(IfaceFlags::AM_SHORT);
    if !am && !attr.flags.contains(IfaceFlags::EP_CHECK) {
        return Verdict::Skipped("no AM_SHORT or EP_CHECK to notice a dead peer with".into());
    }
    let ep = &pair.eps[0];
    if am {
        pair.rx.listen(1, Default::default()).unwrap();
        for i in 0..100 {
            assert_eq!(pair.retry("am_short", || ep.am_short(1, i, &[])), Ok(Outcome::Done(())));
        }
        pair.wait("100 messages", || pair.rx.count(1) == 100);
    }
    pair.rx.kill();
    let start = std::time::Instant::now();
    let failed = |e: Status| {
        matches!(e, Status::ConnectionReset | Status::EndpointTimeout | Status::Unreachable)
            || e.is_endpoint_error()
            || e.is_link_error()
    };
    let err = 'detect: loop {
        assert!(start.elapsed() < opts.timeout, "a dead peer was not noticed within {:?}", opts.timeout);
        if am {
            match ep.am_short(1, 0, &[]) {
                Err(e) => break e,
                Ok(_) => pair.worker.progress(),
            };
        }
        if attr.flags.contains(IfaceFlags::EP_CHECK) {
            let comp = Completion::counter(1);
            match ep.check(Some(&comp)) {
                Err(e) => break e,
                Ok(Outcome::InProgress) => {
                    while comp.count() > 0 {
                        pair.worker.progress();
                        assert!(start.elapsed() < opts.timeout, "ep check on a dead peer never completed");
                    }
                    if comp.status() != Status::Ok {
                        break 'detect comp.status();
                    }
                }
                Ok(_) => {}
            }
        }
        pair.worker.progress();
    };
    assert!(failed(err), "a dead peer must give a peer-failure status, got {err}");
    for _ in 0..16 {
        pair.worker.progress();
    }
    assert_eq!(*pair.failures.borrow(), [(0, err)], "the error handler must hear of the failure once");
    if am {
        assert!(ep.am_short(1, 0, &[]).is_err(), "am_short on a failed endpoint must fail");
    }
    if attr.flags.contains(IfaceFlags::EP_CHECK) {
        assert!(ep.check(None).is_err(), "check on a failed endpoint must fail");
    }
    Verdict::Passed
}
