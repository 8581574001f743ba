//! The driver's half of remote memory access and atomics: remote keys unpacked onto an
//! endpoint's lanes (`ucp_ep_rkey_unpack`, UCX's rkey configuration), the start of an
//! operation (bounds, route, the direct call), its transmissions as uct calls, and the flush
//! of a lane.

use std::ptr::NonNull;
use std::rc::Rc;

use ucs::idtable::Id;
use ucs::{Outcome, Status, UcsResult};

use super::lanes::EpLanes;
use super::Core;
use crate::config::Thresh;
use crate::dt::UserBuf;
use crate::engine::{Lane, TxResult, TxStatus, ZcDone};
use crate::proto::select::{select_rma, AmoCaps, RkeyRoutes, RmaCaps, RmaOpKind, RmaProto, RmaRoute};
use crate::request::{RequestFlags, RequestParam};
use crate::rma::{AmoArgs, RmaReq, RmaTx};
use crate::wire::rkey::PackedRkey;

/// A remote key unpacked on an endpoint.
pub(crate) struct Rkey {
    /// The endpoint it was unpacked on.
    pub ep: Id,
    /// The region on the peer.
    pub base: u64,
    pub len: u64,
    /// The transport key of each lane of the endpoint that has one.
    pub keys: Vec<Option<uct::RemoteKey>>,
    /// Which lane takes each kind of operation.
    pub routes: RkeyRoutes,
    /// Where the region is mapped in this process, if a transport mapped it (`rkey_ptr`).
    pub local: Option<(NonNull<u8>, usize)>,
    /// The components the key had entries for (for messages).
    pub components: String,
    /// The endpoint's lanes (fixed for its lifetime), held so that [`Rkey::direct`]'s
    /// transport endpoints stay alive.
    _io: Rc<EpLanes>,
    /// The largest contiguous put the fast path sends as one `put_short` or `put_bcopy` (0:
    /// none): `routes.put`'s short limit, or its bcopy limit below the zero-copy threshold.
    pub put_direct_max: usize,
    /// The largest contiguous get the fast path makes as one `get_short` or `get_bcopy` (as
    /// `put_direct_max`).
    pub get_direct_max: usize,
    /// The transport endpoint and key of the put, get and atomic routes' lanes where the
    /// lane has a key (checked once here, used by the fast path).
    pub direct: [Option<DirectLane>; 3],
    /// The endpoints' epoch (`Core::ep_epoch`) at which the fast path last found the endpoint
    /// ready and marked it as having unflushed operations: while the epoch has not moved,
    /// neither can have changed.
    pub ready_epoch: std::cell::Cell<u64>,
}

/// A lane's transport endpoint and key, for the fast path ([`Rkey::direct`]): pointers into
/// the key's own `_io` (its endpoints, boxed) and `keys` (a vector never changed after the
/// unpack), so they live as long as the [`Rkey`] that holds them.
#[derive(Clone, Copy)]
pub(crate) struct DirectLane {
    ep: NonNull<dyn uct::Ep>,
    key: NonNull<uct::RemoteKey>,
}

/// [`Rkey::direct`]'s index of each kind of operation.
const DIRECT_PUT: usize = 0;
const DIRECT_GET: usize = 1;
const DIRECT_AMO: usize = 2;

/// The user's operation, as the API hands it to the driver.
pub(crate) struct RmaOp {
    pub kind: RmaOpKind,
    pub buf: UserBuf,
    pub remote: u64,
    pub rkey: Id,
    pub amo: AmoArgs,
}

fn op_name(kind: RmaOpKind) -> &'static str {
    match kind {
        RmaOpKind::Put => "put",
        RmaOpKind::Get => "get",
        RmaOpKind::Amo { .. } => "atomic",
    }
}

