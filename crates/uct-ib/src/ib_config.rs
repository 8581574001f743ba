//! The InfiniBand interface settings every verbs transport has (UCX's `uct_ib_iface_config_t`):
//! buffer size, queue lengths, polling batches and addressing (GID index, traffic class, hop
//! limit, service level). Each transport reads them with its own prefixes (`RC_VERBS_`, `RC_`,
//! `IB_` for rc_verbs; `UD_VERBS_`, `UD_`, `IB_` for ud_verbs) beside its own table.

use ucs::config::{AutoOr, Config, ConfigSource, MemUnits};
use ucs::{Status, UcsResult};

ucs::config_table! {
    /// Options shared by the verbs transports (UCX 1.13 names and defaults).
    pub struct IbIfaceConfigTable {
        pub seg_size: MemUnits = ("SEG_SIZE", "8192", "Size of bounce buffers used for post_send and post_recv."),
        pub tx_queue_len: u32 = ("TX_QUEUE_LEN", "256", "Length of send queue in the QP."),
        pub tx_max_poll: u32 = ("TX_MAX_POLL", "16", "Max number of send completions to pick per progress."),
        pub tx_min_inline: u32 = ("TX_MIN_INLINE", "64", "Bytes to reserve in send WQE for inline data."),
        pub rx_queue_len: u32 = ("RX_QUEUE_LEN", "4096", "Length of receive queue in the QPs."),
        pub rx_max_batch: u32 = ("RX_MAX_BATCH", "16", "How many post-receives to perform in one batch."),
        pub rx_max_poll: u32 = ("RX_MAX_POLL", "16", "Max number of receive completions to pick per progress."),
        pub gid_index: AutoOr<u32> = ("GID_INDEX", "auto",
            "Port GID index to use; auto selects RoCE v2 with an IPv4 address first."),
        pub traffic_class: AutoOr<u32> = ("TRAFFIC_CLASS", "auto", "IB traffic class / IP DSCP << 2 (0..255)."),
        pub hop_limit: u32 = ("HOP_LIMIT", "255", "IB hop limit / TTL of RoCE v2 packets (0..255)."),
        pub sl: AutoOr<u32> = ("SL", "auto", "InfiniBand service level (0..15)."),
    }
}

/// Validated shared settings of one verbs interface.
#[derive(Clone, Debug, PartialEq)]
pub struct IbIfaceConfig {
    /// Descriptor size (largest message, headers included).
    pub seg_size: usize,
    /// Send-queue length.
    pub tx_queue_len: u32,
    /// Send completions handled per progress call.
    pub tx_max_poll: usize,
    /// Inline bytes requested per send WQE.
    pub tx_min_inline: u32,
    /// Receives posted.
    pub rx_queue_len: u32,
    /// Receives posted per batch.
    pub rx_max_batch: usize,
    /// Receive completions handled per progress call.
    pub rx_max_poll: usize,
    /// Forced GID index.
    pub gid_index: Option<u32>,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level.
    pub sl: u8,
}

/// Logs an invalid value of `var` for the transport whose prefixes are `prefixes`.
pub(crate) fn invalid(prefixes: &[&str], var: &str, value: impl std::fmt::Display, why: &str) -> Status {
    let names: Vec<String> = prefixes.iter().map(|p| format!("UCX_{p}{var}")).collect();
    tracing::error!("invalid value for {}: {value} ({why})", names.join(" / "));
    Status::InvalidParam
}

impl IbIfaceConfig {
    /// Reads the shared table with `prefixes` from the environment (or `source`), applies the
    /// overrides that name one of its fields and validates; returns the other overrides for the
    /// transport's own tables. `min_seg` is the transport's smallest usable buffer.
    pub(crate) fn read<'a>(
        source: Option<&dyn ConfigSource>,
        prefixes: &[&str],
        overrides: &'a [(String, String)],
        min_seg: usize,
    ) -> UcsResult<(IbIfaceConfig, Vec<&'a (String, String)>)> {
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let mut t = match source {
            Some(s) => IbIfaceConfigTable::read_from(s, prefixes),
            None => IbIfaceConfigTable::read(prefixes),
        }
        .map_err(report)?;
        let mut rest = Vec::new();
        for o in overrides {
            if IbIfaceConfigTable::table().field(&o.0).is_some() {
                t.set(&o.0, &o.1).map_err(report)?;
            } else {
                rest.push(o);
            }
        }
        let bad = |var: &str, value: String, why: &str| invalid(prefixes, var, value, why);
        let seg_size = match t.seg_size {
            MemUnits::Value(v) if (min_seg..=(1 << 20)).contains(&v) => v,
            MemUnits::Auto => 8192,
            other => return Err(bad("SEG_SIZE", format!("{other:?}"), &format!("must be {min_seg} bytes to 1 MiB"))),
        };
        if !(16..=32768).contains(&t.tx_queue_len) {
            return Err(bad("TX_QUEUE_LEN", t.tx_queue_len.to_string(), "must be 16..32768"));
        }
        if !(16..=(1 << 20)).contains(&t.rx_queue_len) {
            return Err(bad("RX_QUEUE_LEN", t.rx_queue_len.to_string(), "must be 16..1048576"));
        }
        for (name, v) in
            [("TX_MAX_POLL", t.tx_max_poll), ("RX_MAX_POLL", t.rx_max_poll), ("RX_MAX_BATCH", t.rx_max_batch)]
        {
            if v == 0 {
                return Err(bad(name, v.to_string(), "must be at least 1"));
            }
        }
        let byte = |name: &str, v: u32, max: u32| -> UcsResult<u8> {
            if v > max {
                Err(bad(name, v.to_string(), &format!("must be 0..{max}")))
            } else {
                Ok(v as u8)
            }
        };
        let auto_byte = |name: &str, v: AutoOr<u32>, max: u32| match v {
            AutoOr::Auto => Ok(0),
            AutoOr::Value(v) => byte(name, v, max),
        };
        let cfg = IbIfaceConfig {
            seg_size,
            tx_queue_len: t.tx_queue_len,
            tx_max_poll: t.tx_max_poll as usize,
            tx_min_inline: t.tx_min_inline,
            rx_queue_len: t.rx_queue_len,
            rx_max_batch: t.rx_max_batch as usize,
            rx_max_poll: t.rx_max_poll as usize,
            gid_index: match t.gid_index {
                AutoOr::Auto => None,
                AutoOr::Value(v) => Some(v),
            },
            traffic_class: auto_byte("TRAFFIC_CLASS", t.traffic_class, 255)?,
            hop_limit: byte("HOP_LIMIT", t.hop_limit, 255)?,
            sl: auto_byte("SL", t.sl, 15)?,
        };
        Ok((cfg, rest))
    }
}
