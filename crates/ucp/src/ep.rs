//! Endpoints (`ucp_ep_h`): lanes to one remote worker, wireup, queueing, query and close.
//!
//! Wireup: creating an endpoint sends a `REQUEST` carrying this worker's address, its
//! endpoint id, a connection number and the addresses of its endpoint-to-endpoint lanes (rc)
//! on the wireup lane (the AM lane when it connects to the remote interface, else a transport
//! that does: ud or shared memory). The peer finds the endpoint it created towards us with the
//! same number (simultaneous connect, or an endpoint to self) or creates one, connects its
//! endpoint-to-endpoint lanes to ours, and answers with a `REPLY` carrying its endpoint id and
//! lane addresses. The requester connects its lanes in turn and, when there are such lanes,
//! sends an `ACK`: the replier uses its lanes only after it, when both ends are connected.
//! Until then sends are queued on the endpoint and replayed in order; wireup messages have
//! their own queue, so they never wait behind data.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use crate::address::{IfaceRecord, WorkerAddress};
use crate::config::{RndvScheme, Thresh};
use crate::core::Core;
use crate::lanes::{self, LaneLimits, LanePair, Lanes};
use crate::wire::{self, EpAddr, Header, WireupMsg};

/// Endpoint state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EpStatus {
    /// Wireup request sent; no reply yet.
    Connecting,
    /// Both sides know each other's endpoint id.
    Connected,
    /// A transport failed.
    Failed(Status),
    /// Closed by the user.
    Closed,
}

/// A control message (protocol replies), queued when the lane is full.
#[derive(Debug)]
pub(crate) enum Ctrl {
    Wireup(WireupOut),
    SyncAck(wire::SyncAck),
    Ats(wire::Ats),
    Rtr(wire::RtrHdr),
    Atp(wire::Atp),
}

/// A wireup message to send, owning what [`WireupMsg`] borrows.
#[derive(Debug)]
pub(crate) struct WireupOut {
    pub kind: u8,
    pub conn_sn: u32,
    pub src_uuid: u64,
    pub src_ep: u64,
    pub dst_ep: u64,
    pub with_address: Option<Rc<[u8]>>,
    /// Encoded by `WireupMsg::encode_ep_addrs` (empty: none).
    pub ep_addrs: Vec<u8>,
}

impl WireupOut {
    /// The message as it goes on the wire.
    pub fn msg(&self) -> WireupMsg<'_> {
        WireupMsg {
            kind: self.kind,
            conn_sn: self.conn_sn,
            src_uuid: self.src_uuid,
            src_ep: self.src_ep,
            dst_ep: self.dst_ep,
            address: self.with_address.as_deref().unwrap_or(&[]),
            ep_addrs: &self.ep_addrs,
        }
    }
}

impl Ctrl {
    pub fn name(&self) -> &'static str {
        wire::am_name(self.am_id())
    }

    fn header(&self) -> &dyn Header {
        match self {
            Ctrl::Wireup(_) => unreachable!("wireup messages borrow; see `pack`"),
            Ctrl::SyncAck(h) => h,
            Ctrl::Ats(h) => h,
            Ctrl::Rtr(h) => h,
            Ctrl::Atp(h) => h,
        }
    }

    pub fn am_id(&self) -> u8 {
        match self {
            Ctrl::Wireup(_) => wire::AM_WIREUP,
            c => c.header().am_id(),
        }
    }

    /// Encodes the message into a transport buffer; its length (0, logged, when it does not
    /// fit: the endpoint's creation checked that wireup messages fit).
    pub fn pack(&self, buf: &mut [u8]) -> usize {
        let r = match self {
            Ctrl::Wireup(w) => w.msg().encode(buf),
            c => c.header().encode(buf),
        };
        r.unwrap_or_else(|e| {
            tracing::error!("ucp: {} message: {e}", self.name());
            0
        })
    }
}

/// An operation queued on an endpoint.
#[derive(Debug)]
pub(crate) enum Pending {
    /// A send request to start or continue.
    Send(Id),
    /// A control message.
    Ctrl(Ctrl),
    /// A rendezvous get to start (receive request).
    Get(Id),
}

/// The rendezvous lane of an endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RndvLane {
    /// Index into `Ep::uct_eps`.
    pub uct: usize,
    /// Local interface index.
    pub iface: usize,
    /// Both sides can get / put.
    pub get: bool,
    pub put: bool,
    /// Limits of one operation.
    pub max_zcopy: usize,
}