impl Core {
    /// Unpacks a peer's packed remote key on endpoint `ep_id` (`ucp_ep_rkey_unpack`): every
    /// field is checked, each lane of the endpoint gets the key of its memory domain, and the
    /// routes of puts, gets and atomics are resolved once.
    pub fn rkey_unpack(&self, ep_id: Id, bytes: &[u8]) -> UcsResult<(Id, Rc<Rkey>)> {
        let packed = PackedRkey::decode(bytes).map_err(|e| {
            tracing::error!("rkey_unpack: {e}");
            Status::from(e)
        })?;
        let io = {
            let e = self.engine.borrow();
            let Some(ep) = e.sh.eps.get(ep_id) else {
                tracing::error!("rkey_unpack: endpoint {ep_id:?} does not exist (closed?)");
                return Err(Status::InvalidParam);
            };
            if ep.remote.uuid != packed.uuid {
                tracing::error!(
                    "rkey_unpack: the key was packed by worker {:#x}, not by this endpoint's peer '{}' ({:#x})",
                    packed.uuid,
                    ep.remote.name,
                    ep.remote.uuid
                );
                return Err(Status::InvalidParam);
            }
            ep.io.clone()
        };
        let mut keys: Vec<Option<uct::RemoteKey>> = Vec::with_capacity(io.uct_eps.len());
        let mut first_err = None;
        for l in &io.uct_eps {
            let md = &self.ifaces[l.pair.local].md;
            let comp = md.component();
            let entry = packed.entries.iter().find(|e| e.component == comp.name());
            let key = match entry {
                Some(e) => match comp.rkey_unpack(e.key) {
                    Ok(k) if k.base() <= packed.address && k.length() >= packed.length => Some(k),
                    Ok(k) => {
                        tracing::error!(
                            "rkey_unpack: the {} key covers {:#x}+{}, not the region {:#x}+{}",
                            e.component,
                            k.base(),
                            k.length(),
                            packed.address,
                            packed.length
                        );
                        first_err.get_or_insert(Status::InvalidParam);
                        None
                    }
                    Err(err) => {
                        tracing::warn!("rkey_unpack: the {} key does not unpack here: {err}", e.component);
                        first_err.get_or_insert(err);
                        None
                    }
                },
                None => None,
            };
            keys.push(key);
        }
        if keys.iter().all(Option::is_none) {
            if let Some(e) = first_err {
                // Its memory domains' keys are stale (the peer unmapped the region, say).
                tracing::error!("rkey_unpack: no transport key of the remote key is valid: {e}");
                return Err(e);
            }
            // No lane reaches that memory itself: every operation is emulated over active
            // messages, and the peer checks what it is asked to touch.
        }
        let routes = self.routes(&io, &keys);
        if self.ctx.config().proto_info {
            let remote = self.engine.borrow().sh.eps.get(ep_id).map(|e| e.remote.name.clone()).unwrap_or_default();
            println!("[ucp] remote key {:#x}+{} of '{remote}'", packed.address, packed.length);
            for l in self.describe_routes(&io, &routes) {
                println!("[ucp]   {l}");
            }
        }
        let local = keys.iter().flatten().find_map(|k| {
            let (map, len) = k.local_mapping()?;
            // The mapping covers the key's region from its base.
            let off = usize::try_from(packed.address.checked_sub(k.base())?).ok()?;
            let avail = len.checked_sub(off)?;
            if (avail as u64) < packed.length {
                return None;
            }
            Some((NonNull::new(map.as_ptr().wrapping_add(off))?, packed.length as usize))
        });
        // The short limit, or the bcopy limit below the zero-copy threshold ([`select_rma`]'s
        // choice for a contiguous buffer).
        let direct_max = |c: RmaCaps| {
            let bcopy = if c.zcopy_max == 0 { c.bcopy_max } else { c.bcopy_max.min(c.zcopy_thresh.saturating_sub(1)) };
            c.short_max.max(bcopy)
        };
        let put_direct_max = routes.put.map_or(0, direct_max);
        let get_direct_max = routes.get.map_or(0, direct_max);
        let direct_of = |lane: Option<u8>| {
            let lane = lane? as usize;
            let key = keys.get(lane)?.as_ref()?;
            let ep: &dyn uct::Ep = &*io.uct_eps.get(lane)?.ep;
            Some(DirectLane { ep: NonNull::from(ep), key: NonNull::from(key) })
        };
        let direct = [
            direct_of(routes.put.map(|c| c.lane)),
            direct_of(routes.get.map(|c| c.lane)),
            direct_of(routes.amo.map(|a| a.lane)),
        ];
        let rkey = Rc::new(Rkey {
            direct,
            ep: ep_id,
            base: packed.address,
            len: packed.length,
            keys,
            routes,
            local,
            components: packed.entries.iter().map(|e| e.component).collect::<Vec<_>>().join(","),
            _io: io,
            put_direct_max,
            get_direct_max,
            ready_epoch: std::cell::Cell::new(u64::MAX),
        });
        let id = self.rkeys.borrow_mut().insert(rkey.clone());
        Ok((id, rkey))
    }

    /// Releases an unpacked key (`ucp_rkey_destroy`). Operations still queued with it fail.
    pub fn rkey_destroy(&self, id: Id) {
        let gone = self.rkeys.borrow_mut().remove(id);
        drop(gone);
    }

    /// The address in this process of remote address `addr` of key `id` (`ucp_rkey_ptr`):
    /// where a shared-memory transport mapped the region. `Unreachable` when no transport
    /// mapped it; `OutOfRange` outside the region.
    pub fn rkey_ptr(&self, id: Id, addr: u64) -> UcsResult<*mut u8> {
        let rkeys = self.rkeys.borrow();
        let k = rkeys.get(id).ok_or(Status::InvalidParam)?;
        let (map, len) = k.local.ok_or(Status::Unreachable)?;
        let off =
            addr.checked_sub(k.base).filter(|&o| o < len as u64 || (o == 0 && len == 0)).ok_or(Status::OutOfRange)?;
        Ok(map.as_ptr().wrapping_add(off as usize))
    }

