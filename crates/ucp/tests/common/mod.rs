//! Helpers shared by the integration tests that run a peer process (this test binary run
//! again, with a worker address passed in the environment).

// Each test binary uses only some of these.
#![allow(dead_code)]

/// Deterministic test data: `n` bytes depending on `seed`.
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n).map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed * 7 + 1) as u8).collect()
}

/// Lower-case hex of `b` (to pass an address through the environment or a pipe).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a string made by [`hex`].
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}
