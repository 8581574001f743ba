//! What UCP puts in a connection manager's private data when a client connects by socket
//! address (`uct::cm`): the client's worker address and the connection number its endpoint
//! will use; the server answers with its own worker address.
//!
//! ```text
//! client -> server: version (1) | 0 0 0 | conn_sn (u32 LE) | client worker address (packed)
//! server -> client: version (1) | 0 0 0 | conn_sn (u32 LE) | server worker address (packed)
//! ```
//!
//! Then the client's endpoint sends the ordinary wireup request with that connection number
//! over the lanes both workers share, and the server's endpoint, created for the request and
//! waiting under (client, connection number), answers it: from there on it is the wireup of
//! endpoints created by worker address. Connection numbers of socket-address endpoints have
//! the top bit set, so they never meet the numbers of endpoints created by address.

use ucs::{Status, UcsResult};

use super::address::WorkerAddress;

/// Version of the private data layout.
pub const VERSION: u8 = 1;
/// Bytes before the worker address.
pub const HDR: usize = 8;
/// The bit every socket-address connection number has.
pub const SN_BIT: u32 = 1 << 31;

/// Packs a connect's or an accept's private data.
pub fn pack(conn_sn: u32, packed_address: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HDR + packed_address.len());
    v.extend_from_slice(&[VERSION, 0, 0, 0]);
    v.extend_from_slice(&conn_sn.to_le_bytes());
    v.extend_from_slice(packed_address);
    v
}

/// Unpacks private data a peer sent: the connection number and the peer's worker address,
/// validated (a bad version, a number without [`SN_BIT`], a malformed address: `InvalidAddr`).
pub fn unpack(data: &[u8]) -> UcsResult<(u32, WorkerAddress)> {
    if data.len() < HDR {
        tracing::debug!(len = data.len(), "ucp sockaddr: private data shorter than its header");
        return Err(Status::InvalidAddr);
    }
    if data[0] != VERSION || data[1..4] != [0, 0, 0] {
        tracing::debug!(version = data[0], "ucp sockaddr: private data of another version");
        return Err(Status::InvalidAddr);
    }
    let sn = u32::from_le_bytes(data[4..8].try_into().expect("4 bytes"));
    if sn & SN_BIT == 0 {
        tracing::debug!(sn, "ucp sockaddr: a connection number without the socket-address bit");
        return Err(Status::InvalidAddr);
    }
    let addr = WorkerAddress::unpack(&data[HDR..]).inspect_err(|e| {
        tracing::debug!("ucp sockaddr: the peer's worker address is malformed: {e}");
    })?;
    Ok((sn, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some_address() -> Vec<u8> {
        WorkerAddress { uuid: 7, name: "w".into(), ifaces: Vec::new() }.pack().unwrap()
    }

    #[test]
    fn round_trip() {
        let a = some_address();
        let (sn, w) = unpack(&pack(SN_BIT | 5, &a)).unwrap();
        assert_eq!(sn, SN_BIT | 5);
        assert_eq!(w.uuid, 7);
    }

    #[test]
    fn bad_input_is_refused() {
        let a = some_address();
        let good = pack(SN_BIT | 5, &a);
        for cut in 0..good.len() {
            assert!(unpack(&good[..cut]).is_err(), "truncated at {cut}");
        }
        let mut v = good.clone();
        v[0] = 2;
        assert_eq!(unpack(&v).unwrap_err(), Status::InvalidAddr);
        assert_eq!(unpack(&pack(5, &a)).unwrap_err(), Status::InvalidAddr);
        let mut v = good;
        v.extend_from_slice(&[0xff; 3]);
        // Trailing bytes after a valid address: refused or ignored, never a panic.
        let _ = unpack(&v);
    }
}
