//! Protocol selection: the one place that decides how an operation's data goes.
//!
//! [`select`] picks the protocol of a send from its kind (which decides the headers), its
//! length and datatype, and the endpoint's switch points ([`EpConfig`]); every send path -
//! the direct one of the driver, the queued one, a replay - goes through it. A rendezvous
//! then needs two more choices, made here as well: what the sender offers in its RTS
//! ([`rts_offer`]: a registration, a key to read it) and how the receiver takes the data
//! ([`rndv_scheme`]: get, put, or active-message fragments).
//!
//! The memory-handle hint of an operation does not change the choice (as in UCX 1.13's
//! protocols): it only spares the registration of a zero-copy protocol that was chosen.

use super::config::{EpConfig, TagLaneCaps};
use crate::config::RndvScheme;
use crate::wire::len;

/// The kind of operation, for protocol selection: it decides the headers of each protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// A tagged send (`ucp_tag_send_nbx`).
    TagSend,
    /// A synchronous tagged send (`ucp_tag_send_sync_nbx`).
    TagSendSync,
    /// An active message (`ucp_am_send_nbx`) whose header adds `hdr` bytes to the fixed
    /// ones (its user header, and 8 for a reply endpoint), with the protocol family its flags
    /// ask for.
    Am { hdr: u32, force: Force },
    /// Bytes of a stream (`ucp_stream_send_nbx`): eager only, as in UCX.
    Stream,
}

/// The protocol family an active message's flags ask for (`UCP_AM_SEND_FLAG_EAGER`,
/// `UCP_AM_SEND_FLAG_RNDV`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Force {
    /// By the endpoint's switch points.
    Auto,
    /// Eager at every size.
    Eager,
    /// Rendezvous at every size.
    Rndv,
}

impl OpKind {
    /// Header of a whole message in one copied fragment.
    #[inline(always)]
    fn whole_hdr(self) -> usize {
        match self {
            OpKind::TagSend => len::EAGER_ONLY,
            OpKind::TagSendSync => len::EAGER_SYNC_ONLY,
            OpKind::Am { hdr, .. } => len::AM_ONLY + hdr as usize,
            OpKind::Stream => len::STREAM,
        }
    }

    /// Whether the kind may go zero-copy: its headers fit the fixed-size header buffer of
    /// `am_zcopy` (an active message's user header comes on top of its fixed header).
    #[inline(always)]
    fn zcopy_ok(self) -> bool {
        match self {
            OpKind::TagSend | OpKind::TagSendSync | OpKind::Stream => true,
            OpKind::Am { hdr, .. } => len::AM_FIRST + hdr as usize <= len::MAX_DATA_HDR,
        }
    }

    /// Whether the kind may go rendezvous (an active message sent with the eager flag may not).
    #[inline(always)]
    fn rndv_ok(self) -> bool {
        !matches!(self, OpKind::Am { force: Force::Eager, .. } | OpKind::Stream)
    }

    /// Whether the kind may go eager short: `am_short` carries an 8-byte header, the tag; a
    /// synchronous send also needs its endpoint and request.
    #[inline(always)]
    fn short_ok(self) -> bool {
        matches!(self, OpKind::TagSend | OpKind::Am { hdr: 0, .. } | OpKind::Stream)
    }
}

/// An operation to choose a protocol for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    /// What it is.
    pub kind: OpKind,
    /// Bytes of data.
    pub len: usize,
    /// The data is one contiguous buffer (not an iov list).
    pub contig: bool,
}

/// How an operation's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proto {
    /// One `am_short`: the header and the data inline.
    EagerShort,
    /// One `am_bcopy` fragment: the header, then the data copied in.
    EagerBcopy,
    /// Several `am_bcopy` fragments: a first one with the total length, then middle ones.
    EagerMulti,
    /// `am_zcopy` from the user's registered buffer, in one fragment or several.
    EagerZcopy,
    /// Rendezvous: an RTS, then the data as the receiver chooses ([`rndv_scheme`]).
    Rndv,
}

