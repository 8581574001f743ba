//! The `tcp` interface: a listening socket on the device's address, the connections peers
//! opened to it (their active messages are delivered from progress), and the endpoints this
//! interface opened to others (one connection each, written from the send call and from
//! progress).
//!
//! Addresses: the device address is the family (4 or 6) and the IP address's bytes; the
//! interface address is the listening port (big-endian). An endpoint connects to the peer's
//! address and port with a non-blocking `connect`, queues the handshake and sends once the
//! connection is up. Connections are one-way: a peer that answers opens its own endpoint, as
//! UCX's tcp transport did before it shared one socket per pair.

use std::cell::{Cell, RefCell};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::{Rc, Weak};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use ucs::arbiter::GroupId;
use ucs::async_::{EventSet, Events, MAX_WAIT_EVENTS};
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    AmRecv, BandwidthModel, BaseIface, Completion, Ep, EpConnect, EpParams, EventFlags, FlushFlags, Iface, IfaceAttr,
    IfaceFlags, IfaceParams, LinearFunc, OpCaps, ProgressFlags, Resources, Worker,
};

use crate::config::TcpIfaceConfig;
use crate::ep::{EpState, Link, TcpEp};
use crate::md::NetDevice;
use crate::wire::{self, AM_HDR_LEN, HANDSHAKE_LEN};

/// A connection this interface reads (one a peer opened, or one an endpoint here opened):
/// what arrived and is not delivered yet.
struct Conn {
    link: Rc<Link>,
    peer: Option<SocketAddr>,
    /// The peer interface's address (its device address and listening port): from the
    /// handshake of a connection the peer opened, or the address an endpoint here connected to.
    peer_iface: Option<SocketAddr>,
    /// Received bytes: `buf[head..tail]` is not handled yet.
    buf: Vec<u8>,
    head: usize,
    tail: usize,
    handshaken: bool,
    /// The socket has bytes (epoll said so, and no read came back empty since).
    readable: bool,
}

impl Conn {
    /// Whether the socket has bytes, or the buffer a whole message (or the handshake).
    fn has_more(&self) -> bool {
        if self.readable {
            return true;
        }
        let avail = self.tail - self.head;
        if !self.handshaken {
            return avail >= HANDSHAKE_LEN;
        }
        avail >= AM_HDR_LEN
            && AM_HDR_LEN
                + u32::from_le_bytes(self.buf[self.head + 4..self.head + 8].try_into().expect("4 bytes")) as usize
                <= avail
    }
}

/// The connection whose message is being delivered: its slot, its link, its peer interface.
type Delivering = (usize, Rc<Link>, Option<SocketAddr>);

/// The shared state of an interface.
pub(crate) struct Inner {
    pub(crate) base: BaseIface,
    pub(crate) cfg: TcpIfaceConfig,
    dev: NetDevice,
    listener: Socket,
    port: u16,
    /// The listener and the accepted connections (level-triggered), by [`LISTENER`] and
    /// connection slot.
    epoll: EventSet,
    conns: RefCell<Vec<Option<Conn>>>,
    /// The connection whose message is being delivered (out of `conns` meanwhile): its slot,
    /// its link and its peer interface.
    delivering: RefCell<Option<Delivering>>,
    /// Sockets with bytes to write, each watched once for room (`EPOLLOUT | EPOLLONESHOT`) by
    /// [`Iface::event_arm`]; itself watched by `epoll`, so the interface's one descriptor
    /// wakes a sleeper for sends too.
    wr_epoll: EventSet,
    /// Endpoints this interface opened, by their pending group.
    pub(crate) eps: RefCell<Vec<(GroupId, Weak<EpState>)>>,
    /// Progress calls since the endpoints' connections were last checked for a closed peer.
    ticks: Cell<u32>,
}

impl Inner {
    /// Accepts new connections, delivers what arrived on them, moves the endpoints' queued
    /// bytes, and runs pending requests that now have room.
    pub(crate) fn progress(&self) -> usize {
        let mut n = self.read_conns();
        n += self.progress_eps();
        if !self.base.pending.is_empty() {
            n += self.base.pending.dispatch(|g| {
                let ep = self.eps.borrow().iter().find(|(x, _)| *x == g).and_then(|(_, w)| w.upgrade());
                match ep {
                    Some(ep) if ep.has_room_for_any() => Resources::Available,
                    Some(_) => Resources::EpNotReady,
                    None => Resources::Available,
                }
            });
        }
        n
    }

