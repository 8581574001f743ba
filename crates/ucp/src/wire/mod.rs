//! Wire formats of UCP's active messages: ids, typed headers, strict decoding.
//!
//! Every message is one transport active message whose id says what it is (below); its bytes
//! are a header of little-endian fields, then, for data-carrying messages, the payload. Each
//! header is a type with `encode` and a `decode` that returns a [`WireError`] naming what was
//! wrong with malformed input (too short, bytes after a fixed-size message, a length or flag
//! out of range) and never panics or reads past the slice; [`Msg::decode`] dispatches on the
//! AM id. Nothing here reinterprets memory.
//!
//! | id | message | header (fields, bytes) | payload |
//! |---|---|---|---|
//! | 1 | wireup | see [`WireupMsg`] | - |
//! | 2 | eager | [`EagerHdr`] tag (8) | the whole message |
//! | 3 | eager first | [`EagerFirstHdr`] tag, ep, msg id, total (32) | first fragment |
//! | 4 | eager middle | [`EagerMiddleHdr`] ep, msg id, offset (24) | a later fragment |
//! | 5 | eager sync | [`EagerSyncHdr`] tag, ep, sreq (24) | the whole message |
//! | 6 | eager sync first | [`EagerFirstHdr`] tag, ep, msg id, total, sreq (40) | first fragment |
//! | 7 | sync ack | [`SyncAck`] sreq (8) | - |
//! | 8 | rndv RTS | [`RtsHdr`] tag, ep, sreq, size, address, flags (1), key length (2), key | - |
//! | 9 | rndv ATS | [`Ats`] sreq, status (4) | - |
//! | 10 | rndv RTR | [`RtrHdr`] ep, sreq, rreq, address, length, key length (2), key | - |
//! | 11 | rndv data | [`RndvDataHdr`] rreq, offset (16) | a fragment |
//! | 12 | rndv ATP | [`Atp`] rreq (8) | - |
//! | 13 | rma put (emulated) | [`rma::PutHdr`] ep, address (16) | the data |
//! | 14 | rma get (emulated) | [`rma::GetReq`] ep, rreq, address, length (32) | - |
//! | 15 | rma get reply | [`rma::GetRep`] rreq, offset, status (20) | a piece of the data |
//! | 16 | atomic (emulated) | [`rma::AmoReq`] ep, rreq, address, value, compare, op, size, flags (43) | - |
//! | 17 | atomic reply | [`rma::AmoRep`] rreq, value, status (20) | - |
//! | 18, 19 | rma flush, reply | [`rma::FlushMsg`] ep, status (12) | - |
//! | 20 | active message | [`am::AmHdr`] id, flags, user header length (8), ep if reply (8) | user header, data |
//! | 21 | active message first | [`am::AmFirstHdr`] id, flags, user header length, ep, msg id, total (32) | user header, first fragment |
//! | 22 | active message middle | [`am::AmMiddleHdr`] ep, msg id, offset (24) | a later fragment |
//! | 23 | active message rts | [`am::AmRtsHdr`]: an RTS with id, flags, user header length in the tag's place | user header |
//! | 24 | stream data | [`StreamHdr`] ep (8) | bytes of the stream |
//! | 25 | offload sync ack | [`OffloadSyncAck`] ep, tag (16) | - |
//!
//! Tagged sends through a transport's tag matching (a tag lane, `docs/ucp/tag-offload.md`) are
//! not UCP active messages: the transport carries the tag, and an eager message's payload is
//! the user's data alone (a synchronous one names the receiver's endpoint in the immediate
//! value, acknowledged by id 25); a rendezvous request carries an RTS (id 8's format) as its
//! header.
//!
//! Peers are never trusted beyond the format: `ep` fields hold the *receiver's* endpoint id
//! for the sender (learned during wireup) so the receiver replies on the right endpoint, and
//! `sreq`/`rreq` name requests of the sender and the receiver; the protocols look every id up
//! in generation-checked tables and check offsets against the request they name.

use std::fmt;

use ucs::Status;

pub mod am;
mod eager;
mod msg;
pub mod rkey;
pub mod rma;
mod rndv;
pub mod wireup;

