//! How tcp endpoints share connections (two interfaces on `lo`, one process): an endpoint
//! writes to the connection the peer interface opened towards it, so one socket carries both
//! directions; endpoints created at the same time on both sides end with one connection
//! too; an endpoint that goes leaves the peer's endpoint on that connection working; and the
//! sockets close once neither side writes. Counted through this process's descriptors, so the
//! scenarios run one after the other in one test.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use uct::{Ep, EpParams, Iface, IfaceParams, ProgressFlags, Worker};

const LIMIT: Duration = Duration::from_secs(20);

/// Sockets open in this process.
fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with("socket:"))
        .count()
}

struct Side {
    iface: Box<dyn Iface>,
    got: Rc<RefCell<Vec<u64>>>,
}

fn side(worker: &Worker) -> Side {
    let (md, tl) = uct::find_resource("tcp/lo").unwrap();
    let iface = md.iface_open(worker, &IfaceParams::new(&tl.tl_name, &tl.dev_name)).unwrap();
    iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    let got: Rc<RefCell<Vec<u64>>> = Rc::default();
    let g = got.clone();
    iface
        .set_am_handler(
            1,
            Some(Rc::new(move |m: uct::AmRecv<'_>| {
                g.borrow_mut().push(u64::from_ne_bytes(m.data()[..8].try_into().unwrap()))
            })),
        )
        .unwrap();
    Side { iface, got }
}

fn ep_to(from: &Side, to: &Side) -> Box<dyn Ep> {
    from.iface.ep_create(&EpParams::to_iface(&to.iface.device_address(), &to.iface.iface_address())).unwrap()
}

/// Sends `n` numbered messages on `ep` (first number `first`) and waits until `to` has them all.
fn send(worker: &Worker, ep: &dyn Ep, to: &Side, first: u64, n: u64) {
    let t = Instant::now();
    let mut next = first;
    while to.got.borrow().len() < (first + n) as usize {
        if next < first + n && ep.am_short(1, next, b"") == Ok(uct::Outcome::Done(())) {
            next += 1;
        }
        worker.progress();
        assert!(t.elapsed() < LIMIT, "messages did not arrive");
    }
    assert_eq!(*to.got.borrow(), (0..first + n).collect::<Vec<_>>(), "in order");
}

/// Progresses until `sockets()` is `want` (descriptors close as ends of the stream are read).
fn settle(worker: &Worker, want: usize, what: &str) {
    let t = Instant::now();
    while sockets() != want {
        worker.progress();
        assert!(t.elapsed() < LIMIT, "{what}: {} sockets, expected {want}", sockets());
    }
}

#[test]
fn connections_carry_both_directions_and_close_when_unused() {
    uct_tcp::register();
    let worker = Worker::default();
    let base = sockets();

    // A then B: B's endpoint writes to the connection A opened.
    let (a, b) = (side(&worker), side(&worker));
    assert_eq!(sockets(), base + 2, "two listeners");
    let ab = ep_to(&a, &b);
    send(&worker, &*ab, &b, 0, 10);
    let ba = ep_to(&b, &a);
    send(&worker, &*ba, &a, 0, 10);
    send(&worker, &*ab, &b, 10, 10);
    assert_eq!(sockets(), base + 4, "one connection (both ends in this process)");

    // A's endpoint goes: B's still reaches A on the same connection.
    drop(ab);
    send(&worker, &*ba, &a, 10, 10);
    // B's goes too: the connection closes.
    drop(ba);
    settle(&worker, base + 2, "after both endpoints went");

    // Both at once: one connection stays, messages both ways in order.
    let (c, d) = (side(&worker), side(&worker));
    let cd = ep_to(&c, &d);
    let dc = ep_to(&d, &c);
    for k in 0..5 {
        send(&worker, &*cd, &d, k * 10, 10);
        send(&worker, &*dc, &c, k * 10, 10);
    }
    settle(&worker, base + 4 + 2, "simultaneous connect: one connection");
    drop((cd, dc));
    settle(&worker, base + 4, "after the simultaneous pair went");
}
