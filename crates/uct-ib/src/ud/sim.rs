//! Deterministic network simulator for the reliability tests: interfaces exchange datagrams
//! through a virtual network with a fixed latency and a [`LossHook`], on virtual time.
//!
//! Nothing here reads a clock or sleeps: time jumps to the next datagram arrival or timer.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ucs::Status;

use super::config::{RelConfig, MIN_WINDOW};
use super::conn::{IfaceEvent, RxOutcome, UdIface};
use super::loss::{Fate, LossConfig, LossHook};
use super::wire::{DevAddr, PacketKind, PeerAddr, NETH_LEN};

pub(crate) const US: u64 = 1_000;
pub(crate) const MS: u64 = 1_000_000;
pub(crate) const SEC: u64 = 1_000_000_000;

/// One-way latency of the virtual network.
pub(crate) const LATENCY: u64 = 2 * US;
/// Largest extra delay of a reordered datagram.
pub(crate) const REORDER_DELAY: u64 = 20 * US;

pub(crate) fn addr(node: usize) -> PeerAddr {
    PeerAddr { dev_addr: DevAddr::new(&[0xfe, 0x80, node as u8, 1]).unwrap(), qp_num: 100 + node as u32 }
}

/// The payload of message `seq`: the number, then `seq % 24` filler bytes derived from it.
pub(crate) fn payload(seq: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend((0..seq % 24).map(|i| (seq as u8).wrapping_add(i as u8)));
}

fn parse_payload(p: &[u8]) -> u64 {
    assert!(p.len() >= 8, "short payload {p:?}");
    let seq = u64::from_le_bytes(p[..8].try_into().unwrap());
    let mut want = Vec::new();
    payload(seq, &mut want);
    assert_eq!(p, want.as_slice(), "payload of message {seq} corrupted");
    seq
}

/// A one-way message stream: `total` messages from endpoint `ep` of node `node`.
#[derive(Clone, Debug)]
pub(crate) struct Stream {
    pub node: usize,
    pub ep: u32,
    pub total: u64,
    pub next: u64,
}

