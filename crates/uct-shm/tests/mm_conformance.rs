//! The uct conformance kit against `posix` and `sysv`, in one process.

use uct::conformance::{self as kit, Options, Verdict};

fn opts(tl: &str) -> Options {
    uct_shm::register();
    Options::new(&format!("{tl}/memory")).with_scarce_config("FIFO_SIZE", "8")
}

fn run(tl: &str) {
    let results = kit::run_all(&opts(tl));
    for (name, v) in &results {
        match v {
            Verdict::Passed => {}
            Verdict::Skipped(why) => assert_eq!(*name, "am_zcopy_iov", "{tl}: {name} skipped: {why}"),
        }
    }
}

#[test]
fn posix_conformance() {
    run("posix");
}

#[test]
fn sysv_conformance() {
    run("sysv");
}

fn wakeup(tl: &str) {
    use std::rc::Rc;
    use uct::{EpParams, EventFlags, IfaceParams, Outcome, Status, Worker};
    uct_shm::register();
    let worker = Worker::default();
    let name = format!("{tl}/memory");
    let (_md, rx) = uct::iface_open_by_name(&worker, &name, IfaceParams::default()).unwrap();
    let (_md2, tx) = uct::iface_open_by_name(&worker, &name, IfaceParams::default()).unwrap();
    rx.set_am_handler(0, Some(Rc::new(|_| {}))).unwrap();
    let ep = tx.ep_create(&EpParams::to_iface(&rx.device_address(), &rx.iface_address())).unwrap();
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
