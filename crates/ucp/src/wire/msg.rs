//! The messages the engine sends, as the headers above: a header of a message that carries
//! data (eager and rendezvous fragments), and control messages (wireup, sync ack, ATS, ATP).

use std::rc::Rc;

use super::{Header, WireError, WireupMsg};
use crate::dt::UserBuf;
use crate::wire;

/// The user header of an active message: the caller's bytes, read when the header is packed
/// (valid until the send completes: the contract of the send's `unsafe` constructor).
#[derive(Clone, Copy, Debug)]
pub(crate) struct UserHdr(pub UserBuf);

impl PartialEq for UserHdr {
    fn eq(&self, o: &UserHdr) -> bool {
        self.0.contig_seg() == o.0.contig_seg() && self.0.len() == o.0.len()
    }
}

impl Eq for UserHdr {}

impl UserHdr {
    /// Its length.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}

/// The header of a message that carries data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DataHdr {
    Eager(wire::EagerHdr),
    EagerSync(wire::EagerSyncHdr),
    First(wire::EagerFirstHdr),
    Middle(wire::EagerMiddleHdr),
    RndvData(wire::RndvDataHdr),
    /// An emulated put.
    RmaPut(wire::rma::PutHdr),
    /// A whole active message and its user header.
    Am(wire::am::AmHdr, UserHdr),
    /// The first fragment of an active message and its user header.
    AmFirst(wire::am::AmFirstHdr, UserHdr),
    /// A later fragment of an active message.
    AmMiddle(wire::am::AmMiddleHdr),
    /// Bytes of a stream.
    Stream(wire::StreamHdr),
}

impl DataHdr {
    fn inner(&self) -> &dyn Header {
        match self {
            DataHdr::Eager(h) => h,
            DataHdr::EagerSync(h) => h,
            DataHdr::First(h) => h,
            DataHdr::Middle(h) => h,
            DataHdr::RndvData(h) => h,
            DataHdr::RmaPut(h) => h,
            DataHdr::Am(h, _) => h,
            DataHdr::AmFirst(h, _) => h,
            DataHdr::AmMiddle(h) => h,
            DataHdr::Stream(h) => h,
        }
    }

    /// The user header an active message carries after its fixed header.
    #[inline]
    fn user(&self) -> Option<&UserHdr> {
        match self {
            DataHdr::Am(_, u) | DataHdr::AmFirst(_, u) => Some(u),
            _ => None,
        }
    }
}

impl Header for DataHdr {
    #[inline]
    fn am_id(&self) -> u8 {
        self.inner().am_id()
    }
    #[inline]
    fn encoded_len(&self) -> usize {
        self.inner().encoded_len() + self.user().map_or(0, UserHdr::len)
    }
    #[inline]
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        match self {
            // The common one without the indirection.
            DataHdr::Eager(h) => h.encode(buf),
            DataHdr::Am(_, u) | DataHdr::AmFirst(_, u) => {
                let need = self.encoded_len();
                if buf.len() < need {
                    return Err(WireError::BufferTooSmall { needed: need, got: buf.len() });
                }
                let n = self.inner().encode(buf)?;
                // (Within the caller's header: its length is the one the fixed part names.)
                u.0.copy_out(0, &mut buf[n..need]).map_err(|_| WireError::BufferTooSmall { needed: need, got: n })?;
                Ok(need)
            }
            h => h.inner().encode(buf),
        }
    }
}

/// A wireup message to send, owning what [`WireupMsg`] borrows.
#[derive(Debug, Clone)]
pub(crate) struct WireupOut {
    pub kind: u8,
    pub conn_sn: u32,
    pub src_uuid: u64,
    pub src_ep: u64,
    pub dst_ep: u64,
    /// The sender's packed worker address (requests).
    pub with_address: Option<Rc<[u8]>>,
    /// Encoded by `WireupMsg::encode_ep_addrs` (empty: none).
    pub ep_addrs: Vec<u8>,
}

impl WireupOut {
    /// The message as it goes on the wire.
    pub fn msg(&self) -> WireupMsg<'_> {
        WireupMsg {
            kind: self.kind,
            conn_sn: self.conn_sn,
            src_uuid: self.src_uuid,
            src_ep: self.src_ep,
            dst_ep: self.dst_ep,
            address: self.with_address.as_deref().unwrap_or(&[]),
            ep_addrs: &self.ep_addrs,
        }
    }
}

/// A control message (no data), queued on its endpoint when the lane is full.
#[derive(Debug, Clone)]
pub(crate) enum Ctrl {
    Wireup(WireupOut),
    SyncAck(wire::SyncAck),
    OffloadSyncAck(wire::OffloadSyncAck),
    Ats(wire::Ats),
    Atp(wire::Atp),
    RmaGet(wire::rma::GetReq),
    Amo(wire::rma::AmoReq),
    AmoRep(wire::rma::AmoRep),
    RmaFlush(wire::rma::FlushMsg),
}

impl Ctrl {
    /// The message's name, for logs.
    pub fn name(&self) -> &'static str {
        wire::am_name(self.am_id())
    }

    /// Its AM id.
    pub fn am_id(&self) -> u8 {
        match self {
            Ctrl::Wireup(_) => wire::AM_WIREUP,
            Ctrl::SyncAck(h) => h.am_id(),
            Ctrl::OffloadSyncAck(h) => h.am_id(),
            Ctrl::Ats(h) => h.am_id(),
            Ctrl::Atp(h) => h.am_id(),
            Ctrl::RmaGet(h) => h.am_id(),
            Ctrl::Amo(h) => h.am_id(),
            Ctrl::AmoRep(h) => h.am_id(),
            Ctrl::RmaFlush(h) => h.am_id(),
        }
    }

    /// Encodes the message into a transport buffer.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        match self {
            Ctrl::Wireup(w) => w.msg().encode(buf),
            Ctrl::SyncAck(h) => h.encode(buf),
            Ctrl::OffloadSyncAck(h) => h.encode(buf),
            Ctrl::Ats(h) => h.encode(buf),
            Ctrl::Atp(h) => h.encode(buf),
            Ctrl::RmaGet(h) => h.encode(buf),
            Ctrl::Amo(h) => h.encode(buf),
            Ctrl::AmoRep(h) => h.encode(buf),
            Ctrl::RmaFlush(h) => h.encode(buf),
        }
    }
}
