//! Property tests for configuration values: every type round-trips through its UCX syntax,
//! arbitrary strings never panic, and unit parsing, allow lists, patterns and prefix
//! inheritance agree with naive models.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use ucs::config::{
    glob_match, AllowList, AutoOr, Bandwidth, Config, ConfigValue, MemUnits, OnOffAuto, RangeSpec, Ternary,
    TernaryAuto, TimeValue, UlUnits,
};

ucs::config_enum! {
    /// Enum under test.
    pub enum Scheme { Auto = "auto", GetZcopy = "get_zcopy", PutZcopy = "put_zcopy", Am = "am" }
}

ucs::config_table! {
    /// Table under test.
    pub struct Probe {
        pub size: u32 = ("SIZE", "1", "Size"),
        pub mem: MemUnits = ("MEM", "auto", "Memory"),
    }
}

fn round_trip<T: ConfigValue>(v: &T) -> Result<(), TestCaseError> {
    let text = v.format_value();
    let parsed = T::parse_value(&text);
    prop_assert_eq!(parsed.as_ref(), Ok(v), "formatted as {:?}", text);
    Ok(())
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..100_000, 0u32..1000).prop_map(|(s, n)| Duration::new(s, n * 1_000_000)),
    ]
}

fn bandwidth_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        (0u64..1 << 53).prop_map(|v| v as f64),
        (0.0f64..1e30),
        (0.0f64..1.0),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
    ]
}

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9_:.]{1,8}".prop_filter("reserved", |s| s != "all")
}

fn allow_list() -> impl Strategy<Value = AllowList> {
    prop_oneof![
        Just(AllowList::All),
        prop::collection::vec(name(), 0..5).prop_map(AllowList::Allow),
        prop::collection::vec(name(), 0..5).prop_map(AllowList::Deny),
    ]
}

