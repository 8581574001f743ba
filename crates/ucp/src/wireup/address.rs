//! The packed worker address: what one worker gives another (out of band) to connect.
//!
//! Layout (little endian), version 2:
//!
//! ```text
//! magic  u16 = 0x5541 ("UA")   version u8 = 2   record count u8
//! uuid   u64                   name: len u8 + UTF-8 bytes
//! per record:
//!   tl name: len u8 + bytes    dev name: len u8 + bytes    dev type u8
//!   usage u8 (0: communication, 1: wireup only)   iface flags u64            latency (ns) f64   bandwidth (B/s) f64   overhead (ns) f64
//!   dev address: len u16 + bytes      iface address: len u16 + bytes
//! ```
//!
//! Both peers select lanes from the same records (their own and the peer's), so the choice is
//! the same on both sides. Unpacking checks every length and field and rejects trailing bytes.

use ucs::{Status, UcsResult};
use uct::{DeviceType, IfaceFlags};

const MAGIC: u16 = 0x5541;
/// Current address format version.
pub const ADDRESS_VERSION: u8 = 2;
/// At most this many records in one address.
pub const MAX_RECORDS: usize = 64;

/// One transport interface of a worker, as the address describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct IfaceRecord {
    /// Transport name, e.g. `posix`.
    pub tl_name: String,
    /// Device name, e.g. `memory`.
    pub dev_name: String,
    /// Kind of device.
    pub dev_type: DeviceType,
    /// Only for wireup messages of other transports (`:aux` in a `UCX_TLS` alias): never a
    /// data lane, on either side.
    pub aux: bool,
    /// The interface's capability flags.
    pub flags: IfaceFlags,
    /// Latency model, nanoseconds.
    pub latency_ns: f64,
    /// Bandwidth model, bytes per second.
    pub bandwidth: f64,
    /// Per-message software overhead, nanoseconds.
    pub overhead_ns: f64,
    /// Device address.
    pub dev_addr: Vec<u8>,
    /// Interface address (empty for transports that connect endpoint to endpoint).
    pub iface_addr: Vec<u8>,
}

/// A worker's address.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerAddress {
    /// Unique id of the worker.
    pub uuid: u64,
    /// Name for diagnostics.
    pub name: String,
    /// One record per interface.
    pub ifaces: Vec<IfaceRecord>,
}

fn dev_type_code(t: DeviceType) -> u8 {
    match t {
        DeviceType::Net => 0,
        DeviceType::Shm => 1,
        DeviceType::Acc => 2,
        DeviceType::SelfDev => 3,
    }
}

fn dev_type_from(c: u8) -> Option<DeviceType> {
    Some(match c {
        0 => DeviceType::Net,
        1 => DeviceType::Shm,
        2 => DeviceType::Acc,
        3 => DeviceType::SelfDev,
        _ => return None,
    })
}

impl WorkerAddress {
    /// Packs the address. Fails (`InvalidParam`) when a name is longer than 255 bytes, an
    /// address longer than 65535 bytes, or there are more than [`MAX_RECORDS`] records.
    pub fn pack(&self) -> UcsResult<Vec<u8>> {
        if self.ifaces.len() > MAX_RECORDS {
            return Err(Status::InvalidParam);
        }
        let mut out = Vec::with_capacity(64 + self.ifaces.len() * 96);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.push(ADDRESS_VERSION);
        out.push(self.ifaces.len() as u8);
        out.extend_from_slice(&self.uuid.to_le_bytes());
        put_str(&mut out, &self.name)?;
        for r in &self.ifaces {
            put_str(&mut out, &r.tl_name)?;
            put_str(&mut out, &r.dev_name)?;
            out.push(dev_type_code(r.dev_type));
            out.push(r.aux as u8);
            out.extend_from_slice(&r.flags.bits().to_le_bytes());
            for v in [r.latency_ns, r.bandwidth, r.overhead_ns] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            put_blob(&mut out, &r.dev_addr)?;
            put_blob(&mut out, &r.iface_addr)?;
        }
        Ok(out)
    }

