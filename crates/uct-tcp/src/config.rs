//! `UCX_TCP_*` configuration.

use ucs::config::{Config, MemUnits};
use ucs::{Status, UcsResult};
use uct::IfaceParams;

ucs::config_table! {
    /// Configuration of a `tcp` interface (`UCX_TCP_*`).
    pub struct TcpConfigTable {
        pub tx_seg_size: MemUnits = ("TX_SEG_SIZE", "8kb",
            "Size of the send buffer of an endpoint: the largest short or buffered active message, with its header."),
        pub rx_seg_size: MemUnits = ("RX_SEG_SIZE", "64kb",
            "Size of the receive buffer of a connection (at least TX_SEG_SIZE)."),
        pub nodelay: bool = ("NODELAY", "y", "Set TCP_NODELAY on the sockets (no Nagle delay)."),
        pub sndbuf: MemUnits = ("SNDBUF", "auto", "Socket send buffer size (auto: the system's)."),
        pub rcvbuf: MemUnits = ("RCVBUF", "auto", "Socket receive buffer size (auto: the system's)."),
    }
}

/// The configuration prefixes of the `tcp` transport.
pub(crate) const CONFIG_PREFIXES: &[&str] = &["TCP_"];

/// The settings of an interface.
#[derive(Clone, Debug)]
pub(crate) struct TcpIfaceConfig {
    pub tx_seg_size: usize,
    pub rx_seg_size: usize,
    pub nodelay: bool,
    pub sndbuf: Option<usize>,
    pub rcvbuf: Option<usize>,
}

impl TcpIfaceConfig {
    pub(crate) fn read(params: &IfaceParams) -> UcsResult<Self> {
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let mut t = TcpConfigTable::read(CONFIG_PREFIXES).map_err(report)?;
        for (name, value) in &params.config {
            t.set(name, value).map_err(report)?;
        }
        let size = |v: MemUnits, name: &str, auto: Option<usize>| -> UcsResult<Option<usize>> {
            match v {
                MemUnits::Value(v) => Ok(Some(v)),
                MemUnits::Auto => Ok(auto),
                MemUnits::Inf => {
                    tracing::error!("UCX_TCP_{name} cannot be inf");
                    Err(Status::InvalidParam)
                }
            }
        };
        let tx = size(t.tx_seg_size, "TX_SEG_SIZE", Some(8192))?.unwrap_or(8192);
        let rx = size(t.rx_seg_size, "RX_SEG_SIZE", Some(65536))?.unwrap_or(65536);
        if tx <= crate::wire::AM_HDR_LEN + 8 || tx > u32::MAX as usize {
            tracing::error!(tx, "UCX_TCP_TX_SEG_SIZE must be more than 16 bytes and below 4 GiB");
            return Err(Status::InvalidParam);
        }
        if rx < tx {
            tracing::error!(rx, tx, "UCX_TCP_RX_SEG_SIZE must be at least UCX_TCP_TX_SEG_SIZE");
            return Err(Status::InvalidParam);
        }
        Ok(TcpIfaceConfig {
            tx_seg_size: tx,
            rx_seg_size: rx,
            nodelay: t.nodelay,
            sndbuf: size(t.sndbuf, "SNDBUF", None)?,
            rcvbuf: size(t.rcvbuf, "RCVBUF", None)?,
        })
    }
}
