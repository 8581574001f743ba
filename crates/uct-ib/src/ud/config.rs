//! Reliability settings: the `UCX_UD_*` variables (UCX 1.13 names and defaults) plus the
//! knobs this implementation adds.

use std::time::Duration;

use ucs::config::{Config, ConfigSource};
use ucs::{Status, UcsResult};

/// Smallest congestion window (UCX `UCT_UD_CA_MIN_WINDOW`). Windows count like UCX's: a window
/// of `w` lets `w - 1` packets be in flight.
pub const MIN_WINDOW: u16 = 2;

/// Largest congestion window and the default of `UCX_UD_MAX_WINDOW` (UCX `UCT_UD_CA_MAX_WINDOW`).
pub const MAX_WINDOW: u16 = 1025;

/// Smallest accepted `UCX_UD_TIMER_BACKOFF` (UCX `UCT_UD_MIN_TIMER_TIMER_BACKOFF`).
pub const MIN_TIMER_BACKOFF: f64 = 1.0;

ucs::config_table! {
    /// Reliability options of the UD transports, read as `UCX_UD_VERBS_<NAME>` then
    /// `UCX_UD_<NAME>` (the prefixes UCX's `ud_verbs` table uses).
    pub struct UdRelConfigTable {
        pub peer_timeout: Duration = ("TIMEOUT", "30s",
            "Consider the remote peer as unreachable if an acknowledgment was not received after this amount of time."),
        pub timer_tick: Duration = ("TIMER_TICK", "10ms", "Initial timeout for retransmissions."),
        pub timer_backoff: f64 = ("TIMER_BACKOFF", "2.0",
            "Timeout multiplier for resending trigger (must be >= 1.0)."),
        pub max_window: u32 = ("MAX_WINDOW", "1025",
            "Max congestion avoidance window. Should be >= 2 and <= 1025."),
    }
}

/// Validated reliability settings of one interface, times in nanoseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct RelConfig {
    /// `UCX_UD_TIMEOUT`: an endpoint with unacknowledged packets fails with
    /// [`Status::EndpointTimeout`] when no acknowledgement advanced for this long.
    pub peer_timeout: u64,
    /// `UCX_UD_TIMER_TICK`: first retransmission timeout, and the value it returns to after
    /// every acknowledgement.
    pub timer_tick: u64,
    /// `UCX_UD_TIMER_BACKOFF`: the retransmission timeout is multiplied by this after every
    /// expiry, up to [`max_rto`](Self::max_rto).
    pub timer_backoff: f64,
    /// `UCX_UD_MAX_WINDOW`: congestion window ceiling (in flight at most `max_window - 1`).
    pub max_window: u16,
    /// Out-of-order packets the receiver holds until the gap before them closes. 0 (UCX's
    /// behaviour) drops them and sends a NAK; the sender then resends from the gap.
    pub rx_window: u16,
    /// How long an owed acknowledgement may wait for an outgoing packet to ride on before a
    /// pure ack is sent. 0: at the next transmit poll.
    pub ack_delay: u64,
    /// Ceiling of the exponential resend backoff (also capped at a third of the peer timeout,
    /// UCX's ceiling). UCX lets the timeout grow to that third, which leaves room for only
    /// about a dozen resends before the peer timeout: at 30% loss a run of a dozen failed
    /// round trips (probability ~0.5^12 per stall) then kills a live connection. With a 1 s
    /// ceiling a stall gets ~35 attempts inside the default 30 s, and a dead peer costs one
    /// packet per second.
    pub rto_max: u64,
    /// Largest packet, header included (the wiring sets min(path MTU, `UCX_IB_SEG_SIZE`)).
    pub max_packet: usize,
    /// Congestion window of a new endpoint (capped by `max_window`). UCX starts at
    /// [`MIN_WINDOW`]; a larger start lets a fresh endpoint send a burst before the first
    /// acknowledgement (`UCX_UD_VERBS_INITIAL_WINDOW`, an ucx-rs extension).
    pub initial_window: u16,
}

impl Default for RelConfig {
    fn default() -> Self {
        RelConfig {
            peer_timeout: 30_000_000_000,
            timer_tick: 10_000_000,
            timer_backoff: 2.0,
            max_window: MAX_WINDOW,
            rx_window: 0,
            ack_delay: 0,
            rto_max: 1_000_000_000,
            max_packet: 4096,
            initial_window: MIN_WINDOW,
        }
    }
}

