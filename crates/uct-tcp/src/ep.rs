//! A `tcp` endpoint: the sending side of a connection to a peer interface, and the bytes
//! queued for it.
//!
//! Connections carry both directions: an endpoint opens one (without blocking) when its
//! interface has none to that peer interface that no endpoint here writes to yet, else it
//! writes to the one the peer opened towards us - so a request and its reply travel one
//! socket, and TCP's acknowledgements ride on the data instead of going as segments of their
//! own. The interface reads every connection (`Link`).
//!
//! A send appends the message (header and payload) to the endpoint's send buffer, which holds
//! at most `UCX_TCP_TX_SEG_SIZE` bytes, and writes what the socket takes at once; the rest
//! goes from progress. A send that does not fit returns `NoResource` (the pending queue then
//! waits for room). A connection that fails (refused, reset, the peer gone) fails the
//! endpoint: its operations return the error from then on, and the interface's error handler
//! hears of it once.
//!
//! When an endpoint goes, its side of the connection is shut for writing: the peer reads the
//! end of the stream, and keeps writing to it if an endpoint of its own uses it. A connection
//! is closed once neither side writes. An endpoint whose peer shut its side checks that the
//! peer still lives with a keepalive frame: a peer that went answers with a reset.

use std::cell::{Cell, RefCell};
use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::rc::Rc;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use ucs::arbiter::GroupId;
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{check_am_id, check_length, Completion, Ep, FlushFlags, PackFn, PendingHandle, SendFlags};

use crate::iface::Inner;
use crate::wire::{self, AM_HDR_LEN};

/// How long an endpoint waits for the answer to its handshake before it fails with
/// `EndpointTimeout` (a peer that accepts the connection and never answers).
pub(crate) const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A connection, shared by the endpoint that writes to it (at most one on this side) and the
/// interface that reads from it.
pub(crate) struct Link {
    pub(crate) sock: Socket,
    /// An endpoint of this side writes to it.
    pub(crate) tx_used: Cell<bool>,
    /// This side will write no more (its endpoint went, or failed): not for a new endpoint.
    pub(crate) wr_shut: Cell<bool>,
    /// The peer's end of the stream was read (it writes no more).
    pub(crate) rx_closed: Cell<bool>,
}

impl Link {
    pub(crate) fn new(sock: Socket, tx_used: bool) -> Rc<Link> {
        Rc::new(Link { sock, tx_used: Cell::new(tx_used), wr_shut: Cell::new(false), rx_closed: Cell::new(false) })
    }

    /// Whether a new endpoint here may write to it.
    pub(crate) fn is_free(&self) -> bool {
        !self.tx_used.get() && !self.wr_shut.get() && !self.rx_closed.get()
    }
}

/// Where the connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnState {
    Connecting,
    /// Connected; the handshake goes, data waits for the peer's answer.
    WaitAck,
    Connected,
    Failed(Status),
}

/// The state of an endpoint, shared with its interface's progress.
pub(crate) struct EpState {
    iface: Rc<Inner>,
    /// The connection written to (another one when a simultaneous connect is resolved).
    link: RefCell<Rc<Link>>,
    peer: SockAddr,
    /// While waiting for the answer to the handshake, bytes of `tx` before this may go.
    hs_end: Cell<usize>,
    /// A zero-copy message not written whole yet: it goes before anything else.
    zc: RefCell<Option<ZcInFlight>>,
    /// When it was created (an endpoint still waiting for its answer after
    /// [`ANSWER_TIMEOUT`] fails).
    born: std::time::Instant,
    /// A connection the peer opened at the same time was matched with this endpoint
    /// (`Inner::answer_handshake`).
    pub(crate) raced: Cell<bool>,
    state: Cell<ConnState>,
    /// The send buffer (the handshake and one segment); bytes to send: `tx[head..tail]`.
    tx: RefCell<Box<[u8]>>,
    head: Cell<usize>,
    tail: Cell<usize>,
    pub(crate) group: GroupId,
    user_data: u64,
    flush_comps: RefCell<Vec<Rc<Completion>>>,
    /// A keepalive frame went since the peer shut its side.
    probed: Cell<bool>,
}

