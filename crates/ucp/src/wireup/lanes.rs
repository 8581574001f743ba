//! Lane selection, sans IO: which transport pair carries which kind of traffic between two
//! workers, from the records of both workers' addresses.
//!
//! Every score is a symmetric function of the two records of a pair (latency: the larger;
//! overhead: the sum; bandwidth: the smaller) and ties break on transport and device names, so
//! both peers compute the same lanes from the same two addresses, whichever side runs it.

use uct::{DeviceType, IfaceFlags};

use crate::wireup::address::{IfaceRecord, WorkerAddress};

/// A pair of interfaces, one on each side: indices into the two address records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LanePair {
    /// Index into the local worker's records.
    pub local: usize,
    /// Index into the remote worker's records.
    pub remote: usize,
}

/// The lanes of an endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lanes {
    /// Active messages (eager, protocol control).
    pub am: Option<LanePair>,
    /// Wireup messages: the AM lane when it connects to the remote interface, else the best
    /// pair that does (possibly a wireup-only `:aux` transport), which carries the endpoint
    /// addresses of the lanes that connect endpoint to endpoint.
    pub wireup: Option<LanePair>,
    /// Remote memory access, best first.
    pub rma: Vec<LanePair>,
    /// Atomics.
    pub amo: Option<LanePair>,
    /// Rendezvous bulk data (zero-copy get or put), best first, at most `max_rndv_lanes`.
    pub rndv: Vec<LanePair>,
    /// Tagged sends through the transport's tag matching (UCX's tag lane): a pair whose
    /// interfaces both have tag offload on (eager bcopy and rendezvous), get zero-copy and a
    /// pending queue, at least as fast as the AM lane. With one, every tagged send of the
    /// endpoint goes there (one path keeps one sender's messages in order).
    pub tag: Option<LanePair>,
}

/// What the selection may use.
#[derive(Clone, Copy, Debug)]
pub struct LaneLimits {
    /// `UCX_MAX_RNDV_LANES`.
    pub max_rndv_lanes: usize,
    /// Whether atomics were asked for (AMO32/AMO64 features).
    pub atomics: bool,
    /// Whether tag matching was asked for (TAG feature): a tag lane may be chosen.
    pub tag: bool,
}

/// The model of one pair, symmetric in its two records.
#[derive(Clone, Copy, Debug)]
struct PairModel {
    latency: f64,
    overhead: f64,
    bandwidth: f64,
}

/// A candidate pair with its model.
type Candidate = (LanePair, PairModel);

/// An order on candidates.
type CandidateOrder<'a> = &'a dyn Fn(&Candidate, &Candidate) -> std::cmp::Ordering;

fn model(a: &IfaceRecord, b: &IfaceRecord) -> PairModel {
    PairModel {
        latency: a.latency_ns.max(b.latency_ns),
        overhead: a.overhead_ns + b.overhead_ns,
        bandwidth: a.bandwidth.min(b.bandwidth),
    }
}

/// Can `a` (on a worker with uuid `ua`) talk to `b` (uuid `ub`)? Same transport and device
/// type; loopback only within one worker; other devices when the transport says so (the
/// caller's `reachable`, e.g. `Iface::is_reachable`). Shared memory and loopback never cross
/// to another worker of another kind.
fn can_pair(
    ua: u64,
    a: &IfaceRecord,
    ub: u64,
    b: &IfaceRecord,
    reachable: &dyn Fn(&IfaceRecord, &IfaceRecord) -> bool,
) -> bool {
    if a.tl_name != b.tl_name || a.dev_type != b.dev_type {
        return false;
    }
    if a.dev_type == DeviceType::SelfDev && ua != ub {
        return false;
    }
    reachable(a, b)
}

/// A deterministic order key for ties: both names of the lower-sorting record first.
fn tie_key<'a>(a: &'a IfaceRecord, b: &'a IfaceRecord) -> (&'a str, &'a str, &'a str, &'a str) {
    let (x, y) = if (a.tl_name.as_str(), a.dev_name.as_str()) <= (b.tl_name.as_str(), b.dev_name.as_str()) {
        (a, b)
    } else {
        (b, a)
    };
    (&x.tl_name, &x.dev_name, &y.tl_name, &y.dev_name)
}

