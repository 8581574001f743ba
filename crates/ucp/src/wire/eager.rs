//! Eager headers: whole messages, fragments, and the acknowledgement of a synchronous send.

use super::{len, Header, Reader, WireError, Writer};
use super::{
    AM_EAGER_FIRST, AM_EAGER_MIDDLE, AM_EAGER_ONLY, AM_EAGER_SYNC_FIRST, AM_EAGER_SYNC_ONLY, AM_STREAM_DATA,
    AM_SYNC_ACK,
};
use crate::tag::matcher::Tag;

/// A whole eager message: its tag (also the 8-byte header of an `am_short`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerHdr {
    /// The sender's tag.
    pub tag: Tag,
}

impl EagerHdr {
    /// The header and the payload after it.
    #[inline(always)]
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        match data.split_first_chunk::<{ len::EAGER_ONLY }>() {
            Some((t, payload)) => Ok((EagerHdr { tag: u64::from_le_bytes(*t) }, payload)),
            None => Err(Self::short(data.len())),
        }
    }

    #[cold]
    fn short(got: usize) -> WireError {
        WireError::Truncated { what: "eager", needed: len::EAGER_ONLY, got }
    }
}

impl Header for EagerHdr {
    fn am_id(&self) -> u8 {
        AM_EAGER_ONLY
    }
    fn encoded_len(&self) -> usize {
        len::EAGER_ONLY
    }
    #[inline]
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, len::EAGER_ONLY)?;
        w.u64(self.tag);
        Ok(w.done())
    }
}

/// Bytes of an endpoint's stream: the receiver's endpoint to the sender (also the 8-byte
/// header of an `am_short`). A stream has no message boundaries: every piece of a send is one
/// such message, delivered in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamHdr {
    /// The receiver's endpoint to the sender.
    pub ep: u64,
}

impl StreamHdr {
    /// The header and the bytes after it.
    #[inline]
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let mut r = Reader::new("stream data", data);
        let ep = r.u64()?;
        Ok((StreamHdr { ep }, r.rest()))
    }
}

impl Header for StreamHdr {
    fn am_id(&self) -> u8 {
        AM_STREAM_DATA
    }
    fn encoded_len(&self) -> usize {
        len::STREAM
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, len::STREAM)?;
        w.u64(self.ep);
        Ok(w.done())
    }
}

/// A whole synchronous eager message: the receiver acknowledges its match to `(ep, sreq)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerSyncHdr {
    /// The sender's tag.
    pub tag: Tag,
    /// The receiver's endpoint to the sender.
    pub ep: u64,
    /// The sender's request, acknowledged by [`SyncAck`].
    pub sreq: u64,
}

impl EagerSyncHdr {
    /// The header and the payload after it.
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        let mut r = Reader::new("eager sync", data);
        let h = EagerSyncHdr { tag: r.u64()?, ep: r.u64()?, sreq: r.u64()? };
        Ok((h, r.rest()))
    }
}

impl Header for EagerSyncHdr {
    fn am_id(&self) -> u8 {
        AM_EAGER_SYNC_ONLY
    }
    fn encoded_len(&self) -> usize {
        len::EAGER_SYNC_ONLY
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, len::EAGER_SYNC_ONLY)?;
        w.u64(self.tag);
        w.u64(self.ep);
        w.u64(self.sreq);
        Ok(w.done())
    }
}

/// The first fragment of a multi-fragment eager message (synchronous when `sreq` is set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerFirstHdr {
    /// The sender's tag.
    pub tag: Tag,
    /// The receiver's endpoint to the sender.
    pub ep: u64,
    /// The message id the later fragments carry (unique per sender).
    pub msg_id: u64,
    /// Length of the whole message.
    pub total: usize,
    /// A synchronous send's request, acknowledged by [`SyncAck`].
    pub sreq: Option<u64>,
}