impl Stream {
    pub fn new(node: usize, ep: u32, total: u64) -> Self {
        Stream { node, ep, total, next: 0 }
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NetStats {
    pub datagrams: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

/// A datagram on the wire: arrival time, send order (tie-break), destination node, bytes.
type InFlight = Reverse<(u64, u64, usize, Vec<u8>)>;

pub(crate) struct Sim {
    pub now: u64,
    pub ifaces: Vec<UdIface<Vec<u8>>>,
    /// A node that is down neither sends nor receives nor runs timers.
    pub up: Vec<bool>,
    net: BinaryHeap<InFlight>,
    seq: u64,
    pub hook: LossHook,
    /// Next expected message per receiving (node, ep).
    pub expected: HashMap<(usize, u32), u64>,
    pub events: Vec<(usize, u64, IfaceEvent)>,
    pub net_stats: NetStats,
    /// Largest congestion window seen per node.
    pub max_cwnd: Vec<u16>,
    steps: u64,
}

impl Sim {
    pub fn new(nodes: usize, cfg: &RelConfig, loss: LossConfig) -> Self {
        Sim {
            now: 0,
            ifaces: (0..nodes).map(|i| UdIface::new(addr(i), cfg.clone()).unwrap()).collect(),
            up: vec![true; nodes],
            net: BinaryHeap::new(),
            seq: 0,
            hook: LossHook::new(loss),
            expected: HashMap::new(),
            events: Vec::new(),
            net_stats: NetStats::default(),
            max_cwnd: vec![0; nodes],
            steps: 0,
        }
    }

    fn node_of(peer: &PeerAddr) -> usize {
        (peer.qp_num - 100) as usize
    }

    fn net_send(&mut self, src: usize, dst: usize, bytes: Vec<u8>) {
        self.net_stats.datagrams += 1;
        if !self.up[src] || !self.up[dst] {
            self.net_stats.dropped += 1;
            return;
        }
        let at = self.now + LATENCY;
        match self.hook.fate() {
            Fate::Drop => self.net_stats.dropped += 1,
            Fate::Deliver => self.push(at, dst, bytes),
            Fate::Duplicate => {
                self.net_stats.duplicated += 1;
                self.push(at, dst, bytes.clone());
                let later = at + 1 + self.hook.rng().below(REORDER_DELAY);
                self.push(later, dst, bytes);
            }
            Fate::Reorder => {
                self.net_stats.reordered += 1;
                let later = at + 1 + self.hook.rng().below(REORDER_DELAY);
                self.push(later, dst, bytes);
            }
        }
    }

    fn push(&mut self, at: u64, dst: usize, bytes: Vec<u8>) {
        self.seq += 1;
        self.net.push(Reverse((at, self.seq, dst, bytes)));
    }

    /// Sends whatever the applications can, then every datagram the interfaces want out.
    fn transmit(&mut self, streams: &mut [Stream]) {
        for s in streams.iter_mut() {
            if !self.up[s.node] {
                continue;
            }
            while s.next < s.total && self.ifaces[s.node].can_send(s.ep) {
                let seq = s.next;
                let t = self.ifaces[s.node]
                    .send_with(self.now, s.ep, PacketKind::Am((seq % 32) as u8), |b| payload(seq, b))
                    .unwrap();
                let (dst, bytes) = (Self::node_of(t.peer), t.bytes.to_vec());
                self.net_send(s.node, dst, bytes);
                s.next += 1;
            }
        }
        for node in 0..self.ifaces.len() {
            if !self.up[node] {
                continue;
            }
            while let Some(t) = self.ifaces[node].poll_transmit(self.now) {
                let (dst, bytes) = (Self::node_of(t.peer), t.bytes.to_vec());
                self.net_send(node, dst, bytes);
            }
        }
    }

    fn record(&mut self, node: usize, ep: u32, kind: PacketKind, desc: &[u8]) {
        let seq = parse_payload(&desc[NETH_LEN..]);
        assert_eq!(kind, PacketKind::Am((seq % 32) as u8), "message {seq} arrived with the wrong AM id");
        let next = self.expected.entry((node, ep)).or_insert(0);
        assert_eq!(seq, *next, "node {node} ep {ep}: message {seq} delivered, expected {next}");
        *next += 1;
    }

    fn receive(&mut self) {
        while let Some(Reverse((at, _, _, _))) = self.net.peek() {
            if *at > self.now {
                break;
            }
            let Some(Reverse((_, _, dst, bytes))) = self.net.pop() else { break };
            if !self.up[dst] {
                continue;
            }
            let outcome = self.ifaces[dst].on_packet(self.now, bytes);
            if let RxOutcome::Deliver { ep, kind, desc } = &outcome {
                self.record(dst, *ep, *kind, desc);
            }
            if let Some(ep) = outcome.ep() {
                while let Some((kind, desc)) = self.ifaces[dst].pull(ep) {
                    if kind != PacketKind::Ctl {
                        self.record(dst, ep, kind, &desc);
                    }
                }
            }
        }
    }

    fn check_windows(&mut self) {
        for (node, iface) in self.ifaces.iter().enumerate() {
            let max = iface.config().max_window;
            for id in iface.ep_ids() {
                let ep = iface.ep(id).unwrap();
                assert!((MIN_WINDOW..=max).contains(&ep.cwnd()), "cwnd {} out of bounds", ep.cwnd());
                assert!(ep.in_flight() < usize::from(max), "{} in flight with max window {max}", ep.in_flight());
                self.max_cwnd[node] = self.max_cwnd[node].max(ep.cwnd());
            }
        }
    }

    fn collect_events(&mut self) {
        for (node, iface) in self.ifaces.iter_mut().enumerate() {
            while let Some(e) = iface.poll_event() {
                self.events.push((node, self.now, e));
            }
        }
    }

    /// The next datagram arrival or timer.
    fn next_time(&self) -> Option<u64> {
        let timers = (0..self.ifaces.len()).filter(|&i| self.up[i]).filter_map(|i| self.ifaces[i].poll_timeout()).min();
        let arrival = self.net.peek().map(|Reverse((at, ..))| *at);
        [timers, arrival].into_iter().flatten().min()
    }

    /// Processes everything that happens up to time `t`, then moves the clock to `t`.
    pub fn advance_to(&mut self, t: u64) {
        loop {
            self.transmit(&mut []);
            match self.next_time() {
                Some(next) if next <= t => {
                    self.step(&mut []);
                }
                _ => break,
            }
        }
        self.now = self.now.max(t);
    }

    /// One round: transmit, then advance time to the next arrival or timer and process it.
    /// Returns false when nothing is left to happen.
    pub fn step(&mut self, streams: &mut [Stream]) -> bool {
        self.steps += 1;
        assert!(self.steps < 20_000_000, "simulation does not converge");
        self.transmit(streams);
        self.collect_events();
        self.check_windows();
        let Some(next) = self.next_time() else { return false };
        self.now = self.now.max(next);
        self.receive();
        for i in 0..self.ifaces.len() {
            if self.up[i] {
                self.ifaces[i].handle_timeout(self.now);
            }
        }
        self.collect_events();
        true
    }

    /// Steps until `done` holds, failing past `deadline` (virtual).
    pub fn run_until(&mut self, streams: &mut [Stream], deadline: u64, mut done: impl FnMut(&Sim) -> bool) {
        while !done(self) {
            assert!(self.now <= deadline, "not done by {} ms of virtual time", deadline / MS);
            if !self.step(streams) {
                assert!(done(self), "nothing left to happen and not done");
                return;
            }
        }
        self.transmit(streams);
    }

    /// Steps until every stream is sent, delivered and acknowledged.
    pub fn run_streams(&mut self, streams: &mut [Stream], deadline: u64) {
        while !self.streams_done(streams) {
            assert!(self.now <= deadline, "not done by {} ms of virtual time", deadline / MS);
            if !self.step(streams) {
                for (n, iface) in self.ifaces.iter().enumerate() {
                    for id in iface.ep_ids() {
                        eprintln!("node {n} ep {id}: {:#?}", iface.ep(id).unwrap());
                    }
                }
                eprintln!("streams {streams:?} delivered {:?}", self.expected);
                panic!("nothing left to happen and not done");
            }
        }
    }

    pub fn delivered(&self, node: usize, ep: u32) -> u64 {
        self.expected.get(&(node, ep)).copied().unwrap_or(0)
    }

    /// The peer endpoint of (node, ep) on the other node of a two-node simulation.
    pub fn dest(&self, node: usize, ep: u32) -> Option<u32> {
        self.ifaces[node].ep(ep)?.dest_ep_id()
    }

    /// Every stream fully sent, delivered and acknowledged.
    pub fn streams_done(&self, streams: &[Stream]) -> bool {
        streams.iter().all(|s| {
            let iface = &self.ifaces[s.node];
            let Some(ep) = iface.ep(s.ep) else { return false };
            let Some(dest) = ep.dest_ep_id() else { return false };
            let peer = Self::node_of(iface.ep_peer(s.ep).unwrap());
            s.next == s.total && ep.is_idle() && self.delivered(peer, dest) == s.total
        })
    }

    pub fn failures(&self) -> Vec<(usize, u64, u32, Status)> {
        self.events
            .iter()
            .filter_map(|&(n, t, e)| match e {
                IfaceEvent::Failed { ep, status } => Some((n, t, ep, status)),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ud::rel::INITIAL_PSN;
    use crate::ud::wire::EP_NULL_ID;

    fn pct(p: u32) -> u32 {
        p * 10_000
    }

    /// Both sides connect at time 0 (a simultaneous connect); returns their endpoint ids.
    fn connect_both(sim: &mut Sim) -> (u32, u32) {
        let a = sim.ifaces[0].connect_to_iface(0, addr(1), 0).unwrap();
        let b = sim.ifaces[1].connect_to_iface(0, addr(0), 0).unwrap();
        (a, b)
    }

    /// Node 0 connects; node 1 claims the endpoint the CREQ created once it exists.
    fn connect_accept(sim: &mut Sim) -> (u32, u32) {
        let a = sim.ifaces[0].connect_to_iface(0, addr(1), 0).unwrap();
        sim.run_until(&mut [], 10 * SEC, |s| {
            s.events.iter().any(|(n, _, e)| *n == 1 && matches!(e, IfaceEvent::Accepted { .. }))
        });
        let accepted = sim
            .events
            .iter()
            .find_map(|(n, _, e)| match e {
                IfaceEvent::Accepted { ep, conn_sn: 0, .. } if *n == 1 => Some(*ep),
                _ => None,
            })
            .unwrap();
        assert_eq!(sim.ifaces[1].is_private(accepted), Some(true));
        let b = sim.ifaces[1].connect_to_iface(sim.now, addr(0), 0).unwrap();
        assert_eq!(b, accepted, "the local connect claims the accepted endpoint");
        assert_eq!(sim.ifaces[1].is_private(b), Some(false));
        (a, b)
    }

    fn assert_single_pair(sim: &Sim, a: u32, b: u32) {
        assert_eq!(sim.ifaces[0].num_eps(), 1, "node 0 endpoints");
        assert_eq!(sim.ifaces[1].num_eps(), 1, "node 1 endpoints");
        assert_eq!(sim.dest(0, a), Some(b));
        assert_eq!(sim.dest(1, b), Some(a));
    }

    /// Bidirectional transfer of `n` messages each way; returns the simulation for more checks.
    fn exchange(cfg: &RelConfig, loss: LossConfig, n: u64, simultaneous: bool) -> Sim {
        let mut sim = Sim::new(2, cfg, loss);
        let (a, b) = if simultaneous { connect_both(&mut sim) } else { connect_accept(&mut sim) };
        let mut streams = [Stream::new(0, a, n), Stream::new(1, b, n)];
        sim.run_streams(&mut streams, 3600 * SEC);
        assert_single_pair(&sim, a, b);
        assert_eq!(sim.delivered(1, b), n);
        assert_eq!(sim.delivered(0, a), n);
        assert!(sim.failures().is_empty(), "lossy is not dead: {:?}", sim.failures());
        for (node, ep) in [(0, a), (1, b)] {
            let iface = &sim.ifaces[node];
            assert!(iface.ep(ep).unwrap().is_idle());
            assert_eq!(iface.ep(ep).unwrap().rx_held(), 0);
            assert_eq!(iface.stats().rx_invalid, 0);
        }
        sim
    }

    /// Longest acknowledgement wait of any endpoint: how close the run came to a peer timeout.
    fn max_ack_wait(sim: &Sim) -> u64 {
        (0..2)
            .flat_map(|n| sim.ifaces[n].ep_ids().map(move |e| (n, e)))
            .map(|(n, e)| sim.ifaces[n].ep(e).unwrap().stats().max_ack_wait)
            .max()
            .unwrap_or(0)
    }

    fn resent(sim: &Sim) -> u64 {
        (0..2)
            .flat_map(|n| sim.ifaces[n].ep_ids().map(move |e| (n, e)))
            .map(|(n, e)| sim.ifaces[n].ep(e).unwrap().stats().resent)
            .sum()
    }

    #[test]
    fn lossless_exchange_needs_no_resend() {
        let sim = exchange(&RelConfig::default(), LossConfig::default(), 5_000, true);
        assert_eq!(resent(&sim), 0);
        assert_eq!(sim.net_stats.dropped, 0);
        assert!(sim.max_cwnd[0] > 64, "the window opened up to {}", sim.max_cwnd[0]);
    }

    #[test]
    fn one_percent_loss() {
        let sim = exchange(
            &RelConfig::default(),
            LossConfig { drop_ppm: pct(1), seed: 1, ..Default::default() },
            5_000,
            false,
        );
        assert!(sim.net_stats.dropped > 50 && resent(&sim) > 0);
    }

    #[test]
    fn ten_percent_loss() {
        let sim = exchange(
            &RelConfig::default(),
            LossConfig { drop_ppm: pct(10), seed: 2, ..Default::default() },
            3_000,
            true,
        );
        assert!(sim.net_stats.dropped > 300 && resent(&sim) > 0);
    }

    #[test]
    fn thirty_percent_loss() {
        let cfg = RelConfig::default();
        let mut worst = 0;
        for seed in 0..10 {
            let loss = LossConfig { drop_ppm: pct(30), seed, ..Default::default() };
            let sim = exchange(&cfg, loss, 2_000, seed % 2 == 0);
            assert!(sim.net_stats.dropped > 1_000 && resent(&sim) > 0);
            worst = worst.max(max_ack_wait(&sim));
        }
        // Stalls happen (runs of a dozen lost round trips), but each is resolved well before
        // UCX_UD_TIMEOUT; the longest over these seeds is 9.3 s.
        assert!(worst < cfg.peer_timeout / 2, "longest ack wait {} ms", worst / MS);
        assert!(worst > 100 * MS, "the loss did stall the endpoints");
    }

    #[test]
    fn loss_duplication_and_reordering() {
        let loss = LossConfig { drop_ppm: pct(10), dup_ppm: pct(5), reorder_ppm: pct(10), seed: 4 };
        let sim = exchange(&RelConfig::default(), loss, 3_000, true);
        assert!(sim.net_stats.duplicated > 100 && sim.net_stats.reordered > 100);
        let dups: u64 = [0, 1].iter().map(|&n| sim.ifaces[n].ep(0).unwrap().stats().duplicates).sum();
        assert!(dups > 0);
    }

    #[test]
    fn reorder_window_holds_early_packets() {
        let cfg = RelConfig { rx_window: 128, ..RelConfig::default() };
        let loss = LossConfig { drop_ppm: pct(5), dup_ppm: pct(2), reorder_ppm: pct(20), seed: 5 };
        let sim = exchange(&cfg, loss, 3_000, false);
        let ooo: u64 = [0, 1].iter().map(|&n| sim.ifaces[n].ep(0).unwrap().stats().out_of_order).sum();
        assert!(ooo > 0);
    }

    #[test]
    fn small_window_stays_in_bounds() {
        // check_windows asserts the bounds at every step; a small ceiling is hit constantly.
        let cfg = RelConfig { max_window: 4, ..RelConfig::default() };
        let sim = exchange(
            &cfg,
            LossConfig { drop_ppm: pct(5), reorder_ppm: pct(5), seed: 6, ..Default::default() },
            2_000,
            true,
        );
        assert_eq!(sim.max_cwnd[0], 4);
    }

    #[test]
    fn sequence_numbers_wrap_under_loss() {
        let n = 70_000;
        let mut sim = Sim::new(
            2,
            &RelConfig::default(),
            LossConfig { drop_ppm: pct(1), reorder_ppm: pct(1), seed: 7, ..Default::default() },
        );
        let (a, b) = connect_both(&mut sim);
        let mut streams = [Stream::new(0, a, n)];
        sim.run_streams(&mut streams, 3600 * SEC);
        assert_eq!(sim.delivered(1, b), n);
        let ep = sim.ifaces[0].ep(a).unwrap();
        // CREQ + 70000 messages: the 16-bit sequence wrapped once.
        assert_eq!(ep.next_psn().0, ((u64::from(INITIAL_PSN.0) + 1 + n) % 65_536) as u16);
        assert!(ep.stats().sent >= n && sim.failures().is_empty());
    }

    #[test]
    fn silent_peer_times_out() {
        let cfg = RelConfig::default();
        let mut sim = Sim::new(2, &cfg, LossConfig { drop_ppm: pct(10), seed: 8, ..Default::default() });
        let (a, b) = connect_both(&mut sim);
        let mut streams = [Stream::new(0, a, 200), Stream::new(1, b, 200)];
        sim.run_streams(&mut streams, 3600 * SEC);
        // Node 1 vanishes; node 0 keeps sending.
        sim.up[1] = false;
        let down = sim.now;
        let mut more = [Stream::new(0, a, 10)];
        sim.run_until(&mut more, down + 2 * cfg.peer_timeout, |s| !s.failures().is_empty());
        let failures = sim.failures();
        assert_eq!(failures.len(), 1);
        let (node, at, ep, status) = failures[0];
        assert_eq!((node, ep, status), (0, a, Status::EndpointTimeout));
        // The timeout counts from the first unacknowledged send after the peer went away.
        assert_eq!(at - down, cfg.peer_timeout, "fired {} ms after the peer vanished", (at - down) / MS);
        assert!(matches!(sim.ifaces[0].send(at, a, PacketKind::Am(0), b""), Err(Status::EndpointTimeout)));
        assert!(sim.ifaces[0].destroy_ep(a, drop));
        assert_eq!(sim.ifaces[0].num_eps(), 0);
    }

    #[test]
    fn connecting_to_a_dead_interface_times_out() {
        let cfg = RelConfig::default();
        let mut sim = Sim::new(2, &cfg, LossConfig::default());
        sim.up[1] = false;
        let a = sim.ifaces[0].connect_to_iface(0, addr(1), 0).unwrap();
        sim.run_until(&mut [], 2 * cfg.peer_timeout, |s| !s.failures().is_empty());
        assert_eq!(sim.failures(), [(0, cfg.peer_timeout, a, Status::EndpointTimeout)]);
        let ep = sim.ifaces[0].ep(a).unwrap();
        // One CREQ, then resends with backoff: 10 ms doubling to the 1 s ceiling, then 1/s.
        assert!((30..=40).contains(&ep.stats().resent), "{} CREQ resends", ep.stats().resent);
        assert_eq!(ep.dest_ep_id(), None);
    }

    #[test]
    fn flush_gets_acknowledged_without_waiting_for_the_timer() {
        let mut sim = Sim::new(2, &RelConfig::default(), LossConfig::default());
        let (a, _) = connect_both(&mut sim);
        let mut warm = [Stream::new(0, a, 2_000)];
        sim.run_streams(&mut warm, 10 * SEC);
        // A few messages into a wide-open window ask for no acknowledgement on their own.
        let mut tail = [Stream { next: 2_000, ..Stream::new(0, a, 2_003) }];
        sim.transmit(&mut tail);
        assert!(!sim.ifaces[0].ep(a).unwrap().is_idle());
        let start = sim.now;
        sim.ifaces[0].request_ack(start, a);
        sim.run_streams(&mut tail, 10 * SEC);
        assert!(sim.now - start < 100 * US, "acknowledged after {} us", (sim.now - start) / US);
        assert_eq!(sim.ifaces[0].ep(a).unwrap().stats().probes, 0, "no timer fired");
    }

    #[test]
    fn idle_endpoints_never_time_out() {
        let mut sim = Sim::new(2, &RelConfig::default(), LossConfig::default());
        let (a, b) = connect_both(&mut sim);
        let mut streams = [Stream::new(0, a, 10), Stream::new(1, b, 10)];
        sim.run_streams(&mut streams, 10 * SEC);
        sim.up[1] = false;
        let quiet = sim.now;
        // Nothing outstanding: once the last datagrams land there is no timer at all, so the
        // simulation simply stops.
        let mut steps = 0;
        while sim.step(&mut streams) {
            steps += 1;
            assert!(steps < 100);
        }
        assert!(sim.now - quiet < MS, "no timer ran");
        assert!(sim.failures().is_empty());
    }

    #[test]
    fn simultaneous_connect_under_loss_pairs_once() {
        for seed in 0..40 {
            let loss = LossConfig { drop_ppm: pct(30), dup_ppm: pct(10), reorder_ppm: pct(20), seed };
            let mut sim = Sim::new(2, &RelConfig::default(), loss);
            let (a, b) = connect_both(&mut sim);
            let mut streams = [Stream::new(0, a, 50), Stream::new(1, b, 50)];
            sim.run_streams(&mut streams, 3600 * SEC);
            assert_single_pair(&sim, a, b);
            assert_eq!((sim.delivered(0, a), sim.delivered(1, b)), (50, 50), "seed {seed}");
            assert!(sim.failures().is_empty(), "seed {seed}");
            assert_eq!((sim.ifaces[0].stats().passive_eps, sim.ifaces[1].stats().passive_eps), (0, 0));
        }
    }

    #[test]
    fn staggered_connect_under_loss_pairs_once() {
        // Node 1 connects at a different moment in each run: before, during or after node 0's
        // handshake, so every race between CREQ, CREP and the local connect is visited.
        for seed in 0..40u64 {
            let loss = LossConfig { drop_ppm: pct(20), dup_ppm: pct(10), reorder_ppm: pct(10), seed };
            let mut sim = Sim::new(2, &RelConfig::default(), loss);
            let a = sim.ifaces[0].connect_to_iface(0, addr(1), 0).unwrap();
            sim.advance_to(seed * US);
            let b = sim.ifaces[1].connect_to_iface(sim.now, addr(0), 0).unwrap();
            let mut streams = [Stream::new(0, a, 30), Stream::new(1, b, 30)];
            sim.run_streams(&mut streams, 3600 * SEC);
            assert_single_pair(&sim, a, b);
            assert!(sim.failures().is_empty(), "seed {seed}");
        }
    }

    #[test]
    fn duplicated_creqs_create_one_endpoint() {
        let mut sim =
            Sim::new(2, &RelConfig::default(), LossConfig { dup_ppm: pct(60), seed: 9, ..Default::default() });
        let (a, b) = connect_accept(&mut sim);
        // Replay the CREQ by hand as well, long after the handshake.
        let mut creq = Vec::new();
        {
            let mut fresh: UdIface<Vec<u8>> = UdIface::new(addr(0), RelConfig::default()).unwrap();
            let id = fresh.connect_to_iface(0, addr(1), 0).unwrap();
            assert_eq!(id, a);
            creq.extend_from_slice(fresh.poll_transmit(0).unwrap().bytes);
        }
        let mut streams = [Stream::new(0, a, 100), Stream::new(1, b, 100)];
        sim.run_streams(&mut streams, 3600 * SEC);
        let out = sim.ifaces[1].on_packet(sim.now, creq.clone());
        assert!(matches!(out, RxOutcome::Release { ep: Some(e), .. } if e == b), "{out:?}");
        assert_single_pair(&sim, a, b);
        assert_eq!(sim.ifaces[1].stats().passive_eps, 1);
        assert!(sim.net_stats.duplicated > 0);
        // The same CREQ from a different requester endpoint id is rejected, not paired.
        creq[NETH_LEN + 7] = 5;
        let out = sim.ifaces[1].on_packet(sim.now, creq);
        assert!(matches!(out, RxOutcome::Release { reason: crate::ud::conn::ReleaseReason::Rejected, .. }));
        assert_eq!(sim.ifaces[1].num_eps(), 1);
    }

    #[test]
    fn several_connections_pair_in_order() {
        let loss = LossConfig { drop_ppm: pct(10), dup_ppm: pct(5), reorder_ppm: pct(10), seed: 10 };
        let mut sim = Sim::new(2, &RelConfig::default(), loss);
        let a: Vec<u32> = (0..3).map(|_| sim.ifaces[0].connect_to_iface(0, addr(1), 0).unwrap()).collect();
        let b: Vec<u32> = (0..3).map(|_| sim.ifaces[1].connect_to_iface(0, addr(0), 0).unwrap()).collect();
        let mut streams: Vec<Stream> =
            a.iter().map(|&e| Stream::new(0, e, 40)).chain(b.iter().map(|&e| Stream::new(1, e, 40))).collect();
        sim.run_streams(&mut streams, 3600 * SEC);
        for i in 0..3 {
            assert_eq!(sim.dest(0, a[i]), Some(b[i]), "connection {i}");
            assert_eq!(sim.dest(1, b[i]), Some(a[i]), "connection {i}");
        }
        assert_eq!((sim.ifaces[0].num_eps(), sim.ifaces[1].num_eps()), (3, 3));
    }

    #[test]
    fn garbage_is_released_not_fatal() {
        let mut sim = Sim::new(2, &RelConfig::default(), LossConfig::default());
        let (a, b) = connect_both(&mut sim);
        let mut streams = [Stream::new(0, a, 5), Stream::new(1, b, 5)];
        sim.run_streams(&mut streams, 10 * SEC);
        let iface = &mut sim.ifaces[1];
        let mut rng = crate::ud::loss::XorShift64::new(11);
        for len in 0..2_000usize {
            let mut bytes: Vec<u8> = (0..len % 40).map(|_| rng.next_u64() as u8).collect();
            // Aim half of them at the live endpoint so they get past routing.
            if bytes.len() >= 4 && len % 2 == 0 {
                bytes[..3].copy_from_slice(&b.to_le_bytes()[..3]);
            }
            let _ = iface.on_packet(sim.now, bytes);
            while iface.pull(b).is_some() {}
            while iface.poll_transmit(sim.now).is_some() {}
        }
        assert!(iface.stats().rx_invalid > 0);
        let unknown = vec![0u8; 8];
        let mut ack = unknown.clone();
        ack[..4].copy_from_slice(&0x00ab_cdefu32.to_le_bytes());
        assert!(matches!(
            iface.on_packet(sim.now, ack),
            RxOutcome::Release { reason: crate::ud::conn::ReleaseReason::UnknownEp, .. }
        ));
        let mut creq_to_ep = unknown;
        creq_to_ep[..4].copy_from_slice(&EP_NULL_ID.to_le_bytes());
        assert!(matches!(iface.on_packet(sim.now, creq_to_ep), RxOutcome::Release { ep: None, .. }));
    }
}
