//! Rendezvous headers: the request to send (RTS), the receiver's readiness (RTR), data
//! fragments, and the two acknowledgements (ATS to the sender, ATP to the receiver).

use ucs::Status;
use uct::PackedKey;

use super::{len, Header, Reader, WireError, Writer, RTS_FLAG_CONTIG};
use super::{AM_RNDV_ATP, AM_RNDV_ATS, AM_RNDV_DATA, AM_RNDV_RTR, AM_RNDV_RTS};
use crate::tag::matcher::Tag;

/// A rendezvous request to send: `size` bytes at `addr` in the sender, readable with `rkey`
/// (empty: the sender exposed nothing, the data comes by a put or in fragments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsHdr {
    /// The sender's tag.
    pub tag: Tag,
    /// The receiver's endpoint to the sender.
    pub ep: u64,
    /// The sender's request.
    pub sreq: u64,
    /// Length of the message.
    pub size: usize,
    /// Address of the sender's buffer.
    pub addr: u64,
    /// The sender's buffer is contiguous (it can be the source of a put).
    pub contig: bool,
    /// The sender's packed memory key for a get; empty when it offers none.
    pub rkey: PackedKey,
}

impl RtsHdr {
    /// Decodes a whole message.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let (h, rest) = Self::decode_as(data, "rndv rts")?;
        if !rest.is_empty() {
            let n = data.len() - rest.len();
            return Err(WireError::TrailingBytes { what: "rndv rts", expected: n, got: data.len() });
        }
        Ok(h)
    }

    /// Decodes the header of message `what` (an RTS, or one that carries more after it);
    /// returns it and the bytes after it.
    pub(crate) fn decode_as<'a>(data: &'a [u8], what: &'static str) -> Result<(Self, &'a [u8]), WireError> {
        let mut r = Reader::new(what, data);
        let (tag, ep, sreq, size, addr) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let flags = r.u8()?;
        if flags & !RTS_FLAG_CONTIG != 0 {
            return Err(WireError::UnknownFlags { what, flags });
        }
        let rkey = r.key()?;
        let size = usize::try_from(size).map_err(|_| WireError::OutOfRange { what, field: "size", value: size })?;
        Ok((RtsHdr { tag, ep, sreq, size, addr, contig: flags & RTS_FLAG_CONTIG != 0, rkey }, r.rest()))
    }
}

impl Header for RtsHdr {
    fn am_id(&self) -> u8 {
        AM_RNDV_RTS
    }
    fn encoded_len(&self) -> usize {
        len::RTS + self.rkey.len()
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, self.encoded_len())?;
        w.u64(self.tag);
        w.u64(self.ep);
        w.u64(self.sreq);
        w.u64(self.size as u64);
        w.u64(self.addr);
        w.put(&[if self.contig { RTS_FLAG_CONTIG } else { 0 }]);
        w.key(&self.rkey);
        Ok(w.done())
    }
}

/// The receiver of rendezvous `sreq` is done with the sender's buffer: it has the data, or
/// gave up (`status`: truncated, cancelled, failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ats {
    /// The sender's request.
    pub sreq: u64,
    /// How the receive ended.
    pub status: Status,
}

impl Ats {
    /// Decodes a whole message; a status code UCX does not name is an error.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let what = "rndv ats";
        let mut r = Reader::new(what, data);
        let (sreq, status) = (r.u64()?, r.status()?);
        r.end()?;
        Ok(Ats { sreq, status })
    }
}

impl Header for Ats {
    fn am_id(&self) -> u8 {
        AM_RNDV_ATS
    }
    fn encoded_len(&self) -> usize {
        12
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 12)?;
        w.u64(self.sreq);
        w.put(&(self.status.code() as i32).to_le_bytes());
        Ok(w.done())
    }
}

/// The receiver is ready for rendezvous `sreq`: put `len` bytes at `addr` with `rkey`, or,
/// without a key, send them as [`RndvDataHdr`] fragments to `rreq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrHdr {
    /// The sender's endpoint to the receiver.
    pub ep: u64,
    /// The sender's request.
    pub sreq: u64,
    /// The receiver's request.
    pub rreq: u64,
    /// Address of the receiver's buffer.
    pub addr: u64,
    /// Bytes the receiver expects.
    pub len: u64,
    /// The receiver's packed memory key for a put; empty for fragments.
    pub rkey: PackedKey,
}

