//! One interface's endpoints and the connection handshake between them. Sans-IO like
//! [`RelEp`]: received datagrams and the time go in, datagrams to send and events come out.
//!
//! ## Handshake
//! Endpoints are paired by *(peer interface address, path index, connection sequence
//! number)*. Each side numbers its connections to a given peer 0, 1, 2, ... in the order it
//! creates them, so the n-th connection A makes to B pairs with the n-th connection B makes to
//! A, whoever starts first (UCX's connection matching, `ucs_conn_match`).
//!
//! - [`connect_to_iface`](UdIface::connect_to_iface) creates an endpoint and queues a CREQ
//!   (sequence number [`INITIAL_PSN`], addressed to no endpoint, carrying the requester's
//!   endpoint address, connection number and device address).
//! - A CREQ for a key nobody here has yet creates a *passive* endpoint, which learns the
//!   requester's id from it and queues a CREP carrying its own id ([`IfaceEvent::Accepted`]).
//!   A later local `connect_to_iface` with the same key adopts that endpoint instead of
//!   creating one.
//! - A CREQ for a key whose local endpoint is still waiting for its own reply is a
//!   simultaneous connect: the local endpoint learns the peer's id from the CREQ and needs no
//!   CREP; its own CREQ, on its way to the peer, does the same there.
//! - A CREQ for a key already connected to the same peer endpoint is a retransmission: it is
//!   acknowledged, nothing else.
//!
//! CREQ and CREP are ordinary sequenced packets for [`RelEp`]: kept in the send window,
//! resent until acknowledged, and counted in the receiver's sequence, so data that overtakes
//! them waits for them like any other gap.
//!
//! ## Driving it
//! After [`on_packet`](UdIface::on_packet) drain [`pull`](UdIface::pull) for the endpoint it
//! names; after any event drain [`poll_transmit`](UdIface::poll_transmit) and
//! [`poll_event`](UdIface::poll_event); call [`handle_timeout`](UdIface::handle_timeout) at
//! [`poll_timeout`](UdIface::poll_timeout).

use std::collections::{HashMap, VecDeque};

use ucs::Status;

use super::config::RelConfig;
use super::rel::{RecvVerdict, RelEp, TxKind, INITIAL_PSN};
use super::wire::{Crep, Creq, CtlPacket, EpAddr, Neth, Packet, PacketKind, PeerAddr, WireError, EP_NULL_ID};

/// What identifies a connection on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ConnKey {
    peer: PeerAddr,
    path_index: u8,
    conn_sn: u32,
}

#[derive(Debug)]
struct EpEntry<R> {
    rel: RelEp<R>,
    key: ConnKey,
    /// Created by a peer's CREQ and not yet claimed by a local `connect_to_iface`.
    private: bool,
    /// In the transmit schedule.
    scheduled: bool,
}

/// Something the user of the interface should know about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfaceEvent {
    /// A peer's CREQ created endpoint `ep` (not yet claimed by a local connect).
    Accepted {
        /// The new endpoint.
        ep: u32,
        /// The requesting interface.
        peer: PeerAddr,
        /// Its connection number.
        conn_sn: u32,
    },
    /// Endpoint `ep` learned its peer endpoint's id: data can flow.
    Connected {
        /// The endpoint.
        ep: u32,
        /// The peer endpoint's id.
        dest_ep_id: u32,
    },
    /// Endpoint `ep` failed (peer timeout); destroy it with [`UdIface::destroy_ep`].
    Failed {
        /// The endpoint.
        ep: u32,
        /// Why.
        status: Status,
    },
}

/// Why [`UdIface::on_packet`] gave a descriptor back without delivering it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseReason {
    /// Pure acknowledgement or control packet, fully processed.
    Control,
    /// Received before.
    Duplicate,
    /// Out of order beyond the receive window.
    Gap,
    /// Addressed to an endpoint that does not exist.
    UnknownEp,
    /// The endpoint has failed.
    Failed,
    /// A control packet that contradicts the endpoint's state (wrong peer id, bad sequence
    /// number), or no endpoint could be created for it.
    Rejected,
    /// Not a valid packet.
    Invalid(WireError),
}

