//! The wireup message: connection request, reply and acknowledgement.
//!
//! ```text
//! kind u32   conn_sn u32   src_uuid u64   src_ep u64   dst_ep u64
//! worker address: len u32 + bytes (REQUEST; empty otherwise)
//! count u8, then per lane: sender iface u8, receiver iface u8, len u16 + endpoint address
//! ```

use super::{Header, Reader, WireError, Writer, AM_WIREUP};

/// Kind of a connection request carrying the sender's full worker address and the addresses of
/// its endpoint-to-endpoint lanes.
pub const REQUEST: u8 = 1;
/// Kind of the reply carrying the replier's endpoint id and endpoint addresses; sent after the
/// replier connected its lanes to the requester's.
pub const REPLY: u8 = 2;
/// Kind of the requester's acknowledgement: it connected its endpoint-to-endpoint lanes too,
/// the replier may use them.
pub const ACK: u8 = 3;

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

/// A wireup message (decoded, or to encode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireupMsg<'a> {
    /// [`REQUEST`], `REPLY` or `ACK`.
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
    /// Encoded endpoint addresses (see [`WireupMsg::ep_addrs`]): validated by `decode`, made
    /// by [`WireupMsg::encode_ep_addrs`]; empty for none.
    pub ep_addrs: &'a [u8],
}

impl<'a> WireupMsg<'a> {
    /// Fixed part: kind (padded to 4), conn_sn, uuid, src ep, dst ep.
    pub const FIXED: usize = 4 + 4 + 8 + 8 + 8;

    /// Decodes a whole message: an unknown kind, a length past the end or bytes after the last
    /// endpoint address are errors.
    pub fn decode(data: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new("wireup", data);
        let raw_kind = r.u32()?;
        let kind = u8::try_from(raw_kind)
            .ok()
            .filter(|k| (REQUEST..=ACK).contains(k))
            .ok_or(WireError::UnknownKind(raw_kind))?;
        let conn_sn = r.u32()?;
        let src_uuid = r.u64()?;
        let src_ep = r.u64()?;
        let dst_ep = r.u64()?;
        let alen = r.u32()? as usize;
        let address = r.bytes(alen)?;
        let ep_addrs = r.rest();
        // Walk the entries once: afterwards iteration cannot fail.
        let mut e = Reader::new("wireup endpoint addresses", ep_addrs);
        for _ in 0..e.u8()? {
            e.u16()?;
            let n = e.u16()? as usize;
            e.bytes(n)?;
        }
        e.end()?;
        Ok(WireupMsg { kind, conn_sn, src_uuid, src_ep, dst_ep, address, ep_addrs })
    }

    /// The endpoint addresses.
    pub fn ep_addrs(&self) -> impl Iterator<Item = EpAddr<'a>> {
        let mut r = Reader::new("wireup endpoint addresses", self.ep_addrs);
        let n = r.u8().unwrap_or(0);
        (0..n).map_while(move |_| {
            let sender_iface = r.u8().ok()?;
            let receiver_iface = r.u8().ok()?;
            let len = r.u16().ok()? as usize;
            Some(EpAddr { sender_iface, receiver_iface, addr: r.bytes(len).ok()? })
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
}

impl Header for WireupMsg<'_> {
    fn am_id(&self) -> u8 {
        AM_WIREUP
    }
    fn encoded_len(&self) -> usize {
        Self::FIXED + 4 + self.address.len() + self.ep_addrs.len().max(1)
    }
    fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut w = Writer::new(buf, self.encoded_len())?;
        w.put(&(self.kind as u32).to_le_bytes());
        w.put(&self.conn_sn.to_le_bytes());
        w.u64(self.src_uuid);
        w.u64(self.src_ep);
        w.u64(self.dst_ep);
        w.put(&(self.address.len() as u32).to_le_bytes());
        w.put(self.address);
        w.put(if self.ep_addrs.is_empty() { &[0] } else { self.ep_addrs });
        Ok(w.done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wireup_round_trip_and_garbage() {
        let eps = [
            EpAddr { sender_iface: 3, receiver_iface: 4, addr: b"qp-1" },
            EpAddr { sender_iface: 0, receiver_iface: 9, addr: b"" },
        ];
        let enc = WireupMsg::encode_ep_addrs(&eps).unwrap();
        let m =
            WireupMsg { kind: REQUEST, conn_sn: 7, src_uuid: 1, src_ep: 2, dst_ep: 3, address: b"abc", ep_addrs: &enc };
        let mut buf = [0u8; 128];
        let n = m.encode(&mut buf).unwrap();
        let p = WireupMsg::decode(&buf[..n]).unwrap();
        assert_eq!(p, m);
        assert_eq!(p.ep_addrs().collect::<Vec<_>>(), eps);
        for cut in 0..n {
            assert!(WireupMsg::decode(&buf[..cut]).is_err(), "truncated at {cut}");
        }
        let mut longer = buf[..n].to_vec();
        longer.push(0);
        assert!(matches!(WireupMsg::decode(&longer), Err(WireError::TrailingBytes { .. })), "trailing byte");
        buf[0] = 9;
        assert_eq!(WireupMsg::decode(&buf[..n]), Err(WireError::UnknownKind(9)));
        assert!(m.encode(&mut [0u8; 10]).is_err());
        // No endpoint addresses: one count byte.
        let ack = WireupMsg { kind: ACK, ep_addrs: &[], address: &[], ..m };
        let n = ack.encode(&mut buf).unwrap();
        assert_eq!(n, WireupMsg::FIXED + 4 + 1);
        assert_eq!(WireupMsg::decode(&buf[..n]).unwrap().ep_addrs().count(), 0);
    }

    proptest! {
        #[test]
        fn wireup_round_trips(
            kind in REQUEST..=ACK, conn_sn in any::<u32>(), src_uuid in any::<u64>(), src_ep in any::<u64>(),
            dst_ep in any::<u64>(), address in proptest::collection::vec(any::<u8>(), 0..64),
            lanes in proptest::collection::vec((any::<u8>(), any::<u8>(), proptest::collection::vec(any::<u8>(), 0..20)), 0..4),
        ) {
            let list: Vec<EpAddr<'_>> =
                lanes.iter().map(|(s, r, a)| EpAddr { sender_iface: *s, receiver_iface: *r, addr: a }).collect();
            let enc = if list.is_empty() { Vec::new() } else { WireupMsg::encode_ep_addrs(&list).unwrap() };
            let m = WireupMsg { kind, conn_sn, src_uuid, src_ep, dst_ep, address: &address, ep_addrs: &enc };
            let mut buf = vec![0u8; m.encoded_len()];
            m.encode(&mut buf).unwrap();
            let back = WireupMsg::decode(&buf).unwrap();
            prop_assert_eq!(back.ep_addrs().collect::<Vec<_>>(), list);
            prop_assert_eq!((back.kind, back.conn_sn, back.src_uuid, back.src_ep, back.dst_ep, back.address),
                (kind, conn_sn, src_uuid, src_ep, dst_ep, &address[..]));
            // Every truncation fails cleanly.
            for cut in 0..buf.len() {
                prop_assert!(WireupMsg::decode(&buf[..cut]).is_err());
            }
        }
    }
}