/// Protocol switch points of an endpoint, from its AM lane and the configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EpConfig {
    /// Payloads shorter than this go with `am_short` (the tag is its header).
    pub short_lim: usize,
    /// Largest AM bcopy message, headers included.
    pub bcopy_max: usize,
    /// Messages of this size or more go rendezvous.
    pub rndv_thresh: usize,
    /// Contiguous eager messages of this size or more go zero-copy (`usize::MAX`: never, the
    /// AM lane has no `am_zcopy`).
    pub zcopy_thresh: usize,
    /// Largest `am_zcopy` message (header and payload) on the AM lane.
    pub zcopy_max: usize,
    /// Rendezvous scheme: the configured one, with `auto` resolved to `am` where the AM lane
    /// moves data faster than the zero-copy lane (see [`auto_rndv_scheme`]).
    pub scheme: RndvScheme,
}

/// One transport endpoint of a UCP endpoint.
pub(crate) struct UctLane {
    /// The interface records it connects (local, remote).
    pub pair: LanePair,
    pub ep: Box<dyn uct::Ep>,
    /// Connects endpoint to endpoint (through wireup messages).
    pub p2p: bool,
    /// Connected (always, for a lane that connects to the remote interface).
    pub connected: Cell<bool>,
}

/// An endpoint.
pub(crate) struct Ep {
    pub id: Cell<Id>,
    pub remote: WorkerAddress,
    pub conn_sn: u32,
    pub remote_id: Cell<u64>,
    pub status: Cell<EpStatus>,
    pub lanes: Lanes,
    pub uct_eps: Vec<UctLane>,
    pub am_idx: usize,
    pub wireup_idx: usize,
    pub rndv: Option<RndvLane>,
    pub cfg: EpConfig,
    pub pending: RefCell<VecDeque<Pending>>,
    /// Wireup messages waiting for send resources on the wireup lane.
    pub wireup_q: RefCell<VecDeque<Ctrl>>,
    /// In the worker's list of endpoints whose queues progress retries.
    pub listed: Cell<bool>,
    /// `pending` waits for the AM lane: a [`LaneWake`] sits in that lane's pending queue and
    /// replays it when the transport has resources again; until then nothing retries it.
    pub parked: Cell<bool>,
    /// The endpoint's [`LaneWake`], made the first time it parks.
    pub wake: std::cell::OnceCell<uct::PendingHandle>,
}

/// What an endpoint parks in its AM lane's pending queue (`uct_pending_req_t` of UCX's
/// endpoint-level pending): the transport calls it when the lane may send again, and it
/// replays the endpoint's queue.
pub(crate) struct LaneWake {
    pub core: std::rc::Weak<crate::core::Core>,
    pub ep: std::rc::Weak<Ep>,
}

impl uct::PendingReq for LaneWake {
    fn progress(&self) -> uct::PendingOutcome {
        match (self.core.upgrade(), self.ep.upgrade()) {
            // Still blocked: stay queued, but let the transport serve other endpoints first.
            (Some(core), Some(ep)) if core.unpark(&ep) => uct::PendingOutcome::KeepContinue,
            _ => uct::PendingOutcome::Done,
        }
    }
}

impl Ep {
    /// The uct endpoint of the AM lane.
    #[inline]
    pub fn am(&self) -> &dyn uct::Ep {
        &*self.uct_eps[self.am_idx].ep
    }

    /// The uct endpoint of the wireup lane.
    #[inline]
    pub fn wireup(&self) -> &dyn uct::Ep {
        &*self.uct_eps[self.wireup_idx].ep
    }

    /// Whether some lane connects endpoint to endpoint.
    pub fn has_p2p(&self) -> bool {
        self.uct_eps.iter().any(|l| l.p2p)
    }

    /// Ready for protocol sends (wired up, nothing queued).
    #[inline]
    pub fn ready(&self) -> bool {
        self.status.get() == EpStatus::Connected && self.pending.borrow().is_empty()
    }

    /// The endpoint's error, if it failed or was closed.
    #[inline]
    pub fn error(&self) -> Option<Status> {
        match self.status.get() {
            EpStatus::Failed(s) => Some(s),
            EpStatus::Closed => Some(Status::Canceled),
            _ => None,
        }
    }
}

