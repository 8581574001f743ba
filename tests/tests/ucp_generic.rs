//! Generic datatypes (`ucp_dt_create_generic`) in tag, active-message and stream sends and
//! receives: in one process over `self` and between two workers over shared memory, and
//! across two real processes over posix with cma and over sysv (`ucp-peer generic`), with thresholds
//! forced so that eager short, bcopy, multi-fragment and every rendezvous scheme run. Data is
//! scattered into strided destinations (the gaps checked untouched); callbacks that fail
//! (start, pack, unpack) are reported through the request; every state is finished once.

#[path = "common/generic_scenarios.rs"]
mod sc;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use sc::{GenPeer, CONFIGS, SIZES, TIMEOUT};
use tests::generic::Strided;
use tests::text::pattern;
use ucp::{
    AmHandlerFlags, AmMsg, AmSendFlags, Context, ContextParams, Datatype, Endpoint, Features, GenericBuf, RecvData,
    RecvResult, RequestParam, SendData, Status, StreamRecvFlags, Worker, WorkerParams, FULL_MASK,
};

/// Two workers in this process (one for `self`) and an endpoint from the first to the second.
struct Local {
    a: Worker,
    b: Worker,
    ab: Endpoint,
}

impl Local {
    fn new(tls: &str, cfg: &[(&str, &str)]) -> Local {
        uct_shm::register();
        let mut p =
            ContextParams::new(Features::TAG | Features::AM | Features::STREAM | Features::RMA).with_config("TLS", tls);
        for (k, v) in cfg {
            p = p.with_config(k, v);
        }
        let c = Context::new(&p).unwrap();
        let a = Worker::new(&c, &WorkerParams::new("a")).unwrap();
        let b = if tls == "self" { a.clone() } else { Worker::new(&c, &WorkerParams::new("b")).unwrap() };
        let ab = a.ep_create(b.address()).unwrap();
        let l = Local { a, b, ab };
        if let Some(r) = l.ab.flush_nbx(RequestParam::new()).unwrap() {
            l.wait_until(|| r.is_completed());
        }
        l
    }

    /// Posts on `b` a receive tagged `tag` of up to `n` bytes into `dst` through `dt`.
    ///
    /// # Safety
    /// `dst` must outlive the receive and stay untouched until it completes.
    unsafe fn recv_generic(&self, dt: &Datatype, dst: &mut [u8], n: usize, tag: u64) -> Result<RecvResult<'_>, Status> {
        let data = RecvData::Generic(&GenericBuf::recv(dt, dst.as_mut_ptr(), n));
        // SAFETY: forwarded from the caller.
        unsafe { self.b.tag_recv_nbx(data, tag, FULL_MASK, RequestParam::new()) }
    }

    fn wait_until(&self, done: impl FnMut() -> bool) {
        sc::wait_until(self, "an operation", done)
    }

    fn outcome(&self, r: Result<Option<ucp::Request<'_>>, Status>) -> Status {
        sc::outcome(self, r)
    }

    fn recv_outcome(&self, r: Result<RecvResult<'_>, Status>) -> (Status, usize) {
        sc::recv_outcome(self, r)
    }

    fn progress(&self) {
        sc::Progress::progress_once(self);
    }
}

