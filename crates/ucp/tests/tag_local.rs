//! Tag send/receive in one process: an endpoint to the same worker (self) and between two
//! workers (posix + cma), with thresholds forced so every protocol path runs.

use ucp::{
    block_on, CloseMode, Context, ContextParams, Endpoint, Features, IoVec, RecvData, RecvResult, RequestParam,
    SendData, Status, Worker, WorkerParams, FULL_MASK,
};

/// Busy-polling tests of this file run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn ctx(tls: &str, extra: &[(&str, &str)]) -> Context {
    uct_shm::register();
    let mut p = ContextParams::new(Features::TAG).with_config("TLS", tls);
    for (k, v) in extra {
        p = p.with_config(k, v);
    }
    Context::new(&p).unwrap()
}

/// Two workers of one context over posix + cma (with `extra` configuration), and an endpoint
/// from the first to the second.
fn two_workers(extra: &[(&str, &str)]) -> (Worker, Worker, Endpoint) {
    let c = ctx("posix,cma", extra);
    let a = Worker::new(&c, &WorkerParams::new("a")).unwrap();
    let b = Worker::new(&c, &WorkerParams::new("b")).unwrap();
    let ep = a.ep_create(b.address()).unwrap();
    (a, b, ep)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Sends `data` with `tag` from `ep` and receives it on `rw`, progressing both workers.
fn round_trip(
    ep: &Endpoint,
    sw: &Worker,
    rw: &Worker,
    data: &[u8],
    recv_len: usize,
    sync: bool,
) -> Result<Vec<u8>, Status> {
    let mut buf = vec![0u8; recv_len];
    let tag = 0x1234_5678_0000_0000 | data.len() as u64;
    // SAFETY: both buffers outlive the requests (we wait for both below).
    let rreq = unsafe { rw.tag_recv_nbx(RecvData::Contig(&mut buf), tag, FULL_MASK, RequestParam::new()) }?;
    // SAFETY: as above.
    let sreq = unsafe {
        if sync {
            ep.tag_send_sync_nbx(SendData::Contig(data), tag, RequestParam::new())
        } else {
            ep.tag_send_nbx(SendData::Contig(data), tag, RequestParam::new())
        }
    }?;
    let mut rres: Option<Result<ucp::RecvInfo, Status>> = None;
    let mut rreq = match rreq {
        RecvResult::Done(i) => {
            rres = Some(Ok(i));
            None
        }
        RecvResult::Pending(r) => Some(r),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while rres.is_none() || sreq.as_ref().is_some_and(|r| !r.is_completed()) {
        sw.progress();
        rw.progress();
        if let Some(r) = &rreq {
            if r.is_completed() {
                rres = Some(match r.status() {
                    Status::Ok => Ok(r.recv_info().unwrap()),
                    e => Err(e),
                });
                rreq = None;
            }
        }
        assert!(std::time::Instant::now() < deadline, "timed out ({} bytes)", data.len());
    }
    if let Some(s) = &sreq {
        assert_eq!(s.status(), Status::Ok, "send status");
    }
    let info = rres.unwrap()?;
    assert_eq!(info.length, data.len());
    assert_eq!(info.sender_tag, tag);
    buf.truncate(data.len());
    Ok(buf)
}

const SIZES: &[usize] = &[0, 1, 7, 8, 100, 1000, 8000, 8192, 12000, 20000, 100_000, 1 << 20];

fn all_sizes(ep: &Endpoint, sw: &Worker, rw: &Worker, what: &str) {
    for &n in SIZES {
        for sync in [false, true] {
            let data = pattern(n, n as u8);
            let got = round_trip(ep, sw, rw, &data, n + 3, sync).unwrap_or_else(|e| panic!("{what} {n} B: {e}"));
            assert!(got == data, "{what}: {n} B (sync {sync}) arrived corrupted");
        }
    }
}

#[test]
fn self_endpoint_every_protocol() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (name, extra) in [
        ("default", vec![]),
        ("rndv at 0 (AM scheme)", vec![("RNDV_THRESH", "0")]),
        ("rndv at 1000", vec![("RNDV_THRESH", "1000")]),
        ("no short", vec![("BCOPY_THRESH", "0")]),
    ] {
        let c = ctx("self", &extra);
        let w = Worker::new(&c, &WorkerParams::new("self")).unwrap();
        let ep = w.ep_create(w.address()).unwrap();
        let q = ep.query().unwrap();
        assert!(q.lanes.iter().any(|l| l.usage == "am" && l.transport == "self"), "{q:?}");
        all_sizes(&ep, &w, &w, name);
        let c = w.proto_counts();
        eprintln!("{name}: {c:?}");
        match name {
            "default" => assert!(c.eager_short > 0 && c.eager_multi > 0 && c.rndv_am == 0, "{c:?}"),
            "no short" => assert!(c.eager_short == 0 && c.eager_bcopy > 0, "{c:?}"),
            _ => assert!(c.rndv_am > 0, "{c:?}"),
        }
        ep.close(CloseMode::Flush).unwrap();
        assert_eq!(w.stats().1, 0, "{name}: requests left behind");
    }
}

/// `auto` resolves per endpoint: a worker with WAKEUP keeps zero-copy, one without sends
/// fragments over posix + cma. Between two such workers every size still arrives intact both
/// ways: the receiver answers an RTS with or without a key the way its own scheme wants.
#[test]
fn peers_resolving_auto_differently() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let busy = ctx("posix,cma", &[("RNDV_THRESH", "20000")]);
    let sleepy = Context::new(
        &ContextParams::new(Features::TAG | Features::WAKEUP)
            .with_config("TLS", "posix,cma")
            .with_config("RNDV_THRESH", "20000"),
    )
    .unwrap();
    let a = Worker::new(&busy, &WorkerParams::new("busy")).unwrap();
    let b = Worker::new(&sleepy, &WorkerParams::new("sleepy")).unwrap();
    let ab = a.ep_create(b.address()).unwrap();
    all_sizes(&ab, &a, &b, "fragments-minded sender");
    let ba = b.ep_create(a.address()).unwrap();
    all_sizes(&ba, &b, &a, "zero-copy-minded sender");
    let (x, y) = (a.proto_counts(), b.proto_counts());
    eprintln!("busy {x:?}; sleepy {y:?}");
    // The busy worker receives by fragments; the sleepy one, sent no key, answers with its
    // own for a put.
    assert!(x.rndv_am > 0, "{x:?}");
    assert!(y.rndv_put > 0, "{y:?}");
    ab.close(CloseMode::Flush).unwrap();
    ba.close(CloseMode::Flush).unwrap();
}