    /// Unpacks and validates an address from a peer.
    pub fn unpack(bytes: &[u8]) -> UcsResult<WorkerAddress> {
        let mut r = Reader { b: bytes, what: "worker address" };
        if r.u16()? != MAGIC {
            return Err(r.bad("not a worker address (bad magic)"));
        }
        let version = r.u8()?;
        if version != ADDRESS_VERSION {
            tracing::warn!("worker address version {version}, expected {ADDRESS_VERSION}");
            return Err(Status::Unsupported);
        }
        let n = r.u8()? as usize;
        if n > MAX_RECORDS {
            return Err(r.bad("too many interface records"));
        }
        let uuid = r.u64()?;
        let name = r.string()?;
        let mut ifaces = Vec::with_capacity(n);
        for _ in 0..n {
            let tl_name = r.string()?;
            let dev_name = r.string()?;
            if tl_name.is_empty() {
                return Err(r.bad("empty transport name"));
            }
            let dev_type = dev_type_from(r.u8()?).ok_or_else(|| r.bad("unknown device type"))?;
            let aux = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(r.bad("unknown interface usage")),
            };
            let flags = IfaceFlags::from_bits_retain(r.u64()?);
            let latency_ns = r.f64()?;
            let bandwidth = r.f64()?;
            let overhead_ns = r.f64()?;
            let sane = |v: f64, min_exclusive: bool| v.is_finite() && if min_exclusive { v > 0.0 } else { v >= 0.0 };
            if !(sane(latency_ns, false) && sane(bandwidth, true) && sane(overhead_ns, false)) {
                return Err(r.bad("performance model out of range"));
            }
            let dev_addr = r.blob()?;
            let iface_addr = r.blob()?;
            ifaces.push(IfaceRecord {
                tl_name,
                dev_name,
                dev_type,
                aux,
                flags,
                latency_ns,
                bandwidth,
                overhead_ns,
                dev_addr,
                iface_addr,
            });
        }
        if !r.b.is_empty() {
            return Err(r.bad("trailing bytes"));
        }
        Ok(WorkerAddress { uuid, name, ifaces })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) -> UcsResult<()> {
    let n = u8::try_from(s.len()).map_err(|_| Status::InvalidParam)?;
    out.push(n);
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_blob(out: &mut Vec<u8>, b: &[u8]) -> UcsResult<()> {
    let n = u16::try_from(b.len()).map_err(|_| Status::InvalidParam)?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(b);
    Ok(())
}

/// A bounds-checked reader over bytes from a peer.
struct Reader<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl Reader<'_> {
    fn bad(&self, why: &str) -> Status {
        tracing::warn!("rejected {}: {why}", self.what);
        Status::InvalidParam
    }

    fn take(&mut self, n: usize) -> UcsResult<&[u8]> {
        if self.b.len() < n {
            return Err(self.bad("truncated"));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u8(&mut self) -> UcsResult<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> UcsResult<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u64(&mut self) -> UcsResult<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn f64(&mut self) -> UcsResult<f64> {
        Ok(f64::from_bits(self.u64()?))
    }

    fn string(&mut self) -> UcsResult<String> {
        let n = self.u8()? as usize;
        let b = self.take(n)?.to_vec();
        String::from_utf8(b).map_err(|_| self.bad("name is not UTF-8"))
    }

    fn blob(&mut self) -> UcsResult<Vec<u8>> {
        let n = self.u16()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> WorkerAddress {
        WorkerAddress {
            uuid: 0x1234_5678_9abc_def0,
            name: "host:42".into(),
            ifaces: vec![
                IfaceRecord {
                    tl_name: "posix".into(),
                    dev_name: "memory".into(),
                    dev_type: DeviceType::Shm,
                    aux: false,
                    flags: IfaceFlags::AM_SHORT | IfaceFlags::CONNECT_TO_IFACE,
                    latency_ns: 80.0,
                    bandwidth: 12e9,
                    overhead_ns: 10.0,
                    dev_addr: vec![1, 2, 3, 4, 5, 6, 7, 8],
                    iface_addr: vec![9; 30],
                },
                IfaceRecord {
                    tl_name: "self".into(),
                    dev_name: "memory0".into(),
                    dev_type: DeviceType::SelfDev,
                    aux: true,
                    flags: IfaceFlags::AM_BCOPY,
                    latency_ns: 0.0,
                    bandwidth: 6e9,
                    overhead_ns: 10.0,
                    dev_addr: vec![],
                    iface_addr: vec![7; 8],
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let a = sample();
        assert_eq!(WorkerAddress::unpack(&a.pack().unwrap()).unwrap(), a);
    }

    #[test]
    fn every_truncation_and_extension_is_rejected() {
        let p = sample().pack().unwrap();
        for cut in 0..p.len() {
            assert!(WorkerAddress::unpack(&p[..cut]).is_err(), "truncated at {cut}");
        }
        let mut longer = p.clone();
        longer.push(0);
        assert!(WorkerAddress::unpack(&longer).is_err());
    }

    #[test]
    fn version_and_magic() {
        let mut p = sample().pack().unwrap();
        p[2] = ADDRESS_VERSION + 1;
        assert_eq!(WorkerAddress::unpack(&p), Err(Status::Unsupported));
        p[2] = ADDRESS_VERSION;
        p[0] ^= 1;
        assert_eq!(WorkerAddress::unpack(&p), Err(Status::InvalidParam));
    }
}