    /// Asks epoll which sockets have something (one system call, no waiting): accepts on the
    /// listener, marks readable connections.
    fn poll_events(&self) -> usize {
        let mut n = 0;
        let _ = self.epoll.wait(Some(Duration::ZERO), |key, _| {
            if key == LISTENER {
                n += self.accept();
            } else if key == WRITERS {
                self.drain_writers();
            } else if let Some(Some(c)) = self.conns.borrow_mut().get_mut(key as usize) {
                c.readable = true;
            }
        });
        n
    }

    fn accept(&self) -> usize {
        let mut n = 0;
        loop {
            match self.listener.accept() {
                Ok((sock, addr)) => {
                    if let Err(e) = sock.set_nonblocking(true) {
                        tracing::warn!("tcp: cannot make an accepted socket non-blocking: {e}; dropped");
                        continue;
                    }
                    if self.cfg.nodelay {
                        let _ = sock.set_tcp_nodelay(true);
                    }
                    if let Some(k) = self.cfg.keepalive {
                        // (UCX sets keepalive on connecting sockets only; on this side too, a
                        // dead peer's connection goes without waiting for its endpoint.)
                        let _ = k.apply(&sock);
                    }
                    let peer = addr.as_socket();
                    tracing::trace!(?peer, "tcp: accepted a connection");
                    self.add_conn(Link::new(sock, false), peer, None, false);
                    n += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // (EMFILE and the like: the connection stays in the backlog for later.)
                    tracing::warn!("tcp: accept failed: {e}");
                    return n;
                }
            }
        }
    }

    /// Starts reading `link` (under the first free slot); `handshaken`: no handshake is
    /// expected on it (an endpoint here opened it).
    pub(crate) fn add_conn(
        &self,
        link: Rc<Link>,
        peer: Option<SocketAddr>,
        peer_iface: Option<SocketAddr>,
        handshaken: bool,
    ) {
        let fd = link.sock.as_raw_fd();
        let conn = Conn {
            link,
            peer,
            peer_iface,
            buf: vec![0u8; self.cfg.rx_seg_size],
            head: 0,
            tail: 0,
            handshaken,
            readable: !handshaken,
        };
        let mut conns = self.conns.borrow_mut();
        let reserved = self.delivering.borrow().as_ref().map(|d| d.0);
        let slot = match conns.iter().enumerate().position(|(i, c)| c.is_none() && Some(i) != reserved) {
            Some(i) => i,
            None => {
                conns.push(None);
                conns.len() - 1
            }
        };
        if let Err(e) = self.epoll.add(fd, Events::READ, slot as u64) {
            tracing::warn!("tcp: cannot watch a connection: {e}; dropped");
            return;
        }
        conns[slot] = Some(conn);
    }

    /// Stops reading `c` (the peer wrote its last, or the connection failed). Its socket
    /// closes once no endpoint here writes to it either.
    fn forget_conn(&self, c: Conn) {
        c.link.rx_closed.set(true);
        let _ = self.epoll.remove(c.link.sock.as_raw_fd());
    }

    /// A connection to the peer interface at `peer` that no endpoint here writes to yet.
    fn free_link(&self, peer: SocketAddr) -> Option<Rc<Link>> {
        let key = (peer.ip(), peer.port());
        let fits =
            |from: Option<SocketAddr>, link: &Link| from.is_some_and(|a| (a.ip(), a.port()) == key) && link.is_free();
        if let Some((_, link, from)) = self.delivering.borrow().as_ref() {
            if fits(*from, link) {
                return Some(link.clone());
            }
        }
        self.conns.borrow().iter().flatten().find(|c| fits(c.peer_iface, &c.link)).map(|c| c.link.clone())
    }

    /// The endpoint here that writes to `link`.
    fn ep_writing_to(&self, link: &Rc<Link>) -> Option<Rc<EpState>> {
        self.eps.borrow().iter().filter_map(|(_, w)| w.upgrade()).find(|e| e.writes_to(link))
    }

