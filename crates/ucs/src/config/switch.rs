//! Multi-state switches and small composite values: [`Ternary`] (`UCS_CONFIG_TYPE_TERNARY`),
//! [`TernaryAuto`], [`OnOffAuto`], the generic [`AutoOr`] and [`RangeSpec`].

use super::types::parse_bool;
use super::ConfigValue;

fn is_try(s: &str) -> bool {
    s.eq_ignore_ascii_case("try") || s.eq_ignore_ascii_case("maybe")
}

/// A feature request that may be soft (`UCS_CONFIG_TYPE_TERNARY`).
///
/// Syntax: the boolean forms (`y/n`, `yes/no`, `on/off`, `1/0`), or `try`/`maybe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ternary {
    /// Required: fail if unavailable.
    Yes,
    /// Disabled.
    No,
    /// Use if available.
    Try,
}

impl ConfigValue for Ternary {
    fn parse_value(s: &str) -> Result<Self, String> {
        match TernaryAuto::parse_value(s) {
            Ok(TernaryAuto::Yes) => Ok(Ternary::Yes),
            Ok(TernaryAuto::No) => Ok(Ternary::No),
            Ok(TernaryAuto::Try) => Ok(Ternary::Try),
            Ok(TernaryAuto::Auto) | Err(_) => Err(Self::syntax()),
        }
    }

    fn format_value(&self) -> String {
        match self {
            Ternary::Yes => TernaryAuto::Yes,
            Ternary::No => TernaryAuto::No,
            Ternary::Try => TernaryAuto::Try,
        }
        .format_value()
    }

    fn syntax() -> String {
        "<yes|no|try>".to_string()
    }
}

/// [`Ternary`] plus `auto` (`UCS_CONFIG_TYPE_TERNARY_AUTO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TernaryAuto {
    /// Required: fail if unavailable.
    Yes,
    /// Disabled.
    No,
    /// Use if available.
    Try,
    /// Let the component decide.
    Auto,
}

impl ConfigValue for TernaryAuto {
    fn parse_value(s: &str) -> Result<Self, String> {
        if is_try(s) {
            Ok(TernaryAuto::Try)
        } else if s.eq_ignore_ascii_case("auto") {
            Ok(TernaryAuto::Auto)
        } else {
            match parse_bool(s) {
                Some(true) => Ok(TernaryAuto::Yes),
                Some(false) => Ok(TernaryAuto::No),
                None => Err(Self::syntax()),
            }
        }
    }

    fn format_value(&self) -> String {
        match self {
            TernaryAuto::Yes => "y",
            TernaryAuto::No => "n",
            TernaryAuto::Try => "try",
            TernaryAuto::Auto => "auto",
        }
        .to_string()
    }

    fn syntax() -> String {
        "<yes|no|try|auto>".to_string()
    }
}

/// A switch with an automatic setting (`UCS_CONFIG_TYPE_ON_OFF_AUTO`).
///
/// Syntax: `on`/`yes`/`y`/`1`, `off`/`no`/`n`/`0`, `auto` (also `try`/`maybe`), any case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnOffAuto {
    /// Forced on.
    On,
    /// Forced off.
    Off,
    /// Let the component decide.
    Auto,
}

impl ConfigValue for OnOffAuto {
    fn parse_value(s: &str) -> Result<Self, String> {
        if is_try(s) || s.eq_ignore_ascii_case("auto") {
            return Ok(OnOffAuto::Auto);
        }
        match parse_bool(s) {
            Some(true) => Ok(OnOffAuto::On),
            Some(false) => Ok(OnOffAuto::Off),
            None => Err(Self::syntax()),
        }
    }

    fn format_value(&self) -> String {
        match self {
            OnOffAuto::On => "on",
            OnOffAuto::Off => "off",
            OnOffAuto::Auto => "auto",
        }
        .to_string()
    }

    fn syntax() -> String {
        "<on|off|auto>".to_string()
    }
}

/// Any value type extended with `auto` (any case), like UCX's `POS_DOUBLE` or `HEX` types
/// that reserve an "auto" value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AutoOr<T> {
    /// Let the component choose.
    Auto,
    /// An explicit value.
    Value(T),
}

impl<T: ConfigValue> ConfigValue for AutoOr<T> {
    fn parse_value(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(AutoOr::Auto);
        }
        T::parse_value(s).map(AutoOr::Value).map_err(|e| format!("{e}, or \"auto\""))
    }

    fn format_value(&self) -> String {
        match self {
            AutoOr::Auto => "auto".to_string(),
            AutoOr::Value(v) => v.format_value(),
        }
    }

    fn syntax() -> String {
        format!("{}, or \"auto\"", T::syntax())
    }
}

/// An inclusive range of numbers (`UCS_CONFIG_TYPE_RANGE_SPEC`): `<first>-<last>` or a
/// single `<number>` meaning `first == last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RangeSpec {
    /// First number of the range.
    pub first: u32,
    /// Last number of the range (inclusive).
    pub last: u32,
}

impl RangeSpec {
    /// True when `v` lies in `first..=last`.
    pub fn contains(&self, v: u32) -> bool {
        (self.first..=self.last).contains(&v)
    }
}

impl ConfigValue for RangeSpec {
    fn parse_value(s: &str) -> Result<Self, String> {
        let number = |t: &str| -> Result<u32, String> {
            if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
                return Err(Self::syntax());
            }
            t.parse().map_err(|_| Self::syntax())
        };
        match s.split_once('-') {
            None => {
                let v = number(s)?;
                Ok(RangeSpec { first: v, last: v })
            }
            Some((a, b)) => Ok(RangeSpec { first: number(a)?, last: number(b)? }),
        }
    }

    fn format_value(&self) -> String {
        if self.first == self.last {
            self.first.to_string()
        } else {
            format!("{}-{}", self.first, self.last)
        }
    }

    fn syntax() -> String {
        "numbers range: <number>-<number>".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches() {
        assert_eq!(Ternary::parse_value("MAYBE"), Ok(Ternary::Try));
        assert_eq!(Ternary::parse_value("on"), Ok(Ternary::Yes));
        assert!(Ternary::parse_value("auto").is_err());
        assert_eq!(TernaryAuto::parse_value("auto"), Ok(TernaryAuto::Auto));
        assert_eq!(OnOffAuto::parse_value("try"), Ok(OnOffAuto::Auto));
        assert_eq!(OnOffAuto::parse_value("YES"), Ok(OnOffAuto::On));
        assert_eq!(OnOffAuto::parse_value("0"), Ok(OnOffAuto::Off));
        assert!(OnOffAuto::parse_value("2").is_err());
    }

    #[test]
    fn ranges() {
        assert_eq!(RangeSpec::parse_value("3"), Ok(RangeSpec { first: 3, last: 3 }));
        assert_eq!(RangeSpec::parse_value("3-7"), Ok(RangeSpec { first: 3, last: 7 }));
        assert!(RangeSpec::parse_value("3-").is_err());
        assert!(RangeSpec::parse_value("-3").is_err());
        assert!(RangeSpec::parse_value("1-2-3").is_err());
        assert!(RangeSpec { first: 3, last: 7 }.contains(7));
    }

    #[test]
    fn auto_or() {
        assert_eq!(AutoOr::<u32>::parse_value("AUTO"), Ok(AutoOr::Auto));
        assert_eq!(AutoOr::<u32>::parse_value("5"), Ok(AutoOr::Value(5)));
        let err = AutoOr::<u32>::parse_value("x").unwrap_err();
        assert!(err.contains("unsigned integer"), "{err}");
    }
}