/// The protocol of a send of `op` on an endpoint configured as `cfg`:
///
/// * `len >= rndv_thresh`: rendezvous;
/// * contiguous, short-capable kind and `len < short_lim`: eager short;
/// * contiguous and `zcopy_thresh <= len` (non-empty): eager zero-copy;
/// * otherwise eager bcopy, in one fragment when the header and the data fit the AM lane's
///   bcopy size, else in several.
///
/// With a tag lane ([`EpConfig::tag`]) a tagged send takes [`select_tag_lane`]'s choice.
#[inline(always)]
pub(crate) fn select(cfg: &EpConfig, op: Op) -> Proto {
    if let Some(t) = &cfg.tag {
        if matches!(op.kind, OpKind::TagSend | OpKind::TagSendSync) {
            return select_tag_lane(cfg, t, op);
        }
    }
    if (op.len >= cfg.rndv_thresh && op.kind.rndv_ok()) || matches!(op.kind, OpKind::Am { force: Force::Rndv, .. }) {
        return Proto::Rndv;
    }
    if op.contig {
        if op.len < cfg.short_lim && op.kind.short_ok() {
            return Proto::EagerShort;
        }
        if op.len >= cfg.zcopy_thresh && op.len > 0 && op.kind.zcopy_ok() {
            return Proto::EagerZcopy;
        }
    }
    if op.len.saturating_add(op.kind.whole_hdr()) <= cfg.bcopy_max {
        Proto::EagerBcopy
    } else {
        Proto::EagerMulti
    }
}

/// The protocol of a tagged send through the tag lane (UCX's offload protocols): the data
/// in one tagged message (`tag_eager_short` for a contiguous, non-synchronous payload that
/// fits inline, else `tag_eager_bcopy`), or, from the rendezvous threshold on and for what
/// one message cannot carry, a rendezvous whose RTS goes as a software rendezvous request
/// through the same lane (the data then moves by the endpoint's rendezvous scheme).
#[inline]
pub(crate) fn select_tag_lane(cfg: &EpConfig, t: &TagLaneCaps, op: Op) -> Proto {
    if op.len >= cfg.rndv_thresh || op.len > t.bcopy_max {
        return Proto::Rndv;
    }
    if op.contig && op.kind == OpKind::TagSend && t.short_max.is_some_and(|m| op.len <= m) {
        return Proto::EagerShort;
    }
    Proto::EagerBcopy
}

/// What the sender of a rendezvous offers in its RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RtsOffer {
    /// Register the buffer on the rendezvous lane (the receiver may get from it, or the
    /// sender put from it after an RTR).
    pub register: bool,
    /// Pack a key so the receiver can get.
    pub key: bool,
}

/// What the sender of an `len`-byte rendezvous offers: a registration when its buffer is
/// contiguous and one zero-copy operation of the rendezvous lane moves it under the scheme,
/// and a key when that operation may be a get.
pub(crate) fn rts_offer(cfg: &EpConfig, len: usize, contig: bool) -> RtsOffer {
    let none = RtsOffer { register: false, key: false };
    let Some(lane) = cfg.rndv else { return none };
    if !contig || len == 0 || len > lane.max_zcopy {
        return none;
    }
    let get = lane.get && matches!(cfg.scheme, RndvScheme::Auto | RndvScheme::GetZcopy);
    let put = lane.put && matches!(cfg.scheme, RndvScheme::Auto | RndvScheme::PutZcopy);
    RtsOffer { register: get || put, key: get }
}

/// How the receiver of a rendezvous takes the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RndvProto {
    /// It reads the sender's buffer (RTS -> get -> ATS).
    Get,
    /// It asks the sender to write (RTS -> RTR with a key -> put -> ATP).
    Put,
    /// It asks for active-message fragments (RTS -> RTR without key -> data).
    Am,
}

