//! Helpers shared by the `ud_verbs` tests: finding a device, opening interfaces, connecting
//! endpoints, numbered messages with checkable payloads.

#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucs::{Outcome, Status};
use uct::{AmRecv, Ep, EpParams, Iface, IfaceParams, ProgressFlags, SendFlags, Worker};
use uct_ib::ud::UdVerbsIface;
use uct_ib::IbMd;

/// The device and port of the first `ud_verbs` resource, or `None` (after saying why) when
/// there is no RDMA device; with `UCX_RS_REQUIRE_RDMA=1` that is a failure.
pub fn device() -> Option<(Rc<IbMd>, u8)> {
    if !uct_ib::testing::rdma_available() {
        return None;
    }
    let r = uct::query_resources().into_iter().find(|r| r.tl.tl_name == "ud_verbs").expect("a ud_verbs resource");
    let (dev, port) = r.tl.dev_name.rsplit_once(':').expect("dev:port");
    let md = IbMd::open(dev).expect("open the ib memory domain");
    Some((md, port.parse().expect("port number")))
}

/// Endpoint failures reported to an interface's error handler.
pub type Failures = Rc<RefCell<Vec<(u64, Status)>>>;

/// Opens a `ud_verbs` interface with `config` overrides and a recording error handler.
pub fn open(md: &IbMd, port: u8, worker: &Worker, config: &[(&str, &str)]) -> (Rc<UdVerbsIface>, Failures) {
    let mut params = IfaceParams::new("ud_verbs", &format!("{}:{port}", md.dev.name));
    for (k, v) in config {
        params = params.with_config(k, v);
    }
    let failures: Failures = Rc::default();
    let f = failures.clone();
    params.err_handler = Some(Rc::new(move |ud, st| f.borrow_mut().push((ud, st))));
    let iface = Rc::new(UdVerbsIface::open(md, port, worker, &params).expect("open ud_verbs"));
    iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    (iface, failures)
}

/// An endpoint from `from` to `to`.
pub fn connect(from: &UdVerbsIface, to: &UdVerbsIface, user_data: u64) -> Box<dyn Ep> {
    let (dev, addr) = (to.device_address(), to.iface_address());
    assert!(from.is_reachable(&dev, Some(&addr)));
    from.ep_create(&EpParams::to_iface(&dev, &addr).with_user_data(user_data)).expect("ep_create")
}

/// Progresses `worker` until `done()` holds; panics after `limit`.
pub fn wait(worker: &Worker, what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        worker.progress();
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
    }
}

/// Filler byte `k` of message `seq`.
pub fn filler(seq: u64, k: usize) -> u8 {
    (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24) as u8 ^ (k as u8).wrapping_mul(31)
}

/// Payload length of message `seq`: 8 bytes of sequence number plus filler, from 8 to `max`.
pub fn msg_len(seq: u64, max: usize) -> usize {
    8 + (seq as usize * 37) % (max - 7)
}

/// What a receiver saw: the next expected sequence number, and every violation.
#[derive(Default)]
pub struct Inbox {
    pub next: u64,
    pub errors: Vec<String>,
}

/// Installs a handler on `id` that checks messages arrive exactly once, in order, intact.
pub fn listen(iface: &UdVerbsIface, id: u8) -> Rc<RefCell<Inbox>> {
    let inbox: Rc<RefCell<Inbox>> = Rc::default();
    let i2 = inbox.clone();
    iface
        .set_am_handler(
            id,
            Some(Rc::new(move |m: AmRecv<'_>| {
                let mut b = i2.borrow_mut();
                let d = m.data();
                let Some(seq) = d.get(..8).map(|h| u64::from_ne_bytes(h.try_into().unwrap())) else {
                    b.errors.push(format!("message of {} bytes", d.len()));
                    return;
                };
                if seq != b.next {
                    let e = format!("expected message {} got {seq}", b.next);
                    b.errors.push(e);
                }
                if d[8..].iter().enumerate().any(|(k, &x)| x != filler(seq, k)) {
                    b.errors.push(format!("message {seq}: corrupted payload"));
                }
                b.next = seq + 1;
            })),
        )
        .unwrap();
    inbox
}

/// Sends message `seq` on `ep`: every third as `am_short`, the others as `am_bcopy`.
pub fn send(ep: &dyn Ep, id: u8, seq: u64, max_short: usize, max_bcopy: usize) -> Result<bool, Status> {
    let r = if seq % 3 == 0 {
        let len = msg_len(seq, max_short);
        let payload: Vec<u8> = (0..len - 8).map(|k| filler(seq, k)).collect();
        ep.am_short(id, seq, &payload)
    } else {
        let len = msg_len(seq, max_bcopy);
        ep.am_bcopy(
            id,
            &mut |b: &mut [u8]| {
                b[..8].copy_from_slice(&seq.to_ne_bytes());
                for (k, x) in b[8..len].iter_mut().enumerate() {
                    *x = filler(seq, k);
                }
                len
            },
            SendFlags::empty(),
        )
        .map(|o| o.map(|_| ()))
    };
    match r? {
        Outcome::Done(()) => Ok(true),
        Outcome::NoResource => Ok(false),
        Outcome::InProgress => panic!("short/bcopy returned InProgress"),
    }
}
