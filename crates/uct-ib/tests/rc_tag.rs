//! `rc_verbs` with tag matching on (`UCX_RC_TM_ENABLE=y`; emulated: the device model matches in
//! software, the data moves by real SENDs and RDMA READs): unexpected and expected eager
//! messages, immediate values, truncation, rendezvous read by the receiving side with its FIN,
//! rendezvous too large for the posted buffer, software rendezvous requests, cancels, limits,
//! wildcards, a receive posted behind software's unexpected count, the active-message prefix,
//! and reachability against an interface without tag matching. Needs an RDMA device: run with
//! `tools/rdma-vm/test`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucs::{Outcome, Status};
use uct::{
    AmRecv, Completion, Component, Ep, EpParams, Iface, IfaceFlags, IfaceParams, Iov, Md, MemAccess, MemH,
    ProgressFlags, SendFlags, TagHandlers, TagRecvContext, Worker,
};
use uct_ib::rc::RcIface;
use uct_ib::IbMd;

const SEC: Duration = Duration::from_secs(1);
const RTAG: u64 = 0x0123_4567_89ab_cdef;

fn device() -> Option<(Rc<IbMd>, u8)> {
    if !uct_ib::testing::rdma_available() {
        return None;
    }
    let r = uct::query_resources().into_iter().find(|r| r.tl.tl_name == "rc_verbs").expect("an rc_verbs resource");
    let (dev, port) = r.tl.dev_name.rsplit_once(':').expect("dev:port");
    Some((IbMd::open(dev).expect("open the ib memory domain"), port.parse().expect("port number")))
}

/// What the unexpected handlers saw.
#[derive(Debug, Clone, PartialEq)]
enum Unexp {
    Eager { stag: u64, imm: u64, data: Vec<u8> },
    Rndv { stag: u64, header: Vec<u8>, remote_addr: u64, length: usize, rkey: Vec<u8> },
}

type Log<T> = Rc<RefCell<Vec<T>>>;

/// What a posted receive's callbacks saw.
#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Consumed,
    Completed { tag: u64, imm: u64, len: usize, status: Status },
    Rndv { tag: u64, header: Vec<u8>, status: Status },
}

/// Run by the eager handler after it logged a message (to act from inside it).
type Hook = Rc<RefCell<Option<Box<dyn FnMut()>>>>;

struct Side {
    iface: Rc<RcIface>,
    unexp: Log<Unexp>,
    hook: Hook,
}

fn open(md: &IbMd, port: u8, worker: &Worker, tm: bool, config: &[(&str, &str)]) -> Side {
    let mut params = IfaceParams::new("rc_verbs", &format!("{}:{port}", md.dev.name))
        .with_config("TM_ENABLE", if tm { "y" } else { "n" })
        .with_config("RX_QUEUE_LEN", "128");
    for (k, v) in config {
        params = params.with_config(k, v);
    }
    let unexp: Log<Unexp> = Rc::default();
    let hook: Hook = Rc::default();
    let (u1, u2, h) = (unexp.clone(), unexp.clone(), hook.clone());
    params.tag_handlers = Some(TagHandlers {
        eager: Rc::new(move |m| {
            u1.borrow_mut().push(Unexp::Eager { stag: m.stag, imm: m.imm, data: m.msg.data().to_vec() });
            let f = h.borrow_mut().take();
            if let Some(mut f) = f {
                f();
            }
        }),
        rndv: Rc::new(move |m| {
            u2.borrow_mut().push(Unexp::Rndv {
                stag: m.stag,
                header: m.header.to_vec(),
                remote_addr: m.remote_addr,
                length: m.length,
                rkey: m.rkey_buf.to_vec(),
            });
        }),
    });
    let iface = Rc::new(RcIface::open(md, port, worker, &params).expect("open rc_verbs"));
    iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    Side { iface, unexp, hook }
}

/// Endpoints a -> b and b -> a, connected.
fn connect(a: &RcIface, b: &RcIface) -> (Box<dyn Ep>, Box<dyn Ep>) {
    let ab = a.ep_create(&EpParams::to_ep()).expect("ep a->b");
    let ba = b.ep_create(&EpParams::to_ep()).expect("ep b->a");
    ab.connect_to_ep(&b.device_address(), &ba.address().unwrap()).expect("connect a->b");
    ba.connect_to_ep(&a.device_address(), &ab.address().unwrap()).expect("connect b->a");
    (ab, ba)
}

fn wait(worker: &Worker, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        worker.progress();
        assert!(start.elapsed() < 10 * SEC, "timed out waiting for {what}");
    }
}

/// Progresses a while (for things that must not happen).
fn settle(worker: &Worker) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(100) {
        worker.progress();
    }
}