impl sc::Progress for Local {
    fn progress_once(&self) {
        self.a.progress();
        self.b.progress();
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tagged messages of every size: generic to generic (the receive posted first), contiguous
/// to generic (the message waits as unexpected), generic to contiguous.
fn tag_round(l: &Local, what: &str) {
    let (sd, rd) = (Strided::new(3, 5), Strided::new(4, 9));
    let (sdt, rdt) = (sd.datatype(), rd.datatype());
    let mut ops = 0;
    for &n in SIZES {
        let data = pattern(n, n as u64);
        let src = sd.scatter(&data);
        // Generic to generic, receive first.
        let mut dst = vec![0xeeu8; rd.span(n)];
        // SAFETY: `dst` outlives the receive (waited for below).
        let recv = unsafe { l.recv_generic(&rdt, &mut dst, n, 7) };
        // SAFETY: `src` outlives the send (waited for).
        let s = l.outcome(unsafe {
            l.ab.tag_send_nbx(SendData::Generic(&GenericBuf::send(&sdt, src.as_ptr(), n)), 7, RequestParam::new())
        });
        assert_eq!(s, Status::Ok, "{what}: generic send of {n}");
        assert_eq!(l.recv_outcome(recv), (Status::Ok, n), "{what}: generic receive of {n}");
        assert_eq!(rd.gather(&dst, n), data, "{what}: {n} bytes scattered");
        assert!(rd.gaps_untouched(&dst, n), "{what}: {n}: a gap was written");
        // Contiguous to generic, the message unexpected first.
        let mut dst = vec![0xeeu8; rd.span(n)];
        // SAFETY: `data` outlives the send (waited for below).
        let send = unsafe { l.ab.tag_send_nbx(SendData::Contig(&data), 8, RequestParam::new()) };
        for _ in 0..50 {
            l.progress();
        }
        // SAFETY: `dst` outlives the receive (waited for).
        let got = l.recv_outcome(unsafe { l.recv_generic(&rdt, &mut dst, n, 8) });
        assert_eq!(got, (Status::Ok, n), "{what}: unexpected {n} into generic");
        assert_eq!(l.outcome(send), Status::Ok);
        assert_eq!(rd.gather(&dst, n), data, "{what}: unexpected {n} scattered");
        assert!(rd.gaps_untouched(&dst, n));
        // Generic to contiguous.
        let mut flat = vec![0u8; n];
        // SAFETY: `flat` outlives the receive (waited for).
        let recv = unsafe { l.b.tag_recv_nbx(RecvData::Contig(&mut flat), 9, FULL_MASK, RequestParam::new()) };
        // SAFETY: `src` outlives the send (waited for).
        let s = l.outcome(unsafe {
            l.ab.tag_send_nbx(SendData::Generic(&GenericBuf::send(&sdt, src.as_ptr(), n)), 9, RequestParam::new())
        });
        assert_eq!((s, l.recv_outcome(recv)), (Status::Ok, (Status::Ok, n)), "{what}: generic {n} into contiguous");
        assert_eq!(flat, data);
        ops += 2;
    }
    // Every state finished once, each after its operation completed.
    assert_eq!((sd.finished(), rd.finished()), (ops, ops), "{what}: finish calls");
    assert!(sd.in_order() && rd.in_order(), "{what}: pieces out of order");
}

/// Active messages of every size with generic data; the handler takes eager data as bytes and
/// a rendezvous message into a generic destination.
fn am_round(l: &Local, what: &str) {
    let (sd, rd) = (Strided::new(3, 5), Strided::new(4, 9));
    let (sdt, rdt) = (sd.datatype(), rd.datatype());
    type Got = Arc<Mutex<Vec<(usize, Vec<u8>, Option<ucp::AmRndv>)>>>;
    let got: Got = Arc::default();
    let g = got.clone();
    l.b.set_am_recv_handler(
        11,
        Some(move |m: &mut AmMsg<'_>| {
            let rndv = m.is_rndv().then(|| m.take_rndv().expect("descriptor"));
            let data = if rndv.is_some() { Vec::new() } else { m.data().to_vec() };
            g.lock().unwrap().push((m.length(), data, rndv));
        }),
        AmHandlerFlags::WHOLE_MSG,
    )
    .unwrap();
    for &n in SIZES {
        let data = pattern(n, 3 + n as u64);
        let src = sd.scatter(&data);
        // SAFETY: `src` and the header outlive the send (waited for).
        let s = unsafe {
            l.ab.am_send_nbx(
                11,
                b"hdr",
                SendData::Generic(&GenericBuf::send(&sdt, src.as_ptr(), n)),
                AmSendFlags::empty(),
                RequestParam::new(),
            )
        };
        l.wait_until(|| !got.lock().unwrap().is_empty());
        let (len, bytes, rndv) = got.lock().unwrap().pop().unwrap();
        assert_eq!(len, n, "{what}: AM length");
        match rndv {
            None => assert_eq!(bytes, data, "{what}: eager AM of {n}"),
            Some(d) => {
                let mut dst = vec![0xeeu8; rd.span(n)];
                // SAFETY: `dst` outlives the receive (waited for).
                let r = unsafe {
                    l.b.am_recv_data_nbx(
                        d,
                        RecvData::Generic(&GenericBuf::recv(&rdt, dst.as_mut_ptr(), n)),
                        RequestParam::new(),
                    )
                }
                .unwrap();
                l.wait_until(|| r.is_completed());
                assert_eq!(r.status(), Status::Ok, "{what}: rendezvous AM of {n}");
                assert_eq!(rd.gather(&dst, n), data, "{what}: rendezvous AM of {n} scattered");
                assert!(rd.gaps_untouched(&dst, n));
            }
        }
        assert_eq!(l.outcome(s), Status::Ok, "{what}: AM send of {n}");
    }
    assert_eq!(sd.finished(), SIZES.len(), "{what}: AM sends finished");
    assert!(sd.in_order() && rd.in_order());
    l.b.set_am_recv_handler::<fn(&mut AmMsg<'_>)>(11, None, AmHandlerFlags::empty()).unwrap();
}

/// The endpoint `b`'s stream bytes from `a` arrive on.
fn stream_ep(l: &Local) -> Endpoint {
    // A probe byte finds it (`stream_poll`); over `self` it is the endpoint itself.
    let probe = [0x5au8];
    // SAFETY: `probe` outlives the send (waited for).
    assert_eq!(l.outcome(unsafe { l.ab.stream_send_nbx(SendData::Contig(&probe), RequestParam::new()) }), Status::Ok);
    let t = Instant::now();
    let ep = loop {
        l.progress();
        if let Some(e) = l.b.stream_poll(4).unwrap().into_iter().next() {
            break e;
        }
        assert!(t.elapsed() < TIMEOUT, "no stream data");
    };
    let mut one = [0u8; 1];
    // SAFETY: `one` outlives the receive (waited for).
    let r = l.recv_outcome(unsafe {
        ep.stream_recv_nbx(RecvData::Contig(&mut one), StreamRecvFlags::empty(), RequestParam::new())
    });
    assert_eq!((r, one), ((Status::Ok, 1), probe));
    ep
}

/// Stream sends with generic data, received whole (`WAITALL`) into generic destinations.
fn stream_round(l: &Local, what: &str) {
    let ba = stream_ep(l);
    let (sd, rd) = (Strided::new(3, 5), Strided::new(4, 9));
    let (sdt, rdt) = (sd.datatype(), rd.datatype());
    for &n in SIZES.iter().filter(|&&n| n > 0) {
        let data = pattern(n, 5 + n as u64);
        let src = sd.scatter(&data);
        let mut dst = vec![0xeeu8; rd.span(n)];
        // SAFETY: `dst` outlives the receive (waited for below).
        let recv = unsafe {
            ba.stream_recv_nbx(
                RecvData::Generic(&GenericBuf::recv(&rdt, dst.as_mut_ptr(), n)),
                StreamRecvFlags::WAITALL,
                RequestParam::new(),
            )
        };
        // SAFETY: `src` outlives the send (waited for).
        let s = l.outcome(unsafe {
            l.ab.stream_send_nbx(SendData::Generic(&GenericBuf::send(&sdt, src.as_ptr(), n)), RequestParam::new())
        });
        assert_eq!(s, Status::Ok, "{what}: stream send of {n}");
        assert_eq!(l.recv_outcome(recv), (Status::Ok, n), "{what}: stream receive of {n}");
        assert_eq!(rd.gather(&dst, n), data, "{what}: stream {n} scattered");
        assert!(rd.gaps_untouched(&dst, n));
    }
    let sends = SIZES.iter().filter(|&&n| n > 0).count();
    assert_eq!((sd.finished(), rd.finished()), (sends, sends), "{what}: stream states finished");
    assert!(sd.in_order() && rd.in_order());
}

#[test]
fn generic_datatypes_in_one_process_over_self_and_posix() {
    let _g = serial();
    for tls in ["self", "posix"] {
        for (name, cfg) in CONFIGS {
            let l = Local::new(tls, cfg);
            let what = format!("{tls}, {name}");
            tag_round(&l, &what);
            am_round(&l, &what);
            stream_round(&l, &what);
            // Rendezvous of generic data by fragments only (the schemes that would read or
            // write the buffer in place do not apply), multi-fragment eager below it.
            let (ca, cb) = (l.a.proto_counts(), l.b.proto_counts());
            let c = if tls == "self" { ca } else { ucp::ProtoCounts { rndv_am: cb.rndv_am, ..ca } };
            let rndv = name.starts_with("rndv");
            assert!((c.rndv_am > 0 || !rndv) && c.eager_multi > 0 && c.eager_bcopy > 0, "{what}: {c:?}");
            assert_eq!((ca.rndv_get + cb.rndv_get, ca.rndv_put + cb.rndv_put), (0, 0), "{what}");
        }
    }
}

/// Callbacks that fail: a start fails the call at once; a pack error fails the send while the
/// message still arrives whole (zeros where the piece failed) and the next one is intact; an
/// unpack error fails the receive and the next message is intact; a generic receive shorter
/// than the message is truncated; remote memory access refuses generic datatypes.
#[test]
fn failing_callbacks_fail_their_requests_and_nothing_else() {
    let _g = serial();
    for (tls, cfg) in [("self", &[][..]), ("posix", &[("RNDV_THRESH", "4096"), ("RNDV_SCHEME", "am")][..])] {
        let l = Local::new(tls, cfg);
        for n in [100usize, 20_000, 200_000] {
            let data = pattern(n, 1);
            // Start errors.
            let mut bad = Strided::new(2, 3);
            bad.fail_start = true;
            let bdt = bad.datatype();
            let src = bad.scatter(&data);
            // SAFETY: refused before anything is sent.
            let r = unsafe {
                l.ab.tag_send_nbx(SendData::Generic(&GenericBuf::send(&bdt, src.as_ptr(), n)), 1, RequestParam::new())
            };
            assert_eq!(r.err(), Some(Status::Rejected), "{tls}: start_pack error");
            let mut dst = vec![0u8; bad.span(n)];
            // SAFETY: refused before anything is received.
            let r = unsafe { l.recv_generic(&bdt, &mut dst, n, 1) };
            assert_eq!(r.err(), Some(Status::Rejected), "{tls}: start_unpack error");

            // A pack error in the middle of the message.
            let fail = Strided::new(2, 3).failing_at(n / 2);
            let fdt = fail.datatype();
            let src = fail.scatter(&data);
            let mut flat = vec![0xeeu8; n];
            // SAFETY: `flat` outlives the receive (waited for).
            let recv = unsafe { l.b.tag_recv_nbx(RecvData::Contig(&mut flat), 2, FULL_MASK, RequestParam::new()) };
            // SAFETY: `src` outlives the send (waited for).
            let s = l.outcome(unsafe {
                l.ab.tag_send_nbx(SendData::Generic(&GenericBuf::send(&fdt, src.as_ptr(), n)), 2, RequestParam::new())
            });
            assert_eq!(s, Status::NoMemory, "{tls} {n}: the send reports the pack error");
            assert_eq!(l.recv_outcome(recv), (Status::Ok, n), "{tls} {n}: the message arrives whole");
            sc::check_zeroed_piece(&flat, &data, n / 2).unwrap_or_else(|e| panic!("{tls} {n}: {e}"));
            assert_eq!(fail.finished(), 1);

            // An unpack error: the receive fails, the next message is intact.
            let fail = Strided::new(4, 9).failing_at(n / 3);
            let (fdt, good) = (fail.datatype(), Strided::new(4, 9));
            let gdt = good.datatype();
            let mut d1 = vec![0xeeu8; fail.span(n)];
            let mut d2 = vec![0xeeu8; good.span(n)];
            // SAFETY: both destinations outlive their receives (waited for).
            let (r1, r2) = unsafe { (l.recv_generic(&fdt, &mut d1, n, 3), l.recv_generic(&gdt, &mut d2, n, 3)) };
            for _ in 0..2 {
                // SAFETY: `data` outlives the send (waited for).
                let s = l.outcome(unsafe { l.ab.tag_send_nbx(SendData::Contig(&data), 3, RequestParam::new()) });
                assert_eq!(s, Status::Ok);
            }
            assert_eq!(l.recv_outcome(r1).0, Status::NoMemory, "{tls} {n}: the receive reports the unpack error");
            assert_eq!(l.recv_outcome(r2), (Status::Ok, n), "{tls} {n}: the next message");
            assert_eq!(good.gather(&d2, n), data);
            assert_eq!((fail.finished(), good.finished()), (1, 1));

            // Truncation: a generic receive of fewer bytes than the message.
            let short = Strided::new(4, 9);
            let sdt = short.datatype();
            let mut d = vec![0xeeu8; short.span(n / 2)];
            // SAFETY: `d` outlives the receive (waited for).
            let r = unsafe { l.recv_generic(&sdt, &mut d, n / 2, 4) };
            // SAFETY: `data` outlives the send (waited for).
            let s = l.outcome(unsafe { l.ab.tag_send_nbx(SendData::Contig(&data), 4, RequestParam::new()) });
            assert_eq!((s, l.recv_outcome(r).0), (Status::Ok, Status::MessageTruncated), "{tls} {n}: truncation");
            assert_eq!(short.finished(), 1);
        }
        // Stream: an unpack error fails that receive; the bytes after it are intact.
        let ba = stream_ep(&l);
        let data = pattern(30_000, 9);
        let fail = Strided::new(4, 9).failing_at(100);
        let fdt = fail.datatype();
        let mut d1 = vec![0xeeu8; fail.span(10_000)];
        let mut d2 = vec![0u8; 20_000];
        // SAFETY: both destinations outlive their receives (waited for).
        let (r1, r2) = unsafe {
            (
                ba.stream_recv_nbx(
                    RecvData::Generic(&GenericBuf::recv(&fdt, d1.as_mut_ptr(), 10_000)),
                    StreamRecvFlags::WAITALL,
                    RequestParam::new(),
                ),
                ba.stream_recv_nbx(RecvData::Contig(&mut d2), StreamRecvFlags::WAITALL, RequestParam::new()),
            )
        };
        // SAFETY: `data` outlives the send (waited for).
        let s = unsafe { l.ab.stream_send_nbx(SendData::Contig(&data), RequestParam::new()) };
        assert_eq!(l.outcome(s), Status::Ok);
        assert_eq!(l.recv_outcome(r1).0, Status::NoMemory, "{tls}: stream unpack error");
        assert_eq!(l.recv_outcome(r2), (Status::Ok, 20_000));
        assert_eq!(d2, data[10_000..], "{tls}: the stream goes on after the failed receive");
    }
    // Remote memory access takes contiguous and iov data only.
    let l = Local::new("self", &[]);
    let mut mem = vec![0u8; 64];
    // SAFETY: `mem` outlives the mapping (unmapped below).
    let h = unsafe { l.a.mem_map(mem.as_mut_ptr(), mem.len()) }.unwrap();
    let packed = l.a.rkey_pack(&h).unwrap();
    let rkey = l.ab.rkey_unpack(&packed).unwrap();
    let s = Strided::new(1, 1);
    let dt = s.datatype();
    // SAFETY: refused before any access.
    let r = unsafe {
        l.ab.put_nbx(
            SendData::Generic(&GenericBuf::send(&dt, mem.as_ptr(), 8)),
            rkey.address(),
            &rkey,
            RequestParam::new(),
        )
    };
    assert_eq!(r.err(), Some(Status::Unsupported));
    drop(rkey);
    l.a.mem_unmap(h).unwrap();
}

#[test]
fn generic_datatypes_across_processes_over_shared_memory() {
    let _g = serial();
    for tls in ["posix,cma", "sysv"] {
        for (name, cfg) in CONFIGS {
            let w = sc::worker(tls, cfg);
            let mut p = GenPeer::spawn(&w, tls, cfg);
            sc::round_trips(&w, &mut p, &format!("{tls}, {name}"));
            sc::failing_callbacks(&w, &mut p, &format!("{tls}, {name}"));
            p.finish(&w);
        }
    }
}
