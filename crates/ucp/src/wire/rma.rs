//! Remote memory access and atomics emulated over active messages (UCX's `rma_sw.c` and
//! `amo_sw.c`), for lanes that cannot reach a peer's memory themselves: the target applies
//! the operation to its own memory - after checking that the peer named memory it mapped -
//! and answers.
//!
//! `ep` fields name the receiver's endpoint (for its replies and error accounting); `rreq`
//! names the origin's request; a `status` reports what the target refused.

use ucs::Status;

use super::{Header, Reader, WireError, Writer};
use super::{AM_AMO_REP, AM_AMO_REQ, AM_RMA_FLUSH, AM_RMA_FLUSH_REP, AM_RMA_GET_REP, AM_RMA_GET_REQ, AM_RMA_PUT};

/// Put: the payload goes to `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutHdr {
    /// The target's endpoint to the origin.
    pub ep: u64,
    /// Target address of the payload's first byte.
    pub addr: u64,
}

impl PutHdr {
    /// Decodes the header; the payload follows it.
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let mut r = Reader::new("rma put", data);
        let (ep, addr) = (r.u64()?, r.u64()?);
        Ok((PutHdr { ep, addr }, r.rest()))
    }
}

impl Header for PutHdr {
    fn am_id(&self) -> u8 {
        AM_RMA_PUT
    }
    fn encoded_len(&self) -> usize {
        16
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 16)?;
        w.u64(self.ep);
        w.u64(self.addr);
        Ok(w.done())
    }
}

/// Get: send `len` bytes at `addr` back to request `rreq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetReq {
    /// The target's endpoint to the origin.
    pub ep: u64,
    /// The origin's request.
    pub rreq: u64,
    /// Target address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

impl GetReq {
    /// Decodes a whole message.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new("rma get", data);
        let h = GetReq { ep: r.u64()?, rreq: r.u64()?, addr: r.u64()?, len: r.u64()? };
        r.end()?;
        Ok(h)
    }
}

impl Header for GetReq {
    fn am_id(&self) -> u8 {
        AM_RMA_GET_REQ
    }
    fn encoded_len(&self) -> usize {
        32
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 32)?;
        for v in [self.ep, self.rreq, self.addr, self.len] {
            w.u64(v);
        }
        Ok(w.done())
    }
}

/// A piece of a get's data (at `offset` of it), or the target's refusal (`status`, no data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetRep {
    /// The origin's request.
    pub rreq: u64,
    /// Where the payload goes in the request's buffer.
    pub offset: u64,
    /// `Ok`, or why the target refused.
    pub status: Status,
}

impl GetRep {
    /// Decodes the header; the payload follows it.
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let what = "rma get reply";
        let mut r = Reader::new(what, data);
        let (rreq, offset, status) = (r.u64()?, r.u64()?, r.status()?);
        Ok((GetRep { rreq, offset, status }, r.rest()))
    }
}

impl Header for GetRep {
    fn am_id(&self) -> u8 {
        AM_RMA_GET_REP
    }
    fn encoded_len(&self) -> usize {
        20
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 20)?;
        w.u64(self.rreq);
        w.u64(self.offset);
        w.put(&(self.status.code() as i32).to_le_bytes());
        Ok(w.done())
    }
}

/// Atomic flag: the origin wants the old value back.
pub const AMO_FLAG_FETCH: u8 = 1;

/// An atomic on the `size`-byte location `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmoReq {
    /// The target's endpoint to the origin.
    pub ep: u64,
    /// The origin's request (for the reply of a fetching operation).
    pub rreq: u64,
    /// Target address.
    pub addr: u64,
    /// The operand.
    pub value: u64,
    /// The compared value of a compare-and-swap.
    pub compare: u64,
    /// The operation.
    pub op: uct::AtomicOp,
    /// 4 or 8.
    pub size: u8,
    /// Reply with the old value.
    pub fetch: bool,
}

impl AmoReq {
    /// Decodes a whole message.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let what = "atomic";
        let mut r = Reader::new(what, data);
        let (ep, rreq, addr, value, compare) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let (op, size, flags) = (r.u8()?, r.u8()?, r.u8()?);
        r.end()?;
        let op = *uct::AtomicOp::ALL.get(op as usize).ok_or(WireError::OutOfRange {
            what,
            field: "op",
            value: op as u64,
        })?;
        if size != 4 && size != 8 {
            return Err(WireError::OutOfRange { what, field: "size", value: size as u64 });
        }
        if flags & !AMO_FLAG_FETCH != 0 {
            return Err(WireError::UnknownFlags { what, flags });
        }
        Ok(AmoReq { ep, rreq, addr, value, compare, op, size, fetch: flags & AMO_FLAG_FETCH != 0 })
    }
}

impl Header for AmoReq {
    fn am_id(&self) -> u8 {
        AM_AMO_REQ
    }
    fn encoded_len(&self) -> usize {
        43
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 43)?;
        for v in [self.ep, self.rreq, self.addr, self.value, self.compare] {
            w.u64(v);
        }
        w.put(&[self.op as u8, self.size, if self.fetch { AMO_FLAG_FETCH } else { 0 }]);
        Ok(w.done())
    }
}

