//! Wire formats of UCP's active messages: ids, headers, and strict parsing.
//!
//! Every header is a fixed sequence of little-endian words after the uct AM id. A message too
//! short for its header, or with a length field that disagrees with the bytes present, parses
//! to `None`; the caller logs it and drops the message. Peers are never trusted: ids in headers
//! are looked up in generation-checked tables, offsets are bounds-checked against the request.
//!
//! `ep` fields hold the *receiver's* endpoint id for the sender (learned during wireup), so the
//! receiver can reply on the right endpoint. `sreq`/`rreq` are request ids of the sender and
//! the receiver.

/// Wireup: connection request and reply.
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

/// Every AM id UCP uses, for handler registration.
pub const ALL_AM_IDS: [u8; 12] = [
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
        _ => "unknown",
    }
}

/// Reads little-endian words off the front of a message.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads from `buf`.
    #[inline]
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    #[inline]
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (w, rest) = self.buf.split_first_chunk::<N>()?;
        self.buf = rest;
        Some(*w)
    }

    /// The next 8 bytes.
    #[inline]
    pub fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    /// The next 4 bytes.
    #[inline]
    pub fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    /// The next 2 bytes.
    #[inline]
    pub fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }

    /// The next byte.
    #[inline]
    pub fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }

    /// The next `n` bytes.
    #[inline]
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Some(a)
    }

    /// Everything left.
    #[inline]
    pub fn rest(self) -> &'a [u8] {
        self.buf
    }
}

/// Writes little-endian words into a transport buffer. A write that does not fit writes
/// nothing and returns false; `written` reports how far it got.
pub struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// Writes into `buf`.
    #[inline]
    pub fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }

    /// Appends bytes; returns false (writing nothing) when they do not fit.
    #[inline]
    pub fn put(&mut self, b: &[u8]) -> bool {
        match self.buf.get_mut(self.pos..self.pos + b.len()) {
            Some(d) => {
                d.copy_from_slice(b);
                self.pos += b.len();
                true
            }
            None => false,
        }
    }

    /// Appends a word.
    #[inline]
    pub fn u64(&mut self, v: u64) -> bool {
        self.put(&v.to_le_bytes())
    }

    /// The unwritten tail, to fill directly.
    #[inline]
    pub fn tail(&mut self) -> &mut [u8] {
        &mut self.buf[self.pos..]
    }

    /// Bytes written so far.
    #[inline]
    pub fn written(&self) -> usize {
        self.pos
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
    /// Rndv data: rreq, offset.
    pub const RNDV_DATA: usize = 16;
}

/// RTS flag: the sender's buffer is contiguous (it can be the source of a put).
pub const RTS_FLAG_CONTIG: u8 = 1;

/// Wireup message types.
pub mod wireup {
    /// A connection request carrying the sender's full worker address and the addresses of its
    /// endpoint-to-endpoint lanes.
    pub const REQUEST: u8 = 1;
    /// The reply carrying the replier's endpoint id and endpoint addresses; sent after the
    /// replier connected its lanes to the requester's.
    pub const REPLY: u8 = 2;
    /// The requester connected its endpoint-to-endpoint lanes too: the replier may use them.
    pub const ACK: u8 = 3;
}

/// The address of one endpoint-to-endpoint lane in a wireup message: which interface record of
/// the sender's address it belongs to, which record of the receiver's address it connects to,
/// and the transport's endpoint address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpAddr<'a> {
    /// Index of the sender's interface record.
    pub sender_iface: u8,
    /// Index of the receiver's interface record.
    pub receiver_iface: u8,
    /// The transport endpoint's address.
    pub addr: &'a [u8],
}

/// A parsed wireup message.
///
/// ```text
/// kind u32   conn_sn u32   src_uuid u64   src_ep u64   dst_ep u64
/// worker address: len u32 + bytes (REQUEST; empty otherwise)
/// count u8, then per lane: sender iface u8, receiver iface u8, len u16 + endpoint address
/// ```
#[derive(Debug)]
pub struct WireupMsg<'a> {
    /// `wireup::REQUEST`, `REPLY` or `ACK`.
    pub kind: u8,
    /// Connection sequence number, matching endpoints created towards each other.
    pub conn_sn: u32,
    /// Sender worker's uuid.
    pub src_uuid: u64,
    /// Sender's endpoint id.
    pub src_ep: u64,
    /// Receiver's endpoint id (reply and ack).
    pub dst_ep: u64,
    /// Sender's packed worker address (request only).
    pub address: &'a [u8],
    /// Encoded endpoint addresses, validated by `parse` (see [`WireupMsg::ep_addrs`]).
    pub ep_addrs: &'a [u8],
}

impl<'a> WireupMsg<'a> {
    /// Fixed part: kind (padded to 4), conn_sn, uuid, src ep, dst ep.
    pub const FIXED: usize = 4 + 4 + 8 + 8 + 8;

