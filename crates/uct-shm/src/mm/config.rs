//! `UCX_MM_*` configuration, with `UCX_POSIX_*` / `UCX_SYSV_*` overrides (UCX 1.13 defaults).

use ucs::config::{Config, ConfigSource, MemUnits, UlUnits};
use ucs::{Status, UcsResult};

use super::fifo::FifoLayout;

ucs::config_table! {
    /// Memory-mapped transport options (`UCX_MM_*`, overridden per transport).
    pub struct MmConfigTable {
        pub fifo_size: u32 = ("FIFO_SIZE", "64", "Size of the receive FIFO in the memory-map UCTs."),
        pub seg_size: MemUnits = ("SEG_SIZE", "8256", "Size of send/receive buffers for copy-out sends."),
        pub release_factor: f64 = ("FIFO_RELEASE_FACTOR", "0.5",
            "Frequency of resource releasing on the receiver's side, as a fraction of the FIFO size (>= 0 and < 1)."),
        pub elem_size: u32 = ("FIFO_ELEM_SIZE", "128", "Size of the FIFO element size (data + header) in the MM UCTs."),
        pub max_poll: UlUnits = ("FIFO_MAX_POLL", "16", "Maximal number of receive completions to pick during RX poll."),
        pub error_handling: bool = ("ERROR_HANDLING", "n", "Expose error handling support capability."),
    }
}

/// Validated settings of one memory-mapped interface.
#[derive(Clone, Debug, PartialEq)]
pub struct MmIfaceConfig {
    /// FIFO geometry.
    pub layout: FifoLayout,
    /// Size of a receive descriptor (largest bcopy message).
    pub seg_size: usize,
    /// Slots released to producers at a time (power of two).
    pub release_batch: u32,
    /// Receive completions handled per progress call.
    pub max_poll: usize,
    /// Advertise peer-failure handling.
    pub error_handling: bool,
}

fn invalid(var: &str, value: impl std::fmt::Display, why: &str) -> Status {
    tracing::error!("invalid value for UCX_{var}: {value} ({why})");
    Status::InvalidParam
}

impl MmIfaceConfig {
    /// Reads `UCX_<prefix>*` for `prefixes` in order (`POSIX_` or `SYSV_`, then `MM_`) from
    /// `source` (the environment unless given), applies `overrides`, and validates.
    pub fn read(
        prefixes: &[&str],
        source: Option<&dyn ConfigSource>,
        overrides: &[(String, String)],
    ) -> UcsResult<Self> {
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let mut t = match source {
            Some(s) => MmConfigTable::read_from(s, prefixes),
            None => MmConfigTable::read(prefixes),
        }
        .map_err(report)?;
        for (name, value) in overrides {
            t.set(name, value).map_err(report)?;
        }
        let layout = FifoLayout::new(t.fifo_size, t.elem_size).map_err(|_| {
            invalid(
                "MM_FIFO_SIZE/FIFO_ELEM_SIZE",
                format!("{}/{}", t.fifo_size, t.elem_size),
                "FIFO size must be a power of two >= 2, element size a multiple of 8 in 16..=65536",
            )
        })?;
        let seg_size = match t.seg_size {
            MemUnits::Value(v) if (8..=u16::MAX as usize).contains(&v) => v,
            MemUnits::Auto => 8256,
            other => return Err(invalid("MM_SEG_SIZE", format!("{other:?}"), "must be between 8 and 65535 bytes")),
        };
        if !(0.0..1.0).contains(&t.release_factor) {
            return Err(invalid("MM_FIFO_RELEASE_FACTOR", t.release_factor, "must be >= 0 and < 1"));
        }
        let batch = ((t.release_factor * t.fifo_size as f64) as u32).max(1);
        // Largest power of two not above the wanted batch.
        let release_batch = 1u32 << (31 - batch.leading_zeros());
        let max_poll = match t.max_poll {
            UlUnits::Value(0) => return Err(invalid("MM_FIFO_MAX_POLL", 0, "must be at least 1")),
            UlUnits::Value(v) => usize::try_from(v).unwrap_or(usize::MAX),
            UlUnits::Inf | UlUnits::Auto => usize::MAX,
        };
        Ok(MmIfaceConfig { layout, seg_size, release_batch, max_poll, error_handling: t.error_handling })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(env: &[(&str, &str)], overrides: &[(&str, &str)]) -> UcsResult<MmIfaceConfig> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let ov: Vec<(String, String)> = overrides.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        MmIfaceConfig::read(&["POSIX_", "MM_"], Some(&env), &ov)
    }

    #[test]
    fn defaults_match_ucx_1_13() {
        let c = read(&[], &[]).unwrap();
        assert_eq!(c.layout, FifoLayout { fifo_size: 64, elem_size: 128 });
        assert_eq!(c.seg_size, 8256);
        assert_eq!(c.release_batch, 32);
        assert_eq!(c.max_poll, 16);
        assert!(!c.error_handling);
    }

    #[test]
    fn transport_prefix_overrides_family_prefix() {
        let c = read(&[("UCX_MM_FIFO_SIZE", "128"), ("UCX_POSIX_FIFO_SIZE", "256")], &[]).unwrap();
        assert_eq!(c.layout.fifo_size, 256);
        let c = read(&[("UCX_MM_FIFO_SIZE", "128"), ("UCX_SYSV_FIFO_SIZE", "256")], &[]).unwrap();
        assert_eq!(c.layout.fifo_size, 128, "another transport's override does not apply");
        let c = read(&[("UCX_MM_FIFO_SIZE", "128")], &[("FIFO_SIZE", "8")]).unwrap();
        assert_eq!((c.layout.fifo_size, c.release_batch), (8, 4));
    }

    #[test]
    fn invalid_values_are_errors() {
        assert_eq!(read(&[("UCX_MM_FIFO_SIZE", "100")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_POSIX_FIFO_SIZE", "abc")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_MM_FIFO_RELEASE_FACTOR", "1.5")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_MM_SEG_SIZE", "1m")], &[]), Err(Status::InvalidParam));
        assert_eq!(read(&[], &[("NO_SUCH_OPTION", "1")]), Err(Status::NoElem));
    }
}