/// A receive context whose callbacks log into `log`.
fn ctx(log: &Log<Ev>) -> Rc<TagRecvContext> {
    let (l1, l2, l3) = (log.clone(), log.clone(), log.clone());
    Rc::new(TagRecvContext {
        tag_consumed: Box::new(move || l1.borrow_mut().push(Ev::Consumed)),
        completed: Box::new(move |tag, imm, len, status| l2.borrow_mut().push(Ev::Completed { tag, imm, len, status })),
        rndv: Box::new(move |tag, header, status| {
            l3.borrow_mut().push(Ev::Rndv { tag, header: header.to_vec(), status })
        }),
    })
}

/// A registered buffer of `len` bytes filled with `fill`.
struct Buf {
    mem: Vec<u8>,
    memh: MemH,
}

fn buf(md: &IbMd, len: usize, fill: u8) -> Buf {
    let mut mem = vec![fill; len.max(1)];
    // SAFETY: `mem` outlives the registration (dropped after `memh` in `Buf`'s users: both
    // live to the end of the test, and the memory is not reallocated).
    let memh = unsafe { md.mem_reg(mem.as_mut_ptr(), mem.len(), MemAccess::ALL).expect("mem_reg") };
    Buf { mem, memh }
}

impl Buf {
    fn iov(&mut self, len: usize) -> [Iov<'_>; 1] {
        [Iov::new(self.mem.as_mut_ptr(), len, Some(&self.memh))]
    }

