//! `ud_verbs` behaviour beyond the conformance kit, on a real device: waking a sleeping
//! process for resends, peer timeout, forged and malformed datagrams, lingering endpoints,
//! configuration errors. Needs an RDMA device: run with `tools/rdma-vm/test`.

mod ud_common;

use std::rc::Rc;
use std::time::{Duration, Instant};

use ucs::fraglist::Sn16;
use ucs::{Outcome, Status};
use uct::{Completion, EventFlags, FlushFlags, Iface, IfaceParams, Md, MemAccess, ProgressFlags, Worker};
use uct_ib::ud::{Creq, CtlPacket, DevAddr, EpAddr, Neth, PacketKind, UdVerbsIface, PUT_HDR_LEN};
use ud_common::*;

const AM: u8 = 4;
const SEC: Duration = Duration::from_secs(1);

/// Arms `iface` for send completions and receives, progressing until the arm succeeds.
fn arm(worker: &Worker, iface: &UdVerbsIface) {
    let start = Instant::now();
    loop {
        match iface.event_arm(EventFlags::SEND_COMP | EventFlags::RECV) {
            Ok(()) => return,
            Err(Status::Busy) => {
                worker.progress();
            }
            Err(e) => panic!("event_arm: {e}"),
        }
        assert!(start.elapsed() < 10 * SEC, "event_arm stayed busy");
    }
}

#[test]
fn event_fd_wakes_for_resends_and_receives() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let (a, _) = open(&md, port, &worker, &[]);
    let (b, _) = open(&md, port, &worker, &[]);
    let inbox = listen(&b, AM);
    let ep = connect(&a, &b, 0);
    let (ms, mb) = (a.attr().am.max_short, a.attr().am.max_bcopy);
    wait(&worker, "first message", 10 * SEC, || send(&*ep, AM, 0, ms, mb).unwrap());
    wait(&worker, "delivery", 10 * SEC, || inbox.borrow().next == 1);
    wait(&worker, "acknowledgement", 10 * SEC, || ep.flush(FlushFlags::LOCAL, None) == Ok(Outcome::Done(())));

    // Idle: nothing is due, so an armed interface sleeps.
    arm(&worker, &a);
    assert!(!a.wait_event(Some(Duration::from_millis(200))).unwrap(), "an idle interface woke up");

    // The receiver stops: the sender's message is not acknowledged, and its timer wakes it.
    b.progress_disable(ProgressFlags::SEND | ProgressFlags::RECV);
    assert!(send(&*ep, AM, 1, ms, mb).unwrap());
    arm(&worker, &a);
    let posted = a.stats().tx_posted;
    let t0 = Instant::now();
    assert!(a.wait_event(Some(5 * SEC)).unwrap(), "no wakeup for the resend timer");
    let woke = t0.elapsed();
    assert!(woke < 2 * SEC, "woke after {woke:?} (the first timeout is 10 ms)");
    let deadline = Instant::now() + 5 * SEC;
    while a.stats().tx_posted == posted {
        a.progress();
        assert!(Instant::now() < deadline, "the wakeup did not lead to a probe or resend");
    }
    eprintln!("woke after {woke:?} and probed the silent peer");

    // A receive wakes the receiver.
    b.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    wait(&worker, "delivery", 10 * SEC, || inbox.borrow().next == 2);
    wait(&worker, "acknowledgement", 10 * SEC, || ep.flush(FlushFlags::LOCAL, None) == Ok(Outcome::Done(())));
    arm(&worker, &b);
    assert!(send(&*ep, AM, 2, ms, mb).unwrap());
    assert!(b.wait_event(Some(5 * SEC)).unwrap(), "no wakeup for a receive");
    wait(&worker, "delivery", 10 * SEC, || inbox.borrow().next == 3);
    assert!(inbox.borrow().errors.is_empty(), "{:?}", inbox.borrow().errors);
}

