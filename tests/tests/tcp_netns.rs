//! tcp across a real network device: two processes in two network namespaces that the test
//! makes, joined by a veth pair (`tests::netns`), with `UCX_TLS=tcp` and each side's
//! `UCX_NET_DEVICES` its end of the pair.
//!
//! * By socket address: the client connects to the server's veth address, and every family
//!   (tag, stream, active messages; eager and rendezvous sizes) echoes intact; also with IPv6
//!   addresses only (the transport's interfaces and the connection manager on IPv6).
//! * A link taken down in the middle of a transfer: the flooding client and the draining
//!   server both see an endpoint error within the keepalive time (`UCX_TCP_KEEPIDLE=1s`,
//!   `KEEPINTVL=1s`, `KEEPCNT=2`: 3 s), and both exit; nothing hangs.
//!
//! Needs root (CI runs as root); elsewhere the tests say why they cannot run and pass, except
//! under `CI`, where that is a failure.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tests::netns::{NetPair, Side};
use tests::peer::Peer;

/// The pairs busy-poll: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());
const LIMIT: Duration = Duration::from_secs(60);
const KEEPALIVE: [(&str, &str); 3] = [("TCP_KEEPIDLE", "1s"), ("TCP_KEEPINTVL", "1s"), ("TCP_KEEPCNT", "2")];

fn pair() -> Option<NetPair> {
    made(NetPair::new())
}

fn made(p: Result<NetPair, String>) -> Option<NetPair> {
    match p {
        Ok(p) => Some(p),
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "cannot make network namespaces: {e}");
            eprintln!("skipped: cannot make network namespaces: {e}");
            None
        }
    }
}

fn peer(side: &Side, args: &[&str], what: &str) -> Peer {
    let mut c = NetPair::command(side, env!("CARGO_BIN_EXE_ucp-peer"), args);
    c.env("UCX_TLS", "tcp").env("UCX_NET_DEVICES", &side.dev);
    for (k, v) in KEEPALIVE {
        c.env(format!("UCX_{k}"), v);
    }
    Peer::start(c, what)
}

/// Starts the server in `a` and the client in `b` (`flood`: they go on streaming afterwards);
/// both have echoed every family when this returns.
fn connected(p: &NetPair, flood: bool) -> (Peer, Peer) {
    let extra: &[&str] = if flood { &["flood"] } else { &[] };
    let listen = std::net::SocketAddr::new(p.a.ip, 0).to_string();
    let mut server = peer(&p.a, &[&["sockaddr-server", &listen][..], extra].concat(), "server in namespace a");
    let addr = server.expect("listening", LIMIT, || {});
    assert_eq!(addr.parse::<std::net::SocketAddr>().map(|a| a.ip()), Ok(p.a.ip), "{addr}");
    let mut client = peer(&p.b, &[&["sockaddr", &addr][..], extra].concat(), "client in namespace b");
    for (who, dev) in [(&mut client, &p.b.dev), (&mut server, &p.a.dev)] {
        let lanes = who.expect("lanes", LIMIT, || {});
        assert!(lanes.split(' ').any(|l| l == format!("am=tcp/{dev}")), "over the veth device: {lanes}");
        assert_eq!(who.line(LIMIT, || {}), "echo ok");
    }
    (server, client)
}

#[test]
fn every_family_crosses_a_veth_pair_by_socket_address() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = pair() else { return };
    let (mut server, mut client) = connected(&p, false);
    assert!(client.finish(LIMIT, || {}).success());
    assert!(server.finish(LIMIT, || {}).success());
}

#[test]
fn every_family_crosses_an_ipv6_only_link() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = made(NetPair::new_v6()) else { return };
    let (mut server, mut client) = connected(&p, false);
    assert!(client.finish(LIMIT, || {}).success());
    assert!(server.finish(LIMIT, || {}).success());
}

#[test]
fn a_link_taken_down_mid_transfer_fails_both_endpoints() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = pair() else { return };
    let (mut server, mut client) = connected(&p, true);
    assert_eq!(client.line(LIMIT, || {}), "flooding");
    assert_eq!(server.line(LIMIT, || {}), "draining");
    std::thread::sleep(Duration::from_millis(300));
    let down = Instant::now();
    NetPair::link_down(&p.a).unwrap();
    for (who, name) in [(&mut client, "client"), (&mut server, "server")] {
        let l = who.expect("ep error", LIMIT, || {});
        eprintln!("{name}: endpoint error {l} ({} ms after the link went down)", down.elapsed().as_millis());
        assert!(who.finish(LIMIT, || {}).success(), "{name} exits by itself");
    }
}
