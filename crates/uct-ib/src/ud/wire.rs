//! Wire layout of UD packets: the 8-byte network header (UCX `uct_ud_neth_t`) and the
//! connection control packets (CREQ / CREP).
//!
//! Everything is little-endian and packed by hand; nothing here reinterprets memory. Decoders
//! take bytes straight from the network and return a [`WireError`] naming what was wrong,
//! never panic, and never read past the slice.
//!
//! ## Network header (8 bytes)
//!
//! ```text
//!  byte 0..4  packet type word (u32 LE)
//!             bits  0..24  destination endpoint id (0xffffff = none: a CREQ)
//!             bit   24     AM: active message, bits 27..32 carry the AM id
//!             bit   25     ACK_REQ: the receiver should acknowledge now
//!             bit   26     ECN: congestion experienced (carried, not acted on)
//!             bit   27     NAK  \
//!             bit   28     PUT   | only when AM is clear (these bits are the AM id otherwise)
//!             bit   29     CTL   |
//!             bits 30..32  zero /
//!  byte 4..6  psn      (u16 LE) sequence number of this packet
//!  byte 6..8  ack_psn  (u16 LE) last sequence number the sender received in order
//! ```
//!
//! A packet with neither AM, PUT nor CTL is a pure acknowledgement: exactly 8 bytes, it does
//! not consume a sequence number, and it may carry NAK (the receiver saw a gap after
//! `ack_psn`).

use std::fmt;

use ucs::fraglist::Sn16;
use ucs::Status;

/// Size of the network header.
pub const NETH_LEN: usize = 8;

/// The "no endpoint" id: destination of a CREQ, which the receiving interface routes by the
/// requester's address instead (UCX `UCT_UD_EP_NULL_ID`).
pub const EP_NULL_ID: u32 = (1 << 24) - 1;

/// Largest active-message id (ids are 5 bits on the wire).
pub const AM_ID_MAX: u8 = 31;

/// Largest device address a CREQ carries. InfiniBand and RoCE addresses (GID, LID, flags,
/// pkey) stay well below it; the fixed bound keeps [`DevAddr`] inline and `Copy`.
pub const MAX_DEV_ADDR_LEN: usize = 32;

/// Control packet type of a connection request.
pub const CTL_CREQ: u8 = 1;
/// Control packet type of a connection reply.
pub const CTL_CREP: u8 = 2;

/// Length of a CREQ body without its device address.
pub const CREQ_FIXED_LEN: usize = 16;
/// Length of a CREP body.
pub const CREP_LEN: usize = 8;

const DEST_ID_MASK: u32 = EP_NULL_ID;
const FLAG_AM: u32 = 1 << 24;
const FLAG_ACK_REQ: u32 = 1 << 25;
const FLAG_ECN: u32 = 1 << 26;
const FLAG_NAK: u32 = 1 << 27;
const FLAG_PUT: u32 = 1 << 28;
const FLAG_CTL: u32 = 1 << 29;
const RESERVED_NON_AM: u32 = 0b11 << 30;
const AM_ID_SHIFT: u32 = 27;

/// Why bytes could not be decoded or encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The input is shorter than the structure being read.
    Truncated {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// Bytes follow a structure that has a fixed length.
    TrailingBytes {
        /// Bytes the structure occupies.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// Bits that must be zero are set.
    ReservedBits,
    /// More than one of NAK / PUT / CTL is set, or NAK on a packet that is not a pure ack.
    ConflictingFlags,
    /// A control packet type other than CREQ or CREP.
    UnknownCtlType(u8),
    /// An endpoint id that does not fit in 24 bits, or the null id where a real one is needed.
    BadEpId(u32),
    /// An active-message id above [`AM_ID_MAX`].
    BadAmId(u8),
    /// A device address longer than [`MAX_DEV_ADDR_LEN`].
    DevAddrTooLong(usize),
    /// A CREQ not addressed to [`EP_NULL_ID`], or another packet addressed to it.
    Misaddressed,
    /// The output buffer cannot hold what is being encoded.
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { needed, got } => write!(f, "truncated: need {needed} bytes, got {got}"),
            WireError::TrailingBytes { expected, got } => {
                write!(f, "trailing bytes: expected {expected} bytes, got {got}")
            }
            WireError::ReservedBits => f.write_str("reserved header bits set"),
            WireError::ConflictingFlags => f.write_str("conflicting packet flags"),
            WireError::UnknownCtlType(t) => write!(f, "unknown control packet type {t}"),
            WireError::BadEpId(id) => write!(f, "invalid endpoint id {id:#x}"),
            WireError::BadAmId(id) => write!(f, "invalid active message id {id}"),
            WireError::DevAddrTooLong(n) => write!(f, "device address of {n} bytes (max {MAX_DEV_ADDR_LEN})"),
            WireError::Misaddressed => f.write_str("packet destination does not match its type"),
            WireError::BufferTooSmall { needed, got } => write!(f, "buffer too small: need {needed}, got {got}"),
        }
    }
}

