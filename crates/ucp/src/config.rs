//! `UCX_*` configuration of a UCP context (UCX 1.13 names, meanings and defaults).

use ucs::config::{AllowList, Config, ConfigSource, MemUnits};
use ucs::{Status, UcsResult};

ucs::config_enum! {
    /// `UCX_RNDV_SCHEME`: how rendezvous moves the data.
    pub enum RndvScheme {
        /// Chosen from the lanes: active-message fragments when the AM lane's modeled bandwidth
        /// exceeds the zero-copy lane's (shared memory next to cma) and the context does not
        /// ask for wakeup, else get_zcopy when a lane can read remote memory, else put_zcopy,
        /// else active-message fragments.
        Auto = "auto",
        /// The receiver reads the data (RTS -> get -> ATS).
        GetZcopy = "get_zcopy",
        /// The sender writes the data after the receiver's RTR (RTS -> RTR -> put -> ATP).
        PutZcopy = "put_zcopy",
        /// The data goes as active-message fragments after the receiver's RTR.
        Am = "am",
    }
}

ucs::config_enum! {
    /// `UCX_ATOMIC_MODE`: which mechanism carries atomics. One location must never be updated
    /// by two mechanisms at once (a device's atomics are not atomic with the CPU's).
    pub enum AtomicMode {
        /// Device atomics when a device lane does every operation asked for, else CPU.
        Guess = "guess",
        /// CPU atomics: shared-memory lanes on mapped memory, and emulation over active
        /// messages (the target's CPU) everywhere else.
        Cpu = "cpu",
        /// Device atomics where a device lane does every operation asked for; emulation
        /// elsewhere (use it only where every peer reaches the memory through the device).
        Device = "device",
    }
}

ucs::config_table! {
    /// Context options (`UCX_*`).
    pub struct ContextConfigTable {
        pub tls: AllowList = ("TLS", "all",
            "Comma-separated list of transports to use. The order is not meaningful.\n \
             - all: every available transport; sm/shm: shared memory (posix, sysv, cma); mm: posix, sysv;\n \
             ib: rc_verbs, ud_verbs; rc/rc_v: rc_verbs (ud_verbs for bootstrap); ud/ud_v: ud_verbs; tcp.\n \
             A '^' prefix makes it a deny list; a '\\' prefix disables aliasing of that name."),
        pub net_devices: AllowList = ("NET_DEVICES", "all", "Network devices to use (e.g. rxe0:1); \"all\" uses every device."),
        pub shm_devices: AllowList = ("SHM_DEVICES", "all", "Intra-node devices to use; \"all\" uses every device."),
        pub self_devices: AllowList = ("SELF_DEVICES", "all", "Loop-back devices to use; \"all\" uses every device."),
        pub bcopy_thresh: MemUnits = ("BCOPY_THRESH", "auto", "Threshold for switching from short to bcopy protocol."),
        pub zcopy_thresh: MemUnits = ("ZCOPY_THRESH", "auto", "Threshold for switching from buffer copy to zero copy protocol."),
        pub rndv_thresh: MemUnits = ("RNDV_THRESH", "auto", "Threshold for switching from eager to rendezvous protocol."),
        pub rndv_scheme: RndvScheme = ("RNDV_SCHEME", "auto", "Communication scheme in the rendezvous protocol: auto, get_zcopy, put_zcopy, am."),
        pub atomic_mode: AtomicMode = ("ATOMIC_MODE", "guess",
            "Atomic operations synchronization mode.\n \
             cpu - atomic operations are consistent with respect to the CPU.\n \
             device - atomic operations are performed on one of the transport devices,\n \
             and there is guarantee of consistency with respect to the CPU.\n \
             guess - atomic operations mode is configured based on underlying\n \
             transport capabilities. If one of active transports supports\n \
             the DEVICE atomic mode, the DEVICE mode is selected.\n \
             Otherwise the CPU mode is selected."),
        pub seg_size: MemUnits = ("SEG_SIZE", "8192", "Size of a segment in the worker's preregistered memory pool."),
        pub proto_info: bool = ("PROTO_INFO", "n", "Print which protocol each operation and message size range uses."),
        pub tm_thresh: MemUnits = ("TM_THRESH", "1024",
            "Threshold for using tag matching offload capabilities.\n \
             Smaller buffers will not be posted to the transport."),
        pub tm_max_bb_size: MemUnits = ("TM_MAX_BB_SIZE", "1024",
            "Maximal size for posting \"bounce buffer\" (UCX preregistered memory) as a receive\n \
             buffer for a tag offload transport. Only effective when greater than TM_THRESH; at most\n \
             SEG_SIZE."),
        pub tm_force_thresh: MemUnits = ("TM_FORCE_THRESH", "8192",
            "Threshold for forcing tag matching offload mode. Every tag receive operation with\n \
             buffer bigger than this threshold would force offloading of all uncompleted\n \
             non-offloaded receive operations to the transport (e. g. operations with buffers\n \
             below the TM_THRESH value)."),
        pub tm_sw_rndv: bool = ("TM_SW_RNDV", "n",
            "Use software rendezvous protocol with tag offload. If enabled, tag offload mode will\n \
             be used for messages sent with eager protocol only."),
        pub max_eager_lanes: u32 = ("MAX_EAGER_LANES", "1", "Maximal number of devices on which an eager operation may be executed."),
        pub max_rndv_lanes: u32 = ("MAX_RNDV_LANES", "1", "Maximal number of devices on which a rendezvous operation may be executed."),
        pub keepalive_interval: std::time::Duration = ("KEEPALIVE_INTERVAL", "20s", "Time interval between keepalive rounds (0: no keepalive)."),
        pub keepalive_num_eps: u32 = ("KEEPALIVE_NUM_EPS", "128",
            "Maximal number of endpoints to check on every keepalive round\n \
             (inf - check all endpoints on every round, must be greater than 0)"),
    }
}

