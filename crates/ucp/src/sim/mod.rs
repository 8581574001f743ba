//! Engines in memory, on virtual time: the driver's loop of [`crate::core::Core`] again, with
//! lanes that are queues of a simulated network instead of transports. Nothing here reads a
//! clock or sleeps: time jumps to the next event (an arrival, a zero-copy operation's
//! completion).
//!
//! The network of a [`Sim`]:
//! * every directed pair of nodes has a channel per lane kind (active messages with wireup,
//!   rendezvous), first in first out as a uct endpoint is, with its own latency plus seeded
//!   random jitter (so the lanes reorder against each other, never within themselves);
//! * a channel holds at most `capacity` messages in flight; beyond that a transmission is
//!   refused (`NoResource`) and the endpoint parks until the channel drains, as on a full FIFO;
//! * a zero-copy operation completes when its data arrived; gets and puts copy between the two
//!   nodes' user buffers (they share this process) through the packed key, bounds-checked;
//! * a cut ([`Sim::cut`]) loses everything in flight and everything sent afterwards between
//!   two nodes, and the keepalive check reports the peer dead, as a transport does for a
//!   process that died.
//!
//! With `immediate`, a message is delivered inside the transmission, as the `self` transport
//! does: the engine is re-entered while its transmission is with the driver.
//!
//! With `tm` (a tag list size), every node models a transport's tag matching (a device with
//! the contract of `uct_iface_tag_recv_zcopy` and the unexpected handlers, in its simplest
//! form: list operations take effect at once): tagged messages of an endpoint whose
//! [`EpConfig::tag`] is set travel as the transport's tagged messages, match the receives the
//! node posted to its list (copied into their buffers, reported as matched and completed) or go
//! to the node's unexpected handlers; posts beyond the list size are refused.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ucs::idtable::Id;
use ucs::Status;
use uct::AmRecv;

use crate::dt::{Seg, UserBuf};
use crate::engine::{Action, Engine, EpState, Flow, Lane, Local, Mem, Tx, TxOf, TxOp, TxResult, TxStatus, ZcDone};
use crate::proto::pending::Front;
use crate::proto::EpConfig;
use crate::request::{RecvInfo, RequestParam};
use crate::wire::{self, Header};
use crate::wireup::address::{IfaceRecord, WorkerAddress};
use crate::wireup::conn::Connect;
use crate::wireup::lanes::Lanes;

#[cfg(test)]
mod tests;

pub(crate) const US: u64 = 1_000;

/// An endpoint's lanes in the simulation: the directed link it sends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SimIo {
    pub from: usize,
    pub to: usize,
    pub ep: Id,
}

/// The simulated network.
#[derive(Clone, Debug)]
pub(crate) struct SimConfig {
    /// One-way latency of the AM lane.
    pub latency: u64,
    /// One-way latency of the rendezvous lane (a get or put takes a round trip of it).
    pub rndv_latency: u64,
    /// Largest extra delay of a message (seeded).
    pub jitter: u64,
    /// Messages in flight per channel before a transmission is refused.
    pub capacity: usize,
    /// The endpoints' protocol switch points.
    pub ep_cfg: EpConfig,
    /// The lanes connect endpoint to endpoint: wireup exchanges addresses and acknowledges.
    pub p2p: bool,
    /// Deliver inside the transmission (the `self` transport's way).
    pub immediate: bool,
    /// Keepalive interval (0: none).
    pub keepalive: u64,
    /// Model a transport's tag matching with a list of this many receives (0: none).
    pub tm: usize,
    /// The offload settings a node takes when its first tagged message arrives.
    pub tm_offload: crate::tag::offload::OffloadCfg,
    /// The modelled transport refuses receives of this length (as for a buffer it cannot
    /// register).
    pub tm_refuse_len: Option<usize>,
}

/// Counts of what the network did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SimStats {
    pub delivered: u64,
    pub refused: u64,
    /// Whole eager and control messages replayed from a queue without a `Tx` from the engine.
    pub replayed: u64,
    /// Control messages sent at once ([`Action::Ctrl`]).
    pub direct_ctrl: u64,
    /// Sends with a request that went out at once ([`crate::proto::send::send_req`]).
    pub sent_at_once: u64,
    pub lost: u64,
    pub copies: u64,
}