    /// Parses; `None` when malformed (unknown kind, a length past the end, trailing bytes).
    pub fn parse(data: &'a [u8]) -> Option<Self> {
        let mut r = Reader::new(data);
        let kind = u8::try_from(r.u32()?).ok().filter(|k| (wireup::REQUEST..=wireup::ACK).contains(k))?;
        let conn_sn = r.u32()?;
        let src_uuid = r.u64()?;
        let src_ep = r.u64()?;
        let dst_ep = r.u64()?;
        let alen = r.u32()? as usize;
        let address = r.bytes(alen)?;
        let ep_addrs = r.rest();
        // Walk the entries once: afterwards iteration cannot fail.
        let mut e = Reader::new(ep_addrs);
        for _ in 0..e.u8()? {
            e.u16()?;
            let n = e.u16()? as usize;
            e.bytes(n)?;
        }
        if !e.rest().is_empty() {
            return None;
        }
        Some(WireupMsg { kind, conn_sn, src_uuid, src_ep, dst_ep, address, ep_addrs })
    }

    /// The endpoint addresses.
    pub fn ep_addrs(&self) -> impl Iterator<Item = EpAddr<'a>> {
        let mut r = Reader::new(self.ep_addrs);
        let n = r.u8().unwrap_or(0);
        (0..n).map_while(move |_| {
            let sender_iface = r.u8()?;
            let receiver_iface = r.u8()?;
            let len = r.u16()? as usize;
            Some(EpAddr { sender_iface, receiver_iface, addr: r.bytes(len)? })
        })
    }

    /// Encodes endpoint addresses for [`WireupMsg::ep_addrs`]; `None` when there are more
    /// than 255 or one is longer than 65535 bytes.
    pub fn encode_ep_addrs(list: &[EpAddr<'_>]) -> Option<Vec<u8>> {
        let mut out = vec![u8::try_from(list.len()).ok()?];
        for e in list {
            out.extend_from_slice(&[e.sender_iface, e.receiver_iface]);
            out.extend_from_slice(&u16::try_from(e.addr.len()).ok()?.to_le_bytes());
            out.extend_from_slice(e.addr);
        }
        Some(out)
    }

    /// Packs into `buf`; returns the length or `None` if it does not fit. `ep_addrs` must be
    /// empty or come from [`WireupMsg::encode_ep_addrs`].
    pub fn pack(&self, buf: &mut [u8]) -> Option<usize> {
        let mut w = Writer::new(buf);
        let ok = w.put(&(self.kind as u32).to_le_bytes())
            && w.put(&self.conn_sn.to_le_bytes())
            && w.u64(self.src_uuid)
            && w.u64(self.src_ep)
            && w.u64(self.dst_ep)
            && w.put(&u32::try_from(self.address.len()).ok()?.to_le_bytes())
            && w.put(self.address)
            && w.put(if self.ep_addrs.is_empty() { &[0] } else { self.ep_addrs });
        ok.then(|| w.written())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wireup_round_trip_and_garbage() {
        let eps = [
            EpAddr { sender_iface: 3, receiver_iface: 4, addr: b"qp-1" },
            EpAddr { sender_iface: 0, receiver_iface: 9, addr: b"" },
        ];
        let enc = WireupMsg::encode_ep_addrs(&eps).unwrap();
        let m = WireupMsg {
            kind: wireup::REQUEST,
            conn_sn: 7,
            src_uuid: 1,
            src_ep: 2,
            dst_ep: 3,
            address: b"abc",
            ep_addrs: &enc,
        };
        let mut buf = [0u8; 128];
        let n = m.pack(&mut buf).unwrap();
        let p = WireupMsg::parse(&buf[..n]).unwrap();
        assert_eq!((p.kind, p.conn_sn, p.src_uuid, p.src_ep, p.dst_ep, p.address), (1, 7, 1, 2, 3, &b"abc"[..]));
        assert_eq!(p.ep_addrs().collect::<Vec<_>>(), eps);
        for cut in 0..n {
            assert!(WireupMsg::parse(&buf[..cut]).is_none(), "truncated at {cut}");
        }
        let mut longer = buf[..n].to_vec();
        longer.push(0);
        assert!(WireupMsg::parse(&longer).is_none(), "trailing byte");
        buf[0] = 9;
        assert!(WireupMsg::parse(&buf[..n]).is_none());
        assert!(m.pack(&mut [0u8; 10]).is_none());
        // No endpoint addresses: one count byte.
        let ack = WireupMsg { kind: wireup::ACK, ep_addrs: &[], address: &[], ..m };
        let n = ack.pack(&mut buf).unwrap();
        assert_eq!(n, WireupMsg::FIXED + 4 + 1);
        assert_eq!(WireupMsg::parse(&buf[..n]).unwrap().ep_addrs().count(), 0);
    }

    #[test]
    fn reader_stops_at_the_end() {
        let mut r = Reader::new(&[1, 0, 0, 0, 0, 0, 0, 0, 5]);
        assert_eq!(r.u64(), Some(1));
        assert_eq!(r.u64(), None);
        assert_eq!(r.u8(), Some(5));
        assert_eq!(r.bytes(1), None);
    }
}
