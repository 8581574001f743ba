//! Settings of a `ud_verbs` interface: the InfiniBand interface options (`UCX_UD_VERBS_*`,
//! `UCX_UD_*`, `UCX_IB_*`, in that order of precedence; UCX 1.13 names and defaults), the
//! reliability options of [`RelConfig`] (`UCX_UD_VERBS_*`, `UCX_UD_*`), and `LOSS`, this
//! implementation's fault injector for received datagrams.

use std::time::Duration;

use ucs::config::{Config, ConfigSource};
use ucs::{Status, UcsResult};

use super::config::{RelConfig, UdRelConfigTable};
use super::loss::LossConfig;
use crate::ib_config::IbIfaceConfig;

ucs::config_table! {
    /// Interface options of `ud_verbs` (besides the reliability table).
    pub struct UdVerbsConfigTable {
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
    /// The settings every verbs transport has (`SEG_SIZE` before the MTU cap, queues,
    /// addressing).
    pub ib: IbIfaceConfig,
    /// How long a closed endpoint lingers before its id may be reused, nanoseconds.
    pub linger_timeout: u64,
    /// Fault injection on received datagrams.
    pub loss: LossConfig,
    /// Reliability settings (`max_packet` is set when the interface opens).
    pub rel: RelConfig,
}

fn invalid(var: &str, value: impl std::fmt::Display, why: &str) -> Status {
    crate::ib_config::invalid(super::CONFIG_PREFIXES, var, value, why)
}

impl UdVerbsConfig {
    /// Reads the environment (or `source`), applies `overrides` (names without prefix, from
    /// either table; an unknown name is `NoElem`) and validates.
    pub fn read(source: Option<&dyn ConfigSource>, overrides: &[(String, String)]) -> UcsResult<UdVerbsConfig> {
        let prefixes = super::CONFIG_PREFIXES;
        let (ib, overrides) = IbIfaceConfig::read(source, prefixes, overrides, 256)?;
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("ud_verbs: {e}");
            Status::from(e)
        };
        let mut t = match source {
            Some(s) => UdVerbsConfigTable::read_from(s, prefixes),
            None => UdVerbsConfigTable::read(prefixes),
        }
        .map_err(report)?;
        let mut rel_overrides: Vec<(&str, &str)> = Vec::new();
        for (name, value) in overrides {
            let (name, value) = (name.as_str(), value.as_str());
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
        let loss: LossConfig = t.loss.parse().map_err(|e| invalid("LOSS", &t.loss, &format!("{e}")))?;
        Ok(UdVerbsConfig { ib, linger_timeout: ucs::time::from_duration(t.linger_timeout), loss, rel })
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
        assert_eq!((c.ib.seg_size, c.ib.tx_queue_len, c.ib.rx_queue_len), (8192, 256, 4096));
        assert_eq!((c.ib.rx_max_batch, c.ib.rx_max_poll, c.ib.tx_max_poll), (16, 16, 16));
        assert_eq!(c.linger_timeout, 300_000_000_000);
        assert_eq!(c.loss, LossConfig::default());
        assert_eq!(c.rel, RelConfig::default());
    }

    #[test]
    fn prefixes_overrides_and_errors() {
        let c =
            read(&[("UCX_IB_SEG_SIZE", "4k"), ("UCX_UD_VERBS_SEG_SIZE", "2k"), ("UCX_UD_TIMEOUT", "2s")], &[]).unwrap();
        assert_eq!((c.ib.seg_size, c.rel.peer_timeout), (2048, 2_000_000_000));
        let c = read(&[("UCX_UD_VERBS_LOSS", "drop=10%,seed=7")], &[("TIMER_TICK", "1ms"), ("RX_QUEUE_LEN", "64")])
            .unwrap();
        assert_eq!((c.loss.drop_ppm, c.loss.seed), (100_000, 7));
        assert_eq!((c.rel.timer_tick, c.ib.rx_queue_len), (1_000_000, 64));
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