    /// The routes of a key whose transport keys are `keys` on the lanes `io`.
    fn routes(&self, io: &EpLanes, keys: &[Option<uct::RemoteKey>]) -> RkeyRoutes {
        use uct::IfaceFlags as F;
        let cfg = self.ctx.config();
        let caps = |lane: u8, get: bool| -> Option<RmaCaps> {
            keys.get(lane as usize)?.as_ref()?;
            let attr = &self.ifaces[io.uct_eps[lane as usize].pair.local].attr;
            let (ops, f_short, f_bcopy, f_zcopy) = if get {
                (&attr.get, F::GET_SHORT, F::GET_BCOPY, F::GET_ZCOPY)
            } else {
                (&attr.put, F::PUT_SHORT, F::PUT_BCOPY, F::PUT_ZCOPY)
            };
            let has = |f: F, v: usize| if attr.flags.contains(f) { v } else { 0 };
            let c = RmaCaps {
                lane,
                // A contiguous put goes short straight from the user's buffer, as far as the
                // lane takes it (a copy into a mapped segment: UCX's mm takes 4 GiB). Short
                // gets, and short pieces of an iov list (a lane with nothing else), go through
                // a stack buffer.
                short_max: has(
                    f_short,
                    if get || !attr.flags.intersects(f_bcopy | f_zcopy) {
                        ops.max_short.min(SHORT_BUF)
                    } else {
                        ops.max_short
                    },
                ),
                bcopy_max: has(f_bcopy, ops.max_bcopy),
                zcopy_max: has(f_zcopy, ops.max_zcopy),
                zcopy_thresh: match cfg.zcopy_thresh {
                    Thresh::Fixed(t) => t,
                    Thresh::Auto => has(f_bcopy, ops.max_bcopy).saturating_add(1),
                },
            };
            (c.short_max > 0 || c.bcopy_max > 0 || c.zcopy_max > 0).then_some(c)
        };
        let put = io.rma.iter().find_map(|&l| caps(l, false));
        let get = io.rma.iter().find_map(|&l| caps(l, true));
        // One mechanism per location: the atomic lane serves a key only if it does every
        // operation, at every size the context asked for; otherwise every atomic on that
        // memory is emulated (the target's CPU atomics, as the shared-memory lanes use).
        // The atomic lane first, then the other lanes that reach memory (the key's memory may
        // be another transport's: a sysv segment when the atomic lane is posix).
        let mechanism = self.atomic_mechanism();
        let mut candidates = io.amo.into_iter().chain(io.rma.iter().copied());
        let amo = candidates.find_map(|lane| {
            keys.get(lane as usize)?.as_ref()?;
            let attr = &self.ifaces[io.uct_eps[lane as usize].pair.local].attr;
            if !attr.flags.contains(mechanism) || !self.does_every_atomic(attr) {
                return None;
            }
            Some(AmoCaps {
                lane,
                post32: attr.atomic32.op_flags,
                post64: attr.atomic64.op_flags,
                fetch32: attr.atomic32.fop_flags,
                fetch64: attr.atomic64.fop_flags,
            })
        });
        // Emulation over the AM lane: a put piece is one active message after its header.
        let am_bcopy = self.ifaces[io.uct_eps[io.am_idx].pair.local].attr.am.max_bcopy;
        let sw_put_piece = am_bcopy.checked_sub(16).filter(|&n| n > 0);
        RkeyRoutes { put, get, amo, sw_put_piece }
    }

    /// The atomic mechanism of this worker (`UCX_ATOMIC_MODE`): `ATOMIC_CPU` or
    /// `ATOMIC_DEVICE`. `guess` is the device's when some interface offers device atomics for
    /// every operation the context asked for, else the CPU's.
    pub(crate) fn atomic_mechanism(&self) -> uct::IfaceFlags {
        use crate::config::AtomicMode;
        match self.ctx.config().atomic_mode {
            AtomicMode::Cpu => uct::IfaceFlags::ATOMIC_CPU,
            AtomicMode::Device => uct::IfaceFlags::ATOMIC_DEVICE,
            AtomicMode::Guess => {
                let device = self
                    .ifaces
                    .iter()
                    .any(|w| w.attr.flags.contains(uct::IfaceFlags::ATOMIC_DEVICE) && self.does_every_atomic(&w.attr));
                if device {
                    uct::IfaceFlags::ATOMIC_DEVICE
                } else {
                    uct::IfaceFlags::ATOMIC_CPU
                }
            }
        }
    }

    /// Whether an interface does every atomic operation, with and without result, at every
    /// size the context's features ask for (`AMO32`, `AMO64`).
    fn does_every_atomic(&self, attr: &uct::IfaceAttr) -> bool {
        use crate::context::Features;
        let post = uct::AtomicOps::ADD | uct::AtomicOps::AND | uct::AtomicOps::OR | uct::AtomicOps::XOR;
        let fetch = post | uct::AtomicOps::SWAP | uct::AtomicOps::CSWAP;
        let full = |c: &uct::AtomicCaps| c.op_flags.contains(post) && c.fop_flags.contains(fetch);
        let f = self.ctx.features();
        (!f.contains(Features::AMO32) || full(&attr.atomic32)) && (!f.contains(Features::AMO64) || full(&attr.atomic64))
    }

    /// The lines `UCX_PROTO_INFO` prints for a key: how each kind of operation reaches it.
    fn describe_routes(&self, io: &EpLanes, r: &RkeyRoutes) -> Vec<String> {
        let name = |lane: u8| {
            io.uct_eps
                .get(lane as usize)
                .map_or("?".to_string(), |l| self.ifaces[l.pair.local].resource.desc.tl.tl_name.clone())
        };
        let fmt = |n: usize| if n == usize::MAX { "inf".to_string() } else { n.to_string() };
        let xfer = |what: &str, c: Option<RmaCaps>| -> String {
            let Some(c) = c else {
                return match r.sw_put_piece {
                    Some(_) => format!("{what}: emulated over active messages on {}", name(io.am_idx as u8)),
                    None => format!("{what}: unreachable"),
                };
            };
            let mut parts = Vec::new();
            if c.short_max > 0 {
                parts.push(format!("short up to {}", c.short_max));
            }
            if c.bcopy_max > 0 {
                parts.push(format!("bcopy pieces of {}", c.bcopy_max));
            }
            if c.zcopy_max > 0 {
                let from = if c.bcopy_max > 0 { format!(" from {}", fmt(c.zcopy_thresh)) } else { String::new() };
                parts.push(format!("zcopy{from} (pieces of {})", fmt(c.zcopy_max)));
            }
            format!("{what}: {} on {}", parts.join(", "), name(c.lane))
        };
        let amo = match r.amo {
            Some(a) => {
                let how = if self.atomic_mechanism() == uct::IfaceFlags::ATOMIC_DEVICE { "device" } else { "cpu" };
                format!("atomics: {how} atomics on {}", name(a.lane))
            }
            None if r.sw_put_piece.is_some() => {
                format!("atomics: emulated over active messages on {}", name(io.am_idx as u8))
            }
            None => "atomics: unreachable".to_string(),
        };
        vec![xfer("put", r.put), xfer("get", r.get), amo]
    }