impl std::error::Error for WireError {}

impl From<WireError> for Status {
    fn from(e: WireError) -> Status {
        match e {
            WireError::BufferTooSmall { .. } => Status::BufferTooSmall,
            _ => Status::InvalidParam,
        }
    }
}

/// What a packet carries, from the packet type word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// Active message with the given id (0..=31); consumes a sequence number.
    Am(u8),
    /// Put emulation (payload starts with the remote address); consumes a sequence number.
    Put,
    /// Control packet (CREQ / CREP follows the header); consumes a sequence number.
    Ctl,
    /// Pure acknowledgement, no payload, no sequence number of its own. `nak` says the
    /// receiver saw a gap after `ack_psn` and wants the rest resent now.
    Ack {
        /// Negative acknowledgement flag.
        nak: bool,
    },
}

impl PacketKind {
    /// Does this packet take a place in the sequence (everything but pure acks)?
    #[inline]
    pub const fn is_sequenced(self) -> bool {
        !matches!(self, PacketKind::Ack { .. })
    }
}

/// The decoded network header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neth {
    /// Receiving endpoint id (24 bits), [`EP_NULL_ID`] for a CREQ.
    pub dest_ep_id: u32,
    /// Packet kind and its kind-specific bits.
    pub kind: PacketKind,
    /// Acknowledgement requested.
    pub ack_req: bool,
    /// Explicit congestion notification.
    pub ecn: bool,
    /// This packet's sequence number (for pure acks: the sender's next one, informational).
    pub psn: Sn16,
    /// Last sequence number the sender of this packet received in order.
    pub ack_psn: Sn16,
}

#[inline]
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn get_u24(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], 0])
}

#[inline]
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn put_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_le_bytes()[..3]);
}

fn check_len(needed: usize, got: usize) -> Result<(), WireError> {
    if got < needed {
        Err(WireError::Truncated { needed, got })
    } else {
        Ok(())
    }
}

fn check_out(needed: usize, got: usize) -> Result<(), WireError> {
    if got < needed {
        Err(WireError::BufferTooSmall { needed, got })
    } else {
        Ok(())
    }
}

impl Neth {
    /// The packet type word, after checking every field fits its bits.
    pub fn packet_type(&self) -> Result<u32, WireError> {
        if self.dest_ep_id > DEST_ID_MASK {
            return Err(WireError::BadEpId(self.dest_ep_id));
        }
        let mut w = self.dest_ep_id;
        if self.ack_req {
            w |= FLAG_ACK_REQ;
        }
        if self.ecn {
            w |= FLAG_ECN;
        }
        w |= match self.kind {
            PacketKind::Am(id) if id > AM_ID_MAX => return Err(WireError::BadAmId(id)),
            PacketKind::Am(id) => FLAG_AM | (u32::from(id) << AM_ID_SHIFT),
            PacketKind::Put => FLAG_PUT,
            PacketKind::Ctl => FLAG_CTL,
            PacketKind::Ack { nak: true } => FLAG_NAK,
            PacketKind::Ack { nak: false } => 0,
        };
        Ok(w)
    }