/// Transport name aliases accepted in `UCX_TLS` (UCX 1.13's list, for the transports this
/// project has or plans). A `:aux` suffix marks a transport used only for wireup.
pub const TL_ALIASES: &[(&str, &[&str])] = &[
    ("mm", &["posix", "sysv"]),
    ("sm", &["posix", "sysv", "cma"]),
    ("shm", &["posix", "sysv", "cma"]),
    ("ib", &["rc_verbs", "ud_verbs"]),
    ("rc", &["rc_verbs", "ud_verbs:aux"]),
    ("rc_v", &["rc_verbs", "ud_verbs:aux"]),
    ("ud", &["ud_verbs"]),
    ("ud_v", &["ud_verbs"]),
];

/// How a transport is used, after `UCX_TLS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlUse {
    /// For communication.
    Full,
    /// Only to carry wireup messages for another transport (`:aux` in an alias).
    AuxOnly,
    /// Not at all.
    Excluded,
}

/// `UCX_TLS` resolved against the aliases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlSelection {
    list: AllowList,
}

impl TlSelection {
    /// Wraps the parsed variable.
    pub fn new(list: AllowList) -> Self {
        TlSelection { list }
    }

    /// True for a `^` deny list.
    pub fn is_deny(&self) -> bool {
        matches!(self.list, AllowList::Deny(_))
    }

    /// True when the list admits every transport.
    pub fn is_all(&self) -> bool {
        matches!(self.list, AllowList::All)
    }

    /// How transport `tl` (e.g. `posix`) is used. `self` is always allowed unless denied by
    /// name, as in UCX (loopback needs it).
    pub fn use_of(&self, tl: &str) -> TlUse {
        let (names, deny) = match &self.list {
            AllowList::All => return TlUse::Full,
            AllowList::Allow(n) => (n, false),
            AllowList::Deny(n) => (n, true),
        };
        let mut found = None;
        for name in names {
            match Self::expand(name, tl) {
                Some(TlUse::Full) => {
                    found = Some(TlUse::Full);
                    break;
                }
                Some(u) => found = found.or(Some(u)),
                None => {}
            }
        }
        match (deny, found) {
            (false, Some(u)) => u,
            (false, None) if tl == "self" => TlUse::Full,
            (false, None) => TlUse::Excluded,
            (true, Some(TlUse::Full)) => TlUse::Excluded,
            (true, _) => TlUse::Full,
        }
    }

    /// What the list entry `name` says about `tl`.
    fn expand(name: &str, tl: &str) -> Option<TlUse> {
        if let Some(explicit) = name.strip_prefix('\\') {
            return (explicit == tl).then_some(TlUse::Full);
        }
        if name == "all" || name == tl {
            return Some(TlUse::Full);
        }
        let (_, members) = TL_ALIASES.iter().find(|(a, _)| *a == name)?;
        members.iter().find_map(|m| match m.split_once(':') {
            Some((t, "aux")) if t == tl => Some(TlUse::AuxOnly),
            None if *m == tl => Some(TlUse::Full),
            _ => None,
        })
    }

    /// The names in the list as written (empty for `all`).
    pub fn named(&self) -> Vec<String> {
        match &self.list {
            AllowList::Allow(n) | AllowList::Deny(n) => n.clone(),
            AllowList::All => Vec::new(),
        }
    }

    /// The transports an entry stands for (the entry itself when not an alias).
    pub fn members(name: &str) -> Vec<String> {
        let name = name.strip_prefix('\\').unwrap_or(name);
        match TL_ALIASES.iter().find(|(a, _)| *a == name) {
            Some((_, m)) => m.iter().map(|s| s.split(':').next().unwrap_or(s).to_string()).collect(),
            None => vec![name.to_string()],
        }
    }
}

