//! The packed remote key of a mapped region (`ucp_rkey_pack`): what a peer gets out of band to
//! reach the region, with one transport key per memory domain that registered it.
//!
//! ```text
//! magic u16 ("RK")   version u8 (1)   count u8
//! worker uuid u64    address u64      length u64
//! count × { component: len u8 + name, memory domain: len u8 + name, key: len u8 + bytes }
//! ```
//!
//! The bytes come from another process (through the application's own channel) and are
//! decoded strictly: every length is checked against the input and its limit, names must be
//! UTF-8, the region must fit the address space, and nothing may follow the last entry.

use super::WireError;

const MAGIC: u16 = u16::from_le_bytes(*b"RK");
const VERSION: u8 = 1;
/// Bytes before the entries.
const FIXED: usize = 2 + 1 + 1 + 8 + 8 + 8;
/// Entries one key may carry at most (one per memory domain of the packing worker).
pub const MAX_ENTRIES: usize = 16;
/// Longest component or memory-domain name.
pub const MAX_NAME: usize = 32;
const WHAT: &str = "remote key";

/// One memory domain's key in a packed remote key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RkeyEntry<'a> {
    /// The component that packed it (`posix`, `cma`, `rc_verbs`' `ib`, ...): the one that unpacks it.
    pub component: &'a str,
    /// The memory domain (for shared memory the component's name; for a network, the device).
    pub md: &'a str,
    /// The transport's packed key.
    pub key: &'a [u8],
}

/// A packed remote key, decoded (borrowing the bytes) or to encode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedRkey<'a> {
    /// The worker that mapped the region.
    pub uuid: u64,
    /// Start of the region in the owner's address space.
    pub address: u64,
    /// Length of the region.
    pub length: u64,
    /// One key per memory domain.
    pub entries: Vec<RkeyEntry<'a>>,
}