pub use eager::{EagerFirstHdr, EagerHdr, EagerMiddleHdr, EagerSyncHdr, OffloadSyncAck, StreamHdr, SyncAck};
pub use rndv::{Atp, Ats, OffloadRndvHdr, RndvDataHdr, RtrHdr, RtsHdr};
pub use wireup::{EpAddr, WireupMsg};

pub(crate) use msg::{Ctrl, DataHdr, UserHdr, WireupOut};

/// Wireup: connection request, reply and acknowledgement.
pub const AM_WIREUP: u8 = 1;
/// Eager message in one piece: `[tag]` + payload (short: the tag is the 8-byte header).
pub const AM_EAGER_ONLY: u8 = 2;
/// First fragment of a multi-fragment eager message.
pub const AM_EAGER_FIRST: u8 = 3;
/// Following fragments of a multi-fragment eager message (sync or not).
pub const AM_EAGER_MIDDLE: u8 = 4;
/// Synchronous eager message in one piece.
pub const AM_EAGER_SYNC_ONLY: u8 = 5;
/// First fragment of a synchronous multi-fragment eager message.
pub const AM_EAGER_SYNC_FIRST: u8 = 6;
/// The receiver matched a synchronous eager message.
pub const AM_SYNC_ACK: u8 = 7;
/// Rendezvous request to send.
pub const AM_RNDV_RTS: u8 = 8;
/// Rendezvous: the receiver has the data (get) or gave up (truncation, cancel).
pub const AM_RNDV_ATS: u8 = 9;
/// Rendezvous: the receiver is ready; push the data (put_zcopy, or AM fragments without a key).
pub const AM_RNDV_RTR: u8 = 10;
/// Rendezvous data fragment (AM scheme).
pub const AM_RNDV_DATA: u8 = 11;
/// Rendezvous: the sender's put completed.
pub const AM_RNDV_ATP: u8 = 12;

/// Emulated put.
pub const AM_RMA_PUT: u8 = 13;
/// Emulated get: the request.
pub const AM_RMA_GET_REQ: u8 = 14;
/// Emulated get: a piece of the data.
pub const AM_RMA_GET_REP: u8 = 15;
/// Emulated atomic.
pub const AM_AMO_REQ: u8 = 16;
/// Emulated atomic: the old value.
pub const AM_AMO_REP: u8 = 17;
/// Flush of emulated operations: the request.
pub const AM_RMA_FLUSH: u8 = 18;
/// Flush of emulated operations: the reply.
pub const AM_RMA_FLUSH_REP: u8 = 19;

/// Active message (`ucp_am_send_nbx`) in one piece.
pub const AM_AM_ONLY: u8 = 20;
/// First fragment of a multi-fragment active message.
pub const AM_AM_FIRST: u8 = 21;
/// Later fragments of a multi-fragment active message.
pub const AM_AM_MIDDLE: u8 = 22;
/// Rendezvous request of an active message.
pub const AM_AM_RTS: u8 = 23;
/// Bytes of an endpoint's stream (`ucp_stream_send_nbx`).
pub const AM_STREAM_DATA: u8 = 24;
/// Acknowledgement of a synchronous send that went through the transport's tag matching.
pub const AM_OFFLOAD_SYNC_ACK: u8 = 25;

/// Every AM id UCP uses, for handler registration.
pub const ALL_AM_IDS: [u8; 25] = [
    AM_WIREUP,
    AM_EAGER_ONLY,
    AM_EAGER_FIRST,
    AM_EAGER_MIDDLE,
    AM_EAGER_SYNC_ONLY,
    AM_EAGER_SYNC_FIRST,
    AM_SYNC_ACK,
    AM_RNDV_RTS,
    AM_RNDV_ATS,
    AM_RNDV_RTR,
    AM_RNDV_DATA,
    AM_RNDV_ATP,
    AM_RMA_PUT,
    AM_RMA_GET_REQ,
    AM_RMA_GET_REP,
    AM_AMO_REQ,
    AM_AMO_REP,
    AM_RMA_FLUSH,
    AM_RMA_FLUSH_REP,
    AM_AM_ONLY,
    AM_AM_FIRST,
    AM_AM_MIDDLE,
    AM_AM_RTS,
    AM_STREAM_DATA,
    AM_OFFLOAD_SYNC_ACK,
];