#[test]
fn dead_peer_times_out_once() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let (a, failures) = open(&md, port, &worker, &[("TIMEOUT", "500ms")]);
    let (b, _) = open(&md, port, &worker, &[]);
    let inbox = listen(&b, AM);
    let ep = connect(&a, &b, 77);
    let (ms, mb) = (a.attr().am.max_short, a.attr().am.max_bcopy);
    for seq in 0..50 {
        wait(&worker, "send", 10 * SEC, || send(&*ep, AM, seq, ms, mb).unwrap());
    }
    wait(&worker, "delivery", 10 * SEC, || inbox.borrow().next == 50);
    drop(b);
    let comp = Completion::counter(1);
    let start = Instant::now();
    let mut seq = 50;
    let err = loop {
        match send(&*ep, AM, seq, ms, mb) {
            Ok(true) => seq += 1,
            Ok(false) => {
                worker.progress();
            }
            Err(e) => break e,
        }
        if seq == 51 && comp.count() == 1 {
            // A flush waiting for the dead peer completes with the failure.
            assert_eq!(ep.flush(FlushFlags::REMOTE, Some(&comp)), Ok(Outcome::InProgress));
        }
        assert!(start.elapsed() < 10 * SEC, "the dead peer was not noticed");
    };
    let took = start.elapsed();
    assert_eq!(err, Status::EndpointTimeout);
    assert!(took >= Duration::from_millis(400), "failed after {took:?}, before the 500 ms peer timeout");
    for _ in 0..100 {
        worker.progress();
    }
    assert_eq!(*failures.borrow(), [(77, Status::EndpointTimeout)], "the error handler hears once");
    assert_eq!((comp.count(), comp.status()), (0, Status::EndpointTimeout));
    assert_eq!(ep.am_short(AM, 0, b"x"), Err(Status::EndpointTimeout));
    assert_eq!(ep.check(None), Err(Status::EndpointTimeout));
    assert_eq!(ep.flush(FlushFlags::LOCAL, None), Ok(Outcome::Done(())));

    // Connecting to an interface that is gone fails the same way.
    let (c, _) = open(&md, port, &worker, &[]);
    let dead = (c.device_address(), c.iface_address());
    drop(c);
    let ep2 = a.ep_create(&uct::EpParams::to_iface(&dead.0, &dead.1).with_user_data(78)).unwrap();
    wait(&worker, "connection timeout", 10 * SEC, || failures.borrow().len() == 2);
    assert_eq!(failures.borrow()[1], (78, Status::EndpointTimeout));
    assert_eq!(ep2.am_short(AM, 0, b"x"), Err(Status::EndpointTimeout));
}

/// A datagram from a made-up peer: header plus body.
fn packet(neth: Neth, body: &[u8]) -> Vec<u8> {
    let mut p = neth.to_bytes().unwrap().to_vec();
    p.extend_from_slice(body);
    p
}

