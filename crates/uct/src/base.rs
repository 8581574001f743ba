//! What every interface has, written once (UCX's `uct_base_iface_t`): its attributes, the
//! active-message table, the pending queue, its registration with the worker's progress, and
//! the handler of failed endpoints - with the [`Iface`](crate::Iface) methods that use nothing
//! else (their defaults, through [`Iface::base`](crate::Iface::base)) and the cleanup every
//! interface handle does when it goes ([`BaseIface::close`]).
//!
//! A transport keeps one in its interface's shared state and hands it out from `base()`; it
//! implements only what is its own (progress, addresses, endpoints, flush).

use std::fmt;
use std::rc::Rc;

use ucs::Status;

use crate::am::AmTable;
use crate::attr::IfaceAttr;
use crate::params::{ErrHandler, IfaceParams};
use crate::pending::PendingQueue;
use crate::worker::{ProgressRegistration, Worker};

/// The common part of an interface.
pub struct BaseIface {
    /// Capabilities and performance model.
    pub attr: IfaceAttr,
    /// Active-message handlers by id.
    pub am: AmTable,
    /// Requests waiting for send resources, scheduled fairly across endpoints.
    pub pending: PendingQueue,
    /// The interface's progress function, registered with the worker while enabled.
    pub progress: ProgressRegistration,
    /// Called when an endpoint fails.
    err_handler: Option<ErrHandler>,
}

impl BaseIface {
    /// The common part of an interface opened on `worker` with `params` and attributes
    /// `attr`: no handler, nothing pending, progress not enabled.
    pub fn new(worker: &Worker, params: &IfaceParams, attr: IfaceAttr) -> BaseIface {
        BaseIface {
            attr,
            am: AmTable::new(),
            pending: PendingQueue::new(),
            progress: ProgressRegistration::new(worker),
            err_handler: params.err_handler.clone(),
        }
    }

    /// Whether the user set a handler of failed endpoints.
    #[inline]
    pub fn has_err_handler(&self) -> bool {
        self.err_handler.is_some()
    }

    /// Reports the failure of the endpoint whose user data is `user_data` to the handler;
    /// false when there is none.
    pub fn report_failure(&self, user_data: u64, status: Status) -> bool {
        match &self.err_handler {
            Some(h) => {
                h(user_data, status);
                true
            }
            None => false,
        }
    }

    /// Registers `progress(&target)` with the worker, holding `target` weakly.
    #[inline]
    pub fn enable_progress<T: 'static>(&self, target: &Rc<T>, progress: impl Fn(&T) -> usize + 'static) {
        self.progress.enable_for(target, progress);
    }

    /// What an interface handle does when it goes: progress stops, and the handlers and
    /// pending requests are dropped - they may hold endpoints, which hold the interface, so
    /// the interface is freed even if the user never dropped those endpoints.
    pub fn close(&self) {
        self.progress.disable();
        self.am.clear();
        self.pending.clear();
    }
}

impl fmt::Debug for BaseIface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BaseIface")
            .field("progress", &self.progress)
            .field("err_handler", &self.err_handler.is_some())
            .finish()
    }
}
