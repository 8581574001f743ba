//! Operation parameters (`ucp_request_param_t`) and what a completion reports.

use bitflags::bitflags;
use ucs::Status;

use crate::tag::matcher::Tag;

bitflags! {
    /// `UCP_OP_ATTR_FLAG_*`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct RequestFlags: u32 {
        /// Always return a request, even when the operation completed at once.
        const NO_IMM_CMPL = 1 << 0;
        /// Fail with `NoResource` instead of returning a request.
        const FORCE_IMM_CMPL = 1 << 1;
    }
}

/// What a completed receive got (`ucp_tag_recv_info_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvInfo {
    /// Bytes the sender sent.
    pub length: usize,
    /// The sender's tag.
    pub sender_tag: Tag,
}

/// A completion callback: the final status and, for receives, what arrived (for sends, the
/// length sent and the tag).
pub type Callback = Box<dyn FnOnce(Status, RecvInfo) + Send>;

/// A completion callback without allocation: a function and a user value (`cb` and
/// `user_data` of `ucp_request_param_t`).
pub type CallbackFn = fn(Status, RecvInfo, usize);

/// Parameters of an operation (`ucp_request_param_t`).
#[derive(Default)]
pub struct RequestParam {
    /// Immediate-completion behaviour.
    pub flags: RequestFlags,
    /// Called once when the operation completes (not when it completed at once).
    pub callback: Option<Callback>,
    /// The same as a plain function with a user value (no allocation); runs after `callback`.
    pub callback_fn: Option<(CallbackFn, usize)>,
    /// A registration of the buffer (`ucp_mem_map`), used by zero-copy protocols instead of
    /// registering per message.
    pub memh: Option<crate::mem::MemHandle>,
    /// Set by the `*_detached` operations: the request is released from the start (no handle).
    pub(crate) detached: bool,
}

impl std::fmt::Debug for RequestParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestParam")
            .field("flags", &self.flags)
            .field("callback", &self.callback.is_some())
            .field("callback_fn", &self.callback_fn.is_some())
            .field("memh", &self.memh.is_some())
            .finish()
    }
}

impl RequestParam {
    /// No callback, no flags.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a callback.
    pub fn callback(mut self, cb: impl FnOnce(Status, RecvInfo) + Send + 'static) -> Self {
        self.callback = Some(Box::new(cb));
        self
    }

    /// Sets an allocation-free callback: `f(status, info, user_data)`.
    pub fn callback_fn(mut self, f: CallbackFn, user_data: usize) -> Self {
        self.callback_fn = Some((f, user_data));
        self
    }

    /// Sets flags.
    pub fn flags(mut self, flags: RequestFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Sets the memory-handle hint.
    pub fn memh(mut self, memh: crate::mem::MemHandle) -> Self {
        self.memh = Some(memh);
        self
    }

    /// The id of the memory-handle hint.
    #[inline]
    pub(crate) fn hint(&self) -> Option<ucs::idtable::Id> {
        self.memh.map(|m| m.id)
    }
}
