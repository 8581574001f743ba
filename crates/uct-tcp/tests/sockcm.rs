//! The tcp connection manager on its own (`uct::cm`): private data both ways over IPv4 and
//! IPv6 loopback, a rejection, a refused connection, and oversized private data.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use uct::{Cm, CmClientState, CmConnRequest, CmListener, Component, Status};
use uct_tcp::sockcm::PRIV_DATA_MAX;

const LIMIT: Duration = Duration::from_secs(20);

fn cm() -> Box<dyn Cm> {
    uct_tcp::COMPONENT.cm_open().expect("tcp has a connection manager").unwrap()
}

/// Progresses the client (and the listener, which writes the answer) until it is decided.
fn outcome(c: &mut dyn uct::CmClient, l: &mut dyn CmListener) -> CmClientState {
    let t = Instant::now();
    loop {
        l.progress(&mut |_| panic!("no other request"));
        match c.progress() {
            CmClientState::Connecting => {}
            s => return s,
        }
        assert!(t.elapsed() < LIMIT, "no answer");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn exchange(ip: std::net::IpAddr) {
    let cm = cm();
    let mut l = cm.listen(&SocketAddr::new(ip, 0)).unwrap();
    let addr = l.local_addr();
    assert_eq!(addr.ip(), ip);
    assert_ne!(addr.port(), 0);
    let big: Vec<u8> = (0..PRIV_DATA_MAX).map(|i| i as u8).collect();
    let mut c = cm.connect(&addr, &big).unwrap();
    // The client's connect and write move from its own progress.
    let t = Instant::now();
    let req = loop {
        assert_eq!(c.progress(), CmClientState::Connecting);
        let mut got = None;
        l.progress(&mut |r| got = Some(r));
        if let Some(r) = got {
            break r;
        }
        assert!(t.elapsed() < LIMIT, "no request");
    };
    assert_eq!(req.priv_data, big, "the client's private data, whole");
    assert_eq!(req.client.ip(), ip);
    l.accept(req.id, b"server data").unwrap();
    assert_eq!(outcome(&mut *c, &mut *l), CmClientState::Accepted(b"server data".to_vec()));
    assert_eq!(l.accept(req.id, b"twice"), Err(Status::NoElem), "a request is answered once");

    let mut c = cm.connect(&addr, b"").unwrap();
    let req = next_request_with(&mut *c, &mut *l);
    assert!(req.priv_data.is_empty());
    l.reject(req.id);
    assert_eq!(outcome(&mut *c, &mut *l), CmClientState::Failed(Status::Rejected));
}

fn next_request_with(c: &mut dyn uct::CmClient, l: &mut dyn CmListener) -> CmConnRequest {
    let t = Instant::now();
    loop {
        c.progress();
        let mut got = None;
        l.progress(&mut |r| got = Some(r));
        if let Some(r) = got {
            return r;
        }
        assert!(t.elapsed() < LIMIT, "no request");
    }
}

#[test]
fn private_data_both_ways_over_ipv4() {
    exchange(Ipv4Addr::LOCALHOST.into());
}

#[test]
fn private_data_both_ways_over_ipv6() {
    exchange(Ipv6Addr::LOCALHOST.into());
}

#[test]
fn refused_and_oversized() {
    let cm = cm();
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut c = cm.connect(&gone, b"x").unwrap();
    let t = Instant::now();
    let st = loop {
        match c.progress() {
            CmClientState::Connecting => assert!(t.elapsed() < LIMIT),
            s => break s,
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(st, CmClientState::Failed(Status::Unreachable));
    assert_eq!(cm.connect(&gone, &vec![0; PRIV_DATA_MAX + 1]).err(), Some(Status::ExceedsLimit));
    let mut l = cm.listen(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let mut c = cm.connect(&l.local_addr(), b"y").unwrap();
    let req = next_request_with(&mut *c, &mut *l);
    assert_eq!(l.accept(req.id, &vec![0; PRIV_DATA_MAX + 1]), Err(Status::ExceedsLimit));
}
