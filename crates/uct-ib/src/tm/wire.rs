//! The tag-matching wire headers (rdma-core's `tm_types.h`): every tagged message starts with a
//! 16-byte TMH (opcode, three reserved bytes that must be zero, a 32-bit application context
//! and the 64-bit tag); a rendezvous request follows it with a 16-byte RVH (the sender's
//! address, key and length) and optional data for software, and the FIN that completes a
//! rendezvous repeats the request's TMH and RVH with the FIN opcode. All fields are big-endian
//! (network order), as the verbs headers declare them (`__be32`, `__be64`).
//!
//! Decoding checks everything a peer could get wrong: the length, the opcode, the reserved
//! bytes. A bad header is an error naming what was wrong, never a panic.

use std::fmt;

/// Length of a TMH.
pub const TMH_LEN: usize = 16;
/// Length of an RVH.
pub const RVH_LEN: usize = 16;

/// A TMH's opcode (`enum ibv_tmh_op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TmhOp {
    /// Not tagged: always unexpected, left whole (header included) in a shared receive queue
    /// buffer (`IBV_TMH_NO_TAG`).
    NoTag = 0,
    /// A rendezvous request: an RVH follows (`IBV_TMH_RNDV`).
    Rndv = 1,
    /// The end of a rendezvous, sent by the receiver's adapter (`IBV_TMH_FIN`).
    Fin = 2,
    /// An eager message: the payload follows (`IBV_TMH_EAGER`).
    Eager = 3,
}

impl TryFrom<u8> for TmhOp {
    type Error = TmWireError;

    fn try_from(v: u8) -> Result<Self, TmWireError> {
        Ok(match v {
            0 => TmhOp::NoTag,
            1 => TmhOp::Rndv,
            2 => TmhOp::Fin,
            3 => TmhOp::Eager,
            _ => return Err(TmWireError::UnknownOpcode(v)),
        })
    }
}

/// A tag-matching header (`struct ibv_tmh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tmh {
    /// What the message is.
    pub op: TmhOp,
    /// The application's context: for a rendezvous request, the sender's operation (returned
    /// in the FIN); for an eager message, what the sender chose.
    pub app_ctx: u32,
    /// The tag matched against the posted list.
    pub tag: u64,
}

impl Tmh {
    /// The 16 bytes on the wire.
    pub fn to_bytes(&self) -> [u8; TMH_LEN] {
        let mut b = [0u8; TMH_LEN];
        b[0] = self.op as u8;
        b[4..8].copy_from_slice(&self.app_ctx.to_be_bytes());
        b[8..16].copy_from_slice(&self.tag.to_be_bytes());
        b
    }

    /// The header at the start of `msg` and the bytes after it.
    pub fn decode(msg: &[u8]) -> Result<(Tmh, &[u8]), TmWireError> {
        let (h, rest) = split::<TMH_LEN>(msg, "TMH")?;
        let op = TmhOp::try_from(h[0])?;
        let reserved = [h[1], h[2], h[3]];
        if reserved != [0; 3] {
            return Err(TmWireError::Reserved(reserved));
        }
        let app_ctx = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let tag = u64::from_be_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
        Ok((Tmh { op, app_ctx, tag }, rest))
    }
}

/// A rendezvous header (`struct ibv_rvh`): where the sender's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rvh {
    /// The data's address in the sender.
    pub va: u64,
    /// The remote key of the sender's registration.
    pub rkey: u32,
    /// The data's length.
    pub len: u32,
}