/// Chooses the lanes between `local` and `remote`. `reachable(local_rec, remote_rec)` asks the
/// transport whether the remote interface can be reached (it must be symmetric).
pub fn select(
    local: &WorkerAddress,
    remote: &WorkerAddress,
    limits: LaneLimits,
    reachable: &dyn Fn(&IfaceRecord, &IfaceRecord) -> bool,
) -> Lanes {
    let mut pairs: Vec<Candidate> = Vec::new();
    for (i, a) in local.ifaces.iter().enumerate() {
        for (j, b) in remote.ifaces.iter().enumerate() {
            if can_pair(local.uuid, a, remote.uuid, b, reachable) {
                pairs.push((LanePair { local: i, remote: j }, model(a, b)));
            }
        }
    }
    let rec = |p: &LanePair| (&local.ifaces[p.local], &remote.ifaces[p.remote]);
    let both = |p: &LanePair, f: IfaceFlags| {
        let (a, b) = rec(p);
        a.flags.contains(f) && b.flags.contains(f)
    };
    let to_iface = |p: &LanePair| both(p, IfaceFlags::CONNECT_TO_IFACE);
    let to_ep = |p: &LanePair| both(p, IfaceFlags::CONNECT_TO_EP);
    let ties = |x: &Candidate, y: &Candidate| {
        let (xa, xb) = rec(&x.0);
        let (ya, yb) = rec(&y.0);
        tie_key(xa, xb).cmp(&tie_key(ya, yb))
    };
    // Lowest latency + overhead for messages; highest bandwidth for bulk data.
    let by_latency = |x: &Candidate, y: &Candidate| {
        (x.1.latency + x.1.overhead).total_cmp(&(y.1.latency + y.1.overhead)).then_with(|| ties(x, y))
    };
    let by_bandwidth = |x: &Candidate, y: &Candidate| y.1.bandwidth.total_cmp(&x.1.bandwidth).then_with(|| ties(x, y));
    let pick = |filter: &dyn Fn(&LanePair) -> bool, order: CandidateOrder<'_>| {
        let mut v: Vec<Candidate> = pairs.iter().filter(|(p, _)| filter(p)).copied().collect();
        v.sort_by(|x, y| order(x, y));
        v.into_iter().map(|(p, _)| p).collect::<Vec<_>>()
    };
    // Endpoint-to-endpoint pairs need a pair that reaches the remote interface to carry their
    // addresses; without one they are out.
    let wireup_carrier = pick(&|p| to_iface(p) && both(p, IfaceFlags::AM_BCOPY), &by_latency).first().copied();
    let data = |p: &LanePair| {
        let (a, b) = rec(p);
        !a.aux && !b.aux && (to_iface(p) || (to_ep(p) && wireup_carrier.is_some()))
    };
    let am = pick(&|p| data(p) && both(p, IfaceFlags::AM_BCOPY), &by_latency).first().copied();
    let wireup = match am {
        Some(p) if to_iface(&p) => Some(p),
        Some(_) => wireup_carrier,
        None => None,
    };
    let rma = pick(
        &|p| {
            data(p)
                && (both(p, IfaceFlags::PUT_SHORT | IfaceFlags::GET_SHORT)
                    || both(p, IfaceFlags::PUT_ZCOPY)
                    || both(p, IfaceFlags::GET_ZCOPY)
                    || both(p, IfaceFlags::PUT_BCOPY | IfaceFlags::GET_BCOPY))
        },
        &by_latency,
    );
    let amo = if limits.atomics {
        pick(&|p| data(p) && (both(p, IfaceFlags::ATOMIC_CPU) || both(p, IfaceFlags::ATOMIC_DEVICE)), &by_latency)
            .first()
            .copied()
    } else {
        None
    };
    let mut rndv =
        pick(&|p| data(p) && (both(p, IfaceFlags::GET_ZCOPY) || both(p, IfaceFlags::PUT_ZCOPY)), &by_bandwidth);
    rndv.truncate(limits.max_rndv_lanes);
    let tag = if limits.tag {
        let offload = IfaceFlags::TAG_EAGER_BCOPY | IfaceFlags::TAG_RNDV_ZCOPY | IfaceFlags::GET_ZCOPY;
        let best = pick(&|p| data(p) && both(p, offload) && both(p, IfaceFlags::PENDING), &by_latency).first().copied();
        // Only where it is as fast as the AM lane (UCX: its score is not below the AM lane's).
        let cost = |p: &LanePair| {
            let m = pairs.iter().find(|(q, _)| q == p).map(|(_, m)| m.latency + m.overhead);
            m.unwrap_or(f64::INFINITY)
        };
        best.filter(|t| am.is_some_and(|a| cost(t) <= cost(&a)))
    } else {
        None
    };
    Lanes { am, wireup, rma, amo, rndv, tag }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(tl: &str, dt: DeviceType, flags: IfaceFlags, lat: f64, bw: f64) -> IfaceRecord {
        IfaceRecord {
            tl_name: tl.into(),
            dev_name: "memory".into(),
            dev_type: dt,
            aux: false,
            flags,
            latency_ns: lat,
            bandwidth: bw,
            overhead_ns: 10.0,
            dev_addr: vec![1],
            iface_addr: vec![2],
        }
    }

    fn shm_worker(uuid: u64) -> WorkerAddress {
        let am = IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY | IfaceFlags::CONNECT_TO_IFACE;
        let rma = IfaceFlags::PUT_SHORT | IfaceFlags::GET_SHORT | IfaceFlags::ATOMIC_CPU;
        WorkerAddress {
            uuid,
            name: String::new(),
            ifaces: vec![
                rec("self", DeviceType::SelfDev, am | rma, 0.0, 6e9),
                rec("posix", DeviceType::Shm, am | rma, 80.0, 12e9),
                rec("sysv", DeviceType::Shm, am | rma, 80.0, 12e9),
                rec(
                    "cma",
                    DeviceType::Shm,
                    IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY | IfaceFlags::CONNECT_TO_IFACE,
                    300.0,
                    14e9,
                ),
            ],
        }
    }

    const LIMITS: LaneLimits = LaneLimits { max_rndv_lanes: 1, atomics: true, tag: true };

    #[test]
    fn same_worker_uses_self_other_process_uses_shm() {
        let a = shm_worker(1);
        let all = |_: &IfaceRecord, _: &IfaceRecord| true;
        let l = select(&a, &a, LIMITS, &all);
        assert_eq!(l.am, Some(LanePair { local: 0, remote: 0 }), "self for the same worker");
        let b = shm_worker(2);
        let l = select(&a, &b, LIMITS, &all);
        assert_eq!(l.am, Some(LanePair { local: 1, remote: 1 }), "posix before sysv on a tie");
        assert_eq!(l.rndv, [LanePair { local: 3, remote: 3 }], "cma has the bandwidth");
        assert_eq!(l.amo, Some(LanePair { local: 1, remote: 1 }));
    }

    #[test]
    fn both_sides_choose_the_same_lanes() {
        let mut a = shm_worker(1);
        let mut b = shm_worker(2);
        // Different record orders and models on the two sides.
        b.ifaces.reverse();
        a.ifaces[2].latency_ns = 70.0;
        b.ifaces[1].latency_ns = 70.0; // sysv, in b's reversed order
        let all = |_: &IfaceRecord, _: &IfaceRecord| true;
        let ab = select(&a, &b, LIMITS, &all);
        let ba = select(&b, &a, LIMITS, &all);
        let names = |l: &Option<LanePair>, x: &WorkerAddress, y: &WorkerAddress| {
            l.map(|p| (x.ifaces[p.local].tl_name.clone(), y.ifaces[p.remote].tl_name.clone()))
        };
        assert_eq!(names(&ab.am, &a, &b), Some(("sysv".into(), "sysv".into())));
        assert_eq!(names(&ba.am, &b, &a), Some(("sysv".into(), "sysv".into())));
    }

    #[test]
    fn unreachable_pairs_are_skipped() {
        let a = shm_worker(1);
        let b = shm_worker(2);
        let only_sysv = |x: &IfaceRecord, _: &IfaceRecord| x.tl_name == "sysv";
        let l = select(&a, &b, LIMITS, &only_sysv);
        assert_eq!(l.am, Some(LanePair { local: 2, remote: 2 }));
        assert!(l.rndv.is_empty());
        let none = |_: &IfaceRecord, _: &IfaceRecord| false;
        assert_eq!(select(&a, &b, LIMITS, &none), Lanes::default());
    }

    /// rc (endpoint to endpoint) and ud (to interface) on a network device.
    fn ib_worker(uuid: u64, ud_aux: bool) -> WorkerAddress {
        let am = IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY;
        let rc =
            am | IfaceFlags::CONNECT_TO_EP | IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY | IfaceFlags::ATOMIC_DEVICE;
        let mut ud = rec("ud_verbs", DeviceType::Net, am | IfaceFlags::CONNECT_TO_IFACE, 900.0, 1e9);
        ud.aux = ud_aux;
        WorkerAddress { uuid, name: String::new(), ifaces: vec![rec("rc_verbs", DeviceType::Net, rc, 700.0, 3e9), ud] }
    }

    #[test]
    fn a_tag_lane_where_both_sides_have_tag_matching_and_it_is_the_fastest() {
        let all = |_: &IfaceRecord, _: &IfaceRecord| true;
        let tm = IfaceFlags::TAG_EAGER_BCOPY | IfaceFlags::TAG_RNDV_ZCOPY | IfaceFlags::PENDING;
        let (a, b) = (ib_worker(1, false), ib_worker(2, false));
        assert_eq!(select(&a, &b, LIMITS, &all).tag, None, "no tag matching on");
        let (mut a, mut b) = (a, b);
        a.ifaces[0].flags |= tm;
        assert_eq!(select(&a, &b, LIMITS, &all).tag, None, "on one side only");
        b.ifaces[0].flags |= tm;
        let rc = Some(LanePair { local: 0, remote: 0 });
        assert_eq!(select(&a, &b, LIMITS, &all).tag, rc);
        assert_eq!(select(&b, &a, LIMITS, &all).tag, rc, "both sides agree");
        assert_eq!(select(&a, &b, LaneLimits { tag: false, ..LIMITS }, &all).tag, None, "without the TAG feature");
        // Slower than the AM lane (shared memory, say): no tag lane.
        a.ifaces[1].latency_ns = 10.0;
        b.ifaces[1].latency_ns = 10.0;
        let l = select(&a, &b, LIMITS, &all);
        assert_eq!(l.am, Some(LanePair { local: 1, remote: 1 }));
        assert_eq!(l.tag, None);
    }

    #[test]
    fn endpoint_to_endpoint_lanes_are_wired_up_through_an_interface_lane() {
        let all = |_: &IfaceRecord, _: &IfaceRecord| true;
        for aux in [true, false] {
            let (a, b) = (ib_worker(1, aux), ib_worker(2, aux));
            let l = select(&a, &b, LIMITS, &all);
            let rc = Some(LanePair { local: 0, remote: 0 });
            assert_eq!(l.am, rc, "rc has the lower latency");
            assert_eq!(l.wireup, Some(LanePair { local: 1, remote: 1 }), "ud carries the wireup");
            assert_eq!(l.amo, rc);
            assert_eq!(l.rndv, [LanePair { local: 0, remote: 0 }]);
            assert!(l.rma.iter().all(|p| p.local == 0), "{:?}", l.rma);
        }
        // A wireup-only transport is never a data lane, even when it is the better one.
        let (mut a, mut b) = (ib_worker(1, true), ib_worker(2, true));
        a.ifaces[1].latency_ns = 1.0;
        b.ifaces[1].latency_ns = 1.0;
        let l = select(&a, &b, LIMITS, &all);
        assert_eq!(l.am, Some(LanePair { local: 0, remote: 0 }));
        // Aux on one side only still keeps it out on both.
        let l2 = select(&b, &ib_worker(3, false), LIMITS, &all);
        assert_eq!(l2.am, Some(LanePair { local: 0, remote: 0 }));
        // With no pair reaching an interface, rc cannot be wired up: no lanes at all.
        let only_rc = |x: &IfaceRecord, _: &IfaceRecord| x.tl_name == "rc_verbs";
        assert_eq!(select(&a, &b, LIMITS, &only_rc), Lanes::default());
        // An interface lane carries its own wireup.
        let only_ud = |x: &IfaceRecord, _: &IfaceRecord| x.tl_name == "ud_verbs";
        let (a, b) = (ib_worker(1, false), ib_worker(2, false));
        let l = select(&a, &b, LIMITS, &only_ud);
        assert_eq!((l.am, l.wireup), (Some(LanePair { local: 1, remote: 1 }), Some(LanePair { local: 1, remote: 1 })));
    }

    #[test]
    fn shared_memory_wires_up_a_network_bandwidth_lane() {
        let all = |_: &IfaceRecord, _: &IfaceRecord| true;
        let mut a = ib_worker(1, false);
        a.ifaces.pop();
        let mut s = shm_worker(1);
        s.ifaces.truncate(2); // self, posix: no zero-copy
        a.ifaces.extend(s.ifaces);
        let mut b = a.clone();
        b.uuid = 2;
        let l = select(&a, &b, LIMITS, &all);
        assert_eq!(l.am, Some(LanePair { local: 2, remote: 2 }), "posix");
        assert_eq!(l.wireup, l.am);
        assert_eq!(l.rndv, [LanePair { local: 0, remote: 0 }], "rc, connected through posix");
    }
}