    /// Writes the header into the first [`NETH_LEN`] bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_out(NETH_LEN, out.len())?;
        let w = self.packet_type()?;
        out[0..4].copy_from_slice(&w.to_le_bytes());
        out[4..6].copy_from_slice(&self.psn.0.to_le_bytes());
        out[6..8].copy_from_slice(&self.ack_psn.0.to_le_bytes());
        Ok(())
    }

    /// The header as bytes.
    pub fn to_bytes(&self) -> Result<[u8; NETH_LEN], WireError> {
        let mut b = [0; NETH_LEN];
        self.encode(&mut b)?;
        Ok(b)
    }

    /// Reads a header from the first [`NETH_LEN`] bytes of `bytes` (the rest is not looked at).
    pub fn decode(bytes: &[u8]) -> Result<Neth, WireError> {
        check_len(NETH_LEN, bytes.len())?;
        let w = get_u32(bytes, 0);
        let kind = if w & FLAG_AM != 0 {
            PacketKind::Am((w >> AM_ID_SHIFT) as u8)
        } else {
            if w & RESERVED_NON_AM != 0 {
                return Err(WireError::ReservedBits);
            }
            match (w & FLAG_NAK != 0, w & FLAG_PUT != 0, w & FLAG_CTL != 0) {
                (false, false, false) => PacketKind::Ack { nak: false },
                (true, false, false) => PacketKind::Ack { nak: true },
                (false, true, false) => PacketKind::Put,
                (false, false, true) => PacketKind::Ctl,
                _ => return Err(WireError::ConflictingFlags),
            }
        };
        Ok(Neth {
            dest_ep_id: w & DEST_ID_MASK,
            kind,
            ack_req: w & FLAG_ACK_REQ != 0,
            ecn: w & FLAG_ECN != 0,
            psn: Sn16(get_u16(bytes, 4)),
            ack_psn: Sn16(get_u16(bytes, 6)),
        })
    }
}

/// Rewrites `ack_psn` of an encoded header in place (resends carry fresh acknowledgements).
pub(crate) fn patch_ack_psn(packet: &mut [u8], ack_psn: Sn16) {
    if let Some(b) = packet.get_mut(6..8) {
        b.copy_from_slice(&ack_psn.0.to_le_bytes());
    }
}

/// Sets or clears ACK_REQ of an encoded header in place.
pub(crate) fn patch_ack_req(packet: &mut [u8], ack_req: bool) {
    if let Some(b) = packet.get_mut(0..4) {
        let mut w = get_u32(b, 0);
        if ack_req {
            w |= FLAG_ACK_REQ;
        } else {
            w &= !FLAG_ACK_REQ;
        }
        b.copy_from_slice(&w.to_le_bytes());
    }
}

/// A device address (the InfiniBand / RoCE address of an interface), stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevAddr {
    len: u8,
    bytes: [u8; MAX_DEV_ADDR_LEN],
}

impl DevAddr {
    /// Copies `bytes`; fails when longer than [`MAX_DEV_ADDR_LEN`].
    pub fn new(bytes: &[u8]) -> Result<DevAddr, WireError> {
        if bytes.len() > MAX_DEV_ADDR_LEN {
            return Err(WireError::DevAddrTooLong(bytes.len()));
        }
        let mut a = DevAddr { len: bytes.len() as u8, bytes: [0; MAX_DEV_ADDR_LEN] };
        a.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(a)
    }

    /// The address bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Debug for DevAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DevAddr(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        f.write_str(")")
    }
}

/// Address of a remote interface: its device address plus its UD queue pair number. This is
/// what identifies a peer for connection matching (UCX's unpacked peer address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    /// Device address (GID / LID and flags).
    pub dev_addr: DevAddr,
    /// Queue pair number (24 bits).
    pub qp_num: u32,
}

/// Address of an endpoint: its interface's queue pair number and its endpoint id, both 24 bits
/// (UCX `uct_ud_ep_addr_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EpAddr {
    /// Queue pair number of the endpoint's interface.
    pub qp_num: u32,
    /// Endpoint id inside that interface.
    pub ep_id: u32,
}

