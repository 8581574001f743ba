//! `tcp_sockcm`: the tcp component's connection manager ([`uct::cm`]), UCX's client/server
//! connection over a plain TCP connection that lives only for the exchange.
//!
//! The exchange, each side's block prefixed by [`MAGIC`]:
//! * client -> server: `MAGIC`, private data length (u32, little-endian), private data;
//! * server -> client: `MAGIC`, verdict (u8: 0 accepted, 1 rejected), 3 zero bytes, private
//!   data length (u32), private data; then the server closes the connection.
//!
//! The server drops, without an answer and with a debug log, a connection that sends bytes of
//! another protocol, announces more than [`PRIV_DATA_MAX`] bytes, closes early, or says nothing
//! for [`IDLE_TIMEOUT`]. A port scan costs an accept and a close. Both sides are non-blocking
//! and progressed by the caller.

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use ucs::async_::{EventSet, Events};
use ucs::{Status, UcsResult};
use uct::{Cm, CmClient, CmClientState, CmConnRequest, CmListener};

/// First bytes of both sides' blocks.
pub const MAGIC: [u8; 8] = *b"UCXRSCM1";
/// The largest private data either side may send.
pub const PRIV_DATA_MAX: usize = 16 * 1024;
/// How long the server waits for a connected client's request.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many connections may wait for their request at once (more are closed at once).
const MAX_PENDING: usize = 1024;
const REQ_HDR: usize = 12;
const REPLY_HDR: usize = 16;
const LISTENER_TOKEN: u64 = u64::MAX;

/// The tcp connection manager.
pub struct TcpSockCm;

fn io_err(what: &str, e: std::io::Error) -> Status {
    tracing::error!("tcp_sockcm: {what}: {e}");
    Status::IoError
}

/// A non-blocking socket for `addr`'s family (socket2 makes it close-on-exec).
fn new_socket(addr: &SocketAddr) -> UcsResult<Socket> {
    let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP)).map_err(|e| io_err("socket", e))?;
    sock.set_nonblocking(true).map_err(|e| io_err("non-blocking socket", e))?;
    Ok(sock)
}

impl Cm for TcpSockCm {
    fn name(&self) -> &str {
        crate::md::NAME
    }

    fn priv_data_max(&self) -> usize {
        PRIV_DATA_MAX
    }

    fn listen(&self, addr: &SocketAddr) -> UcsResult<Box<dyn CmListener>> {
        let sock = new_socket(addr)?;
        sock.set_reuse_address(true).map_err(|e| io_err("SO_REUSEADDR", e))?;
        if let Err(e) = sock.bind(&SockAddr::from(*addr)) {
            tracing::error!("tcp_sockcm: cannot listen on {addr}: {e}");
            return Err(if e.kind() == ErrorKind::AddrInUse { Status::Busy } else { Status::InvalidAddr });
        }
        sock.listen(128).map_err(|e| io_err("listen", e))?;
        let local = sock.local_addr().ok().and_then(|a| a.as_socket()).ok_or(Status::IoError)?;
        let set = EventSet::new()?;
        set.add(sock.as_raw_fd(), Events::READ, LISTENER_TOKEN)?;
        tracing::debug!("tcp_sockcm: listening on {local}");
        Ok(Box::new(TcpListener { sock, local, set, conns: Vec::new(), next_id: 1 }))
    }

