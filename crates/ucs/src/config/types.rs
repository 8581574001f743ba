//! The [`ConfigValue`] trait and its implementations for Rust's scalar types.
//!
//! Each implementation accepts what UCX's `sscanf`-style parser for the matching
//! `UCS_CONFIG_TYPE_*` accepts, minus trailing garbage (UCX's `sscanf` silently ignores it,
//! which hides typos), and formats so that the output parses back to the same value.

use std::time::Duration;

/// A type that can be read from, and written back to, a UCX configuration value string.
///
/// `parse_value(&v.format_value()) == Ok(v)` holds for every value the type can represent
/// (collections only for elements that do not contain the separator).
pub trait ConfigValue: Sized + Clone + std::fmt::Debug + PartialEq {
    /// Parses a value in UCX syntax. On failure returns a description of the accepted forms,
    /// which becomes the `expected:` part of a [`ConfigError`](super::ConfigError).
    fn parse_value(s: &str) -> Result<Self, String>;

    /// Formats the value in UCX syntax.
    fn format_value(&self) -> String;

    /// Describes the accepted syntax, as the `syntax:` line of `ucx_info -f`.
    fn syntax() -> String;
}

/// Splits `s` into the longest leading decimal floating-point literal and the rest.
///
/// Accepts `[+-]digits[.digits][e[+-]digits]` and `[+-].digits...`; returns `None` when `s`
/// does not start with a number. Needed because units follow the number without a separator.
pub(crate) fn split_float(s: &str) -> Option<(f64, &str)> {
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        i += 1;
    }
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let mut digits = i - int_start;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let frac_start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        digits += i - frac_start;
    }
    if digits == 0 {
        return None;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        let exp_start = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        // An `e` not followed by digits belongs to the unit, not to the number.
        if j > exp_start {
            i = j;
        }
    }
    let value = s[..i].parse::<f64>().ok()?;
    Some((value, &s[i..]))
}

/// Splits `s` into its leading run of ASCII digits and the rest.
pub(crate) fn split_digits(s: &str) -> (&str, &str) {
    let end = s.bytes().take_while(u8::is_ascii_digit).count();
    s.split_at(end)
}

/// Parses an unsigned integer: decimal, or hexadecimal with a `0x` prefix.
pub(crate) fn parse_u64(s: &str) -> Option<u64> {
    let s = s.strip_prefix('+').unwrap_or(s);
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        return u64::from_str_radix(hex, 16).ok();
    }
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses a signed integer: decimal, or hexadecimal with a `0x` prefix after the sign.
fn parse_i64(s: &str) -> Option<i64> {
    let (negative, magnitude) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if magnitude.starts_with(['+', '-']) {
        return None;
    }
    let m = parse_u64(magnitude)?;
    if negative {
        0i64.checked_sub_unsigned(m)
    } else {
        i64::try_from(m).ok()
    }
}

fn bool_from_str(s: &str) -> Option<bool> {
    const TRUE: [&str; 4] = ["y", "yes", "on", "1"];
    const FALSE: [&str; 4] = ["n", "no", "off", "0"];
    if TRUE.iter().any(|t| t.eq_ignore_ascii_case(s)) {
        Some(true)
    } else if FALSE.iter().any(|f| f.eq_ignore_ascii_case(s)) {
        Some(false)
    } else {
        None
    }
}

/// Parses UCX's boolean forms (`y/n`, `yes/no`, `on/off`, `1/0`, any case).
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    bool_from_str(s)
}

impl ConfigValue for bool {
    fn parse_value(s: &str) -> Result<Self, String> {
        bool_from_str(s).ok_or_else(Self::syntax)
    }

    fn format_value(&self) -> String {
        if *self { "y" } else { "n" }.to_string()
    }

    fn syntax() -> String {
        "<y|n>".to_string()
    }
}

// UCX's `uint` parser maps "inf" to the type's maximum and prints the maximum back as "inf";
// every unsigned width here does the same so the mapping is uniform.
macro_rules! unsigned_config_value {
    ($($t:ty),*) => {$(
        impl ConfigValue for $t {
            fn parse_value(s: &str) -> Result<Self, String> {
                if s.eq_ignore_ascii_case("inf") {
                    return Ok(<$t>::MAX);
                }
                let v = parse_u64(s).ok_or_else(Self::syntax)?;
                <$t>::try_from(v)
                    .map_err(|_| format!("{} no larger than {}", Self::syntax(), <$t>::MAX))
            }

            fn format_value(&self) -> String {
                if *self == <$t>::MAX {
                    "inf".to_string()
                } else {
                    self.to_string()
                }
            }

            fn syntax() -> String {
                "unsigned integer".to_string()
            }
        }
    )*};
}

unsigned_config_value!(u8, u16, u32, u64, usize);

macro_rules! signed_config_value {
    ($($t:ty),*) => {$(
        impl ConfigValue for $t {
            fn parse_value(s: &str) -> Result<Self, String> {
                let v = parse_i64(s).ok_or_else(Self::syntax)?;
                <$t>::try_from(v).map_err(|_| {
                    format!("{} in {}..={}", Self::syntax(), <$t>::MIN, <$t>::MAX)
                })
            }

            fn format_value(&self) -> String {
                self.to_string()
            }

            fn syntax() -> String {
                "integer".to_string()
            }
        }
    )*};
}