    /// The bytes, read without a reference held across progress.
    fn bytes(&self, len: usize) -> Vec<u8> {
        // SAFETY: within the buffer; read after the transfer completed.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr(), len).to_vec() }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Sends `data` tagged `tag` as eager bcopy with `imm`.
fn eager_bcopy(worker: &Worker, ep: &dyn Ep, tag: u64, imm: u64, data: &[u8]) {
    wait(worker, "eager bcopy send", || {
        match ep.tag_eager_bcopy(
            tag,
            imm,
            &mut |d: &mut [u8]| {
                d[..data.len()].copy_from_slice(data);
                data.len()
            },
            SendFlags::empty(),
        ) {
            Ok(Outcome::Done(n)) => {
                assert_eq!(n, data.len());
                true
            }
            Ok(_) => false,
            Err(e) => panic!("tag_eager_bcopy: {e}"),
        }
    });
}

#[test]
fn capabilities_reachability_and_active_messages() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let a = open(&md, port, &worker, true, &[]);
    let b = open(&md, port, &worker, true, &[]);
    let plain = open(&md, port, &worker, false, &[]);
    let attr = a.iface.attr();
    assert!(attr
        .flags
        .contains(IfaceFlags::TAG_EAGER_BCOPY | IfaceFlags::TAG_EAGER_ZCOPY | IfaceFlags::TAG_RNDV_ZCOPY));
    assert!(!plain.iface.attr().flags.intersects(IfaceFlags::TAG_EAGER_BCOPY | IfaceFlags::TAG_RNDV_ZCOPY));
    assert_eq!(attr.tag.recv_max_iov, 1);
    assert_eq!(attr.tag.recv_max_outstanding, 64, "the emulated device's 64 tags (TM_LIST_SIZE 1024 caps more)");
    assert_eq!(attr.tag.eager.max_bcopy, (48 << 10) - 16, "TM_SEG_SIZE less the TMH");
    assert_eq!(attr.tag.rndv.max_hdr, 32);
    assert!(attr.tag.emulated, "labelled emulated");
    // One byte of prefix (the bcopy segment is TM_SEG_SIZE with tag matching on).
    assert_eq!(attr.am.max_bcopy, (48 << 10) - 2);
    assert_eq!(attr.am.max_short + 1, plain.iface.attr().am.max_short);

    // With and without tag matching do not mix (the active messages' formats differ).
    assert!(a.iface.is_reachable(&b.iface.device_address(), None));
    assert!(!a.iface.is_reachable(&plain.iface.device_address(), None));
    assert!(!plain.iface.is_reachable(&a.iface.device_address(), None));
    let x = a.iface.ep_create(&EpParams::to_ep()).unwrap();
    let y = plain.iface.ep_create(&EpParams::to_ep()).unwrap();
    assert_eq!(x.connect_to_ep(&plain.iface.device_address(), &y.address().unwrap()), Err(Status::Unreachable));
    // Tag operations need tag matching.
    assert_eq!(y.tag_eager_short(1, b"x"), Err(Status::Unsupported));

    // Active messages go through the device untouched (the NO_TAG prefix): every size.
    let (ab, _ba) = connect(&a.iface, &b.iface);
    let got: Log<Vec<u8>> = Rc::default();
    let g = got.clone();
    b.iface.set_am_handler(3, Some(Rc::new(move |m: AmRecv<'_>| g.borrow_mut().push(m.data().to_vec())))).unwrap();
    let big = pattern(attr.am.max_bcopy, 9);
    wait(&worker, "am_short", || ab.am_short(3, 0x0102_0304_0506_0708, b"abc") == Ok(Outcome::Done(())));
    wait(&worker, "am_bcopy", || {
        matches!(
            ab.am_bcopy(
                3,
                &mut |d: &mut [u8]| {
                    d[..big.len()].copy_from_slice(&big);
                    big.len()
                },
                SendFlags::empty()
            ),
            Ok(Outcome::Done(_))
        )
    });
    wait(&worker, "two active messages", || got.borrow().len() == 2);
    let got = got.borrow();
    assert_eq!(got[0], [&0x0102_0304_0506_0708u64.to_le_bytes()[..], b"abc"].concat());
    assert_eq!(got[1], big);
    assert!(b.unexp.borrow().is_empty(), "active messages are not tagged messages");
}

#[test]
fn unexpected_eager_with_immediate_values() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let a = open(&md, port, &worker, true, &[]);
    let b = open(&md, port, &worker, true, &[]);
    let (ab, _ba) = connect(&a.iface, &b.iface);
    let max = a.iface.attr().tag.eager.max_bcopy;
    wait(&worker, "eager short", || ab.tag_eager_short(0x11, b"short") == Ok(Outcome::Done(())));
    eager_bcopy(&worker, &*ab, 0x22, 0, b"no imm");
    eager_bcopy(&worker, &*ab, 0x33, 0x1234_5678_9abc_def0, b"imm");
    eager_bcopy(&worker, &*ab, 0x44, 7, b"low imm");
    eager_bcopy(&worker, &*ab, 0x55, 9 << 32, b"high imm");
    let full = pattern(max, 3);
    eager_bcopy(&worker, &*ab, 0x66, 0, &full);
    wait(&worker, "six unexpected messages", || b.unexp.borrow().len() == 6);
    let u = b.unexp.borrow();
    let e = |stag, imm, data: &[u8]| Unexp::Eager { stag, imm, data: data.to_vec() };
    assert_eq!(u[0], e(0x11, 0, b"short"));
    assert_eq!(u[1], e(0x22, 0, b"no imm"));
    assert_eq!(u[2], e(0x33, 0x1234_5678_9abc_def0, b"imm"));
    assert_eq!(u[3], e(0x44, 7, b"low imm"));
    assert_eq!(u[4], e(0x55, 9 << 32, b"high imm"));
    assert_eq!(u[5], e(0x66, 0, &full));
    let st = b.iface.tm_stats().unwrap();
    assert_eq!((st.rx_unexp_eager, st.rx_exp, st.tx_add_op), (6, 0, 0));
    // Beyond the limits: refused at the sender.
    assert_eq!(ab.tag_eager_short(1, &vec![0; a.iface.attr().tag.eager.max_short + 1]), Err(Status::InvalidParam));
}

#[test]
fn expected_eager_placed_in_the_posted_buffer() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let a = open(&md, port, &worker, true, &[]);
    let b = open(&md, port, &worker, true, &[]);
    let (ab, _ba) = connect(&a.iface, &b.iface);
    let log: Log<Ev> = Rc::default();
    let mut rbuf = buf(&md, 4096, 0xee);
    let data = pattern(3000, 1);
    // SAFETY: `rbuf` lives to the end of the test.
    unsafe { b.iface.tag_recv_zcopy(0xabc, u64::MAX, &rbuf.iov(4096), ctx(&log)).unwrap() };
    eager_bcopy(&worker, &*ab, 0xabc, 0x5_0000_0006, &data);
    wait(&worker, "completion", || log.borrow().len() == 2);
    assert_eq!(
        *log.borrow(),
        vec![Ev::Consumed, Ev::Completed { tag: 0xabc, imm: 0x5_0000_0006, len: 3000, status: Status::Ok }]
    );
    assert_eq!(rbuf.bytes(3000), data);
    assert_eq!(rbuf.bytes(3001)[3000], 0xee, "nothing past the message");
    assert!(b.unexp.borrow().is_empty());

    // A wildcard mask (the low byte free) and eager zcopy from registered memory.
    log.borrow_mut().clear();
    let mut sbuf = buf(&md, 1000, 0);
    sbuf.mem.copy_from_slice(&pattern(1000, 7));
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(0x5500, !0xff, &rbuf.iov(4096), ctx(&log)).unwrap() };
    let comp = Completion::new(1, |_| {});
    let siov = sbuf.iov(1000);
    wait(&worker, "eager zcopy", || {
        // SAFETY: `sbuf` lives until the completion (waited for below).
        match unsafe { ab.tag_eager_zcopy(0x55aa, 0, &siov, SendFlags::empty(), Some(&comp)) } {
            Ok(Outcome::InProgress) => true,
            Ok(Outcome::NoResource) => false,
            r => panic!("tag_eager_zcopy: {r:?}"),
        }
    });
    wait(&worker, "zcopy completion", || log.borrow().len() == 2 && comp.count() == 0);
    assert_eq!(log.borrow()[1], Ev::Completed { tag: 0x55aa, imm: 0, len: 1000, status: Status::Ok });
    assert_eq!(rbuf.bytes(1000), pattern(1000, 7));

    // Too long for the posted buffer: truncated to it.
    log.borrow_mut().clear();
    let mut small = buf(&md, 100, 0);
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(0x77, u64::MAX, &small.iov(100), ctx(&log)).unwrap() };
    eager_bcopy(&worker, &*ab, 0x77, 0, &data);
    wait(&worker, "truncation", || log.borrow().len() == 2);
    assert_eq!(log.borrow()[1], Ev::Completed { tag: 0x77, imm: 0, len: 100, status: Status::MessageTruncated });
    assert_eq!(small.bytes(100), data[..100]);

