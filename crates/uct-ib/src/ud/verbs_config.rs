//! Settings of a `ud_verbs` interface: the InfiniBand interface options (`UCX_UD_VERBS_*`,
//! `UCX_UD_*`, `UCX_IB_*`, in that order of precedence; UCX 1.13 names and defaults), the
//! reliability options of [`RelConfig`] (`UCX_UD_VERBS_*`, `UCX_UD_*`), and `LOSS`, this
//! implementation's fault injector for received datagrams.

use std::time::Duration;

use ucs::config::{AutoOr, Config, ConfigSource, MemUnits};
use ucs::{Status, UcsResult};

use super::config::{RelConfig, UdRelConfigTable};
use super::loss::LossConfig;

ucs::config_table! {
    /// Interface options of `ud_verbs` (besides the reliability table).
    pub struct UdVerbsConfigTable {
        pub seg_size: MemUnits = ("SEG_SIZE", "8192",
            "Largest datagram (header included); the port's MTU caps it."),
        pub tx_queue_len: u32 = ("TX_QUEUE_LEN", "256", "Length of the send queue of the UD QP."),
        pub tx_max_poll: u32 = ("TX_MAX_POLL", "16", "Max number of send completions to pick per progress."),
        pub tx_min_inline: u32 = ("TX_MIN_INLINE", "64", "Bytes to reserve in send WQE for inline data."),
        pub rx_queue_len: u32 = ("RX_QUEUE_LEN", "4096", "Length of the receive queue of the UD QP."),
        pub rx_max_batch: u32 = ("RX_MAX_BATCH", "16", "How many post-receives to perform in one batch."),
        pub rx_max_poll: u32 = ("RX_MAX_POLL", "16", "Max number of receive completions to pick per progress."),
        pub gid_index: AutoOr<u32> = ("GID_INDEX", "auto",
            "Port GID index to use; auto selects RoCE v2 with an IPv4 address first."),
        pub traffic_class: AutoOr<u32> = ("TRAFFIC_CLASS", "auto", "IB traffic class / IP DSCP << 2 (0..255)."),
        pub hop_limit: u32 = ("HOP_LIMIT", "255", "IB hop limit / TTL of RoCE v2 packets (0..255)."),
        pub sl: AutoOr<u32> = ("SL", "auto", "InfiniBand service level (0..15)."),
        pub linger_timeout: Duration = ("LINGER_TIMEOUT", "5m",
            "Keep the connection open internally for this amount of time after closing it."),
        pub initial_window: u32 = ("INITIAL_WINDOW", "2",
            "ucx-rs extension: congestion window of a new endpoint (2..1025, at most MAX_WINDOW; UCX starts at 2)."),
        pub loss: String = ("LOSS", "",
            "ucx-rs extension: drop/duplicate/reorder received datagrams, e.g. drop=10%,seed=7 \
             (keys drop, dup, reorder, seed; rates in % or ppm). Empty: no faults."),
    }
}

/// Validated settings of one `ud_verbs` interface.
#[derive(Clone, Debug, PartialEq)]
pub struct UdVerbsConfig {
    /// Largest datagram before the MTU cap (`SEG_SIZE`).
    pub seg_size: usize,
    /// Send queue length.
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
    /// How long a closed endpoint lingers before its id may be reused, nanoseconds.
    pub linger_timeout: u64,
    /// Fault injection on received datagrams.
    pub loss: LossConfig,
    /// Reliability settings (`max_packet` is set when the interface opens).
    pub rel: RelConfig,
}

fn invalid(var: &str, value: impl std::fmt::Display, why: &str) -> Status {
    tracing::error!("invalid value for UCX_UD_VERBS_{var} (or UCX_UD_/UCX_IB_{var}): {value} ({why})");
    Status::InvalidParam
}