impl<'a> PackedRkey<'a> {
    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        FIXED + self.entries.iter().map(|e| 3 + e.component.len() + e.md.len() + e.key.len()).sum::<usize>()
    }

    /// The bytes; `OutOfRange` when an entry's field or the count exceeds the format's limits.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let range = |field, value: usize| WireError::OutOfRange { what: WHAT, field, value: value as u64 };
        if self.entries.len() > MAX_ENTRIES {
            return Err(range("entry count", self.entries.len()));
        }
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(self.entries.len() as u8);
        out.extend_from_slice(&self.uuid.to_le_bytes());
        out.extend_from_slice(&self.address.to_le_bytes());
        out.extend_from_slice(&self.length.to_le_bytes());
        for e in &self.entries {
            for (field, b, max) in [
                ("component name length", e.component.as_bytes(), MAX_NAME),
                ("memory domain name length", e.md.as_bytes(), MAX_NAME),
                ("transport key length", e.key, uct::PackedKey::MAX),
            ] {
                if b.len() > max {
                    return Err(range(field, b.len()));
                }
                out.push(b.len() as u8);
                out.extend_from_slice(b);
            }
        }
        Ok(out)
    }

    /// Decodes `buf`, naming what was wrong with it.
    pub fn decode(buf: &'a [u8]) -> Result<PackedRkey<'a>, WireError> {
        let mut r = super::Reader::new(WHAT, buf);
        let magic = r.u16()?;
        if magic != MAGIC {
            return Err(WireError::OutOfRange { what: WHAT, field: "magic", value: magic as u64 });
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(WireError::OutOfRange { what: WHAT, field: "version", value: version as u64 });
        }
        let count = r.u8()? as usize;
        if count > MAX_ENTRIES {
            return Err(WireError::OutOfRange { what: WHAT, field: "entry count", value: count as u64 });
        }
        let (uuid, address, length) = (r.u64()?, r.u64()?, r.u64()?);
        if address.checked_add(length).is_none() {
            return Err(WireError::OutOfRange { what: WHAT, field: "length", value: length });
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let mut name = |field| -> Result<&'a str, WireError> {
                let n = r.u8()? as usize;
                if n > MAX_NAME {
                    return Err(WireError::OutOfRange { what: WHAT, field, value: n as u64 });
                }
                std::str::from_utf8(r.bytes(n)?).map_err(|_| WireError::OutOfRange {
                    what: WHAT,
                    field,
                    value: n as u64,
                })
            };
            let component = name("component name")?;
            let md = name("memory domain name")?;
            let n = r.u8()? as usize;
            if n > uct::PackedKey::MAX {
                return Err(WireError::KeyTooLong { what: WHAT, len: n });
            }
            entries.push(RkeyEntry { component, md, key: r.bytes(n)? });
        }
        r.end()?;
        Ok(PackedRkey { uuid, address, length, entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> PackedRkey<'static> {
        PackedRkey {
            uuid: 0x1234_5678_9abc_def0,
            address: 0x7f00_0000_1000,
            length: 4096,
            entries: vec![
                RkeyEntry { component: "posix", md: "posix", key: &[1, 2, 3, 4] },
                RkeyEntry { component: "cma", md: "cma", key: &[9; 24] },
            ],
        }
    }

    #[test]
    fn round_trips_and_every_truncation_fails() {
        let k = sample();
        let bytes = k.encode().unwrap();
        assert_eq!(bytes.len(), k.encoded_len());
        assert_eq!(PackedRkey::decode(&bytes).unwrap(), k);
        for cut in 0..bytes.len() {
            assert!(matches!(PackedRkey::decode(&bytes[..cut]), Err(WireError::Truncated { .. })), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(PackedRkey::decode(&longer), Err(WireError::TrailingBytes { .. })));
    }

    #[test]
    fn corrupted_fields_are_named() {
        let bytes = sample().encode().unwrap();
        let mut b = bytes.clone();
        b[0] ^= 1;
        assert_eq!(
            PackedRkey::decode(&b).unwrap_err().to_string(),
            format!("remote key: magic {} out of range", u16::from_le_bytes([b[0], b[1]]))
        );
        let mut b = bytes.clone();
        b[2] = 7;
        assert_eq!(PackedRkey::decode(&b), Err(WireError::OutOfRange { what: WHAT, field: "version", value: 7 }));
        let mut b = bytes.clone();
        b[3] = 200;
        assert_eq!(PackedRkey::decode(&b), Err(WireError::OutOfRange { what: WHAT, field: "entry count", value: 200 }));
        // A region that wraps the address space.
        let mut b = bytes.clone();
        b[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(PackedRkey::decode(&b), Err(WireError::OutOfRange { field: "length", .. })));
        // A name that is not UTF-8.
        let mut b = bytes;
        b[FIXED + 1] = 0xff;
        assert!(matches!(PackedRkey::decode(&b), Err(WireError::OutOfRange { field: "component name", .. })));
    }

    #[test]
    fn limits_are_enforced_when_encoding() {
        let mut k = sample();
        let long = [0u8; uct::PackedKey::MAX + 1];
        k.entries[0].key = &long;
        assert!(k.encode().is_err());
        let mut k = sample();
        k.entries = vec![k.entries[0]; MAX_ENTRIES + 1];
        assert!(k.encode().is_err());
    }

    proptest! {
        #[test]
        fn decoding_anything_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = PackedRkey::decode(&bytes);
        }

        #[test]
        fn any_valid_key_round_trips(uuid: u64, address in 0u64..1 << 47, length in 0u64..1 << 40,
                                     keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..=64), 0..4)) {
            let entries = keys.iter().map(|k| RkeyEntry { component: "posix", md: "posix", key: k }).collect();
            let k = PackedRkey { uuid, address, length, entries };
            let bytes = k.encode().unwrap();
            prop_assert_eq!(PackedRkey::decode(&bytes).unwrap(), k);
        }
    }
}
