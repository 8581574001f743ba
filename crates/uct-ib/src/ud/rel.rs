//! Per-endpoint reliability: sequence numbers, acknowledgements, resends, congestion window,
//! peer timeout. Sans-IO: events and the current time go in, packets to transmit come out.
//!
//! ## Send side
//! Packets are numbered from [`INITIAL_PSN`]; the window is `[acked + 1, psn)` and may hold up
//! to `cwnd - 1` packets (UCX's convention, so `UCX_UD_MAX_WINDOW` means the same). Every
//! packet stays in the send window (a ring of reused buffers) until an acknowledgement covers
//! it. The sender asks for an acknowledgement (ACK_REQ) on the packet that fills a quarter of
//! the window, on the one that fills the window, and when a probe is owed.
//!
//! Loss is detected two ways: a NAK from the receiver (it saw a gap), or the resend timer
//! (`UCX_UD_TIMER_TICK`, multiplied by `UCX_UD_TIMER_BACKOFF` at each expiry up to a third of
//! `UCX_UD_TIMEOUT`). The first timer expiry only probes (a pure ack with ACK_REQ: the packets
//! may have arrived and only the acknowledgements been lost); the next one resends. A resend
//! goes back to `acked + 1` and replays every outstanding packet that fits the window, with
//! fresh acknowledgement fields. The congestion window grows by one per acknowledgement that
//! advances and halves (never below [`MIN_WINDOW`]) once per loss episode.
//!
//! When acknowledgements stop advancing while packets are outstanding for `UCX_UD_TIMEOUT`, the
//! endpoint fails with [`Status::EndpointTimeout`].
//!
//! ## Receive side
//! A [`FragList`] keyed by sequence number: the next expected packet is delivered, older ones
//! are duplicates (dropped, and an acknowledgement is owed because the sender is evidently
//! resending), newer ones are held up to `rx_window` ahead or dropped, and in both cases a NAK
//! is owed. Every packet's `ack_psn` is processed as an acknowledgement; every outgoing packet
//! carries the current receive head, so acknowledgements ride on data whenever there is data.
//! A pure ack goes out when one is owed and no packet carried it within `ack_delay`.

use ucs::fraglist::{FragInsert, FragList, Sn16};
use ucs::Status;

use super::config::{RelConfig, MIN_WINDOW};
use super::txwin::TxWindow;
use super::wire::{patch_ack_psn, patch_ack_req, CtlPacket, Neth, PacketKind, EP_NULL_ID, NETH_LEN};

/// Sequence number of an endpoint's first packet (UCX `UCT_UD_INITIAL_PSN`); a CREQ always
/// carries it.
pub const INITIAL_PSN: Sn16 = Sn16(1);

/// During a resend, every this many packets asks for an acknowledgement (UCX
/// `UCT_UD_RESENDS_PER_ACK`).
pub const RESENDS_PER_ACK: i32 = 4;

/// What became of a received sequenced packet or acknowledgement.
///
/// After every [`RelEp::on_recv`], call [`RelEp::pull`] until it returns `None`: a packet
/// that closes a gap makes held packets deliverable.
#[derive(Debug, PartialEq, Eq)]
pub enum RecvVerdict<R> {
    /// The next packet in order: hand its payload to the user.
    Deliver(R),
    /// A control packet (CREQ/CREP) in order, or a pure ack: nothing to deliver.
    Control(R),
    /// Received before; dropped. An acknowledgement is scheduled.
    Duplicate(R),
    /// Ahead of the next expected packet. `None`: held until the gap closes. `Some`: beyond
    /// the receive window, dropped. A NAK is scheduled either way.
    Gap(Option<R>),
    /// The endpoint has failed; the packet was ignored.
    Failed(R),
}

/// Why a packet is being transmitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxKind {
    /// First transmission of a queued control packet (CREQ / CREP).
    Fresh,
    /// Retransmission of a packet in the window.
    Resend,
    /// Pure acknowledgement (possibly with NAK or ACK_REQ); not kept for resending.
    Ack,
}

/// A packet to put on the wire now.
#[derive(Debug)]
pub struct RelTransmit<'a> {
    /// The whole packet, header included.
    pub bytes: &'a [u8],
    /// Why it is sent.
    pub kind: TxKind,
}

/// Counters of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelStats {
    /// Sequenced packets sent for the first time.
    pub sent: u64,
    /// Retransmissions.
    pub resent: u64,
    /// Pure acknowledgements sent (with or without NAK / ACK_REQ).
    pub acks_sent: u64,
    /// NAKs sent.
    pub naks_sent: u64,
    /// NAKs received that started a resend.
    pub naks_acted: u64,
    /// Resend timer expiries that started a resend.
    pub timeouts: u64,
    /// Resend timer expiries that sent an ACK_REQ probe.
    pub probes: u64,
    /// Packets received in order.
    pub delivered: u64,
    /// Duplicate packets received.
    pub duplicates: u64,
    /// Out-of-order packets received (held or dropped).
    pub out_of_order: u64,
    /// Acknowledgements naming packets never transmitted (ignored).
    pub bad_acks: u64,
    /// Longest time, in nanoseconds, that packets were outstanding before an acknowledgement
    /// advanced (compare with the peer timeout).
    pub max_ack_wait: u64,
}