    /// The handshake of the peer interface `c.peer_iface` arrived on `c`, a connection it
    /// opened. Usually the answer goes at once, and an endpoint here to that interface may
    /// write to `c` from now on. When an endpoint here connected to the same interface at the
    /// same time and still waits for its own answer, one of the two connections stays: the one
    /// the smaller interface address opened. If that is ours, `c` gets no answer (the peer
    /// takes ours and closes `c`); else our endpoint takes `c`, answering it, and closes its own.
    fn answer_handshake(&self, c: &mut Conn) -> Result<(), ()> {
        let Some(from) = c.peer_iface else { return Ok(()) };
        let me = self.local_addr();
        let key = |a: SocketAddr| (a.ip(), a.port());
        let racing = self
            .eps
            .borrow()
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .find(|e| e.is_waiting() && !e.raced.get() && e.peer_addr().is_some_and(|p| key(p) == key(from)));
        // (One incoming connection per racing endpoint: more from that peer are for its other
        // endpoints, and get their answer.)
        if let Some(e) = &racing {
            if key(me) != key(from) {
                e.raced.set(true);
            }
        }
        match racing {
            Some(_) if key(me) < key(from) => {
                tracing::trace!(%from, "tcp: simultaneous connect; the peer takes our connection");
                // (Never free for an endpoint here: the peer closes it.)
                c.link.wr_shut.set(true);
                Ok(())
            }
            Some(ep) if key(me) > key(from) => {
                tracing::trace!(%from, "tcp: simultaneous connect; we take the peer's connection");
                ep.adopt(c.link.clone());
                Ok(())
            }
            _ => {
                let ack = wire::am_header(wire::AM_ID_ACK, 0);
                match (&c.link.sock).write(&ack) {
                    Ok(n) if n == ack.len() => Ok(()),
                    r => {
                        tracing::debug!(peer = ?c.peer, "tcp: cannot answer a handshake ({r:?}); dropped");
                        Err(())
                    }
                }
            }
        }
    }

    /// Takes the writers' set's events (one-shot: each fired once; progress writes).
    fn drain_writers(&self) {
        while self.wr_epoll.wait(Some(Duration::ZERO), |_, _| {}) == Ok(MAX_WAIT_EVENTS) {}
    }

    /// Arms for the next event: `Err(Busy)` when progress has work now (a whole message
    /// buffered, a connection with bytes, a pending request with room, a socket with room for
    /// bytes waiting); else the sockets with bytes to write are watched for room.
    fn arm(&self) -> UcsResult<()> {
        if self.conns.borrow().iter().flatten().any(Conn::has_more) {
            return Err(Status::Busy);
        }
        // (Level-triggered: what this sees, the caller's progress sees again.)
        if self.epoll.wait(Some(Duration::ZERO), |_, _| {})? > 0 {
            return Err(Status::Busy);
        }
        let eps: Vec<Rc<EpState>> = self.eps.borrow().iter().filter_map(|(_, w)| w.upgrade()).collect();
        if !self.base.pending.is_empty() && eps.iter().any(|e| e.has_room_for_any()) {
            return Err(Status::Busy);
        }
        for e in eps.iter().filter(|e| e.has_unsent()) {
            let (fd, room) = (e.fd(), Events::WRITE | Events::ONESHOT);
            if self.wr_epoll.modify(fd, room, 0).is_err() {
                self.wr_epoll.add(fd, room, 0)?;
            }
        }
        Ok(())
    }