/// What one lane of an endpoint is for, with its transport (`ucp_ep_query`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneInfo {
    /// `am`, `wireup` (when not the AM lane), `rma`, `amo` or `rndv`.
    pub usage: &'static str,
    /// Transport name.
    pub transport: String,
    /// Device name.
    pub device: String,
}

/// The result of [`crate::Endpoint::query`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpInfo {
    /// The remote worker's name.
    pub remote_name: String,
    /// Whether wireup completed.
    pub connected: bool,
    /// The lanes.
    pub lanes: Vec<LaneInfo>,
    /// Messages of this size or more use rendezvous.
    pub rndv_thresh: usize,
    /// Payloads shorter than this go eager short.
    pub short_lim: usize,
}

/// Automatic rendezvous threshold: where `2 × len / am bandwidth` (copy in, copy out) exceeds
/// `rendezvous latency + len / zcopy bandwidth`, never below one bcopy fragment.
fn auto_rndv_thresh(am: &IfaceRecord, rndv: &IfaceRecord, bcopy_max: usize) -> usize {
    let am_lat = am.latency_ns * 1e-9 + am.overhead_ns * 1e-9;
    // RTS, the zero-copy operation, ATS.
    let lat = 2.0 * am_lat + rndv.latency_ns * 1e-9 + rndv.overhead_ns * 1e-9;
    let per_byte = 2.0 / am.bandwidth - 1.0 / rndv.bandwidth;
    let t = if per_byte > 0.0 { (lat / per_byte) as usize } else { usize::MAX };
    t.max(bcopy_max)
}

/// The rendezvous scheme `auto` stands for on an endpoint: `am` when the AM lane's modeled
/// bandwidth exceeds the zero-copy lane's and the context does not ask for wakeup, else `auto`
/// itself (get_zcopy, else put_zcopy, else AM fragments, by what the lane can do).
///
/// Fragments on the AM lane are copied in by the sender and out by the receiver, and the two
/// copies overlap (the sender fills the next fragment while the receiver empties the last), so
/// the AM scheme moves data at about the AM lane's bandwidth. On a network lane that is the
/// wire, the same as the zero-copy lane's: the tie goes to zero-copy, which spares both CPUs
/// the copies. On shared memory the AM lane's bandwidth is a copy bandwidth (posix/sysv
/// 15,360 MB/s in UCX's model) and the zero-copy lane is cma at 11,145 MB/s: its
/// `process_vm_readv` pins and walks the pages of every transfer.
///
/// A worker that sleeps on its event descriptor (`wakeup`, the WAKEUP feature) wakes for every
/// few fragments, where a zero-copy transfer is one event: there, zero-copy.
fn auto_rndv_scheme(am: &IfaceRecord, rndv: Option<&IfaceRecord>, wakeup: bool) -> RndvScheme {
    match rndv {
        Some(r) if am.bandwidth > r.bandwidth && !wakeup => RndvScheme::Am,
        _ => RndvScheme::Auto,
    }
}

impl Core {
    /// The next connection number towards worker `uuid`.
    fn next_sn(&self, uuid: u64) -> u32 {
        let mut c = self.conn.borrow_mut();
        let sn = c.next_sn.entry(uuid).or_insert(0);
        let v = *sn;
        *sn = sn.wrapping_add(1);
        v
    }

