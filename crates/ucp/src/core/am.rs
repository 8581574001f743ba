//! The driver's half of active messages: the handler table (`ucp_worker_set_am_recv_handler`),
//! the direct send (`ucp_am_send_nbx`) through the shared send path, and the delivery of what
//! the engine's family ([`crate::am`]) hands over: the user's handler runs here, outside the
//! engine, so that it may send (replies included) from inside the call.
//!
//! Data a handler may keep beyond its call (`UCP_AM_RECV_ATTR_FLAG_DATA`: a message that
//! arrived in a transport descriptor, a reassembled one, or any one for a handler registered
//! with `PERSISTENT_DATA`) lives in the worker's table of kept messages, at a stable address,
//! from when the handler takes it until the user releases it (`ucp_am_data_release`). A
//! reassembled message or a copy for `PERSISTENT_DATA` enters the table before the handler
//! runs and leaves it when the handler returns without taking it; a transport descriptor is
//! lent to the handler as it is and enters the table only when taken ([`Keep::Desc`]), so a
//! handler that keeps nothing costs no table entry.

use std::cell::Cell;
use std::rc::Rc;

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::Core;
use crate::am::{AmArrival, AmBytes};
use crate::dt::UserBuf;
use crate::proto::{Force, OpKind};
use crate::request::{AmOut, RequestParam, SendMsg};
use crate::wire;

/// What a handler is given (the API wraps it for the user).
pub(crate) struct AmIn<'a> {
    /// The user's id.
    pub id: u16,
    /// The endpoint to reply on, when the sender asked for one.
    pub reply: Option<Id>,
    /// The user header (valid during the call).
    pub hdr: &'a [u8],
    /// The data: valid during the call; with `kept`, until the kept entry is released. Empty
    /// for a rendezvous message (see `rndv`).
    pub data: &'a [u8],
    /// Length of the data (of a rendezvous message: what its sender sends).
    pub length: usize,
    /// A rendezvous message's descriptor: the handler takes it to receive the data (or not:
    /// the data is dropped when the handler returns).
    pub rndv: Option<Id>,
    /// Whether and how the handler may keep the data.
    pub keep: Keep<'a>,
    /// Set by the handler to keep the data (the entry then stays until released).
    pub taken: &'a Cell<bool>,
}

/// Whether a handler may keep a message's data beyond its call, and how.
#[derive(Clone, Copy)]
pub(crate) enum Keep<'a> {
    /// It may not (the data is lent for the call).
    No,
    /// The data is in the kept table already, as this entry (a reassembled message, or a copy
    /// for a handler registered with `PERSISTENT_DATA`).
    Kept(Id),
    /// The data is in a transport descriptor, whose buffer does not move when kept: the
    /// function moves the descriptor into the kept table and gives its entry (`None` when it
    /// did so already). Most handlers do not keep, and then pay nothing for the table.
    Desc(&'a dyn Fn() -> Option<Id>),
}

impl Keep<'_> {
    /// Whether the data can be kept.
    pub fn possible(&self) -> bool {
        !matches!(self, Keep::No)
    }

    /// The kept table's entry of the data, moved there now if need be.
    pub fn entry(&self) -> Option<Id> {
        match self {
            Keep::No => None,
            Keep::Kept(id) => Some(*id),
            Keep::Desc(keep) => keep(),
        }
    }
}

/// A registered handler: the API's wrapper of the user's callback, and whether the data must
/// always be keepable (`UCP_AM_FLAG_PERSISTENT_DATA`).
#[derive(Clone)]
pub(crate) struct AmEntry {
    pub cb: Rc<dyn Fn(AmIn<'_>)>,
    pub persistent: bool,
}

/// Storage of a kept message: stable in memory while it lives (a transport or pool buffer, or
/// the heap), whatever the table does with the entry itself.
enum KeptStore {
    Desc(uct::AmDesc),
    Pool(ucs::mpool::PoolBuf),
    Heap(Vec<u8>),
}

/// A kept message: its storage and where its data is in it.
pub(crate) struct AmKept {
    store: KeptStore,
    data: (usize, usize),
}

impl AmKept {
    fn base(&self) -> *const u8 {
        match &self.store {
            KeptStore::Desc(d) => d.as_ptr(),
            KeptStore::Pool(b) => b.as_ptr(),
            KeptStore::Heap(v) => v.as_ptr(),
        }
    }

    /// Start and length of the data.
    pub fn data(&self) -> (*const u8, usize) {
        (self.base().wrapping_add(self.data.0), self.data.1)
    }
}

/// [`Core::am_max_header`] of a worker with interfaces `ifaces` (computed once, at creation).
pub(super) fn max_header(ifaces: &[super::iface::WorkerIface]) -> usize {
    ifaces
        .iter()
        .filter(|w| w.attr.flags.contains(uct::IfaceFlags::AM_BCOPY))
        .map(|w| {
            w.attr.am.max_bcopy.saturating_sub((wire::len::AM_FIRST + 1).max(wire::len::RTS + uct::PackedKey::MAX))
        })
        .min()
        .unwrap_or(0)
        .min(u32::MAX as usize)
}

impl Core {
    /// Registers (or with `None` removes) the handler of active-message id `id`. A message
    /// goes to the handler registered when it arrived whole; one with no handler is dropped
    /// (logged).
    pub fn set_am_handler(&self, id: u16, entry: Option<AmEntry>) {
        let mut h = self.am_handlers.borrow_mut();
        let i = id as usize;
        if h.len() <= i {
            if entry.is_none() {
                return;
            }
            h.resize(i + 1, None);
        }
        h[i] = entry;
    }