#[test]
fn forged_and_malformed_datagrams_are_dropped() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let (a, failures) = open(&md, port, &worker, &[("TIMEOUT", "1s")]);
    let inbox = listen(&a, AM);

    // Garbage: random lengths and bytes, and every truncation of a valid header.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..5000 {
        let len = (rnd() % 1100) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        a.inject_datagram(&bytes);
        worker.progress();
    }
    let am =
        Neth { dest_ep_id: 0, kind: PacketKind::Am(AM), ack_req: true, ecn: false, psn: Sn16(1), ack_psn: Sn16(0) };
    for cut in 0..8 {
        a.inject_datagram(&am.to_bytes().unwrap()[..cut]);
    }
    assert!(a.stats().rx_malformed > 0);

    // A connection request with a device address that is not one: dropped, no endpoint.
    let eps_before = a.stats().num_eps;
    let creq = |dev: &[u8], ep_id: u32| {
        let c = CtlPacket::Creq(Creq {
            ep_addr: EpAddr { qp_num: 0x00ab_cdef, ep_id },
            conn_sn: 0,
            path_index: 0,
            dev_addr: DevAddr::new(dev).unwrap(),
        });
        let mut body = vec![0u8; c.encoded_len()];
        c.encode(&mut body).unwrap();
        let n = Neth {
            dest_ep_id: uct_ib::ud::wire::EP_NULL_ID,
            kind: PacketKind::Ctl,
            ack_req: true,
            ecn: false,
            psn: Sn16(1),
            ack_psn: Sn16(0),
        };
        packet(n, &body)
    };
    let malformed = a.stats().rx_malformed;
    assert!(a.inject_datagram(&creq(&[0xff; 20], 5)));
    assert!(a.inject_datagram(&creq(&[1, 2, 3], 5)));
    assert_eq!(a.stats().rx_malformed, malformed + 2);
    assert_eq!(a.stats().num_eps, eps_before, "a bad connection request created an endpoint");

    // A well-formed request from a made-up peer creates a passive endpoint (id 0 on this fresh
    // interface) expecting packet 2 next; forge puts on it.
    assert!(a.inject_datagram(&creq(&a.device_address(), 5)));
    worker.progress();
    assert_eq!(a.stats().num_eps, eps_before + 1);
    let region = md.mem_alloc(4096, MemAccess::ALL, "forged puts").unwrap();
    let packed = md.mkey_pack(&region).unwrap();
    let rkey = u32::from_le_bytes(packed[4..8].try_into().unwrap());
    let base = region.address() as u64;
    let mut psn = 2u16;
    let mut put = |addr: u64, key: u32, data: &[u8]| {
        let n =
            Neth { dest_ep_id: 0, kind: PacketKind::Put, ack_req: false, ecn: false, psn: Sn16(psn), ack_psn: Sn16(0) };
        psn += 1;
        let mut body = addr.to_le_bytes().to_vec();
        body.extend_from_slice(&key.to_le_bytes());
        body.extend_from_slice(data);
        assert!(a.inject_datagram(&packet(n, &body)));
    };
    let rejected = a.stats().put_rejected;
    put(base + 100, rkey, b"inside");
    put(base + 4093, rkey, b"past the end");
    put(base.wrapping_sub(8), rkey, b"before");
    put(base + 8, rkey ^ 1, b"wrong key");
    put(0, rkey, b"null");
    put(u64::MAX - 3, rkey, b"wrap");
    put(&rejected as *const u64 as u64, rkey, b"stack");
    put(base, rkey, &[]);
    assert_eq!(a.stats().put_rejected, rejected + 6);
    // SAFETY: the region is 4096 bytes of live memory allocated above.
    let mem = unsafe { std::slice::from_raw_parts(region.address(), 4096) };
    assert_eq!(&mem[100..106], b"inside");
    assert!(mem[..100].iter().chain(&mem[106..]).all(|&b| b == 0), "a refused put wrote");
    // A put shorter than its header is malformed.
    let malformed = a.stats().rx_malformed;
    put(base, rkey, &[]);
    let n = Neth { dest_ep_id: 0, kind: PacketKind::Put, ack_req: false, ecn: false, psn: Sn16(psn), ack_psn: Sn16(0) };
    assert!(a.inject_datagram(&packet(n, &[0u8; PUT_HDR_LEN - 1])));
    assert_eq!(a.stats().rx_malformed, malformed + 1);

    // After all that, a real peer connects and talks to the interface normally.
    let (b, _) = open(&md, port, &worker, &[]);
    let ep = connect(&b, &a, 9);
    let (ms, mb) = (b.attr().am.max_short, b.attr().am.max_bcopy);
    for seq in 0..200 {
        wait(&worker, "send", 10 * SEC, || send(&*ep, AM, seq, ms, mb).unwrap());
    }
    wait(&worker, "delivery", 10 * SEC, || inbox.borrow().next == 200);
    assert!(inbox.borrow().errors.is_empty(), "{:?}", inbox.borrow().errors);
    assert!(failures.borrow().is_empty(), "the made-up peer's endpoint has no user to report to");
    drop(region);
}