    /// Builds an endpoint towards `remote` (lanes, uct endpoints, protocol thresholds) and
    /// inserts it.
    fn build_ep(&self, remote: WorkerAddress, conn_sn: u32) -> UcsResult<Rc<Ep>> {
        let cfg = self.ctx.config();
        let limits = LaneLimits {
            max_rndv_lanes: cfg.max_rndv_lanes.max(1),
            atomics: self.ctx.features().intersects(crate::Features::AMO32 | crate::Features::AMO64),
        };
        let reachable = |l: &IfaceRecord, r: &IfaceRecord| {
            let Some(i) = self.address.ifaces.iter().position(|x| std::ptr::eq(x, l)) else { return false };
            let wi = &self.ifaces[i];
            let to_iface = uct::IfaceFlags::CONNECT_TO_IFACE;
            if wi.attr.flags.contains(to_iface) && r.flags.contains(to_iface) {
                wi.iface.is_reachable(&r.dev_addr, Some(&r.iface_addr))
            } else {
                // Endpoint to endpoint: the device decides; the wireup lane carries the rest.
                wi.attr.flags.contains(uct::IfaceFlags::CONNECT_TO_EP) && wi.iface.is_reachable(&r.dev_addr, None)
            }
        };
        let lanes = lanes::select(&self.address, &remote, limits, &reachable);
        let Some(am) = lanes.am else {
            tracing::error!(
                "ucp: worker '{}' is unreachable: no common transport with active messages (local: {}; remote: {})",
                remote.name,
                self.address.ifaces.iter().map(|i| i.tl_name.as_str()).collect::<Vec<_>>().join(","),
                remote.ifaces.iter().map(|i| i.tl_name.as_str()).collect::<Vec<_>>().join(","),
            );
            return Err(Status::Unreachable);
        };
        // The selection pairs an endpoint-to-endpoint AM lane with a wireup lane.
        let wireup = lanes.wireup.unwrap_or(am);
        let id = self.eps.borrow_mut().insert(None);
        let mut uct_eps: Vec<UctLane> = Vec::new();
        let mut ep_for = |pair: LanePair| -> UcsResult<usize> {
            if let Some(i) = uct_eps.iter().position(|l| l.pair == pair) {
                return Ok(i);
            }
            let r = &remote.ifaces[pair.remote];
            let to_iface = uct::IfaceFlags::CONNECT_TO_IFACE;
            let p2p = !(self.address.ifaces[pair.local].flags.contains(to_iface) && r.flags.contains(to_iface));
            let params = if p2p { uct::EpParams::to_ep() } else { uct::EpParams::to_iface(&r.dev_addr, &r.iface_addr) };
            let ep = self.ifaces[pair.local].iface.ep_create(&params.with_user_data(id.raw()))?;
            uct_eps.push(UctLane { pair, ep, p2p, connected: Cell::new(!p2p) });
            Ok(uct_eps.len() - 1)
        };
        let built = (|| -> UcsResult<(usize, usize, Option<RndvLane>)> {
            let am_idx = ep_for(am)?;
            let wireup_idx = ep_for(wireup)?;
            let rndv = match lanes.rndv.first() {
                Some(&p) => {
                    let (l, r) = (&self.address.ifaces[p.local], &remote.ifaces[p.remote]);
                    let both = |f: uct::IfaceFlags| l.flags.contains(f) && r.flags.contains(f);
                    let attr = &self.ifaces[p.local].attr;
                    let (get, put) = (both(uct::IfaceFlags::GET_ZCOPY), both(uct::IfaceFlags::PUT_ZCOPY));
                    // A message must fit every operation the lane may use for it.
                    let limit = |ok: bool, v: usize| if ok { v } else { usize::MAX };
                    Some(RndvLane {
                        uct: ep_for(p)?,
                        iface: p.local,
                        get,
                        put,
                        max_zcopy: limit(get, attr.get.max_zcopy).min(limit(put, attr.put.max_zcopy)).max(1),
                    })
                }
                None => None,
            };
            Ok((am_idx, wireup_idx, rndv))
        })();
        let (am_idx, wireup_idx, rndv) = match built {
            Ok(v) => v,
            Err(e) => {
                self.eps.borrow_mut().remove(id);
                tracing::error!("ucp: cannot connect to '{}': {e}", remote.name);
                return Err(e);
            }
        };
        for l in &uct_eps {
            self.activate(l.pair.local);
        }
        let am_attr = &self.ifaces[am.local].attr;
        let mut short_lim = am_attr.am.max_short.saturating_add(1).saturating_sub(wire::len::EAGER_ONLY);
        if !am_attr.flags.contains(uct::IfaceFlags::AM_SHORT) {
            short_lim = 0;
        }
        if let Thresh::Fixed(t) = cfg.bcopy_thresh {
            short_lim = short_lim.min(t);
        }
        let bcopy_max = am_attr.am.max_bcopy;
        // Eager zero-copy where the AM lane has it and takes UCP's largest eager header.
        let zcopy_ok = am_attr.flags.contains(uct::IfaceFlags::AM_ZCOPY)
            && am_attr.am.max_hdr >= wire::len::EAGER_SYNC_FIRST
            && am_attr.am.max_zcopy > wire::len::EAGER_SYNC_FIRST;
        let zcopy_thresh = match cfg.zcopy_thresh {
            _ if !zcopy_ok => usize::MAX,
            Thresh::Fixed(t) => t,
            // From the size that no longer fits one copied fragment: copying it would take
            // several bounce buffers, sending from the user's buffer takes a registration
            // (cached) instead.
            Thresh::Auto => bcopy_max.saturating_sub(wire::len::EAGER_ONLY) + 1,
        };
        let rndv_thresh = match cfg.rndv_thresh {
            Thresh::Fixed(t) => t,
            Thresh::Auto => match lanes.rndv.first() {
                Some(p) => auto_rndv_thresh(&self.address.ifaces[am.local], &self.address.ifaces[p.local], bcopy_max),
                None => usize::MAX,
            },
        };
        let scheme = match cfg.rndv_scheme {
            RndvScheme::Auto => auto_rndv_scheme(
                &self.address.ifaces[am.local],
                lanes.rndv.first().map(|p| &self.address.ifaces[p.local]),
                self.ctx.features().contains(crate::Features::WAKEUP),
            ),
            s => s,
        };
        let ep = Rc::new(Ep {
            id: Cell::new(id),
            remote,
            conn_sn,
            remote_id: Cell::new(0),
            status: Cell::new(EpStatus::Connecting),
            lanes,
            uct_eps,
            am_idx,
            wireup_idx,
            rndv,
            cfg: EpConfig { short_lim, bcopy_max, rndv_thresh, zcopy_thresh, zcopy_max: am_attr.am.max_zcopy, scheme },
            pending: RefCell::new(VecDeque::new()),
            wireup_q: RefCell::new(VecDeque::new()),
            listed: Cell::new(false),
            parked: Cell::new(false),
            wake: std::cell::OnceCell::new(),
        });
        if let Some(slot) = self.eps.borrow_mut().get_mut(id) {
            *slot = Some(ep.clone());
        }
        if cfg.proto_info {
            self.print_proto_info(&ep);
        }
        Ok(ep)
    }