signed_config_value!(i8, i16, i32, i64, isize);

impl ConfigValue for f64 {
    fn parse_value(s: &str) -> Result<Self, String> {
        match s.parse::<f64>() {
            Ok(v) if !v.is_nan() => Ok(v),
            _ => Err(Self::syntax()),
        }
    }

    fn format_value(&self) -> String {
        // Rust's shortest round-trip form; UCX's "%.3f" would lose precision.
        self.to_string()
    }

    fn syntax() -> String {
        "floating point number".to_string()
    }
}

impl ConfigValue for String {
    fn parse_value(s: &str) -> Result<Self, String> {
        Ok(s.to_string())
    }

    fn format_value(&self) -> String {
        self.clone()
    }

    fn syntax() -> String {
        "string".to_string()
    }
}

/// Comma-separated list; empty items are skipped as in UCX (`"a,,b"` is `[a, b]`).
impl<T: ConfigValue> ConfigValue for Vec<T> {
    fn parse_value(s: &str) -> Result<Self, String> {
        s.split(',')
            .filter(|item| !item.is_empty())
            .map(|item| T::parse_value(item).map_err(|e| format!("comma-separated list of: {e}")))
            .collect()
    }

    fn format_value(&self) -> String {
        self.iter().map(T::format_value).collect::<Vec<_>>().join(",")
    }

    fn syntax() -> String {
        format!("comma-separated list of: {}", T::syntax())
    }
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Parses UCX's time syntax: a number followed by `m`, `s`, `ms`, `us` or `ns` (no unit means
/// seconds). Integer values are converted exactly; fractions go through `f64`.
pub(crate) fn parse_duration(s: &str) -> Option<Duration> {
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E') {
        // `e` is an exponent inside the number; no unit starts with it.
        Some(pos) => s.split_at(pos),
        None => (s, ""),
    };
    let nanos_per_unit: u128 = match unit {
        "" | "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "ms" => 1_000_000,
        "us" => 1_000,
        "ns" => 1,
        _ => return None,
    };
    let (digits, rest) = split_digits(number);
    if !digits.is_empty() && rest.is_empty() {
        let total = digits.parse::<u128>().ok()?.checked_mul(nanos_per_unit)?;
        let secs = u64::try_from(total / NANOS_PER_SEC).ok()?;
        // The remainder is below 10^9, so it fits in u32.
        let nanos = (total % NANOS_PER_SEC) as u32;
        return Some(Duration::new(secs, nanos));
    }
    match split_float(number) {
        Some((value, "")) => {
            // Lossy by nature: a fractional value already went through f64.
            let secs = value * (nanos_per_unit as f64 / NANOS_PER_SEC as f64);
            Duration::try_from_secs_f64(secs).ok()
        }
        _ => None,
    }
}

/// Formats a duration exactly, in the largest of s/ms/us/ns that divides it.
pub(crate) fn format_duration(d: &Duration) -> String {
    let nanos = d.as_nanos();
    if nanos % NANOS_PER_SEC == 0 {
        format!("{}s", nanos / NANOS_PER_SEC)
    } else if nanos % 1_000_000 == 0 {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}

pub(crate) const TIME_SYNTAX: &str = "time value: <number>[m|s|ms|us|ns]";

/// UCX's `UCS_CONFIG_TYPE_TIME`: a non-negative number with an optional unit.
impl ConfigValue for Duration {
    fn parse_value(s: &str) -> Result<Self, String> {
        parse_duration(s).ok_or_else(Self::syntax)
    }

    fn format_value(&self) -> String {
        format_duration(self)
    }

    fn syntax() -> String {
        TIME_SYNTAX.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_prefix() {
        assert_eq!(split_float("1.5MBs"), Some((1.5, "MBs")));
        assert_eq!(split_float("2e3x"), Some((2000.0, "x")));
        assert_eq!(split_float("2ex"), Some((2.0, "ex")));
        assert_eq!(split_float(".5"), Some((0.5, "")));
        assert_eq!(split_float("."), None);
        assert_eq!(split_float("-"), None);
        assert_eq!(split_float("abc"), None);
    }

    #[test]
    fn integers() {
        assert_eq!(u32::parse_value("0x10"), Ok(16));
        assert_eq!(u32::parse_value("inf"), Ok(u32::MAX));
        assert!(u8::parse_value("256").is_err());
        assert!(u32::parse_value("-1").is_err());
        assert!(u32::parse_value("0x").is_err());
        assert_eq!(i32::parse_value("-0x10"), Ok(-16));
        assert_eq!(i64::parse_value("-9223372036854775808"), Ok(i64::MIN));
        assert!(i64::parse_value("--1").is_err());
        assert!(i64::parse_value("-+1").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms"), Some(Duration::from_millis(10)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1e3us"), Some(Duration::from_millis(1)));
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration("1h"), None);
        assert_eq!(format_duration(&Duration::from_micros(1500)), "1500us");
        assert_eq!(format_duration(&Duration::ZERO), "0s");
    }
}
