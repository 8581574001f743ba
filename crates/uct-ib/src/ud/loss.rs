//! Deterministic fault injection: decide, per packet, to deliver, drop, duplicate or delay it.
//!
//! The tests' network simulator uses it between two interfaces; a real transport can apply the
//! same hook to its outgoing datagrams to exercise the reliability layer on a clean fabric.
//! Decisions come from a seeded xorshift generator, so a given seed and packet order always
//! give the same faults.

use std::fmt;
use std::str::FromStr;

/// Parts per million: 1% is 10_000.
pub const PPM: u32 = 1_000_000;

/// xorshift64* pseudo-random generator: tiny, fast, good enough for fault injection, and
/// identical on every platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XorShift64(u64);

impl XorShift64 {
    /// A generator seeded with `seed` (0 is replaced by a fixed non-zero constant, since
    /// xorshift would stay at 0 forever).
    pub fn new(seed: u64) -> Self {
        // Spread small seeds over the state so seeds 1, 2, 3 give unrelated streams.
        let s = seed.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        XorShift64(if s == 0 { 0x2545_f491_4f6c_dd1d } else { s })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: unbiased enough for n far below 2^64.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Fault rates, in parts per million of packets, and the generator seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossConfig {
    /// Packets silently dropped.
    pub drop_ppm: u32,
    /// Packets delivered twice.
    pub dup_ppm: u32,
    /// Packets held back so that later packets overtake them.
    pub reorder_ppm: u32,
    /// Generator seed.
    pub seed: u64,
}

impl LossConfig {
    /// Whether any fault can happen.
    pub fn is_active(&self) -> bool {
        self.drop_ppm > 0 || self.dup_ppm > 0 || self.reorder_ppm > 0
    }
}

/// Error of [`LossConfig::from_str`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LossConfigError(String);

impl fmt::Display for LossConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid loss specification: {}", self.0)
    }
}

impl std::error::Error for LossConfigError {}

fn parse_rate(v: &str) -> Option<u32> {
    let ppm = if let Some(pct) = v.strip_suffix('%') {
        let p: f64 = pct.trim().parse().ok()?;
        if !(0.0..=100.0).contains(&p) {
            return None;
        }
        (p * 10_000.0).round() as u32
    } else {
        v.strip_suffix("ppm").unwrap_or(v).trim().parse().ok()?
    };
    (ppm <= PPM).then_some(ppm)
}

impl FromStr for LossConfig {
    type Err = LossConfigError;

    /// Parses `drop=1%,dup=500ppm,reorder=0.5%,seed=42` (any subset, any order; a rate is a
    /// percentage with `%` or parts per million, with or without `ppm`). Empty means no faults.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut c = LossConfig::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item.split_once('=').ok_or_else(|| LossConfigError(format!("'{item}' is not key=value")))?;
            let bad = || LossConfigError(format!("bad value in '{item}'"));
            match k.trim() {
                "drop" => c.drop_ppm = parse_rate(v).ok_or_else(bad)?,
                "dup" => c.dup_ppm = parse_rate(v).ok_or_else(bad)?,
                "reorder" => c.reorder_ppm = parse_rate(v).ok_or_else(bad)?,
                "seed" => c.seed = v.trim().parse().map_err(|_| bad())?,
                other => return Err(LossConfigError(format!("unknown key '{other}'"))),
            }
        }
        Ok(c)
    }
}

/// What to do with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Send it normally.
    Deliver,
    /// Do not send it.
    Drop,
    /// Send it twice.
    Duplicate,
    /// Send it late, after packets that follow it.
    Reorder,
}

/// The fault injector: one [`Fate`] per packet, from the configured rates.
#[derive(Clone, Debug)]
pub struct LossHook {
    config: LossConfig,
    rng: XorShift64,
}

impl LossHook {
    /// An injector with `config`'s rates, seeded with `config.seed`.
    pub fn new(config: LossConfig) -> Self {
        LossHook { config, rng: XorShift64::new(config.seed) }
    }

    /// The rates in use.
    pub fn config(&self) -> &LossConfig {
        &self.config
    }

    /// Changes the rates, keeping the generator's position (e.g. to stop losses mid-test).
    pub fn set_config(&mut self, config: LossConfig) {
        self.config = config;
    }

    /// Decides the fate of the next packet. Drop, duplicate and reorder are exclusive; their
    /// rates add up (capped at 100%).
    pub fn fate(&mut self) -> Fate {
        if !self.config.is_active() {
            return Fate::Deliver;
        }
        let r = self.rng.below(u64::from(PPM));
        let drop = u64::from(self.config.drop_ppm);
        let dup = drop + u64::from(self.config.dup_ppm);
        let reorder = dup + u64::from(self.config.reorder_ppm);
        if r < drop {
            Fate::Drop
        } else if r < dup {
            Fate::Duplicate
        } else if r < reorder {
            Fate::Reorder
        } else {
            Fate::Deliver
        }
    }

    /// The generator, for choosing delays and the like from the same deterministic stream.
    pub fn rng(&mut self) -> &mut XorShift64 {
        &mut self.rng
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_honoured_and_seeded() {
        let cfg = LossConfig { drop_ppm: 100_000, dup_ppm: 50_000, reorder_ppm: 20_000, seed: 7 };
        let mut h = LossHook::new(cfg);
        let mut counts = [0u32; 4];
        let fates: Vec<Fate> = (0..100_000).map(|_| h.fate()).collect();
        for f in &fates {
            counts[*f as usize] += 1;
        }
        // Deliver, Drop, Duplicate, Reorder within 10% of the expectation.
        for (got, want) in counts.iter().zip([83_000u32, 10_000, 5_000, 2_000]) {
            assert!(got.abs_diff(want) < want / 10, "{counts:?}");
        }
        let mut again = LossHook::new(cfg);
        assert!(fates.iter().all(|f| *f == again.fate()), "same seed, same fates");
        let mut other = LossHook::new(LossConfig { seed: 8, ..cfg });
        assert!(fates.iter().any(|f| *f != other.fate()));
        assert_eq!(LossHook::new(LossConfig::default()).fate(), Fate::Deliver);
        let mut all = LossHook::new(LossConfig { drop_ppm: PPM, ..cfg });
        assert!((0..100).all(|_| all.fate() == Fate::Drop));
        assert_eq!(XorShift64::new(0).below(0), 0);
        assert!(XorShift64::new(0).next_u64() != 0);
    }

    #[test]
    fn parse() {
        let c: LossConfig = "drop=1%, dup=500ppm,reorder=20,seed=9".parse().unwrap();
        assert_eq!(c, LossConfig { drop_ppm: 10_000, dup_ppm: 500, reorder_ppm: 20, seed: 9 });
        assert_eq!("".parse::<LossConfig>(), Ok(LossConfig::default()));
        assert_eq!("drop=0.5%".parse::<LossConfig>().unwrap().drop_ppm, 5_000);
        for bad in ["drop", "drop=200%", "drop=2000000", "loss=1", "seed=x", "dup=-1%", "reorder=nan%"] {
            assert!(bad.parse::<LossConfig>().is_err(), "{bad}");
        }
        assert!(LossConfigError("x".into()).to_string().contains('x'));
    }
}