proptest! {
    // Fixed seed: a failure reproduces on every run without a regressions file.
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x0c0f_1600),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn scalars_round_trip(b in any::<bool>(), u8_ in any::<u8>(), u16_ in any::<u16>(),
                          u32_ in any::<u32>(), u64_ in any::<u64>(), us in any::<usize>(),
                          i8_ in any::<i8>(), i32_ in any::<i32>(), i64_ in any::<i64>()) {
        round_trip(&b)?;
        round_trip(&u8_)?;
        round_trip(&u16_)?;
        round_trip(&u32_)?;
        round_trip(&u64_)?;
        round_trip(&us)?;
        round_trip(&i8_)?;
        round_trip(&i32_)?;
        round_trip(&i64_)?;
    }

    #[test]
    fn floats_round_trip(f in any::<f64>().prop_filter("nan", |f| !f.is_nan())) {
        round_trip(&f)?;
    }

    #[test]
    fn strings_and_lists_round_trip(s in any::<String>(),
                                    names in prop::collection::vec("[^,]{1,10}", 0..6),
                                    nums in prop::collection::vec(any::<u32>(), 0..6)) {
        round_trip(&s)?;
        round_trip(&names)?;
        round_trip(&nums)?;
    }

    #[test]
    fn units_round_trip(d in duration(), mem in any::<usize>(), ul in any::<u64>(),
                        bw in bandwidth_value(), special in 0u8..3) {
        round_trip(&d)?;
        round_trip(&MemUnits::Value(mem))?;
        round_trip(&UlUnits::Value(ul))?;
        round_trip(&Bandwidth::BytesPerSec(bw))?;
        round_trip(&TimeValue::Value(d))?;
        let (m, u, t) = match special {
            0 => (MemUnits::Inf, UlUnits::Inf, TimeValue::Inf),
            1 => (MemUnits::Auto, UlUnits::Auto, TimeValue::Auto),
            _ => (MemUnits::Value(0), UlUnits::Value(0), TimeValue::Value(Duration::ZERO)),
        };
        round_trip(&m)?;
        round_trip(&u)?;
        round_trip(&t)?;
        round_trip(&Bandwidth::Auto)?;
    }

    #[test]
    fn switches_and_composites_round_trip(i in 0usize..4, first in any::<u32>(), last in any::<u32>(),
                                          list in allow_list(), auto in any::<Option<u32>>()) {
        round_trip(&[Ternary::Yes, Ternary::No, Ternary::Try][i % 3])?;
        round_trip(&[TernaryAuto::Yes, TernaryAuto::No, TernaryAuto::Try, TernaryAuto::Auto][i])?;
        round_trip(&[OnOffAuto::On, OnOffAuto::Off, OnOffAuto::Auto][i % 3])?;
        round_trip(&Scheme::ALL[i])?;
        round_trip(&RangeSpec { first, last })?;
        round_trip(&list)?;
        round_trip(&auto.map_or(AutoOr::Auto, AutoOr::Value))?;
    }

    #[test]
    fn garbage_never_panics(s in prop_oneof![any::<String>(), "[0-9a-zA-Z.+\\-eE/^,*\\[\\]!\\\\]{0,24}"],
                            name in any::<String>()) {
        let _ = bool::parse_value(&s);
        let _ = u8::parse_value(&s);
        let _ = u64::parse_value(&s);
        let _ = i64::parse_value(&s);
        let _ = f64::parse_value(&s);
        let _ = Vec::<u32>::parse_value(&s);
        let _ = Duration::parse_value(&s);
        let _ = TimeValue::parse_value(&s);
        let _ = MemUnits::parse_value(&s);
        let _ = UlUnits::parse_value(&s);
        let _ = Bandwidth::parse_value(&s);
        let _ = Ternary::parse_value(&s);
        let _ = TernaryAuto::parse_value(&s);
        let _ = OnOffAuto::parse_value(&s);
        let _ = RangeSpec::parse_value(&s);
        let _ = AutoOr::<f64>::parse_value(&s);
        let _ = Scheme::parse_value(&s);
        if let Ok(list) = AllowList::parse_value(&s) {
            let _ = list.allows(&name);
        }
        let _ = glob_match(&s, &name);
        let mut probe = Probe::default();
        let _ = probe.set("MEM", &s);
        let env = HashMap::from([("UCX_SIZE", s.as_str())]);
        let _ = Probe::read_from(&env, &[""]);
    }

    #[test]
    fn memunits_match_model(n in 0u64..1 << 45, unit in 0usize..5, suffix_b in any::<bool>(),
                            upper in any::<bool>()) {
        let letters = ["", "k", "m", "g", "t"];
        let mut suffix = letters[unit].to_string();
        if suffix_b {
            suffix.push('b');
        }
        if upper {
            suffix = suffix.to_uppercase();
        }
        let expected = n.checked_mul(1u64 << (10 * unit)).and_then(|b| usize::try_from(b).ok());
        let parsed = MemUnits::parse_value(&format!("{n}{suffix}")).ok();
        prop_assert_eq!(parsed, expected.map(MemUnits::Value));
    }

    #[test]
    fn time_matches_model(n in 0u64..1 << 40, unit in 0usize..6) {
        let (suffix, nanos) = [("", 1_000_000_000u128), ("s", 1_000_000_000), ("m", 60_000_000_000),
                               ("ms", 1_000_000), ("us", 1_000), ("ns", 1)][unit];
        let total = u128::from(n) * nanos;
        let expected = Duration::new((total / 1_000_000_000) as u64, (total % 1_000_000_000) as u32);
        prop_assert_eq!(Duration::parse_value(&format!("{n}{suffix}")), Ok(expected));
        prop_assert_eq!(TimeValue::parse_value(&format!("{n}{suffix}")), Ok(TimeValue::Value(expected)));
    }

    #[test]
    fn bandwidth_matches_model(v in 0u32..1_000_000, frac in 0u32..100, prefix in 0usize..5,
                               bits in any::<bool>(), per in 0usize..3) {
        let text = format!("{v}.{frac:02}{}{}{}", ["", "K", "M", "G", "T"][prefix],
                           if bits { "b" } else { "B" }, ["ps", "/s", "s"][per]);
        let number = f64::from(v) + f64::from(frac) / 100.0;
        let expected = number * 1024f64.powi(prefix as i32) / if bits { 8.0 } else { 1.0 };
        match Bandwidth::parse_value(&text) {
            Ok(Bandwidth::BytesPerSec(got)) => {
                prop_assert!((got - expected).abs() <= expected * 1e-12, "{} -> {}", text, got);
            }
            other => prop_assert!(false, "{} -> {:?}", text, other),
        }
    }

    #[test]
    fn allow_list_matches_model(negate in any::<bool>(),
                                items in prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "all", ""]), 0..5)) {
        let text = format!("{}{}", if negate { "^" } else { "" }, items.join(","));
        let names: Vec<&str> = items.iter().copied().filter(|s| !s.is_empty()).collect();
        let parsed = AllowList::parse_value(&text);
        if names.first() == Some(&"all") {
            prop_assert_eq!(parsed.is_ok(), names.len() == 1, "{}", text);
            if let Ok(list) = parsed {
                prop_assert_eq!(list, AllowList::All);
            }
        } else {
            let list = parsed.map_err(TestCaseError::fail)?;
            for candidate in ["a", "b", "c", "d", "all"] {
                let listed = names.contains(&candidate);
                prop_assert_eq!(list.allows(candidate), listed != negate, "{} / {}", text, candidate);
            }
        }
    }

    #[test]
    fn glob_matches_model(pattern in "[ab*?]{0,8}", name in "[ab]{0,8}") {
        prop_assert_eq!(glob_match(&pattern, &name), naive_glob(pattern.as_bytes(), name.as_bytes()),
                        "{} vs {}", pattern, name);
    }

    #[test]
    fn prefix_inheritance_matches_model(settings in prop::collection::vec(prop::option::of(any::<u32>()), 3)) {
        let prefixes = ["A_", "B_", ""];
        let env: HashMap<String, String> = prefixes
            .iter()
            .zip(&settings)
            .filter_map(|(p, s)| s.map(|v| (format!("UCX_{p}SIZE"), v.to_string())))
            .collect();
        let expected = settings.iter().flatten().next().copied().unwrap_or(1);
        prop_assert_eq!(Probe::read_from(&env, &prefixes).map(|p| p.size), Ok(expected));
    }
}

fn naive_glob(p: &[u8], n: &[u8]) -> bool {
    match (p.first(), n.first()) {
        (None, None) => true,
        (Some(b'*'), _) => naive_glob(&p[1..], n) || (!n.is_empty() && naive_glob(p, &n[1..])),
        (Some(b'?'), Some(_)) => naive_glob(&p[1..], &n[1..]),
        (Some(a), Some(b)) if a == b => naive_glob(&p[1..], &n[1..]),
        _ => false,
    }
}