    /// This interface's address as peers connect to it.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.dev.addr, self.port)
    }

    /// Accepts connections, reads them and delivers their messages round robin, one message
    /// per connection per round (so that no peer's burst delays the others'), up to
    /// `MAX_DELIVER` messages in a call.
    fn read_conns(&self) -> usize {
        const MAX_DELIVER: usize = 1024;
        let mut n = 0;
        while n < MAX_DELIVER {
            // Each round asks epoll first: a connection whose bytes came meanwhile takes its
            // turn in this round, not after another connection's whole buffer.
            n += self.poll_events();
            let mut round = 0;
            let count = self.conns.borrow().len();
            for i in 0..count {
                // Taken out while its message is delivered: a handler may send, or accept.
                let Some(mut c) = self.conns.borrow_mut().get_mut(i).and_then(|c| c.take_if(|c| c.has_more())) else {
                    continue;
                };
                // Its slot stays reserved, and an endpoint created by the handler may write to
                // it (the reply to a request goes where the request came from).
                *self.delivering.borrow_mut() = Some((i, c.link.clone(), c.peer_iface));
                let r = self.next_message(&mut c);
                *self.delivering.borrow_mut() = None;
                match r {
                    Ok(true) => round += 1,
                    Ok(false) => {}
                    Err(()) => {
                        tracing::debug!(peer = ?c.peer, "tcp: connection closed");
                        self.forget_conn(c);
                        continue;
                    }
                }
                self.conns.borrow_mut()[i] = Some(c);
            }
            n += round;
            // Another round only if a connection is known to have more (else return: the
            // caller may be waiting for exactly what was delivered, and the next call polls).
            if round == 0 || !self.conns.borrow().iter().flatten().any(Conn::has_more) {
                break;
            }
        }
        n
    }

    /// Delivers the next whole message of `c`, reading from its socket when its buffer holds
    /// none: true if one was delivered; `Err` when the connection is to be dropped (closed by
    /// the peer, failed, or it sent what cannot be read).
    fn next_message(&self, c: &mut Conn) -> Result<bool, ()> {
        let max = self.cfg.rx_seg_size - AM_HDR_LEN;
        for _ in 0..2 {
            // Whole messages in the buffer.
            loop {
                let avail = c.tail - c.head;
                if !c.handshaken {
                    if avail < HANDSHAKE_LEN {
                        break;
                    }
                    let h: [u8; HANDSHAKE_LEN] = c.buf[c.head..c.head + HANDSHAKE_LEN].try_into().expect("length");
                    match wire::check_handshake(&h) {
                        Ok(from) => c.peer_iface = Some(from),
                        Err(e) => {
                            tracing::warn!(peer = ?c.peer, "tcp: dropped a connection: {e}");
                            return Err(());
                        }
                    }
                    c.handshaken = true;
                    c.head += HANDSHAKE_LEN;
                    self.answer_handshake(c)?;
                    continue;
                }
                if avail < AM_HDR_LEN {
                    break;
                }
                let h: [u8; AM_HDR_LEN] = c.buf[c.head..c.head + AM_HDR_LEN].try_into().expect("length");
                let (id, len) = match wire::decode_am_header(&h, max) {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(peer = ?c.peer, "tcp: dropped a connection: {e}");
                        return Err(());
                    }
                };
                if avail < AM_HDR_LEN + len {
                    break;
                }
                let at = c.head + AM_HDR_LEN;
                c.head = at + len;
                if id == wire::AM_ID_KEEPALIVE {
                    continue;
                }
                if id == wire::AM_ID_ACK {
                    if let Some(ep) = self.ep_writing_to(&c.link) {
                        ep.on_ack();
                    }
                    continue;
                }
                let _ = self.base.am.invoke(id, AmRecv::borrowed(&c.buf[at..at + len]));
                return Ok(true);
            }
            // None whole: read (once).
            if c.head == c.tail {
                c.head = 0;
                c.tail = 0;
            } else if c.head > 0 {
                // Room for the rest of the message: move the unhandled bytes to the front.
                c.buf.copy_within(c.head..c.tail, 0);
                c.tail -= c.head;
                c.head = 0;
            }
            loop {
                match (&c.link.sock).read(&mut c.buf[c.tail..]) {
                    Ok(0) => {
                        if c.head != c.tail {
                            tracing::warn!(peer = ?c.peer, bytes = c.tail - c.head,
                                "tcp: a peer closed its connection in the middle of a message");
                        }
                        return Err(());
                    }
                    Ok(k) => {
                        // A read that did not fill the space took all there was: no second
                        // read to hear `EAGAIN` (epoll, level-triggered, says when more came).
                        c.readable = c.tail + k == c.buf.len();
                        c.tail += k;
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        c.readable = false;
                        return Ok(false);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::debug!(peer = ?c.peer, "tcp: reading a connection failed: {e}");
                        return Err(());
                    }
                }
            }
        }
        Ok(false)
    }

    /// Connects, writes and checks the endpoints; the number that moved bytes.
    fn progress_eps(&self) -> usize {
        let tick = self.ticks.get().wrapping_add(1);
        self.ticks.set(tick);
        // A closed peer is noticed on the next write; without writes, every 1024 calls.
        let check_closed = tick % 1024 == 0;
        if check_closed {
            self.eps.borrow_mut().retain(|(_, w)| w.strong_count() > 0);
        }
        let mut n = 0;
        let count = self.eps.borrow().len();
        for i in 0..count {
            // (Not borrowed while it runs: a failure calls the error handler.)
            let ep = self.eps.borrow().get(i).and_then(|(_, w)| w.upgrade());
            if let Some(ep) = ep {
                n += ep.progress(check_closed) as usize;
            }
        }
        n
    }
}

