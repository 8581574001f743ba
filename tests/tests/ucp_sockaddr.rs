//! Connecting by socket address (UCX's client/server flow): a listener, connection
//! requests accepted or rejected, clients that know only the server's IP address and port.
//!
//! * Two processes (the test is the server, `ucp-peer sockaddr` the client) over shared
//!   memory and over tcp: every family (tag, stream, active messages; eager and rendezvous
//!   sizes) echoes intact, over the lanes both workers share.
//! * The errors a client sees: no listener (`Unreachable`), rejected (`Rejected`, also when the
//!   handler drops the request), no answer in time (`TimedOut`), the listener gone before it
//!   answered (`ConnectionReset`); the future form connects too.
//! * Bad clients at the listener - a port scan, bytes of another protocol, a length beyond the
//!   limit, a truncated request, private data that is not a worker's, a client that says
//!   nothing - never reach the handler, and the listener keeps serving real clients.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::sockaddr::{self, Inbox, LIMIT};
use ucp::{block_on, ConnRequest, Status};

/// Tests here busy-poll: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

use sockaddr::worker;

fn loopback() -> SocketAddr {
    SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)
}

#[test]
fn a_client_process_connects_by_address_over_shared_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lanes = sockaddr::serve_a_client_process(env!("CARGO_BIN_EXE_ucp-peer"), "shm", &[]);
    assert!(
        lanes.split(' ').any(|l| l == "am=posix/memory" || l == "am=sysv/memory"),
        "two processes on one host talk over shared memory: {lanes}"
    );
}

#[test]
fn a_client_process_connects_by_address_over_tcp() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lanes = sockaddr::serve_a_client_process(env!("CARGO_BIN_EXE_ucp-peer"), "tcp", &[("NET_DEVICES", "lo")]);
    assert!(lanes.split(' ').any(|l| l == "am=tcp/lo"), "{lanes}");
}

/// What a server thread does with each request.
#[derive(Clone, Copy, PartialEq)]
enum Policy {
    /// Accepts, and runs the server's side of the echo.
    Echo,
    /// Rejects.
    Reject,
    /// Drops the request in the handler.
    Drop,
    /// Keeps the request, unanswered, until the server stops.
    Hold,
}