impl EpState {
    /// Opens a connection to `peer` (without waiting for it) with the handshake queued; the
    /// interface reads it from now on.
    pub(crate) fn connect(iface: &Rc<Inner>, peer: SockAddr, user_data: u64) -> UcsResult<Rc<EpState>> {
        let domain = if peer.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP)).map_err(|e| {
            tracing::error!("tcp: cannot create a socket: {e}");
            Status::IoError
        })?;
        let setup = || -> std::io::Result<()> {
            sock.set_nonblocking(true)?;
            if iface.cfg.nodelay {
                sock.set_tcp_nodelay(true)?;
            }
            if let Some(b) = iface.cfg.sndbuf {
                sock.set_send_buffer_size(b)?;
            }
            if let Some(b) = iface.cfg.rcvbuf {
                sock.set_recv_buffer_size(b)?;
            }
            if let Some(k) = iface.cfg.keepalive {
                k.apply(&sock)?;
            }
            Ok(())
        };
        setup().map_err(|e| {
            tracing::error!("tcp: cannot set up a socket: {e}");
            Status::IoError
        })?;
        let state = match sock.connect(&peer) {
            Ok(()) => ConnState::WaitAck,
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == ErrorKind::WouldBlock => {
                ConnState::Connecting
            }
            Err(e) => {
                tracing::debug!(peer = ?peer.as_socket(), "tcp: connect failed: {e}");
                return Err(Status::Unreachable);
            }
        };
        let link = Link::new(sock, true);
        iface.add_conn(link.clone(), peer.as_socket(), peer.as_socket(), true);
        let st = Self::with_link(iface, link, peer, state, user_data, Some(&wire::handshake(iface.local_addr())));
        st.write();
        Ok(st)
    }

    /// An endpoint that writes to `link`, a connection the peer opened (connected, no
    /// handshake to send).
    pub(crate) fn attach(iface: &Rc<Inner>, link: Rc<Link>, peer: SockAddr, user_data: u64) -> Rc<EpState> {
        link.tx_used.set(true);
        Self::with_link(iface, link, peer, ConnState::Connected, user_data, None)
    }

    fn with_link(
        iface: &Rc<Inner>,
        link: Rc<Link>,
        peer: SockAddr,
        state: ConnState,
        user_data: u64,
        handshake: Option<&[u8]>,
    ) -> Rc<EpState> {
        // One segment and the handshake, and room for an answer to a handshake (`adopt`).
        let mut tx = vec![0u8; iface.cfg.tx_seg_size + wire::HANDSHAKE_LEN + AM_HDR_LEN].into_boxed_slice();
        let tail = handshake.map_or(0, |h| {
            tx[..h.len()].copy_from_slice(h);
            h.len()
        });
        let group = iface.base.pending.add_group();
        Rc::new(EpState {
            iface: iface.clone(),
            link: RefCell::new(link),
            peer,
            hs_end: Cell::new(tail),
            raced: Cell::new(false),
            zc: RefCell::new(None),
            born: std::time::Instant::now(),
            state: Cell::new(state),
            tx: RefCell::new(tx),
            head: Cell::new(0),
            tail: Cell::new(tail),
            group,
            user_data,
            flush_comps: RefCell::default(),
            probed: Cell::new(false),
        })
    }

    /// The error the endpoint failed with, if it did.
    fn error(&self) -> Option<Status> {
        match self.state.get() {
            ConnState::Failed(s) => Some(s),
            _ => None,
        }
    }

    /// Whether `len` more bytes fit in the send buffer (nothing is queued beyond the handshake
    /// and one segment).
    pub(crate) fn has_room(&self, len: usize) -> bool {
        self.zc.borrow().is_none() && self.tail.get() - self.head.get() + len <= self.tx.borrow().len() - AM_HDR_LEN
    }

    /// Nothing is left to send (or the endpoint failed: nothing will be).
    pub(crate) fn is_flushed(&self) -> bool {
        self.error().is_some()
            || (self.state.get() == ConnState::Connected
                && self.tail.get() == self.head.get()
                && self.zc.borrow().is_none())
    }

    /// The send buffer is empty again: waiting flushes complete with `status`.
    fn drained(&self, status: Status) {
        self.head.set(0);
        self.tail.set(0);
        let comps = std::mem::take(&mut *self.flush_comps.borrow_mut());
        for c in comps {
            c.complete(status);
        }
    }

    pub(crate) fn add_flush_comp(&self, c: Rc<Completion>) {
        self.flush_comps.borrow_mut().push(c);
    }

    /// Fails the endpoint with `status` (once): queued bytes are dropped, waiting flushes
    /// complete with the error, and the interface's error handler hears of it.
    fn fail(&self, status: Status) {
        if self.error().is_some() {
            return;
        }
        tracing::debug!(peer = ?self.peer.as_socket(), "tcp: endpoint failed: {status}");
        self.state.set(ConnState::Failed(status));
        let link = self.link.borrow();
        link.wr_shut.set(true);
        let _ = link.sock.shutdown(std::net::Shutdown::Both);
        drop(link);
        let zc = self.zc.borrow_mut().take();
        if let Some(c) = zc.and_then(|z| z.comp) {
            c.complete(status);
        }
        self.drained(status);
        self.iface.base.report_failure(self.user_data, status);
    }

    /// Checks a connection in progress; true once it is up (data may still wait for the
    /// answer to the handshake).
    fn connected(&self) -> bool {
        match self.state.get() {
            ConnState::Connected | ConnState::WaitAck => return true,
            ConnState::Failed(_) => return false,
            ConnState::Connecting => {}
        }
        let link = self.link.borrow().clone();
        let mut p = libc::pollfd { fd: link.sock.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd; no waiting.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r <= 0 || p.revents == 0 {
            return false;
        }
        match link.sock.take_error() {
            Ok(None) => {
                self.state.set(ConnState::WaitAck);
                true
            }
            Ok(Some(e)) | Err(e) => {
                tracing::debug!(peer = ?self.peer.as_socket(), "tcp: connection failed: {e}");
                self.fail(Status::Unreachable);
                false
            }
        }
    }

    /// Bytes wait to be written (or the connection to come up).
    pub(crate) fn has_unsent(&self) -> bool {
        self.error().is_none()
            && (self.state.get() == ConnState::Connecting
                || self.zc.borrow().is_some()
                || (self.tail.get() != self.head.get()
                    && (self.state.get() == ConnState::Connected || self.head.get() < self.hs_end.get())))
    }

    /// The socket it writes to.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.link.borrow().sock.as_raw_fd()
    }

    /// Waits for the answer to its handshake.
    pub(crate) fn is_waiting(&self) -> bool {
        matches!(self.state.get(), ConnState::Connecting | ConnState::WaitAck)
    }

    /// The peer interface's address.
    pub(crate) fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.peer.as_socket()
    }

    /// Whether it writes to `link`.
    pub(crate) fn writes_to(&self, link: &Rc<Link>) -> bool {
        Rc::ptr_eq(&self.link.borrow(), link)
    }

    /// The peer answered the handshake: data goes.
    pub(crate) fn on_ack(&self) {
        if self.state.get() == ConnState::WaitAck {
            self.state.set(ConnState::Connected);
            self.write();
        }
    }

    /// Both sides connected at once and this side's interface address is the larger one:
    /// writes to `link` (the peer's connection, whose handshake arrived) from now on, answering
    /// it first, and closes its own. Nothing but the handshake went on its own connection.
    pub(crate) fn adopt(&self, link: Rc<Link>) {
        if !self.is_waiting() {
            return;
        }
        link.tx_used.set(true);
        let old = self.link.replace(link);
        old.tx_used.set(false);
        old.wr_shut.set(true);
        let _ = old.sock.shutdown(std::net::Shutdown::Both);
        // The answer goes in front of the data, in the handshake's place (or, when the data
        // moved into it, before the data moved back: the buffer has room for one header more).
        let (hs, t) = (self.hs_end.get(), self.tail.get());
        let mut tx = self.tx.borrow_mut();
        let at = if hs >= AM_HDR_LEN {
            hs - AM_HDR_LEN
        } else {
            tx.copy_within(hs..t, AM_HDR_LEN);
            self.tail.set(t - hs + AM_HDR_LEN);
            0
        };
        tx[at..at + AM_HDR_LEN].copy_from_slice(&wire::am_header(wire::AM_ID_ACK, 0));
        drop(tx);
        self.head.set(at);
        self.state.set(ConnState::Connected);
        self.write();
    }

    /// Writes what the socket takes (while waiting for the answer to the handshake, the
    /// handshake only); true if bytes went.
    fn write(&self) -> bool {
        if !self.connected() {
            return false;
        }
        let waiting = self.state.get() == ConnState::WaitAck;
        let mut wrote = false;
        if !waiting && self.zc.borrow().is_some() {
            match self.write_zc() {
                Ok(w) => wrote = w,
                Err(e) => {
                    self.fail(io_status(&e));
                    return wrote;
                }
            }
            if self.zc.borrow().is_some() {
                return wrote;
            }
        }
        let link = self.link.borrow();
        loop {
            let (h, t) = (self.head.get(), self.tail.get());
            let end = if waiting { self.hs_end.get().min(t) } else { t };
            if h >= end {
                break;
            }
            let r = (&link.sock).write(&self.tx.borrow()[h..end]);
            match r {
                Ok(k) => {
                    wrote = true;
                    self.head.set(self.head.get() + k);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return wrote,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(peer = ?self.peer.as_socket(), "tcp: write failed: {e}");
                    drop(link);
                    self.fail(io_status(&e));
                    return wrote;
                }
            }
        }
        if !waiting {
            self.drained(Status::Ok);
        }
        wrote
    }

    /// Writes what the socket takes of the zero-copy message in flight; completes it when it
    /// went whole. Whether bytes went.
    fn write_zc(&self) -> std::io::Result<bool> {
        let mut zc = self.zc.borrow_mut();
        let Some(z) = zc.as_mut() else { return Ok(false) };
        let mut wrote = false;
        while !z.done() {
            match z.write_to(&self.link.borrow().sock) {
                Ok(n) => {
                    wrote |= n > 0;
                    z.advance(n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(wrote),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        let comp = zc.take().and_then(|z| z.comp);
        drop(zc);
        if let Some(c) = comp {
            c.complete(Status::Ok);
        }
        Ok(wrote)
    }

    /// Sends header and `iov` straight from the caller's memory (`writev`); what the socket
    /// does not take now goes from progress, and `comp` completes then.
    ///
    /// # Safety
    /// The iov's memory stays valid and unmodified until the operation completes.
    unsafe fn zcopy(&self, id: u8, header: &[u8], iov: &[uct::Iov<'_>], comp: Option<&Rc<Completion>>) -> OpResult {
        if let Some(s) = self.error() {
            return Err(s);
        }
        if !self.iface.base.pending.may_send(self.group) || self.zc.borrow().is_some() {
            return Ok(Outcome::NoResource);
        }
        if iov.iter().any(|v| v.count > 1 && v.stride != v.length) {
            tracing::error!("tcp: am_zcopy takes contiguous iov entries only");
            return Err(Status::Unsupported);
        }
        let payload = uct::iov_total_len(iov);
        // Behind queued bytes, or before the peer answered: copied like a buffered send when
        // it fits, else wait.
        if self.state.get() != ConnState::Connected || self.tail.get() != self.head.get() {
            self.write();
        }
        if self.state.get() != ConnState::Connected || self.tail.get() != self.head.get() {
            if !self.has_room(AM_HDR_LEN + header.len() + payload) {
                return Ok(Outcome::NoResource);
            }
            return self
                .send(id, header.len() + payload, |b| {
                    b[..header.len()].copy_from_slice(header);
                    let mut at = header.len();
                    for v in iov {
                        let n = v.total_len();
                        // SAFETY: the caller keeps the entry's `n` bytes at `v.buffer` valid;
                        // entries are contiguous (checked above).
                        b[at..at + n].copy_from_slice(unsafe { std::slice::from_raw_parts(v.buffer, n) });
                        at += n;
                    }
                    Ok(at)
                })
                .map(|o| o.map(|_| ()));
        }
        let mut z = ZcInFlight::new(id, header, iov, payload)?;
        let mut first = true;
        while !z.done() {
            match z.write_to(&self.link.borrow().sock) {
                Ok(n) => z.advance(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if first => {
                    tracing::debug!(peer = ?self.peer.as_socket(), "tcp: write failed: {e}");
                    self.fail(io_status(&e));
                    return Err(io_status(&e));
                }
                Err(e) => {
                    // Part of it went: the operation is started, its completion reports.
                    z.comp = comp.cloned();
                    *self.zc.borrow_mut() = Some(z);
                    self.fail(io_status(&e));
                    return Ok(Outcome::InProgress);
                }
            }
            first = false;
        }
        if z.done() {
            return Ok(Outcome::Done(()));
        }
        z.comp = comp.cloned();
        *self.zc.borrow_mut() = Some(z);
        Ok(Outcome::InProgress)
    }

    /// Whether the connection is gone, and why: reset (`ConnectionReset`, also when the peer
    /// closed it whole), or keepalive found no peer (`EndpointTimeout`). A peer that only shut
    /// its side (its endpoint went; it may still read) gets a keepalive frame, once: if the
    /// peer went, the reset it causes shows on a later check. Without bytes queued, a write
    /// would not tell.
    fn peer_closed(&self) -> Option<Status> {
        let link = self.link.borrow().clone();
        let mut p = libc::pollfd { fd: link.sock.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd; no waiting.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r <= 0 {
            return None;
        }
        if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            return Some(match link.sock.take_error() {
                Ok(Some(e)) | Err(e) => {
                    tracing::debug!(peer = ?self.peer.as_socket(), "tcp: connection failed: {e}");
                    io_status(&e)
                }
                Ok(None) => Status::ConnectionReset,
            });
        }
        if p.revents & libc::POLLRDHUP != 0 && !self.probed.get() && self.tail.get() == self.head.get() {
            self.probed.set(true);
            self.head.set(0);
            self.tail.set(0);
            let at = 0;
            self.tx.borrow_mut()[at..at + AM_HDR_LEN].copy_from_slice(&wire::am_header(wire::AM_ID_KEEPALIVE, 0));
            self.tail.set(at + AM_HDR_LEN);
            self.write();
        }
        None
    }

    /// Progress of this endpoint: connect, write; with `check_closed`, notice a peer that
    /// closed. True if bytes went.
    pub(crate) fn progress(&self, check_closed: bool) -> bool {
        if self.error().is_some() {
            return false;
        }
        let wrote = self.write();
        if check_closed && self.is_waiting() && self.born.elapsed() > ANSWER_TIMEOUT {
            tracing::debug!(peer = ?self.peer.as_socket(), "tcp: no answer to the handshake in {ANSWER_TIMEOUT:?}");
            self.fail(Status::EndpointTimeout);
            return wrote;
        }
        if check_closed && matches!(self.state.get(), ConnState::Connected | ConnState::WaitAck) {
            if let Some(s) = self.peer_closed() {
                self.fail(s);
            }
        }
        wrote
    }

    /// Whether a message of any allowed size fits now.
    pub(crate) fn has_room_for_any(&self) -> bool {
        self.has_room(AM_HDR_LEN + self.iface.base.attr.am.max_bcopy)
    }

    /// Queues one active message of at most `len` payload bytes written by `fill` (which says
    /// how many it wrote, or fails: then nothing is queued), and writes.
    fn send(&self, id: u8, len: usize, fill: impl FnOnce(&mut [u8]) -> UcsResult<usize>) -> OpResult<usize> {
        if let Some(s) = self.error() {
            return Err(s);
        }
        if !self.iface.base.pending.may_send(self.group) {
            return Ok(Outcome::NoResource);
        }
        if !self.has_room(AM_HDR_LEN + len) {
            self.write();
            if !self.has_room(AM_HDR_LEN + len) {
                return Ok(Outcome::NoResource);
            }
        }
        let n = {
            let mut tx = self.tx.borrow_mut();
            let (h, t) = (self.head.get(), self.tail.get());
            if t + AM_HDR_LEN + len > tx.len() {
                // Room at the front (`has_room`): move what is not written yet there.
                tx.copy_within(h..t, 0);
                self.head.set(0);
                self.tail.set(t - h);
                self.hs_end.set(self.hs_end.get().saturating_sub(h));
            }
            let at = self.tail.get();
            let n = fill(&mut tx[at + AM_HDR_LEN..at + AM_HDR_LEN + len])?;
            tx[at..at + AM_HDR_LEN].copy_from_slice(&wire::am_header(id, n));
            self.tail.set(at + AM_HDR_LEN + n);
            n
        };
        self.write();
        Ok(Outcome::Done(n))
    }
}

impl Drop for EpState {
    fn drop(&mut self) {
        self.iface.base.pending.remove_group(self.group);
        // This side writes no more: the peer reads the end of the stream (and may go on
        // writing); the socket closes when the interface stops reading it too.
        let link = self.link.borrow();
        link.tx_used.set(false);
        if !link.wr_shut.replace(true) {
            let _ = link.sock.shutdown(std::net::Shutdown::Write);
        }
    }
}

/// An endpoint of the `tcp` transport.
pub struct TcpEp {
    st: Rc<EpState>,
}

impl TcpEp {
    pub(crate) fn new(st: Rc<EpState>) -> TcpEp {
        TcpEp { st }
    }
}

impl Ep for TcpEp {
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> OpResult {
        check_am_id(id)?;
        let len = payload.len() + 8;
        check_length(len, self.st.iface.base.attr.am.max_short, "am_short")?;
        self.st
            .send(id, len, |b| {
                b[..8].copy_from_slice(&header.to_ne_bytes());
                b[8..len].copy_from_slice(payload);
                Ok(len)
            })
            .map(|o| o.map(|_| ()))
    }

    fn am_short_iov(&self, id: u8, iov: &[&[u8]]) -> OpResult {
        check_am_id(id)?;
        let len = iov.iter().map(|s| s.len()).fold(0usize, usize::saturating_add);
        check_length(len, self.st.iface.base.attr.am.max_short, "am_short_iov")?;
        self.st
            .send(id, len, |b| {
                let mut at = 0;
                for part in iov {
                    b[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                Ok(at)
            })
            .map(|o| o.map(|_| ()))
    }

    fn am_bcopy(&self, id: u8, pack: PackFn<'_>, _flags: SendFlags) -> OpResult<usize> {
        check_am_id(id)?;
        let max = self.st.iface.base.attr.am.max_bcopy;
        self.st.send(id, max, |b| {
            let n = pack(&mut b[..max]);
            check_length(n, max, "am_bcopy").map(|()| n)
        })
    }

    unsafe fn am_zcopy(
        &self,
        id: u8,
        header: &[u8],
        iov: &[uct::Iov<'_>],
        _flags: SendFlags,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        check_am_id(id)?;
        let a = &self.st.iface.base.attr.am;
        check_length(header.len(), a.max_hdr, "am_zcopy header")?;
        check_length(header.len() + uct::iov_total_len(iov), a.max_zcopy, "am_zcopy")?;
        if iov.len() > a.max_iov {
            return Err(Status::InvalidParam);
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.st.zcopy(id, header, iov, comp) }
    }

    fn flush(&self, _flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        if let Some(s) = self.st.error() {
            return Err(s);
        }
        if !self.st.iface.base.pending.group_is_empty(self.st.group) {
            return Ok(Outcome::NoResource);
        }
        self.st.write();
        if self.st.is_flushed() {
            return Ok(Outcome::Done(()));
        }
        if let Some(c) = comp {
            self.st.add_flush_comp(c.clone());
        }
        Ok(Outcome::InProgress)
    }

    fn check(&self, _comp: Option<&Rc<Completion>>) -> OpResult {
        if let Some(s) = self.st.error() {
            return Err(s);
        }
        if self.st.connected() {
            if let Some(s) = self.st.peer_closed() {
                self.st.fail(s);
                return Err(s);
            }
        }
        Ok(Outcome::Done(()))
    }

    fn pending_add(&self, req: PendingHandle) -> UcsResult<()> {
        if self.st.error().is_none()
            && self.st.has_room_for_any()
            && self.st.iface.base.pending.group_is_empty(self.st.group)
        {
            return Err(Status::Busy);
        }
        self.st.iface.base.pending.push(self.st.group, req);
        Ok(())
    }

    fn pending_purge(&self, sink: &mut dyn FnMut(PendingHandle)) {
        self.st.iface.base.pending.purge(self.st.group, sink);
    }
}

/// The status of a failed connection: a keepalive or user timeout is `EndpointTimeout`,
/// anything else `ConnectionReset`.
fn io_status(e: &std::io::Error) -> Status {
    if e.raw_os_error() == Some(libc::ETIMEDOUT) {
        Status::EndpointTimeout
    } else {
        Status::ConnectionReset
    }
}

/// The most iov entries an `am_zcopy` takes (and the attribute says).
pub(crate) const ZC_MAX_IOV: usize = 8;
/// The largest user header of an `am_zcopy`.
pub(crate) const ZC_MAX_HDR: usize = 128;

/// A zero-copy active message being written: the frame header and the user header copied
/// here, the payload in the caller's memory.
pub(crate) struct ZcInFlight {
    head: [u8; AM_HDR_LEN + ZC_MAX_HDR],
    head_len: usize,
    parts: [(*const u8, usize); ZC_MAX_IOV],
    nparts: usize,
    /// Bytes written so far (of the whole frame).
    sent: usize,
    total: usize,
    comp: Option<Rc<Completion>>,
}

impl ZcInFlight {
    fn new(id: u8, header: &[u8], iov: &[uct::Iov<'_>], payload: usize) -> UcsResult<ZcInFlight> {
        if header.len() > ZC_MAX_HDR || iov.len() > ZC_MAX_IOV {
            return Err(Status::InvalidParam);
        }
        let mut head = [0u8; AM_HDR_LEN + ZC_MAX_HDR];
        head[..AM_HDR_LEN].copy_from_slice(&wire::am_header(id, header.len() + payload));
        head[AM_HDR_LEN..AM_HDR_LEN + header.len()].copy_from_slice(header);
        let mut parts = [(std::ptr::null(), 0); ZC_MAX_IOV];
        for (p, v) in parts.iter_mut().zip(iov) {
            *p = (v.buffer as *const u8, v.total_len());
        }
        let head_len = AM_HDR_LEN + header.len();
        Ok(ZcInFlight { head, head_len, parts, nparts: iov.len(), sent: 0, total: head_len + payload, comp: None })
    }

    fn done(&self) -> bool {
        self.sent == self.total
    }

    fn advance(&mut self, n: usize) {
        self.sent += n;
    }

    /// One `writev` of what is left.
    fn write_to(&self, sock: &Socket) -> std::io::Result<usize> {
        let mut bufs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; ZC_MAX_IOV + 1];
        let mut n = 0;
        let mut skip = self.sent;
        let head = (self.head.as_ptr(), self.head_len);
        for &(ptr, len) in std::iter::once(&head).chain(&self.parts[..self.nparts]) {
            if skip >= len {
                skip -= len;
                continue;
            }
            // SAFETY: `skip < len`, within the part; the caller of `am_zcopy` keeps the payload
            // valid until completion, and the header lives in `self`.
            bufs[n] = libc::iovec { iov_base: unsafe { ptr.add(skip) } as *mut libc::c_void, iov_len: len - skip };
            skip = 0;
            n += 1;
        }
        // SAFETY: `n` valid iovecs over live memory; a non-blocking socket.
        let r = unsafe { libc::writev(sock.as_raw_fd(), bufs.as_ptr(), n as i32) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(r as usize)
    }
}