#[derive(Clone, Copy, Debug)]
struct Resend {
    /// First packet of this resend round (for spacing ACK_REQs).
    start: Sn16,
    /// Next packet to resend.
    next: Sn16,
    /// One past the last packet to resend.
    end: Sn16,
}

/// Reliability state of one endpoint. `R` is the caller's receive descriptor: the core holds
/// out-of-order ones and hands every one back exactly once.
#[derive(Debug)]
pub struct RelEp<R> {
    tick: u64,
    backoff: f64,
    max_rto: u64,
    peer_timeout: u64,
    wmax: u16,
    ack_delay: u64,
    max_packet: usize,

    dest_ep_id: Option<u32>,

    /// Next sequence number to assign.
    psn: Sn16,
    /// Last sequence number the peer acknowledged.
    acked: Sn16,
    /// First sequence number never transmitted (queued control packets wait here).
    unsent: Sn16,
    cwnd: u16,
    window: TxWindow,
    /// Last (re)transmission or acknowledgement progress: the resend timer runs from here.
    last_tx: u64,
    /// Current resend timeout.
    rto: u64,
    /// When acknowledgements last advanced (or the window last became non-empty).
    progress_time: u64,
    /// The resend timer already probed since the last progress.
    probed: bool,
    resend: Option<Resend>,
    /// The window is not cut again until the acknowledgements pass this.
    recovery: Sn16,
    /// An ACK_REQ should go out on the next packet.
    probe: bool,

    rx: FragList<(PacketKind, R)>,
    /// An acknowledgement is owed, at this time.
    ack_due: Option<u64>,
    nak: bool,
    /// Receive head and time of the last NAK, to send at most one per head per tick.
    last_nak: Option<(Sn16, u64)>,

    ack_buf: [u8; NETH_LEN],
    failed: Option<Status>,
    stats: RelStats,
}

impl<R> RelEp<R> {
    /// A fresh endpoint: nothing sent, nothing received, not connected.
    pub fn new(cfg: &RelConfig, now: u64) -> Self {
        RelEp {
            tick: cfg.timer_tick.max(1),
            backoff: cfg.timer_backoff.max(1.0),
            max_rto: cfg.max_rto(),
            peer_timeout: cfg.peer_timeout,
            wmax: cfg.max_window.max(MIN_WINDOW),
            ack_delay: cfg.ack_delay,
            max_packet: cfg.max_packet,
            dest_ep_id: None,
            psn: INITIAL_PSN,
            acked: Sn16(INITIAL_PSN.0.wrapping_sub(1)),
            unsent: INITIAL_PSN,
            cwnd: cfg.initial_window.clamp(MIN_WINDOW, cfg.max_window.max(MIN_WINDOW)),
            window: TxWindow::new(INITIAL_PSN, cfg.max_packet),
            last_tx: now,
            rto: cfg.timer_tick.max(1),
            progress_time: now,
            probed: false,
            resend: None,
            recovery: Sn16(INITIAL_PSN.0.wrapping_sub(1)),
            probe: false,
            rx: FragList::new(Sn16(INITIAL_PSN.0.wrapping_sub(1)), cfg.rx_window),
            ack_due: None,
            nak: false,
            last_nak: None,
            ack_buf: [0; NETH_LEN],
            failed: None,
            stats: RelStats::default(),
        }
    }

    /// The peer endpoint's id, once known.
    pub fn dest_ep_id(&self) -> Option<u32> {
        self.dest_ep_id
    }

    /// Records the peer endpoint's id: the endpoint is connected. Ids that do not fit the
    /// header (or the null id) are refused.
    pub fn set_dest_ep_id(&mut self, id: u32) -> Result<(), Status> {
        if id >= EP_NULL_ID {
            return Err(Status::InvalidParam);
        }
        self.dest_ep_id = Some(id);
        Ok(())
    }

    /// Whether the peer endpoint's id is known.
    pub fn is_connected(&self) -> bool {
        self.dest_ep_id.is_some()
    }

    /// `Err` with the failure status once the endpoint has failed.
    pub fn status(&self) -> Result<(), Status> {
        self.failed.map_or(Ok(()), Err)
    }

    /// Next sequence number to be assigned.
    pub fn next_psn(&self) -> Sn16 {
        self.psn
    }

    /// Last sequence number the peer acknowledged.
    pub fn acked_psn(&self) -> Sn16 {
        self.acked
    }

    /// Last sequence number received in order (what outgoing packets acknowledge).
    pub fn rx_head(&self) -> Sn16 {
        self.rx.head_sn()
    }

    /// Current congestion window (at most `cwnd - 1` packets in flight).
    pub fn cwnd(&self) -> u16 {
        self.cwnd
    }