impl UdVerbsConfig {
    /// Reads the environment (or `source`), applies `overrides` (names without prefix, from
    /// either table; an unknown name is `NoElem`) and validates.
    pub fn read(source: Option<&dyn ConfigSource>, overrides: &[(String, String)]) -> UcsResult<UdVerbsConfig> {
        let prefixes = ["UD_VERBS_", "UD_", "IB_"];
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("ud_verbs: {e}");
            Status::from(e)
        };
        let mut t = match source {
            Some(s) => UdVerbsConfigTable::read_from(s, &prefixes),
            None => UdVerbsConfigTable::read(&prefixes),
        }
        .map_err(report)?;
        let mut rel_overrides: Vec<(&str, &str)> = Vec::new();
        for (name, value) in overrides {
            if UdVerbsConfigTable::table().field(name).is_some() {
                t.set(name, value).map_err(report)?;
            } else if UdRelConfigTable::table().field(name).is_some() {
                rel_overrides.push((name, value));
            } else {
                tracing::error!("ud_verbs: no configuration variable {name:?} (UCX_UD_VERBS_{name})");
                return Err(Status::NoElem);
            }
        }
        let mut rel = RelConfig::read(source, &rel_overrides)?;
        rel.initial_window = u16::try_from(t.initial_window).unwrap_or(u16::MAX);
        rel.validate()?;
        let seg_size = match t.seg_size {
            MemUnits::Value(v) if (256..=(1 << 20)).contains(&v) => v,
            MemUnits::Auto => 8192,
            other => return Err(invalid("SEG_SIZE", format!("{other:?}"), "must be 256 bytes to 1 MiB")),
        };
        if !(16..=32768).contains(&t.tx_queue_len) {
            return Err(invalid("TX_QUEUE_LEN", t.tx_queue_len, "must be 16..32768"));
        }
        if !(16..=(1 << 20)).contains(&t.rx_queue_len) {
            return Err(invalid("RX_QUEUE_LEN", t.rx_queue_len, "must be 16..1048576"));
        }
        for (name, v) in
            [("TX_MAX_POLL", t.tx_max_poll), ("RX_MAX_POLL", t.rx_max_poll), ("RX_MAX_BATCH", t.rx_max_batch)]
        {
            if v == 0 {
                return Err(invalid(name, v, "must be at least 1"));
            }
        }
        let byte = |name: &str, v: u32, max: u32| -> UcsResult<u8> {
            if v > max {
                Err(invalid(name, v, &format!("must be 0..{max}")))
            } else {
                Ok(v as u8)
            }
        };
        let traffic_class = match t.traffic_class {
            AutoOr::Auto => 0,
            AutoOr::Value(v) => byte("TRAFFIC_CLASS", v, 255)?,
        };
        let sl = match t.sl {
            AutoOr::Auto => 0,
            AutoOr::Value(v) => byte("SL", v, 15)?,
        };
        let loss: LossConfig = t.loss.parse().map_err(|e| invalid("LOSS", &t.loss, &format!("{e}")))?;
        Ok(UdVerbsConfig {
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
            traffic_class,
            hop_limit: byte("HOP_LIMIT", t.hop_limit, 255)?,
            sl,
            linger_timeout: ucs::time::from_duration(t.linger_timeout),
            loss,
            rel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(env: &[(&str, &str)], ov: &[(&str, &str)]) -> UcsResult<UdVerbsConfig> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let ov: Vec<(String, String)> = ov.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        UdVerbsConfig::read(Some(&env), &ov)
    }

    #[test]
    fn defaults_match_ucx() {
        let c = read(&[], &[]).unwrap();
        assert_eq!((c.seg_size, c.tx_queue_len, c.rx_queue_len), (8192, 256, 4096));
        assert_eq!((c.rx_max_batch, c.rx_max_poll, c.tx_max_poll), (16, 16, 16));
        assert_eq!(c.linger_timeout, 300_000_000_000);
        assert_eq!(c.loss, LossConfig::default());
        assert_eq!(c.rel, RelConfig::default());
    }

    #[test]
    fn prefixes_overrides_and_errors() {
        let c =
            read(&[("UCX_IB_SEG_SIZE", "4k"), ("UCX_UD_VERBS_SEG_SIZE", "2k"), ("UCX_UD_TIMEOUT", "2s")], &[]).unwrap();
        assert_eq!((c.seg_size, c.rel.peer_timeout), (2048, 2_000_000_000));
        let c = read(&[("UCX_UD_VERBS_LOSS", "drop=10%,seed=7")], &[("TIMER_TICK", "1ms"), ("RX_QUEUE_LEN", "64")])
            .unwrap();
        assert_eq!((c.loss.drop_ppm, c.loss.seed), (100_000, 7));
        assert_eq!((c.rel.timer_tick, c.rx_queue_len), (1_000_000, 64));
        let c = read(&[], &[("LOSS", "drop=1%"), ("LINGER_TIMEOUT", "0s")]).unwrap();
        assert_eq!((c.loss.drop_ppm, c.linger_timeout), (10_000, 0));
        assert_eq!(read(&[], &[("NO_SUCH", "1")]), Err(Status::NoElem));
        assert_eq!(read(&[("UCX_UD_VERBS_LOSS", "drop=200%")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("LOSS", "lose=1")]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_IB_TX_QUEUE_LEN", "x")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("TX_QUEUE_LEN", "8")]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("SL", "16")]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("MAX_WINDOW", "1")]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("SEG_SIZE", "100")]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("INITIAL_WINDOW", "1")]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("INITIAL_WINDOW", "70000")]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("INITIAL_WINDOW", "64")]).unwrap().rel.initial_window, 64);
    }
}
