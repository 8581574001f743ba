//! Worker creation over the shared-memory transports: one interface per selected resource, an
//! address that unpacks to the same records, distinct ids, lanes between two workers.

use ucp::lanes::{select, LaneLimits};
use ucp::{Context, ContextParams, Features, Worker, WorkerAddress, WorkerParams};

fn ctx(tls: &str) -> Context {
    uct_shm::register();
    Context::new(&ContextParams::new(Features::TAG).with_config("TLS", tls)).unwrap()
}

#[test]
fn address_describes_every_interface() {
    let c = ctx("shm");
    let w = Worker::new(&c, &WorkerParams { name: "test".into() }).unwrap();
    let a = WorkerAddress::unpack(w.address()).unwrap();
    assert_eq!(&a, w.address_record());
    assert_eq!(a.ifaces.len(), w.ifaces().len());
    let names: Vec<&str> = a.ifaces.iter().map(|r| r.tl_name.as_str()).collect();
    for tl in ["self", "posix", "sysv"] {
        assert!(names.contains(&tl), "{tl} missing from {names:?}");
    }
    assert_eq!(w.progress(), 0, "nothing to do yet");
    let w2 = Worker::new(&c, &WorkerParams::default()).unwrap();
    assert_ne!(w.uuid(), w2.uuid());
}

#[test]
fn lanes_between_two_workers() {
    let c = ctx("shm");
    let w1 = Worker::new(&c, &WorkerParams::default()).unwrap();
    let w2 = Worker::new(&c, &WorkerParams::default()).unwrap();
    let a1 = w1.address_record();
    let a2 = WorkerAddress::unpack(w2.address()).unwrap();
    let reach = |l: &ucp::IfaceRecord, r: &ucp::IfaceRecord| {
        let i = a1.ifaces.iter().position(|x| x == l).unwrap();
        w1.ifaces()[i].iface.is_reachable(&r.dev_addr, Some(&r.iface_addr))
    };
    let limits = LaneLimits { max_rndv_lanes: 1, atomics: false };
    let lanes = select(a1, &a2, limits, &reach);
    let am = lanes.am.expect("an AM lane between two workers of one process");
    assert_ne!(a1.ifaces[am.local].tl_name, "self", "self is only for the same worker");
    let own = select(a1, a1, limits, &reach);
    assert_eq!(a1.ifaces[own.am.unwrap().local].tl_name, "self", "a worker talks to itself over self");
}