impl RtrHdr {
    /// Decodes a whole message.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new("rndv rtr", data);
        let (ep, sreq, rreq, addr, len) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let rkey = r.key()?;
        r.end()?;
        Ok(RtrHdr { ep, sreq, rreq, addr, len, rkey })
    }
}

impl Header for RtrHdr {
    fn am_id(&self) -> u8 {
        AM_RNDV_RTR
    }
    fn encoded_len(&self) -> usize {
        len::RTR + self.rkey.len()
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, self.encoded_len())?;
        w.u64(self.ep);
        w.u64(self.sreq);
        w.u64(self.rreq);
        w.u64(self.addr);
        w.u64(self.len);
        w.key(&self.rkey);
        Ok(w.done())
    }
}

/// A rendezvous data fragment for receive `rreq`, to go at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RndvDataHdr {
    /// The receiver's request.
    pub rreq: u64,
    /// Where the fragment goes in the message.
    pub offset: usize,
}

impl RndvDataHdr {
    /// The header and the fragment after it.
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let what = "rndv data";
        let mut r = Reader::new(what, data);
        let (rreq, offset) = (r.u64()?, r.u64()?);
        let offset =
            usize::try_from(offset).map_err(|_| WireError::OutOfRange { what, field: "offset", value: offset })?;
        Ok((RndvDataHdr { rreq, offset }, r.rest()))
    }
}

impl Header for RndvDataHdr {
    fn am_id(&self) -> u8 {
        AM_RNDV_DATA
    }
    fn encoded_len(&self) -> usize {
        len::RNDV_DATA
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, len::RNDV_DATA)?;
        w.u64(self.rreq);
        w.u64(self.offset as u64);
        Ok(w.done())
    }
}

/// The sender's put into receive `rreq` completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Atp {
    /// The receiver's request.
    pub rreq: u64,
}

impl Atp {
    /// Decodes a whole message.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new("rndv atp", data);
        let rreq = r.u64()?;
        r.end()?;
        Ok(Atp { rreq })
    }
}

impl Header for Atp {
    fn am_id(&self) -> u8 {
        AM_RNDV_ATP
    }
    fn encoded_len(&self) -> usize {
        8
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 8)?;
        w.u64(self.rreq);
        Ok(w.done())
    }
}

/// The header software gets with an offloaded rendezvous (`tag_rndv_zcopy`, whose RVH carries
/// the address, key and length for the receiver's transport): the receiver's endpoint for the
/// sender, the send request, the size. With it software can finish the rendezvous itself: as
/// an RTS when the message came unexpected, or with a truncation when the posted buffer was
/// too small (the transport hands that back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadRndvHdr {
    /// The receiver's endpoint for the sender.
    pub ep: u64,
    /// The sender's request.
    pub sreq: u64,
    /// The message's size.
    pub size: usize,
}

impl OffloadRndvHdr {
    /// Its length on the wire.
    pub const LEN: usize = 24;

