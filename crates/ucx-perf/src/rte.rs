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

use crate::opts::{
    validate, AsyncMode, DataLayout, MemoryType, PerfParams, TestKind, ThreadMode, UcpDatatype, WaitMode,
};

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
const PARAMS_HEADER: &str = "ucx-perf-params 1";

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

/// The client's parameters with the server's local options kept.
fn merge_local(mut theirs: PerfParams, local: &PerfParams) -> PerfParams {
    theirs.server = local.server.clone();
    theirs.port = local.port;
    theirs.ipv6 = local.ipv6;
    theirs.cpus.clone_from(&local.cpus);
    theirs.final_only = local.final_only;
    theirs.csv = local.csv;
    theirs.numeric = local.numeric;
    theirs.extra_info = local.extra_info;
    theirs.batch_files.clone_from(&local.batch_files);
    theirs.batch_names.clone_from(&local.batch_names);
    theirs
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            c => o.push(c),
        }
    }
    o
}

fn unescape(s: &str) -> Result<String, String> {
    let mut o = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            o.push(c);
            continue;
        }
        match it.next() {
            Some('\\') => o.push('\\'),
            Some('n') => o.push('\n'),
            Some('r') => o.push('\r'),
            _ => return Err(format!("bad escape in '{s}'")),
        }
    }
    Ok(o)
}

fn opt_str(v: &Option<String>) -> String {
    match v {
        None => "-".to_string(),
        Some(s) => format!("={}", escape(s)),
    }
}

fn b(v: bool) -> u8 {
    u8::from(v)
}

/// The test parameters as text lines `key value` (machine-local ones left out), in a fixed
/// order so two encodings compare byte for byte.
fn encode_params(p: &PerfParams) -> String {
    let sizes: Vec<String> = p.msg_sizes.iter().map(usize::to_string).collect();
    let mut s = format!(
        "{PARAMS_HEADER}\n\
         test {}\n\
         msg_sizes {}\n\
         iters {}\n\
         warmup {}\n\
         max_outstanding {}\n\
         iov_stride {}\n\
         loopback {}\n\
         no_responder_progress {}\n\
         map_nonblock {}\n\
         percentile {}\n\
         dev {}\n\
         tl {}\n\
         layout {}\n\
         ucp_send_datatype {}\n\
         ucp_recv_datatype {}\n\
         fc_window {}\n\
         am_hdr_size {}\n\
         ucp_am_hdr_size {}\n\
         send_mem {}\n\
         recv_mem {}\n\
         thread_mode {}\n\
         threads {}\n\
         async_mode {}\n\
         wait_mode {}\n\
         wildcard {}\n\
         force_unexpected {}\n\
         wakeup {}\n\
         err_handling {}\n\
         prereg {}\n\
         stream_recv_data {}\n\
         quiet {}\n",
        if p.has_test { p.test.name() } else { "-" },
        sizes.join(","),
        p.iters,
        p.warmup,
        p.max_outstanding,
        p.iov_stride,
        b(p.loopback),
        b(p.no_responder_progress),
        b(p.map_nonblock),
        p.percentile,
        opt_str(&p.dev),
        opt_str(&p.tl),
        p.layout.name(),
        p.ucp_send_datatype.name(),
        p.ucp_recv_datatype.name(),
        p.fc_window,
        p.am_hdr_size,
        p.ucp_am_hdr_size,
        p.send_mem.name(),
        p.recv_mem.name(),
        p.thread_mode.name(),
        p.threads,
        p.async_mode.name(),
        p.wait_mode.map_or("-", |w| w.name()),
        b(p.wildcard),
        b(p.force_unexpected),
        b(p.wakeup),
        b(p.err_handling),
        b(p.prereg),
        b(p.stream_recv_data),
        b(p.quiet),
    );
    for n in &p.batch_names {
        s.push_str(&format!("batch_name ={}\n", escape(n)));
    }
    s
}

