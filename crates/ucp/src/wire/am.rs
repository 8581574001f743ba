//! Active-message headers (`ucp_am_send_nbx`): a whole message, the first fragment of a
//! multi-fragment one, and the later fragments.
//!
//! Every one starts with the same 8 bytes, UCX's `ucp_am_hdr_t` in our order: the user's
//! 16-bit id, flags, a zero byte and the length of the user header (32 bits). A whole message
//! without a user header or reply endpoint is exactly those 8 bytes and the data, so it goes
//! as one `am_short` with the 8 bytes as the transport header ([`AmWord::word`]). The user
//! header follows the fixed fields and precedes the data.
//!
//! A rendezvous active message sends an RTS ([`AmRtsHdr`]): the fields of a tagged RTS with the
//! 8 fixed bytes in the tag's place, then the user header; the data follows the rendezvous
//! protocol of tagged messages (get, put or fragments, then ATS or ATP).

use super::{len, Header, Reader, WireError, Writer};
use super::{EagerMiddleHdr, RtsHdr, AM_AM_FIRST, AM_AM_MIDDLE, AM_AM_ONLY, AM_AM_RTS};

/// Flag: the sender asks for a reply endpoint (`UCP_AM_SEND_FLAG_REPLY`); the message names
/// the receiver's endpoint to the sender.
pub const AM_FLAG_REPLY: u8 = 1;

/// Every flag bit this version defines.
const AM_FLAGS: u8 = AM_FLAG_REPLY;

/// The fields every active-message header starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmWord {
    /// The user's active-message id.
    pub id: u16,
    /// `AM_FLAG_*`.
    pub flags: u8,
    /// Length of the user header after the fixed fields.
    pub hdr_len: u32,
}

impl AmWord {
    /// The 8 bytes as a little-endian word (an `am_short` header).
    #[inline(always)]
    pub fn word(&self) -> u64 {
        self.id as u64 | (self.flags as u64) << 16 | (self.hdr_len as u64) << 32
    }

    /// Whether the sender asked for a reply endpoint.
    #[inline]
    pub fn reply(&self) -> bool {
        self.flags & AM_FLAG_REPLY != 0
    }

    #[inline]
    fn read(r: &mut Reader<'_>, what: &'static str) -> Result<AmWord, WireError> {
        Self::from_word(r.u64()?, what)
    }

    /// The fields of an 8-byte word (see [`AmWord::word`]), checked.
    #[inline]
    pub fn from_word(w: u64, what: &'static str) -> Result<AmWord, WireError> {
        let flags = (w >> 16) as u8;
        if flags & !AM_FLAGS != 0 {
            return Err(WireError::UnknownFlags { what, flags });
        }
        if (w >> 24) as u8 != 0 {
            return Err(WireError::OutOfRange { what, field: "reserved byte", value: (w >> 24) & 0xff });
        }
        Ok(AmWord { id: w as u16, flags, hdr_len: (w >> 32) as u32 })
    }
}

/// A whole active message: the fixed fields, the reply endpoint when asked for, then (not part
/// of this type) the user header and the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmHdr {
    /// Id, flags, user header length.
    pub w: AmWord,
    /// With [`AM_FLAG_REPLY`]: the receiver's endpoint to the sender.
    pub ep: u64,
}

impl AmHdr {
    /// The header, the user header and the data after them.
    #[inline]
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8], &[u8]), WireError> {
        let what = "active message";
        let mut r = Reader::new(what, data);
        let w = AmWord::read(&mut r, what)?;
        let ep = if w.reply() { r.u64()? } else { 0 };
        let user = r.bytes(w.hdr_len as usize)?;
        Ok((AmHdr { w, ep }, user, r.rest()))
    }

    /// Length of the fixed part (without the user header).
    #[inline]
    pub fn fixed_len(&self) -> usize {
        len::AM_ONLY + if self.w.reply() { 8 } else { 0 }
    }
}

impl Header for AmHdr {
    fn am_id(&self) -> u8 {
        AM_AM_ONLY
    }
    /// The fixed part only: the user header is written after it by the sender.
    fn encoded_len(&self) -> usize {
        self.fixed_len()
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, self.fixed_len())?;
        w.u64(self.w.word());
        if self.w.reply() {
            w.u64(self.ep);
        }
        Ok(w.done())
    }
}

/// The first fragment of a multi-fragment active message: the fixed fields, the receiver's
/// endpoint to the sender (always: with the message id it names the message; with
/// [`AM_FLAG_REPLY`] it is also the reply endpoint), the message id and the data's total
/// length; then the user header and the first piece of the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmFirstHdr {
    /// Id, flags, user header length.
    pub w: AmWord,
    /// The receiver's endpoint to the sender.
    pub ep: u64,
    /// The id the later fragments carry (unique per sender).
    pub msg_id: u64,
    /// Length of the whole data (without the user header).
    pub total: usize,
}

