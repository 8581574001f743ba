//! `UCX_TCP_*` configuration.

use std::time::Duration;

use ucs::config::{Config, MemUnits, TimeValue, UlUnits};
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
        pub keepidle: TimeValue = ("KEEPIDLE", "10s",
            "Idle time of a connection before keepalive probes start (TCP_KEEPIDLE); inf: no keepalive."),
        pub keepcnt: UlUnits = ("KEEPCNT", "auto",
            "Keepalive probes unanswered before the connection fails (TCP_KEEPCNT; auto: the system's); inf: no keepalive."),
        pub keepintvl: TimeValue = ("KEEPINTVL", "2s",
            "Time between keepalive probes (TCP_KEEPINTVL); inf: no keepalive."),
    }
}

/// TCP keepalive of a connection (`UCX_TCP_KEEPIDLE`, `KEEPCNT`, `KEEPINTVL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keepalive {
    pub idle: Duration,
    pub intvl: Duration,
    /// `None`: the system's count.
    pub cnt: Option<u32>,
}

impl Keepalive {
    /// How long a dead peer takes to be noticed: idle time, then the probes. With the system's
    /// count, Linux's default of 9 is assumed.
    pub fn timeout(&self) -> Duration {
        self.idle + self.intvl * self.cnt.unwrap_or(9)
    }

    /// Sets keepalive on `sock`, and the user timeout (`TCP_USER_TIMEOUT`) to the same time,
    /// so that a connection with data in flight - which sends no keepalive probes - fails as
    /// soon as an idle one would.
    pub fn apply(&self, sock: &socket2::Socket) -> std::io::Result<()> {
        let mut ka = socket2::TcpKeepalive::new().with_time(self.idle).with_interval(self.intvl);
        if let Some(c) = self.cnt {
            ka = ka.with_retries(c);
        }
        sock.set_tcp_keepalive(&ka)?;
        sock.set_tcp_user_timeout(Some(self.timeout()))
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
    /// `None`: no keepalive (one of the settings is `inf`).
    pub keepalive: Option<Keepalive>,
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
            keepalive: keepalive(t.keepidle, t.keepcnt, t.keepintvl)?,
        })
    }
}

/// The keepalive settings, clamped as UCX clamps them (times to [1 s, 32767 s], the count to
/// at most 127); `None` when one of them is `inf`.
fn keepalive(idle: TimeValue, cnt: UlUnits, intvl: TimeValue) -> UcsResult<Option<Keepalive>> {
    let secs = |v: TimeValue, auto: u64| -> Option<Duration> {
        let d = match v {
            TimeValue::Value(d) => d,
            TimeValue::Auto => Duration::from_secs(auto),
            TimeValue::Inf => return None,
        };
        Some(d.clamp(Duration::from_secs(1), Duration::from_secs(32767)))
    };
    let (Some(idle), Some(intvl)) = (secs(idle, 10), secs(intvl, 2)) else { return Ok(None) };
    let cnt = match cnt {
        UlUnits::Inf => return Ok(None),
        UlUnits::Auto => None,
        UlUnits::Value(0) => {
            tracing::error!("UCX_TCP_KEEPCNT must be at least 1");
            return Err(Status::InvalidParam);
        }
        UlUnits::Value(n) => Some(n.min(127) as u32),
    };
    Ok(Some(Keepalive { idle, intvl, cnt }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_settings() {
        let s = |x: u64| TimeValue::Value(Duration::from_secs(x));
        let k = keepalive(s(10), UlUnits::Auto, s(2)).unwrap().unwrap();
        assert_eq!((k.idle, k.intvl, k.cnt), (Duration::from_secs(10), Duration::from_secs(2), None));
        assert_eq!(k.timeout(), Duration::from_secs(28));
        let k = keepalive(TimeValue::Value(Duration::from_millis(10)), UlUnits::Value(500), s(99999)).unwrap().unwrap();
        assert_eq!((k.idle, k.intvl, k.cnt), (Duration::from_secs(1), Duration::from_secs(32767), Some(127)));
        assert_eq!(keepalive(TimeValue::Inf, UlUnits::Auto, s(2)).unwrap(), None);
        assert_eq!(keepalive(s(1), UlUnits::Inf, s(2)).unwrap(), None);
        assert!(keepalive(s(1), UlUnits::Value(0), s(2)).is_err());
    }
}