    /// Starts a remote memory access or atomic on endpoint `ep_id` with key `rk` (the key of
    /// `op.rkey`); `Ok(None)`: completed at once. The common operations go straight to the
    /// transport ([`Core::put_direct`], [`Core::get_direct`], [`Core::amo_direct`]) before
    /// anything else is built.
    #[inline(always)]
    pub fn rma_start(&self, ep_id: Id, rk: &Rkey, op: RmaOp, mut param: RequestParam) -> UcsResult<Option<Id>> {
        // (The API checked that the key is this endpoint's.)
        debug_assert_eq!(rk.ep, ep_id);
        if !param.flags.contains(RequestFlags::NO_IMM_CMPL) {
            let direct = match op.kind {
                RmaOpKind::Put => match op.buf.contig_bytes() {
                    Some(data) => self.put_direct(ep_id, rk, data, op.remote).map(|r| r.map(|()| None)),
                    None => None,
                },
                RmaOpKind::Get => match op.buf.contig_seg() {
                    // SAFETY: the operation's buffer, writable without other access until it
                    // completes (its `UserBuf`'s contract); a direct get completes at once.
                    Some(s) => unsafe { self.get_direct(ep_id, rk, op.rkey, s.ptr, s.len, op.remote, &mut param) },
                    None => None,
                },
                RmaOpKind::Amo { op: aop, fetch, size } => {
                    let reply = match (fetch, op.buf.contig_seg()) {
                        (false, _) => Some(std::ptr::null_mut()),
                        (true, Some(s)) if s.len == size as usize => Some(s.ptr),
                        (true, _) => None,
                    };
                    match reply {
                        // SAFETY: a fetching operation's reply buffer of `size` bytes, writable
                        // without other access until it completes (its `UserBuf`'s contract).
                        Some(res) => unsafe {
                            self.amo_direct(ep_id, rk, op.rkey, aop, size, op.amo, op.remote, res, &mut param)
                        },
                        None => None,
                    }
                }
            };
            if let Some(r) = direct {
                return r;
            }
        }
        self.rma_slow(ep_id, op, param)
    }

    /// Marks endpoint `ep_id` as having unflushed remote operations if it is ready for a
    /// direct transport call (connected, nothing queued or parked); `false`: it is not.
    #[inline(always)]
    fn direct_rma(&self, ep_id: Id) -> bool {
        let mut e = self.engine.borrow_mut();
        match e.sh.eps.get_mut(ep_id) {
            Some(ep) if ep.ready() => {
                ep.rma_dirty = true;
                true
            }
            _ => false,
        }
    }