    // Matching in posting order: two receives for one tag, two messages.
    let (l1, l2): (Log<Ev>, Log<Ev>) = (Rc::default(), Rc::default());
    let (mut r1, mut r2) = (buf(&md, 64, 0), buf(&md, 64, 0));
    // SAFETY: as above.
    unsafe {
        b.iface.tag_recv_zcopy(9, u64::MAX, &r1.iov(64), ctx(&l1)).unwrap();
        b.iface.tag_recv_zcopy(9, u64::MAX, &r2.iov(64), ctx(&l2)).unwrap();
    }
    eager_bcopy(&worker, &*ab, 9, 0, b"first");
    eager_bcopy(&worker, &*ab, 9, 0, b"second");
    wait(&worker, "both", || l1.borrow().len() == 2 && l2.borrow().len() == 2);
    assert_eq!(r1.bytes(5), b"first");
    assert_eq!(r2.bytes(6), b"second");
    let st = b.iface.tm_stats().unwrap();
    assert_eq!((st.rx_exp, st.tx_add_op, st.rx_unexp_eager), (5, 5, 0));
}

#[test]
fn rendezvous_read_by_the_receiver_then_fin() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let a = open(&md, port, &worker, true, &[]);
    let b = open(&md, port, &worker, true, &[]);
    let (ab, _ba) = connect(&a.iface, &b.iface);
    let len = 1 << 20;
    let mut sbuf = buf(&md, len, 0);
    sbuf.mem.copy_from_slice(&pattern(len, 5));
    let mut rbuf = buf(&md, len, 0);
    let send_addr = sbuf.mem.as_ptr() as u64;

    // Expected: the receiver's device reads, then sends the FIN that completes the sender.
    let log: Log<Ev> = Rc::default();
    // SAFETY: `rbuf` lives to the end of the test.
    unsafe { b.iface.tag_recv_zcopy(RTAG, u64::MAX, &rbuf.iov(len), ctx(&log)).unwrap() };
    let sent = Rc::new(RefCell::new(None));
    let s2 = sent.clone();
    let comp = Completion::new(1, move |st| *s2.borrow_mut() = Some(st));
    let siov = sbuf.iov(len);
    // SAFETY: `sbuf` lives until the completion.
    let op = unsafe { ab.tag_rndv_zcopy(RTAG, b"hdr", &siov, SendFlags::empty(), Some(&comp)) };
    assert!(matches!(op, Ok(Outcome::Done(_))), "{op:?}");
    wait(&worker, "receive and FIN", || log.borrow().len() == 2 && sent.borrow().is_some());
    assert_eq!(*log.borrow(), vec![Ev::Consumed, Ev::Completed { tag: RTAG, imm: 0, len, status: Status::Ok }]);
    assert_eq!(*sent.borrow(), Some(Status::Ok));
    assert!(rbuf.bytes(len) == pattern(len, 5), "the read data differs");

    // Unexpected: the handler gets the header, address, length and a key that unpacks.
    let comp2 = Completion::new(1, |_| panic!("a cancelled rendezvous completed"));
    // SAFETY: as above.
    let op = unsafe { ab.tag_rndv_zcopy(0x99, b"late", &siov, SendFlags::empty(), Some(&comp2)) };
    let Ok(Outcome::Done(op)) = op else { panic!("{op:?}") };
    wait(&worker, "unexpected rendezvous", || b.unexp.borrow().len() == 1);
    let Unexp::Rndv { stag, header, remote_addr, length, rkey } = b.unexp.borrow()[0].clone() else { panic!() };
    assert_eq!((stag, header.as_slice(), remote_addr, length), (0x99, &b"late"[..], send_addr, len));
    let key = uct_ib::COMPONENT.rkey_unpack(&rkey).expect("the rendezvous key unpacks");
    assert_eq!(key.base(), remote_addr);
    // Software finishes it; the sender forgets the offloaded operation (no completion).
    ab.tag_rndv_cancel(op).unwrap();
    assert_eq!(ab.tag_rndv_cancel(op), Err(Status::NoElem));
    settle(&worker);

    // Larger than the posted buffer: software takes over with the user's header.
    let log3: Log<Ev> = Rc::default();
    let mut small = buf(&md, 4096, 0);
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(0x5, u64::MAX, &small.iov(4096), ctx(&log3)).unwrap() };
    let comp3 = Completion::new(1, |_| {});
    // SAFETY: as above.
    let op = unsafe { ab.tag_rndv_zcopy(0x5, b"too big", &siov, SendFlags::empty(), Some(&comp3)) };
    let Ok(Outcome::Done(op)) = op else { panic!("{op:?}") };
    wait(&worker, "incomplete rendezvous", || log3.borrow().len() == 2);
    assert_eq!(log3.borrow()[1], Ev::Rndv { tag: 0x5, header: b"too big".to_vec(), status: Status::Ok });
    ab.tag_rndv_cancel(op).unwrap();
    // Into a buffer shorter than the request's headers: the user header still comes whole.
    let log6: Log<Ev> = Rc::default();
    let mut tiny6 = buf(&md, 8, 0);
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(0xa, u64::MAX, &tiny6.iov(8), ctx(&log6)).unwrap() };
    let comp6 = Completion::new(1, |_| {});
    // SAFETY: as above.
    let op = unsafe { ab.tag_rndv_zcopy(0xa, b"header, whole", &siov, SendFlags::empty(), Some(&comp6)) };
    let Ok(Outcome::Done(op)) = op else { panic!("{op:?}") };
    wait(&worker, "incomplete rendezvous into 8 bytes", || log6.borrow().len() == 2);
    assert_eq!(log6.borrow()[1], Ev::Rndv { tag: 0xa, header: b"header, whole".to_vec(), status: Status::Ok });
    ab.tag_rndv_cancel(op).unwrap();

    // A software rendezvous request: expected, then unexpected.
    let log4: Log<Ev> = Rc::default();
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(0x6, u64::MAX, &small.iov(4096), ctx(&log4)).unwrap() };
    wait(&worker, "rndv request", || ab.tag_rndv_request(0x6, b"sw-rts", SendFlags::empty()) == Ok(Outcome::Done(())));
    wait(&worker, "expected request", || log4.borrow().len() == 2);
    assert_eq!(log4.borrow()[1], Ev::Rndv { tag: 0x6, header: b"sw-rts".to_vec(), status: Status::Ok });
    wait(&worker, "rndv request", || ab.tag_rndv_request(0x7, b"sw-rts2", SendFlags::empty()) == Ok(Outcome::Done(())));
    wait(&worker, "unexpected request", || b.unexp.borrow().len() == 2);
    assert_eq!(
        b.unexp.borrow()[1],
        Unexp::Rndv { stag: 0x7, header: b"sw-rts2".to_vec(), remote_addr: 0, length: 0, rkey: vec![] }
    );
    // A request longer than the posted buffer: software still gets the whole header.
    let log5: Log<Ev> = Rc::default();
    let mut tiny = buf(&md, 4, 0);
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(0x9, u64::MAX, &tiny.iov(4), ctx(&log5)).unwrap() };
    wait(&worker, "rndv request", || {
        ab.tag_rndv_request(0x9, b"longer than four", SendFlags::empty()) == Ok(Outcome::Done(()))
    });
    wait(&worker, "expected request into a short buffer", || log5.borrow().len() == 2);
    assert_eq!(log5.borrow()[1], Ev::Rndv { tag: 0x9, header: b"longer than four".to_vec(), status: Status::Ok });
    // A request header larger than an inline send (UCP's RTS with a key): from a buffer.
    let big = pattern(2000, 4);
    wait(&worker, "large rndv request", || ab.tag_rndv_request(0x8, &big, SendFlags::empty()) == Ok(Outcome::Done(())));
    wait(&worker, "large request", || b.unexp.borrow().len() == 3);
    assert_eq!(b.unexp.borrow()[2], Unexp::Rndv { stag: 0x8, header: big, remote_addr: 0, length: 0, rkey: vec![] });
    let (sa, sb) = (a.iface.tm_stats().unwrap(), b.iface.tm_stats().unwrap());
    assert_eq!(sa.rx_rndv_fin, 1);
    assert_eq!((sb.rx_exp, sb.rx_unexp_rndv, sb.rx_exp_rndv_req, sb.rx_unexp_rndv_req), (5, 1, 2, 2));
}