impl Rvh {
    /// The 16 bytes on the wire.
    pub fn to_bytes(&self) -> [u8; RVH_LEN] {
        let mut b = [0u8; RVH_LEN];
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// The header at the start of `msg` and the bytes after it.
    pub fn decode(msg: &[u8]) -> Result<(Rvh, &[u8]), TmWireError> {
        let (h, rest) = split::<RVH_LEN>(msg, "RVH")?;
        let va = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
        let rkey = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        let len = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
        Ok((Rvh { va, rkey, len }, rest))
    }
}

/// A tagged message as it arrives, its headers checked: what follows the headers is borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmMsg<'a> {
    /// Not tagged (`IBV_TMH_NO_TAG`): the bytes after the opcode's TMH.
    NoTag(&'a [u8]),
    /// An eager message and its payload.
    Eager(Tmh, &'a [u8]),
    /// A rendezvous request and the data after its RVH (for software, when it is unexpected).
    Rndv(Tmh, Rvh, &'a [u8]),
    /// The end of a rendezvous: the request's headers with the FIN opcode.
    Fin(Tmh, Rvh),
}

impl<'a> TmMsg<'a> {
    /// Decodes a message that starts with a TMH. A FIN carries nothing after its RVH.
    pub fn decode(msg: &'a [u8]) -> Result<TmMsg<'a>, TmWireError> {
        let (tmh, rest) = Tmh::decode(msg)?;
        Ok(match tmh.op {
            TmhOp::NoTag => TmMsg::NoTag(rest),
            TmhOp::Eager => TmMsg::Eager(tmh, rest),
            TmhOp::Rndv => {
                let (rvh, meta) = Rvh::decode(rest)?;
                TmMsg::Rndv(tmh, rvh, meta)
            }
            TmhOp::Fin => {
                let (rvh, extra) = Rvh::decode(rest)?;
                if !extra.is_empty() {
                    return Err(TmWireError::Trailing { what: "FIN", extra: extra.len() });
                }
                TmMsg::Fin(tmh, rvh)
            }
        })
    }
}

/// What was wrong with a tag-matching header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmWireError {
    /// The message ends inside header `what`.
    Short {
        /// The header.
        what: &'static str,
        /// Its length.
        need: usize,
        /// The bytes there were.
        got: usize,
    },
    /// The TMH's opcode is none of the four.
    UnknownOpcode(u8),
    /// The TMH's reserved bytes are not zero.
    Reserved([u8; 3]),
    /// A message that ends with its headers carries more bytes.
    Trailing {
        /// The message.
        what: &'static str,
        /// How many bytes follow.
        extra: usize,
    },
}

impl fmt::Display for TmWireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TmWireError::Short { what, need, got } => {
                write!(f, "tag-matching message too short: {what} needs {need} bytes, {got} there")
            }
            TmWireError::UnknownOpcode(op) => write!(f, "tag-matching header with unknown opcode {op}"),
            TmWireError::Reserved(r) => write!(f, "tag-matching header with non-zero reserved bytes {r:02x?}"),
            TmWireError::Trailing { what, extra } => write!(f, "tag-matching {what} followed by {extra} bytes"),
        }
    }
}

impl std::error::Error for TmWireError {}