/// The `tcp` interface.
pub struct TcpIface {
    inner: Rc<Inner>,
}

impl TcpIface {
    pub(crate) fn open(worker: &Worker, params: &IfaceParams, dev: &NetDevice) -> UcsResult<Self> {
        let cfg = TcpIfaceConfig::read(params)?;
        let bind = match dev.addr {
            IpAddr::V4(a) => SocketAddr::new(IpAddr::V4(a), 0),
            IpAddr::V6(a) => SocketAddr::V6(std::net::SocketAddrV6::new(a, 0, 0, dev.scope_id)),
        };
        let listener = Socket::new(Domain::for_address(bind), Type::STREAM, Some(Protocol::TCP)).map_err(|e| {
            tracing::error!("tcp: cannot create a socket: {e}");
            Status::IoError
        })?;
        let setup = || -> std::io::Result<u16> {
            listener.set_reuse_address(true)?;
            if let Some(b) = cfg.rcvbuf {
                // (Accepted sockets inherit it, window scaling included.)
                listener.set_recv_buffer_size(b)?;
            }
            listener.bind(&bind.into())?;
            listener.listen(1024)?;
            listener.set_nonblocking(true)?;
            let port = listener.local_addr()?.as_socket().map(|a| a.port()).unwrap_or(0);
            Ok(port)
        };
        let port = setup().map_err(|e| {
            tracing::error!("tcp: cannot listen on {bind} ({}): {e}", dev.name);
            Status::IoError
        })?;
        let (epoll, wr_epoll) = (EventSet::new()?, EventSet::new()?);
        epoll.add(listener.as_raw_fd(), Events::READ, LISTENER).inspect_err(|e| {
            tracing::error!("tcp: cannot watch the listener: {e}");
        })?;
        epoll.add(wr_epoll.as_raw_fd(), Events::READ, WRITERS).inspect_err(|e| {
            tracing::error!("tcp: cannot watch the writers' set: {e}");
        })?;
        let max = cfg.tx_seg_size - AM_HDR_LEN;
        let attr = IfaceAttr {
            flags: IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::AM_SHORT
                | IfaceFlags::AM_BCOPY
                | IfaceFlags::AM_ZCOPY
                | IfaceFlags::PENDING
                | IfaceFlags::CB_SYNC
                | IfaceFlags::EP_CHECK
                | IfaceFlags::ERRHANDLE_PEER_FAILURE
                | IfaceFlags::INTER_NODE,
            am: OpCaps {
                max_short: max,
                max_bcopy: max,
                // Zero-copy messages as large as the receiver's segment.
                max_zcopy: cfg.rx_seg_size - AM_HDR_LEN,
                max_hdr: crate::ep::ZC_MAX_HDR,
                opt_zcopy_align: 1,
                align_mtu: 1,
                max_iov: crate::ep::ZC_MAX_IOV,
                ..Default::default()
            },
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::FD,
            device_addr_len: 17,
            iface_addr_len: 2,
            ep_addr_len: 0,
            max_num_eps: usize::MAX,
            overhead: 50e-6,
            latency: LinearFunc { c: 10e-6, m: 0.0 },
            bandwidth: BandwidthModel { dedicated: 0.0, shared: 100e6 },
            priority: 0,
            ..Default::default()
        };
        tracing::debug!(dev = %dev.name, %bind, port, "tcp: interface listening");
        Ok(TcpIface {
            inner: Rc::new(Inner {
                base: BaseIface::new(worker, params, attr),
                cfg,
                dev: dev.clone(),
                listener,
                port,
                epoll,
                wr_epoll,
                conns: RefCell::default(),
                delivering: RefCell::default(),
                eps: RefCell::default(),
                ticks: Cell::new(0),
            }),
        })
    }
}

