//! The uct conformance kit against `posix` and `sysv` in one process, and the interfaces'
//! wakeup and re-entrancy. The runs across two processes are in the `tests` package
//! (`tests/kit_shm.rs`, with its `kit-agent` program). Every test here busy-polls, so they take
//! turns.

use uct::conformance::{self as kit, Options};

fn opts(tl: &str) -> Options {
    uct_shm::register();
    Options::new(&format!("{tl}/memory")).with_scarce_config("FIFO_SIZE", "8")
}

fn run(opts: Options) {
    kit::run_checked(&opts, |name, _why, remote| name == "am_zcopy_iov" || (name == "peer_failure" && !remote));
}

#[test]
fn posix_conformance() {
    run(opts("posix"));
}

#[test]
fn sysv_conformance() {
    run(opts("sysv"));
}

/// Two interfaces of `tl` in this process, the receiving one shared so handlers can reach it,
/// and an endpoint from the other to it. Holds the turn.
struct LocalPair {
    _turn: std::sync::MutexGuard<'static, ()>,
    _worker: uct::Worker,
    _mds: [std::rc::Rc<dyn uct::Md>; 2],
    rx: std::rc::Rc<dyn uct::Iface>,
    _tx: Box<dyn uct::Iface>,
    ep: Box<dyn uct::Ep>,
}

fn local_pair(tl: &str) -> LocalPair {
    let _turn = kit::take_turn();
    uct_shm::register();
    let worker = uct::Worker::default();
    let name = format!("{tl}/memory");
    let (md, rx) = uct::iface_open_by_name(&worker, &name, uct::IfaceParams::default()).unwrap();
    let (md2, tx) = uct::iface_open_by_name(&worker, &name, uct::IfaceParams::default()).unwrap();
    let ep = tx.ep_create(&uct::EpParams::to_iface(&rx.device_address(), &rx.iface_address())).unwrap();
    LocalPair { _turn, _worker: worker, _mds: [md, md2], rx: rx.into(), _tx: tx, ep }
}

fn wakeup(tl: &str) {
    use std::rc::Rc;
    use uct::{EventFlags, Outcome, Status};
    // The whole pair stays bound: it holds the turn, the worker and both interfaces.
    let pair = local_pair(tl);
    let (rx, ep) = (&pair.rx, &pair.ep);
    rx.set_am_handler(0, Some(Rc::new(|_| {}))).unwrap();
    let fd = rx.event_fd().unwrap();
    let readable = |ms: i32| {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    };
    assert_eq!(rx.event_arm(EventFlags::RECV), Ok(()));
    assert!(!readable(0), "{tl}: fd readable with nothing sent");
    assert_eq!(ep.am_short(0, 1, &[]), Ok(Outcome::Done(())));
    assert!(readable(5000), "{tl}: a send to an armed receiver must wake it");
    assert_eq!(rx.event_arm(EventFlags::RECV), Err(Status::Busy), "{tl}: a message waits");
    while rx.progress() > 0 {}
    // The signal of the message just polled is still queued: arming takes it and answers
    // Busy once, as UCX's mm transport does, so the caller progresses instead of waking at once.
    assert_eq!(rx.event_arm(EventFlags::RECV), Err(Status::Busy), "{tl}: the old signal is taken");
    assert_eq!(rx.event_arm(EventFlags::RECV), Ok(()), "{tl}: drained, armed again");
    assert!(!readable(0), "{tl}: the old signal was consumed by arming");
}

#[test]
fn posix_wakeup() {
    wakeup("posix");
}

#[test]
fn sysv_wakeup() {
    wakeup("sysv");
}

/// A handler that progresses or arms its own interface (which UCX does not allow) gets nothing
/// from the nested call and no panic: the receive side is busy handling it. The messages behind
/// it are handled once, in order, by the outer progress.
fn reentrant_handler(tl: &str) {
    use std::cell::RefCell;
    use std::rc::{Rc, Weak};
    use uct::{EventFlags, Iface, Outcome, Status};
    // The whole pair stays bound: it holds the turn, the worker and both interfaces.
    let pair = local_pair(tl);
    let (rx, ep) = (&pair.rx, &pair.ep);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let (me, log): (Weak<dyn Iface>, _) = (Rc::downgrade(rx), seen.clone());
    rx.set_am_handler(
        1,
        Some(Rc::new(move |m: uct::AmRecv<'_>| {
            let iface = me.upgrade().unwrap();
            let nested = (iface.progress(), iface.event_arm(EventFlags::RECV));
            log.borrow_mut().push((m.data()[0], nested));
        })),
    )
    .unwrap();
    for i in 0..3u8 {
        assert_eq!(ep.am_short(1, i as u64, &[]), Ok(Outcome::Done(())));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while seen.borrow().len() < 3 {
        rx.progress();
        assert!(std::time::Instant::now() < deadline, "{tl}: messages lost");
    }
    let want: Vec<_> = (0..3u8).map(|i| (i, (0, Err(Status::Busy)))).collect();
    assert_eq!(*seen.borrow(), want, "{tl}");
}

#[test]
fn posix_reentrant_handler() {
    reentrant_handler("posix");
}

#[test]
fn sysv_reentrant_handler() {
    reentrant_handler("sysv");
}