enum Event {
    /// Active message `id` from `from` arrives at `to` (`zc`: the data follows the header from
    /// user memory, read now; the sender's completion then fires).
    Deliver { from: usize, to: usize, lane: u8, id: u8, bytes: Vec<u8>, zc: Option<(Seg, ZcDone)> },
    /// A get or put: copy `len` bytes, then complete `what` on `node`.
    Copy { node: usize, peer: usize, src: *const u8, dst: *mut u8, len: usize, what: ZcDone },
}

/// One node: a worker's engine.
pub(crate) struct Node {
    pub engine: Engine<SimIo>,
    pub addr: WorkerAddress,
    /// The modelled transport's tag list: receives posted to it, in order (request, tag,
    /// buffer).
    pub tm: Vec<(Id, u64, Seg)>,
}

/// Pseudo AM ids of the modelled transport's tagged messages on the network: an eager one
/// (tag, immediate value, data) and a software rendezvous request (tag, RTS).
const SIM_TAG_EAGER: u8 = 250;
const SIM_TAG_RNDV: u8 = 251;

/// The simulation.
pub(crate) struct Sim {
    pub now: u64,
    pub cfg: SimConfig,
    pub nodes: Vec<Node>,
    pub stats: SimStats,
    events: BinaryHeap<Reverse<(u64, u64)>>,
    pending: HashMap<u64, Event>,
    seq: u64,
    /// Per (from, to, lane): messages in flight, the last arrival time (first in first out),
    /// and the endpoints parked on it.
    channels: HashMap<(usize, usize, u8), Channel>,
    rng: u64,
    /// Links cut: (a, b) with a < b.
    cuts: Vec<(usize, usize)>,
}

#[derive(Default)]
struct Channel {
    inflight: usize,
    last: u64,
    parked: Vec<(usize, Id)>,
}

thread_local! {
    /// The simulation's time, for callbacks.
    pub(crate) static NOW: Cell<u64> = const { Cell::new(0) };
    /// Completions: (user data, status, info, time).
    pub(crate) static LOG: RefCell<Vec<(usize, Status, RecvInfo, u64)>> = const { RefCell::new(Vec::new()) };
}

/// The completion callback of simulated operations: logs `(user_data, status, info, now)`.
pub(crate) fn record(status: Status, info: RecvInfo, data: usize) {
    LOG.with(|l| l.borrow_mut().push((data, status, info, NOW.with(Cell::get))));
}

/// Parameters with [`record`] as callback and `data` as user data; detached (no handle).
pub(crate) fn param(data: usize) -> RequestParam {
    let mut p = RequestParam::new().callback_fn(record, data);
    p.detached = true;
    p
}

fn lane_code(l: Lane) -> u8 {
    match l {
        Lane::Am | Lane::Wireup | Lane::Tag => 0,
        Lane::Rndv => 1,
        Lane::Uct(i) => 2u8.saturating_add(i),
    }
}

/// The packed key of `seg` in the simulation: its address and length.
fn key_of(seg: Seg) -> uct::PackedKey {
    let mut k = uct::PackedKey::new();
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&(seg.ptr as u64).to_le_bytes());
    b[8..].copy_from_slice(&(seg.len as u64).to_le_bytes());
    k.push(&b).unwrap_or(());
    k
}

/// An RTS as the simulated driver sends it: the sender's buffer "registered" (a bounds
/// handle in `res`) and, with `key`, its key in the header.
fn expose_rts(hdr: &wire::RtsHdr, key: bool, mem: Option<&Mem>, res: &mut TxResult) -> wire::RtsHdr {
    let mut hdr = *hdr;
    if let Some(m) = mem {
        res.memh = Some(uct::MemH::bounds("sim", m.seg.ptr, m.seg.len));
        if key {
            hdr.rkey = key_of(m.seg);
        }
    }
    res.keyed = !hdr.rkey.is_empty();
    hdr
}

/// The region a packed key names, if the key is well formed.
fn region_of(k: &uct::PackedKey) -> Option<(u64, u64)> {
    let b: &[u8; 16] = k.as_slice().try_into().ok()?;
    Some((u64::from_le_bytes(b[..8].try_into().ok()?), u64::from_le_bytes(b[8..].try_into().ok()?)))
}