impl AmFirstHdr {
    /// The header, the user header and the piece of data after them. The piece may not be
    /// longer than the data it starts.
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8], &[u8]), WireError> {
        let what = "active message first";
        let mut r = Reader::new(what, data);
        let w = AmWord::read(&mut r, what)?;
        let (ep, msg_id, total) = (r.u64()?, r.u64()?, r.u64()?);
        let user = r.bytes(w.hdr_len as usize)?;
        let payload = r.rest();
        let total = usize::try_from(total).ok().filter(|&t| t >= payload.len()).ok_or(WireError::OutOfRange {
            what,
            field: "total length",
            value: total,
        })?;
        Ok((AmFirstHdr { w, ep, msg_id, total }, user, payload))
    }
}

impl Header for AmFirstHdr {
    fn am_id(&self) -> u8 {
        AM_AM_FIRST
    }
    /// The fixed part only (as [`AmHdr`]).
    fn encoded_len(&self) -> usize {
        len::AM_FIRST
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, len::AM_FIRST)?;
        w.u64(self.w.word());
        w.u64(self.ep);
        w.u64(self.msg_id);
        w.u64(self.total as u64);
        Ok(w.done())
    }
}

/// The RTS of a rendezvous active message: an RTS whose tag is the active message's 8 fixed
/// bytes, then (not part of this type) the user header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmRtsHdr {
    /// Id, flags, user header length.
    pub w: AmWord,
    /// The rendezvous fields (`tag` holds `w`'s word; `ep` is the receiver's endpoint to the
    /// sender, the reply endpoint when the sender asked for one).
    pub rts: RtsHdr,
}

impl AmRtsHdr {
    /// The header and the user header after it (exactly its length: nothing else follows).
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let what = "active message rts";
        let (rts, rest) = RtsHdr::decode_as(data, what)?;
        let w = AmWord::from_word(rts.tag, what)?;
        let n = w.hdr_len as usize;
        if rest.len() != n {
            let at = data.len() - rest.len();
            return Err(if rest.len() < n {
                WireError::Truncated { what, needed: at + n, got: data.len() }
            } else {
                WireError::TrailingBytes { what, expected: at + n, got: data.len() }
            });
        }
        Ok((AmRtsHdr { w, rts }, rest))
    }
}

impl Header for AmRtsHdr {
    fn am_id(&self) -> u8 {
        AM_AM_RTS
    }
    /// The RTS part only (as [`AmHdr`]).
    fn encoded_len(&self) -> usize {
        self.rts.encoded_len()
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        RtsHdr { tag: self.w.word(), ..self.rts }.encode(buf)
    }
}

/// A later fragment of a multi-fragment active message: the fields of an eager middle
/// fragment ([`EagerMiddleHdr`]) under the active-message id, so the two families' messages
/// in progress never mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmMiddleHdr(pub EagerMiddleHdr);

impl AmMiddleHdr {
    /// The header and the fragment after it.
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let (h, p) = EagerMiddleHdr::decode_as(data, "active message middle")?;
        Ok((AmMiddleHdr(h), p))
    }
}