/// What [`UdIface::on_packet`] did with a datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum RxOutcome<R> {
    /// In-order data for endpoint `ep`: the payload is `desc`'s bytes after the header.
    Deliver {
        /// Receiving endpoint.
        ep: u32,
        /// [`PacketKind::Am`] or [`PacketKind::Put`].
        kind: PacketKind,
        /// The datagram.
        desc: R,
    },
    /// Held out of order by endpoint `ep`.
    Held {
        /// Holding endpoint.
        ep: u32,
    },
    /// Nothing to deliver; release `desc`.
    Release {
        /// The endpoint it was for, if any.
        ep: Option<u32>,
        /// The datagram.
        desc: R,
        /// Why.
        reason: ReleaseReason,
    },
}

impl<R> RxOutcome<R> {
    /// The endpoint the datagram went to (drain [`UdIface::pull`] for it).
    pub fn ep(&self) -> Option<u32> {
        match self {
            RxOutcome::Deliver { ep, .. } | RxOutcome::Held { ep } => Some(*ep),
            RxOutcome::Release { ep, .. } => *ep,
        }
    }
}

/// A datagram to send now.
#[derive(Debug)]
pub struct Transmit<'a> {
    /// Sending endpoint.
    pub ep: u32,
    /// Destination interface.
    pub peer: &'a PeerAddr,
    /// The datagram.
    pub bytes: &'a [u8],
    /// Why it is sent.
    pub kind: TxKind,
}

/// Interface-wide counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceStats {
    /// Datagrams that failed to decode.
    pub rx_invalid: u64,
    /// Datagrams for endpoints that do not exist.
    pub rx_unknown_ep: u64,
    /// Control packets rejected.
    pub rx_rejected: u64,
    /// Endpoints created by CREQs.
    pub passive_eps: u64,
}

/// Endpoints of one UD interface, their connection state and reliability.
#[derive(Debug)]
pub struct UdIface<R> {
    cfg: RelConfig,
    local: PeerAddr,
    eps: Vec<Option<EpEntry<R>>>,
    free_ids: VecDeque<u32>,
    conns: HashMap<ConnKey, u32>,
    next_conn_sn: HashMap<(PeerAddr, u8), u32>,
    sched: VecDeque<u32>,
    events: VecDeque<IfaceEvent>,
    stats: IfaceStats,
}

impl<R> UdIface<R> {
    /// An interface whose own address (put in CREQs) is `local`.
    pub fn new(local: PeerAddr, cfg: RelConfig) -> Result<Self, Status> {
        cfg.validate()?;
        if local.qp_num >= EP_NULL_ID {
            return Err(Status::InvalidParam);
        }
        Ok(UdIface {
            cfg,
            local,
            eps: Vec::new(),
            free_ids: VecDeque::new(),
            conns: HashMap::new(),
            next_conn_sn: HashMap::new(),
            sched: VecDeque::new(),
            events: VecDeque::new(),
            stats: IfaceStats::default(),
        })
    }

    /// This interface's address.
    pub fn local_addr(&self) -> &PeerAddr {
        &self.local
    }

    /// The settings in use.
    pub fn config(&self) -> &RelConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &IfaceStats {
        &self.stats
    }

    fn entry(&self, ep: u32) -> Option<&EpEntry<R>> {
        self.eps.get(ep as usize)?.as_ref()
    }

    fn entry_mut(&mut self, ep: u32) -> Option<&mut EpEntry<R>> {
        self.eps.get_mut(ep as usize)?.as_mut()
    }

    /// The reliability state of endpoint `ep`.
    pub fn ep(&self, ep: u32) -> Option<&RelEp<R>> {
        self.entry(ep).map(|e| &e.rel)
    }

    /// The interface endpoint `ep` talks to.
    pub fn ep_peer(&self, ep: u32) -> Option<&PeerAddr> {
        self.entry(ep).map(|e| &e.key.peer)
    }

    /// Whether endpoint `ep` was created by a peer and not yet claimed locally.
    pub fn is_private(&self, ep: u32) -> Option<bool> {
        self.entry(ep).map(|e| e.private)
    }