/// A size threshold: automatic (from the performance model) or fixed by the user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thresh {
    /// From the performance model.
    Auto,
    /// Fixed, in bytes (`inf` is `usize::MAX`).
    Fixed(usize),
}

impl Thresh {
    fn from_units(v: MemUnits) -> Self {
        match v {
            MemUnits::Auto => Thresh::Auto,
            MemUnits::Inf => Thresh::Fixed(usize::MAX),
            MemUnits::Value(n) => Thresh::Fixed(n),
        }
    }
}

/// Validated context configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ContextConfig {
    /// `UCX_TLS`.
    pub tls: TlSelection,
    /// `UCX_NET_DEVICES`.
    pub net_devices: AllowList,
    /// `UCX_SHM_DEVICES`.
    pub shm_devices: AllowList,
    /// `UCX_SELF_DEVICES`.
    pub self_devices: AllowList,
    /// `UCX_BCOPY_THRESH`: eager short below, bcopy from here.
    pub bcopy_thresh: Thresh,
    /// `UCX_ZCOPY_THRESH`: eager bcopy below, zcopy from here.
    pub zcopy_thresh: Thresh,
    /// `UCX_RNDV_THRESH`: eager below, rendezvous from here.
    pub rndv_thresh: Thresh,
    /// `UCX_RNDV_SCHEME`.
    pub rndv_scheme: RndvScheme,
    /// `UCX_ATOMIC_MODE`.
    pub atomic_mode: AtomicMode,
    /// `UCX_SEG_SIZE`: size of the worker's bounce buffers.
    pub seg_size: usize,
    /// `UCX_PROTO_INFO`.
    pub proto_info: bool,
    /// `UCX_TM_THRESH`: receives from this size on may be posted to a transport's tag
    /// matching (`usize::MAX`: never).
    pub tm_thresh: usize,
    /// `UCX_TM_SW_RNDV`: rendezvous through the tag lane as software requests only.
    pub tm_sw_rndv: bool,
    /// `UCX_TM_MAX_BB_SIZE`: receives below this size are posted to a transport's tag
    /// matching with a preregistered bounce buffer (capped at `UCX_SEG_SIZE`).
    pub tm_max_bb_size: usize,
    /// `UCX_TM_FORCE_THRESH`: a receive this large offloads the software receives waiting
    /// before it first.
    pub tm_force_thresh: usize,
    /// `UCX_MAX_EAGER_LANES`.
    pub max_eager_lanes: usize,
    /// `UCX_MAX_RNDV_LANES`.
    pub max_rndv_lanes: usize,
    /// `UCX_KEEPALIVE_INTERVAL`: how often endpoints check that their peer is alive (zero: never).
    pub keepalive_interval: std::time::Duration,
    /// `UCX_KEEPALIVE_NUM_EPS`: endpoints checked per keepalive round.
    pub keepalive_num_eps: usize,
    /// Overrides that are not UCP's own settings (`RC_TIMEOUT`, `POSIX_FIFO_SIZE`), kept for the
    /// transports whose prefixes they carry, as `ucp_config_modify` does.
    pub tl_config: Vec<(String, String)>,
}