    /// The largest user header an active message may carry on this worker (UCX's
    /// `max_am_header`): what one bcopy fragment of the smallest AM lane leaves after the
    /// longer of a rendezvous RTS with the longest key and the fixed header of a first fragment
    /// with one byte of data (so that every fragment of a multi-fragment message moves data).
    #[inline]
    pub fn am_max_header(&self) -> usize {
        self.am_max_hdr
    }

    /// Starts an active-message send (`ucp_am_send_nbx`) of data `buf` with user header `hdr`,
    /// by the protocols `force` allows; `Ok(None)`: completed at once.
    #[allow(clippy::too_many_arguments)]
    pub fn am_send(
        &self,
        ep_id: Id,
        id: u16,
        hdr: UserBuf,
        buf: UserBuf,
        reply: bool,
        force: Force,
        param: RequestParam,
    ) -> UcsResult<Option<Id>> {
        let max = self.am_max_header();
        if hdr.len() > max {
            tracing::error!("am_send: a {}-byte header is longer than the largest one ({max})", hdr.len());
            return Err(Status::InvalidParam);
        }
        let a = AmOut { id, reply, hdr: wire::UserHdr(hdr) };
        let kind = OpKind::Am { hdr: (hdr.len() + if reply { 8 } else { 0 }) as u32, force };
        self.send_msg(ep_id, buf, SendMsg::Am(a), kind, false, param)
    }

    /// A message of the active-message family arrived (AM id `id`).
    pub(crate) fn on_user_am(&self, id: u8, m: uct::AmRecv<'_>) {
        if id == wire::AM_AM_ONLY {
            // A whole message: decoded here; the engine is entered only to check the reply
            // endpoint of a message that names one.
            let reply_ep = |raw| crate::am::reply_ep(&self.engine.borrow().sh, raw, "active message");
            if let Some(a) = crate::am::whole(m, reply_ep) {
                self.deliver_am(a);
            }
            return;
        }
        let arrival = {
            let mut guard = self.engine.borrow_mut();
            let e = &mut *guard;
            e.am.on_msg(&e.sh, id, m)
        };
        if let Some(a) = arrival {
            self.deliver_am(a);
        }
    }