fn invalid(var: &str, value: impl std::fmt::Display, why: &str) -> Status {
    tracing::error!("invalid value for UCX_UD_{var}: {value} ({why})");
    Status::InvalidParam
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl RelConfig {
    /// Largest retransmission timeout: [`rto_max`](Self::rto_max), at most a third of the
    /// peer timeout (UCX `UCT_UD_SLOW_TIMER_MAX_TICK`) so the peer gets at least three resends
    /// before it is declared dead, and never below the first timeout.
    pub fn max_rto(&self) -> u64 {
        self.rto_max.min(self.peer_timeout / 3).max(self.timer_tick)
    }

    /// Builds the settings from a read table, keeping this struct's non-UCX knobs from
    /// [`RelConfig::default`], and validates them as UCX does.
    pub fn from_table(t: &UdRelConfigTable) -> UcsResult<RelConfig> {
        let c = RelConfig {
            peer_timeout: nanos(t.peer_timeout),
            timer_tick: nanos(t.timer_tick),
            timer_backoff: t.timer_backoff,
            max_window: u16::try_from(t.max_window).unwrap_or(u16::MAX),
            ..RelConfig::default()
        };
        if !(u32::from(MIN_WINDOW)..=u32::from(MAX_WINDOW)).contains(&t.max_window) {
            return Err(invalid("MAX_WINDOW", t.max_window, "must be >= 2 and <= 1025"));
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks every field; what UCX rejects at interface creation is rejected here.
    pub fn validate(&self) -> UcsResult<()> {
        if self.timer_tick == 0 {
            return Err(invalid("TIMER_TICK", 0, "must be > 0"));
        }
        if self.peer_timeout == 0 {
            return Err(invalid("TIMEOUT", 0, "must be > 0"));
        }
        if self.timer_backoff.is_nan() || self.timer_backoff < MIN_TIMER_BACKOFF {
            return Err(invalid("TIMER_BACKOFF", self.timer_backoff, "must be >= 1.0"));
        }
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&self.max_window) {
            return Err(invalid("MAX_WINDOW", self.max_window, "must be >= 2 and <= 1025"));
        }
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&self.initial_window) {
            return Err(invalid("VERBS_INITIAL_WINDOW", self.initial_window, "must be >= 2 and <= 1025"));
        }
        if self.max_packet
            < crate::ud::wire::NETH_LEN + crate::ud::wire::CREQ_FIXED_LEN + crate::ud::wire::MAX_DEV_ADDR_LEN
        {
            return Err(invalid("SEG_SIZE", self.max_packet, "too small for a connection request"));
        }
        Ok(())
    }

    /// Reads `UCX_UD_VERBS_*` / `UCX_UD_*` from `source` (the process environment when
    /// `None`), applies `overrides` (`("TIMEOUT", "1s")`, names without prefix) and validates.
    pub fn read(source: Option<&dyn ConfigSource>, overrides: &[(&str, &str)]) -> UcsResult<RelConfig> {
        let prefixes = ["UD_VERBS_", "UD_"];
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let mut t = match source {
            Some(s) => UdRelConfigTable::read_from(s, &prefixes),
            None => UdRelConfigTable::read(&prefixes),
        }
        .map_err(report)?;
        for (name, value) in overrides {
            t.set(name, value).map_err(report)?;
        }
        RelConfig::from_table(&t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(env: &[(&str, &str)]) -> UcsResult<RelConfig> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RelConfig::read(Some(&env), &[])
    }

    #[test]
    fn defaults_match_ucx_1_13() {
        let c = read(&[]).unwrap();
        assert_eq!(c, RelConfig::default());
        assert_eq!(c.peer_timeout, 30_000_000_000);
        assert_eq!(c.timer_tick, 10_000_000);
        assert_eq!(c.timer_backoff, 2.0);
        assert_eq!(c.max_window, 1025);
        assert_eq!(c.max_rto(), 1_000_000_000);
        assert_eq!(RelConfig { peer_timeout: 600_000_000, ..c.clone() }.max_rto(), 200_000_000);
        assert_eq!(RelConfig { rto_max: 0, ..c }.max_rto(), 10_000_000);
    }

    #[test]
    fn variables_and_prefixes() {
        let c = read(&[("UCX_UD_TIMEOUT", "2s"), ("UCX_UD_VERBS_MAX_WINDOW", "64"), ("UCX_UD_MAX_WINDOW", "32")]);
        let c = c.unwrap();
        assert_eq!((c.peer_timeout, c.max_window), (2_000_000_000, 64));
        let env: HashMap<String, String> = HashMap::new();
        let c = RelConfig::read(Some(&env), &[("TIMER_TICK", "1ms"), ("TIMER_BACKOFF", "1.5")]).unwrap();
        assert_eq!((c.timer_tick, c.timer_backoff), (1_000_000, 1.5));
    }

    #[test]
    fn invalid_values() {
        assert_eq!(read(&[("UCX_UD_MAX_WINDOW", "1")]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_UD_MAX_WINDOW", "1026")]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_UD_MAX_WINDOW", "99999999")]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_UD_TIMER_BACKOFF", "0.5")]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_UD_TIMER_TICK", "0s")]), Err(Status::InvalidParam));
        assert_eq!(read(&[("UCX_UD_TIMEOUT", "soon")]), Err(Status::InvalidParam));
        assert!(RelConfig { max_packet: 20, ..RelConfig::default() }.validate().is_err());
        assert!(RelConfig { timer_backoff: f64::NAN, ..RelConfig::default() }.validate().is_err());
    }
}