    fn connect(&self, addr: &SocketAddr, priv_data: &[u8]) -> UcsResult<Box<dyn CmClient>> {
        if priv_data.len() > PRIV_DATA_MAX {
            tracing::error!("tcp_sockcm: {} bytes of private data, more than {PRIV_DATA_MAX}", priv_data.len());
            return Err(Status::ExceedsLimit);
        }
        let sock = new_socket(addr)?;
        let _ = sock.set_tcp_nodelay(true);
        let connecting = match sock.connect(&SockAddr::from(*addr)) {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == ErrorKind::WouldBlock => true,
            Err(e) => {
                tracing::debug!("tcp_sockcm: connect to {addr} failed: {e}");
                return Ok(Box::new(TcpClient::failed(sock, *addr, connect_status(&e))));
            }
        };
        let mut out = Vec::with_capacity(REQ_HDR + priv_data.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&(priv_data.len() as u32).to_le_bytes());
        out.extend_from_slice(priv_data);
        Ok(Box::new(TcpClient {
            sock,
            server: *addr,
            connecting,
            out,
            sent: 0,
            inbuf: Vec::new(),
            state: CmClientState::Connecting,
        }))
    }
}

/// The status a failed connect maps to.
fn connect_status(e: &std::io::Error) -> Status {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) | Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) | Some(libc::EADDRNOTAVAIL) => {
            Status::Unreachable
        }
        Some(libc::ETIMEDOUT) => Status::EndpointTimeout,
        Some(libc::ECONNRESET) | Some(libc::EPIPE) => Status::ConnectionReset,
        _ => Status::IoError,
    }
}

/// Where a server-side connection stands.
enum Stage {
    /// Reading the request.
    Reading,
    /// The request went to the caller; waiting for accept or reject.
    Raised,
    /// Writing the answer; closed once written.
    Answering,
}

struct ServerConn {
    id: u64,
    sock: Socket,
    peer: SocketAddr,
    stage: Stage,
    /// Bytes read (request) or to write (answer).
    buf: Vec<u8>,
    pos: usize,
    since: Instant,
}

/// A listening socket and its connections.
struct TcpListener {
    sock: Socket,
    local: SocketAddr,
    /// The listener and every connection reading or answering (level-triggered).
    set: EventSet,
    conns: Vec<ServerConn>,
    next_id: u64,
}

/// What a step of a connection decided.
enum Step {
    /// Keep it.
    Keep,
    /// Its request is whole.
    Request,
    /// Drop it (closed, bad, done).
    Drop,
}

impl ServerConn {
    /// Reads what the socket has; whether the request is whole.
    fn read(&mut self) -> Step {
        let mut chunk = [0u8; 4096];
        loop {
            let need = self.need();
            if self.buf.len() >= REQ_HDR && self.buf.len() >= need {
                return Step::Request;
            }
            let want = (need - self.buf.len()).min(chunk.len());
            match self.sock.read(&mut chunk[..want]) {
                Ok(0) => {
                    tracing::debug!(peer = %self.peer, "tcp_sockcm: a client closed before its request was whole");
                    return Step::Drop;
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if self.buf.len() >= MAGIC.len() && self.buf[..MAGIC.len()] != MAGIC {
                        tracing::debug!(peer = %self.peer, "tcp_sockcm: a client sent bytes of another protocol");
                        return Step::Drop;
                    }
                    if self.buf.len() >= REQ_HDR && self.announced() > PRIV_DATA_MAX {
                        tracing::debug!(
                            peer = %self.peer,
                            "tcp_sockcm: a client announced {} bytes of private data, more than {PRIV_DATA_MAX}",
                            self.announced()
                        );
                        return Step::Drop;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(peer = %self.peer, "tcp_sockcm: reading a request failed: {e}");
                    return Step::Drop;
                }
            }
        }
    }

    fn announced(&self) -> usize {
        u32::from_le_bytes(self.buf[8..12].try_into().expect("4 bytes")) as usize
    }

    /// Bytes the whole request has, as far as known.
    fn need(&self) -> usize {
        if self.buf.len() < REQ_HDR {
            REQ_HDR
        } else {
            REQ_HDR + self.announced()
        }
    }

    /// Writes the answer; done when all went (or the client is gone).
    fn write(&mut self) -> Step {
        while self.pos < self.buf.len() {
            match self.sock.write(&self.buf[self.pos..]) {
                Ok(n) => self.pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(peer = %self.peer, "tcp_sockcm: answering a client failed: {e}");
                    return Step::Drop;
                }
            }
        }
        Step::Drop
    }
}

