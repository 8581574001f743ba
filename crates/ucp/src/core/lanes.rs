//! An endpoint's transport endpoints (its lanes, as the driver holds them): built from the
//! lane selection, connected endpoint to endpoint during wireup, parked on when full, queried.

use std::cell::{Cell, OnceCell};
use std::rc::{Rc, Weak};

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::Core;
use crate::config::RndvScheme;
use crate::engine::{EpStatus, Lane};
use crate::proto::{EpConfig, LaneModels, RndvCaps};
use crate::wire::{self, EpAddr, WireupMsg};
use crate::wireup::address::{IfaceRecord, WorkerAddress};
use crate::wireup::lanes::{self, LaneLimits, LanePair, Lanes};

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

/// The result of [`Endpoint::query`](crate::Endpoint::query).
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

/// The rendezvous lane of an endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RndvLane {
    /// Index into [`EpLanes::uct_eps`].
    pub uct: usize,
    /// Local interface index.
    pub iface: usize,
}

/// The lanes of one endpoint: what the engine keeps for the driver with the endpoint's
/// protocol state, and hands back with each transmission.
pub(crate) struct EpLanes {
    /// The endpoint's id.
    pub id: Id,
    pub uct_eps: Vec<UctLane>,
    pub am_idx: usize,
    pub wireup_idx: usize,
    pub rndv: Option<RndvLane>,
    /// The remote-memory-access lanes, best first (indices into `uct_eps`; with the RMA or
    /// AMO features).
    pub rma: Vec<u8>,
    /// The atomic lane (with the AMO features).
    pub amo: Option<u8>,
    /// The tag lane: tagged sends through the transport's tag matching (with the TAG feature,
    /// where both sides have it on).
    pub tag: Option<u8>,
    /// The endpoint's [`LaneWake`], made the first time it parks.
    wake: OnceCell<uct::PendingHandle>,
    /// The lane whose pending queue holds the wake.
    parked_on: Cell<Option<usize>>,
}

impl EpLanes {
    /// The uct endpoint of the AM lane.
    #[inline(always)]
    pub fn am(&self) -> &dyn uct::Ep {
        &*self.uct_eps[self.am_idx].ep
    }

    /// The uct endpoint of `lane` (the AM lane for a rendezvous lane the endpoint lacks).
    #[inline]
    pub fn uct(&self, lane: Lane) -> &dyn uct::Ep {
        let i = match lane {
            Lane::Am => self.am_idx,
            Lane::Wireup => self.wireup_idx,
            Lane::Rndv => self.rndv.map_or(self.am_idx, |r| r.uct),
            Lane::Tag => self.tag.map_or(self.am_idx, |t| t as usize),
            Lane::Uct(i) => i as usize,
        };
        &*self.uct_eps[i].ep
    }

    /// Parks the endpoint on `lane`: its wake goes into the lane's pending queue. False when the
    /// lane has resources by now (nothing queued: retry).
    pub fn park(&self, lane: Lane, core: &Weak<Core>) -> bool {
        let i = match lane {
            Lane::Am => self.am_idx,
            Lane::Rndv => self.rndv.map_or(self.am_idx, |r| r.uct),
            Lane::Tag => self.tag.map_or(self.am_idx, |t| t as usize),
            Lane::Uct(i) if (i as usize) < self.uct_eps.len() => i as usize,
            Lane::Wireup | Lane::Uct(_) => return false,
        };
        let wake = self.wake.get_or_init(|| Rc::new(LaneWake { core: core.clone(), ep: self.id }));
        let parked = self.uct_eps[i].ep.pending_add(wake.clone()).is_ok();
        if parked {
            self.parked_on.set(Some(i));
        }
        parked
    }

    /// Takes the endpoint's wake off the lane it waits on.
    pub fn unpark(&self) {
        if let Some(i) = self.parked_on.take() {
            self.uct_eps[i].ep.pending_purge(&mut drop);
        }
    }

    /// Whether some lane connects endpoint to endpoint.
    pub fn has_p2p(&self) -> bool {
        self.uct_eps.iter().any(|l| l.p2p)
    }
}