#[test]
fn cancel_limits_and_the_unexpected_count() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let a = open(&md, port, &worker, true, &[]);
    let b = open(&md, port, &worker, true, &[("TM_LIST_SIZE", "4")]);
    let (ab, _ba) = connect(&a.iface, &b.iface);
    let mut bufs: Vec<Buf> = (0..6).map(|_| buf(&md, 256, 0)).collect();
    let logs: Vec<Log<Ev>> = (0..6).map(|_| Rc::default()).collect();
    let ctxs: Vec<Rc<TagRecvContext>> = logs.iter().map(ctx).collect();

    // Cancel without force: completes with Canceled from progress, not inside the call.
    // SAFETY: the buffers live to the end of the test.
    unsafe { b.iface.tag_recv_zcopy(1, u64::MAX, &bufs[0].iov(256), ctxs[0].clone()).unwrap() };
    b.iface.tag_recv_cancel(&ctxs[0], false).unwrap();
    assert!(logs[0].borrow().is_empty(), "a completion inside tag_recv_cancel");
    wait(&worker, "cancel completion", || !logs[0].borrow().is_empty());
    assert_eq!(*logs[0].borrow(), vec![Ev::Completed { tag: 0, imm: 0, len: 0, status: Status::Canceled }]);
    // The cancelled receive is gone: its tag arrives unexpected.
    eager_bcopy(&worker, &*ab, 1, 0, b"after cancel");
    wait(&worker, "unexpected", || b.unexp.borrow().len() == 1);
    settle(&worker);
    assert_eq!(logs[0].borrow().len(), 1, "completed twice");

    // Forced: no callback at all.
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(2, u64::MAX, &bufs[1].iov(256), ctxs[1].clone()).unwrap() };
    b.iface.tag_recv_cancel(&ctxs[1], true).unwrap();
    assert_eq!(b.iface.tag_recv_cancel(&ctxs[1], true), Err(Status::NoElem));
    settle(&worker);
    assert!(logs[1].borrow().is_empty());

    // SAFETY: the buffers live to the end of the test.
    unsafe {
        // The same buffer twice, the same context twice.
        b.iface.tag_recv_zcopy(3, u64::MAX, &bufs[2].iov(256), ctxs[2].clone()).unwrap();
        let again = b.iface.tag_recv_zcopy(3, u64::MAX, &bufs[2].iov(256), ctxs[3].clone());
        assert_eq!(again, Err(Status::AlreadyExists));
        let again = b.iface.tag_recv_zcopy(3, u64::MAX, &bufs[3].iov(256), ctxs[2].clone());
        assert_eq!(again, Err(Status::InvalidParam), "the same context twice");
        // A list of 4: three more fit, the fifth does not.
        for k in 3..6 {
            b.iface.tag_recv_zcopy(10 + k as u64, u64::MAX, &bufs[k].iov(256), ctxs[k].clone()).unwrap();
        }
        let mut extra = buf(&md, 16, 0);
        let l: Log<Ev> = Rc::default();
        assert_eq!(b.iface.tag_recv_zcopy(99, u64::MAX, &extra.iov(16), ctx(&l)), Err(Status::ExceedsLimit));
        // Two iov entries, or no registration: refused.
        let (x, y) = bufs.split_at_mut(1);
        let two = [x[0].iov(8)[0], y[0].iov(8)[0]];
        assert_eq!(b.iface.tag_recv_zcopy(99, u64::MAX, &two, ctx(&l)), Err(Status::InvalidParam));
        let mut raw = [0u8; 8];
        let bare = [Iov::new(raw.as_mut_ptr(), 8, None)];
        assert_eq!(b.iface.tag_recv_zcopy(99, u64::MAX, &bare, ctx(&l)), Err(Status::InvalidParam));
    }
    // A matched receive is gone once completed; one still listed cancels.
    eager_bcopy(&worker, &*ab, 3, 0, b"three");
    wait(&worker, "match", || logs[2].borrow().len() == 2);
    assert_eq!(bufs[2].bytes(5), b"three");
    assert_eq!(b.iface.tag_recv_cancel(&ctxs[2], false), Err(Status::NoElem), "completed and gone");
    for c in &ctxs[3..6] {
        b.iface.tag_recv_cancel(c, true).unwrap();
    }
    settle(&worker);

    // A receive posted before software counted an unexpected message (here: from the handler
    // of that message, before it returns) carries a stale count: the device keeps it disabled
    // until a later list operation reports the current count (none does here), so a message for
    // its tag arrives unexpected. Software must find such receives itself
    // (UCP searches its posted receives for every unexpected message).
    let stale_log: Log<Ev> = Rc::default();
    let stale = ctx(&stale_log);
    let late = Rc::new(RefCell::new(buf(&md, 64, 0)));
    let (iface, late2, stale2) = (b.iface.clone(), late.clone(), stale.clone());
    let ran = Rc::new(Cell::new(false));
    let ran2 = ran.clone();
    *b.hook.borrow_mut() = Some(Box::new(move || {
        let mut lb = late2.borrow_mut();
        // SAFETY: `late` lives to the end of the test.
        unsafe { iface.tag_recv_zcopy(0x42, u64::MAX, &lb.iov(64), stale2.clone()).unwrap() };
        ran2.set(true);
    }));
    let seen = b.unexp.borrow().len();
    eager_bcopy(&worker, &*ab, 0x41, 0, b"trigger");
    wait(&worker, "trigger", || ran.get());
    eager_bcopy(&worker, &*ab, 0x42, 0, b"for the stale receive");
    wait(&worker, "the message for the stale receive", || b.unexp.borrow().len() == seen + 2);
    assert!(stale_log.borrow().is_empty(), "a receive posted with a stale count matched");
    assert!(matches!(&b.unexp.borrow()[seen + 1], Unexp::Eager { stag: 0x42, .. }));
    // Cancelled and posted again, now in step: it matches.
    b.iface.tag_recv_cancel(&stale, true).unwrap();
    let fresh_log: Log<Ev> = Rc::default();
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(0x42, u64::MAX, &late.borrow_mut().iov(64), ctx(&fresh_log)).unwrap() };
    eager_bcopy(&worker, &*ab, 0x42, 0, b"now");
    wait(&worker, "the fresh receive", || fresh_log.borrow().len() == 2);
    assert_eq!(late.borrow().bytes(3), b"now");
    // Receives 0..6 posted (one refused for the same context, one for the full list, after
    // their ADD was taken back: not counted), the stale one and the fresh one; DELs: two
    // cancels, three forced at the end of the limits, the stale one.
    let st = b.iface.tm_stats().unwrap();
    assert_eq!((st.tx_add_op, st.tx_del_op), (8, 6));
}