    /// The transport endpoint and key of `rk`'s lane for operations of kind `which` (a
    /// `DIRECT_*` index) for an access of `len` bytes at `remote`, if it lies within the key's
    /// region and endpoint `ep_id` is ready for a direct call (marked as having unflushed
    /// operations then).
    #[inline(always)]
    fn direct_lane<'k>(
        &self,
        ep_id: Id,
        rk: &'k Rkey,
        which: usize,
        remote: u64,
        len: usize,
    ) -> Option<(&'k dyn uct::Ep, &'k uct::RemoteKey)> {
        let inside = remote.checked_sub(rk.base).is_some_and(|o| o.saturating_add(len as u64) <= rk.len);
        if !inside {
            return None;
        }
        let d = rk.direct[which]?;
        // The endpoints were not reached mutably since this key last found its endpoint ready:
        // it still is, and still marked (a flush or fence, a queued operation, a failure would
        // all have changed it). Back-to-back operations skip the engine.
        if rk.ready_epoch.get() != self.ep_epoch.get() {
            if !self.direct_rma(ep_id) {
                return None;
            }
            rk.ready_epoch.set(self.ep_epoch.get());
        }
        // SAFETY: the pointers point into `rk._io`'s boxed endpoints and `rk.keys`, which live
        // as long as `rk` and are never changed after the unpack ([`DirectLane`]).
        Some(unsafe { (d.ep.as_ref(), d.key.as_ref()) })
    }

    /// A contiguous put that fits one `put_short` or `put_bcopy`, on a ready endpoint, inside
    /// the key's region, as one transport call (the fast path). `None`: anything else, or the
    /// transport could not take it now ([`Core::rma_slow`] sees it again).
    #[inline(always)]
    pub fn put_direct(&self, ep_id: Id, rk: &Rkey, data: &[u8], remote: u64) -> Option<UcsResult<()>> {
        let len = data.len();
        // (Without short or bcopy the limit is 0: nothing fits; an empty put completes on the
        // slow path without a transport call.)
        if len.wrapping_sub(1) >= rk.put_direct_max {
            return None;
        }
        let c = rk.routes.put?;
        let (uep, key) = self.direct_lane(ep_id, rk, DIRECT_PUT, remote, len)?;
        let r = if len <= c.short_max {
            uep.put_short(data, remote, key)
        } else {
            uep.put_bcopy(&mut |dst| pack_slice(dst, data), remote, key).map(|o| o.map(|_| ()))
        };
        done_or_none(r)
    }

    /// A get of `len` bytes into `dst` that fits one `get_short` or `get_bcopy` (as
    /// [`Core::put_direct`]). A bcopy get carries a completion from the worker's free list; if
    /// the transport finishes it later (RDMA), it gets its request (from `param`, taken) then,
    /// as a fetching atomic does.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, without other access, until the
    /// operation completes.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub unsafe fn get_direct(
        &self,
        ep_id: Id,
        rk: &Rkey,
        rkey_id: Id,
        dst: *mut u8,
        len: usize,
        remote: u64,
        param: &mut RequestParam,
    ) -> Option<UcsResult<Option<Id>>> {
        if len.wrapping_sub(1) >= rk.get_direct_max {
            return None;
        }
        let c = rk.routes.get?;
        let (uep, key) = self.direct_lane(ep_id, rk, DIRECT_GET, remote, len)?;
        if len <= c.short_max {
            // SAFETY: the caller's promise; a short get completes within the call.
            let r = uep.get_short(unsafe { std::slice::from_raw_parts_mut(dst, len) }, remote, key);
            return done_or_none(r).map(|r| r.map(|()| None));
        }
        // The spare completion: the transport keeps it only for a get it finishes later.
        let z = self.zc_spare();
        // SAFETY: the caller's promise; a started get completes only after its completion.
        let r = unsafe { uep.get_bcopy(dst, len, remote, key, Some(&z.comp)) };
        let op = || {
            // SAFETY: the caller's promise; the request's buffer is the destination.
            let buf = unsafe { UserBuf::contig(dst, len) };
            let op = RmaOp { kind: RmaOpKind::Get, buf, remote, rkey: rkey_id, amo: AmoArgs::default() };
            (op, RmaRoute { lane: c.lane, proto: RmaProto::Bcopy, piece: len }, len)
        };
        self.direct_settle(z, r, ep_id, rkey_id, op, param)
    }

    /// The outcome of a direct operation that carried spare completion `z`: done, the spare
    /// goes back; started, the operation (`op`: it, its route and `offset`, built only then)
    /// gets its request (from `param`, taken; `offset` is
    /// how far it got, one piece in flight) and keeps its key in the completion's slot;
    /// refused, `None` for the slow path to queue it (meeting the refusal again, it parks the
    /// endpoint).
    #[inline(always)]
    fn direct_settle(
        &self,
        z: super::exec::ZcComp,
        r: ucs::OpResult,
        ep_id: Id,
        rkey_id: Id,
        op: impl FnOnce() -> (RmaOp, RmaRoute, usize),
        param: &mut RequestParam,
    ) -> Option<UcsResult<Option<Id>>> {
        Some(match r {
            Ok(Outcome::Done(())) => {
                self.zc_spare_back(z);
                Ok(None)
            }
            Ok(Outcome::InProgress) => {
                // The key stays until the completion (the user may destroy it before).
                if let Some(rkey) = self.rkeys.borrow().get(rkey_id) {
                    z.slot.keep_rma(None, rkey.clone());
                }
                let param = std::mem::take(param);
                let (op, route, offset) = op();
                let rid = self.with_engine(|e| {
                    let req = rma_req(ep_id, &op, route, param.hint(), offset, 1);
                    e.sh.rma_inflight(req, param)
                });
                z.slot.set_what(ZcDone::Rma { rid });
                Ok(Some(rid))
            }
            Ok(Outcome::NoResource) => {
                self.zc_spare_back(z);
                return None;
            }
            Err(e) => {
                self.zc_spare_back(z);
                Err(e)
            }
        })
    }

    /// An atomic the key's atomic lane does, aligned, on a ready endpoint, inside the region
    /// (as [`Core::put_direct`]); `res` is the reply buffer of a fetching one (null for the
    /// others). A fetching atomic carries a completion from the worker's free list; if the
    /// transport finishes it later, it gets its request (from `param`, taken) then.
    ///
    /// # Safety
    /// A non-null `res` must be valid for writes of `size` bytes, without other access, until
    /// the operation completes.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub unsafe fn amo_direct(
        &self,
        ep_id: Id,
        rk: &Rkey,
        rkey_id: Id,
        aop: uct::AtomicOp,
        size: u8,
        amo: AmoArgs,
        remote: u64,
        res: *mut u8,
        param: &mut RequestParam,
    ) -> Option<UcsResult<Option<Id>>> {
        let a = rk.routes.amo?;
        let fetch = !res.is_null();
        let ops = match (fetch, size) {
            (false, 4) => a.post32,
            (false, _) => a.post64,
            (true, 4) => a.fetch32,
            (true, _) => a.fetch64,
        };
        let aligned = remote % size as u64 == 0 && (res as usize) % size as usize == 0;
        if !ops.contains(aop.bit()) || !aligned {
            return None;
        }
        let (uep, key) = self.direct_lane(ep_id, rk, DIRECT_AMO, remote, size as usize)?;
        if !fetch {
            return done_or_none(post_atomic(uep, aop, size, amo.value, remote, key)).map(|r| r.map(|()| None));
        }
        // The spare completion: the transport keeps it only for an operation it finishes later.
        let z = self.zc_spare();
        // SAFETY: `res` is the operation's reply buffer of `size` bytes, aligned (checked
        // above), writable without other access until the operation completes (the caller's
        // promise); a started operation completes only after its completion.
        let r = unsafe { fetch_atomic(uep, aop, size, amo, remote, key, res, &z.comp) };
        let op = || {
            // SAFETY: as above; the request's buffer is the reply buffer.
            let buf = unsafe { UserBuf::contig(res, size as usize) };
            let op = RmaOp { kind: RmaOpKind::Amo { op: aop, fetch: true, size }, buf, remote, rkey: rkey_id, amo };
            (op, RmaRoute { lane: a.lane, proto: RmaProto::Amo, piece: size as usize }, 1)
        };
        self.direct_settle(z, r, ep_id, rkey_id, op, param)
    }

    /// [`Core::rma_start`] off the fast path: checks with errors that say what was wrong,
    /// the route, the direct call of an operation with a completion, the queue.
    #[inline(never)]
    fn rma_slow(&self, ep_id: Id, op: RmaOp, param: RequestParam) -> UcsResult<Option<Id>> {
        let name = op_name(op.kind);
        let rkey = self.rkeys.borrow().get(op.rkey).cloned().ok_or_else(|| {
            tracing::error!("{name}: the remote key was destroyed");
            Status::InvalidParam
        })?;
        if rkey.ep != ep_id {
            tracing::error!("{name}: the remote key was unpacked on another endpoint");
            return Err(Status::InvalidParam);
        }
        let (len, contig) = match op.kind {
            RmaOpKind::Amo { size, .. } => (size as usize, true),
            _ => (op.buf.len(), op.buf.contig_seg().is_some()),
        };
        // Beyond C UCX: an access outside the region the key describes is refused here.
        let inside =
            op.remote.checked_sub(rkey.base).and_then(|o| o.checked_add(len as u64)).is_some_and(|e| e <= rkey.len);
        if !inside {
            tracing::error!(
                "{name}: {len} bytes at {:#x} are outside the remote region {:#x}+{}",
                op.remote,
                rkey.base,
                rkey.len
            );
            return Err(Status::OutOfRange);
        }
        if let RmaOpKind::Amo { size, .. } = op.kind {
            if op.remote % size as u64 != 0 {
                tracing::error!("atomic: remote address {:#x} is not aligned to the operand's {size} bytes", op.remote);
                return Err(Status::InvalidParam);
            }
        }
        let error = self.engine.borrow().sh.eps.get(ep_id).map(|e| e.error());
        match error {
            None => {
                tracing::error!("{name}: endpoint {ep_id:?} does not exist (closed?)");
                return Err(Status::InvalidParam);
            }
            Some(Some(e)) => return Err(e),
            Some(None) => {}
        }
        let no_imm = param.flags.contains(RequestFlags::NO_IMM_CMPL);
        if len == 0 && !matches!(op.kind, RmaOpKind::Amo { .. }) {
            // Nothing to move: complete at once.
            if !no_imm {
                return Ok(None);
            }
            return Ok(Some(self.with_engine(|e| {
                let rid = e.sh.reqs.tab.insert(crate::request::ReqState::new(
                    crate::request::ReqKind::Done,
                    param.callback,
                    param.callback_fn,
                    param.detached,
                ));
                e.sh.finish(rid, Status::Ok);
                rid
            })));
        }
        let Some(route) = select_rma(&rkey.routes, op.kind, len, contig) else {
            tracing::error!(
                "{name} of {len} bytes{}: no lane of this endpoint reaches that memory with that operation \
                 (the key has entries for: {})",
                if contig { "" } else { " from an iov list" },
                rkey.components
            );
            return Err(Status::Unsupported);
        };
        // The direct path: one transport call, on a ready endpoint. What completes at once
        // needs no request; what the transport finishes later gets one, not queued.
        let single = match op.kind {
            RmaOpKind::Amo { .. } => true,
            _ => contig && len <= route.piece,
        };
        let direct = !no_imm && route.proto != RmaProto::Sw && single;
        let io = {
            let mut e = self.engine.borrow_mut();
            match e.sh.eps.get(ep_id) {
                Some(ep) if direct && ep.ready() => {
                    let io = ep.io.clone();
                    e.sh.rma_touched(ep_id);
                    Some(io)
                }
                _ => None,
            }
        };
        let Some(io) = io else {
            return Ok(Some(self.queue_rma(ep_id, op, route, param, false)));
        };
        let t = RmaTx {
            kind: op.kind,
            proto: route.proto,
            rkey: op.rkey,
            remote: op.remote,
            buf: op.buf,
            offset: 0,
            len,
            amo: op.amo,
            hint: param.hint(),
            // Set to the request's once there is one (a completion fires from progress only).
            token: ZcDone::Rma { rid: Id::from_raw(u64::MAX) },
        };
        let (res, slot) = self.issue_rma(&io, route.lane, &t, &rkey);
        match res.status {
            TxStatus::Done => Ok(None),
            TxStatus::Started => {
                let rid = self.with_engine(|e| {
                    let offset = if matches!(op.kind, RmaOpKind::Amo { .. }) { 1 } else { len };
                    let req = rma_req(ep_id, &op, route, param.hint(), offset, 1);
                    e.sh.rma_inflight(req, param)
                });
                if let Some(slot) = slot {
                    slot.set_what(ZcDone::Rma { rid });
                }
                Ok(Some(rid))
            }
            TxStatus::NoResource => {
                let rid = self.queue_rma(ep_id, op, route, param, true);
                if io.park(Lane::Uct(route.lane), &self.weak) {
                    self.engine.borrow_mut().sh.parked(ep_id);
                }
                Ok(Some(rid))
            }
            TxStatus::Failed(e) => {
                tracing::debug!("{name} failed: {e}");
                Err(e)
            }
        }
    }

    /// Queues an operation on its endpoint (transmitted at once when the endpoint can).
    fn queue_rma(&self, ep_id: Id, op: RmaOp, route: RmaRoute, param: RequestParam, blocked: bool) -> Id {
        let req = rma_req(ep_id, &op, route, param.hint(), 0, 0);
        self.with_engine(|e| e.sh.rma_queue(req, param, blocked))
    }

    /// Makes one transmission of a remote memory access or atomic on `lanes`.
    pub(crate) fn exec_rma(&self, lanes: &EpLanes, lane: u8, t: &RmaTx) -> TxResult {
        let Some(rkey) = self.rkeys.borrow().get(t.rkey).cloned() else {
            tracing::warn!("{}: the remote key was destroyed while the operation waited", op_name(t.kind));
            return TxResult::of(TxStatus::Failed(Status::InvalidParam));
        };
        self.issue_rma(lanes, lane, t, &rkey).0
    }

    /// One transport call of an operation on lane `lane` of `lanes`, with `rkey`: its outcome,
    /// and the slot of its completion when the transport finishes it later (its registration
    /// and key are kept there until then; a completion it did not take goes back to the
    /// worker's free list).
    fn issue_rma(
        &self,
        lanes: &EpLanes,
        lane: u8,
        t: &RmaTx,
        rkey: &Rc<Rkey>,
    ) -> (TxResult, Option<Rc<super::exec::ZcSlot>>) {
        let fail = |s| (TxResult::of(TxStatus::Failed(s)), None);
        let Some(key) = rkey.keys.get(lane as usize).and_then(Option::as_ref) else { return fail(Status::Unsupported) };
        let Some(l) = lanes.uct_eps.get(lane as usize) else { return fail(Status::InvalidParam) };
        let ep = &*l.ep;
        let (off, len) = (t.offset, t.len);
        match (t.kind, t.proto) {
            (RmaOpKind::Put, RmaProto::Short) => {
                let mut tmp = [0u8; SHORT_BUF];
                match short_bytes(&t.buf, off, len, &mut tmp) {
                    Some(b) => (TxResult::from_uct(ep.put_short(b, t.remote, key)), None),
                    None => fail(Status::InvalidParam),
                }
            }
            (RmaOpKind::Put, RmaProto::Bcopy) => {
                (TxResult::from_uct(ep.put_bcopy(&mut |dst| pack(dst, &t.buf, off, len), t.remote, key)), None)
            }
            (RmaOpKind::Get, RmaProto::Short) => {
                (TxResult::from_uct(get_short(ep, &t.buf, off, len, t.remote, key)), None)
            }
            (RmaOpKind::Get, RmaProto::Bcopy) => {
                let Some(run) = t.buf.run_at(off).and_then(|s| s.sub(0, len)) else {
                    return fail(Status::InvalidParam);
                };
                let (comp, slot) = self.zc_completion(t.token);
                // SAFETY: `run` is user memory of the operation, writable without other access
                // until it completes (its `UserBuf`'s contract); the engine completes it only
                // after this piece's completion. The key stays alive in the slot until then.
                let r = unsafe { ep.get_bcopy(run.ptr, run.len, t.remote, key, Some(&comp)) };
                self.settle(comp, slot, r, None, rkey)
            }
            (RmaOpKind::Put | RmaOpKind::Get, RmaProto::Zcopy) => {
                let Some(seg) = t.buf.run_at(off).and_then(|s| s.sub(0, len)) else {
                    return fail(Status::InvalidParam);
                };
                let iface = l.pair.local;
                let memh = match self.memh_for(t.hint, iface, seg) {
                    Ok(m) => m,
                    Err(e) => return fail(e),
                };
                let (comp, slot) = self.zc_completion(t.token);
                let iov = [uct::Iov::new(seg.ptr, seg.len, Some(&memh))];
                // SAFETY: as for a get above; a put only reads the memory, which stays
                // unmodified until the operation completes. The registration and the key stay
                // in the slot until the completion fires.
                let r = unsafe {
                    if t.kind == RmaOpKind::Get {
                        ep.get_zcopy(&iov, t.remote, key, Some(&comp))
                    } else {
                        ep.put_zcopy(&iov, t.remote, key, Some(&comp))
                    }
                };
                self.settle(comp, slot, r, Some(memh), rkey)
            }
            (RmaOpKind::Amo { op, fetch, size }, RmaProto::Amo) => {
                if !fetch {
                    return (TxResult::from_uct(post_atomic(ep, op, size, t.amo.value, t.remote, key)), None);
                }
                let Some(res) =
                    t.buf.contig_seg().filter(|s| s.len == size as usize && (s.ptr as usize) % size as usize == 0)
                else {
                    return fail(Status::InvalidParam);
                };
                let (comp, slot) = self.zc_completion(t.token);
                // SAFETY: `res` is the operation's result buffer of `size` bytes, aligned
                // (checked), writable without other access until the operation completes (its
                // `UserBuf`'s contract), which the engine does only after the completion.
                let r = unsafe { fetch_atomic(ep, op, size, t.amo, t.remote, key, res.ptr, &comp) };
                self.settle(comp, slot, r, None, rkey)
            }
            _ => fail(Status::InvalidParam),
        }
    }

    /// The outcome of a call that was given completion `comp`: started, its registration and
    /// key stay in the slot until the completion fires; otherwise the completion goes back to
    /// the free list.
    fn settle(
        &self,
        comp: Rc<uct::Completion>,
        slot: Rc<super::exec::ZcSlot>,
        r: ucs::OpResult,
        memh: Option<uct::MemH>,
        rkey: &Rc<Rkey>,
    ) -> (TxResult, Option<Rc<super::exec::ZcSlot>>) {
        if let Ok(Outcome::InProgress) = r {
            slot.keep_rma(memh, rkey.clone());
            return (TxResult::from_uct(r), Some(slot));
        }
        self.zc_unused(comp, slot);
        (TxResult::from_uct(r), None)
    }

    /// Flushes lane `lane` of `lanes`; the completion reports `token` if it finishes later.
    pub(crate) fn exec_flush(&self, lanes: &EpLanes, lane: u8, token: crate::engine::ZcDone) -> TxResult {
        let Some(l) = lanes.uct_eps.get(lane as usize) else { return TxResult::of(TxStatus::Done) };
        let (comp, slot) = self.zc_completion(token);
        let r = l.ep.flush(uct::FlushFlags::LOCAL, Some(&comp));
        if !matches!(r, Ok(Outcome::InProgress)) {
            self.zc_unused(comp, slot);
        }
        TxResult::from_uct(r)
    }

    /// Starts flushing `eps` (`None`: every endpoint of the worker); `Ok(None)`: nothing to
    /// wait for.
    pub fn flush_start(&self, eps: Option<Id>, param: RequestParam) -> UcsResult<Option<Id>> {
        let r = self.with_engine(|e| match eps {
            Some(id) => {
                if !e.sh.eps.contains(id) {
                    tracing::error!("flush: endpoint {id:?} does not exist (closed?)");
                    return Err(Status::InvalidParam);
                }
                e.sh.flush_start(&[id], param)
            }
            None => {
                let list: Vec<Id> = e.sh.eps.iter().map(|(id, _)| id).collect();
                e.sh.flush_start(&list, param)
            }
        })?;
        if r.is_some() {
            // Transmit what can go now (the flushes of idle endpoints).
            self.drain();
        }
        Ok(r)
    }

    /// Fences the worker (`ucp_worker_fence`).
    pub fn fence(&self) {
        self.with_engine(|e| e.sh.fence());
    }
}

