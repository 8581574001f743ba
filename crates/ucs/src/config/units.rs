//! Quantities with units and special values: memory sizes (`UCS_CONFIG_TYPE_MEMUNITS`),
//! counts with `inf`/`auto` (`ULUNITS`), times with `inf`/`auto` (`TIME_UNITS`) and
//! bandwidths (`BW`).

use std::time::Duration;

use super::types::{format_duration, parse_duration, parse_u64, split_digits, split_float};
use super::ConfigValue;

const INF: &str = "inf";
const AUTO: &str = "auto";

/// Binary size prefixes UCX accepts after a number, each 1024 times the previous; the
/// formatter stops at the last one because UCX's parser knows no larger prefix.
const MEM_PREFIXES: [&str; 4] = ["K", "M", "G", "T"];

/// A memory size: bytes, or one of UCX's special values (`UCS_CONFIG_TYPE_MEMUNITS`).
///
/// Syntax: `<number>[b|k|m|g|t][b]` (any case; `8k`, `8kb` and `8192` are equal), `inf`, `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemUnits {
    /// A size in bytes.
    Value(usize),
    /// No limit (`inf`).
    Inf,
    /// Let the component choose (`auto`).
    Auto,
}

impl MemUnits {
    /// Resolves to bytes like `ucs_config_memunits_get`: `Auto` becomes `auto_size`, and
    /// `Inf` or a larger value is capped at `max_size`.
    pub fn get(self, auto_size: usize, max_size: usize) -> usize {
        match self {
            MemUnits::Value(v) => v.min(max_size),
            MemUnits::Inf => max_size,
            MemUnits::Auto => auto_size,
        }
    }
}

impl ConfigValue for MemUnits {
    fn parse_value(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case(INF) {
            return Ok(MemUnits::Inf);
        }
        if s.eq_ignore_ascii_case(AUTO) {
            return Ok(MemUnits::Auto);
        }
        let (digits, suffix) = split_digits(s);
        let number: u64 = digits.parse().map_err(|_| Self::syntax())?;
        let mut chars = suffix.chars().map(|c| c.to_ascii_uppercase());
        let multiplier = match chars.next() {
            None => 1,
            Some('B') => 1,
            Some('K') => 1 << 10,
            Some('M') => 1 << 20,
            Some('G') => 1 << 30,
            Some('T') => 1 << 40,
            Some(_) => return Err(Self::syntax()),
        };
        match (chars.next(), chars.next()) {
            (None, _) | (Some('B'), None) => {}
            _ => return Err(Self::syntax()),
        }
        number
            .checked_mul(multiplier)
            .and_then(|bytes| usize::try_from(bytes).ok())
            .map(MemUnits::Value)
            .ok_or_else(|| format!("{} (at most {} bytes)", Self::syntax(), usize::MAX))
    }

    fn format_value(&self) -> String {
        match *self {
            MemUnits::Inf => INF.to_string(),
            MemUnits::Auto => AUTO.to_string(),
            MemUnits::Value(v) => {
                let mut value = v as u64;
                let mut suffix = "";
                for prefix in MEM_PREFIXES {
                    if value < 1024 || value % 1024 != 0 {
                        break;
                    }
                    value /= 1024;
                    suffix = prefix;
                }
                format!("{value}{suffix}")
            }
        }
    }

    fn syntax() -> String {
        "memory units: <number>[b|kb|mb|gb|tb], \"inf\", or \"auto\"".to_string()
    }
}

/// A count with UCX's special values (`UCS_CONFIG_TYPE_ULUNITS`): `<number>`, `inf`, `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UlUnits {
    /// A plain number.
    Value(u64),
    /// No limit (`inf`).
    Inf,
    /// Let the component choose (`auto`).
    Auto,
}

impl ConfigValue for UlUnits {
    fn parse_value(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case(INF) {
            Ok(UlUnits::Inf)
        } else if s.eq_ignore_ascii_case(AUTO) {
            Ok(UlUnits::Auto)
        } else {
            parse_u64(s).map(UlUnits::Value).ok_or_else(Self::syntax)
        }
    }

    fn format_value(&self) -> String {
        match self {
            UlUnits::Value(v) => v.to_string(),
            UlUnits::Inf => INF.to_string(),
            UlUnits::Auto => AUTO.to_string(),
        }
    }

    fn syntax() -> String {
        "unsigned long: <number>, \"inf\", or \"auto\"".to_string()
    }
}

/// A time with UCX's special values (`UCS_CONFIG_TYPE_TIME_UNITS`).
///
/// Syntax: `<number>[m|s|ms|us|ns]` (no unit means seconds, `m` is minutes), `inf`, `auto`.
/// Plain [`Duration`] fields take the same syntax without the special values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeValue {
    /// A finite time.
    Value(Duration),
    /// Never (`inf`).
    Inf,
    /// Let the component choose (`auto`).
    Auto,
}

impl ConfigValue for TimeValue {
    fn parse_value(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case(INF) {
            Ok(TimeValue::Inf)
        } else if s.eq_ignore_ascii_case(AUTO) {
            Ok(TimeValue::Auto)
        } else {
            parse_duration(s).map(TimeValue::Value).ok_or_else(Self::syntax)
        }
    }