/// Human name of an AM id, for logs.
pub fn am_name(id: u8) -> &'static str {
    match id {
        AM_WIREUP => "wireup",
        AM_EAGER_ONLY => "eager",
        AM_EAGER_FIRST => "eager first",
        AM_EAGER_MIDDLE => "eager middle",
        AM_EAGER_SYNC_ONLY => "eager sync",
        AM_EAGER_SYNC_FIRST => "eager sync first",
        AM_SYNC_ACK => "sync ack",
        AM_RNDV_RTS => "rndv rts",
        AM_RNDV_ATS => "rndv ats",
        AM_RNDV_RTR => "rndv rtr",
        AM_RNDV_DATA => "rndv data",
        AM_RNDV_ATP => "rndv atp",
        AM_RMA_PUT => "rma put",
        AM_RMA_GET_REQ => "rma get",
        AM_RMA_GET_REP => "rma get reply",
        AM_AMO_REQ => "atomic",
        AM_AMO_REP => "atomic reply",
        AM_RMA_FLUSH => "rma flush",
        AM_RMA_FLUSH_REP => "rma flush reply",
        AM_AM_ONLY => "active message",
        AM_AM_FIRST => "active message first",
        AM_AM_MIDDLE => "active message middle",
        AM_AM_RTS => "active message rts",
        AM_STREAM_DATA => "stream data",
        AM_OFFLOAD_SYNC_ACK => "offload sync ack",
        _ => "unknown",
    }
}

/// Header sizes.
pub mod len {
    /// Eager only: tag.
    pub const EAGER_ONLY: usize = 8;
    /// Eager first: tag, ep, msg id, total length.
    pub const EAGER_FIRST: usize = 32;
    /// Eager middle: ep, msg id, offset.
    pub const EAGER_MIDDLE: usize = 24;
    /// Eager sync only: tag, ep, sreq.
    pub const EAGER_SYNC_ONLY: usize = 24;
    /// Eager sync first: tag, ep, msg id, total, sreq.
    pub const EAGER_SYNC_FIRST: usize = 40;
    /// Rndv RTS before the key: tag, ep, sreq, size, address, flags (u8), key length (u16).
    pub const RTS: usize = 43;
    /// Rndv RTR before the key: ep, sreq, rreq, address, length, key length (u16).
    pub const RTR: usize = 42;
    /// Rndv data: rreq, offset.
    pub const RNDV_DATA: usize = 16;
    /// Active message: id, flags, user header length (without the reply endpoint and the
    /// user header).
    pub const AM_ONLY: usize = 8;
    /// Active message first fragment: id, flags, user header length, ep, msg id, total.
    pub const AM_FIRST: usize = 32;
    /// Stream data: ep.
    pub const STREAM: usize = 8;
    /// The longest fixed header of a message with a payload (eager sync first); an active
    /// message's user header comes on top of its fixed header.
    pub const MAX_DATA_HDR: usize = EAGER_SYNC_FIRST;
}

/// RTS flag: the sender's buffer is contiguous (it can be the source of a put).
pub const RTS_FLAG_CONTIG: u8 = 1;

