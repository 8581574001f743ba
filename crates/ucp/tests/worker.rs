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
    let w = Worker::new(&c, &WorkerParams::new("test")).unwrap();
    let a = WorkerAddress::unpack(w.address()).unwrap();
    assert_eq!(&a, w.address_record());
    assert_eq!(a.ifaces.len(), w.iface_names().len());
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
    let ep = w1.ep_create(w2.address()).unwrap();
    let q = ep.query().unwrap();
    let am = q.lanes.iter().find(|l| l.usage == "am").expect("an AM lane between two workers of one process");
    assert_ne!(am.transport, "self", "self is only for the same worker");
    assert!(q.lanes.iter().any(|l| l.usage == "rndv" && l.transport == "cma"), "{q:?}");
    let own = w1.ep_create(w1.address()).unwrap();
    let q = own.query().unwrap();
    assert_eq!(
        q.lanes.iter().find(|l| l.usage == "am").unwrap().transport,
        "self",
        "a worker talks to itself over self"
    );
    // The same selection, sans IO, from the two addresses.
    let a1 = w1.address_record();
    let a2 = WorkerAddress::unpack(w2.address()).unwrap();
    let lanes = select(a1, &a2, LaneLimits { max_rndv_lanes: 1, atomics: false, tag: false }, &|_, _| true);
    assert_eq!(a1.ifaces[lanes.am.unwrap().local].tl_name, am.transport);
}