impl Sim {
    /// `n` nodes on a network configured as `cfg`, randomness from `seed`.
    pub fn new(n: usize, cfg: SimConfig, seed: u64) -> Sim {
        let nodes = (0..n)
            .map(|i| {
                let addr = WorkerAddress {
                    uuid: 0x51_0000 + i as u64,
                    name: format!("node{i}"),
                    ifaces: vec![IfaceRecord {
                        tl_name: "sim".into(),
                        dev_name: "net".into(),
                        dev_type: uct::DeviceType::Net,
                        aux: false,
                        flags: uct::IfaceFlags::empty(),
                        latency_ns: cfg.latency as f64,
                        bandwidth: 1e9,
                        overhead_ns: 0.0,
                        dev_addr: vec![i as u8],
                        iface_addr: vec![],
                    }],
                };
                let packed = addr.pack().expect("a simulated address packs");
                let local = Local { uuid: addr.uuid, packed: packed.into() };
                let engine = Engine::new(local, cfg.keepalive, 16, 0).expect("an engine");
                Node { engine, addr, tm: Vec::new() }
            })
            .collect();
        NOW.with(|t| t.set(0));
        LOG.with(|l| l.borrow_mut().clear());
        Sim {
            now: 0,
            cfg,
            nodes,
            stats: SimStats::default(),
            events: BinaryHeap::new(),
            pending: HashMap::new(),
            seq: 0,
            channels: HashMap::new(),
            rng: seed | 1,
            cuts: Vec::new(),
        }
    }