impl TcpListener {
    fn accept_all(&mut self) -> usize {
        let mut n = 0;
        loop {
            match self.sock.accept() {
                Ok((sock, addr)) => {
                    n += 1;
                    let Some(peer) = addr.as_socket() else { continue };
                    if self.conns.len() >= MAX_PENDING {
                        tracing::debug!(%peer, "tcp_sockcm: {MAX_PENDING} connections wait already; closed");
                        continue;
                    }
                    if sock.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let id = self.next_id;
                    self.next_id += 1;
                    if self.set.add(sock.as_raw_fd(), Events::READ, id).is_err() {
                        continue;
                    }
                    tracing::trace!(%peer, id, "tcp_sockcm: accepted a connection");
                    self.conns.push(ServerConn {
                        id,
                        sock,
                        peer,
                        stage: Stage::Reading,
                        buf: Vec::new(),
                        pos: 0,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: try again on the next progress.
                    tracing::warn!("tcp_sockcm: accept on {} failed: {e}", self.local);
                    return n;
                }
            }
        }
    }

    fn remove(&mut self, i: usize) {
        let c = self.conns.swap_remove(i);
        let _ = self.set.remove(c.sock.as_raw_fd());
    }

    fn answer(&mut self, id: u64, verdict: u8, priv_data: &[u8]) -> UcsResult<()> {
        let i = self.conns.iter().position(|c| c.id == id && matches!(c.stage, Stage::Raised)).ok_or(Status::NoElem)?;
        let c = &mut self.conns[i];
        c.buf.clear();
        c.buf.extend_from_slice(&MAGIC);
        c.buf.extend_from_slice(&[verdict, 0, 0, 0]);
        c.buf.extend_from_slice(&(priv_data.len() as u32).to_le_bytes());
        c.buf.extend_from_slice(priv_data);
        c.pos = 0;
        c.stage = Stage::Answering;
        let _ = self.set.add(c.sock.as_raw_fd(), Events::WRITE, id);
        if let Step::Drop = c.write() {
            self.remove(i);
        }
        Ok(())
    }
}

impl CmListener for TcpListener {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn event_fd(&self) -> RawFd {
        self.set.as_raw_fd()
    }

    fn progress(&mut self, on_request: &mut dyn FnMut(CmConnRequest)) -> usize {
        let mut n = 0;
        let mut accept = false;
        let _ = self.set.wait(Some(Duration::ZERO), |token, _| accept |= token == LISTENER_TOKEN);
        if accept {
            n += self.accept_all();
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.conns.len() {
            let c = &mut self.conns[i];
            let step = match c.stage {
                Stage::Reading => match c.read() {
                    Step::Keep if now.duration_since(c.since) > IDLE_TIMEOUT => {
                        tracing::debug!(peer = %c.peer, "tcp_sockcm: a client sent no request in {IDLE_TIMEOUT:?}");
                        Step::Drop
                    }
                    s => s,
                },
                Stage::Raised => Step::Keep,
                Stage::Answering => c.write(),
            };
            match step {
                Step::Keep => i += 1,
                Step::Drop => {
                    n += 1;
                    self.remove(i);
                }
                Step::Request => {
                    n += 1;
                    c.stage = Stage::Raised;
                    let req = CmConnRequest { id: c.id, client: c.peer, priv_data: c.buf.split_off(REQ_HDR) };
                    c.buf.clear();
                    // Nothing to read until answered: out of the set, so it does not wake us.
                    let _ = self.set.remove(c.sock.as_raw_fd());
                    i += 1;
                    on_request(req);
                }
            }
        }
        n
    }

    fn accept(&mut self, id: u64, priv_data: &[u8]) -> UcsResult<()> {
        if priv_data.len() > PRIV_DATA_MAX {
            tracing::error!("tcp_sockcm: {} bytes of private data, more than {PRIV_DATA_MAX}", priv_data.len());
            return Err(Status::ExceedsLimit);
        }
        self.answer(id, 0, priv_data)
    }

    fn reject(&mut self, id: u64) {
        let _ = self.answer(id, 1, &[]);
    }
}

/// A client's connection.
struct TcpClient {
    sock: Socket,
    server: SocketAddr,
    connecting: bool,
    out: Vec<u8>,
    sent: usize,
    inbuf: Vec<u8>,
    state: CmClientState,
}

impl TcpClient {
    fn failed(sock: Socket, server: SocketAddr, status: Status) -> TcpClient {
        TcpClient {
            sock,
            server,
            connecting: false,
            out: Vec::new(),
            sent: 0,
            inbuf: Vec::new(),
            state: CmClientState::Failed(status),
        }
    }

    fn fail(&mut self, status: Status, why: &str) -> CmClientState {
        tracing::debug!(server = %self.server, "tcp_sockcm: {why}");
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.state = CmClientState::Failed(status);
        self.state.clone()
    }

    fn step(&mut self) -> CmClientState {
        if self.connecting {
            let mut p = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
            // SAFETY: one valid pollfd; no waiting.
            let r = unsafe { libc::poll(&mut p, 1, 0) };
            if r <= 0 || p.revents == 0 {
                return CmClientState::Connecting;
            }
            match self.sock.take_error() {
                Ok(None) => self.connecting = false,
                Ok(Some(e)) | Err(e) => {
                    let s = connect_status(&e);
                    return self.fail(s, &format!("cannot connect: {e}"));
                }
            }
        }
        while self.sent < self.out.len() {
            match self.sock.write(&self.out[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return CmClientState::Connecting,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    let s = connect_status(&e);
                    return self.fail(s, &format!("sending the request failed: {e}"));
                }
            }
        }
        let mut chunk = [0u8; 4096];
        loop {
            let need = if self.inbuf.len() < REPLY_HDR {
                REPLY_HDR
            } else {
                REPLY_HDR + u32::from_le_bytes(self.inbuf[12..16].try_into().expect("4 bytes")) as usize
            };
            if self.inbuf.len() >= REPLY_HDR && self.inbuf.len() >= need {
                break;
            }
            let want = (need - self.inbuf.len()).min(chunk.len());
            match self.sock.read(&mut chunk[..want]) {
                Ok(0) => return self.fail(Status::ConnectionReset, "the server closed without answering"),
                Ok(n) => {
                    self.inbuf.extend_from_slice(&chunk[..n]);
                    if self.inbuf.len() >= MAGIC.len() && self.inbuf[..MAGIC.len()] != MAGIC {
                        return self.fail(Status::InvalidAddr, "the server answered in another protocol");
                    }
                    if self.inbuf.len() >= REPLY_HDR {
                        let len = u32::from_le_bytes(self.inbuf[12..16].try_into().expect("4 bytes")) as usize;
                        if len > PRIV_DATA_MAX || self.inbuf[8] > 1 {
                            return self.fail(Status::InvalidAddr, "the server's answer is malformed");
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return CmClientState::Connecting,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    let s = connect_status(&e);
                    return self.fail(s, &format!("reading the answer failed: {e}"));
                }
            }
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.state = if self.inbuf[8] == 0 {
            CmClientState::Accepted(self.inbuf.split_off(REPLY_HDR))
        } else {
            tracing::debug!(server = %self.server, "tcp_sockcm: the server rejected the connection");
            CmClientState::Failed(Status::Rejected)
        };
        self.state.clone()
    }
}

impl CmClient for TcpClient {
    fn event_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn progress(&mut self) -> CmClientState {
        if self.state != CmClientState::Connecting {
            return self.state.clone();
        }
        self.step()
    }
}