impl Drop for TcpIface {
    fn drop(&mut self) {
        self.inner.base.close();
    }
}

/// The epoll key of the listener (connections have their slot's index).
const LISTENER: u64 = u64::MAX;
/// The epoll key of the writers' set.
const WRITERS: u64 = u64::MAX - 1;

/// The device address of `ip`: its family (4 or 6) and its bytes.
fn encode_ip(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => [&[4u8][..], &a.octets()].concat(),
        IpAddr::V6(a) => [&[6u8][..], &a.octets()].concat(),
    }
}

/// The IP address in a device address; `None` when it is not one.
pub(crate) fn decode_ip(dev_addr: &[u8]) -> Option<IpAddr> {
    match dev_addr {
        [4, rest @ ..] if rest.len() == 4 => Some(IpAddr::V4(Ipv4Addr::new(rest[0], rest[1], rest[2], rest[3]))),
        [6, rest @ ..] if rest.len() == 16 => {
            let b: [u8; 16] = rest.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

impl Iface for TcpIface {
    fn base(&self) -> &BaseIface {
        &self.inner.base
    }

    fn progress(&self) -> usize {
        self.inner.progress()
    }

    fn progress_enable(&self, _flags: ProgressFlags) {
        self.inner.base.enable_progress(&self.inner, Inner::progress);
    }

    fn device_address(&self) -> Vec<u8> {
        encode_ip(self.inner.dev.addr)
    }

    fn event_fd(&self) -> UcsResult<RawFd> {
        Ok(self.inner.epoll.as_raw_fd())
    }

    fn event_arm(&self, _events: EventFlags) -> UcsResult<()> {
        self.inner.arm()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.inner.port.to_be_bytes().to_vec()
    }

    fn is_reachable(&self, dev_addr: &[u8], iface_addr: Option<&[u8]>) -> bool {
        let Some(ip) = decode_ip(dev_addr) else { return false };
        if iface_addr.is_some_and(|a| a.len() != 2) {
            return false;
        }
        // Same family; a loopback device reaches loopback addresses only, and only it does.
        ip.is_ipv4() == self.inner.dev.addr.is_ipv4() && ip.is_loopback() == self.inner.dev.addr.is_loopback()
    }

    fn ep_create(&self, params: &EpParams<'_>) -> UcsResult<Box<dyn Ep>> {
        let EpConnect::ToIface { dev_addr, iface_addr } = params.connect else {
            return Err(Status::Unsupported);
        };
        let (Some(ip), Ok(port)) = (decode_ip(dev_addr), <[u8; 2]>::try_from(iface_addr)) else {
            tracing::debug!("tcp: a malformed peer address");
            return Err(Status::InvalidAddr);
        };
        if !self.is_reachable(dev_addr, Some(iface_addr)) {
            return Err(Status::Unreachable);
        }
        let peer = match ip {
            IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80 => {
                SocketAddr::V6(std::net::SocketAddrV6::new(a, u16::from_be_bytes(port), 0, self.inner.dev.scope_id))
            }
            ip => SocketAddr::new(ip, u16::from_be_bytes(port)),
        };
        // The connection the peer opened towards us, if no endpoint here writes to it yet:
        // one socket for both directions.
        let st = match self.inner.free_link(peer) {
            Some(link) => EpState::attach(&self.inner, link, SockAddr::from(peer), params.user_data),
            None => EpState::connect(&self.inner, SockAddr::from(peer), params.user_data)?,
        };
        self.inner.eps.borrow_mut().push((st.group, Rc::downgrade(&st)));
        Ok(Box::new(TcpEp::new(st)))
    }

    fn flush(&self, _flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        let eps: Vec<Rc<EpState>> = self.inner.eps.borrow().iter().filter_map(|(_, w)| w.upgrade()).collect();
        let busy: Vec<&Rc<EpState>> = eps.iter().filter(|e| !e.is_flushed()).collect();
        if busy.is_empty() {
            return Ok(Outcome::Done(()));
        }
        if let Some(c) = comp {
            c.add_count(busy.len() as i32 - 1);
            for e in busy {
                e.add_flush_comp(c.clone());
            }
        }
        Ok(Outcome::InProgress)
    }
}
