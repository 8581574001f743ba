//! The UCP worker (`ucp_worker_h`): a `uct` worker with one interface per selected resource,
//! and the packed address peers connect to.
//!
//! This is the worker's core, used from one thread. The thread-mode wrapper (single /
//! serialized / multi) and the protocol state come on top of it.

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use ucs::{Status, UcsResult};
use uct::{Iface, IfaceAttr, IfaceParams, Md, ProgressFlags};

use crate::address::{IfaceRecord, WorkerAddress};
use crate::config::TlUse;
use crate::context::{Context, Resource};

/// Parameters of [`Worker::new`].
#[derive(Clone, Debug, Default)]
pub struct WorkerParams {
    /// A name for diagnostics (put in the address).
    pub name: String,
}

/// One opened interface of the worker.
pub struct WorkerIface {
    /// The resource it was opened on.
    pub resource: Resource,
    /// Its memory domain.
    pub md: Rc<dyn Md>,
    /// The interface.
    pub iface: Rc<dyn Iface>,
    /// Its attributes, queried once.
    pub attr: IfaceAttr,
}

/// A UCP worker.
pub struct Worker {
    ctx: Context,
    uct: uct::Worker,
    ifaces: Vec<WorkerIface>,
    address: WorkerAddress,
    packed: Vec<u8>,
}

/// A worker id unique across processes on this machine and, with high probability, beyond.
fn new_uuid() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = ucs::time::now();
    let mut x = (std::process::id() as u64) << 32 ^ t ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(48);
    // splitmix64 finaliser: spreads the bits.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Worker {
    /// Opens an interface on every resource of `ctx` (resources that fail to open are skipped
    /// with a warning; none at all is `NoDevice`) and builds the worker's address.
    pub fn new(ctx: &Context, params: &WorkerParams) -> UcsResult<Worker> {
        let uct = uct::Worker::default();
        let mut ifaces = Vec::new();
        for r in ctx.resources() {
            let opened = uct::component(r.desc.component).and_then(|c| {
                let md = c.md_open(&r.desc.md_name)?;
                let iface: Rc<dyn Iface> =
                    md.iface_open(&uct, &IfaceParams::new(&r.desc.tl.tl_name, &r.desc.tl.dev_name))?.into();
                Ok((md, iface))
            });
            match opened {
                Ok((md, iface)) => {
                    iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
                    let attr = iface.attr().clone();
                    ifaces.push(WorkerIface { resource: r.clone(), md, iface, attr });
                }
                Err(e) => tracing::warn!("{}: cannot open an interface: {e}", r.desc.tl.full_name()),
            }
        }
        if !ifaces.iter().any(|i| i.resource.usage == TlUse::Full) {
            tracing::error!("ucp worker: no interface could be opened");
            return Err(Status::NoDevice);
        }
        let address = WorkerAddress {
            uuid: new_uuid(),
            name: params.name.chars().take(64).collect(),
            ifaces: ifaces.iter().map(record_of).collect(),
        };
        let packed = address.pack()?;
        Ok(Worker { ctx: ctx.clone(), uct, ifaces, address, packed })
    }

    /// The packed address to give peers.
    pub fn address(&self) -> &[u8] {
        &self.packed
    }

    /// The worker's own address, unpacked.
    pub fn address_record(&self) -> &WorkerAddress {
        &self.address
    }

    /// Unique id of this worker.
    pub fn uuid(&self) -> u64 {
        self.address.uuid
    }

    /// The opened interfaces, in the order of the address records.
    pub fn ifaces(&self) -> &[WorkerIface] {
        &self.ifaces
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Progresses every interface once; returns the number of events.
    pub fn progress(&self) -> usize {
        self.uct.progress()
    }
}

fn record_of(i: &WorkerIface) -> IfaceRecord {
    let a = &i.attr;
    let bw = a.bandwidth.dedicated + a.bandwidth.shared;
    IfaceRecord {
        tl_name: i.resource.desc.tl.tl_name.clone(),
        dev_name: i.resource.desc.tl.dev_name.clone(),
        dev_type: i.resource.desc.tl.dev_type,
        flags: a.flags,
        latency_ns: (a.latency.c * 1e9).max(0.0),
        // A transport without a model still gets a positive bandwidth.
        bandwidth: if bw.is_finite() && bw > 0.0 { bw } else { 1.0 },
        overhead_ns: (a.overhead * 1e9).max(0.0),
        dev_addr: i.iface.device_address(),
        iface_addr: i.iface.iface_address(),
    }
}