/// Why bytes could not be decoded, or a header not encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The input is shorter than the header being read.
    Truncated {
        /// The message.
        what: &'static str,
        /// Bytes the header needs.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// Bytes follow a message that has no payload.
    TrailingBytes {
        /// The message.
        what: &'static str,
        /// Bytes the message occupies.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// A remote key longer than any memory domain packs.
    KeyTooLong {
        /// The message.
        what: &'static str,
        /// The length it claims.
        len: usize,
    },
    /// A field whose value cannot be right (a length that does not fit this machine's address
    /// space, a first fragment longer than its message, an unknown status code).
    OutOfRange {
        /// The message.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// Flag bits this version does not define are set.
    UnknownFlags {
        /// The message.
        what: &'static str,
        /// The flags byte.
        flags: u8,
    },
    /// A wireup message of an unknown kind.
    UnknownKind(u32),
    /// An active-message id UCP does not use.
    UnknownAmId(u8),
    /// The output buffer cannot hold the header.
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
            WireError::Truncated { what, needed, got } => {
                write!(f, "{what}: truncated header (need {needed} bytes, got {got})")
            }
            WireError::TrailingBytes { what, expected, got } => {
                write!(f, "{what}: {got} bytes where the message has {expected}")
            }
            WireError::KeyTooLong { what, len } => {
                write!(f, "{what}: {len}-byte remote key, longer than any transport packs ({})", uct::PackedKey::MAX)
            }
            WireError::OutOfRange { what, field, value } => write!(f, "{what}: {field} {value} out of range"),
            WireError::UnknownFlags { what, flags } => write!(f, "{what}: unknown flags {flags:#04x}"),
            WireError::UnknownKind(k) => write!(f, "wireup: unknown message kind {k}"),
            WireError::UnknownAmId(id) => write!(f, "active message id {id} is not one of UCP's"),
            WireError::BufferTooSmall { needed, got } => {
                write!(f, "header of {needed} bytes does not fit a {got}-byte buffer")
            }
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

/// A protocol header: its AM id and encoding. Decoding is per type (`decode`), since the
/// caller knows the type from the AM id.
pub trait Header {
    /// The active-message id the header goes with.
    fn am_id(&self) -> u8;
    /// Encoded length in bytes.
    fn encoded_len(&self) -> usize;
    /// Writes the header at the start of `buf`; its length.
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError>;
}

/// A decoded message, by AM id.
#[derive(Debug, PartialEq, Eq)]
pub enum Msg<'a> {
    /// [`AM_WIREUP`].
    Wireup(WireupMsg<'a>),
    /// [`AM_EAGER_ONLY`]: header and payload.
    Eager(EagerHdr, &'a [u8]),
    /// [`AM_EAGER_SYNC_ONLY`].
    EagerSync(EagerSyncHdr, &'a [u8]),
    /// [`AM_EAGER_FIRST`] or [`AM_EAGER_SYNC_FIRST`].
    EagerFirst(EagerFirstHdr, &'a [u8]),
    /// [`AM_EAGER_MIDDLE`].
    EagerMiddle(EagerMiddleHdr, &'a [u8]),
    /// [`AM_SYNC_ACK`].
    SyncAck(SyncAck),
    /// [`AM_OFFLOAD_SYNC_ACK`].
    OffloadSyncAck(OffloadSyncAck),
    /// [`AM_RNDV_RTS`].
    Rts(RtsHdr),
    /// [`AM_RNDV_ATS`].
    Ats(Ats),
    /// [`AM_RNDV_RTR`].
    Rtr(RtrHdr),
    /// [`AM_RNDV_DATA`].
    RndvData(RndvDataHdr, &'a [u8]),
    /// [`AM_RNDV_ATP`].
    Atp(Atp),
    /// [`AM_RMA_PUT`].
    RmaPut(rma::PutHdr, &'a [u8]),
    /// [`AM_RMA_GET_REQ`].
    RmaGet(rma::GetReq),
    /// [`AM_RMA_GET_REP`].
    RmaGetRep(rma::GetRep, &'a [u8]),
    /// [`AM_AMO_REQ`].
    Amo(rma::AmoReq),
    /// [`AM_AMO_REP`].
    AmoRep(rma::AmoRep),
    /// [`AM_RMA_FLUSH`] or [`AM_RMA_FLUSH_REP`].
    RmaFlush(rma::FlushMsg),
    /// [`AM_AM_ONLY`]: header, user header, data.
    Am(am::AmHdr, &'a [u8], &'a [u8]),
    /// [`AM_AM_FIRST`]: header, user header, first fragment.
    AmFirst(am::AmFirstHdr, &'a [u8], &'a [u8]),
    /// [`AM_AM_MIDDLE`].
    AmMiddle(am::AmMiddleHdr, &'a [u8]),
    /// [`AM_AM_RTS`]: header, user header.
    AmRts(am::AmRtsHdr, &'a [u8]),
    /// [`AM_STREAM_DATA`]: header, bytes.
    Stream(StreamHdr, &'a [u8]),
}

impl<'a> Msg<'a> {
    /// Decodes the message that arrived with AM id `id`.
    pub fn decode(id: u8, data: &'a [u8]) -> Result<Msg<'a>, WireError> {
        Ok(match id {
            AM_WIREUP => Msg::Wireup(WireupMsg::decode(data)?),
            AM_EAGER_ONLY => {
                let (h, p) = EagerHdr::decode(data)?;
                Msg::Eager(h, p)
            }
            AM_EAGER_SYNC_ONLY => {
                let (h, p) = EagerSyncHdr::decode(data)?;
                Msg::EagerSync(h, p)
            }
            AM_EAGER_FIRST | AM_EAGER_SYNC_FIRST => {
                let (h, p) = EagerFirstHdr::decode(data, id == AM_EAGER_SYNC_FIRST)?;
                Msg::EagerFirst(h, p)
            }
            AM_EAGER_MIDDLE => {
                let (h, p) = EagerMiddleHdr::decode(data)?;
                Msg::EagerMiddle(h, p)
            }
            AM_SYNC_ACK => Msg::SyncAck(SyncAck::decode(data)?),
            AM_OFFLOAD_SYNC_ACK => Msg::OffloadSyncAck(OffloadSyncAck::decode(data)?),
            AM_RNDV_RTS => Msg::Rts(RtsHdr::decode(data)?),
            AM_RNDV_ATS => Msg::Ats(Ats::decode(data)?),
            AM_RNDV_RTR => Msg::Rtr(RtrHdr::decode(data)?),
            AM_RNDV_DATA => {
                let (h, p) = RndvDataHdr::decode(data)?;
                Msg::RndvData(h, p)
            }
            AM_RNDV_ATP => Msg::Atp(Atp::decode(data)?),
            AM_RMA_PUT => {
                let (h, p) = rma::PutHdr::decode(data)?;
                Msg::RmaPut(h, p)
            }
            AM_RMA_GET_REQ => Msg::RmaGet(rma::GetReq::decode(data)?),
            AM_RMA_GET_REP => {
                let (h, p) = rma::GetRep::decode(data)?;
                Msg::RmaGetRep(h, p)
            }
            AM_AMO_REQ => Msg::Amo(rma::AmoReq::decode(data)?),
            AM_AMO_REP => Msg::AmoRep(rma::AmoRep::decode(data)?),
            AM_RMA_FLUSH | AM_RMA_FLUSH_REP => Msg::RmaFlush(rma::FlushMsg::decode(id, data)?),
            AM_AM_ONLY => {
                let (h, u, p) = am::AmHdr::decode(data)?;
                Msg::Am(h, u, p)
            }
            AM_AM_FIRST => {
                let (h, u, p) = am::AmFirstHdr::decode(data)?;
                Msg::AmFirst(h, u, p)
            }
            AM_AM_MIDDLE => {
                let (h, p) = am::AmMiddleHdr::decode(data)?;
                Msg::AmMiddle(h, p)
            }
            AM_AM_RTS => {
                let (h, u) = am::AmRtsHdr::decode(data)?;
                Msg::AmRts(h, u)
            }
            AM_STREAM_DATA => {
                let (h, p) = StreamHdr::decode(data)?;
                Msg::Stream(h, p)
            }
            _ => return Err(WireError::UnknownAmId(id)),
        })
    }
}

/// Reads little-endian fields off the front of a message; every read names the message, so a
/// short one reports what it was.
pub(crate) struct Reader<'a> {
    what: &'static str,
    all: usize,
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads the message `what` from `buf`.
    #[inline]
    pub fn new(what: &'static str, buf: &'a [u8]) -> Self {
        Reader { what, all: buf.len(), buf }
    }

    #[inline]
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        match self.buf.split_first_chunk::<N>() {
            Some((w, rest)) => {
                self.buf = rest;
                Ok(*w)
            }
            None => Err(self.short(N)),
        }
    }

    #[cold]
    fn short(&self, n: usize) -> WireError {
        let at = self.all - self.buf.len();
        WireError::Truncated { what: self.what, needed: at + n, got: self.all }
    }

    /// The next 8 bytes.
    #[inline]
    pub fn u64(&mut self) -> Result<u64, WireError> {
        self.take().map(u64::from_le_bytes)
    }

    /// The next 4 bytes.
    #[inline]
    pub fn u32(&mut self) -> Result<u32, WireError> {
        self.take().map(u32::from_le_bytes)
    }

    /// The next 2 bytes.
    #[inline]
    pub fn u16(&mut self) -> Result<u16, WireError> {
        self.take().map(u16::from_le_bytes)
    }

    /// The next byte.
    #[inline]
    pub fn u8(&mut self) -> Result<u8, WireError> {
        self.take::<1>().map(|[b]| b)
    }

    /// The next `n` bytes.
    #[inline]
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(self.short(n));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    /// A status code (4 bytes); one UCX does not name is an error.
    pub fn status(&mut self) -> Result<Status, WireError> {
        let code = self.u32()?;
        i8::try_from(code as i32).ok().and_then(Status::from_code).ok_or(WireError::OutOfRange {
            what: self.what,
            field: "status",
            value: code as u64,
        })
    }

    /// A remote key: a 16-bit length, then the key.
    pub fn key(&mut self) -> Result<uct::PackedKey, WireError> {
        let n = self.u16()? as usize;
        if n > uct::PackedKey::MAX {
            return Err(WireError::KeyTooLong { what: self.what, len: n });
        }
        let bytes = self.bytes(n)?;
        uct::PackedKey::from_slice(bytes).map_err(|_| WireError::KeyTooLong { what: self.what, len: n })
    }

    /// Everything left (a payload).
    #[inline]
    pub fn rest(self) -> &'a [u8] {
        self.buf
    }

    /// The end of a message without payload: nothing may follow.
    pub fn end(self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(WireError::TrailingBytes { what: self.what, expected: self.all - self.buf.len(), got: self.all })
        }
    }
}

/// Writes little-endian fields into a buffer whose size the caller checked against the
/// header's `encoded_len` first (so the writes cannot fail).
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// Writes into `buf`, which must hold `need` bytes.
    #[inline]
    pub fn new(buf: &'a mut [u8], need: usize) -> Result<Self, WireError> {
        if buf.len() < need {
            return Err(WireError::BufferTooSmall { needed: need, got: buf.len() });
        }
        Ok(Writer { buf, pos: 0 })
    }

    /// Appends bytes.
    #[inline]
    pub fn put(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }

    /// Appends a word.
    #[inline]
    pub fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }

    /// Appends a remote key with its 16-bit length.
    #[inline]
    pub fn key(&mut self, k: &uct::PackedKey) {
        self.put(&(k.len() as u16).to_le_bytes());
        self.put(k);
    }

    /// Bytes written.
    #[inline]
    pub fn done(self) -> usize {
        self.pos
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Checks the contract of a header type on one value: it encodes to `encoded_len` bytes,
    /// decodes back to itself with the payload after it, fails cleanly on every truncation and
    /// on a buffer one byte too small.
    pub fn round_trip<H: Header + PartialEq + fmt::Debug>(
        h: &H,
        payload: &[u8],
        decode: impl Fn(&[u8]) -> Result<(H, &[u8]), WireError>,
    ) {
        let n = h.encoded_len();
        let mut buf = vec![0u8; n + payload.len()];
        assert_eq!(h.encode(&mut buf), Ok(n));
        buf[n..].copy_from_slice(payload);
        let (back, rest) = decode(&buf).unwrap();
        assert_eq!(&back, h);
        assert_eq!(rest, payload);
        for cut in 0..n {
            assert!(matches!(decode(&buf[..cut]), Err(WireError::Truncated { .. })), "cut at {cut}");
        }
        assert_eq!(h.encode(&mut vec![0u8; n - 1]), Err(WireError::BufferTooSmall { needed: n, got: n - 1 }));
    }

    #[test]
    fn every_id_has_a_name_and_unknown_ids_fail() {
        for id in ALL_AM_IDS {
            assert_ne!(am_name(id), "unknown");
        }
        assert_eq!(Msg::decode(0, &[]), Err(WireError::UnknownAmId(0)));
        assert_eq!(Msg::decode(26, &[0; 64]), Err(WireError::UnknownAmId(26)));
    }

    #[test]
    fn errors_name_the_message() {
        let e = Msg::decode(AM_RNDV_ATS, &[1, 2, 3]).unwrap_err();
        assert_eq!(e, WireError::Truncated { what: "rndv ats", needed: 8, got: 3 });
        assert_eq!(e.to_string(), "rndv ats: truncated header (need 8 bytes, got 3)");
        assert_eq!(Status::from(e), Status::InvalidParam);
    }

    proptest! {
        #[test]
        fn decoding_anything_never_panics(id in 0u8..28, bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = Msg::decode(id, &bytes);
        }
    }
}