/// With the emulated device's list operations delayed (`TM_EMU_OP_DELAY`), a receive cancelled
/// with force may still be listed when its message arrives: whatever the device does first, the
/// message reaches software once, as unexpected, and never the cancelled receive.
#[test]
fn delayed_list_operations_lose_no_message() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let a = open(&md, port, &worker, true, &[]);
    let b = open(&md, port, &worker, true, &[("TM_EMU_OP_DELAY", "3")]);
    let (ab, _ba) = connect(&a.iface, &b.iface);
    let mut bufs: Vec<Buf> = (0..20).map(|_| buf(&md, 256, 0)).collect();
    let mut expected_unexp = 0;
    let mut completed = 0;
    for (k, bf) in bufs.iter_mut().enumerate() {
        let tag = 0x100 + k as u64;
        let log: Log<Ev> = Rc::default();
        let c = ctx(&log);
        // SAFETY: the buffers live to the end of the test.
        unsafe { b.iface.tag_recv_zcopy(tag, u64::MAX, &bf.iov(256), c.clone()).unwrap() };
        if k % 2 == 0 {
            // Cancelled at once (its ADD and DEL both still queued, or run later).
            b.iface.tag_recv_cancel(&c, true).unwrap();
            expected_unexp += 1;
        }
        let data = pattern(100, k as u8);
        eager_bcopy(&worker, &*ab, tag, 0, &data);
        if k % 2 == 0 {
            wait(&worker, "the message of a cancelled receive", || b.unexp.borrow().len() == expected_unexp);
            assert!(
                matches!(&b.unexp.borrow()[expected_unexp - 1], Unexp::Eager { stag, data: d, .. } if *stag == tag && *d == data)
            );
            settle(&worker);
            assert!(log.borrow().is_empty(), "a receive cancelled with force was reported: {:?}", log.borrow());
        } else {
            // Kept: it takes the message (listed in time), or the message came first and went
            // to software as unexpected (then the receive is still posted: cancel it).
            wait(&worker, "the message", || log.borrow().len() == 2 || b.unexp.borrow().len() > expected_unexp);
            if log.borrow().len() == 2 {
                completed += 1;
                assert_eq!(bf.bytes(100), data);
            } else {
                expected_unexp += 1;
                b.iface.tag_recv_cancel(&c, true).unwrap();
            }
        }
    }
    settle(&worker);
    assert_eq!(b.unexp.borrow().len(), expected_unexp, "a message was delivered twice or lost");
    eprintln!("{completed} of 10 kept receives matched in the device, {expected_unexp} messages went to software");

    // A cancel, then a forced one while the first's DEL waits: the receive is software's at
    // once; its message goes to software, and neither cancel reports.
    let log: Log<Ev> = Rc::default();
    let c = ctx(&log);
    let mut last = buf(&md, 256, 0);
    // SAFETY: `last` lives to the end of the test.
    unsafe { b.iface.tag_recv_zcopy(0x200, u64::MAX, &last.iov(256), c.clone()).unwrap() };
    b.iface.tag_recv_cancel(&c, false).unwrap();
    b.iface.tag_recv_cancel(&c, true).unwrap();
    eager_bcopy(&worker, &*ab, 0x200, 0, b"after both cancels");
    wait(&worker, "the message", || b.unexp.borrow().len() == expected_unexp + 1);
    settle(&worker);
    assert!(log.borrow().is_empty(), "a cancelled receive reported: {:?}", log.borrow());
    assert_eq!(last.bytes(4), [0, 0, 0, 0], "the cancelled receive's buffer was written");
}