/// Each rendezvous scheme forced, from 20,000 bytes up.
const FORCED_SCHEMES: [(&str, &[(&str, &str)]); 3] = [
    ("get_zcopy", &[("RNDV_THRESH", "20000"), ("RNDV_SCHEME", "get_zcopy")]),
    ("put_zcopy", &[("RNDV_THRESH", "20000"), ("RNDV_SCHEME", "put_zcopy")]),
    ("am", &[("RNDV_THRESH", "20000"), ("RNDV_SCHEME", "am")]),
];

#[test]
fn two_workers_every_protocol() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let all_rndv: (&str, &[(&str, &str)]) = ("all rndv", &[("RNDV_THRESH", "0")]);
    for (name, extra) in [("default", &[][..])].into_iter().chain(FORCED_SCHEMES).chain([all_rndv]) {
        let (a, b, ep) = two_workers(extra);
        let q = ep.query().unwrap();
        assert!(q.lanes.iter().any(|l| l.usage == "am" && l.transport == "posix"), "{q:?}");
        assert!(q.lanes.iter().any(|l| l.usage == "rndv" && l.transport == "cma"), "{q:?}");
        all_sizes(&ep, &a, &b, name);
        // And back, over the endpoint the peer made for us.
        let back = b.ep_create(a.address()).unwrap();
        all_sizes(&back, &b, &a, name);
        let (x, y) = (a.proto_counts(), b.proto_counts());
        let sum = |f: fn(&ucp::ProtoCounts) -> u64| f(&x) + f(&y);
        eprintln!("{name}: {x:?} {y:?}");
        let rndv = match name {
            "get_zcopy" => sum(|c| c.rndv_get),
            "put_zcopy" => sum(|c| c.rndv_put),
            // `auto` over posix + cma: fragments on the AM lane (its model is faster than cma's).
            "am" | "default" => sum(|c| c.rndv_am),
            _ => sum(|c| c.rndv_get + c.rndv_put + c.rndv_am),
        };
        assert!(rndv > 0, "{name}: the rendezvous scheme asked for was not used: {x:?} {y:?}");
        if name != "all rndv" {
            assert!(sum(|c| c.eager_short) > 0 && sum(|c| c.eager_bcopy) > 0, "{name}: {x:?}");
            assert!(sum(|c| c.eager_multi) > 0 && sum(|c| c.eager_sync) > 0, "{name}: {x:?}");
        } else {
            assert_eq!(sum(|c| c.eager_short + c.eager_bcopy + c.eager_multi), 0, "{name}: {x:?}");
        }
        ep.close(CloseMode::Flush).unwrap();
        back.close(CloseMode::Flush).unwrap();
    }
}