    /// Ids of all endpoints, in id order.
    pub fn ep_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eps.iter().enumerate().filter(|(_, e)| e.is_some()).map(|(i, _)| i as u32)
    }

    /// Number of endpoints.
    pub fn num_eps(&self) -> usize {
        self.eps.iter().filter(|e| e.is_some()).count()
    }

    /// Whether endpoint `ep` can send a data packet now.
    pub fn can_send(&self, ep: u32) -> bool {
        self.entry(ep).is_some_and(|e| e.rel.can_send())
    }

    fn alloc_ep(&mut self, now: u64, key: ConnKey, private: bool) -> Result<u32, Status> {
        let id = match self.free_ids.pop_front() {
            Some(id) => id,
            None if self.eps.len() < EP_NULL_ID as usize => self.eps.len() as u32,
            None => return Err(Status::NoResource),
        };
        let entry = EpEntry { rel: RelEp::new(&self.cfg, now), key, private, scheduled: false };
        if id as usize == self.eps.len() {
            self.eps.push(Some(entry));
        } else {
            self.eps[id as usize] = Some(entry);
        }
        self.conns.insert(key, id);
        Ok(id)
    }

    fn schedule(&mut self, ep: u32, now: u64) {
        if let Some(e) = self.eps.get_mut(ep as usize).and_then(Option::as_mut) {
            if !e.scheduled && e.rel.has_transmit(now) {
                e.scheduled = true;
                self.sched.push_back(ep);
            }
        }
    }

    /// Creates an endpoint to the interface `peer` (UCX `uct_ep_create` with an interface
    /// address) and queues its CREQ, or claims the endpoint a CREQ from `peer` with the same
    /// connection number already created.
    pub fn connect_to_iface(&mut self, now: u64, peer: PeerAddr, path_index: u8) -> Result<u32, Status> {
        if peer.qp_num >= EP_NULL_ID {
            return Err(Status::InvalidAddr);
        }
        let counter = self.next_conn_sn.entry((peer, path_index)).or_insert(0);
        let conn_sn = *counter;
        *counter = counter.wrapping_add(1);
        let key = ConnKey { peer, path_index, conn_sn };
        if let Some(&id) = self.conns.get(&key) {
            return match self.entry_mut(id) {
                Some(e) if e.private => {
                    e.private = false;
                    Ok(id)
                }
                _ => Err(Status::AlreadyExists),
            };
        }
        let id = self.alloc_ep(now, key, false)?;
        let creq = CtlPacket::Creq(Creq {
            ep_addr: EpAddr { qp_num: self.local.qp_num, ep_id: id },
            conn_sn,
            path_index,
            dev_addr: self.local.dev_addr,
        });
        let queued = self.entry_mut(id).map(|e| e.rel.queue_ctl(now, EP_NULL_ID, &creq));
        if let Some(Err(s)) = queued {
            self.destroy_ep(id, drop);
            return Err(s);
        }
        self.schedule(id, now);
        Ok(id)
    }

    /// Removes endpoint `ep`, handing held receive descriptors to `sink`. Its id may be
    /// reused, so late packets from the old peer could reach a new endpoint: the caller
    /// should keep an endpoint whose peer may still send (UCX lingers for
    /// `UCX_UD_LINGER_TIMEOUT`) before destroying it.
    pub fn destroy_ep(&mut self, ep: u32, sink: impl FnMut(R)) -> bool {
        let Some(mut e) = self.eps.get_mut(ep as usize).and_then(Option::take) else {
            return false;
        };
        e.rel.purge(sink);
        if self.conns.get(&e.key) == Some(&ep) {
            self.conns.remove(&e.key);
        }
        self.sched.retain(|&id| id != ep);
        self.free_ids.push_back(ep);
        true
    }

    /// Fails endpoint `ep` with `status` at the user's request (e.g. a cancelling flush): its
    /// send window is dropped and it sends nothing more. No [`IfaceEvent::Failed`] is queued.
    /// Returns false for an unknown endpoint.
    pub fn fail_ep(&mut self, ep: u32, status: Status) -> bool {
        let Some(e) = self.entry_mut(ep) else { return false };
        e.rel.fail(status);
        self.sched.retain(|&id| id != ep);
        if let Some(e) = self.entry_mut(ep) {
            e.scheduled = false;
        }
        true
    }

    /// Sends an active message or put on endpoint `ep` (see [`RelEp::send`]).
    pub fn send(&mut self, now: u64, ep: u32, kind: PacketKind, payload: &[u8]) -> Result<Transmit<'_>, Status> {
        self.send_with(now, ep, kind, |buf| buf.extend_from_slice(payload))
    }

    /// Sends on endpoint `ep` with `pack` appending the payload (see [`RelEp::send_with`]).
    pub fn send_with(
        &mut self,
        now: u64,
        ep: u32,
        kind: PacketKind,
        pack: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Transmit<'_>, Status> {
        let e = self.eps.get_mut(ep as usize).and_then(Option::as_mut).ok_or(Status::InvalidParam)?;
        let bytes = e.rel.send_with(now, kind, pack)?;
        Ok(Transmit { ep, peer: &e.key.peer, bytes, kind: TxKind::Fresh })
    }

    /// Asks endpoint `ep`'s peer to acknowledge everything now (flush).
    pub fn request_ack(&mut self, now: u64, ep: u32) {
        if let Some(e) = self.entry_mut(ep) {
            e.rel.request_ack();
        }
        self.schedule(ep, now);
    }

    /// Processes a received datagram. `desc` owns it; it comes back in the outcome unless an
    /// endpoint holds it out of order (then it comes back later from [`pull`](Self::pull)
    /// or [`destroy_ep`](Self::destroy_ep)).
    pub fn on_packet(&mut self, now: u64, desc: R) -> RxOutcome<R>
    where
        R: AsRef<[u8]>,
    {
        let (neth, ctl) = match Packet::decode(desc.as_ref()) {
            Ok(Packet::Data { neth, .. }) | Ok(Packet::Ack(neth)) => (neth, None),
            Ok(Packet::Ctl { neth, ctl }) => (neth, Some(ctl)),
            Err(e) => {
                self.stats.rx_invalid += 1;
                return RxOutcome::Release { ep: None, desc, reason: ReleaseReason::Invalid(e) };
            }
        };
        let ep = match ctl {
            Some(CtlPacket::Creq(creq)) => match self.rx_creq(now, &neth, &creq) {
                Ok(ep) => ep,
                Err(reason) => return RxOutcome::Release { ep: None, desc, reason },
            },
            Some(CtlPacket::Crep(crep)) => match self.rx_crep(&neth, crep) {
                Ok(ep) => ep,
                Err(reason) => return RxOutcome::Release { ep: None, desc, reason },
            },
            None => neth.dest_ep_id,
        };
        let Some(e) = self.eps.get_mut(ep as usize).and_then(Option::as_mut) else {
            self.stats.rx_unknown_ep += 1;
            return RxOutcome::Release { ep: None, desc, reason: ReleaseReason::UnknownEp };
        };
        let verdict = e.rel.on_recv(now, &neth, desc);
        self.schedule(ep, now);
        let release = |desc, reason| RxOutcome::Release { ep: Some(ep), desc, reason };
        match verdict {
            RecvVerdict::Deliver(desc) => RxOutcome::Deliver { ep, kind: neth.kind, desc },
            RecvVerdict::Control(desc) => release(desc, ReleaseReason::Control),
            RecvVerdict::Duplicate(desc) => release(desc, ReleaseReason::Duplicate),
            RecvVerdict::Gap(Some(desc)) => release(desc, ReleaseReason::Gap),
            RecvVerdict::Gap(None) => RxOutcome::Held { ep },
            RecvVerdict::Failed(desc) => release(desc, ReleaseReason::Failed),
        }
    }

    /// Finds or creates the endpoint a CREQ is for and connects it.
    fn rx_creq(&mut self, now: u64, neth: &Neth, creq: &Creq) -> Result<u32, ReleaseReason> {
        let reject = |s: &mut Self| {
            s.stats.rx_rejected += 1;
            Err(ReleaseReason::Rejected)
        };
        if neth.psn != INITIAL_PSN {
            return reject(self);
        }
        let key = ConnKey { peer: creq.peer(), path_index: creq.path_index, conn_sn: creq.conn_sn };
        let peer_id = creq.ep_addr.ep_id;
        if let Some(&id) = self.conns.get(&key) {
            let Some(e) = self.entry_mut(id) else { return reject(self) };
            match e.rel.dest_ep_id() {
                None => {
                    // Simultaneous connect: our CREQ is on its way there, theirs arrived here.
                    if e.rel.set_dest_ep_id(peer_id).is_err() {
                        return reject(self);
                    }
                    self.events.push_back(IfaceEvent::Connected { ep: id, dest_ep_id: peer_id });
                }
                Some(d) if d == peer_id => {}
                Some(_) => return reject(self),
            }
            return Ok(id);
        }
        let Ok(id) = self.alloc_ep(now, key, true) else { return reject(self) };
        let crep = CtlPacket::Crep(Crep { src_ep_id: id });
        let ok = self
            .entry_mut(id)
            .map(|e| e.rel.set_dest_ep_id(peer_id).is_ok() && e.rel.queue_ctl(now, peer_id, &crep).is_ok());
        if ok != Some(true) {
            self.destroy_ep(id, drop);
            return reject(self);
        }
        self.stats.passive_eps += 1;
        self.events.push_back(IfaceEvent::Accepted { ep: id, peer: key.peer, conn_sn: key.conn_sn });
        self.events.push_back(IfaceEvent::Connected { ep: id, dest_ep_id: peer_id });
        Ok(id)
    }

    /// Connects the endpoint a CREP is addressed to.
    fn rx_crep(&mut self, neth: &Neth, crep: Crep) -> Result<u32, ReleaseReason> {
        let id = neth.dest_ep_id;
        let Some(e) = self.entry_mut(id) else {
            self.stats.rx_unknown_ep += 1;
            return Err(ReleaseReason::UnknownEp);
        };
        match e.rel.dest_ep_id() {
            None => {
                if e.rel.set_dest_ep_id(crep.src_ep_id).is_err() {
                    self.stats.rx_rejected += 1;
                    return Err(ReleaseReason::Rejected);
                }
                self.events.push_back(IfaceEvent::Connected { ep: id, dest_ep_id: crep.src_ep_id });
            }
            Some(d) if d == crep.src_ep_id => {}
            Some(_) => {
                self.stats.rx_rejected += 1;
                return Err(ReleaseReason::Rejected);
            }
        }
        Ok(id)
    }

    /// The next held datagram of endpoint `ep` that is now in order, with its kind. Control
    /// packets come out too (kind [`PacketKind::Ctl`]): release them.
    pub fn pull(&mut self, ep: u32) -> Option<(PacketKind, R)> {
        self.entry_mut(ep)?.rel.pull()
    }

    /// The next datagram to send: control packets, resends and acknowledgements, one
    /// endpoint after the other.
    pub fn poll_transmit(&mut self, now: u64) -> Option<Transmit<'_>> {
        let id = loop {
            let id = self.sched.pop_front()?;
            match self.eps.get_mut(id as usize).and_then(Option::as_mut) {
                Some(e) if e.rel.has_transmit(now) => break id,
                Some(e) => e.scheduled = false,
                None => {}
            }
        };
        // Back of the queue: one datagram per endpoint per turn.
        self.sched.push_back(id);
        let e = self.eps.get_mut(id as usize).and_then(Option::as_mut)?;
        let t = e.rel.poll_transmit(now)?;
        Some(Transmit { ep: id, peer: &e.key.peer, bytes: t.bytes, kind: t.kind })
    }

    /// Runs every endpoint's timers; failures become [`IfaceEvent::Failed`].
    pub fn handle_timeout(&mut self, now: u64) {
        for id in 0..self.eps.len() as u32 {
            let Some(e) = self.eps.get_mut(id as usize).and_then(Option::as_mut) else { continue };
            let was_failed = e.rel.status().is_err();
            if let Err(status) = e.rel.handle_timeout(now) {
                if !was_failed {
                    self.events.push_back(IfaceEvent::Failed { ep: id, status });
                }
            }
            self.schedule(id, now);
        }
    }

    /// The earliest time any endpoint has a timer due.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.eps.iter().flatten().filter_map(|e| e.rel.poll_timeout()).min()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<IfaceEvent> {
        self.events.pop_front()
    }
}
