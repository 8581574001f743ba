//! The bootstrap ("run-time environment") of `ucx-perf`: how the two sides find each other
//! and trade the bytes a test needs before it runs, as `ucx_perftest` does over TCP.
//!
//! - The **server** (no host name) listens on `-p` (default 13337) on every address (IPv4,
//!   or IPv6 with `-6`, which on Linux also accepts IPv4 clients), prints
//!   `Waiting for connection...` and, once a client is in, `Accepted connection from <ip>:<port>`
//!   to stdout (whatever `-f`/`-v` say), and stops listening.
//! - The **client** (host name given) connects to `host:port`. Unlike the reference, which
//!   gives up at once, it retries refused connections for up to [`CONNECT_RETRY`], so the two
//!   sides may be started in any order.
//! - The server runs the **client's** test parameters (the reference sends its whole
//!   parameter block to the server): [`Rte::exchange_params`]. Output options and the
//!   machine-local ones stay each side's own.
//! - After that both sides trade opaque blobs ([`Rte::exchange`]: addresses, keys, status)
//!   and meet at barriers ([`Rte::barrier_with`], which keeps a transport
//!   progressing while it waits, as the reference's barrier does).
//! - **Loopback** (`-l`): one process is both sides; [`Rte::exchange`] returns its own bytes.
//!
//! Wire format (ours; the C tool's is a raw struct dump and the two do not interoperate):
//! both sides first send the 8-byte [`MAGIC`] and check the peer's, then every message is a
//! frame `kind: u8` (`D` data, `B` barrier), `length: u64` little-endian, payload. A payload
//! over [`MAX_BLOB`] (64 MiB) is refused before anything is allocated for it, and a frame of
//! the wrong kind is reported as a protocol error rather than misread.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use ucx_perf::params::PerfParams;

pub mod launcher;
mod params;
#[cfg(test)]
mod tests;

use params::{decode_params, encode_params, merge_local};

use crate::opts::validate;

/// Largest blob a peer may send.
pub const MAX_BLOB: usize = 64 << 20;
/// First bytes each side sends: a peer that is not `ucx-perf` (or another version of its
/// bootstrap) is told apart from a slow one.
pub const MAGIC: [u8; 8] = *b"UCXPERF\x01";
/// How long the client keeps retrying a refused connection.
pub const CONNECT_RETRY: Duration = Duration::from_secs(10);
/// How long each side waits for the peer's [`MAGIC`].
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const KIND_DATA: u8 = b'D';
const KIND_BARRIER: u8 = b'B';
pub(super) const PARAMS_HEADER: &str = "ucx-perf-params 1";

fn proto_err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// A server socket bound but not yet connected (lets the caller learn the port before
/// blocking in [`accept`](Listener::accept), e.g. with port 0).
pub struct Listener {
    inner: TcpListener,
}