#[test]
fn truncation_eager_and_rndv() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (a, b, ep) = two_workers(&[("RNDV_THRESH", "4096")]);
    for n in [100usize, 3000, 10000, 100_000] {
        let data = pattern(n, 1);
        let mut small = vec![0xeeu8; n / 2 + 64];
        let tag = 9;
        // SAFETY: buffers outlive the requests (waited for below).
        let r = unsafe { b.tag_recv_nbx(RecvData::Contig(&mut small[..n / 2]), tag, FULL_MASK, RequestParam::new()) }
            .unwrap();
        // SAFETY: as above.
        let s = unsafe { ep.tag_send_nbx(SendData::Contig(&data), tag, RequestParam::new()) }.unwrap();
        let RecvResult::Pending(r) = r else { panic!("nothing sent yet") };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !r.is_completed() || s.as_ref().is_some_and(|s| !s.is_completed()) {
            a.progress();
            b.progress();
            assert!(std::time::Instant::now() < deadline);
        }
        assert_eq!(r.status(), Status::MessageTruncated, "{n} B into {} B", n / 2);
        if let Some(s) = s {
            assert_eq!(s.status(), Status::Ok);
        }
        assert!(small[n / 2..].iter().all(|&x| x == 0xee), "{n} B: wrote past the buffer");
    }
}

/// Splits `buf` into pieces of the lengths in `cuts` (cycled), the last taking the rest.
fn iov_over(buf: &mut [u8], cuts: &[usize]) -> Vec<IoVec> {
    let mut list = Vec::new();
    let (mut at, mut i) = (0, 0);
    while at < buf.len() {
        let n = cuts[i % cuts.len()].min(buf.len() - at);
        list.push(IoVec { buffer: buf[at..].as_mut_ptr(), length: n });
        at += n;
        i += 1;
    }
    list
}

/// Iov lists of many uneven pieces, longer than any fixed-size copy would hold, on both sides
/// and through every protocol: the lists are read in place (the caller keeps them until
/// completion, as UCX requires) and the data arrives intact, including empty pieces.
#[test]
fn iov_lists_every_protocol() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let eager: [(&str, &[(&str, &str)]); 2] = [("default", &[]), ("zcopy eager", &[("ZCOPY_THRESH", "512")])];
    for (name, extra) in eager.into_iter().chain(FORCED_SCHEMES) {
        let (a, b, ep) = two_workers(extra);
        for n in [40usize, 5000, 30_000, 300_000] {
            let mut data = pattern(n, 7);
            let mut out = vec![0u8; n + 5];
            let send_list = iov_over(&mut data, &[3, 0, 100, 17, 250, 900, 1, 64, 5, 2048, 77, 0, 31, 9000]);
            let recv_list = iov_over(&mut out, &[11, 400, 0, 2, 700, 33, 1200, 8, 129, 1, 5000]);
            let pieces = (send_list.len(), recv_list.len());
            assert!(n == 40 || (pieces.0 > 8 && pieces.1 > 8), "{name} {n}: {pieces:?} pieces");
            let tag = 0x10 | n as u64;
            // SAFETY: both lists and the buffers they cover outlive the requests, unchanged
            // (waited for below).
            let r = unsafe { b.tag_recv_nbx(RecvData::Iov(&recv_list), tag, FULL_MASK, RequestParam::new()) }.unwrap();
            // SAFETY: as above.
            let s = unsafe { ep.tag_send_nbx(SendData::Iov(&send_list), tag, RequestParam::new()) }.unwrap();
            let RecvResult::Pending(r) = r else { panic!("{name} {n}: nothing sent yet") };
            progress_until(&a, &b, name, || r.is_completed() && s.as_ref().is_none_or(|s| s.is_completed()));
            assert_eq!(r.status(), Status::Ok, "{name} {n}");
            assert_eq!(r.recv_info().map(|i| i.length), Some(n), "{name} {n}");
            if let Some(s) = s {
                assert_eq!(s.status(), Status::Ok, "{name} {n}");
            }
            assert!(out[..n] == data[..], "{name}: {n} B arrived corrupted");
            assert!(out[n..].iter().all(|&x| x == 0), "{name} {n}: wrote past the message");
        }
    }
}

/// Progresses both workers until `done`, failing after 20 s.
fn progress_until(a: &Worker, b: &Worker, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        a.progress();
        b.progress();
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
    }
}

