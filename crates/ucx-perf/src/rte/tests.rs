//! The bootstrap between two sides in threads, and the parameters on the wire.

use super::*;
use crate::opts::{parse, Parsed};
use std::sync::mpsc;
use std::thread;
use ucx_perf::params::{DataLayout, TestKind};

const T: Option<Duration> = Some(Duration::from_secs(10));

fn params(s: &str) -> PerfParams {
    let a: Vec<String> = s.split_whitespace().map(str::to_string).collect();
    match parse(&a) {
        Ok(Parsed::Run(p)) => p,
        other => panic!("{other:?}"),
    }
}

/// A connected (server, client) pair on 127.0.0.1 (or ::1), both with bounded waits.
fn pair(ipv6: bool) -> (Rte, Rte) {
    let l = Listener::bind(0, ipv6).unwrap();
    let port = l.local_port().unwrap();
    let (tx, rx) = mpsc::channel();
    let srv = thread::spawn(move || {
        let (rte, peer) = l.accept().unwrap();
        tx.send(peer).unwrap();
        rte
    });
    let host = if ipv6 { "::1" } else { "127.0.0.1" };
    let mut c = Rte::connect(host, port, Some(ipv6), Duration::ZERO).unwrap();
    let mut s = srv.join().unwrap();
    let peer = rx.recv().unwrap();
    assert_eq!(peer.is_ipv6(), ipv6);
    s.set_timeout(T).unwrap();
    c.set_timeout(T).unwrap();
    (s, c)
}

#[test]
fn roles() {
    let l = Rte::loopback();
    assert!(l.is_server() && l.is_loopback());
    assert_eq!((l.group_size(), l.group_index(), l.peer_index()), (1, 0, 0));
    let (s, c) = pair(false);
    assert_eq!((s.group_size(), s.group_index(), s.peer_index()), (2, 0, 1));
    assert_eq!((c.group_index(), c.peer_index()), (1, 0));
    assert!(s.is_server() && !c.is_server() && !c.is_loopback());
}

#[test]
fn loopback_exchange_returns_own_data() {
    let mut l = Rte::loopback();
    assert_eq!(l.exchange(b"addr").unwrap(), b"addr");
    l.barrier().unwrap();
    let p = params("-l -t am_lat -x posix -d memory");
    assert_eq!(l.exchange_params(&p).unwrap(), p);
    l.verify_params(&p).unwrap();
}

#[test]
fn exchange_and_barrier_over_tcp() {
    let (mut s, mut c) = pair(false);
    let big: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    let big2 = big.clone();
    let t = thread::spawn(move || {
        let got = c.exchange(b"client").unwrap();
        let got_big = c.exchange(&big2).unwrap();
        c.barrier().unwrap();
        assert_eq!(c.exchange(&[]).unwrap(), b"x");
        (got, got_big)
    });
    assert_eq!(s.exchange(b"server").unwrap(), b"client");
    // Both send 4 MiB, more than the socket buffers hold: must not deadlock.
    assert_eq!(s.exchange(&big).unwrap(), big);
    let mut polls = 0;
    s.barrier_with(&mut || polls += 1).unwrap();
    assert_eq!(s.exchange(b"x").unwrap(), b"");
    let (got, got_big) = t.join().unwrap();
    assert_eq!(got, b"server");
    assert_eq!(got_big, big);
}

#[test]
fn ipv6() {
    // Skip where the machine has no IPv6 loopback.
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        return;
    }
    let (mut s, mut c) = pair(true);
    let t = thread::spawn(move || c.exchange(b"6").unwrap());
    assert_eq!(s.exchange(b"s").unwrap(), b"6");
    assert_eq!(t.join().unwrap(), b"s");
}

#[test]
fn barrier_progresses_while_waiting() {
    let (mut s, mut c) = pair(false);
    let (tx, rx) = mpsc::channel::<()>();
    let t = thread::spawn(move || {
        // Enter the barrier only after the server has progressed a few times.
        rx.recv().unwrap();
        c.barrier().unwrap();
    });
    let mut polls = 0;
    let mut tx = Some(tx);
    s.barrier_with(&mut || {
        polls += 1;
        if polls == 3 {
            tx.take().unwrap().send(()).unwrap();
        }
    })
    .unwrap();
    assert!(polls >= 3);
    t.join().unwrap();
}