/// What the receiver of a `size`-byte rendezvous does, given the sender's offer (`rkey`: it
/// sent a key; `sender_contig`: its buffer is contiguous) and whether its own buffer is
/// contiguous.
pub(crate) fn rndv_scheme(
    cfg: &EpConfig,
    size: usize,
    rkey: bool,
    sender_contig: bool,
    recv_contig: bool,
) -> RndvProto {
    let Some(lane) = cfg.rndv.filter(|l| size <= l.max_zcopy) else { return RndvProto::Am };
    if !recv_contig {
        return RndvProto::Am;
    }
    if lane.get && rkey && matches!(cfg.scheme, RndvScheme::Auto | RndvScheme::GetZcopy) {
        return RndvProto::Get;
    }
    if lane.put && sender_contig && matches!(cfg.scheme, RndvScheme::Auto | RndvScheme::PutZcopy) {
        return RndvProto::Put;
    }
    RndvProto::Am
}

/// What one lane can do for one kind of remote memory access (put or get) with one remote
/// key: its uct limits, 0 where the lane lacks the operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RmaCaps {
    /// Index of the lane among the endpoint's transport endpoints.
    pub lane: u8,
    /// Largest `put_short`/`get_short` payload (0: none).
    pub short_max: usize,
    /// Largest `put_bcopy`/`get_bcopy` payload (0: none).
    pub bcopy_max: usize,
    /// Largest `put_zcopy`/`get_zcopy` payload (0: none).
    pub zcopy_max: usize,
    /// Contiguous transfers of this size or more go zero-copy, where the lane has it
    /// (`UCX_ZCOPY_THRESH`; `auto`: from the size that no longer fits one bcopy operation).
    pub zcopy_thresh: usize,
}

/// What the atomic lane of an endpoint can do with one remote key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AmoCaps {
    /// Index of the lane among the endpoint's transport endpoints.
    pub lane: u8,
    /// Operations without a result, 32 and 64 bits.
    pub post32: uct::AtomicOps,
    /// (see `post32`)
    pub post64: uct::AtomicOps,
    /// Operations with a result, 32 and 64 bits.
    pub fetch32: uct::AtomicOps,
    /// (see `fetch32`)
    pub fetch64: uct::AtomicOps,
}

/// The routes of one remote key on its endpoint, resolved once at unpack (UCX's rkey
/// configuration): which lane takes puts, gets and atomics to that memory, and its limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RkeyRoutes {
    /// Puts.
    pub put: Option<RmaCaps>,
    /// Gets.
    pub get: Option<RmaCaps>,
    /// Atomics.
    pub amo: Option<AmoCaps>,
    /// Emulation over active messages, for what no lane reaches: the largest piece of an
    /// emulated put (`None`: the endpoint cannot emulate).
    pub sw_put_piece: Option<usize>,
}

/// A remote memory access or atomic, for protocol selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RmaOpKind {
    /// `ucp_put_nbx`.
    Put,
    /// `ucp_get_nbx`.
    Get,
    /// `ucp_atomic_op_nbx`: the operation, whether it fetches, and the operand size (4 or 8).
    Amo { op: uct::AtomicOp, fetch: bool, size: u8 },
}

/// How a remote memory access goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RmaProto {
    /// One `put_short`/`get_short`.
    Short,
    /// `put_bcopy`/`get_bcopy`, in pieces of at most `bcopy_max`.
    Bcopy,
    /// `put_zcopy`/`get_zcopy` from or into the user's registered buffer, in pieces of at
    /// most `zcopy_max`.
    Zcopy,
    /// One transport atomic (CPU atomics on mapped memory, or the device's).
    Amo,
    /// Emulated over active messages: the target applies it to its memory.
    Sw,
}

/// The route of an operation: a lane, a protocol, and the largest piece one transport call
/// moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RmaRoute {
    pub lane: u8,
    pub proto: RmaProto,
    pub piece: usize,
}