/// The longest short piece copied through the stack (larger short limits use bcopy pieces).
const SHORT_BUF: usize = 256;

/// Bytes `[off, off + len)` of `buf` as one slice: the buffer's own when contiguous, else
/// copied into `tmp`.
fn short_bytes<'a>(buf: &'a UserBuf, off: usize, len: usize, tmp: &'a mut [u8; SHORT_BUF]) -> Option<&'a [u8]> {
    if let Some(b) = buf.contig_bytes() {
        return b.get(off..off.checked_add(len)?);
    }
    let t = tmp.get_mut(..len)?;
    buf.copy_out(off, t).ok()?;
    Some(t)
}

/// Reads `len` bytes at `remote` with `get_short` into bytes `[off, off + len)` of `buf`:
/// straight into the buffer when it is contiguous, else through the stack.
#[inline]
fn get_short(
    ep: &dyn uct::Ep,
    buf: &UserBuf,
    off: usize,
    len: usize,
    remote: u64,
    key: &uct::RemoteKey,
) -> ucs::OpResult {
    if let Some(dst) = buf.contig_seg().and_then(|s| s.sub(off, len)) {
        // SAFETY: a piece of the operation's buffer, writable without other access until it
        // completes (its `UserBuf`'s contract); a short get completes within this call.
        return ep.get_short(unsafe { std::slice::from_raw_parts_mut(dst.ptr, dst.len) }, remote, key);
    }
    let mut tmp = [0u8; SHORT_BUF];
    let Some(t) = tmp.get_mut(..len) else { return Err(Status::InvalidParam) };
    let r = ep.get_short(t, remote, key)?;
    if let Outcome::Done(()) = r {
        buf.copy_in(off, t)?;
    }
    Ok(r)
}