#[test]
fn dead_receiver_fails_the_offloaded_rendezvous() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let fast = [("TIMEOUT", "20ms"), ("RETRY_COUNT", "3")];
    let a = open(&md, port, &worker, true, &fast);
    let b = open(&md, port, &worker, true, &fast);
    let (ab, ba) = connect(&a.iface, &b.iface);
    let mut sbuf = buf(&md, 4096, 1);
    let status: Rc<RefCell<Option<Status>>> = Rc::default();
    let s2 = status.clone();
    let comp = Completion::new(1, move |st| *s2.borrow_mut() = Some(st));
    let siov = sbuf.iov(4096);
    // SAFETY: `sbuf` lives to the end of the test.
    let op = unsafe { ab.tag_rndv_zcopy(0x1, b"", &siov, SendFlags::empty(), Some(&comp)) };
    assert!(matches!(op, Ok(Outcome::Done(_))), "{op:?}");
    wait(&worker, "the request at the receiver", || b.unexp.borrow().len() == 1);
    // The receiver goes away without answering: no FIN will come.
    drop(ba);
    drop(b);
    settle(&worker);
    assert_eq!(*status.borrow(), None, "completed without a FIN");
    // The sender finds out when it next reaches for the peer; the rendezvous then fails.
    let checked = Completion::new(1, |_| {});
    let _ = ab.check(Some(&checked));
    wait(&worker, "the rendezvous to fail", || status.borrow().is_some());
    let st = status.borrow().unwrap();
    assert_ne!(st, Status::Ok, "a rendezvous to a dead peer completed successfully");
    eprintln!("the offloaded rendezvous failed with {st:?}");
}