impl Header for AmMiddleHdr {
    fn am_id(&self) -> u8 {
        AM_AM_MIDDLE
    }
    fn encoded_len(&self) -> usize {
        self.0.encoded_len()
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.0.encode(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Msg;
    use proptest::prelude::*;

    fn word() -> impl Strategy<Value = AmWord> {
        (any::<u16>(), 0..=AM_FLAGS, 0u32..64).prop_map(|(id, flags, hdr_len)| AmWord { id, flags, hdr_len })
    }

    /// Encodes `h` (fixed part), then the user header and the payload.
    fn message(h: &dyn Header, user: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; h.encoded_len()];
        assert_eq!(h.encode(&mut buf), Ok(h.encoded_len()));
        assert_eq!(
            h.encode(&mut vec![0u8; h.encoded_len() - 1]).unwrap_err(),
            WireError::BufferTooSmall { needed: h.encoded_len(), got: h.encoded_len() - 1 }
        );
        buf.extend_from_slice(user);
        buf.extend_from_slice(payload);
        buf
    }

    proptest! {
        #[test]
        fn whole_round_trips(w in word(), ep in any::<u64>(), p in proptest::collection::vec(any::<u8>(), 0..40)) {
            let user: Vec<u8> = (0..w.hdr_len).map(|i| i as u8).collect();
            let h = AmHdr { w, ep: if w.reply() { ep } else { 0 } };
            let buf = message(&h, &user, &p);
            let (back, u, rest) = AmHdr::decode(&buf).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(u, &user[..]);
            prop_assert_eq!(rest, &p[..]);
            prop_assert!(matches!(Msg::decode(AM_AM_ONLY, &buf), Ok(Msg::Am(..))));
            // Every cut inside the header or the user header is refused.
            for cut in 0..h.fixed_len() + user.len() {
                prop_assert!(matches!(AmHdr::decode(&buf[..cut]), Err(WireError::Truncated { .. })), "cut at {}", cut);
            }
        }

        #[test]
        fn first_round_trips(w in word(), ep in any::<u64>(), msg_id in any::<u64>(), extra in 0usize..1 << 40,
                             p in proptest::collection::vec(any::<u8>(), 0..40)) {
            let user: Vec<u8> = (0..w.hdr_len).map(|i| !(i as u8)).collect();
            let h = AmFirstHdr { w, ep, msg_id, total: p.len() + extra };
            let buf = message(&h, &user, &p);
            let (back, u, rest) = AmFirstHdr::decode(&buf).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(u, &user[..]);
            prop_assert_eq!(rest, &p[..]);
            for cut in 0..len::AM_FIRST + user.len() {
                prop_assert!(matches!(AmFirstHdr::decode(&buf[..cut]), Err(WireError::Truncated { .. })), "cut at {}", cut);
            }
        }

        #[test]
        fn middle_round_trips(ep in any::<u64>(), msg_id in any::<u64>(), offset in 0usize..1 << 40,
                              p in proptest::collection::vec(any::<u8>(), 0..40)) {
            let h = AmMiddleHdr(EagerMiddleHdr { ep, msg_id, offset });
            crate::wire::tests::round_trip(&h, &p, AmMiddleHdr::decode);
            let buf = message(&h, &[], &p);
            prop_assert!(matches!(Msg::decode(AM_AM_MIDDLE, &buf), Ok(Msg::AmMiddle(..))));
        }
    }

    proptest! {
        #[test]
        fn rts_round_trips(w in word(), ep in any::<u64>(), sreq in any::<u64>(), size in 0usize..1 << 40,
                           addr in any::<u64>(), contig in any::<bool>(), key in proptest::collection::vec(any::<u8>(), 0..64)) {
            let rkey = uct::PackedKey::from_slice(&key).unwrap();
            let h = AmRtsHdr { w, rts: RtsHdr { tag: w.word(), ep, sreq, size, addr, contig, rkey } };
            let user: Vec<u8> = (0..w.hdr_len).map(|i| i as u8 ^ 0x5a).collect();
            let buf = message(&h, &user, &[]);
            let (back, u) = AmRtsHdr::decode(&buf).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(u, &user[..]);
            prop_assert!(matches!(Msg::decode(AM_AM_RTS, &buf), Ok(Msg::AmRts(..))));
            for cut in 0..buf.len() {
                prop_assert!(AmRtsHdr::decode(&buf[..cut]).is_err(), "cut at {}", cut);
            }
            let mut more = buf.clone();
            more.push(0);
            let is_trailing = matches!(AmRtsHdr::decode(&more), Err(WireError::TrailingBytes { .. }));
            prop_assert!(is_trailing);
        }
    }

    #[test]
    fn the_short_word_is_the_encoded_header() {
        let h = AmHdr { w: AmWord { id: 0xbeef, flags: 0, hdr_len: 0 }, ep: 0 };
        let mut buf = [0u8; 8];
        h.encode(&mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), h.w.word());
    }

    #[test]
    fn malformed_headers_say_what_was_wrong() {
        let w =
            |flags: u64, reserved: u64, hdr_len: u64| (7 | flags << 16 | reserved << 24 | hdr_len << 32).to_le_bytes();
        assert_eq!(
            AmHdr::decode(&w(0x80, 0, 0)).unwrap_err(),
            WireError::UnknownFlags { what: "active message", flags: 0x80 }
        );
        assert_eq!(
            AmHdr::decode(&w(0, 3, 0)).unwrap_err(),
            WireError::OutOfRange { what: "active message", field: "reserved byte", value: 3 }
        );
        // A user header longer than the message.
        let e = AmHdr::decode(&w(0, 0, 100)).unwrap_err();
        assert_eq!(e, WireError::Truncated { what: "active message", needed: 108, got: 8 });
        // A reply endpoint missing.
        assert!(matches!(AmHdr::decode(&w(1, 0, 0)), Err(WireError::Truncated { .. })));
        // A first fragment longer than its message.
        let mut b = w(0, 0, 0).to_vec();
        b.extend_from_slice(&[0u8; 16]);
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&[1, 2, 3]);
        assert_eq!(
            AmFirstHdr::decode(&b).unwrap_err(),
            WireError::OutOfRange { what: "active message first", field: "total length", value: 2 }
        );
    }
}