impl EagerFirstHdr {
    /// The header and the fragment after it; `sync` for [`AM_EAGER_SYNC_FIRST`]. The fragment
    /// may not be longer than the message it starts.
    pub fn decode(data: &[u8], sync: bool) -> Result<(Self, &[u8]), WireError> {
        let what = if sync { "eager sync first" } else { "eager first" };
        let mut r = Reader::new(what, data);
        let (tag, ep, msg_id, total) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let sreq = if sync { Some(r.u64()?) } else { None };
        let payload = r.rest();
        let total = usize::try_from(total).ok().filter(|&t| t >= payload.len()).ok_or(WireError::OutOfRange {
            what,
            field: "total length",
            value: total,
        })?;
        Ok((EagerFirstHdr { tag, ep, msg_id, total, sreq }, payload))
    }
}

impl Header for EagerFirstHdr {
    fn am_id(&self) -> u8 {
        if self.sreq.is_some() {
            AM_EAGER_SYNC_FIRST
        } else {
            AM_EAGER_FIRST
        }
    }
    fn encoded_len(&self) -> usize {
        if self.sreq.is_some() {
            len::EAGER_SYNC_FIRST
        } else {
            len::EAGER_FIRST
        }
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, self.encoded_len())?;
        w.u64(self.tag);
        w.u64(self.ep);
        w.u64(self.msg_id);
        w.u64(self.total as u64);
        if let Some(s) = self.sreq {
            w.u64(s);
        }
        Ok(w.done())
    }
}

/// A later fragment of a multi-fragment eager message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerMiddleHdr {
    /// The receiver's endpoint to the sender.
    pub ep: u64,
    /// The message id of its first fragment.
    pub msg_id: u64,
    /// Where the fragment goes in the message.
    pub offset: usize,
}

impl EagerMiddleHdr {
    /// The header and the fragment after it.
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), WireError> {
        Self::decode_as(data, "eager middle")
    }

    /// [`EagerMiddleHdr::decode`] for the message `what` (another family's middle fragment).
    pub(crate) fn decode_as<'a>(data: &'a [u8], what: &'static str) -> Result<(Self, &'a [u8]), WireError> {
        let mut r = Reader::new(what, data);
        let (ep, msg_id, offset) = (r.u64()?, r.u64()?, r.u64()?);
        let offset =
            usize::try_from(offset).map_err(|_| WireError::OutOfRange { what, field: "offset", value: offset })?;
        Ok((EagerMiddleHdr { ep, msg_id, offset }, r.rest()))
    }
}

impl Header for EagerMiddleHdr {
    fn am_id(&self) -> u8 {
        AM_EAGER_MIDDLE
    }
    fn encoded_len(&self) -> usize {
        len::EAGER_MIDDLE
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, len::EAGER_MIDDLE)?;
        w.u64(self.ep);
        w.u64(self.msg_id);
        w.u64(self.offset as u64);
        Ok(w.done())
    }
}

/// The receiver matched synchronous send `sreq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncAck {
    /// The sender's request.
    pub sreq: u64,
}

impl SyncAck {
    /// Decodes a whole message.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new("sync ack", data);
        let sreq = r.u64()?;
        r.end()?;
        Ok(SyncAck { sreq })
    }
}

impl Header for SyncAck {
    fn am_id(&self) -> u8 {
        AM_SYNC_ACK
    }
    fn encoded_len(&self) -> usize {
        8
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 8)?;
        w.u64(self.sreq);
        Ok(w.done())
    }
}

/// The receiver matched a synchronous send that came through the transport's tag matching
/// (UCX's `UCP_AM_ID_OFFLOAD_SYNC_ACK`): such a message carries no request id, so the sender
/// acknowledges its oldest unacknowledged synchronous send of `tag` on endpoint `ep`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadSyncAck {
    /// The sender's endpoint (the receiver's endpoint's remote id).
    pub ep: u64,
    /// The message's tag.
    pub tag: u64,
}