/// The first `N` bytes of `msg` and the rest, or the error for header `what`.
fn split<'a, const N: usize>(msg: &'a [u8], what: &'static str) -> Result<(&'a [u8; N], &'a [u8]), TmWireError> {
    match msg.split_first_chunk::<N>() {
        Some((h, rest)) => Ok((h, rest)),
        None => Err(TmWireError::Short { what, need: N, got: msg.len() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_the_verbs_one() {
        // The offsets rdma-core's own tag-matching test writes by hand: opcode at 0, tag at 8
        // (big-endian), the RVH's address at 16, key at 24 and length at 28.
        let tmh = Tmh { op: TmhOp::Rndv, app_ctx: 0x0102_0304, tag: 0x1122_3344_5566_7788 };
        let rvh = Rvh { va: 0xa1a2_a3a4_a5a6_a7a8, rkey: 0xb1b2_b3b4, len: 0xc1c2_c3c4 };
        let mut msg = tmh.to_bytes().to_vec();
        msg.extend_from_slice(&rvh.to_bytes());
        assert_eq!(msg[0], 1);
        assert_eq!(&msg[1..4], &[0, 0, 0]);
        assert_eq!(&msg[4..8], &[1, 2, 3, 4]);
        assert_eq!(&msg[8..16], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(&msg[16..24], &[0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8]);
        assert_eq!(&msg[24..28], &[0xb1, 0xb2, 0xb3, 0xb4]);
        assert_eq!(&msg[28..32], &[0xc1, 0xc2, 0xc3, 0xc4]);
        msg.extend_from_slice(b"meta");
        assert_eq!(TmMsg::decode(&msg), Ok(TmMsg::Rndv(tmh, rvh, b"meta")));
    }

    #[test]
    fn opcodes_are_the_verbs_ones() {
        for (op, v) in [(TmhOp::NoTag, 0), (TmhOp::Rndv, 1), (TmhOp::Fin, 2), (TmhOp::Eager, 3)] {
            assert_eq!(op as u8, v);
            assert_eq!(TmhOp::try_from(v), Ok(op));
        }
        assert_eq!(TmhOp::try_from(4), Err(TmWireError::UnknownOpcode(4)));
    }

    #[test]
    fn bad_headers_are_errors_that_say_what() {
        let eager = Tmh { op: TmhOp::Eager, app_ctx: 7, tag: 9 }.to_bytes();
        assert_eq!(Tmh::decode(&eager[..15]), Err(TmWireError::Short { what: "TMH", need: 16, got: 15 }));
        assert_eq!(TmMsg::decode(&[]), Err(TmWireError::Short { what: "TMH", need: 16, got: 0 }));
        let mut bad = eager;
        bad[0] = 9;
        assert_eq!(TmMsg::decode(&bad), Err(TmWireError::UnknownOpcode(9)));
        let mut bad = eager;
        bad[2] = 0x80;
        assert_eq!(TmMsg::decode(&bad), Err(TmWireError::Reserved([0, 0x80, 0])));
        // A rendezvous request or FIN without its whole RVH.
        let mut rndv = Tmh { op: TmhOp::Rndv, app_ctx: 0, tag: 0 }.to_bytes().to_vec();
        rndv.extend_from_slice(&[0; 10]);
        assert_eq!(TmMsg::decode(&rndv), Err(TmWireError::Short { what: "RVH", need: 16, got: 10 }));
        // A FIN with bytes after its RVH.
        let mut fin = Tmh { op: TmhOp::Fin, app_ctx: 0, tag: 0 }.to_bytes().to_vec();
        fin.extend_from_slice(&[0; 17]);
        assert_eq!(TmMsg::decode(&fin), Err(TmWireError::Trailing { what: "FIN", extra: 1 }));
        assert_eq!(
            TmWireError::Reserved([0, 0x80, 0]).to_string(),
            "tag-matching header with non-zero reserved bytes [00, 80, 00]"
        );
    }

    #[test]
    fn no_tag_and_eager_carry_the_rest() {
        let mut m = Tmh { op: TmhOp::NoTag, app_ctx: 0, tag: 0 }.to_bytes().to_vec();
        m.extend_from_slice(b"am");
        assert_eq!(TmMsg::decode(&m), Ok(TmMsg::NoTag(b"am")));
        let tmh = Tmh { op: TmhOp::Eager, app_ctx: 5, tag: u64::MAX };
        let m = tmh.to_bytes();
        assert_eq!(TmMsg::decode(&m), Ok(TmMsg::Eager(tmh, &[])));
    }

    proptest! {
        /// Headers survive the round trip, and no input makes the decoder panic.
        #[test]
        fn round_trip_and_any_bytes(op in 0u8..4, app_ctx: u32, tag: u64, va: u64, rkey: u32, len: u32,
                                    tail in proptest::collection::vec(any::<u8>(), 0..40),
                                    junk in proptest::collection::vec(any::<u8>(), 0..64)) {
            let tmh = Tmh { op: TmhOp::try_from(op).unwrap(), app_ctx, tag };
            let b = tmh.to_bytes();
            prop_assert_eq!(Tmh::decode(&b), Ok((tmh, &[][..])));
            let rvh = Rvh { va, rkey, len };
            let b = rvh.to_bytes();
            prop_assert_eq!(Rvh::decode(&b), Ok((rvh, &[][..])));
            let mut m = tmh.to_bytes().to_vec();
            if matches!(tmh.op, TmhOp::Rndv | TmhOp::Fin) {
                m.extend_from_slice(&rvh.to_bytes());
            }
            if tmh.op != TmhOp::Fin {
                m.extend_from_slice(&tail);
            }
            let expect = match tmh.op {
                TmhOp::NoTag => TmMsg::NoTag(&tail),
                TmhOp::Eager => TmMsg::Eager(tmh, &tail),
                TmhOp::Rndv => TmMsg::Rndv(tmh, rvh, &tail),
                TmhOp::Fin => TmMsg::Fin(tmh, rvh),
            };
            prop_assert_eq!(TmMsg::decode(&m), Ok(expect));
            let _ = TmMsg::decode(&junk);
        }
    }
}