    fn deliver_am(&self, a: AmArrival<'_>) {
        let entry = self.am_handlers.borrow().get(a.id as usize).cloned().flatten();
        let Some(entry) = entry else {
            tracing::warn!("ucp: an active message with id {} arrived, and no handler is set for it; dropped", a.id);
            match a.bytes {
                AmBytes::Owned { data, .. } => self.engine.borrow_mut().am.recycle(data),
                // The sender learns it (as in UCX).
                AmBytes::Rndv { desc, .. } => self.am_drop_rndv(desc, Status::InvalidParam),
                AmBytes::Recv { .. } => {}
            }
            return;
        };
        let taken = Cell::new(false);
        let (kept, (off, n)) = match a.bytes {
            AmBytes::Recv { m, hdr, data } if !m.is_desc() && !entry.persistent => {
                // Inline in the transport's buffer and not to be kept: lent for the call.
                let bytes = m.data();
                let (h, d) = (&bytes[hdr.0..hdr.0 + hdr.1], &bytes[data..]);
                let length = d.len();
                (entry.cb)(AmIn {
                    id: a.id,
                    reply: a.reply,
                    hdr: h,
                    data: d,
                    length,
                    keep: Keep::No,
                    rndv: None,
                    taken: &taken,
                });
                return;
            }
            AmBytes::Recv { m, hdr, data } if m.is_desc() && !entry.persistent => {
                // In a transport descriptor: lent for the call, and moved into the kept table
                // only if the handler keeps it (the descriptor's buffer stays where it is).
                let bytes = m.data();
                let (p, len) = (bytes.as_ptr(), bytes.len());
                let slot = Cell::new(Some(m));
                let keep = || {
                    let m = slot.take()?;
                    let k = AmKept { store: KeptStore::Desc(m.keep()), data: (data, len - data) };
                    Some(self.am_kept.borrow_mut().insert(k))
                };
                // SAFETY: the message's `len` bytes at `p` stay valid for the call: in the
                // transport's buffer while `slot` holds the message, and in the same buffer,
                // moved into the kept table, once `keep` took it (released only after the call,
                // below, or by the handle the handler took); nobody writes them meanwhile. The
                // engine decoded `hdr` and `data` within them.
                let all = unsafe { std::slice::from_raw_parts(p, len) };
                (entry.cb)(AmIn {
                    id: a.id,
                    reply: a.reply,
                    hdr: &all[hdr.0..hdr.0 + hdr.1],
                    data: &all[data..],
                    length: len - data,
                    keep: Keep::Desc(&keep),
                    rndv: None,
                    taken: &taken,
                });
                return;
            }
            AmBytes::Rndv { m, hdr, desc, size } => {
                let bytes = m.data();
                let h = &bytes[hdr.0..hdr.0 + hdr.1];
                let i = AmIn {
                    id: a.id,
                    reply: a.reply,
                    hdr: h,
                    data: &[],
                    length: size,
                    keep: Keep::No,
                    rndv: Some(desc),
                    taken: &taken,
                };
                (entry.cb)(i);
                if !taken.get() {
                    // Not taken: the data is dropped, and the sender completes (UCX's callback
                    // returning UCS_OK for a rendezvous message).
                    self.am_drop_rndv(desc, Status::Ok);
                }
                return;
            }
            AmBytes::Recv { m, hdr, data } => {
                let len = m.len();
                let store = if m.is_desc() {
                    KeptStore::Desc(m.keep())
                } else {
                    // Copied whole (the user header stays readable during the call), into a
                    // pool buffer or the heap: `AmRecv::keep_in` would keep a short one inside
                    // the descriptor itself, which moves with the table's entries.
                    let pool = self.engine.borrow().sh.kept_msgs.clone();
                    match (len <= pool.elem_size()).then(|| pool.get_buf()).flatten() {
                        Some(mut b) => {
                            b.as_mut_slice()[..len].copy_from_slice(m.data());
                            KeptStore::Pool(b)
                        }
                        None => KeptStore::Heap(m.data().to_vec()),
                    }
                };
                let k = AmKept { store, data: (data, len - data) };
                (self.am_kept.borrow_mut().insert(k), hdr)
            }
            AmBytes::Owned { hdr, data } => {
                let n = data.len();
                let k = AmKept { store: KeptStore::Heap(data), data: (0, n) };
                let id = self.am_kept.borrow_mut().insert(k);
                self.deliver_kept(&entry, a.id, a.reply, id, &hdr, &taken);
                if !taken.get() {
                    self.am_release_into_engine(id);
                }
                return;
            }
        };
        // The header is in the kept storage, before the data.
        let Some(base) = self.am_kept.borrow().get(kept).map(AmKept::base) else { return };
        // SAFETY: `base` is the kept storage's start (stable while the entry lives, which is
        // at least until this function releases it below), and the header lies within the
        // message the engine decoded (`off + n` within it).
        let h = unsafe { std::slice::from_raw_parts(base.add(off), n) };
        self.deliver_kept(&entry, a.id, a.reply, kept, h, &taken);
        if !taken.get() {
            self.am_release_into_engine(kept);
        }
    }

    /// Runs the handler on kept message `kept` with user header `hdr`.
    fn deliver_kept(&self, entry: &AmEntry, id: u16, reply: Option<Id>, kept: Id, hdr: &[u8], taken: &Cell<bool>) {
        let Some((p, n)) = self.am_kept.borrow().get(kept).map(AmKept::data) else { return };
        // SAFETY: the kept storage does not move and lives until released, which happens only
        // after the handler returned (by this module) or through the handle the handler took.
        let data = unsafe { std::slice::from_raw_parts(p, n) };
        (entry.cb)(AmIn { id, reply, hdr, data, length: n, keep: Keep::Kept(kept), rndv: None, taken });
    }

    /// Receives rendezvous descriptor `desc`'s data into `buf` (`ucp_am_recv_data_nbx`); the
    /// request's id.
    pub fn am_recv_data(&self, desc: Id, buf: UserBuf, param: RequestParam) -> UcsResult<Id> {
        self.with_engine(|e| e.am.recv_data(&mut e.sh, desc, buf, param))
    }

    /// Drops rendezvous descriptor `desc`: its sender completes with `status`.
    pub fn am_drop_rndv(&self, desc: Id, status: Status) {
        self.with_engine(|e| e.am.drop_rndv(&mut e.sh, desc, status));
    }

    /// Keeps a piece of a stream (`ucp_stream_recv_data_nb`) in the table of kept messages:
    /// its entry and where its bytes are.
    pub(crate) fn keep_chunk(&self, c: crate::stream::Chunk) -> (Id, *const u8, usize) {
        let n = c.rest().len();
        let store = match c.bytes {
            crate::stream::ChunkBytes::Desc(d) => KeptStore::Desc(d),
            crate::stream::ChunkBytes::Heap(v) => KeptStore::Heap(v),
        };
        let k = AmKept { store, data: (c.off, n) };
        let (p, len) = k.data();
        (self.am_kept.borrow_mut().insert(k), p, len)
    }

    /// Releases a kept message (`ucp_am_data_release`); a reassembly buffer goes back to the
    /// engine's family for reuse.
    pub fn am_release_into_engine(&self, kept: Id) {
        let k = self.am_kept.borrow_mut().remove(kept);
        if let Some(AmKept { store: KeptStore::Heap(v), .. }) = k {
            self.engine.borrow_mut().am.recycle(v);
        }
    }
}