/// Connection request: who is asking, and which of its connections to this peer this is.
///
/// Layout after the network header (16 bytes + device address):
/// `type u8 = 1 | 3 reserved zero bytes | qp_num u24 | ep_id u24 | conn_sn u32 | path_index u8 |
/// dev_addr_len u8 | dev_addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Creq {
    /// The requesting endpoint.
    pub ep_addr: EpAddr,
    /// Connection sequence number: the requester's n-th connection to this peer. Both sides
    /// number their connections to each other the same way, which is what pairs them.
    pub conn_sn: u32,
    /// Path index (multi-path / LAG port selection).
    pub path_index: u8,
    /// The requester's device address; with `ep_addr.qp_num` it forms the requester's
    /// [`PeerAddr`].
    pub dev_addr: DevAddr,
}

impl Creq {
    /// The requester's interface address.
    pub fn peer(&self) -> PeerAddr {
        PeerAddr { dev_addr: self.dev_addr, qp_num: self.ep_addr.qp_num }
    }
}

/// Connection reply: the replying endpoint's id.
///
/// Layout after the network header (8 bytes): `type u8 = 2 | 3 reserved zero bytes |
/// src_ep_id u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crep {
    /// The replying endpoint's id.
    pub src_ep_id: u32,
}

/// A control packet body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtlPacket {
    /// Connection request.
    Creq(Creq),
    /// Connection reply.
    Crep(Crep),
}

fn check_ep_id(id: u32) -> Result<(), WireError> {
    if id >= EP_NULL_ID {
        Err(WireError::BadEpId(id))
    } else {
        Ok(())
    }
}

fn check_qp_num(qp: u32) -> Result<(), WireError> {
    if qp > DEST_ID_MASK {
        Err(WireError::BadEpId(qp))
    } else {
        Ok(())
    }
}

impl CtlPacket {
    /// Bytes the body occupies.
    pub fn encoded_len(&self) -> usize {
        match self {
            CtlPacket::Creq(c) => CREQ_FIXED_LEN + c.dev_addr.as_bytes().len(),
            CtlPacket::Crep(_) => CREP_LEN,
        }
    }

    /// Writes the body at the start of `out`, returning its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let len = self.encoded_len();
        check_out(len, out.len())?;
        match self {
            CtlPacket::Creq(c) => {
                check_qp_num(c.ep_addr.qp_num)?;
                check_ep_id(c.ep_addr.ep_id)?;
                let addr = c.dev_addr.as_bytes();
                out[0] = CTL_CREQ;
                out[1..4].fill(0);
                put_u24(out, 4, c.ep_addr.qp_num);
                put_u24(out, 7, c.ep_addr.ep_id);
                out[10..14].copy_from_slice(&c.conn_sn.to_le_bytes());
                out[14] = c.path_index;
                out[15] = addr.len() as u8;
                out[CREQ_FIXED_LEN..len].copy_from_slice(addr);
            }
            CtlPacket::Crep(c) => {
                check_ep_id(c.src_ep_id)?;
                out[0] = CTL_CREP;
                out[1..4].fill(0);
                out[4..8].copy_from_slice(&c.src_ep_id.to_le_bytes());
            }
        }
        Ok(len)
    }

    /// Reads a body that must fill `bytes` exactly.
    pub fn decode(bytes: &[u8]) -> Result<CtlPacket, WireError> {
        check_len(4, bytes.len())?;
        if bytes[1..4] != [0, 0, 0] {
            return Err(WireError::ReservedBits);
        }
        let exact = |expected: usize| {
            check_len(expected, bytes.len())?;
            if bytes.len() > expected {
                return Err(WireError::TrailingBytes { expected, got: bytes.len() });
            }
            Ok(())
        };
        match bytes[0] {
            CTL_CREQ => {
                check_len(CREQ_FIXED_LEN, bytes.len())?;
                let addr_len = usize::from(bytes[15]);
                if addr_len > MAX_DEV_ADDR_LEN {
                    return Err(WireError::DevAddrTooLong(addr_len));
                }
                exact(CREQ_FIXED_LEN + addr_len)?;
                let ep_id = get_u24(bytes, 7);
                check_ep_id(ep_id)?;
                Ok(CtlPacket::Creq(Creq {
                    ep_addr: EpAddr { qp_num: get_u24(bytes, 4), ep_id },
                    conn_sn: get_u32(bytes, 10),
                    path_index: bytes[14],
                    dev_addr: DevAddr::new(&bytes[CREQ_FIXED_LEN..])?,
                }))
            }
            CTL_CREP => {
                exact(CREP_LEN)?;
                let src_ep_id = get_u32(bytes, 4);
                check_ep_id(src_ep_id)?;
                Ok(CtlPacket::Crep(Crep { src_ep_id }))
            }
            t => Err(WireError::UnknownCtlType(t)),
        }
    }
}

