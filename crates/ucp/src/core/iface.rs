//! The worker's interfaces: one per resource of the context, opened at worker creation, with
//! UCP's active-message handlers set on each; and the record of each in the worker address.

use std::rc::{Rc, Weak};

use ucs::idtable::Id;
use ucs::{Status, UcsResult};
use uct::{AmRecv, Iface, IfaceAttr, IfaceParams, Md};

use super::Core;
use crate::config::TlUse;
use crate::context::{Context, Resource};
use crate::wire;
use crate::wireup::address::IfaceRecord;

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

impl WorkerIface {
    /// `transport/device`, for messages.
    pub fn name(&self) -> String {
        self.resource.desc.tl.full_name()
    }
}

/// This interface's record in the worker address: transport, device, capabilities and the
/// performance model lane selection compares.
pub(crate) fn record_of(i: &WorkerIface) -> IfaceRecord {
    let a = &i.attr;
    let bw = a.bandwidth.dedicated + a.bandwidth.shared;
    IfaceRecord {
        tl_name: i.resource.desc.tl.tl_name.clone(),
        dev_name: i.resource.desc.tl.dev_name.clone(),
        dev_type: i.resource.desc.tl.dev_type,
        aux: i.resource.usage == TlUse::AuxOnly,
        flags: a.flags,
        latency_ns: (a.latency.c * 1e9).max(0.0),
        // A transport without a model still gets a positive bandwidth.
        bandwidth: if bw.is_finite() && bw > 0.0 { bw } else { 1.0 },
        overhead_ns: (a.overhead * 1e9).max(0.0),
        dev_addr: i.iface.device_address(),
        iface_addr: i.iface.iface_address(),
    }
}

/// Runs an active-message handler's work on the core it was made for, unless the core is
/// being dropped (then the message is dropped), without taking a reference count per message.
#[inline(always)]
pub(super) fn with_core(w: &Weak<Core>, f: impl FnOnce(&Core)) {
    if w.strong_count() > 0 {
        // SAFETY: the core is alive (a non-zero strong count: it is not being dropped). It
        // stays alive for the whole handler. Handlers run inside a call on this core (its
        // progress, or a send on its `self` lane), reached through a `Worker` or `Endpoint`
        // handle whose `Arc` keeps the worker, and so the core's `Rc`, alive until the call
        // returns (nothing a handler or a user callback does can drop the caller's handle), or
        // while the worker goes: while `Shared::drop` releases the endpoints its `Rc` still
        // holds the core, and once the core itself is dropped the strong count is zero.
        f(unsafe { &*w.as_ptr() })
    }
}

/// Opens an interface on every resource of `ctx`, with UCP's handlers (errors of endpoints go
/// to the core's `on_ep_error`). Resources that fail to open are skipped with a warning; no
/// interface for communication at all is `NoDevice`.
pub(crate) fn open_all(ctx: &Context, uct: &uct::Worker, weak: &Weak<Core>) -> UcsResult<Vec<WorkerIface>> {
    let mut ifaces = Vec::new();
    for r in ctx.resources() {
        let w = weak.clone();
        let err: uct::ErrHandler = Rc::new(move |user_data, status| {
            if let Some(core) = w.upgrade() {
                core.on_ep_error(Id::from_raw(user_data), status);
            }
        });
        let opened = uct::component(r.desc.component).and_then(|c| {
            let md = c.md_open(&r.desc.md_name)?;
            let mut params = IfaceParams::new(&r.desc.tl.tl_name, &r.desc.tl.dev_name);
            params.err_handler = Some(err);
            params.config = r.config.clone();
            if ctx.features().contains(crate::context::Features::TAG) {
                // (A transport with tag matching turns it on only when asked to, and only
                // with these.)
                params.tag_handlers = Some(tag_handlers(ifaces.len(), weak));
            }
            let iface: Rc<dyn Iface> = md.iface_open(uct, &params)?.into();
            Ok((md, iface))
        });
        match opened {
            Ok((md, iface)) => {
                let attr = iface.attr().clone();
                if attr.flags.contains(uct::IfaceFlags::AM_BCOPY) {
                    set_handlers(&*iface, ifaces.len(), weak, &r.desc.tl.full_name());
                }
                ifaces.push(WorkerIface { resource: r.clone(), md, iface, attr });
            }
            Err(e) => tracing::warn!("{}: cannot open an interface: {e}", r.desc.tl.full_name()),
        }
    }
    if !ifaces.iter().any(|i| i.resource.usage == TlUse::Full) {
        tracing::error!("ucp worker: no interface could be opened");
        return Err(Status::NoDevice);
    }
    Ok(ifaces)
}

/// The handlers of tagged messages that came through interface number `index`'s tag matching
/// without meeting a receive posted there: into the tag family, as the active messages'.
fn tag_handlers(index: usize, weak: &Weak<Core>) -> uct::TagHandlers {
    let (w1, w2) = (weak.clone(), weak.clone());
    uct::TagHandlers {
        eager: Rc::new(move |u: uct::TagUnexpEager<'_>| {
            with_core(&w1, |core| {
                core.activate(index);
                core.on_offload_eager(index, u);
            })
        }),
        rndv: Rc::new(move |u: uct::TagUnexpRndv<'_>| {
            with_core(&w2, |core| {
                core.activate(index);
                core.on_offload_rndv(index, &u);
            })
        }),
    }
}

/// Sets UCP's active-message handlers on interface number `index`.
fn set_handlers(iface: &dyn Iface, index: usize, weak: &Weak<Core>, name: &str) {
    for id in wire::ALL_AM_IDS {
        let w = weak.clone();
        // Eager messages, the common case, skip the dispatch by id.
        let h: uct::AmHandler = if id == wire::AM_EAGER_ONLY {
            Rc::new(move |m: AmRecv<'_>| {
                with_core(&w, |core| {
                    core.activate(index);
                    core.on_eager(m);
                })
            })
        } else {
            Rc::new(move |m: AmRecv<'_>| {
                with_core(&w, |core| {
                    core.activate(index);
                    core.on_am(id, m);
                })
            })
        };
        if let Err(e) = iface.set_am_handler(id, Some(h)) {
            tracing::warn!("{name}: cannot set AM handler {id}: {e}");
        }
    }
}