impl OffloadSyncAck {
    /// Decodes a whole message.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new("offload sync ack", data);
        let ep = r.u64()?;
        let tag = r.u64()?;
        r.end()?;
        Ok(OffloadSyncAck { ep, tag })
    }
}

impl Header for OffloadSyncAck {
    fn am_id(&self) -> u8 {
        super::AM_OFFLOAD_SYNC_ACK
    }
    fn encoded_len(&self) -> usize {
        16
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, 16)?;
        w.u64(self.ep);
        w.u64(self.tag);
        Ok(w.done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::round_trip;
    use crate::wire::Msg;
    use proptest::prelude::*;

    fn payload() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..40)
    }

    proptest! {
        #[test]
        fn stream_round_trips(ep in any::<u64>(), p in payload()) {
            round_trip(&StreamHdr { ep }, &p, StreamHdr::decode);
        }

        #[test]
        fn eager_round_trips(tag in any::<u64>(), p in payload()) {
            round_trip(&EagerHdr { tag }, &p, EagerHdr::decode);
        }

        #[test]
        fn eager_sync_round_trips(tag in any::<u64>(), ep in any::<u64>(), sreq in any::<u64>(), p in payload()) {
            round_trip(&EagerSyncHdr { tag, ep, sreq }, &p, EagerSyncHdr::decode);
        }

        #[test]
        fn eager_first_round_trips(
            tag in any::<u64>(), ep in any::<u64>(), msg_id in any::<u64>(), extra in 0usize..1 << 40,
            sreq in proptest::option::of(any::<u64>()), p in payload(),
        ) {
            let h = EagerFirstHdr { tag, ep, msg_id, total: p.len() + extra, sreq };
            round_trip(&h, &p, |d| EagerFirstHdr::decode(d, sreq.is_some()));
            // Through the dispatch, by the id the header names.
            let mut buf = vec![0u8; h.encoded_len() + p.len()];
            let n = h.encode(&mut buf).unwrap();
            buf[n..].copy_from_slice(&p);
            prop_assert_eq!(Msg::decode(h.am_id(), &buf), Ok(Msg::EagerFirst(h, &p[..])));
        }

        #[test]
        fn eager_middle_round_trips(ep in any::<u64>(), msg_id in any::<u64>(), offset in any::<usize>(), p in payload()) {
            round_trip(&EagerMiddleHdr { ep, msg_id, offset }, &p, EagerMiddleHdr::decode);
        }

        #[test]
        fn sync_ack_round_trips(sreq in any::<u64>()) {
            round_trip(&SyncAck { sreq }, &[], |d| SyncAck::decode(d).map(|h| (h, &d[d.len()..])));
        }
    }

    #[test]
    fn a_first_fragment_longer_than_its_message_is_refused() {
        let h = EagerFirstHdr { tag: 1, ep: 2, msg_id: 3, total: 4, sreq: None };
        let mut buf = [0u8; len::EAGER_FIRST + 5];
        h.encode(&mut buf).unwrap();
        assert_eq!(
            EagerFirstHdr::decode(&buf, false),
            Err(WireError::OutOfRange { what: "eager first", field: "total length", value: 4 })
        );
        assert!(EagerFirstHdr::decode(&buf[..len::EAGER_FIRST + 4], false).is_ok());
    }

    #[test]
    fn a_sync_ack_with_trailing_bytes_is_refused() {
        assert_eq!(SyncAck::decode(&[0; 9]), Err(WireError::TrailingBytes { what: "sync ack", expected: 8, got: 9 }));
        let a = OffloadSyncAck { ep: 7, tag: u64::MAX };
        round_trip(&a, &[], |d| OffloadSyncAck::decode(d).map(|h| (h, &d[d.len()..])));
        assert!(OffloadSyncAck::decode(&[0; 15]).is_err());
        assert!(OffloadSyncAck::decode(&[0; 17]).is_err());
    }
}