    /// Prints which protocol each message size range uses (`UCX_PROTO_INFO=y`).
    fn print_proto_info(&self, ep: &Ep) {
        let c = &ep.cfg;
        let name = |p: Option<lanes::LanePair>| {
            p.map(|p| self.address.ifaces[p.local].tl_name.clone()).unwrap_or_else(|| "-".into())
        };
        let am = name(ep.lanes.am);
        let rndv_tl = name(ep.lanes.rndv.first().copied());
        let single = c.bcopy_max.saturating_sub(wire::len::EAGER_ONLY);
        let rndv = match (ep.rndv, c.scheme) {
            (_, RndvScheme::Am) | (None, _) => format!("rendezvous, data in active messages on {am}"),
            (Some(l), RndvScheme::PutZcopy) if l.put => format!("rendezvous put_zcopy on {rndv_tl}"),
            (Some(l), RndvScheme::GetZcopy | RndvScheme::Auto) if l.get => format!("rendezvous get_zcopy on {rndv_tl}"),
            (Some(l), _) if l.put => format!("rendezvous put_zcopy on {rndv_tl}"),
            _ => format!("rendezvous, data in active messages on {am}"),
        };
        let fmt = |n: usize| if n == usize::MAX { "inf".to_string() } else { n.to_string() };
        let mut lines = vec![format!("[ucp] endpoint to '{}' (tag send)", ep.remote.name)];
        let mut lo = 0usize;
        let rt = c.rndv_thresh;
        let mut range = |hi: usize, what: String| {
            let hi = hi.min(rt);
            if hi > lo {
                lines.push(format!("[ucp]   {}..{}: {what}", lo, fmt(if hi == usize::MAX { hi } else { hi - 1 })));
                lo = hi;
            }
        };
        range(c.short_lim, format!("eager short on {am}"));
        range(single.saturating_add(1).min(c.zcopy_thresh), format!("eager bcopy on {am}"));
        range(c.zcopy_thresh, format!("eager bcopy, multi-fragment on {am}"));
        range(usize::MAX, format!("eager zero-copy on {am} (contiguous buffers; others bcopy)"));
        if rt != usize::MAX {
            lines.push(format!("[ucp]   {rt}..inf: {rndv}"));
        }
        lines.push(format!("[ucp]   tag send sync: eager sync below {}, {rndv} above", fmt(rt)));
        for l in lines {
            println!("{l}");
        }
    }