/// Sends that meet the peer's full FIFO park the endpoint on its AM lane: progress on the
/// sender alone leaves them queued; once the receiver drains the FIFO they go out in order and
/// intact (short, bcopy and rendezvous mixed). A force close cancels what is still parked, and
/// the endpoint's wake goes with it.
#[test]
fn a_full_fifo_parks_sends_and_replays_them_in_order() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (a, b, ep) = two_workers(&[("RNDV_THRESH", "16384")]);
    // Wired up first: sends before that queue behind the wireup, not behind the FIFO.
    round_trip(&ep, &a, &b, b"wireup", 8, false).unwrap();
    const N: usize = 600;
    let size = |i: usize| [8usize, 1000, 20000, 0][i % 4];
    let data: Vec<Vec<u8>> = (0..N).map(|i| pattern(size(i), i as u8)).collect();
    let mut sends = Vec::new();
    for (i, d) in data.iter().enumerate() {
        // SAFETY: `data` outlives the requests (all complete below).
        if let Some(r) = unsafe { ep.tag_send_nbx(SendData::Contig(d), i as u64, RequestParam::new()) }.unwrap() {
            sends.push(r);
        }
    }
    assert!(a.proto_counts().parked > 0, "{N} sends never met a full FIFO: {:?}", a.proto_counts());
    for _ in 0..10_000 {
        a.progress();
    }
    assert!(sends.iter().any(|r| !r.is_completed()), "queued sends went out without the receiver");
    let mut buf = vec![0u8; 20000 + 64];
    for (i, d) in data.iter().enumerate() {
        // Any tag: the order of arrival is the sender's order.
        // SAFETY: `buf` outlives the request (waited for below).
        let r = unsafe { b.tag_recv_nbx(RecvData::Contig(&mut buf), 0, 0, RequestParam::new()) }.unwrap();
        let info = match r {
            RecvResult::Done(info) => info,
            RecvResult::Pending(r) => {
                progress_until(&a, &b, "a receive", || r.is_completed());
                assert_eq!(r.status(), Status::Ok, "message {i}");
                r.recv_info().unwrap()
            }
        };
        assert_eq!(info.sender_tag, i as u64, "message {i} overtaken");
        assert!(buf[..info.length] == d[..], "message {i} ({} B) arrived corrupted", d.len());
    }
    progress_until(&a, &b, "the sends", || sends.iter().all(|r| r.is_completed()));
    assert!(sends.iter().all(|r| r.status() == Status::Ok));
    drop(sends);

    // Park again, then force close: what is queued completes with Canceled.
    let before = a.proto_counts().parked;
    let small = pattern(8, 3);
    let canceled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut queued = 0;
    for i in 0..N {
        let c = canceled.clone();
        let param = RequestParam::new().callback(move |st, _| {
            assert_eq!(st, Status::Canceled, "a parked send completed with {st}");
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        // SAFETY: `small` outlives the requests (completed by the close below).
        if unsafe { ep.tag_send_nbx(SendData::Contig(&small), i as u64, param) }.unwrap().is_some() {
            queued += 1;
        }
    }
    assert!(a.proto_counts().parked > before && queued > 0);
    ep.close(CloseMode::Force).unwrap();
    assert_eq!(canceled.load(std::sync::atomic::Ordering::Relaxed), queued, "parked sends not canceled");
    for _ in 0..1000 {
        a.progress();
        b.progress();
    }
    assert_eq!(a.stats().1, 0, "requests left behind");
}

#[test]
fn futures_and_drop_cancels() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = ctx("self", &[]);
    let w = Worker::new(&c, &WorkerParams::new("f")).unwrap();
    let ep = w.ep_create(w.address()).unwrap();
    // Dropping a pending receive cancels it: the message then goes to the next receive.
    {
        let f = w.tag_recv(vec![0u8; 16], 5, FULL_MASK);
        drop(f);
    }
    let (buf, r) = block_on(async {
        let (_, s) = ep.tag_send(b"hello".to_vec(), 5).await;
        s.unwrap();
        w.tag_recv(vec![0u8; 16], 5, FULL_MASK).await
    });
    let info = r.unwrap();
    assert_eq!(&buf[..info.length], b"hello");
    // A sync send stays pending until the receiver matched it.
    for n in [1000usize, 100_000] {
        let mut sf = std::pin::pin!(ep.tag_send_sync(vec![1u8; n], 6));
        for _ in 0..100 {
            assert!(poll_once(sf.as_mut()).is_none(), "sync send of {n} B completed before a receive was posted");
        }
        let (b, r) = block_on(w.tag_recv(vec![0u8; n], 6, FULL_MASK));
        assert_eq!(r.unwrap().length, n);
        assert!(b.iter().all(|&x| x == 1));
        let (_, s) = block_on(sf);
        s.unwrap();
    }
    assert_eq!(w.stats().3, 0, "the dropped receive left the expected queue");
}

fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
    use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
    fn clone(_: *const ()) -> RawWaker {
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    // SAFETY: the vtable ignores the data pointer.
    let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
    match f.poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// What the callbacks of detached operations reported, in order.
type Reports = std::sync::Arc<std::sync::Mutex<Vec<(&'static str, Status, ucp::RecvInfo)>>>;

fn report_to(reports: &Reports, what: &'static str) -> RequestParam {
    let r = reports.clone();
    RequestParam::new().callback(move |status, info| r.lock().unwrap().push((what, status, info)))
}

/// Detached operations (no request handle): every size and protocol, expected and unexpected,
/// plain and synchronous. One that completes at once says so and runs no callback; the others
/// report through their callback exactly once, with the data intact, and leave no request
/// behind. `NO_IMM_CMPL`, which asks for a handle, is refused.
#[test]
fn detached_operations_report_through_callbacks_only() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (a, b, ep) = two_workers(&[("RNDV_THRESH", "20000")]);
    round_trip(&ep, &a, &b, b"wireup", 8, false).unwrap();
    let reports: Reports = Default::default();
    for &n in SIZES {
        for (sync, expected) in [(false, true), (true, true), (false, false), (true, false)] {
            reports.lock().unwrap().clear();
            let data = pattern(n, n as u8 ^ 0x5a);
            let mut buf = vec![0u8; n + 3];
            let tag = 0xd7ac_0000_0000_0000 | n as u64;
            let mut recv_now = None;
            let post_recv = |buf: &mut Vec<u8>| {
                // SAFETY: `buf` outlives the receive (waited for below).
                unsafe { b.tag_recv_nbx_detached(RecvData::Contig(buf), tag, FULL_MASK, report_to(&reports, "recv")) }
                    .unwrap()
            };
            if expected {
                assert!(post_recv(&mut buf).is_none(), "{n} B: nothing sent yet, the receive must wait");
            }
            // SAFETY: `data` outlives the send (waited for below).
            let sent_now = unsafe {
                let p = report_to(&reports, "send");
                if sync {
                    ep.tag_send_sync_nbx_detached(SendData::Contig(&data), tag, p)
                } else {
                    ep.tag_send_nbx_detached(SendData::Contig(&data), tag, p)
                }
            }
            .unwrap();
            assert!(!(sync && sent_now), "{n} B: a synchronous send completed before its match");
            assert!(sync || n > 1000 || sent_now, "{n} B: an eager send in one piece completes at once");
            if !expected {
                // Let the message (or its first piece) arrive before the receive is posted.
                let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
                while std::time::Instant::now() < deadline {
                    a.progress();
                    b.progress();
                }
                recv_now = post_recv(&mut buf);
                assert!(n > 1000 || recv_now.is_some(), "{n} B: a whole eager message waited; it completes at once");
            }
            let want = usize::from(!sent_now) + usize::from(recv_now.is_none());
            let what = format!("{n} B sync {sync} expected {expected}");
            progress_until(&a, &b, &what, || reports.lock().unwrap().len() >= want);
            let got = reports.lock().unwrap().clone();
            assert_eq!(got.len(), want, "{what}: {got:?}");
            for (who, status, info) in &got {
                assert_eq!(*status, Status::Ok, "{what}: {who}");
                if *who == "recv" {
                    assert_eq!((info.length, info.sender_tag), (n, tag), "{what}");
                }
            }
            if let Some(info) = recv_now {
                assert_eq!((info.length, info.sender_tag), (n, tag), "{what}");
            }
            assert!(buf[..n] == data[..], "{what}: data");
            assert!(buf[n..].iter().all(|&x| x == 0), "{what}: wrote past the message");
            progress_until(&a, &b, &what, || a.stats().1 == 0 && b.stats().1 == 0);
        }
    }
    let no_handle = RequestParam::new().flags(ucp::RequestFlags::NO_IMM_CMPL);
    let mut buf = [0u8; 8];
    // SAFETY: refused before anything is posted.
    let r = unsafe { b.tag_recv_nbx_detached(RecvData::Contig(&mut buf), 1, FULL_MASK, no_handle) };
    assert_eq!(r, Err(Status::InvalidParam));
    let no_handle = RequestParam::new().flags(ucp::RequestFlags::NO_IMM_CMPL);
    // SAFETY: refused before anything is sent.
    let r = unsafe { ep.tag_send_nbx_detached(SendData::Contig(b"x"), 1, no_handle) };
    assert_eq!(r, Err(Status::InvalidParam));
    ep.close(CloseMode::Flush).unwrap();
}