/// A server worker on its own thread.
struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Server {
    fn start(tls: &'static str, cfg: &'static [(&'static str, &'static str)], policy: Policy) -> Server {
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = channel();
        let (s, n) = (stop.clone(), requests.clone());
        let thread = std::thread::spawn(move || {
            let w = worker(tls, cfg, "server");
            let inbox = Inbox::install(&w);
            let held: Arc<Mutex<Vec<ConnRequest>>> = Arc::default();
            let h = held.clone();
            let l = w
                .listener(loopback(), move |req| {
                    n.fetch_add(1, Ordering::SeqCst);
                    match policy {
                        Policy::Reject => req.reject(),
                        Policy::Drop => drop(req),
                        Policy::Echo | Policy::Hold => h.lock().unwrap().push(req),
                    }
                })
                .unwrap();
            tx.send(l.query()).unwrap();
            let t = Instant::now();
            while !s.load(Ordering::SeqCst) {
                assert!(t.elapsed() < Duration::from_secs(120), "server thread: watchdog");
                w.progress();
                if policy == Policy::Echo {
                    let req = held.lock().unwrap().pop();
                    if let Some(req) = req {
                        let ep = w.ep_create_conn_request(req).map_err(|e| format!("accept: {e}"))?;
                        sockaddr::server(&w, &ep, &inbox)?;
                    }
                }
            }
            // Unanswered requests go with the listener.
            drop(l);
            drop(held);
            Ok(())
        });
        let addr = rx.recv_timeout(LIMIT).expect("the server listens");
        Server { addr, stop, requests, thread: Some(thread) }
    }

    fn stop(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().map_or(Ok(()), |t| t.join().expect("server thread"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

#[test]
fn clients_see_clear_errors() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const TLS: &str = "tcp";
    const CFG: &[(&str, &str)] = &[("NET_DEVICES", "lo")];
    let client = worker(TLS, CFG, "client");

    // No listener at the address.
    let gone = std::net::TcpListener::bind(loopback()).unwrap().local_addr().unwrap();
    assert_eq!(client.ep_create_sockaddr(gone).err(), Some(Status::Unreachable));

    // Rejected by the handler, or dropped by it.
    for policy in [Policy::Reject, Policy::Drop] {
        let mut s = Server::start(TLS, CFG, policy);
        assert_eq!(client.ep_create_sockaddr(s.addr).err(), Some(Status::Rejected));
        assert_eq!(s.requests.load(Ordering::SeqCst), 1);
        s.stop().unwrap();
    }

    // No answer in time; then the listener goes before answering.
    let mut s = Server::start(TLS, CFG, Policy::Hold);
    let t = Instant::now();
    assert_eq!(client.ep_create_sockaddr_timeout(s.addr, Duration::from_millis(300)).err(), Some(Status::TimedOut));
    assert!(t.elapsed() < LIMIT);
    let waiting = client.ep_connect(s.addr);
    // The future is polled on this thread while the server thread holds the request; the
    // server stops once it has it.
    let stopper = std::thread::spawn({
        let stop = s.stop.clone();
        let n = s.requests.clone();
        move || {
            let t = Instant::now();
            while n.load(Ordering::SeqCst) < 2 && t.elapsed() < LIMIT {
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.store(true, Ordering::SeqCst);
        }
    });
    assert_eq!(block_on(waiting).err(), Some(Status::ConnectionReset));
    stopper.join().unwrap();
    s.stop().unwrap();

    // The future form connects, and the endpoint carries every family.
    let mut s = Server::start(TLS, CFG, Policy::Echo);
    let ep = block_on(client.ep_connect(s.addr)).expect("connected by the future form");
    let inbox = Inbox::install(&client);
    sockaddr::client(&client, &ep, &inbox).unwrap();
    s.stop().unwrap();
}

/// Sends `bytes` to the listener, then waits until it closes the connection or `linger`
/// passes; what it answered.
fn raw_client(addr: SocketAddr, bytes: &[u8], close: bool, linger: Duration) -> Vec<u8> {
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(bytes).unwrap();
    if close {
        c.shutdown(std::net::Shutdown::Write).unwrap();
    }
    c.set_read_timeout(Some(linger)).unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    got
}

#[test]
fn bad_clients_do_not_reach_the_handler_and_the_listener_keeps_serving() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const TLS: &str = "tcp";
    const CFG: &[(&str, &str)] = &[("NET_DEVICES", "lo")];
    let mut s = Server::start(TLS, CFG, Policy::Echo);
    let magic = uct_tcp::sockcm::MAGIC;
    let short = Duration::from_millis(300);

    // A port scan: connect and close.
    drop(TcpStream::connect(s.addr).unwrap());
    // Another protocol.
    assert!(raw_client(s.addr, b"GET / HTTP/1.0\r\n\r\n", false, LIMIT).is_empty(), "closed without an answer");
    // A length beyond the limit.
    let mut huge = magic.to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(raw_client(s.addr, &huge, false, LIMIT).is_empty());
    // A truncated request, then the client closes.
    let mut cut = magic.to_vec();
    cut.extend_from_slice(&100u32.to_le_bytes());
    cut.extend_from_slice(&[7; 10]);
    assert!(raw_client(s.addr, &cut, true, LIMIT).is_empty());
    // A whole request whose private data is not a worker's: rejected by ucp before the handler.
    let mut junk = magic.to_vec();
    junk.extend_from_slice(&5u32.to_le_bytes());
    junk.extend_from_slice(b"hello");
    let answer = raw_client(s.addr, &junk, false, LIMIT);
    assert_eq!(answer.len(), 16, "a rejection: {answer:?}");
    assert_eq!(&answer[..8], &magic);
    assert_eq!(answer[8], 1, "the verdict is 'rejected'");
    // A client that says nothing, still connected while a real client is served.
    let silent = TcpStream::connect(s.addr).unwrap();
    assert!(raw_client(s.addr, &magic[..3], false, short).is_empty(), "half a magic: no answer yet");

    let client = worker(TLS, CFG, "client");
    let inbox = Inbox::install(&client);
    let ep = client.ep_create_sockaddr(s.addr).expect("a real client is served");
    sockaddr::client(&client, &ep, &inbox).unwrap();
    assert_eq!(s.requests.load(Ordering::SeqCst), 1, "only the real client reached the handler");
    drop(silent);
    s.stop().unwrap();
}