/// An atomic without result, 4 or 8 bytes.
#[inline]
fn post_atomic(
    ep: &dyn uct::Ep,
    op: uct::AtomicOp,
    size: u8,
    value: u64,
    remote: u64,
    key: &uct::RemoteKey,
) -> ucs::OpResult {
    if size == 4 {
        ep.atomic32_post(op, value as u32, remote, key)
    } else {
        ep.atomic64_post(op, value, remote, key)
    }
}

/// An atomic with result (`Cswap` compares with `amo.compare`), 4 or 8 bytes; the old value
/// goes to `res`.
///
/// # Safety
/// `res` must be aligned to `size` and valid for writes of `size` bytes, without other access,
/// until the operation completes.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn fetch_atomic(
    ep: &dyn uct::Ep,
    op: uct::AtomicOp,
    size: u8,
    amo: AmoArgs,
    remote: u64,
    key: &uct::RemoteKey,
    res: *mut u8,
    comp: &Rc<uct::Completion>,
) -> ucs::OpResult {
    let (v, c) = (amo.value, Some(comp));
    // SAFETY: forwarded from the caller.
    unsafe {
        match (op, size) {
            (uct::AtomicOp::Cswap, 4) => ep.atomic_cswap32(amo.compare as u32, v as u32, remote, key, res.cast(), c),
            (uct::AtomicOp::Cswap, _) => ep.atomic_cswap64(amo.compare, v, remote, key, res.cast(), c),
            (_, 4) => ep.atomic32_fetch(op, v as u32, res.cast(), remote, key, c),
            _ => ep.atomic64_fetch(op, v, res.cast(), remote, key, c),
        }
    }
}

