//! An endpoint's protocol switch points ([`EpConfig`]): from its lanes' performance models
//! and the `UCX_*` thresholds, once per endpoint.

use crate::config::{ContextConfig, RndvScheme, Thresh};
use crate::wire;
use crate::wireup::address::IfaceRecord;

/// What the rendezvous lane of an endpoint can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RndvCaps {
    /// Both sides can get.
    pub get: bool,
    /// Both sides can put.
    pub put: bool,
    /// Largest message one zero-copy operation moves.
    pub max_zcopy: usize,
}

/// Protocol switch points of an endpoint, from its lanes and the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The rendezvous lane, if the endpoint has one.
    pub rndv: Option<RndvCaps>,
    /// How many transport endpoints the endpoint has (a flush goes through each).
    pub uct_lanes: u8,
    /// The tag lane's limits, if the endpoint has one: then every tagged send goes there.
    pub tag: Option<TagLaneCaps>,
}

/// What the tag lane of an endpoint takes (its transport's `cap.tag`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TagLaneCaps {
    /// Payloads up to this go with `tag_eager_short` (`None`: the lane has no eager short).
    pub short_max: Option<usize>,
    /// Payloads up to this go with `tag_eager_bcopy` (one message: there are no fragments
    /// through tag matching); larger ones go rendezvous.
    pub bcopy_max: usize,
    /// Contiguous rendezvous up to this size are offloaded (`tag_rndv_zcopy`: the receiver's
    /// transport reads the data); 0: every rendezvous goes as a software request
    /// (`UCX_TM_SW_RNDV`, or the lane cannot).
    pub hw_rndv_max: usize,
}

/// The transports of an endpoint's lanes, as [`EpConfig::new`] needs them.
pub(crate) struct LaneModels<'a> {
    /// The AM lane's interface attributes and address record.
    pub am: (&'a uct::IfaceAttr, &'a IfaceRecord),
    /// The rendezvous lane's capabilities and record.
    pub rndv: Option<(RndvCaps, &'a IfaceRecord)>,
    /// The tag lane's interface attributes, if the endpoint has one.
    pub tag: Option<&'a uct::IfaceAttr>,
}

impl EpConfig {
    /// The switch points for an endpoint with `lanes` under configuration `cfg` (`wakeup`: the
    /// context has the WAKEUP feature).
    pub fn new(lanes: &LaneModels<'_>, cfg: &ContextConfig, wakeup: bool) -> EpConfig {
        let (am_attr, am_rec) = lanes.am;
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
            && am_attr.am.max_hdr >= wire::len::MAX_DATA_HDR
            && am_attr.am.max_zcopy > wire::len::MAX_DATA_HDR;
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
            Thresh::Auto => match lanes.rndv {
                Some((_, r)) => auto_rndv_thresh(am_rec, r, bcopy_max),
                None => usize::MAX,
            },
        };
        let scheme = match cfg.rndv_scheme {
            RndvScheme::Auto => auto_rndv_scheme(am_rec, lanes.rndv.map(|(_, r)| r), wakeup),
            s => s,
        };
        EpConfig {
            short_lim,
            bcopy_max,
            rndv_thresh,
            zcopy_thresh,
            zcopy_max: am_attr.am.max_zcopy,
            scheme,
            rndv: lanes.rndv.map(|(c, _)| c),
            uct_lanes: 0,
            tag: lanes.tag.map(|a| {
                let mut short_max = a.flags.contains(uct::IfaceFlags::TAG_EAGER_SHORT).then_some(a.tag.eager.max_short);
                // `UCX_BCOPY_THRESH`: copied from that size on.
                if let Thresh::Fixed(t) = cfg.bcopy_thresh {
                    short_max = short_max.and_then(|m| t.checked_sub(1).map(|u| m.min(u)));
                }
                let hw = a.flags.contains(uct::IfaceFlags::TAG_RNDV_ZCOPY)
                    && !cfg.tm_sw_rndv
                    && a.tag.rndv.max_hdr >= wire::OffloadRndvHdr::LEN;
                TagLaneCaps {
                    short_max,
                    bcopy_max: a.tag.eager.max_bcopy,
                    hw_rndv_max: if hw { a.tag.rndv.max_zcopy } else { 0 },
                }
            }),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use uct::DeviceType;

    pub(crate) fn rec(tl: &str, bw_mbs: f64) -> IfaceRecord {
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
