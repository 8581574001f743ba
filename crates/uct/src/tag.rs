//! Hardware tag-matching offload types (UCX `uct_tag_*`). The operations are methods of
//! [`crate::Iface`] and [`crate::Ep`]; transports without offload return `Unsupported` and do not
//! advertise the `TAG_*` capability flags.

use std::fmt;
use std::rc::Rc;

use ucs::Status;

/// A 64-bit tag.
pub type Tag = u64;

/// Completion callback of a posted receive: sender tag, immediate data, length, status.
pub type TagCompletedFn = Box<dyn Fn(Tag, u64, usize, Status)>;

/// Rendezvous callback of a posted receive: sender tag, user header, status.
pub type TagRndvFn = Box<dyn Fn(Tag, &[u8], Status)>;

/// Callbacks of a receive posted to the hardware (`uct_tag_context_t`).
pub struct TagRecvContext {
    /// The hardware matched a message to this receive: the buffer is now being filled and the
    /// receive can no longer be cancelled.
    pub tag_consumed: Box<dyn Fn()>,
    /// The receive completed: sender tag, immediate data, length, and status
    /// (`MessageTruncated` when the message was larger than the buffer, `Canceled` on cancel).
    pub completed: TagCompletedFn,
    /// A rendezvous request matched this receive in hardware but the transport could not
    /// complete it: sender tag and the user header of the request.
    pub rndv: TagRndvFn,
}

impl fmt::Debug for TagRecvContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TagRecvContext")
    }
}

/// An eager message that matched no posted receive, passed to software.
#[derive(Debug)]
pub struct TagUnexpEager<'a> {
    /// Sender tag.
    pub stag: Tag,
    /// Immediate data (eager bcopy/zcopy).
    pub imm: u64,
    /// The message.
    pub msg: crate::AmRecv<'a>,
}

/// A rendezvous request that matched no posted receive, passed to software.
#[derive(Debug)]
pub struct TagUnexpRndv<'a> {
    /// Sender tag.
    pub stag: Tag,
    /// User header of the request.
    pub header: &'a [u8],
    /// Remote address of the sender's data.
    pub remote_addr: u64,
    /// Length of the sender's data.
    pub length: usize,
    /// Packed remote key of the sender's data.
    pub rkey_buf: &'a [u8],
}

/// Handlers for unexpected tagged messages, given when the interface is opened with tag offload.
#[derive(Clone)]
pub struct TagHandlers {
    /// Unexpected eager messages.
    pub eager: Rc<dyn Fn(TagUnexpEager<'_>)>,
    /// Unexpected rendezvous requests.
    pub rndv: Rc<dyn Fn(TagUnexpRndv<'_>)>,
}

impl fmt::Debug for TagHandlers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TagHandlers")
    }
}

/// Handle of an offloaded rendezvous send, for [`crate::Ep::tag_rndv_cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RndvOp(pub u64);
