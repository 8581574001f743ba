//! Parameters for opening an interface (`uct_iface_params_t`) and its endpoint failure
//! handler: what an interface is opened with, apart from the interface itself (so the
//! transports' common part, [`BaseIface`](crate::BaseIface), can take them without depending
//! on the traits).

use std::fmt;
use std::rc::Rc;

use ucs::Status;

use crate::tag::TagHandlers;

/// Called when an endpoint fails (peer died, link error): the endpoint's `user_data` and the
/// error. The endpoint then returns errors from every operation.
pub type ErrHandler = Rc<dyn Fn(u64, Status)>;

/// Parameters for opening an interface (`uct_iface_params_t`).
#[derive(Clone, Default)]
pub struct IfaceParams {
    /// Transport name, e.g. `posix`.
    pub tl_name: String,
    /// Device name, e.g. `memory`.
    pub dev_name: String,
    /// Peer failure handler.
    pub err_handler: Option<ErrHandler>,
    /// Tag-offload handlers for unexpected messages (only for transports with tag offload).
    pub tag_handlers: Option<TagHandlers>,
    /// Configuration overrides `(NAME, value)` applied on top of the `UCX_*` environment, with
    /// names as in the transport's table without prefix, e.g. `("FIFO_SIZE", "128")`.
    pub config: Vec<(String, String)>,
}

impl IfaceParams {
    /// Parameters for `tl_name` on `dev_name`, nothing else set.
    pub fn new(tl_name: &str, dev_name: &str) -> Self {
        IfaceParams { tl_name: tl_name.into(), dev_name: dev_name.into(), ..Default::default() }
    }

    /// Adds a configuration override.
    pub fn with_config(mut self, name: &str, value: &str) -> Self {
        self.config.push((name.into(), value.into()));
        self
    }

    /// The override for `name`, if any.
    pub fn config_value(&self, name: &str) -> Option<&str> {
        self.config.iter().rev().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

impl fmt::Debug for IfaceParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IfaceParams")
            .field("tl_name", &self.tl_name)
            .field("dev_name", &self.dev_name)
            .field("err_handler", &self.err_handler.is_some())
            .field("config", &self.config)
            .finish()
    }
}