    /// Creates an endpoint to the worker with packed address `addr`.
    pub fn ep_create(&self, addr: &[u8]) -> UcsResult<Id> {
        let remote = WorkerAddress::unpack(addr)?;
        let sn = self.next_sn(remote.uuid);
        let claimed = self.conn.borrow_mut().unexpected.remove(&(remote.uuid, sn));
        if let Some(id) = claimed.filter(|&id| self.ep(id).is_some()) {
            return Ok(id);
        }
        let uuid = remote.uuid;
        let ep = self.build_ep(remote, sn)?;
        let id = ep.id.get();
        let ep_addrs = match self.p2p_addresses(&ep) {
            Ok(a) => a,
            Err(e) => {
                self.ep_destroy(&ep);
                return Err(e);
            }
        };
        // The request must fit the wireup lane in one message (no addresses: one count byte).
        let need = WireupMsg::FIXED + 4 + self.packed.len() + ep_addrs.len().max(1);
        let packed: Rc<[u8]> = self.packed.clone().into();
        let request = Ctrl::Wireup(WireupOut {
            kind: wire::wireup::REQUEST,
            conn_sn: sn,
            src_uuid: self.address.uuid,
            src_ep: id.raw(),
            dst_ep: 0,
            with_address: Some(packed),
            ep_addrs,
        });
        let wl = &self.ifaces[ep.uct_eps[ep.wireup_idx].pair.local];
        if need > wl.attr.am.max_bcopy {
            tracing::error!(
                "ucp: the wireup request to '{}' ({need} bytes: worker address and endpoint addresses) does not fit \
                 one message of the wireup lane {} ({} bytes); use fewer transports in UCX_TLS",
                ep.remote.name,
                wl.resource.desc.tl.full_name(),
                wl.attr.am.max_bcopy
            );
            self.ep_destroy(&ep);
            return Err(Status::ExceedsLimit);
        }
        self.conn.borrow_mut().expected.insert((uuid, sn), id);
        self.send_ctrl(&ep, request);
        Ok(id)
    }

    /// The encoded addresses of an endpoint's endpoint-to-endpoint lanes (empty: none).
    fn p2p_addresses(&self, ep: &Ep) -> UcsResult<Vec<u8>> {
        if !ep.has_p2p() {
            return Ok(Vec::new());
        }
        let mut addrs = Vec::new();
        for l in ep.uct_eps.iter().filter(|l| l.p2p) {
            addrs.push((l.pair, l.ep.address()?));
        }
        let list: Vec<EpAddr<'_>> = addrs
            .iter()
            .map(|(p, a)| EpAddr { sender_iface: p.local as u8, receiver_iface: p.remote as u8, addr: a })
            .collect();
        WireupMsg::encode_ep_addrs(&list).ok_or(Status::InvalidParam)
    }

    /// Connects the endpoint-to-endpoint lanes of `ep` not yet connected to the addresses in a
    /// peer's wireup message.
    fn connect_p2p(&self, ep: &Ep, m: &WireupMsg<'_>) -> UcsResult<()> {
        for l in ep.uct_eps.iter().filter(|l| l.p2p && !l.connected.get()) {
            let lane_name = || self.ifaces[l.pair.local].resource.desc.tl.full_name();
            let Some(a) = m
                .ep_addrs()
                .find(|a| a.sender_iface as usize == l.pair.remote && a.receiver_iface as usize == l.pair.local)
            else {
                tracing::warn!("wireup: '{}' sent no endpoint address for lane {}", ep.remote.name, lane_name());
                return Err(Status::InvalidAddr);
            };
            let dev_addr = &ep.remote.ifaces[l.pair.remote].dev_addr;
            if let Err(e) = l.ep.connect_to_ep(dev_addr, a.addr) {
                tracing::warn!("wireup: cannot connect lane {} to '{}': {e}", lane_name(), ep.remote.name);
                return Err(e);
            }
            l.connected.set(true);
        }
        Ok(())
    }