    /// The bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&self.ep.to_le_bytes());
        b[8..16].copy_from_slice(&self.sreq.to_le_bytes());
        b[16..].copy_from_slice(&(self.size as u64).to_le_bytes());
        b
    }

    /// Decodes a whole header.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new("offload rndv header", data);
        let ep = r.u64()?;
        let sreq = r.u64()?;
        let size = r.u64()?;
        r.end()?;
        let size = usize::try_from(size).map_err(|_| WireError::OutOfRange {
            what: "offload rndv header",
            field: "size",
            value: size,
        })?;
        Ok(OffloadRndvHdr { ep, sreq, size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::round_trip;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = PackedKey> {
        proptest::collection::vec(any::<u8>(), 0..=PackedKey::MAX).prop_map(|v| PackedKey::from_slice(&v).unwrap())
    }

    fn status() -> impl Strategy<Value = Status> {
        (-128i32..=127).prop_filter_map("a status UCX names", |c| Status::from_code(c as i8))
    }

    /// Whole-message decoders through the payload-returning shape of `round_trip`.
    fn whole<H>(f: fn(&[u8]) -> Result<H, WireError>) -> impl Fn(&[u8]) -> Result<(H, &[u8]), WireError> {
        move |d| f(d).map(|h| (h, &d[d.len()..]))
    }

    proptest! {
        #[test]
        fn rts_round_trips(
            tag in any::<u64>(), ep in any::<u64>(), sreq in any::<u64>(), size in any::<usize>(),
            addr in any::<u64>(), contig in any::<bool>(), rkey in key(),
        ) {
            round_trip(&RtsHdr { tag, ep, sreq, size, addr, contig, rkey }, &[], whole(RtsHdr::decode));
        }

        #[test]
        fn rtr_round_trips(
            ep in any::<u64>(), sreq in any::<u64>(), rreq in any::<u64>(), addr in any::<u64>(), len in any::<u64>(),
            rkey in key(),
        ) {
            round_trip(&RtrHdr { ep, sreq, rreq, addr, len, rkey }, &[], whole(RtrHdr::decode));
        }

        #[test]
        fn ats_round_trips(sreq in any::<u64>(), status in status()) {
            round_trip(&Ats { sreq, status }, &[], whole(Ats::decode));
        }

        #[test]
        fn atp_round_trips(rreq in any::<u64>()) {
            round_trip(&Atp { rreq }, &[], whole(Atp::decode));
        }

        #[test]
        fn rndv_data_round_trips(rreq in any::<u64>(), offset in any::<usize>(), p in proptest::collection::vec(any::<u8>(), 0..40)) {
            round_trip(&RndvDataHdr { rreq, offset }, &p, RndvDataHdr::decode);
        }
    }

    fn rts_bytes(klen: u16, key: usize, flags: u8) -> Vec<u8> {
        let mut m = Vec::new();
        for word in [7u64, 1, 2, 65536, 0x1000] {
            m.extend_from_slice(&word.to_le_bytes());
        }
        m.push(flags);
        m.extend_from_slice(&klen.to_le_bytes());
        m.extend(std::iter::repeat_n(0xab, key));
        m
    }

    #[test]
    fn malformed_rts_are_refused_with_what_was_wrong() {
        assert!(RtsHdr::decode(&rts_bytes(24, 24, RTS_FLAG_CONTIG)).is_ok());
        let long = PackedKey::MAX + 1;
        assert_eq!(
            RtsHdr::decode(&rts_bytes(long as u16, long, 1)),
            Err(WireError::KeyTooLong { what: "rndv rts", len: long })
        );
        assert_eq!(
            RtsHdr::decode(&rts_bytes(24, 23, 1)),
            Err(WireError::Truncated { what: "rndv rts", needed: len::RTS + 24, got: len::RTS + 23 })
        );
        assert_eq!(
            RtsHdr::decode(&rts_bytes(24, 25, 1)),
            Err(WireError::TrailingBytes { what: "rndv rts", expected: len::RTS + 24, got: len::RTS + 25 })
        );
        assert_eq!(
            RtsHdr::decode(&rts_bytes(0, 0, 0x81)),
            Err(WireError::UnknownFlags { what: "rndv rts", flags: 0x81 })
        );
    }

    #[test]
    fn an_ats_with_an_unknown_status_is_refused() {
        let mut m = 5u64.to_le_bytes().to_vec();
        m.extend_from_slice(&1000i32.to_le_bytes());
        assert_eq!(Ats::decode(&m), Err(WireError::OutOfRange { what: "rndv ats", field: "status", value: 1000 }));
    }

    #[test]
    fn offload_rndv_header_round_trip_and_errors() {
        let h = OffloadRndvHdr { ep: 1, sreq: 2, size: 3 };
        assert_eq!(OffloadRndvHdr::decode(&h.to_bytes()), Ok(h));
        assert!(OffloadRndvHdr::decode(&h.to_bytes()[..23]).is_err());
        assert!(OffloadRndvHdr::decode(&[0; 25]).is_err());
    }
}