/// Reads [`encode_params`]' text back, checking every field; local options get defaults.
fn decode_params(blob: &[u8]) -> Result<PerfParams, String> {
    let text = std::str::from_utf8(blob).map_err(|_| "the client's parameters are not UTF-8".to_string())?;
    let mut lines = text.lines();
    if lines.next() != Some(PARAMS_HEADER) {
        return Err("the client's parameters are in an unknown format (another ucx-perf version?)".to_string());
    }
    let mut p = PerfParams::default();
    let mut seen = std::collections::HashSet::new();
    for line in lines {
        let (key, val) = line.split_once(' ').ok_or_else(|| format!("bad parameter line '{line}'"))?;
        if key != "batch_name" && !seen.insert(key) {
            return Err(format!("parameter '{key}' sent twice"));
        }
        let bad = || format!("bad value for parameter '{key}': '{val}'");
        let num = |v: &str| v.parse::<u64>().map_err(|_| bad());
        let flag = |v: &str| match v {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(bad()),
        };
        let ostr = |v: &str| -> Result<Option<String>, String> {
            match v {
                "-" => Ok(None),
                _ => v.strip_prefix('=').map(unescape).transpose()?.map(Some).ok_or_else(bad),
            }
        };
        let small = |v: &str| -> Result<u32, String> { num(v)?.try_into().map_err(|_| bad()) };
        let size = |v: &str| -> Result<usize, String> { num(v)?.try_into().map_err(|_| bad()) };
        match key {
            "test" => {
                p.has_test = val != "-";
                if p.has_test {
                    p.test = TestKind::from_name(val).ok_or_else(bad)?;
                }
            }
            "msg_sizes" => p.msg_sizes = val.split(',').map(size).collect::<Result<_, _>>()?,
            "iters" => p.iters = num(val)?,
            "warmup" => p.warmup = num(val)?,
            "max_outstanding" => p.max_outstanding = small(val)?,
            "iov_stride" => p.iov_stride = size(val)?,
            "loopback" => p.loopback = flag(val)?,
            "no_responder_progress" => p.no_responder_progress = flag(val)?,
            "map_nonblock" => p.map_nonblock = flag(val)?,
            "percentile" => {
                p.percentile = val.parse::<f64>().ok().filter(|r| (0.0..=100.0).contains(r)).ok_or_else(bad)?
            }
            "dev" => p.dev = ostr(val)?,
            "tl" => p.tl = ostr(val)?,
            "layout" => p.layout = DataLayout::from_name(val).ok_or_else(bad)?,
            "ucp_send_datatype" => p.ucp_send_datatype = UcpDatatype::from_name(val).ok_or_else(bad)?,
            "ucp_recv_datatype" => p.ucp_recv_datatype = UcpDatatype::from_name(val).ok_or_else(bad)?,
            "fc_window" => p.fc_window = small(val)?,
            "am_hdr_size" => p.am_hdr_size = size(val)?,
            "ucp_am_hdr_size" => p.ucp_am_hdr_size = size(val)?,
            "send_mem" => p.send_mem = MemoryType::from_name(val).ok_or_else(bad)?,
            "recv_mem" => p.recv_mem = MemoryType::from_name(val).ok_or_else(bad)?,
            "thread_mode" => p.thread_mode = ThreadMode::from_name(val).ok_or_else(bad)?,
            "threads" => p.threads = small(val)?,
            "async_mode" => p.async_mode = AsyncMode::from_name(val).ok_or_else(bad)?,
            "wait_mode" => {
                p.wait_mode = if val == "-" { None } else { Some(WaitMode::from_name(val).ok_or_else(bad)?) }
            }
            "wildcard" => p.wildcard = flag(val)?,
            "force_unexpected" => p.force_unexpected = flag(val)?,
            "wakeup" => p.wakeup = flag(val)?,
            "err_handling" => p.err_handling = flag(val)?,
            "prereg" => p.prereg = flag(val)?,
            "stream_recv_data" => p.stream_recv_data = flag(val)?,
            "quiet" => p.quiet = flag(val)?,
            "batch_name" => p.batch_names.push(ostr(val)?.ok_or_else(bad)?),
            _ => return Err(format!("unknown parameter '{key}' (another ucx-perf version?)")),
        }
    }
    const KEYS: usize = 31;
    if seen.len() != KEYS {
        return Err(format!("the client's parameters are incomplete ({} of {KEYS} fields)", seen.len()));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opts::{parse, Parsed};
    use std::sync::mpsc;
    use std::thread;

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
}