    /// A wireup message arrived.
    pub fn on_wireup(&self, m: &WireupMsg<'_>) {
        match m.kind {
            wire::wireup::REQUEST => self.on_wireup_request(m),
            _ => {
                let what = if m.kind == wire::wireup::REPLY { "wireup reply" } else { "wireup ack" };
                let Some(ep) = self.ep_from_wire(m.dst_ep, what) else { return };
                if ep.remote.uuid != m.src_uuid || ep.conn_sn != m.conn_sn {
                    tracing::warn!("{what}: from an unexpected worker; dropped");
                    return;
                }
                if ep.error().is_some() {
                    return;
                }
                ep.remote_id.set(m.src_ep);
                if m.kind == wire::wireup::REPLY {
                    if let Err(e) = self.connect_p2p(&ep, m) {
                        self.on_ep_error(ep.id.get(), e);
                        return;
                    }
                    if ep.has_p2p() {
                        self.send_ctrl(&ep, self.wireup_msg(&ep, wire::wireup::ACK, m.src_ep, Vec::new()));
                    }
                }
                self.ep_connected(&ep);
            }
        }
    }

    fn wireup_msg(&self, ep: &Ep, kind: u8, dst_ep: u64, ep_addrs: Vec<u8>) -> Ctrl {
        Ctrl::Wireup(WireupOut {
            kind,
            conn_sn: ep.conn_sn,
            src_uuid: self.address.uuid,
            src_ep: ep.id.get().raw(),
            dst_ep,
            with_address: None,
            ep_addrs,
        })
    }

    fn on_wireup_request(&self, m: &WireupMsg<'_>) {
        let remote = match WorkerAddress::unpack(m.address) {
            Ok(a) if a.uuid == m.src_uuid => a,
            Ok(_) => {
                tracing::warn!("wireup: request's address does not match its sender; dropped");
                return;
            }
            Err(e) => {
                tracing::warn!("wireup: request with a bad address ({e}); dropped");
                return;
            }
        };
        let key = (m.src_uuid, m.conn_sn);
        let found = {
            let mut c = self.conn.borrow_mut();
            c.expected.remove(&key).or_else(|| c.unexpected.get(&key).copied())
        };
        let ep = match found.and_then(|id| self.ep(id)) {
            Some(ep) => ep,
            None => match self.build_ep(remote, m.conn_sn) {
                Ok(ep) => {
                    self.conn.borrow_mut().unexpected.insert(key, ep.id.get());
                    ep
                }
                Err(e) => {
                    tracing::warn!("wireup: cannot create an endpoint for a peer's request: {e}");
                    return;
                }
            },
        };
        if ep.error().is_some() {
            return;
        }
        ep.remote_id.set(m.src_ep);
        let addrs = self.connect_p2p(&ep, m).and_then(|()| self.p2p_addresses(&ep));
        let ep_addrs = match addrs {
            Ok(a) => a,
            Err(e) => {
                self.on_ep_error(ep.id.get(), e);
                return;
            }
        };
        let p2p = ep.has_p2p();
        self.send_ctrl(&ep, self.wireup_msg(&ep, wire::wireup::REPLY, m.src_ep, ep_addrs));
        // With endpoint-to-endpoint lanes, the requester's lanes are connected only when its
        // reply or ack says so.
        if !p2p {
            self.ep_connected(&ep);
        }
    }

    /// Wireup completed: replay what was queued.
    fn ep_connected(&self, ep: &Rc<Ep>) {
        if ep.status.get() != EpStatus::Connecting {
            return;
        }
        ep.status.set(EpStatus::Connected);
        self.replay(ep);
    }