/// A receive the device matched is reported consumed before any other callback runs, even
/// when completions queued before the match (here a rendezvous read that finished in the same
/// progress call) are handled first: a callback of those could otherwise take the receive in
/// software (UCP does, for a message of the same tag sent to itself over `self`) while the
/// device had placed its message there already, and that message would be lost.
#[test]
fn a_match_is_reported_before_the_callbacks_of_earlier_completions() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let a = open(&md, port, &worker, true, &[]);
    let b = open(&md, port, &worker, true, &[]);
    let (ab, _ba) = connect(&a.iface, &b.iface);
    let len = 64 * 1024;
    let mut sbuf = buf(&md, len, 0);
    sbuf.mem.copy_from_slice(&pattern(len, 9));
    let mut rbuf = buf(&md, len, 0);
    let mut ebuf = buf(&md, 64, 0);
    let (log0, log1): (Log<Ev>, Log<Ev>) = (Rc::default(), Rc::default());
    // R0 (rendezvous): its completion notes what R1 had reported by then.
    let seen: Rc<RefCell<Option<Vec<Ev>>>> = Rc::default();
    let (l0, l1, s) = (log0.clone(), log1.clone(), seen.clone());
    let ctx0 = Rc::new(TagRecvContext {
        tag_consumed: Box::new({
            let l0 = l0.clone();
            move || l0.borrow_mut().push(Ev::Consumed)
        }),
        completed: Box::new(move |tag, imm, len, status| {
            *s.borrow_mut() = Some(l1.borrow().clone());
            l0.borrow_mut().push(Ev::Completed { tag, imm, len, status });
        }),
        rndv: Box::new(|_, _, _| panic!("the rendezvous was handed back")),
    });
    // SAFETY: the buffers live to the end of the test.
    unsafe { b.iface.tag_recv_zcopy(0x70, u64::MAX, &rbuf.iov(len), ctx0).unwrap() };
    // SAFETY: as above.
    unsafe { b.iface.tag_recv_zcopy(0x71, u64::MAX, &ebuf.iov(64), ctx(&log1)).unwrap() };
    let comp = Completion::new(1, |_| {});
    let siov = sbuf.iov(len);
    // SAFETY: `sbuf` lives until the completion.
    let op = unsafe { ab.tag_rndv_zcopy(0x70, b"r0", &siov, SendFlags::empty(), Some(&comp)) };
    assert!(matches!(op, Ok(Outcome::Done(_))), "{op:?}");
    // The request matched and the device's read is under way; then R1's message, with the
    // receiver left alone until the read finished and the message arrived.
    wait(&worker, "the rendezvous match", || !log0.borrow().is_empty());
    assert_eq!(ab.tag_eager_short(0x71, b"for r1"), Ok(Outcome::Done(())));
    std::thread::sleep(Duration::from_secs(1));
    worker.progress();
    assert!(
        log0.borrow().len() == 2 && log1.borrow().len() == 2,
        "the read's end and the message were not handled in one progress call (R0 {:?}, R1 {:?}): \
         the test did not set up the case",
        log0.borrow(),
        log1.borrow()
    );
    assert_eq!(
        seen.borrow().as_deref(),
        Some(&[Ev::Consumed][..]),
        "when R0 completed, R1 (whose message the device had placed) was not reported consumed"
    );
    assert_eq!(ebuf.bytes(6), b"for r1");
    assert!(rbuf.bytes(len) == pattern(len, 9));
    wait(&worker, "the rendezvous sender's completion", || comp.count() == 0);
}