#[test]
fn server_takes_the_clients_parameters() {
    let (mut s, mut c) = pair(false);
    let client = params("host -t put_bw -x sysv -d memory -n 77 -s 16,48 -D bcopy -R 99.5 -f");
    let server = params("-t am_lat -x posix -d memory -v -N -p 23456");
    let cp = client.clone();
    let t = thread::spawn(move || c.exchange_params(&cp));
    let effective = s.exchange_params(&server).unwrap();
    assert_eq!(t.join().unwrap().unwrap(), client);
    assert_eq!(effective.test, TestKind::PutBw);
    assert_eq!((effective.iters, effective.msg_sizes.clone()), (77, vec![16, 48]));
    assert_eq!((effective.tl.as_deref(), effective.layout), (Some("sysv"), DataLayout::Bcopy));
    assert_eq!(effective.percentile, 99.5);
    // Output and local options stay the server's.
    assert!(effective.csv && effective.numeric && !effective.final_only);
    assert_eq!((effective.port, effective.server.clone()), (23456, None));
    assert_eq!(effective.max_outstanding, 1);
}

#[test]
fn server_refusal_reaches_the_client() {
    let (mut s, mut c) = pair(false);
    // A client with batch files names no test; the server has none of its own.
    let mut client = params("host -x posix -d memory -b somefile");
    client.batch_files.clear();
    let t = thread::spawn(move || c.exchange_params(&client));
    let e = s.exchange_params(&params("")).unwrap_err();
    assert!(e.starts_with("the client names no test"), "{e}");
    let ce = t.join().unwrap().unwrap_err();
    assert_eq!(ce, format!("the server refused the test: {e}"));
}

#[test]
fn verify_params_spots_differences() {
    let (mut s, mut c) = pair(false);
    let mut a = params("host -t am_lat -x posix -d memory");
    a.batch_names = vec!["lat1".into()];
    let mut b2 = a.clone();
    b2.server = None;
    b2.csv = true;
    let a2 = a.clone();
    let t = thread::spawn(move || {
        c.verify_params(&a2).unwrap();
        let mut other = a2.clone();
        other.iters = 5;
        c.verify_params(&other)
    });
    s.verify_params(&b2).unwrap();
    let e = s.verify_params(&b2).unwrap_err();
    assert_eq!(e, "client and server run different tests: this side has iters 1000000, the peer iters 5");
    assert!(t.join().unwrap().is_err());
}

#[test]
fn params_round_trip() {
    for args in [
        "-l -t am_lat -x posix -d memory",
        "host -t tag_bw -D iov,contig -M multi -T 4 -A signal -E poll -r recv_data -C -U -e -z -B -q -H 32",
        "host -t fadd -x po\\six -d mem -s 4 -W 3 -O 9 -i 64 -o -w 0 -n 0 -R 0.1",
        "",
    ] {
        let mut p = params(args);
        p.batch_names = vec!["a b".into(), "c\nd".into()];
        p.dev = p.dev.map(|d| format!("{d}\r\n\\x"));
        let back = decode_params(encode_params(&p).as_bytes()).unwrap();
        assert_eq!(merge_local(back, &p), p, "{args}");
    }
}

#[test]
fn decode_rejects_bad_input() {
    let good = encode_params(&params("-l -t am_lat -x posix -d memory"));
    assert!(decode_params(b"\xff\xfe").is_err());
    assert!(decode_params(b"hello").unwrap_err().contains("unknown format"));
    let cases = [
        good.replace("test am_lat", "test nope"),
        good.replace("iters 1000000", "iters -1"),
        good.replace("percentile 50", "percentile 101"),
        good.replace("layout short", "layout long"),
        good.replace("loopback 1", "loopback 2"),
        good.replace("quiet 0\n", ""),
        format!("{good}quiet 0\n"),
        format!("{good}future 1\n"),
        format!("{good}novalue\n"),
        good.replace("dev =memory", "dev memory"),
        good.replace("dev =memory", "dev =mem\\q"),
        good.replace("max_outstanding 1", "max_outstanding 99999999999"),
    ];
    for (i, c) in cases.iter().enumerate() {
        assert!(decode_params(c.as_bytes()).is_err(), "case {i}: {c}");
    }
}