impl ContextConfig {
    /// Reads `UCX_*` from `source` (the environment unless given), applies `overrides`
    /// (names without the `UCX_` prefix) and validates.
    pub fn read(source: Option<&dyn ConfigSource>, overrides: &[(String, String)]) -> UcsResult<Self> {
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let mut t = match source {
            Some(s) => ContextConfigTable::read_from(s, &[""]),
            None => ContextConfigTable::read(&[""]),
        }
        .map_err(report)?;
        let mut tl_config = Vec::new();
        for (name, value) in overrides {
            match t.set(name, value) {
                Ok(()) => {}
                Err(ucs::config::ConfigError::UnknownField { .. }) => tl_config.push((name.clone(), value.clone())),
                Err(e) => return Err(report(e)),
            }
        }
        let seg_size = match t.seg_size {
            MemUnits::Value(v) if (512..=(1 << 30)).contains(&v) => v,
            MemUnits::Auto => 8192,
            other => {
                tracing::error!("invalid value for UCX_SEG_SIZE: {other:?} (must be between 512 bytes and 1G)");
                return Err(Status::InvalidParam);
            }
        };
        for (var, v) in [
            ("MAX_EAGER_LANES", t.max_eager_lanes),
            ("MAX_RNDV_LANES", t.max_rndv_lanes),
            ("KEEPALIVE_NUM_EPS", t.keepalive_num_eps),
        ] {
            if v == 0 {
                tracing::error!("invalid value for UCX_{var}: 0 (must be at least 1)");
                return Err(Status::InvalidParam);
            }
        }
        Ok(ContextConfig {
            tls: TlSelection::new(t.tls),
            net_devices: t.net_devices,
            shm_devices: t.shm_devices,
            self_devices: t.self_devices,
            bcopy_thresh: Thresh::from_units(t.bcopy_thresh),
            zcopy_thresh: Thresh::from_units(t.zcopy_thresh),
            rndv_thresh: Thresh::from_units(t.rndv_thresh),
            rndv_scheme: t.rndv_scheme,
            atomic_mode: t.atomic_mode,
            seg_size,
            proto_info: t.proto_info,
            tm_thresh: match t.tm_thresh {
                MemUnits::Value(v) => v,
                MemUnits::Inf => usize::MAX,
                MemUnits::Auto => 1024,
            },
            tm_sw_rndv: t.tm_sw_rndv,
            tm_max_bb_size: match t.tm_max_bb_size {
                MemUnits::Value(v) => v.min(seg_size),
                MemUnits::Inf | MemUnits::Auto => seg_size,
            },
            tm_force_thresh: match t.tm_force_thresh {
                MemUnits::Value(v) => v,
                MemUnits::Inf => usize::MAX,
                MemUnits::Auto => 8192,
            },
            max_eager_lanes: t.max_eager_lanes as usize,
            max_rndv_lanes: t.max_rndv_lanes as usize,
            keepalive_interval: t.keepalive_interval,
            keepalive_num_eps: t.keepalive_num_eps as usize,
            tl_config,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> TlSelection {
        use ucs::config::ConfigValue;
        TlSelection::new(AllowList::parse_value(s).unwrap())
    }

    #[test]
    fn aliases_expand() {
        let s = sel("shm");
        for tl in ["posix", "sysv", "cma", "self"] {
            assert_eq!(s.use_of(tl), TlUse::Full, "{tl}");
        }
        assert_eq!(s.use_of("rc_verbs"), TlUse::Excluded);
        let s = sel("rc_v");
        assert_eq!(s.use_of("rc_verbs"), TlUse::Full);
        assert_eq!(s.use_of("ud_verbs"), TlUse::AuxOnly);
        let s = sel("rc_v,ud_v");
        assert_eq!(s.use_of("ud_verbs"), TlUse::Full);
        assert_eq!(sel("all").use_of("tcp"), TlUse::Full);
    }

    #[test]
    fn deny_list_and_explicit_names() {
        let s = sel("^cma");
        assert_eq!(s.use_of("cma"), TlUse::Excluded);
        assert_eq!(s.use_of("posix"), TlUse::Full);
        let s = sel("^shm");
        assert_eq!(s.use_of("sysv"), TlUse::Excluded);
        assert_eq!(s.use_of("self"), TlUse::Full);
        assert_eq!(sel("\\posix").use_of("posix"), TlUse::Full);
        assert_eq!(sel("\\shm").use_of("posix"), TlUse::Excluded);
        assert_eq!(sel("posix").use_of("self"), TlUse::Full, "self stays for loopback");
        assert_eq!(sel("^self").use_of("self"), TlUse::Excluded);
    }

    #[test]
    fn defaults_and_errors() {
        let src: std::collections::BTreeMap<String, String> = Default::default();
        let c = ContextConfig::read(Some(&src as &dyn ConfigSource), &[]).unwrap();
        assert!(c.tls.is_all());
        assert_eq!((c.rndv_thresh, c.rndv_scheme, c.seg_size), (Thresh::Auto, RndvScheme::Auto, 8192));
        assert_eq!(c.tm_thresh, 1024);
        assert_eq!((c.tm_max_bb_size, c.tm_force_thresh, c.tm_sw_rndv), (1024, 8192, false));
        let o = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        let c = ContextConfig::read(Some(&src as &dyn ConfigSource), &o("RNDV_THRESH", "inf")).unwrap();
        assert_eq!(c.rndv_thresh, Thresh::Fixed(usize::MAX));
        let c = ContextConfig::read(Some(&src as &dyn ConfigSource), &o("RNDV_SCHEME", "put_zcopy")).unwrap();
        assert_eq!(c.rndv_scheme, RndvScheme::PutZcopy);
        assert!(ContextConfig::read(Some(&src as &dyn ConfigSource), &o("RNDV_SCHEME", "sideways")).is_err());
        assert!(ContextConfig::read(Some(&src as &dyn ConfigSource), &o("SEG_SIZE", "1")).is_err());
        assert_eq!(c.atomic_mode, AtomicMode::Guess);
        let c = ContextConfig::read(Some(&src as &dyn ConfigSource), &o("ATOMIC_MODE", "cpu")).unwrap();
        assert_eq!(c.atomic_mode, AtomicMode::Cpu);
        assert!(ContextConfig::read(Some(&src as &dyn ConfigSource), &o("ATOMIC_MODE", "gpu")).is_err());
    }
}
