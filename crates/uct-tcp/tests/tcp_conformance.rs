//! The uct conformance kit against `tcp` on the loopback device, in one process (two
//! interfaces). The checks busy-poll, so they take turns.

use uct::conformance::{self as kit, Options};

#[test]
fn tcp_loopback_conformance() {
    uct_tcp::register();
    // Small socket buffers make the pending checks run out of room.
    let opts = Options::new("tcp/lo")
        .with_scarce_config("TX_SEG_SIZE", "64")
        .with_scarce_config("SNDBUF", "1k")
        .with_scarce_config("RCVBUF", "1k");
    let results =
        kit::run_checked(&opts, |name, why, remote| why.starts_with("no ") || (name == "peer_failure" && !remote));
    let passed: Vec<_> = results.iter().filter(|(_, v)| *v == kit::Verdict::Passed).map(|(n, _)| *n).collect();
    for must in ["am_sizes", "am_invalid", "am_keep_desc", "am_reentrant", "pending_fairness", "flush", "ep_check"] {
        assert!(passed.contains(&must), "{must} did not pass: {results:?}");
    }
}

/// Bad input at the listener: a client that connects and says nothing, one that sends garbage,
/// one that sends a good handshake and then an active message header with a bad id, one that
/// sends half a message and goes. Each is dropped (or waited for) without harm, and a real
/// endpoint's messages still arrive.
#[test]
fn the_listener_survives_bad_clients() {
    use std::cell::RefCell;
    use std::io::Write;
    use std::rc::Rc;
    use uct::{EpParams, IfaceParams, ProgressFlags, Worker};

    uct_tcp::register();
    let _turn = kit::take_turn();
    let (md, tl) = uct::find_resource("tcp/lo").unwrap();
    let worker = Worker::default();
    let params = IfaceParams::new(&tl.tl_name, &tl.dev_name);
    let rx = md.iface_open(&worker, &params).unwrap();
    let tx = md.iface_open(&worker, &params).unwrap();
    rx.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    tx.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    let got: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let g = got.clone();
    rx.set_am_handler(3, Some(Rc::new(move |m: uct::AmRecv<'_>| g.borrow_mut().push(m.data().to_vec())))).unwrap();
    let port = u16::from_be_bytes(rx.iface_address().try_into().unwrap());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let silent = std::net::TcpStream::connect(addr).unwrap();
    let mut garbage = std::net::TcpStream::connect(addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut bad_id = std::net::TcpStream::connect(addr).unwrap();
    // A good handshake (version 2, from interface 127.0.0.1:9).
    let mut hs = b"UCXRSTCP".to_vec();
    hs.extend_from_slice(&2u32.to_le_bytes());
    hs.extend_from_slice(&[4, 0, 0, 9, 127, 0, 0, 1]);
    hs.extend_from_slice(&[0; 12]);
    bad_id.write_all(&hs).unwrap();
    bad_id.write_all(&[200, 0, 0, 0, 1, 0, 0, 0, 9]).unwrap();
    {
        let mut half = std::net::TcpStream::connect(addr).unwrap();
        half.write_all(&hs).unwrap();
        half.write_all(&[3, 0, 0, 0, 100, 0, 0, 0, 1, 2, 3]).unwrap();
    }
    let ep = tx.ep_create(&EpParams::to_iface(&rx.device_address(), &rx.iface_address())).unwrap();
    let start = std::time::Instant::now();
    let mut sent = 0u64;
    while got.borrow().len() < 3 {
        if sent < 3 && ep.am_short(3, sent, b"ok") == Ok(uct::Outcome::Done(())) {
            sent += 1;
        }
        worker.progress();
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "the real endpoint's messages did not arrive");
    }
    for (i, m) in got.borrow().iter().enumerate() {
        assert_eq!(&m[..8], &(i as u64).to_ne_bytes());
        assert_eq!(&m[8..], b"ok");
    }
    drop(silent);
}