    /// Packets sent (or queued) and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.window.len()
    }

    /// Out-of-order packets held.
    pub fn rx_held(&self) -> usize {
        self.rx.num_held()
    }

    /// Counters.
    pub fn stats(&self) -> &RelStats {
        &self.stats
    }

    /// Whether a data packet could be sent now: connected, not failed, nothing queued ahead of
    /// it, and room in the congestion window.
    pub fn can_send(&self) -> bool {
        self.failed.is_none() && self.dest_ep_id.is_some() && self.unsent == self.psn && self.window_has_room()
    }

    fn window_has_room(&self) -> bool {
        self.psn.distance(self.acked) < i32::from(self.cwnd)
    }

    /// Whether everything sent has been acknowledged.
    pub fn is_idle(&self) -> bool {
        self.window.is_empty()
    }

    /// Sends an active message or put with `payload`: assigns the next sequence number, keeps
    /// the packet for resending and returns its bytes, to be posted now.
    ///
    /// `NoResource` when not connected or the window is full (retry after progress); the
    /// failure status once failed; `InvalidParam` for a packet longer than `max_packet` or a
    /// kind other than [`PacketKind::Am`] / [`PacketKind::Put`].
    pub fn send(&mut self, now: u64, kind: PacketKind, payload: &[u8]) -> Result<&[u8], Status> {
        self.send_with(now, kind, |buf| buf.extend_from_slice(payload))
    }

    /// As [`send`](Self::send), with `pack` appending the payload to the packet buffer (which
    /// already holds the header), as bcopy sends do.
    pub fn send_with(&mut self, now: u64, kind: PacketKind, pack: impl FnOnce(&mut Vec<u8>)) -> Result<&[u8], Status> {
        self.status()?;
        let dest = self.dest_ep_id.ok_or(Status::NoResource)?;
        if !matches!(kind, PacketKind::Am(_) | PacketKind::Put) {
            return Err(Status::InvalidParam);
        }
        if !self.can_send() {
            return Err(Status::NoResource);
        }
        let psn = self.psn;
        let neth = Neth {
            dest_ep_id: dest,
            kind,
            ack_req: self.probe || self.wants_ack_req(psn),
            ecn: false,
            psn,
            ack_psn: self.rx.head_sn(),
        };
        let header = neth.to_bytes()?;
        let max = self.max_packet;
        let buf = self.window.push();
        buf.extend_from_slice(&header);
        pack(buf);
        if buf.len() > max {
            self.window.pop_back();
            return Err(Status::InvalidParam);
        }
        self.commit(now);
        self.unsent = self.psn;
        self.last_tx = now;
        self.piggybacked(neth.ack_req);
        self.stats.sent += 1;
        Ok(self.window.back())
    }

    /// Queues a control packet (CREQ with `dest` = [`EP_NULL_ID`], or CREP) as the next
    /// sequenced packet; [`poll_transmit`](Self::poll_transmit) sends it. Returns its number.
    pub(crate) fn queue_ctl(&mut self, now: u64, dest: u32, ctl: &CtlPacket) -> Result<Sn16, Status> {
        self.status()?;
        let psn = self.psn;
        let neth = Neth {
            dest_ep_id: dest,
            kind: PacketKind::Ctl,
            ack_req: true,
            ecn: false,
            psn,
            ack_psn: self.rx.head_sn(),
        };
        let header = neth.to_bytes()?;
        let buf = self.window.push();
        buf.resize(NETH_LEN + ctl.encoded_len(), 0);
        buf[..NETH_LEN].copy_from_slice(&header);
        if let Err(e) = ctl.encode(&mut buf[NETH_LEN..]) {
            self.window.pop_back();
            return Err(e.into());
        }
        self.commit(now);
        Ok(psn)
    }

    /// Bookkeeping after a packet was appended to the window.
    fn commit(&mut self, now: u64) {
        if self.window.len() == 1 {
            self.progress_time = now;
            self.probed = false;
        }
        self.psn = self.psn.next();
    }

    /// An outgoing packet carried the current receive head (and maybe ACK_REQ).
    fn piggybacked(&mut self, ack_req: bool) {
        self.ack_due = None;
        if ack_req {
            self.probe = false;
        }
    }

    /// Ask for an acknowledgement on the packet filling a quarter of the window and on the one
    /// filling it.
    fn wants_ack_req(&self, psn: Sn16) -> bool {
        let ahead = psn.distance(self.acked);
        let cwnd = i32::from(self.cwnd);
        ahead == (cwnd / 4).max(1) || ahead + 1 >= cwnd
    }

    /// Asks the peer to acknowledge now (a flush): the next packet, or a pure ack, carries
    /// ACK_REQ. Nothing happens when nothing is outstanding.
    pub fn request_ack(&mut self) {
        if !self.window.is_empty() {
            self.probe = true;
        }
    }

    /// Processes a received packet addressed to this endpoint: its acknowledgement, its
    /// ACK_REQ / NAK flags, and its place in the sequence.
    pub fn on_recv(&mut self, now: u64, neth: &Neth, desc: R) -> RecvVerdict<R> {
        if self.failed.is_some() {
            return RecvVerdict::Failed(desc);
        }
        self.on_ack(now, neth.ack_psn);
        if let PacketKind::Ack { nak } = neth.kind {
            if nak {
                self.on_nak();
            }
            if neth.ack_req {
                self.owe_ack(now, 0);
            }
            return RecvVerdict::Control(desc);
        }
        if neth.ack_req {
            self.owe_ack(now, self.ack_delay);
        }
        match self.rx.insert(neth.psn, (neth.kind, desc)) {
            FragInsert::InOrder((kind, desc)) | FragInsert::Ready((kind, desc)) => {
                if kind == PacketKind::Ctl {
                    RecvVerdict::Control(desc)
                } else {
                    self.stats.delivered += 1;
                    RecvVerdict::Deliver(desc)
                }
            }
            FragInsert::Held => {
                self.stats.out_of_order += 1;
                self.owe_nak(now);
                RecvVerdict::Gap(None)
            }
            FragInsert::Duplicate((_, desc)) => {
                self.stats.duplicates += 1;
                self.owe_ack(now, 0);
                RecvVerdict::Duplicate(desc)
            }
            FragInsert::OutOfWindow((_, desc)) => {
                self.stats.out_of_order += 1;
                self.owe_nak(now);
                RecvVerdict::Gap(Some(desc))
            }
        }
    }

    /// The next held packet that is now in order, with its kind. Control packets come out
    /// too (kind [`PacketKind::Ctl`]): release them, there is nothing to deliver.
    pub fn pull(&mut self) -> Option<(PacketKind, R)> {
        let item = self.rx.pull()?;
        if item.0 != PacketKind::Ctl {
            self.stats.delivered += 1;
        }
        Some(item)
    }

    fn owe_ack(&mut self, now: u64, delay: u64) {
        let due = now.saturating_add(delay);
        self.ack_due = Some(self.ack_due.map_or(due, |d| d.min(due)));
    }

    fn owe_nak(&mut self, now: u64) {
        let head = self.rx.head_sn();
        match self.last_nak {
            Some((h, t)) if h == head && now < t.saturating_add(self.tick) => {}
            _ => self.nak = true,
        }
    }

    fn on_ack(&mut self, now: u64, ack: Sn16) {
        if !ack.gt(self.acked) {
            return;
        }
        if !ack.lt(self.unsent) {
            // Acknowledges something never transmitted: corrupt or stale, ignore it.
            self.stats.bad_acks += 1;
            return;
        }
        self.stats.max_ack_wait = self.stats.max_ack_wait.max(now.saturating_sub(self.progress_time));
        self.window.release_through(ack);
        self.acked = ack;
        if self.cwnd < self.wmax {
            self.cwnd += 1;
        }
        self.progress_time = now;
        self.last_tx = now;
        self.rto = self.tick;
        self.probed = false;
        if let Some(r) = &mut self.resend {
            if r.next.le(ack) {
                r.next = ack.next();
            }
            if !r.next.lt(r.end) {
                self.resend = None;
            }
        }
    }

    /// Whether some transmitted packet is still unacknowledged.
    fn has_outstanding(&self) -> bool {
        self.unsent.distance(self.acked) > 1
    }

    fn on_nak(&mut self) {
        if !self.has_outstanding() || self.resend.is_some() {
            return;
        }
        self.stats.naks_acted += 1;
        self.on_loss();
        self.start_resend();
    }

    /// Multiplicative decrease, once per window of data.
    fn on_loss(&mut self) {
        if self.acked.ge(self.recovery) {
            self.cwnd = (self.cwnd / 2).max(MIN_WINDOW);
            self.recovery = Sn16(self.unsent.0.wrapping_sub(1));
        }
    }

    fn start_resend(&mut self) {
        let first = self.acked.next();
        self.resend = Some(Resend { start: first, next: first, end: self.unsent });
        self.probed = false;
    }

    /// Marks the endpoint failed with `status` and drops its send window. Held receive
    /// descriptors stay until [`purge`](Self::purge).
    pub fn fail(&mut self, status: Status) {
        if self.failed.is_some() {
            return;
        }
        tracing::debug!(?status, acked = self.acked.0, psn = self.psn.0, "ud ep failed");
        self.failed = Some(status);
        self.window.clear(self.psn);
        self.acked = Sn16(self.psn.0.wrapping_sub(1));
        self.unsent = self.psn;
        self.resend = None;
        self.ack_due = None;
        self.nak = false;
        self.probe = false;
    }

    /// Hands every held out-of-order descriptor to `sink` (endpoint teardown).
    pub fn purge(&mut self, mut sink: impl FnMut(R)) {
        self.rx.purge(|(_, desc)| sink(desc));
    }

    /// Runs the timers: resend (probe first, then go back to the first unacknowledged
    /// packet) and peer timeout. Returns the failure status once the endpoint has failed.
    pub fn handle_timeout(&mut self, now: u64) -> Result<(), Status> {
        self.status()?;
        if self.window.is_empty() {
            return Ok(());
        }
        if now.saturating_sub(self.progress_time) >= self.peer_timeout {
            self.fail(Status::EndpointTimeout);
            return Err(Status::EndpointTimeout);
        }
        if !self.has_outstanding() || now < self.last_tx.saturating_add(self.rto) {
            return Ok(());
        }
        if !self.probed && self.dest_ep_id.is_some() && self.resend.is_none() {
            // The packets may have arrived and only the acknowledgements been lost: ask first.
            self.stats.probes += 1;
            self.probed = true;
            self.probe = true;
        } else {
            self.stats.timeouts += 1;
            self.on_loss();
            self.start_resend();
            self.probed = true;
            let next = (self.rto as f64 * self.backoff) as u64;
            self.rto = next.clamp(self.tick, self.max_rto);
        }
        self.last_tx = now;
        Ok(())
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) (or, for an owed
    /// acknowledgement, [`poll_transmit`](Self::poll_transmit)) has something to do.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.failed.is_some() {
            return None;
        }
        let mut t: Option<u64> = None;
        let mut at = |x: u64| t = Some(t.map_or(x, |t| t.min(x)));
        if !self.window.is_empty() {
            at(self.progress_time.saturating_add(self.peer_timeout));
            if self.has_outstanding() {
                at(self.last_tx.saturating_add(self.rto));
            }
        }
        if self.dest_ep_id.is_some() {
            if let Some(due) = self.ack_due {
                at(due);
            }
        }
        t
    }

    fn resend_ready(&self) -> Option<Resend> {
        let r = self.resend?;
        (r.next.lt(r.end) && r.next.distance(self.acked) < i32::from(self.cwnd)).then_some(r)
    }

    fn ack_ready(&self, now: u64) -> bool {
        self.dest_ep_id.is_some() && (self.nak || self.probe || self.ack_due.is_some_and(|d| d <= now))
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) would return a packet now.
    pub fn has_transmit(&self, now: u64) -> bool {
        self.failed.is_none() && (self.unsent != self.psn || self.resend_ready().is_some() || self.ack_ready(now))
    }

    /// The next packet to transmit: a queued control packet, then resends, then an owed
    /// acknowledgement. Call until `None` whenever the endpoint saw an event.
    pub fn poll_transmit(&mut self, now: u64) -> Option<RelTransmit<'_>> {
        if self.failed.is_some() {
            return None;
        }
        if self.unsent != self.psn {
            let psn = self.unsent;
            self.unsent = psn.next();
            self.last_tx = now;
            let ack_req = self.probe;
            return self.emit(psn, ack_req.then_some(true), TxKind::Fresh);
        }
        if let Some(mut r) = self.resend_ready() {
            let psn = r.next;
            r.next = psn.next();
            let last = r.next == r.end || r.next.distance(self.acked) >= i32::from(self.cwnd);
            let ack_req =
                self.probe || psn == self.acked.next() || psn.distance(r.start) % RESENDS_PER_ACK == 0 || last;
            self.resend = if r.next.lt(r.end) { Some(r) } else { None };
            self.last_tx = now;
            self.stats.resent += 1;
            return self.emit(psn, Some(ack_req), TxKind::Resend);
        }
        if let Some(r) = self.resend {
            if !r.next.lt(r.end) {
                self.resend = None;
            }
        }
        if !self.ack_ready(now) {
            return None;
        }
        let dest = self.dest_ep_id?;
        let head = self.rx.head_sn();
        let neth = Neth {
            dest_ep_id: dest,
            kind: PacketKind::Ack { nak: self.nak },
            ack_req: self.probe,
            ecn: false,
            psn: self.psn,
            ack_psn: head,
        };
        neth.encode(&mut self.ack_buf).ok()?;
        if self.nak {
            self.last_nak = Some((head, now));
            self.stats.naks_sent += 1;
        }
        self.stats.acks_sent += 1;
        self.nak = false;
        self.probe = false;
        self.ack_due = None;
        Some(RelTransmit { bytes: &self.ack_buf, kind: TxKind::Ack })
    }

    /// Refreshes the stored packet `psn` (acknowledgement field, ACK_REQ when `ack_req` is
    /// given) and returns it.
    fn emit(&mut self, psn: Sn16, ack_req: Option<bool>, kind: TxKind) -> Option<RelTransmit<'_>> {
        let head = self.rx.head_sn();
        self.piggybacked(ack_req == Some(true));
        let buf = self.window.get_mut(psn)?;
        patch_ack_psn(buf, head);
        if let Some(req) = ack_req {
            patch_ack_req(buf, req);
        }
        Some(RelTransmit { bytes: buf, kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn cfg() -> RelConfig {
        RelConfig::default()
    }

    fn connected(cfg: &RelConfig) -> RelEp<Vec<u8>> {
        let mut ep = RelEp::new(cfg, 0);
        ep.set_dest_ep_id(7).unwrap();
        ep
    }

    fn ack(psn: u16, ack_psn: u16, nak: bool, ack_req: bool) -> Neth {
        Neth {
            dest_ep_id: 1,
            kind: PacketKind::Ack { nak },
            ack_req,
            ecn: false,
            psn: Sn16(psn),
            ack_psn: Sn16(ack_psn),
        }
    }

    fn data(psn: u16, ack_psn: u16, ack_req: bool) -> Neth {
        Neth { dest_ep_id: 1, kind: PacketKind::Am(3), ack_req, ecn: false, psn: Sn16(psn), ack_psn: Sn16(ack_psn) }
    }

    fn drain(ep: &mut RelEp<Vec<u8>>, now: u64) -> Vec<(TxKind, Neth)> {
        let mut out = Vec::new();
        while let Some(t) = ep.poll_transmit(now) {
            out.push((t.kind, Neth::decode(t.bytes).unwrap()));
        }
        out
    }

    #[test]
    fn not_connected_means_no_resource() {
        let mut ep: RelEp<Vec<u8>> = RelEp::new(&cfg(), 0);
        assert_eq!(ep.send(0, PacketKind::Am(0), b"x"), Err(Status::NoResource));
        assert!(!ep.can_send());
        assert_eq!(ep.set_dest_ep_id(EP_NULL_ID), Err(Status::InvalidParam));
        let mut ep = connected(&cfg());
        assert_eq!(ep.send(0, PacketKind::Ctl, b"x"), Err(Status::InvalidParam));
        assert_eq!(ep.send(0, PacketKind::Am(0), &[0; 5000]), Err(Status::InvalidParam));
        assert_eq!(ep.in_flight(), 0, "a refused packet leaves no trace");
        assert_eq!(ep.next_psn(), INITIAL_PSN);
    }

    #[test]
    fn window_grows_with_acks_and_limits_sends() {
        let mut ep = connected(&RelConfig { max_window: 8, ..cfg() });
        assert_eq!(ep.cwnd(), MIN_WINDOW);
        let b = ep.send(0, PacketKind::Am(1), b"hello").unwrap().to_vec();
        let n = Neth::decode(&b).unwrap();
        assert_eq!((n.psn, n.ack_psn, n.dest_ep_id, n.ack_req), (Sn16(1), Sn16(0), 7, true));
        assert_eq!(&b[NETH_LEN..], b"hello");
        assert_eq!(ep.send(0, PacketKind::Am(1), b"x"), Err(Status::NoResource), "cwnd 2: one in flight");
        assert_eq!(ep.on_recv(1, &ack(1, 1, false, false), vec![]), RecvVerdict::Control(vec![]));
        assert!(ep.is_idle());
        assert_eq!(ep.cwnd(), 3);
        // Acks grow the window up to max_window and never beyond.
        let mut next = 2u16;
        for round in 0..20 {
            let mut sent = 0;
            while ep.can_send() {
                ep.send(round, PacketKind::Am(0), b"").unwrap();
                sent += 1;
            }
            assert_eq!(sent, usize::from(ep.cwnd()) - 1);
            assert!(ep.in_flight() < usize::from(ep.cwnd()) && ep.cwnd() <= 8);
            next = next.wrapping_add(sent as u16);
            ep.on_recv(round, &ack(0, next - 1, false, false), vec![]);
        }
        assert_eq!(ep.cwnd(), 8);
        assert_eq!(ep.stats().bad_acks, 0);
    }

    #[test]
    fn bogus_and_stale_acks_are_ignored() {
        let mut ep = connected(&cfg());
        ep.send(0, PacketKind::Am(0), b"").unwrap();
        ep.on_recv(1, &ack(0, 5, false, false), vec![]);
        assert_eq!((ep.acked_psn(), ep.stats().bad_acks, ep.in_flight()), (Sn16(0), 1, 1));
        ep.on_recv(1, &ack(0, 40000, false, false), vec![]);
        assert_eq!(ep.acked_psn(), Sn16(0));
        ep.on_recv(1, &ack(0, 1, false, false), vec![]);
        ep.on_recv(1, &ack(0, 0, false, false), vec![]);
        assert_eq!(ep.acked_psn(), Sn16(1));
    }

    #[test]
    fn receive_verdicts_without_reorder_window() {
        let mut ep = connected(&cfg());
        assert_eq!(ep.on_recv(0, &data(1, 0, false), vec![1]), RecvVerdict::Deliver(vec![1]));
        assert_eq!(ep.pull(), None);
        assert_eq!(ep.on_recv(0, &data(1, 0, false), vec![1]), RecvVerdict::Duplicate(vec![1]));
        assert_eq!(drain(&mut ep, 0), [(TxKind::Ack, ack(1, 1, false, false).with_dest(7))]);
        assert_eq!(ep.on_recv(0, &data(3, 0, false), vec![3]), RecvVerdict::Gap(Some(vec![3])));
        let out = drain(&mut ep, 0);
        assert_eq!(out, [(TxKind::Ack, ack(1, 1, true, false).with_dest(7))], "NAK names the head");
        // A second gap at the same head within a tick does not NAK again.
        ep.on_recv(1, &data(4, 0, false), vec![4]);
        assert!(drain(&mut ep, 1).is_empty());
        ep.on_recv(MS * 20, &data(4, 0, false), vec![4]);
        assert_eq!(drain(&mut ep, MS * 20).len(), 1);
        assert_eq!(ep.on_recv(0, &data(2, 0, true), vec![2]), RecvVerdict::Deliver(vec![2]));
        assert_eq!(drain(&mut ep, 0), [(TxKind::Ack, ack(1, 2, false, false).with_dest(7))]);
        assert_eq!(ep.stats().delivered, 2);
    }

    #[test]
    fn receive_window_holds_and_releases_in_order() {
        let mut ep = connected(&RelConfig { rx_window: 16, ..cfg() });
        assert_eq!(ep.on_recv(0, &data(3, 0, false), vec![3]), RecvVerdict::Gap(None));
        assert_eq!(ep.on_recv(0, &data(2, 0, false), vec![2]), RecvVerdict::Gap(None));
        assert_eq!(ep.rx_held(), 2);
        assert_eq!(ep.on_recv(0, &data(1, 0, false), vec![1]), RecvVerdict::Deliver(vec![1]));
        assert_eq!(ep.pull(), Some((PacketKind::Am(3), vec![2])));
        assert_eq!(ep.pull(), Some((PacketKind::Am(3), vec![3])));
        assert_eq!(ep.pull(), None);
        assert_eq!(ep.rx_head(), Sn16(3));
        ep.on_recv(0, &data(9, 0, false), vec![9]);
        let mut purged = Vec::new();
        ep.purge(|d| purged.push(d));
        assert_eq!(purged, [vec![9]]);
    }

    #[test]
    fn piggybacked_ack_cancels_pure_ack() {
        let mut ep = connected(&RelConfig { ack_delay: 5 * MS, ..cfg() });
        ep.on_recv(0, &data(1, 0, true), vec![]);
        assert!(!ep.has_transmit(0));
        assert_eq!(ep.poll_timeout(), Some(5 * MS));
        let b = ep.send(MS, PacketKind::Am(0), b"").unwrap();
        assert_eq!(Neth::decode(b).unwrap().ack_psn, Sn16(1));
        assert!(!ep.has_transmit(10 * MS), "the data packet carried the ack");
    }

    #[test]
    fn timer_probes_then_resends_with_backoff() {
        let c = RelConfig { max_window: 16, ..cfg() };
        let mut ep = connected(&c);
        ep.send(0, PacketKind::Am(0), b"a").unwrap();
        assert_eq!(ep.poll_timeout(), Some(c.timer_tick));
        ep.handle_timeout(c.timer_tick - 1).unwrap();
        assert!(!ep.has_transmit(c.timer_tick - 1));
        // First expiry: probe.
        let t1 = c.timer_tick;
        ep.handle_timeout(t1).unwrap();
        let out = drain(&mut ep, t1);
        assert_eq!(out.len(), 1);
        assert!(out[0].1.ack_req && out[0].0 == TxKind::Ack);
        // Second expiry: resend, window cut, timeout doubled.
        let t2 = t1 + c.timer_tick;
        assert_eq!(ep.poll_timeout(), Some(t2));
        ep.handle_timeout(t2).unwrap();
        let out = drain(&mut ep, t2);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0, out[0].1.psn, out[0].1.ack_req), (TxKind::Resend, Sn16(1), true));
        assert_eq!(ep.poll_timeout(), Some(t2 + 2 * c.timer_tick));
        let t3 = t2 + 2 * c.timer_tick;
        ep.handle_timeout(t3).unwrap();
        assert_eq!(drain(&mut ep, t3).len(), 1);
        assert_eq!(ep.poll_timeout(), Some(t3 + 4 * c.timer_tick));
        assert_eq!((ep.stats().probes, ep.stats().timeouts, ep.stats().resent), (1, 2, 2));
        // An ack resets the timeout to one tick.
        ep.on_recv(t3 + 1, &ack(0, 1, false, false), vec![]);
        ep.send(t3 + 1, PacketKind::Am(0), b"b").unwrap();
        assert_eq!(ep.poll_timeout(), Some(t3 + 1 + c.timer_tick));
    }

    #[test]
    fn nak_resends_from_the_gap_once() {
        let mut ep = connected(&RelConfig { max_window: 64, ..cfg() });
        // Open the window to 10.
        for i in 0..8u16 {
            ep.send(0, PacketKind::Am(0), b"").unwrap();
            ep.on_recv(0, &ack(0, i + 1, false, false), vec![]);
        }
        assert_eq!(ep.cwnd(), 10);
        for _ in 0..6 {
            ep.send(1, PacketKind::Am(0), b"").unwrap();
        }
        // psn 9..=14 outstanding; the peer has 9 and 10, then saw a gap.
        ep.on_recv(2, &ack(0, 10, true, false), vec![]);
        assert_eq!(ep.cwnd(), 5, "11 + 1 then halved");
        let out = drain(&mut ep, 2);
        let psns: Vec<u16> = out.iter().map(|(_, n)| n.psn.0).collect();
        assert_eq!(psns, [11, 12, 13, 14], "everything outstanding fits the cut window");
        assert!(out[0].1.ack_req && out[3].1.ack_req);
        // A stale NAK during or right after the resend does not cut the window again.
        ep.on_recv(3, &ack(0, 10, true, false), vec![]);
        assert_eq!(ep.cwnd(), 5);
        assert_eq!(ep.stats().naks_acted, 2);
    }

    #[test]
    fn resend_stops_at_the_window_and_continues_on_ack() {
        let mut ep = connected(&RelConfig { max_window: 64, ..cfg() });
        for i in 0..8u16 {
            ep.send(0, PacketKind::Am(0), b"").unwrap();
            ep.on_recv(0, &ack(0, i + 1, false, false), vec![]);
        }
        for _ in 0..9 {
            ep.send(1, PacketKind::Am(0), b"").unwrap();
        }
        // Timer path: probe, then resend with cwnd 10 -> 5: four packets fit.
        ep.handle_timeout(MS * 10 + 1).unwrap();
        drain(&mut ep, MS * 10 + 1);
        ep.handle_timeout(MS * 20 + 2).unwrap();
        let psns: Vec<u16> = drain(&mut ep, MS * 20 + 2).iter().map(|(_, n)| n.psn.0).collect();
        assert_eq!(psns, [9, 10, 11, 12]);
        ep.on_recv(MS * 21, &ack(0, 10, false, false), vec![]);
        let psns: Vec<u16> = drain(&mut ep, MS * 21).iter().map(|(_, n)| n.psn.0).collect();
        assert_eq!(psns, [13, 14, 15], "cwnd 6 after the ack: up to psn 15");
    }

    #[test]
    fn peer_timeout_fires_only_without_progress() {
        let c = RelConfig { peer_timeout: 1000 * MS, ..cfg() };
        let mut ep = connected(&c);
        let mut now = 0;
        ep.send(now, PacketKind::Am(0), b"").unwrap();
        // A lossy but live peer: acks keep coming, no timeout.
        for i in 1..50u16 {
            now += 300 * MS;
            ep.handle_timeout(now).unwrap();
            ep.on_recv(now, &ack(0, i, false, false), vec![]);
            ep.send(now, PacketKind::Am(0), b"").unwrap();
        }
        // Silence: probes and resends with backoff, then failure exactly at the deadline.
        let start = now;
        let mut sent_after = 0;
        loop {
            let t = ep.poll_timeout().unwrap();
            assert!(t > now);
            now = t;
            match ep.handle_timeout(now) {
                Ok(()) => sent_after += drain(&mut ep, now).len(),
                Err(s) => {
                    assert_eq!(s, Status::EndpointTimeout);
                    break;
                }
            }
        }
        assert_eq!(now - start, c.peer_timeout);
        assert!(sent_after >= 3, "at least three resends before giving up");
        assert_eq!(ep.status(), Err(Status::EndpointTimeout));
        assert_eq!(ep.send(now, PacketKind::Am(0), b""), Err(Status::EndpointTimeout));
        assert_eq!(ep.poll_timeout(), None);
        assert!(matches!(ep.on_recv(now, &data(1, 0, false), vec![]), RecvVerdict::Failed(_)));
        assert!(ep.is_idle());
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut a = connected(&RelConfig { max_window: 32, ..cfg() });
        let mut b = connected(&cfg());
        let mut expected = 0u32;
        for i in 0..70_000u32 {
            let pkt = a.send(u64::from(i), PacketKind::Am(2), &i.to_le_bytes()).unwrap().to_vec();
            let n = Neth::decode(&pkt).unwrap();
            match b.on_recv(u64::from(i), &n, pkt) {
                RecvVerdict::Deliver(p) => {
                    assert_eq!(p[NETH_LEN..], expected.to_le_bytes());
                    expected += 1;
                }
                v => panic!("unexpected {v:?}"),
            }
            // Acknowledge every packet right away.
            let head = b.rx_head();
            a.on_recv(u64::from(i), &ack(0, head.0, false, false), vec![]);
        }
        assert_eq!(expected, 70_000);
        assert_eq!(a.next_psn(), Sn16((70_001u32 % 65_536) as u16));
        assert!(a.is_idle());
    }

    impl Neth {
        fn with_dest(mut self, d: u32) -> Neth {
            self.dest_ep_id = d;
            self
        }
    }
}