#[test]
fn oversized_and_out_of_step_frames_are_errors() {
    let l = Listener::bind(0, false).unwrap();
    let port = l.local_port().unwrap();
    let t = thread::spawn(move || {
        let (mut rte, _) = l.accept().unwrap();
        rte.set_timeout(T).unwrap();
        let e1 = rte.exchange(b"x").unwrap_err();
        e1.to_string()
    });
    // A raw peer: right handshake, then a data frame claiming 1 GiB.
    let mut raw = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.set_read_timeout(T).unwrap();
    raw.write_all(&MAGIC).unwrap();
    let mut m = [0u8; 8];
    raw.read_exact(&mut m).unwrap();
    let mut hdr = vec![KIND_DATA];
    hdr.extend_from_slice(&(1u64 << 30).to_le_bytes());
    raw.write_all(&hdr).unwrap();
    let e = t.join().unwrap();
    assert!(e.contains("blob of 1073741824 bytes"), "{e}");

    let (mut s, mut c) = pair(false);
    let t = thread::spawn(move || c.barrier());
    let e = s.exchange(b"x").unwrap_err();
    assert!(e.to_string().contains("expected a data frame, the peer sent barrier"), "{e}");
    drop(s);
    // The client sees the server go away instead of hanging.
    assert!(t.join().unwrap().is_err());

    let mut l2 = Rte::loopback();
    assert_eq!(l2.exchange(&[0u8; 16]).unwrap().len(), 16);
    let (mut s, _c) = pair(false);
    let e = s.exchange(&vec![0u8; MAX_BLOB + 1]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn foreign_peer_is_told_apart() {
    let l = Listener::bind(0, false).unwrap();
    let port = l.local_port().unwrap();
    let t = thread::spawn(move || l.accept().map(|_| ()).unwrap_err().to_string());
    let mut raw = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.write_all(b"NOTUCXPF").unwrap();
    let e = t.join().unwrap();
    assert!(e.contains("bad handshake"), "{e}");
}

#[test]
fn peer_gone_is_an_error_not_a_hang() {
    let (mut s, c) = pair(false);
    drop(c);
    let e = s.exchange(b"x").unwrap_err();
    assert!(e.to_string().contains("closed") || e.kind() == io::ErrorKind::ConnectionReset, "{e}");
}

#[test]
fn client_retries_until_the_server_listens() {
    // Find a free port, then start listening only after the client has begun trying.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel::<()>();
    let srv = thread::spawn(move || {
        rx.recv().unwrap();
        let l = Listener::bind(port, false).unwrap();
        l.accept().unwrap().0
    });
    let cli = thread::spawn(move || Rte::connect("127.0.0.1", port, Some(false), Duration::from_secs(10)));
    // Usually the client meets refusals first; either order must work.
    tx.send(()).unwrap();
    let mut c = cli.join().unwrap().unwrap();
    let mut s = srv.join().unwrap();
    c.set_timeout(T).unwrap();
    s.set_timeout(T).unwrap();
    let t = thread::spawn(move || c.exchange(b"c").unwrap());
    assert_eq!(s.exchange(b"s").unwrap(), b"c");
    assert_eq!(t.join().unwrap(), b"s");
}

#[test]
fn connect_errors_are_one_line() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = Rte::connect("127.0.0.1", port, Some(false), Duration::ZERO).unwrap_err().to_string();
    assert!(e.starts_with(&format!("client failed: connect() to 127.0.0.1:{port} failed: ")), "{e}");
    let e = Rte::connect("127.0.0.1", port, Some(true), Duration::ZERO).unwrap_err().to_string();
    assert_eq!(e, "server '127.0.0.1' has no IPv6 address");
    let e = Rte::connect("::1", port, Some(false), Duration::ZERO).unwrap_err().to_string();
    assert_eq!(e, "server '::1' has no IPv4 address (use -6 for IPv6)");
    assert!(!e.contains('\n'));
}

#[test]
fn peer_string_has_no_brackets() {
    let v6: SocketAddr = "[::ffff:127.0.0.1]:55048".parse().unwrap();
    assert_eq!(peer_string(&v6), "::ffff:127.0.0.1:55048");
    let v4: SocketAddr = "127.0.0.1:1".parse().unwrap();
    assert_eq!(peer_string(&v4), "127.0.0.1:1");
}