/// A whole decoded packet: header, plus the control body or the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Active message or put: header and payload (everything after the header).
    Data {
        /// Header.
        neth: Neth,
        /// Payload bytes.
        payload: &'a [u8],
    },
    /// Control packet.
    Ctl {
        /// Header.
        neth: Neth,
        /// Body.
        ctl: CtlPacket,
    },
    /// Pure acknowledgement (header only).
    Ack(Neth),
}

impl<'a> Packet<'a> {
    /// Decodes and cross-checks a whole packet: pure acks are exactly a header, control
    /// packets hold exactly one body, a CREQ (and only a CREQ) goes to [`EP_NULL_ID`].
    pub fn decode(bytes: &'a [u8]) -> Result<Packet<'a>, WireError> {
        let neth = Neth::decode(bytes)?;
        let rest = &bytes[NETH_LEN..];
        let to_null = neth.dest_ep_id == EP_NULL_ID;
        match neth.kind {
            PacketKind::Ack { .. } => {
                if !rest.is_empty() {
                    return Err(WireError::TrailingBytes { expected: NETH_LEN, got: bytes.len() });
                }
                if to_null {
                    return Err(WireError::Misaddressed);
                }
                Ok(Packet::Ack(neth))
            }
            PacketKind::Ctl => {
                let ctl = CtlPacket::decode(rest)?;
                if to_null != matches!(ctl, CtlPacket::Creq(_)) {
                    return Err(WireError::Misaddressed);
                }
                Ok(Packet::Ctl { neth, ctl })
            }
            PacketKind::Am(_) | PacketKind::Put => {
                if to_null {
                    return Err(WireError::Misaddressed);
                }
                Ok(Packet::Data { neth, payload: rest })
            }
        }
    }

    /// The header.
    pub fn neth(&self) -> &Neth {
        match self {
            Packet::Data { neth, .. } | Packet::Ctl { neth, .. } | Packet::Ack(neth) => neth,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn neth(kind: PacketKind) -> Neth {
        Neth { dest_ep_id: 0x12_3456, kind, ack_req: true, ecn: false, psn: Sn16(0xbeef), ack_psn: Sn16(7) }
    }

    #[test]
    fn header_layout_is_ucx_layout() {
        let b = neth(PacketKind::Am(5)).to_bytes().unwrap();
        // dest | AM | ACK_REQ | am_id << 27, then psn, then ack_psn.
        let w: u32 = 0x12_3456 | (1 << 24) | (1 << 25) | (5 << 27);
        assert_eq!(&b[0..4], &w.to_le_bytes());
        assert_eq!(&b[4..6], &0xbeefu16.to_le_bytes());
        assert_eq!(&b[6..8], &7u16.to_le_bytes());
        let ack = Neth { ack_req: false, ..neth(PacketKind::Ack { nak: true }) }.to_bytes().unwrap();
        assert_eq!(u32::from_le_bytes(ack[0..4].try_into().unwrap()), 0x12_3456 | (1 << 27));
        let ctl = neth(PacketKind::Ctl).packet_type().unwrap();
        assert_eq!(ctl, 0x12_3456 | (1 << 25) | (1 << 29));
    }

    #[test]
    fn header_errors() {
        assert_eq!(Neth::decode(&[0; 7]), Err(WireError::Truncated { needed: 8, got: 7 }));
        let mut b = neth(PacketKind::Put).to_bytes().unwrap();
        b[3] |= 0x80;
        assert_eq!(Neth::decode(&b), Err(WireError::ReservedBits));
        let w: u32 = 5 | FLAG_PUT | FLAG_CTL;
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&w.to_le_bytes());
        assert_eq!(Neth::decode(&b), Err(WireError::ConflictingFlags));
        assert_eq!(neth(PacketKind::Am(32)).to_bytes(), Err(WireError::BadAmId(32)));
        let big = Neth { dest_ep_id: 1 << 24, ..neth(PacketKind::Put) };
        assert_eq!(big.to_bytes(), Err(WireError::BadEpId(1 << 24)));
        assert_eq!(neth(PacketKind::Put).encode(&mut [0; 4]), Err(WireError::BufferTooSmall { needed: 8, got: 4 }));
        assert_eq!(Status::from(WireError::ReservedBits), Status::InvalidParam);
        assert!(WireError::Truncated { needed: 8, got: 1 }.to_string().contains("need 8"));
    }

    #[test]
    fn patches_touch_only_their_field() {
        let mut b = neth(PacketKind::Am(3)).to_bytes().unwrap();
        patch_ack_psn(&mut b, Sn16(999));
        patch_ack_req(&mut b, false);
        let n = Neth::decode(&b).unwrap();
        assert_eq!(n, Neth { ack_psn: Sn16(999), ack_req: false, ..neth(PacketKind::Am(3)) });
        patch_ack_req(&mut b, true);
        assert!(Neth::decode(&b).unwrap().ack_req);
        patch_ack_psn(&mut [0u8; 3], Sn16(1));
        patch_ack_req(&mut [0u8; 3], true);
    }

    #[test]
    fn ctl_packets() {
        let creq = CtlPacket::Creq(Creq {
            ep_addr: EpAddr { qp_num: 0xab_cdef, ep_id: 17 },
            conn_sn: 3,
            path_index: 1,
            dev_addr: DevAddr::new(&[1, 2, 3, 4, 5]).unwrap(),
        });
        let mut buf = [0u8; 64];
        let n = creq.encode(&mut buf).unwrap();
        assert_eq!(n, CREQ_FIXED_LEN + 5);
        assert_eq!(CtlPacket::decode(&buf[..n]), Ok(creq));
        assert_eq!(CtlPacket::decode(&buf[..n + 1]), Err(WireError::TrailingBytes { expected: n, got: n + 1 }));
        assert_eq!(CtlPacket::decode(&buf[..n - 1]), Err(WireError::Truncated { needed: n, got: n - 1 }));
        assert_eq!(creq.encode(&mut buf[..n - 1]), Err(WireError::BufferTooSmall { needed: n, got: n - 1 }));
        let mut long = buf;
        long[15] = 200;
        assert_eq!(CtlPacket::decode(&long[..n]), Err(WireError::DevAddrTooLong(200)));
        let crep = CtlPacket::Crep(Crep { src_ep_id: 42 });
        let n = crep.encode(&mut buf).unwrap();
        assert_eq!(CtlPacket::decode(&buf[..n]), Ok(crep));
        buf[2] = 1;
        assert_eq!(CtlPacket::decode(&buf[..n]), Err(WireError::ReservedBits));
        assert_eq!(CtlPacket::decode(&[9, 0, 0, 0]), Err(WireError::UnknownCtlType(9)));
        assert_eq!(
            CtlPacket::Crep(Crep { src_ep_id: EP_NULL_ID }).encode(&mut buf),
            Err(WireError::BadEpId(EP_NULL_ID))
        );
        assert!(DevAddr::new(&[0; 33]).is_err());
        assert_eq!(format!("{:?}", DevAddr::new(&[0xa, 0xb]).unwrap()), "DevAddr(0a0b)");
    }

    #[test]
    fn packet_cross_checks() {
        let mut buf = [0u8; 64];
        let creq_neth = Neth { dest_ep_id: EP_NULL_ID, ..neth(PacketKind::Ctl) };
        creq_neth.encode(&mut buf).unwrap();
        let body = CtlPacket::Creq(Creq {
            ep_addr: EpAddr { qp_num: 1, ep_id: 2 },
            conn_sn: 0,
            path_index: 0,
            dev_addr: DevAddr::new(&[]).unwrap(),
        });
        let n = NETH_LEN + body.encode(&mut buf[NETH_LEN..]).unwrap();
        assert!(matches!(Packet::decode(&buf[..n]), Ok(Packet::Ctl { ctl: CtlPacket::Creq(_), .. })));
        // The same CREQ sent to a real endpoint is misaddressed.
        neth(PacketKind::Ctl).encode(&mut buf).unwrap();
        assert_eq!(Packet::decode(&buf[..n]), Err(WireError::Misaddressed));
        // Acks are exactly a header.
        let ack = neth(PacketKind::Ack { nak: false }).to_bytes().unwrap();
        assert!(matches!(Packet::decode(&ack), Ok(Packet::Ack(_))));
        let mut long = [0u8; 9];
        long[..8].copy_from_slice(&ack);
        assert!(matches!(Packet::decode(&long), Err(WireError::TrailingBytes { .. })));
        let data = neth(PacketKind::Am(1)).to_bytes().unwrap();
        let p = Packet::decode(&data).unwrap();
        assert_eq!(p.neth().kind, PacketKind::Am(1));
        assert!(matches!(p, Packet::Data { payload: [], .. }));
    }

    fn arb_kind() -> impl Strategy<Value = PacketKind> {
        prop_oneof![
            (0..=AM_ID_MAX).prop_map(PacketKind::Am),
            Just(PacketKind::Put),
            Just(PacketKind::Ctl),
            any::<bool>().prop_map(|nak| PacketKind::Ack { nak }),
        ]
    }

    fn arb_neth() -> impl Strategy<Value = Neth> {
        (0..=EP_NULL_ID, arb_kind(), any::<bool>(), any::<bool>(), any::<u16>(), any::<u16>()).prop_map(
            |(dest_ep_id, kind, ack_req, ecn, psn, ack_psn)| Neth {
                dest_ep_id,
                kind,
                ack_req,
                ecn,
                psn: Sn16(psn),
                ack_psn: Sn16(ack_psn),
            },
        )
    }

    fn arb_ctl() -> impl Strategy<Value = CtlPacket> {
        prop_oneof![
            (0..EP_NULL_ID).prop_map(|src_ep_id| CtlPacket::Crep(Crep { src_ep_id })),
            (
                0..=EP_NULL_ID,
                0..EP_NULL_ID,
                any::<u32>(),
                any::<u8>(),
                proptest::collection::vec(any::<u8>(), 0..=MAX_DEV_ADDR_LEN)
            )
                .prop_map(|(qp_num, ep_id, conn_sn, path_index, addr)| {
                    CtlPacket::Creq(Creq {
                        ep_addr: EpAddr { qp_num, ep_id },
                        conn_sn,
                        path_index,
                        dev_addr: DevAddr::new(&addr).unwrap(),
                    })
                }),
        ]
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Neth::decode(&bytes);
            let _ = CtlPacket::decode(&bytes);
            let _ = Packet::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_near_valid(
            ctl in arb_ctl(), flips in proptest::collection::vec((0usize..64, any::<u8>()), 1..4), cut in 0usize..64
        ) {
            let mut buf = [0u8; 64];
            Neth { dest_ep_id: EP_NULL_ID, kind: PacketKind::Ctl, ack_req: false, ecn: false, psn: Sn16(1),
                ack_psn: Sn16(0) }.encode(&mut buf).unwrap();
            let n = NETH_LEN + ctl.encode(&mut buf[NETH_LEN..]).unwrap();
            for (at, x) in flips {
                buf[at % n] ^= x;
            }
            let _ = Packet::decode(&buf[..n]);
            let _ = Packet::decode(&buf[..cut.min(n)]);
        }

        #[test]
        fn neth_round_trips(n in arb_neth()) {
            let b = n.to_bytes().unwrap();
            prop_assert_eq!(Neth::decode(&b), Ok(n));
        }

        #[test]
        fn ctl_round_trips(c in arb_ctl()) {
            let mut buf = [0u8; 64];
            let len = c.encode(&mut buf).unwrap();
            prop_assert_eq!(len, c.encoded_len());
            prop_assert_eq!(CtlPacket::decode(&buf[..len]), Ok(c));
        }

        #[test]
        fn decoded_headers_reencode_identically(bytes in proptest::array::uniform8(any::<u8>())) {
            if let Ok(n) = Neth::decode(&bytes) {
                prop_assert_eq!(n.to_bytes(), Ok(bytes));
            }
        }
    }
}