/// The outcome of a direct call: done, or an error; `None` when the transport did not take it
/// (the slow path tries again, and queues it).
#[inline(always)]
fn done_or_none(r: ucs::OpResult) -> Option<UcsResult<()>> {
    match r {
        Ok(Outcome::Done(())) => Some(Ok(())),
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    }
}

/// Packs a contiguous put into a transport buffer; its length (0, logged, if it does not fit:
/// a bug, the route sized it).
fn pack_slice(dst: &mut [u8], data: &[u8]) -> usize {
    match dst.get_mut(..data.len()) {
        Some(d) => {
            d.copy_from_slice(data);
            data.len()
        }
        None => {
            tracing::error!("put: {} bytes do not fit the transport's {}-byte buffer", data.len(), dst.len());
            0
        }
    }
}

/// Packs bytes `[off, off + len)` of `buf` into a transport buffer; the length (0, logged, if
/// it does not fit: a bug, the route sized the piece).
fn pack(dst: &mut [u8], buf: &UserBuf, off: usize, len: usize) -> usize {
    match dst.get_mut(..len).map(|d| buf.copy_out(off, d)) {
        Some(Ok(())) => len,
        _ => {
            tracing::error!("put: a {len}-byte piece does not fit the transport's {}-byte buffer", dst.len());
            0
        }
    }
}

/// The state of an operation of `op` with route `route`, `offset` bytes issued and `inflight`
/// pieces with the transport.
fn rma_req(ep: Id, op: &RmaOp, route: RmaRoute, hint: Option<Id>, offset: usize, inflight: u32) -> RmaReq {
    RmaReq {
        ep,
        kind: op.kind,
        buf: op.buf,
        remote: op.remote,
        rkey: op.rkey,
        route,
        amo: op.amo,
        offset,
        inflight,
        error: None,
        hint,
    }
}