    /// Lanes of an endpoint with their transports.
    pub fn ep_query(&self, id: Id) -> UcsResult<EpInfo> {
        let ep = self.ep(id).ok_or(Status::InvalidParam)?;
        let mut lanes = Vec::new();
        let mut add = |usage: &'static str, p: lanes::LanePair| {
            let r = &self.address.ifaces[p.local];
            lanes.push(LaneInfo { usage, transport: r.tl_name.clone(), device: r.dev_name.clone() });
        };
        if let Some(p) = ep.lanes.am {
            add("am", p);
        }
        if let Some(p) = ep.lanes.wireup.filter(|&w| Some(w) != ep.lanes.am) {
            add("wireup", p);
        }
        for p in &ep.lanes.rma {
            add("rma", *p);
        }
        if let Some(p) = ep.lanes.amo {
            add("amo", p);
        }
        for p in &ep.lanes.rndv {
            add("rndv", *p);
        }
        Ok(EpInfo {
            remote_name: ep.remote.name.clone(),
            connected: ep.status.get() == EpStatus::Connected,
            lanes,
            rndv_thresh: ep.cfg.rndv_thresh,
            short_lim: ep.cfg.short_lim,
        })
    }

    /// Starts closing endpoint `id`. Force: every outstanding operation completes with
    /// `Canceled` and the endpoint goes now. Flush: queued and outstanding operations finish,
    /// the transports flush, then the endpoint goes.
    pub fn ep_close(&self, id: Id, force: bool, rid: Id) {
        let Some(ep) = self.ep(id) else {
            self.finish(rid, Status::Ok);
            return;
        };
        if force || ep.error().is_some() {
            ep.status.set(EpStatus::Closed);
            self.fail_ep_requests(&ep, Status::Canceled);
            self.ep_destroy(&ep);
            self.finish(rid, Status::Ok);
        } else {
            self.closing.borrow_mut().push(rid);
        }
    }

    fn ep_destroy(&self, ep: &Ep) {
        let id = ep.id.get();
        {
            let mut c = self.conn.borrow_mut();
            c.expected.retain(|_, v| *v != id);
            c.unexpected.retain(|_, v| *v != id);
        }
        self.unpark_dropped(ep);
        self.pending_eps.borrow_mut().retain(|e| *e != id);
        let gone = self.eps.borrow_mut().remove(id);
        drop(gone);
    }

    /// Flush-closes whose endpoints have drained.
    pub fn progress_closing(&self) -> usize {
        let list = std::mem::take(&mut *self.closing.borrow_mut());
        let mut n = 0;
        let mut again = Vec::new();
        for rid in list {
            let ep_id = match self.reqs.borrow().get(rid) {
                Some(crate::request::ReqState { kind: crate::request::ReqKind::Close(c), .. }) => c.ep,
                _ => continue,
            };
            let Some(ep) = self.ep(ep_id) else {
                self.finish(rid, Status::Ok);
                continue;
            };
            let busy = !ep.pending.borrow().is_empty()
                || ep.status.get() == EpStatus::Connecting
                || self.reqs.borrow().iter().any(|(_, r)| {
                    r.status == Status::InProgress
                        && matches!(&r.kind, crate::request::ReqKind::Send(s) if s.ep == ep_id)
                });
            if ep.error().is_some() {
                self.ep_destroy(&ep);
                self.finish(rid, Status::Ok);
                n += 1;
                continue;
            }
            let flushed = !busy
                && ep
                    .uct_eps
                    .iter()
                    .all(|l| matches!(l.ep.flush(uct::FlushFlags::LOCAL, None), Ok(ucs::Outcome::Done(_)) | Err(_)));
            if flushed {
                ep.status.set(EpStatus::Closed);
                self.ep_destroy(&ep);
                self.finish(rid, Status::Ok);
                n += 1;
            } else {
                again.push(rid);
            }
        }
        self.closing.borrow_mut().extend(again);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct::DeviceType;

    fn rec(tl: &str, bw_mbs: f64) -> IfaceRecord {
        IfaceRecord {
            tl_name: tl.into(),
            dev_name: "memory".into(),
            dev_type: DeviceType::Shm,
            aux: false,
            flags: uct::IfaceFlags::empty(),
            latency_ns: 80.0,
            bandwidth: bw_mbs * 1024.0 * 1024.0,
            overhead_ns: 10.0,
            dev_addr: vec![1],
            iface_addr: vec![2],
        }
    }

    #[test]
    fn auto_scheme_follows_the_faster_lane() {
        // posix next to cma (the transports' models): fragments on the AM lane.
        let (posix, cma) = (rec("posix", 15360.0), rec("cma", 11145.0));
        assert_eq!(auto_rndv_scheme(&posix, Some(&cma), false), RndvScheme::Am);
        // The same lanes for a worker that sleeps on events: one event per transfer.
        assert_eq!(auto_rndv_scheme(&posix, Some(&cma), true), RndvScheme::Auto);
        // One network lane for both (rc): a tie, zero-copy.
        let rc = rec("rc_verbs", 12000.0);
        assert_eq!(auto_rndv_scheme(&rc, Some(&rc), false), RndvScheme::Auto);
        // A zero-copy lane faster than the AM lane.
        assert_eq!(auto_rndv_scheme(&rec("ud_verbs", 3000.0), Some(&rc), false), RndvScheme::Auto);
        // No zero-copy lane: `auto` (which then sends fragments anyway).
        assert_eq!(auto_rndv_scheme(&rec("self", 19360.0), None, false), RndvScheme::Auto);
    }
}