impl Listener {
    /// Binds `port` on every IPv4 address, or every IPv6 address with `ipv6`
    /// (`SO_REUSEADDR` is set, as the reference sets it).
    pub fn bind(port: u16, ipv6: bool) -> io::Result<Listener> {
        let ip = if ipv6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) };
        let inner = TcpListener::bind(SocketAddr::new(ip, port))
            .map_err(|e| io::Error::new(e.kind(), format!("server failed: bind() to port {port} failed: {e}")))?;
        Ok(Listener { inner })
    }

    /// The port actually bound.
    #[cfg(test)]
    pub fn local_port(&self) -> io::Result<u16> {
        Ok(self.inner.local_addr()?.port())
    }

    /// Waits at most `limit` for one client (see [`Listener::accept`]).
    pub fn accept_timeout(self, limit: Duration) -> io::Result<(Rte, SocketAddr)> {
        self.inner.set_nonblocking(true)?;
        let deadline = Instant::now() + limit;
        loop {
            match self.inner.accept() {
                Ok((stream, peer)) => {
                    stream.set_nonblocking(false)?;
                    drop(self.inner);
                    return Ok((Rte::from_stream(stream, true)?, peer));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no peer connected in {limit:?}")));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits for one client, checks it speaks this bootstrap, and closes the listening socket.
    /// Returns the connection and the client's address.
    pub fn accept(self) -> io::Result<(Rte, SocketAddr)> {
        let (stream, peer) = self.inner.accept()?;
        drop(self.inner);
        let rte = Rte::from_stream(stream, true)?;
        Ok((rte, peer))
    }
}

/// `<ip>:<port>` as the reference prints a peer (no brackets around IPv6 addresses).
pub fn peer_string(addr: &SocketAddr) -> String {
    format!("{}:{}", addr.ip(), addr.port())
}

/// One side's connection to the other (or to itself in loopback).
#[derive(Debug)]
pub struct Rte {
    stream: Option<TcpStream>,
    is_server: bool,
    timeout: Option<Duration>,
}

impl Rte {
    /// The server side: listens on `port`, prints `Waiting for connection...`, accepts one
    /// client, prints `Accepted connection from <ip>:<port>` (both on stdout).
    pub fn server(port: u16, ipv6: bool) -> io::Result<Rte> {
        let listener = Listener::bind(port, ipv6)?;
        let mut out = io::stdout().lock();
        writeln!(out, "Waiting for connection...")?;
        out.flush()?;
        let (rte, peer) = listener.accept()?;
        writeln!(out, "Accepted connection from {}", peer_string(&peer))?;
        out.flush()?;
        Ok(rte)
    }

    /// The client side with the reference's address-family rule: `Some(false)` only IPv4
    /// addresses (no `-6`), `Some(true)` only IPv6 (`-6`), `None` any. Refused connections
    /// are retried until `retry` has passed (zero: one attempt, as the reference).
    pub fn connect(host: &str, port: u16, ipv6: Option<bool>, retry: Duration) -> io::Result<Rte> {
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot resolve server '{host}' port {port}: {e}")))?
            .filter(|a| ipv6.is_none_or(|v6| a.is_ipv6() == v6))
            .collect();
        if addrs.is_empty() {
            let fam = match ipv6 {
                Some(true) => "IPv6 ",
                Some(false) => "IPv4 ",
                None => "",
            };
            let hint = if ipv6 == Some(false) { " (use -6 for IPv6)" } else { "" };
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("server '{host}' has no {fam}address{hint}")));
        }
        let deadline = Instant::now() + retry;
        loop {
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect(a) {
                    Ok(s) => return Rte::from_stream(s, false),
                    Err(e) => last = Some((*a, e)),
                }
            }
            let Some((addr, e)) = last else { unreachable!("addrs is not empty") };
            let retryable = matches!(e.kind(), io::ErrorKind::ConnectionRefused);
            if !retryable || Instant::now() >= deadline {
                return Err(io::Error::new(
                    e.kind(),
                    format!("client failed: connect() to {} failed: {e}", peer_string(&addr)),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The two ranks of a job a launcher started (see [`launcher`]): rank 0 listens on a free
    /// port and publishes where through the launcher's key-value store, rank 1 connects.
    pub fn launched(pmi: &mut dyn launcher::Pmi, ipv6: bool) -> io::Result<Rte> {
        if pmi.size() != 2 {
            return Err(launcher::wrong_size(pmi.name(), pmi.size(), 2));
        }
        if pmi.rank() == 0 {
            let listener = Listener::bind(0, ipv6)?;
            let port = listener.inner.local_addr()?.port();
            let ips: Vec<IpAddr> = launcher::local_ips().into_iter().filter(|ip| ipv6 || ip.is_ipv4()).collect();
            pmi.put(launcher::ADDR_KEY, &launcher::encode_addrs(&ips, port))?;
            pmi.fence()?;
            Ok(listener.accept_timeout(CONNECT_RETRY * 6)?.0)
        } else {
            pmi.fence()?;
            let addrs = launcher::decode_addrs(&pmi.get(0, launcher::ADDR_KEY)?)?;
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                    Ok(s) => return Rte::from_stream(s, false),
                    Err(e) => last = Some(format!("{}: {e}", peer_string(a))),
                }
            }
            Err(io::Error::other(format!(
                "cannot reach rank 0 at any of its addresses (last: {})",
                last.unwrap_or_default()
            )))
        }
    }

    /// Both sides in this process.
    pub fn loopback() -> Rte {
        Rte { stream: None, is_server: true, timeout: None }
    }

    fn from_stream(mut stream: TcpStream, is_server: bool) -> io::Result<Rte> {
        // Small frames must not wait for Nagle.
        stream.set_nodelay(true)?;
        stream.write_all(&MAGIC)?;
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let mut magic = [0u8; 8];
        stream.read_exact(&mut magic).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no ucx-perf handshake from the peer within {HANDSHAKE_TIMEOUT:?} (is it ucx-perf?)"),
            ),
            io::ErrorKind::UnexpectedEof => proto_err("the peer closed the connection during the handshake"),
            _ => e,
        })?;
        if magic != MAGIC {
            return Err(proto_err("the peer is not ucx-perf (or another version): bad handshake"));
        }
        stream.set_read_timeout(None)?;
        Ok(Rte { stream: Some(stream), is_server, timeout: None })
    }

    /// True on the server and in loopback (group index 0).
    pub fn is_server(&self) -> bool {
        self.is_server
    }

    /// True in loopback.
    pub fn is_loopback(&self) -> bool {
        self.stream.is_none()
    }

    /// Sides in the group: 1 in loopback, else 2.
    #[cfg(test)]
    pub fn group_size(&self) -> u32 {
        if self.is_loopback() {
            1
        } else {
            2
        }
    }

    /// This side's index: 0 for the server (and loopback), 1 for the client.
    pub fn group_index(&self) -> u32 {
        u32::from(!self.is_server)
    }

    /// The peer's index (`size - 1 - index`: itself in loopback).
    #[cfg(test)]
    pub fn peer_index(&self) -> u32 {
        self.group_size() - 1 - self.group_index()
    }

    /// Bounds every later wait for the peer (`None`, the default: wait as long as it takes,
    /// as the reference does; a peer that dies still ends the wait with an error).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.timeout = timeout;
        if let Some(s) = &self.stream {
            s.set_read_timeout(timeout)?;
            s.set_write_timeout(timeout)?;
        }
        Ok(())
    }

    fn stream(&mut self) -> &mut TcpStream {
        self.stream.as_mut().expect("called only with a peer")
    }

    fn send_frame(&mut self, kind: u8, payload: &[u8]) -> io::Result<()> {
        if payload.len() > MAX_BLOB {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("blob of {} bytes is larger than the bootstrap's limit ({MAX_BLOB})", payload.len()),
            ));
        }
        let mut frame = Vec::with_capacity(9 + payload.len());
        frame.push(kind);
        frame.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        frame.extend_from_slice(payload);
        self.stream().write_all(&frame)
    }

    fn check_header(hdr: &[u8; 9], kind: u8) -> io::Result<usize> {
        let len = u64::from_le_bytes(hdr[1..].try_into().expect("8 bytes"));
        if hdr[0] != kind {
            return Err(proto_err(format!(
                "bootstrap out of step: expected a {} frame, the peer sent {}",
                kind_name(kind),
                kind_name(hdr[0])
            )));
        }
        if len > MAX_BLOB as u64 {
            return Err(proto_err(format!("the peer sent a blob of {len} bytes (limit {MAX_BLOB})")));
        }
        Ok(len as usize)
    }

    fn recv_frame(&mut self, kind: u8) -> io::Result<Vec<u8>> {
        let mut hdr = [0u8; 9];
        self.stream().read_exact(&mut hdr).map_err(eof_is_peer_gone)?;
        let len = Self::check_header(&hdr, kind)?;
        // Grows with what arrives: a lying length does not allocate 64 MiB up front.
        let mut payload = Vec::with_capacity(len.min(64 << 10));
        self.stream().take(len as u64).read_to_end(&mut payload)?;
        if payload.len() != len {
            return Err(eof_is_peer_gone(io::Error::from(io::ErrorKind::UnexpectedEof)));
        }
        Ok(payload)
    }

    /// Sends `mine` to the peer and returns the peer's blob (in loopback: `mine`). The server
    /// sends first and the client receives first, so blobs larger than the socket buffers do
    /// not deadlock.
    pub fn exchange(&mut self, mine: &[u8]) -> io::Result<Vec<u8>> {
        if self.is_loopback() {
            return Ok(mine.to_vec());
        }
        if self.is_server {
            self.send_frame(KIND_DATA, mine)?;
            self.recv_frame(KIND_DATA)
        } else {
            let theirs = self.recv_frame(KIND_DATA)?;
            self.send_frame(KIND_DATA, mine)?;
            Ok(theirs)
        }
    }

    /// Waits until the peer reaches its barrier too.
    #[cfg(test)]
    pub fn barrier(&mut self) -> io::Result<()> {
        self.barrier_with(&mut || {})
    }

    /// Waits until the peer reaches its barrier, calling `progress` about every millisecond
    /// meanwhile (the reference progresses the transport worker while it waits, which a
    /// peer's flush may need).
    pub fn barrier_with(&mut self, progress: &mut dyn FnMut()) -> io::Result<()> {
        if self.is_loopback() {
            return Ok(());
        }
        self.send_frame(KIND_BARRIER, &[])?;
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let stream = self.stream();
        stream.set_read_timeout(Some(Duration::from_millis(1)))?;
        let mut hdr = [0u8; 9];
        let mut got = 0;
        let res = loop {
            if got == hdr.len() {
                break Ok(());
            }
            match stream.read(&mut hdr[got..]) {
                Ok(0) => break Err(eof_is_peer_gone(io::Error::from(io::ErrorKind::UnexpectedEof))),
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break Err(io::Error::new(io::ErrorKind::TimedOut, "timed out waiting for the peer's barrier"));
                    }
                    progress();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let timeout = self.timeout;
        self.stream().set_read_timeout(timeout)?;
        res?;
        let len = Self::check_header(&hdr, KIND_BARRIER)?;
        if len != 0 {
            return Err(proto_err("barrier frame with a payload"));
        }
        Ok(())
    }

    /// Agrees on the test parameters: the client sends its own and gets them back; the
    /// server receives the client's and returns them with its own output and local options
    /// (`-f -v -N -I -c -p -6 -b`, host name) kept. The server checks them ([`validate`],
    /// when it has no batch files of its own) and tells the client if it cannot run them, so
    /// both sides fail with the same message. Loopback returns `p`.
    pub fn exchange_params(&mut self, p: &PerfParams) -> Result<PerfParams, String> {
        if self.is_loopback() {
            return Ok(p.clone());
        }
        if self.is_server {
            let blob = self.recv_frame(KIND_DATA).map_err(|e| format!("receiving the client's parameters: {e}"))?;
            let result = decode_params(&blob).and_then(|theirs| {
                let merged = merge_local(theirs, p);
                if merged.batch_files.is_empty() {
                    if !merged.has_test {
                        return Err("the client names no test: give the same -b batch files to both sides, \
                                    or -t to the client"
                            .to_string());
                    }
                    validate(&merged)?;
                }
                Ok(merged)
            });
            let reply = match &result {
                Ok(_) => "OK".to_string(),
                Err(e) => format!("ERR {e}"),
            };
            self.send_frame(KIND_DATA, reply.as_bytes()).map_err(|e| format!("answering the client: {e}"))?;
            result
        } else {
            self.send_frame(KIND_DATA, encode_params(p).as_bytes())
                .map_err(|e| format!("sending the parameters to the server: {e}"))?;
            let reply = self.recv_frame(KIND_DATA).map_err(|e| format!("waiting for the server: {e}"))?;
            match std::str::from_utf8(&reply) {
                Ok("OK") => Ok(p.clone()),
                Ok(r) if r.starts_with("ERR ") => Err(format!("the server refused the test: {}", &r[4..])),
                _ => Err("the server answered garbage to the parameters".to_string()),
            }
        }
    }

    /// Checks that both sides are about to run the same test (batch runs: each side reads
    /// its own batch files, as in the reference, so they could differ). Compares every test
    /// parameter and the batch names; output and local options may differ.
    pub fn verify_params(&mut self, p: &PerfParams) -> Result<(), String> {
        if self.is_loopback() {
            return Ok(());
        }
        let mine = encode_params(p);
        let theirs = self.exchange(mine.as_bytes()).map_err(|e| format!("comparing parameters: {e}"))?;
        if theirs == mine.as_bytes() {
            return Ok(());
        }
        let theirs = String::from_utf8_lossy(&theirs);
        let diff = mine
            .lines()
            .zip(theirs.lines())
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("this side has {a}, the peer {b}"))
            .unwrap_or_else(|| "different parameter lists".to_string());
        Err(format!("client and server run different tests: {diff}"))
    }

    /// Closes the connection (also done on drop).
    pub fn close(mut self) {
        if let Some(s) = self.stream.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn kind_name(k: u8) -> String {
    match k {
        KIND_DATA => "data".to_string(),
        KIND_BARRIER => "barrier".to_string(),
        other => format!("unknown (0x{other:02x})"),
    }
}

fn eof_is_peer_gone(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the bootstrap connection")
    } else {
        e
    }
}