/// The old value of a fetching atomic, or the target's refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmoRep {
    /// The origin's request.
    pub rreq: u64,
    /// The old value.
    pub value: u64,
    /// `Ok`, or why the target refused.
    pub status: Status,
}

impl AmoRep {
    /// Decodes a whole message.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let what = "atomic reply";
        let mut r = Reader::new(what, data);
        let (rreq, value, status) = (r.u64()?, r.u64()?, r.status()?);
        r.end()?;
        Ok(AmoRep { rreq, value, status })
    }
}

impl Header for AmoRep {
    fn am_id(&self) -> u8 {
        AM_AMO_REP
    }
    fn encoded_len(&self) -> usize {
        20
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 20)?;
        w.u64(self.rreq);
        w.u64(self.value);
        w.put(&(self.status.code() as i32).to_le_bytes());
        Ok(w.done())
    }
}

/// Flush request (`ep`: the target's endpoint) or reply (`ep`: the origin's endpoint, with
/// the first error the target met since the last flush).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushMsg {
    /// Reply rather than request.
    pub reply: bool,
    /// The receiver's endpoint.
    pub ep: u64,
    /// `Ok`, or the first operation the target refused since the last flush.
    pub status: Status,
}

impl FlushMsg {
    /// Decodes a whole message of id `id`.
    pub fn decode(id: u8, data: &[u8]) -> Result<Self, WireError> {
        let what = if id == AM_RMA_FLUSH { "rma flush" } else { "rma flush reply" };
        let mut r = Reader::new(what, data);
        let (ep, status) = (r.u64()?, r.status()?);
        r.end()?;
        Ok(FlushMsg { reply: id == AM_RMA_FLUSH_REP, ep, status })
    }
}

impl Header for FlushMsg {
    fn am_id(&self) -> u8 {
        if self.reply {
            AM_RMA_FLUSH_REP
        } else {
            AM_RMA_FLUSH
        }
    }
    fn encoded_len(&self) -> usize {
        12
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 12)?;
        w.u64(self.ep);
        w.put(&(self.status.code() as i32).to_le_bytes());
        Ok(w.done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::round_trip;
    use crate::wire::Msg;
    use proptest::prelude::*;

    fn whole<H: Header + PartialEq + std::fmt::Debug>(h: H, decode: impl Fn(&[u8]) -> Result<H, WireError>) {
        round_trip(&h, &[], |b| decode(b).map(|h| (h, &b[b.len()..])));
        let mut b = vec![0u8; h.encoded_len() + 1];
        h.encode(&mut b).unwrap();
        assert!(matches!(decode(&b), Err(WireError::TrailingBytes { .. })));
    }

    #[test]
    fn headers_round_trip_and_reject_bad_fields() {
        round_trip(&PutHdr { ep: 1, addr: 0x7000 }, b"data", PutHdr::decode);
        round_trip(&GetRep { rreq: 3, offset: 8192, status: Status::Ok }, b"xy", GetRep::decode);
        whole(GetReq { ep: 1, rreq: 2, addr: 3, len: 4 }, GetReq::decode);
        let amo =
            AmoReq { ep: 1, rreq: 2, addr: 8, value: 5, compare: 6, op: uct::AtomicOp::Cswap, size: 4, fetch: true };
        whole(amo, AmoReq::decode);
        whole(AmoRep { rreq: 9, value: u64::MAX, status: Status::OutOfRange }, AmoRep::decode);
        whole(FlushMsg { reply: false, ep: 4, status: Status::Ok }, |b| FlushMsg::decode(AM_RMA_FLUSH, b));
        whole(FlushMsg { reply: true, ep: 4, status: Status::InvalidParam }, |b| FlushMsg::decode(AM_RMA_FLUSH_REP, b));
        let mut b = [0u8; 43];
        amo.encode(&mut b).unwrap();
        let mut bad = b;
        bad[40] = 6;
        assert!(matches!(AmoReq::decode(&bad), Err(WireError::OutOfRange { field: "op", .. })));
        let mut bad = b;
        bad[41] = 2;
        assert!(matches!(AmoReq::decode(&bad), Err(WireError::OutOfRange { field: "size", .. })));
        let mut bad = b;
        bad[42] = 0x80;
        assert!(matches!(AmoReq::decode(&bad), Err(WireError::UnknownFlags { .. })));
        let mut r = [0u8; 20];
        AmoRep { rreq: 1, value: 2, status: Status::Ok }.encode(&mut r).unwrap();
        r[16..].copy_from_slice(&1000i32.to_le_bytes());
        assert!(matches!(AmoRep::decode(&r), Err(WireError::OutOfRange { field: "status", .. })));
    }

    proptest! {
        #[test]
        fn decoding_anything_never_panics(id in 13u8..20, bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Msg::decode(id, &bytes);
        }
    }
}
