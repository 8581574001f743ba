//! Fuzzing the worker-address unpacker with proptest: arbitrary bytes and mutated valid
//! addresses never panic, and whatever unpacks packs back to the same bytes.

use proptest::prelude::*;
use ucp::{IfaceRecord, WorkerAddress};
use uct::{DeviceType, IfaceFlags};

fn valid() -> Vec<u8> {
    WorkerAddress {
        uuid: 7,
        name: "w".into(),
        ifaces: vec![IfaceRecord {
            tl_name: "sysv".into(),
            dev_name: "memory".into(),
            dev_type: DeviceType::Shm,
            aux: false,
            flags: IfaceFlags::AM_SHORT,
            latency_ns: 80.0,
            bandwidth: 1e10,
            overhead_ns: 5.0,
            dev_addr: vec![1; 8],
            iface_addr: vec![2; 24],
        }],
    }
    .pack()
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(a) = WorkerAddress::unpack(&b) {
            prop_assert_eq!(a.pack().unwrap(), b);
        }
    }

    #[test]
    fn mutated_valid_address(pos in 0usize..1000, val in any::<u8>(), cut in 0usize..1000) {
        let mut b = valid();
        let p = pos % b.len();
        b[p] = val;
        b.truncate(b.len() - cut % 4);
        if let Ok(a) = WorkerAddress::unpack(&b) {
            prop_assert_eq!(a.pack().unwrap(), b);
        }
    }
}