#[test]
fn closed_endpoints_linger_then_go() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let (a, _) = open(&md, port, &worker, &[("LINGER_TIMEOUT", "50ms")]);
    let (b, _) = open(&md, port, &worker, &[]);
    let inbox = listen(&b, AM);
    let (ms, mb) = (a.attr().am.max_short, a.attr().am.max_bcopy);
    let ep = connect(&a, &b, 0);
    for seq in 0..20 {
        wait(&worker, "send", 10 * SEC, || send(&*ep, AM, seq, ms, mb).unwrap());
    }
    drop(ep);
    // Still there: it delivers what it sent, and answers its peer.
    assert_eq!(a.stats().num_eps, 1);
    wait(&worker, "delivery", 10 * SEC, || inbox.borrow().next == 20);
    wait(&worker, "linger timeout", 10 * SEC, || a.stats().num_eps == 0);
    assert!(inbox.borrow().errors.is_empty());
    // A new connection gets a new connection number; the peer pairs it with a new endpoint.
    let ep = connect(&a, &b, 1);
    let inbox2 = listen(&b, AM + 1);
    for seq in 0..20 {
        wait(&worker, "send", 10 * SEC, || send(&*ep, AM + 1, seq, ms, mb).unwrap());
    }
    wait(&worker, "delivery", 10 * SEC, || inbox2.borrow().next == 20);
    assert!(inbox2.borrow().errors.is_empty(), "{:?}", inbox2.borrow().errors);
}

#[test]
fn configuration_errors() {
    let Some((md, port)) = device() else { return };
    let worker = Worker::default();
    let dev = format!("{}:{port}", md.dev.name);
    let try_open = |k: &str, v: &str| {
        let params = IfaceParams::new("ud_verbs", &dev).with_config(k, v);
        UdVerbsIface::open(&md, port, &worker, &params).map(drop)
    };
    assert_eq!(try_open("NO_SUCH_VARIABLE", "1"), Err(Status::NoElem));
    assert_eq!(try_open("TIMEOUT", "soon"), Err(Status::InvalidParam));
    assert_eq!(try_open("MAX_WINDOW", "1"), Err(Status::InvalidParam));
    assert_eq!(try_open("LOSS", "drop=150%"), Err(Status::InvalidParam));
    assert_eq!(try_open("TX_QUEUE_LEN", "1"), Err(Status::InvalidParam));
    assert_eq!(try_open("GID_INDEX", "100000"), Err(Status::InvalidParam));
    assert_eq!(try_open("SEG_SIZE", "4k"), Ok(()));
    // Addresses from peers are checked.
    let (a, _) = open(&md, port, &worker, &[]);
    let at = a.attr();
    eprintln!(
        "{dev}: am short {} bcopy {} zcopy {} (header {}), put short {}, flags {:?}",
        at.am.max_short, at.am.max_bcopy, at.am.max_zcopy, at.am.max_hdr, at.put.max_short, at.flags
    );
    let good_dev = a.device_address();
    assert!(!a.is_reachable(&good_dev[..5], None));
    assert!(!a.is_reachable(&good_dev, Some(&[1, 2, 3])));
    assert!(!a.is_reachable(&good_dev, Some(&(1u32 << 24).to_le_bytes())));
    let ep = |dev: &[u8], addr: &[u8]| a.ep_create(&uct::EpParams::to_iface(dev, addr)).map(drop);
    assert_eq!(ep(&good_dev, &[1, 2]), Err(Status::InvalidAddr));
    assert_eq!(ep(&[0u8; 40], &a.iface_address()), Err(Status::InvalidAddr));
    assert_eq!(ep(&good_dev, &0u32.to_le_bytes()), Err(Status::InvalidAddr));
    assert_eq!(a.ep_create(&uct::EpParams::to_ep()).map(drop), Err(Status::Unsupported));
    let _ = Rc::clone(&a);
}