    fn format_value(&self) -> String {
        match self {
            TimeValue::Value(d) => format_duration(d),
            TimeValue::Inf => INF.to_string(),
            TimeValue::Auto => AUTO.to_string(),
        }
    }

    fn syntax() -> String {
        "time value: <number>[m|s|ms|us|ns], \"inf\", or \"auto\"".to_string()
    }
}

/// A bandwidth (`UCS_CONFIG_TYPE_BW`), always held in bytes per second.
///
/// Syntax (case-sensitive, as in UCX, because `B` is bytes and `b` is bits):
/// `<number>[T|G|M|K]<B|b><ps|/s|s>` or `auto`; prefixes are binary (`K` = 1024), so
/// `1KBs` = 1024 B/s and `8Kbps` = 1024 B/s. A unit is required.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bandwidth {
    /// A finite, non-negative rate in bytes per second.
    BytesPerSec(f64),
    /// Let the component measure or choose (`auto`).
    Auto,
}

impl ConfigValue for Bandwidth {
    fn parse_value(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case(AUTO) {
            return Ok(Bandwidth::Auto);
        }
        let (value, unit) = split_float(s).ok_or_else(Self::syntax)?;
        let (scale, unit) = match unit.as_bytes().first() {
            Some(b'K') => (1u64 << 10, &unit[1..]),
            Some(b'M') => (1 << 20, &unit[1..]),
            Some(b'G') => (1 << 30, &unit[1..]),
            Some(b'T') => (1 << 40, &unit[1..]),
            _ => (1, unit),
        };
        let (bits_per_unit, per) = match unit.as_bytes().first() {
            Some(b'B') => (1.0, &unit[1..]),
            Some(b'b') => (8.0, &unit[1..]),
            _ => return Err(Self::syntax()),
        };
        if !matches!(per, "ps" | "/s" | "s") {
            return Err(Self::syntax());
        }
        let bytes = value * scale as f64 / bits_per_unit;
        if bytes.is_finite() && bytes >= 0.0 {
            Ok(Bandwidth::BytesPerSec(bytes))
        } else {
            Err(format!("non-negative {}", Self::syntax()))
        }
    }

    fn format_value(&self) -> String {
        const SUFFIXES: [&str; 5] = ["", "K", "M", "G", "T"];
        match *self {
            Bandwidth::Auto => AUTO.to_string(),
            Bandwidth::BytesPerSec(mut value) => {
                // Scaling by 1024 is exact in binary floating point, so the shortest
                // round-trip representation of the scaled value parses back exactly.
                let mut i = 0;
                while value > 50000.0 && i + 1 < SUFFIXES.len() {
                    value /= 1024.0;
                    i += 1;
                }
                format!("{value}{}Bps", SUFFIXES[i])
            }
        }
    }

    fn syntax() -> String {
        "bandwidth value: <number>[T|G|M|K]B|b[[p|/]s] or \"auto\"".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memunits_forms() {
        let v = |s| MemUnits::parse_value(s);
        assert_eq!(v("8k"), Ok(MemUnits::Value(8192)));
        assert_eq!(v("8KB"), Ok(MemUnits::Value(8192)));
        assert_eq!(v("1m"), Ok(MemUnits::Value(1 << 20)));
        assert_eq!(v("64"), Ok(MemUnits::Value(64)));
        assert_eq!(v("64b"), Ok(MemUnits::Value(64)));
        assert_eq!(v("INF"), Ok(MemUnits::Inf));
        assert_eq!(v("Auto"), Ok(MemUnits::Auto));
        assert!(v("8x").is_err());
        assert!(v("8kbb").is_err());
        assert!(v("k").is_err());
        assert!(v("-1").is_err());
        assert!(v("99999999999999999999").is_err());
        assert_eq!(MemUnits::Value(8256).format_value(), "8256");
        assert_eq!(MemUnits::Value(8192).format_value(), "8K");
        assert_eq!(MemUnits::Value(1 << 50).format_value(), "1024T");
    }

    #[test]
    fn bandwidth_forms() {
        let v = |s| Bandwidth::parse_value(s);
        assert_eq!(v("100Bps"), Ok(Bandwidth::BytesPerSec(100.0)));
        assert_eq!(v("8bps"), Ok(Bandwidth::BytesPerSec(1.0)));
        assert_eq!(v("1KB/s"), Ok(Bandwidth::BytesPerSec(1024.0)));
        assert_eq!(v("2MBs"), Ok(Bandwidth::BytesPerSec(2.0 * 1048576.0)));
        assert_eq!(v("8Gbps"), Ok(Bandwidth::BytesPerSec(1073741824.0)));
        assert!(v("10").is_err());
        assert!(v("10MB").is_err());
        assert!(v("10kbps").is_err());
        assert!(v("-1Bps").is_err());
        assert_eq!(Bandwidth::BytesPerSec(12179.0 * 1048576.0).format_value(), "12179MBps");
    }
}
