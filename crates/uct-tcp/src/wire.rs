//! What travels on a tcp connection: a handshake from the connecting side, then active
//! messages, each behind an 8-byte header.
//!
//! * Handshake (16 bytes): the magic `UCXRSTCP`, the protocol version (u32, little-endian) and
//!   four zero bytes. The accepting side drops a connection whose first bytes are anything
//!   else, so a port scan or a stray client costs it nothing but a log line.
//! * Active message: the id (one byte, below [`uct::AM_ID_MAX`]), three zero bytes, the
//!   payload's length (u32, little-endian), the payload.

use std::fmt;

/// The first bytes of every connection.
pub(crate) const MAGIC: [u8; 8] = *b"UCXRSTCP";
/// The protocol version this build speaks.
pub(crate) const VERSION: u32 = 1;
/// Length of the handshake.
pub(crate) const HANDSHAKE_LEN: usize = 16;
/// Length of an active message's header.
pub(crate) const AM_HDR_LEN: usize = 8;

/// The handshake bytes.
pub(crate) fn handshake() -> [u8; HANDSHAKE_LEN] {
    let mut h = [0u8; HANDSHAKE_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// What is wrong with bytes a peer sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireError {
    BadMagic,
    BadVersion(u32),
    BadReserved,
    BadAmId(u8),
    TooLong { len: usize, max: usize },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic => write!(f, "the connection did not start with the ucx-rs tcp handshake"),
            WireError::BadVersion(v) => write!(f, "handshake of protocol version {v} (this build speaks {VERSION})"),
            WireError::BadReserved => write!(f, "reserved header bytes are not zero"),
            WireError::BadAmId(id) => write!(f, "active message id {id} out of range (0..{})", uct::AM_ID_MAX),
            WireError::TooLong { len, max } => write!(f, "active message of {len} bytes (at most {max})"),
        }
    }
}

/// Checks a handshake.
pub(crate) fn check_handshake(h: &[u8; HANDSHAKE_LEN]) -> Result<(), WireError> {
    if h[..8] != MAGIC {
        return Err(WireError::BadMagic);
    }
    let v = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if v != VERSION {
        return Err(WireError::BadVersion(v));
    }
    if h[12..] != [0; 4] {
        return Err(WireError::BadReserved);
    }
    Ok(())
}

/// An active message's header.
pub(crate) fn am_header(id: u8, len: usize) -> [u8; AM_HDR_LEN] {
    let mut h = [0u8; AM_HDR_LEN];
    h[0] = id;
    h[4..].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// Decodes an active message's header: its id and payload length (at most `max`).
pub(crate) fn decode_am_header(h: &[u8; AM_HDR_LEN], max: usize) -> Result<(u8, usize), WireError> {
    if h[0] >= uct::AM_ID_MAX {
        return Err(WireError::BadAmId(h[0]));
    }
    if h[1..4] != [0; 3] {
        return Err(WireError::BadReserved);
    }
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
    if len > max {
        return Err(WireError::TooLong { len, max });
    }
    Ok((h[0], len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_round_trip_and_bad_ones() {
        assert_eq!(check_handshake(&handshake()), Ok(()));
        let mut h = handshake();
        h[0] = b'X';
        assert_eq!(check_handshake(&h), Err(WireError::BadMagic));
        let mut h = handshake();
        h[8] = 9;
        assert_eq!(check_handshake(&h), Err(WireError::BadVersion(9)));
        let mut h = handshake();
        h[15] = 1;
        assert_eq!(check_handshake(&h), Err(WireError::BadReserved));
    }

    #[test]
    fn am_header_round_trip_and_bad_ones() {
        assert_eq!(decode_am_header(&am_header(5, 100), 100), Ok((5, 100)));
        assert_eq!(decode_am_header(&am_header(5, 101), 100), Err(WireError::TooLong { len: 101, max: 100 }));
        assert_eq!(decode_am_header(&am_header(uct::AM_ID_MAX, 1), 100), Err(WireError::BadAmId(uct::AM_ID_MAX)));
        let mut h = am_header(1, 1);
        h[2] = 1;
        assert_eq!(decode_am_header(&h, 100), Err(WireError::BadReserved));
    }
}