/// What an endpoint parks in a lane's pending queue (`uct_pending_req_t` of UCX's
/// endpoint-level pending): the transport calls it when the lane may send again, and the
/// endpoint's queue replays.
pub(crate) struct LaneWake {
    core: Weak<Core>,
    ep: Id,
}

impl uct::PendingReq for LaneWake {
    fn progress(&self) -> uct::PendingOutcome {
        match self.core.upgrade() {
            // Still blocked: stay queued, but let the transport serve other endpoints first.
            Some(core) if core.unpark(self.ep) => uct::PendingOutcome::KeepContinue,
            _ => uct::PendingOutcome::Done,
        }
    }
}

/// What an endpoint is built from.
pub(crate) struct Built {
    pub lanes: EpLanes,
    pub cfg: EpConfig,
    pub selection: Lanes,
    /// The encoded addresses of its endpoint-to-endpoint lanes (empty: none).
    pub p2p_addrs: Vec<u8>,
}

impl Core {
    /// Builds the lanes of endpoint `id` towards `remote`: the lane selection, a transport
    /// endpoint per lane, the protocol switch points.
    pub(crate) fn build_lanes(&self, remote: &WorkerAddress, id: Id) -> UcsResult<Built> {
        let cfg = self.ctx.config();
        let limits = LaneLimits {
            max_rndv_lanes: cfg.max_rndv_lanes.max(1),
            atomics: self.ctx.features().intersects(crate::context::Features::AMO32 | crate::context::Features::AMO64),
            tag: self.ctx.features().contains(crate::context::Features::TAG),
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
        let selection = lanes::select(&self.address, remote, limits, &reachable);
        let Some(am) = selection.am else {
            tracing::error!(
                "ucp: worker '{}' is unreachable: no common transport with active messages (local: {}; remote: {})",
                remote.name,
                self.address.ifaces.iter().map(|i| i.tl_name.as_str()).collect::<Vec<_>>().join(","),
                remote.ifaces.iter().map(|i| i.tl_name.as_str()).collect::<Vec<_>>().join(","),
            );
            return Err(Status::Unreachable);
        };
        let am_attr = &self.ifaces[am.local].attr;
        if am_attr.am.max_bcopy <= wire::len::MAX_DATA_HDR {
            tracing::error!(
                "ucp: the AM lane {} to '{}' carries {} bytes per message, not more than UCP's headers",
                self.ifaces[am.local].name(),
                remote.name,
                am_attr.am.max_bcopy
            );
            return Err(Status::Unsupported);
        }
        // The selection pairs an endpoint-to-endpoint AM lane with a wireup lane.
        let wireup = selection.wireup.unwrap_or(am);
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
        let rma_feature = self.ctx.features().intersects(
            crate::context::Features::RMA | crate::context::Features::AMO32 | crate::context::Features::AMO64,
        );
        type Indices = (usize, usize, Option<(RndvLane, RndvCaps)>, Vec<u8>, Option<u8>, Option<u8>);
        let built = (|| -> UcsResult<Indices> {
            let am_idx = ep_for(am)?;
            let wireup_idx = ep_for(wireup)?;
            let rndv = match selection.rndv.first() {
                Some(&p) => {
                    let (l, r) = (&self.address.ifaces[p.local], &remote.ifaces[p.remote]);
                    let both = |f: uct::IfaceFlags| l.flags.contains(f) && r.flags.contains(f);
                    let attr = &self.ifaces[p.local].attr;
                    let (get, put) = (both(uct::IfaceFlags::GET_ZCOPY), both(uct::IfaceFlags::PUT_ZCOPY));
                    // A message must fit every operation the lane may use for it.
                    let limit = |ok: bool, v: usize| if ok { v } else { usize::MAX };
                    let max_zcopy = limit(get, attr.get.max_zcopy).min(limit(put, attr.put.max_zcopy)).max(1);
                    Some((RndvLane { uct: ep_for(p)?, iface: p.local }, RndvCaps { get, put, max_zcopy }))
                }
                None => None,
            };
            let mut rma = Vec::new();
            let mut amo = None;
            if rma_feature {
                for &p in &selection.rma {
                    rma.push(ep_for(p)? as u8);
                }
                if let Some(p) = selection.amo {
                    amo = Some(ep_for(p)? as u8);
                }
            }
            let tag = match selection.tag {
                Some(p) => Some(ep_for(p)? as u8),
                None => None,
            };
            Ok((am_idx, wireup_idx, rndv, rma, amo, tag))
        })();
        let (am_idx, wireup_idx, rndv, rma, amo, tag) = built.inspect_err(|e| {
            tracing::error!("ucp: cannot connect to '{}': {e}", remote.name);
        })?;
        for l in &uct_eps {
            self.activate(l.pair.local);
        }
        let models = LaneModels {
            am: (am_attr, &self.address.ifaces[am.local]),
            rndv: rndv.map(|(_, caps)| (caps, &self.address.ifaces[selection.rndv[0].local])),
            tag: selection.tag.map(|p| &self.ifaces[p.local].attr),
        };
        let mut ep_cfg = EpConfig::new(&models, cfg, self.ctx.features().contains(crate::context::Features::WAKEUP));
        ep_cfg.uct_lanes = uct_eps.len() as u8;
        let lanes = EpLanes {
            id,
            uct_eps,
            am_idx,
            wireup_idx,
            rndv: rndv.map(|(l, _)| l),
            rma,
            amo,
            tag,
            wake: OnceCell::new(),
            parked_on: Cell::new(None),
        };
        let p2p_addrs = p2p_addresses(&lanes)?;
        if cfg.proto_info {
            self.print_proto_info(&remote.name, &selection, &ep_cfg);
        }
        Ok(Built { lanes, cfg: ep_cfg, selection, p2p_addrs })
    }

    /// Connects the endpoint-to-endpoint lanes of `lanes` not yet connected to the addresses a
    /// peer sent (encoded as in a wireup message).
    pub(crate) fn connect_p2p(&self, lanes: &EpLanes, remote: &WorkerAddress, addrs: &[u8]) -> UcsResult<()> {
        let m = WireupMsg { kind: 0, conn_sn: 0, src_uuid: 0, src_ep: 0, dst_ep: 0, address: &[], ep_addrs: addrs };
        for l in lanes.uct_eps.iter().filter(|l| l.p2p && !l.connected.get()) {
            let lane_name = || self.ifaces[l.pair.local].name();
            let Some(a) = m
                .ep_addrs()
                .find(|a| a.sender_iface as usize == l.pair.remote && a.receiver_iface as usize == l.pair.local)
            else {
                tracing::warn!("wireup: '{}' sent no endpoint address for lane {}", remote.name, lane_name());
                return Err(Status::InvalidAddr);
            };
            let dev_addr = &remote.ifaces[l.pair.remote].dev_addr;
            if let Err(e) = l.ep.connect_to_ep(dev_addr, a.addr) {
                tracing::warn!("wireup: cannot connect lane {} to '{}': {e}", lane_name(), remote.name);
                return Err(e);
            }
            l.connected.set(true);
        }
        Ok(())
    }

    /// Prints which protocol each message size range uses (`UCX_PROTO_INFO=y`).
    fn print_proto_info(&self, remote: &str, lanes: &Lanes, c: &EpConfig) {
        let name =
            |p: Option<LanePair>| p.map(|p| self.address.ifaces[p.local].tl_name.clone()).unwrap_or_else(|| "-".into());
        let am = name(lanes.am);
        let rndv_tl = name(lanes.rndv.first().copied());
        let single = c.bcopy_max.saturating_sub(wire::len::EAGER_ONLY);
        let rndv = match (c.rndv, c.scheme) {
            (_, RndvScheme::Am) | (None, _) => format!("rendezvous, data in active messages on {am}"),
            (Some(l), RndvScheme::PutZcopy) if l.put => format!("rendezvous put_zcopy on {rndv_tl}"),
            (Some(l), RndvScheme::GetZcopy | RndvScheme::Auto) if l.get => format!("rendezvous get_zcopy on {rndv_tl}"),
            (Some(l), _) if l.put => format!("rendezvous put_zcopy on {rndv_tl}"),
            _ => format!("rendezvous, data in active messages on {am}"),
        };
        let fmt = |n: usize| if n == usize::MAX { "inf".to_string() } else { n.to_string() };
        if let (Some(t), Some(p)) = (c.tag, lanes.tag) {
            // Through the tag lane (select_tag_lane).
            let tl = &self.ifaces[p.local];
            let how = if tl.attr.tag.emulated { ", emulated tag matching" } else { "" };
            let tag = format!("{}{how}", tl.resource.desc.tl.tl_name);
            let mut lines = vec![format!("[ucp] endpoint to '{remote}' (tag send, through the tag lane {tag})")];
            let top = t.bcopy_max.min(c.rndv_thresh.saturating_sub(1));
            if let Some(m) = t.short_max {
                lines.push(format!("[ucp]   0..{}: tag eager short (contiguous, not sync)", m.min(top)));
            }
            lines.push(format!("[ucp]   ..{top}: tag eager bcopy (sync: immediate value, acknowledged by tag)"));
            let rndv_sw = format!("rendezvous request through the tag lane, then {rndv}");
            if t.hw_rndv_max > 0 {
                lines.push(format!(
                    "[ucp]   {}..{}: offloaded rendezvous (the receiver's transport reads; contiguous), else {rndv_sw}",
                    top + 1,
                    fmt(t.hw_rndv_max)
                ));
            } else {
                lines.push(format!("[ucp]   {}..inf: {rndv_sw}", top + 1));
            }
            for l in lines {
                println!("{l}");
            }
            return;
        }
        let mut lines = vec![format!("[ucp] endpoint to '{remote}' (tag send)")];
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

    /// Lanes of an endpoint with their transports (`ucp_ep_query`).
    pub(crate) fn ep_query(&self, id: Id) -> UcsResult<EpInfo> {
        let e = self.engine.borrow();
        let ep = e.sh.eps.get(id).ok_or(Status::InvalidParam)?;
        let mut lanes = Vec::new();
        let mut add = |usage: &'static str, p: LanePair| {
            let r = &self.address.ifaces[p.local];
            lanes.push(LaneInfo { usage, transport: r.tl_name.clone(), device: r.dev_name.clone() });
        };
        let sel = &ep.lanes;
        if let Some(p) = sel.am {
            add("am", p);
        }
        if let Some(p) = sel.wireup.filter(|&w| Some(w) != sel.am) {
            add("wireup", p);
        }
        for p in &sel.rma {
            add("rma", *p);
        }
        if let Some(p) = sel.amo {
            add("amo", p);
        }
        for p in &sel.rndv {
            add("rndv", *p);
        }
        if let Some(p) = sel.tag {
            add("tag", p);
        }
        Ok(EpInfo {
            remote_name: ep.remote.name.clone(),
            connected: ep.status == EpStatus::Connected,
            lanes,
            rndv_thresh: ep.cfg.rndv_thresh,
            short_lim: ep.cfg.short_lim,
        })
    }
}

/// The encoded addresses of the endpoint-to-endpoint lanes of `lanes` (empty: none).
fn p2p_addresses(lanes: &EpLanes) -> UcsResult<Vec<u8>> {
    if !lanes.has_p2p() {
        return Ok(Vec::new());
    }
    let mut addrs = Vec::new();
    for l in lanes.uct_eps.iter().filter(|l| l.p2p) {
        addrs.push((l.pair, l.ep.address()?));
    }
    let list: Vec<EpAddr<'_>> = addrs
        .iter()
        .map(|(p, a)| EpAddr { sender_iface: p.local as u8, receiver_iface: p.remote as u8, addr: a })
        .collect();
    WireupMsg::encode_ep_addrs(&list).ok_or(Status::InvalidParam)
}