/// The protocol of a remote memory access of `len` bytes (`contig`: one buffer, not an iov
/// list) or of an atomic, to memory whose key resolved to `routes`:
///
/// * put and get: short when contiguous and it fits one short operation; zero-copy from
///   the lane's threshold for contiguous buffers, or when the lane has no bcopy (then an iov
///   list goes one piece per entry); else bcopy, in as many pieces as it takes;
/// * atomics: the lane's atomic when it has that operation at that size.
///
/// * otherwise, emulation over active messages where the endpoint can
///   ([`RkeyRoutes::sw_put_piece`]): puts in pieces of one active message, gets and atomics
///   as one request the target answers.
///
/// `None`: no lane of the endpoint reaches that memory with that operation, and it cannot
/// emulate it.
pub(crate) fn select_rma(routes: &RkeyRoutes, kind: RmaOpKind, len: usize, contig: bool) -> Option<RmaRoute> {
    offload(routes, kind, len, contig).or_else(|| {
        let piece = routes.sw_put_piece?;
        Some(RmaRoute { lane: 0, proto: RmaProto::Sw, piece: if kind == RmaOpKind::Put { piece } else { usize::MAX } })
    })
}

/// The route of [`select_rma`] on a lane that reaches the memory itself.
fn offload(routes: &RkeyRoutes, kind: RmaOpKind, len: usize, contig: bool) -> Option<RmaRoute> {
    let c = match kind {
        RmaOpKind::Put => routes.put?,
        RmaOpKind::Get => routes.get?,
        RmaOpKind::Amo { op, fetch, size } => {
            let a = routes.amo?;
            let ops = match (fetch, size) {
                (false, 4) => a.post32,
                (false, _) => a.post64,
                (true, 4) => a.fetch32,
                (true, _) => a.fetch64,
            };
            return ops.contains(op.bit()).then_some(RmaRoute {
                lane: a.lane,
                proto: RmaProto::Amo,
                piece: size as usize,
            });
        }
    };
    let route = |proto, piece: usize| Some(RmaRoute { lane: c.lane, proto, piece: piece.max(1) });
    if contig && c.short_max > 0 && len <= c.short_max {
        return route(RmaProto::Short, c.short_max);
    }
    if c.zcopy_max > 0 && ((contig && len >= c.zcopy_thresh) || c.bcopy_max == 0) {
        return route(RmaProto::Zcopy, c.zcopy_max);
    }
    if c.bcopy_max > 0 {
        return route(RmaProto::Bcopy, c.bcopy_max);
    }
    if c.short_max > 0 {
        // Short pieces from an iov list or past one short operation (a lane with nothing else).
        return route(RmaProto::Short, c.short_max);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::config::RndvCaps;
    use OpKind::{TagSend as T, TagSendSync as S};
    use Proto::*;

    /// posix-like: short below 93 (100 - 8 + 1), bcopy 8 KiB, zero-copy from the next byte,
    /// rendezvous from 64 KiB over a lane that gets and puts up to 1 MiB.
    fn cfg() -> EpConfig {
        EpConfig {
            short_lim: 93,
            bcopy_max: 8192,
            rndv_thresh: 65536,
            zcopy_thresh: 8192 - 8 + 1,
            zcopy_max: 8192,
            scheme: RndvScheme::Auto,
            rndv: Some(RndvCaps { get: true, put: true, max_zcopy: 1 << 20 }),
            uct_lanes: 1,
            tag: None,
        }
    }

    #[test]
    fn tagged_sends_through_a_tag_lane() {
        use crate::proto::config::TagLaneCaps;
        let mut c = cfg();
        c.tag = Some(TagLaneCaps { short_max: Some(48), bcopy_max: 48 * 1024 - 16, hw_rndv_max: 1 << 30 });
        #[rustfmt::skip]
        let table: &[(OpKind, usize, bool, Proto)] = &[
            (T, 0, true, EagerShort), (T, 48, true, EagerShort), (T, 49, true, EagerBcopy),
            (T, 48, false, EagerBcopy),
            // No eager short for a synchronous send (its immediate value needs bcopy).
            (S, 8, true, EagerBcopy),
            // No zero-copy nor fragments: one message up to the lane's bcopy, then rendezvous.
            (T, 20000, true, EagerBcopy), (T, 48 * 1024 - 16, true, EagerBcopy),
            (T, 48 * 1024 - 15, true, Rndv), (S, 48 * 1024 - 15, false, Rndv),
            (T, 65536, true, Rndv),
        ];
        for &(kind, len, contig, want) in table {
            assert_eq!(select(&c, Op { kind, len, contig }), want, "{kind:?} {len} contig={contig}");
        }
        // Other families keep the AM lane's protocols.
        let am = OpKind::Am { hdr: 0, force: Force::Auto };
        assert_eq!(select(&c, Op { kind: am, len: 20000, contig: true }), EagerZcopy);
        assert_eq!(select(&c, Op { kind: OpKind::Stream, len: 20000, contig: false }), EagerMulti);
        // Without eager short on the lane.
        c.tag = Some(TagLaneCaps { short_max: None, bcopy_max: 1000, hw_rndv_max: 0 });
        assert_eq!(select(&c, Op { kind: T, len: 1, contig: true }), EagerBcopy);
        assert_eq!(select(&c, Op { kind: T, len: 1001, contig: true }), Rndv);
    }

    #[test]
    fn send_protocols_by_kind_size_and_datatype() {
        let c = cfg();
        #[rustfmt::skip]
        let table: &[(OpKind, usize, bool, Proto)] = &[
            // kind, length, contiguous, protocol
            (T, 0, true, EagerShort),
            (T, 8, true, EagerShort),
            (T, 92, true, EagerShort),
            (T, 93, true, EagerBcopy),
            (T, 8184, true, EagerBcopy),           // 8 + 8184 = one full fragment
            (T, 8185, true, EagerZcopy),           // from zcopy_thresh, contiguous
            (T, 8185, false, EagerMulti),          // an iov list is copied
            (T, 8, false, EagerBcopy),             // no short from an iov list
            (T, 65535, true, EagerZcopy),
            (T, 65536, true, Rndv),
            (T, 65536, false, Rndv),
            (S, 0, true, EagerBcopy),              // sync: never short
            (S, 8, true, EagerBcopy),
            (S, 8168, true, EagerBcopy),           // 24 + 8168 = one full fragment
            (S, 8169, false, EagerMulti),
            (S, 8185, true, EagerZcopy),
            (S, 1 << 20, true, Rndv),
        ];
        for &(kind, len, contig, want) in table {
            assert_eq!(select(&c, Op { kind, len, contig }), want, "{kind:?} {len} contig={contig}");
        }
    }

    #[test]
    fn forced_thresholds_and_missing_lanes() {
        // UCX_ZCOPY_THRESH=0: short still wins for what fits it; empty messages are not zero-copy.
        let c = EpConfig { zcopy_thresh: 0, ..cfg() };
        assert_eq!(select(&c, Op { kind: T, len: 8, contig: true }), EagerShort);
        assert_eq!(select(&c, Op { kind: S, len: 0, contig: true }), EagerBcopy);
        assert_eq!(select(&c, Op { kind: T, len: 100, contig: true }), EagerZcopy);
        // No am_short and no am_zcopy on the lane, no rendezvous lane (`self`-like, huge bcopy).
        let c = EpConfig { short_lim: 0, zcopy_thresh: usize::MAX, rndv_thresh: usize::MAX, rndv: None, ..cfg() };
        assert_eq!(select(&c, Op { kind: T, len: 0, contig: true }), EagerBcopy);
        assert_eq!(select(&c, Op { kind: T, len: usize::MAX - 1, contig: true }), EagerMulti);
        // UCX_RNDV_THRESH=0: everything is rendezvous.
        let c = EpConfig { rndv_thresh: 0, ..cfg() };
        assert_eq!(select(&c, Op { kind: T, len: 0, contig: true }), Rndv);
    }

    #[test]
    fn rendezvous_offers_and_schemes() {
        let on = |get, put, max_zcopy| Some(RndvCaps { get, put, max_zcopy });
        let reg_key = RtsOffer { register: true, key: true };
        let reg = RtsOffer { register: true, key: false };
        let none = RtsOffer { register: false, key: false };
        use RndvProto::{Am, Get, Put};
        use RndvScheme as Sc;
        type Row = (Sc, Option<RndvCaps>, usize, bool, RtsOffer, bool, bool, RndvProto);
        #[rustfmt::skip]
        let table: &[Row] = &[
            // scheme, lane, size, sender contiguous, offer, key sent, receiver contiguous, receiver's choice
            (Sc::Auto, on(true, true, 1 << 20), 65536, true, reg_key, true, true, Get),
            (Sc::Auto, on(true, true, 1 << 20), 65536, true, reg_key, true, false, Am),   // iov receive
            (Sc::Auto, on(true, true, 1 << 20), 65536, false, none, false, true, Am),     // iov send: no put either
            (Sc::Auto, on(false, true, 1 << 20), 65536, true, reg, false, true, Put),
            (Sc::Auto, on(true, true, 1000), 65536, true, none, false, true, Am),         // over the lane's limit
            (Sc::Auto, None, 65536, true, none, false, true, Am),
            (Sc::GetZcopy, on(true, true, 1 << 20), 65536, true, reg_key, true, true, Get),
            (Sc::GetZcopy, on(false, true, 1 << 20), 65536, true, none, false, true, Am),
            (Sc::PutZcopy, on(true, true, 1 << 20), 65536, true, reg, false, true, Put),
            (Sc::Am, on(true, true, 1 << 20), 65536, true, none, false, true, Am),
            (Sc::Auto, on(true, true, 1 << 20), 0, true, none, false, true, Am),         // empty: nothing to register
        ];
        for &(scheme, rndv, size, s_contig, offer, key, r_contig, want) in table {
            let c = EpConfig { scheme, rndv, ..cfg() };
            assert_eq!(rts_offer(&c, size, s_contig), offer, "{scheme:?} {rndv:?} {size}");
            // (An empty rendezvous completes at the match, whatever the scheme.)
            if size > 0 {
                assert_eq!(rndv_scheme(&c, size, key, s_contig, r_contig), want, "{scheme:?} {rndv:?} {size}");
            }
        }
    }

    #[test]
    fn rma_protocols_by_lane_size_and_datatype() {
        use RmaProto::{Bcopy as B, Short as Sh, Zcopy as Z};
        // posix-like: short 100, bcopy 8 KiB, no zero-copy.
        let posix = RmaCaps { lane: 1, short_max: 100, bcopy_max: 8256, zcopy_max: 0, zcopy_thresh: 8257 };
        // cma-like: zero-copy only.
        let cma = RmaCaps { lane: 2, short_max: 0, bcopy_max: 0, zcopy_max: usize::MAX, zcopy_thresh: 0 };
        // rc-like: all three.
        let rc = RmaCaps { lane: 0, short_max: 124, bcopy_max: 8192, zcopy_max: 1 << 30, zcopy_thresh: 8193 };
        #[rustfmt::skip]
        type Row = (RmaCaps, usize, bool, Option<(RmaProto, usize)>);
        let table: &[Row] = &[
            (posix, 0, true, Some((Sh, 100))),
            (posix, 8, true, Some((Sh, 100))),
            (posix, 100, true, Some((Sh, 100))),
            (posix, 101, true, Some((B, 8256))),
            (posix, 8, false, Some((B, 8256))),      // an iov list is copied
            (posix, 1 << 20, true, Some((B, 8256))), // in pieces
            (cma, 0, true, Some((Z, usize::MAX))),
            (cma, 8, true, Some((Z, usize::MAX))),
            (cma, 8, false, Some((Z, usize::MAX))), // zero-copy only: one piece per iov entry
            (rc, 8, true, Some((Sh, 124))),
            (rc, 4096, true, Some((B, 8192))),
            (rc, 8193, true, Some((Z, 1 << 30))),
            (rc, 8193, false, Some((B, 8192))),
        ];
        for &(caps, len, contig, want) in table {
            let routes = RkeyRoutes { put: Some(caps), get: Some(caps), amo: None, sw_put_piece: None };
            for kind in [RmaOpKind::Put, RmaOpKind::Get] {
                let got = select_rma(&routes, kind, len, contig).map(|r| (r.proto, r.piece));
                assert_eq!(got, want, "{kind:?} {caps:?} {len} contig={contig}");
            }
        }
        // No route at all for a key the endpoint's lanes cannot use, unless it emulates.
        assert_eq!(select_rma(&RkeyRoutes::default(), RmaOpKind::Put, 8, true), None);
        let sw = RkeyRoutes { sw_put_piece: Some(8000), ..Default::default() };
        let put = select_rma(&sw, RmaOpKind::Put, 1 << 20, false).unwrap();
        assert_eq!((put.proto, put.piece), (RmaProto::Sw, 8000));
        let get = select_rma(&sw, RmaOpKind::Get, 1 << 20, true).unwrap();
        assert_eq!((get.proto, get.piece), (RmaProto::Sw, usize::MAX));
        // A lane that reaches the memory wins over emulation.
        let both = RkeyRoutes { put: Some(posix), ..sw };
        assert_eq!(select_rma(&both, RmaOpKind::Put, 8, true).unwrap().proto, Sh);
    }

    #[test]
    fn atomics_by_operation_and_size() {
        use uct::{AtomicOp as Op, AtomicOps as Ops};
        let cpu = Ops::ADD | Ops::AND | Ops::OR | Ops::XOR;
        let shm = AmoCaps {
            lane: 3,
            post32: cpu,
            post64: cpu,
            fetch32: cpu | Ops::SWAP | Ops::CSWAP,
            fetch64: cpu | Ops::SWAP | Ops::CSWAP,
        };
        // A device with 64-bit fetch-add and compare-and-swap only.
        let dev = AmoCaps { lane: 0, post64: Ops::ADD, fetch64: Ops::ADD | Ops::CSWAP, ..Default::default() };
        let amo = |op, fetch, size| RmaOpKind::Amo { op, fetch, size };
        #[rustfmt::skip]
        let table: &[(AmoCaps, RmaOpKind, bool)] = &[
            (shm, amo(Op::Add, false, 4), true),
            (shm, amo(Op::Xor, true, 8), true),
            (shm, amo(Op::Cswap, true, 4), true),
            (shm, amo(Op::Swap, false, 8), false),     // a swap always fetches
            (dev, amo(Op::Add, false, 8), true),
            (dev, amo(Op::Add, false, 4), false),
            (dev, amo(Op::And, true, 8), false),
            (dev, amo(Op::Cswap, true, 8), true),
        ];
        for &(caps, kind, ok) in table {
            let routes = RkeyRoutes { amo: Some(caps), ..Default::default() };
            let got = select_rma(&routes, kind, 0, true);
            assert_eq!(got.is_some(), ok, "{caps:?} {kind:?}");
            // With emulation, what the lane lacks is emulated.
            let sw = RkeyRoutes { sw_put_piece: Some(100), ..routes };
            let r = select_rma(&sw, kind, 0, true).unwrap();
            assert_eq!(r.proto == RmaProto::Sw, !ok);
            if let Some(r) = got {
                assert_eq!((r.lane, r.proto), (caps.lane, RmaProto::Amo));
            }
        }
    }
}