    fn random(&mut self, below: u64) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        if below == 0 {
            0
        } else {
            r % below
        }
    }

    /// The endpoint-to-endpoint addresses a node's endpoints send in wireup (with `p2p`).
    fn p2p_addrs(&self, node: usize) -> Vec<u8> {
        if !self.cfg.p2p {
            return Vec::new();
        }
        let a = [node as u8, 0xee];
        wire::WireupMsg::encode_ep_addrs(&[wire::EpAddr { sender_iface: 0, receiver_iface: 0, addr: &a }])
            .unwrap_or_default()
    }

    /// Node `a` creates an endpoint to node `b` (`ucp_ep_create`); its id on `a`.
    pub fn connect(&mut self, a: usize, b: usize) -> Id {
        let c = self.cfg.ep_cfg;
        self.connect_cfg(a, b, c)
    }

    /// As [`Sim::connect`], with switch points `ep_cfg` (e.g. with or without a tag lane).
    pub fn connect_cfg(&mut self, a: usize, b: usize, ep_cfg: EpConfig) -> Id {
        let remote = self.nodes[b].addr.clone();
        let e = &mut self.nodes[a].engine;
        let sn = match e.conn.connect_begin(&e.sh, remote.uuid) {
            Connect::Claimed(id) => return id,
            Connect::New(sn) => sn,
        };
        let id = e.sh.eps.next_id();
        let io = SimIo { from: a, to: b, ep: id };
        let st = EpState::new(io, remote, sn, ep_cfg, Lanes::default(), self.p2p_addrs(a));
        let e = &mut self.nodes[a].engine;
        let got = e.conn.connect(&mut e.sh, st);
        assert_eq!(got, id);
        self.drain(a);
        id
    }

    /// Cuts the link between `a` and `b`: in-flight and later messages are lost, and checks
    /// report the peer gone.
    pub fn cut(&mut self, a: usize, b: usize) {
        self.cuts.push((a.min(b), a.max(b)));
    }

    fn is_cut(&self, a: usize, b: usize) -> bool {
        self.cuts.contains(&(a.min(b), a.max(b)))
    }

    fn schedule(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq)));
        self.pending.insert(self.seq, ev);
    }

    /// Posts a tagged send of `data` on node `n`'s endpoint `ep` (the request path); the
    /// completion is logged with `user`.
    pub fn send(&mut self, n: usize, ep: Id, data: &[u8], tag: u64, sync: bool, user: usize) -> Result<(), Status> {
        // SAFETY: the test keeps `data` alive and unmodified until the send's completion is
        // logged (every scenario waits for it before dropping its buffers).
        let buf = unsafe { UserBuf::contig(data.as_ptr() as *mut u8, data.len()) };
        let e = &mut self.nodes[n].engine;
        let cfg = e.sh.eps.get(ep).map(|s| s.cfg).ok_or(Status::InvalidParam)?;
        let kind = if sync { crate::proto::OpKind::TagSendSync } else { crate::proto::OpKind::TagSend };
        let proto = crate::proto::select(&cfg, crate::proto::Op { kind, len: data.len(), contig: true });
        let (_, front) = crate::proto::send::send_req(
            &mut e.sh,
            ep,
            buf,
            crate::request::SendMsg::Tag(tag),
            sync,
            param(user),
            proto,
        )?;
        if let Some(f) = front {
            self.stats.sent_at_once += 1;
            self.send_front_now(n, ep, f);
        }
        self.drain(n);
        Ok(())
    }

    /// Posts a tagged receive into `data` on node `n`; logged with `user` when it completes
    /// (at once: logged now).
    pub fn recv(&mut self, n: usize, data: &mut [u8], tag: u64, mask: u64, user: usize) -> Result<(), Status> {
        // SAFETY: the test keeps `data` alive, and does not touch it, until the receive's
        // completion is logged.
        let buf = unsafe { UserBuf::contig(data.as_mut_ptr(), data.len()) };
        let e = &mut self.nodes[n].engine;
        let r = e.tag.tag_recv(&mut e.sh, buf, tag, mask, param(user));
        self.drain(n);
        match r? {
            crate::tag::recv::RecvOut::Done(info) => record(Status::Ok, info, user),
            crate::tag::recv::RecvOut::Req(_) => {}
        }
        Ok(())
    }

    /// Runs node `n`'s engine work.
    pub fn drain(&mut self, n: usize) {
        while let Some(a) = self.nodes[n].engine.pop_action() {
            match a {
                Action::Done(d) => d.run(),
                Action::Full(c) => c.run(),
                Action::Transmit(id) => self.flush(n, id),
                Action::Ctrl { ep, io, ctrl } => {
                    if !self.nodes[n].engine.sh.ctrl_dropped_if_gone(ep) {
                        self.stats.direct_ctrl += 1;
                        self.send_front_now(n, ep, Front::Ctrl { io, ctrl });
                    }
                }
                // The modelled tag list takes the receive (the buffer stays the receive's), or
                // refuses it when full or absent, or of the length it is told to refuse.
                Action::TagPost { rid, tag, seg, .. } => {
                    let node = &mut self.nodes[n];
                    if node.tm.len() < self.cfg.tm && Some(seg.len) != self.cfg.tm_refuse_len {
                        node.tm.push((rid, tag, seg));
                    } else {
                        node.engine.tag.offload_post_failed(&mut node.engine.sh, rid);
                    }
                }
                Action::TagCancel { rid, force } => {
                    let node = &mut self.nodes[n];
                    if let Some(i) = node.tm.iter().position(|p| p.0 == rid) {
                        node.tm.remove(i);
                        if !force {
                            let e = &mut node.engine;
                            e.tag.offload_completed(&mut e.sh, rid, 0, 0, 0, Status::Canceled);
                        }
                    }
                }
                // (No offloaded rendezvous in the model.)
                Action::TagRndvCancel { .. } => {}
                Action::Accept(req) => {
                    let e = &mut self.nodes[n].engine;
                    let id = e.sh.eps.next_id();
                    let Some(peer) = self.nodes.iter().position(|x| x.addr.uuid == req.remote.uuid) else { continue };
                    let io = SimIo { from: n, to: peer, ep: id };
                    let st = EpState::new(
                        io,
                        req.remote.clone(),
                        req.conn_sn,
                        self.cfg.ep_cfg,
                        Lanes::default(),
                        self.p2p_addrs(n),
                    );
                    let e = &mut self.nodes[n].engine;
                    let got = e.conn.accept(&mut e.sh, *req, st);
                    assert_eq!(got, id);
                }
                Action::ConnectP2p { ep, addrs } => {
                    let m = wire::WireupMsg {
                        kind: 0,
                        conn_sn: 0,
                        src_uuid: 0,
                        src_ep: 0,
                        dst_ep: 0,
                        address: &[],
                        ep_addrs: &addrs,
                    };
                    let peer = self.nodes[n].engine.sh.eps.get(ep).map(|s| s.io.to);
                    // The peer's lane address names the peer.
                    let ok = m.ep_addrs().any(|a| peer.is_some_and(|p| a.addr == [p as u8, 0xee]));
                    let r = if ok { Ok(()) } else { Err(Status::InvalidAddr) };
                    let e = &mut self.nodes[n].engine;
                    match r {
                        Ok(()) => e.conn.p2p_connected(&mut e.sh, ep),
                        Err(err) => e.on_ep_error(ep, err),
                    }
                }
                Action::Release { io, .. } | Action::Unpark(io) => {
                    for c in self.channels.values_mut() {
                        c.parked.retain(|&(node, id)| !(node == n && id == io.ep));
                    }
                }
                Action::CheckPeer(id) => {
                    let io = self.nodes[n].engine.sh.eps.get(id).map(|s| s.io);
                    if io.is_some_and(|io| self.is_cut(io.from, io.to)) {
                        self.nodes[n].engine.on_ep_error(id, Status::ConnectionReset);
                    }
                }
                Action::Drop(x) => drop(x),
            }
        }
    }

    /// Makes node `n`'s endpoint `id`'s transmissions (the driver's `flush`).
    fn flush(&mut self, n: usize, id: Id) {
        loop {
            // The driver's replays from the front of the queue, through the same engine calls.
            if let Some(f) = self.nodes[n].engine.sh.front(id) {
                self.stats.replayed += 1;
                if let Flow::Blocked(_) = self.send_front(n, id, f) {
                    return;
                }
                continue;
            }
            let Some(tx) = self.nodes[n].engine.sh.next_tx(id) else { return };
            let io = tx.io;
            let res = self.exec(n, &tx);
            let flow = self.nodes[n].engine.sh.tx_done(id, tx, res);
            self.drain(n);
            if let Flow::Blocked(lane) = flow {
                self.park(n, id, io, lane);
                return;
            }
        }
    }

    /// Sends what [`Shared::front`](crate::engine::Shared::front) (or a send at once) gave,
    /// as the driver's `send_front` does; parks the endpoint when the channel refuses.
    fn send_front(&mut self, n: usize, id: Id, f: Front<SimIo>) -> Flow {
        let (io, flow) = match f {
            Front::Data { io, rid, short, hdr, buf, offset, len } => {
                let op = match short.then(|| crate::proto::eager::short_op(&hdr, buf)).flatten() {
                    Some(op) => op,
                    None => TxOp::Bcopy { hdr, data: buf, offset, len },
                };
                let tx = Tx { io, lane: Lane::Am, op, of: TxOf::Req { rid, offset, len } };
                let res = self.exec(n, &tx);
                (io, self.nodes[n].engine.sh.data_replayed(id, rid, short, hdr, buf, offset, len, res.status))
            }
            Front::Ctrl { io, ctrl } => {
                let tx = Tx { io, lane: Lane::Am, op: TxOp::Ctrl(ctrl), of: TxOf::Ctrl };
                let res = self.exec(n, &tx);
                let TxOp::Ctrl(ctrl) = tx.op else { unreachable!("built above") };
                (io, self.nodes[n].engine.sh.ctrl_replayed(id, ctrl, res.status))
            }
        };
        self.drain(n);
        if let Flow::Blocked(lane) = flow {
            self.park(n, id, io, lane);
        }
        flow
    }

    /// [`Sim::send_front`] outside a flush, then a kick, as the driver's `send_front_now`.
    fn send_front_now(&mut self, n: usize, id: Id, f: Front<SimIo>) {
        if self.send_front(n, id, f) == Flow::Continue {
            self.nodes[n].engine.sh.kick(id);
            self.drain(n);
        }
    }

    fn park(&mut self, n: usize, id: Id, io: SimIo, lane: Lane) {
        if self.nodes[n].engine.sh.waking(id) || lane == Lane::Wireup {
            return;
        }
        let cap = self.cfg.capacity;
        let ch = self.channels.entry((io.from, io.to, lane_code(lane))).or_default();
        if ch.inflight >= cap {
            ch.parked.push((n, id));
            self.nodes[n].engine.sh.parked(id);
        }
    }

    /// A channel has room again: its parked endpoints replay (those still blocked stay).
    fn wake(&mut self, key: (usize, usize, u8)) {
        let parked = self.channels.get_mut(&key).map(|c| std::mem::take(&mut c.parked)).unwrap_or_default();
        for (n, id) in parked {
            let stays = if self.nodes[n].engine.sh.wake_begin(id) {
                self.flush(n, id);
                let stays = self.nodes[n].engine.sh.wake_end(id);
                self.drain(n);
                stays
            } else {
                false
            };
            if stays {
                self.channels.entry(key).or_default().parked.push((n, id));
            }
        }
    }

    /// Makes one transmission on the simulated network.
    fn exec(&mut self, n: usize, tx: &Tx<SimIo>) -> TxResult {
        let io = tx.io;
        let code = lane_code(tx.lane);
        let key = (io.from, io.to, code);
        let cap = self.cfg.capacity;
        if self.channels.entry(key).or_default().inflight >= cap {
            self.stats.refused += 1;
            return TxResult::of(TxStatus::NoResource);
        }
        let mut res = TxResult::of(TxStatus::Done);
        let (id, bytes, zc) = match &tx.op {
            // Through the tag lane: the modelled transport's tagged messages.
            op if tx.lane == Lane::Tag => match op {
                TxOp::Short { hdr, data, .. } => {
                    let mut b = [hdr.to_le_bytes(), 0u64.to_le_bytes()].concat();
                    b.extend_from_slice(data.contig_bytes().unwrap_or(&[]));
                    (SIM_TAG_EAGER, b, None)
                }
                TxOp::Bcopy { hdr, data, offset, len } => {
                    let (tag, imm) = match hdr {
                        crate::wire::DataHdr::Eager(h) => (h.tag, 0),
                        crate::wire::DataHdr::EagerSync(h) => (h.tag, h.ep),
                        _ => return TxResult::of(TxStatus::Failed(Status::InvalidParam)),
                    };
                    let mut b = [tag.to_le_bytes(), imm.to_le_bytes()].concat();
                    let at = b.len();
                    b.resize(at + len, 0);
                    data.copy_out(*offset, &mut b[at..]).expect("the piece is in the buffer");
                    (SIM_TAG_EAGER, b, None)
                }
                TxOp::Rts { hdr, offer, mem, .. } => {
                    let hdr = expose_rts(hdr, offer.key, mem.as_ref(), &mut res);
                    let mut b = hdr.tag.to_le_bytes().to_vec();
                    let at = b.len();
                    b.resize(at + hdr.encoded_len(), 0);
                    hdr.encode(&mut b[at..]).expect("an RTS fits");
                    (SIM_TAG_RNDV, b, None)
                }
                _ => return TxResult::of(TxStatus::Failed(Status::Unsupported)),
            },
            // The simulation runs the tag family and wireup; it has no remote memory.
            TxOp::Rma(_) => return TxResult::of(TxStatus::Failed(Status::Unsupported)),
            TxOp::Flush { .. } => return TxResult::of(TxStatus::Done),
            TxOp::RmaGetData { .. } | TxOp::TagRndv { .. } => {
                return TxResult::of(TxStatus::Failed(Status::Unsupported))
            }
            TxOp::Short { id, hdr, data } => {
                let mut b = hdr.to_le_bytes().to_vec();
                b.extend_from_slice(data.contig_bytes().unwrap_or(&[]));
                (*id, b, None)
            }
            TxOp::Bcopy { hdr, data, offset, len } => {
                let mut b = vec![0u8; hdr.encoded_len() + len];
                let h = hdr.encode(&mut b).expect("the header fits");
                data.copy_out(*offset, &mut b[h..]).expect("the piece is in the buffer");
                (hdr.am_id(), b, None)
            }
            TxOp::Ctrl(c) => {
                let mut b = vec![0u8; 4096];
                let len = c.encode(&mut b).expect("a control message fits");
                b.truncate(len);
                (c.am_id(), b, None)
            }
            TxOp::Rts { hdr, offer, mem, .. } => {
                let hdr = expose_rts(hdr, offer.key, mem.as_ref(), &mut res);
                let mut b = vec![0u8; hdr.encoded_len()];
                hdr.encode(&mut b).expect("an RTS fits");
                (wire::AM_RNDV_RTS, b, None)
            }
            TxOp::Rtr { hdr, mem } => {
                let mut hdr = *hdr;
                if let Some(m) = mem {
                    res.memh = Some(uct::MemH::bounds("sim", m.seg.ptr, m.seg.len));
                    hdr.rkey = key_of(m.seg);
                }
                res.keyed = !hdr.rkey.is_empty();
                let mut b = vec![0u8; hdr.encoded_len()];
                hdr.encode(&mut b).expect("an RTR fits");
                (wire::AM_RNDV_RTR, b, None)
            }
            TxOp::AmZcopy { hdr, mem, offset, len, token } => {
                let mut b = vec![0u8; hdr.encoded_len()];
                hdr.encode(&mut b).expect("the header fits");
                let piece = mem.seg.sub(*offset, *len).expect("the piece is in the buffer");
                let memh = mem.memh.clone().unwrap_or_else(|| uct::MemH::bounds("sim", mem.seg.ptr, mem.seg.len));
                assert!(memh.contains(piece.ptr, piece.len), "a zero-copy fragment outside its registration");
                if mem.memh.is_none() {
                    res.memh = Some(memh);
                }
                res.status = TxStatus::Started;
                (hdr.am_id(), b, Some((piece, *token)))
            }
            TxOp::Get { mem, remote, rkey, token } | TxOp::Put { mem, remote, rkey, token } => {
                let get = matches!(tx.op, TxOp::Get { .. });
                return self.rma(n, io, mem, *remote, rkey, *token, get);
            }
        };
        if self.cfg.immediate && !self.is_cut(io.from, io.to) {
            self.stats.delivered += 1;
            self.arrive(io.to, id, bytes, zc.map(|z| z.0));
            if let Some((_, what)) = zc {
                // Completed within the call: no completion fires.
                let _ = what;
                res.status = TxStatus::Done;
            }
            return res;
        }
        let lat = self.cfg.latency + self.random(self.cfg.jitter + 1);
        let ch = self.channels.entry(key).or_default();
        let at = (self.now + lat).max(ch.last);
        ch.last = at;
        ch.inflight += 1;
        self.schedule(at, Event::Deliver { from: io.from, to: io.to, lane: code, id, bytes, zc });
        res
    }

    /// A get or put between the two nodes' memory, through the packed key.
    #[allow(clippy::too_many_arguments)]
    fn rma(
        &mut self,
        n: usize,
        io: SimIo,
        mem: &Mem,
        remote: u64,
        rkey: &uct::PackedKey,
        what: ZcDone,
        get: bool,
    ) -> TxResult {
        let Some((base, len)) = region_of(rkey) else { return TxResult::of(TxStatus::Failed(Status::InvalidParam)) };
        let n_bytes = mem.seg.len as u64;
        if remote < base || remote.checked_add(n_bytes).is_none_or(|e| e > base + len) {
            return TxResult::of(TxStatus::Failed(Status::InvalidParam));
        }
        let memh = mem.memh.clone().unwrap_or_else(|| uct::MemH::bounds("sim", mem.seg.ptr, mem.seg.len));
        assert!(memh.contains(mem.seg.ptr, mem.seg.len), "a get or put outside its registration");
        let (src, dst) =
            if get { (remote as *const u8, mem.seg.ptr) } else { (mem.seg.ptr as *const u8, remote as *mut u8) };
        let mut res = TxResult::of(TxStatus::Started);
        if mem.memh.is_none() {
            res.memh = Some(uct::MemH::bounds("sim", mem.seg.ptr, mem.seg.len));
        }
        let key = (io.from, io.to, 1);
        let lat = 2 * self.cfg.rndv_latency + self.random(self.cfg.jitter + 1);
        let ch = self.channels.entry(key).or_default();
        let at = (self.now + lat).max(ch.last);
        ch.last = at;
        ch.inflight += 1;
        self.schedule(at, Event::Copy { node: n, peer: io.to, src, dst, len: mem.seg.len, what });
        res
    }

    /// A tagged message of the modelled transport arrives at node `to`: it matches the
    /// earliest receive posted to the node's list for its tag, or goes to the unexpected
    /// handlers (which activate offload on the node, as a transport's first tagged message
    /// does).
    fn tm_arrive(&mut self, to: usize, id: u8, bytes: &[u8]) {
        let tag = u64::from_le_bytes(bytes[..8].try_into().expect("a tag"));
        let node = &mut self.nodes[to];
        let hit = node.tm.iter().position(|p| p.1 == tag);
        let e = &mut node.engine;
        match (hit, id) {
            (Some(i), SIM_TAG_EAGER) => {
                let (rid, _, seg) = node.tm.remove(i);
                let imm = u64::from_le_bytes(bytes[8..16].try_into().expect("an immediate value"));
                let data = &bytes[16..];
                let n = data.len().min(seg.len);
                // SAFETY: the posted receive's buffer is valid until it completes (reported
                // below); `n` fits it.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), seg.ptr, n) };
                let status = if data.len() > seg.len { Status::MessageTruncated } else { Status::Ok };
                e.tag.offload_consumed(&mut e.sh, rid);
                e.tag.offload_completed(&mut e.sh, rid, tag, imm, n, status);
            }
            (Some(i), _) => {
                let (rid, _, _) = node.tm.remove(i);
                e.tag.offload_consumed(&mut e.sh, rid);
                e.tag.offload_rndv(&mut e.sh, rid, tag, &bytes[8..]);
            }
            (None, SIM_TAG_EAGER) => {
                let imm = u64::from_le_bytes(bytes[8..16].try_into().expect("an immediate value"));
                e.tag.offload_activate(0, self.cfg.tm, self.cfg.tm_offload);
                if let Some(d) = e.tag.on_offload_eager(&mut e.sh, tag, imm, AmRecv::borrowed(&bytes[16..])) {
                    d.run();
                }
            }
            (None, _) => {
                e.tag.offload_activate(0, self.cfg.tm, self.cfg.tm_offload);
                let u = uct::TagUnexpRndv { stag: tag, header: &bytes[8..], remote_addr: 0, length: 0, rkey_buf: &[] };
                e.tag.on_offload_rndv(&mut e.sh, &u);
            }
        }
        self.drain(to);
    }

    /// A message arrives at node `to`.
    fn arrive(&mut self, to: usize, id: u8, mut bytes: Vec<u8>, zc: Option<Seg>) {
        if id == SIM_TAG_EAGER || id == SIM_TAG_RNDV {
            return self.tm_arrive(to, id, &bytes);
        }
        if let Some(seg) = zc {
            let mut data = vec![0u8; seg.len];
            // SAFETY: the sender's user buffer stays valid until this operation's completion
            // fires, which is after this read (the engine's contract with its driver).
            unsafe { std::ptr::copy_nonoverlapping(seg.ptr, data.as_mut_ptr(), seg.len) };
            bytes.extend_from_slice(&data);
        }
        let d = self.nodes[to].engine.on_am(id, AmRecv::borrowed(&bytes));
        if let Some(d) = d {
            d.run();
        }
        self.drain(to);
    }

    /// Processes the next event; false when there is none.
    pub fn step(&mut self) -> bool {
        let Some(Reverse((at, seq))) = self.events.pop() else { return false };
        self.now = self.now.max(at);
        NOW.with(|t| t.set(self.now));
        let Some(ev) = self.pending.remove(&seq) else { return true };
        match ev {
            Event::Deliver { from, to, lane, id, bytes, zc } => {
                let key = (from, to, lane);
                if let Some(c) = self.channels.get_mut(&key) {
                    c.inflight = c.inflight.saturating_sub(1);
                }
                if self.is_cut(from, to) {
                    self.stats.lost += 1;
                    // A transport completes what was in flight to a dead peer with an error.
                    if let Some((_, what)) = zc {
                        self.nodes[from].engine.sh.zc_done(what, Status::ConnectionReset);
                        self.drain(from);
                    }
                } else {
                    self.stats.delivered += 1;
                    self.arrive(to, id, bytes, zc.map(|z| z.0));
                    if let Some((_, what)) = zc {
                        self.nodes[from].engine.sh.zc_done(what, Status::Ok);
                        self.drain(from);
                    }
                }
                self.wake(key);
            }
            Event::Copy { node, peer, src, dst, len, what } => {
                let key = (node, peer, 1);
                if let Some(c) = self.channels.get_mut(&key) {
                    c.inflight = c.inflight.saturating_sub(1);
                }
                let status = if self.is_cut(node, peer) {
                    self.stats.lost += 1;
                    Status::ConnectionReset
                } else {
                    // SAFETY: both buffers belong to operations in flight (a receive and the
                    // send it matched), valid until their requests complete, which is after
                    // this completion; the key was checked to cover the remote range.
                    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
                    self.stats.copies += 1;
                    Status::Ok
                };
                self.nodes[node].engine.sh.zc_done(what, status);
                self.drain(node);
                self.wake(key);
            }
        }
        true
    }

    /// Every node's progress: retries, timers.
    pub fn progress(&mut self) {
        for n in 0..self.nodes.len() {
            let mut list = Vec::new();
            self.nodes[n].engine.sh.take_retry(&mut list);
            for id in list {
                self.flush(n, id);
            }
            let now = self.now;
            self.nodes[n].engine.sh.on_timer(now);
            self.drain(n);
        }
    }

    /// Runs events until `done` holds (true) or nothing is left to happen (false); a timer-only
    /// wait advances time by the keepalive interval.
    pub fn run_until(&mut self, mut done: impl FnMut(&Sim) -> bool) -> bool {
        for _ in 0..1_000_000 {
            self.progress();
            if done(self) {
                return true;
            }
            if !self.step() {
                if self.cfg.keepalive == 0 || self.nodes.iter().all(|n| n.engine.sh.eps.is_empty()) {
                    self.progress();
                    return done(self);
                }
                self.now += self.cfg.keepalive;
                NOW.with(|t| t.set(self.now));
            }
        }
        panic!("the simulation did not settle: {:?}", Sim::log());
    }

    /// The completions logged so far.
    pub fn log() -> Vec<(usize, Status, RecvInfo, u64)> {
        LOG.with(|l| l.borrow().clone())
    }

    /// Whether `user` completed.
    pub fn completed(user: usize) -> Option<(Status, RecvInfo, u64)> {
        LOG.with(|l| l.borrow().iter().find(|e| e.0 == user).map(|e| (e.1, e.2, e.3)))
    }
}
