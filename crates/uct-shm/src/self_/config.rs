//! `UCX_SELF_*` configuration.

use ucs::config::{Config, MemUnits, UlUnits};
use ucs::{Status, UcsResult};
use uct::IfaceParams;

ucs::config_table! {
    /// Configuration of a `self` interface (`UCX_SELF_*`).
    pub struct SelfConfigTable {
        pub seg_size: MemUnits = ("SEG_SIZE", "8k", "Size of copy-out buffer: the largest active message."),
        pub rx_max_bufs: UlUnits = ("RX_MAX_BUFS", "inf",
            "Maximal number of message buffers active message handlers may keep at once (inf: no limit)."),
    }
}

/// The `self` interface settings after applying the environment and the interface parameters.
pub(crate) struct SelfIfaceConfig {
    pub seg_size: usize,
    pub max_bufs: usize,
}

/// The configuration prefixes of the `self` transport (`UCX_SELF_*`).
pub(crate) const CONFIG_PREFIXES: &[&str] = &["SELF_"];

impl SelfIfaceConfig {
    pub(crate) fn read(params: &IfaceParams) -> UcsResult<Self> {
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let mut t = SelfConfigTable::read(CONFIG_PREFIXES).map_err(report)?;
        for (name, value) in &params.config {
            t.set(name, value).map_err(report)?;
        }
        let seg_size = match t.seg_size {
            MemUnits::Value(v) => v,
            MemUnits::Auto => 8192,
            MemUnits::Inf => {
                tracing::error!("UCX_SELF_SEG_SIZE cannot be inf");
                return Err(Status::InvalidParam);
            }
        };
        let max_bufs = match t.rx_max_bufs {
            UlUnits::Value(v) => usize::try_from(v).unwrap_or(usize::MAX),
            UlUnits::Inf | UlUnits::Auto => usize::MAX,
        };
        if max_bufs == 0 {
            tracing::error!("UCX_SELF_RX_MAX_BUFS must be at least 1");
            return Err(Status::InvalidParam);
        }
        Ok(SelfIfaceConfig { seg_size, max_bufs })
    }
}
