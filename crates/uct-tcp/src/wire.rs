//! What travels on a tcp connection: a handshake from the connecting side, then active
//! messages, each behind an 8-byte header, in both directions.
//!
//! * Handshake (32 bytes): the magic `UCXRSTCP`, the protocol version (u32, little-endian),
//!   then the connecting interface's address - the family (4 or 6), a zero byte, the listening
//!   port (u16, big-endian) and the IP address (16 bytes; an IPv4 address in the first four,
//!   the rest zero) - so that an endpoint of the accepting side to that interface can write to
//!   this connection. The accepting side drops a connection whose first bytes are anything
//!   else, so a port scan or a stray client costs it nothing but a log line.
//! * The accepting side answers a handshake with an [`AM_ID_ACK`] frame, and only then does
//!   the connecting side send: when both sides connected to each other at once, the side with
//!   the larger interface address answers on the other's connection and closes its own, so
//!   one connection carries both directions, in order.
//! * Active message: the id (one byte, below [`uct::AM_ID_MAX`], or [`AM_ID_KEEPALIVE`] or
//!   [`AM_ID_ACK`] with no payload, which the reader does not deliver), three zero bytes, the
//!   payload's length (u32, little-endian), the payload.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The first bytes of every connection.
pub(crate) const MAGIC: [u8; 8] = *b"UCXRSTCP";
/// The protocol version this build speaks.
pub(crate) const VERSION: u32 = 2;
/// Length of the handshake.
pub(crate) const HANDSHAKE_LEN: usize = 32;
/// Length of an active message's header.
pub(crate) const AM_HDR_LEN: usize = 8;
/// The id of a keepalive frame: no payload, nothing delivered.
pub(crate) const AM_ID_KEEPALIVE: u8 = 0xff;
/// The id of the accepting side's answer to a handshake: the connecting side may send now.
pub(crate) const AM_ID_ACK: u8 = 0xfe;

/// The handshake of a connection from the interface at `from`.
pub(crate) fn handshake(from: SocketAddr) -> [u8; HANDSHAKE_LEN] {
    let mut h = [0u8; HANDSHAKE_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[14..16].copy_from_slice(&from.port().to_be_bytes());
    match from.ip() {
        IpAddr::V4(a) => {
            h[12] = 4;
            h[16..20].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            h[12] = 6;
            h[16..32].copy_from_slice(&a.octets());
        }
    }
    h
}

/// What is wrong with bytes a peer sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WireError {
    BadMagic,
    BadVersion(u32),
    BadReserved,
    BadAddress,
    BadAmId(u8),
    TooLong { len: usize, max: usize },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic => write!(f, "the connection did not start with the ucx-rs tcp handshake"),
            WireError::BadVersion(v) => write!(f, "handshake of protocol version {v} (this build speaks {VERSION})"),
            WireError::BadReserved => write!(f, "reserved header bytes are not zero"),
            WireError::BadAddress => write!(f, "the handshake's interface address is malformed"),
            WireError::BadAmId(id) => write!(f, "active message id {id} out of range (0..{})", uct::AM_ID_MAX),
            WireError::TooLong { len, max } => write!(f, "active message of {len} bytes (at most {max})"),
        }
    }
}

/// Checks a handshake; the connecting interface's address.
pub(crate) fn check_handshake(h: &[u8; HANDSHAKE_LEN]) -> Result<SocketAddr, WireError> {
    if h[..8] != MAGIC {
        return Err(WireError::BadMagic);
    }
    let v = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if v != VERSION {
        return Err(WireError::BadVersion(v));
    }
    if h[13] != 0 {
        return Err(WireError::BadReserved);
    }
    let port = u16::from_be_bytes([h[14], h[15]]);
    let ip = match h[12] {
        4 if h[20..] == [0; 12] => IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&h[16..32]).expect("16 bytes"))),
        _ => return Err(WireError::BadAddress),
    };
    if port == 0 {
        return Err(WireError::BadAddress);
    }
    Ok(SocketAddr::new(ip, port))
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
    let keepalive = (h[0] == AM_ID_KEEPALIVE || h[0] == AM_ID_ACK) && h[4..] == [0; 4];
    if h[0] >= uct::AM_ID_MAX && !keepalive {
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
        for from in ["127.0.0.1:4242", "[fe80::1]:7"] {
            let from: SocketAddr = from.parse().unwrap();
            assert_eq!(check_handshake(&handshake(from)), Ok(from));
        }
        let ok = handshake("10.1.2.3:99".parse().unwrap());
        let mut h = ok;
        h[0] = b'X';
        assert_eq!(check_handshake(&h), Err(WireError::BadMagic));
        let mut h = ok;
        h[8] = 9;
        assert_eq!(check_handshake(&h), Err(WireError::BadVersion(9)));
        let mut h = ok;
        h[13] = 1;
        assert_eq!(check_handshake(&h), Err(WireError::BadReserved));
        let mut h = ok;
        h[12] = 5;
        assert_eq!(check_handshake(&h), Err(WireError::BadAddress));
        let mut h = ok;
        h[31] = 1;
        assert_eq!(check_handshake(&h), Err(WireError::BadAddress), "an IPv4 address with bytes after it");
        let mut h = ok;
        h[14..16].copy_from_slice(&[0, 0]);
        assert_eq!(check_handshake(&h), Err(WireError::BadAddress), "port 0");
    }

    #[test]
    fn am_header_round_trip_and_bad_ones() {
        assert_eq!(decode_am_header(&am_header(5, 100), 100), Ok((5, 100)));
        assert_eq!(decode_am_header(&am_header(5, 101), 100), Err(WireError::TooLong { len: 101, max: 100 }));
        assert_eq!(decode_am_header(&am_header(uct::AM_ID_MAX, 1), 100), Err(WireError::BadAmId(uct::AM_ID_MAX)));
        assert_eq!(decode_am_header(&am_header(AM_ID_KEEPALIVE, 0), 100), Ok((AM_ID_KEEPALIVE, 0)));
        assert_eq!(decode_am_header(&am_header(AM_ID_KEEPALIVE, 1), 100), Err(WireError::BadAmId(AM_ID_KEEPALIVE)));
        let mut h = am_header(1, 1);
        h[2] = 1;
        assert_eq!(decode_am_header(&h, 100), Err(WireError::BadReserved));
    }
}
