//! Capabilities and performance model of interfaces and memory domains (`uct_iface_attr_t`,
//! `uct_md_attr_t`).

use bitflags::bitflags;

bitflags! {
    /// Interface capability flags (`UCT_IFACE_FLAG_*`, same bit positions as UCX).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct IfaceFlags: u64 {
        /// Short active message.
        const AM_SHORT = 1 << 0;
        /// Buffered (packed) active message.
        const AM_BCOPY = 1 << 1;
        /// Zero-copy active message.
        const AM_ZCOPY = 1 << 2;
        /// Pending operations (`pending_add`).
        const PENDING = 1 << 3;
        /// Short put.
        const PUT_SHORT = 1 << 4;
        /// Buffered put.
        const PUT_BCOPY = 1 << 5;
        /// Zero-copy put.
        const PUT_ZCOPY = 1 << 6;
        /// Short get.
        const GET_SHORT = 1 << 8;
        /// Buffered get.
        const GET_BCOPY = 1 << 9;
        /// Zero-copy get.
        const GET_ZCOPY = 1 << 10;
        /// Atomics are coherent with the CPU's own atomics on the target memory.
        const ATOMIC_CPU = 1 << 30;
        /// Atomics are coherent only with other atomics of the same device.
        const ATOMIC_DEVICE = 1 << 31;
        /// Invalid buffer of a short operation is detected.
        const ERRHANDLE_SHORT_BUF = 1 << 32;
        /// Invalid buffer of a buffered operation is detected.
        const ERRHANDLE_BCOPY_BUF = 1 << 33;
        /// Invalid buffer of a zero-copy operation is detected.
        const ERRHANDLE_ZCOPY_BUF = 1 << 34;
        /// Invalid AM id on the remote side is detected.
        const ERRHANDLE_AM_ID = 1 << 35;
        /// Remote memory access errors are detected.
        const ERRHANDLE_REMOTE_MEM = 1 << 36;
        /// Invalid buffered-operation length is detected.
        const ERRHANDLE_BCOPY_LEN = 1 << 37;
        /// Peer failure is reported through the error handler.
        const ERRHANDLE_PEER_FAILURE = 1 << 38;
        /// `Ep::check` is supported.
        const EP_CHECK = 1 << 39;
        /// Endpoints connect to a remote interface address.
        const CONNECT_TO_IFACE = 1 << 40;
        /// Endpoints connect to a remote endpoint address.
        const CONNECT_TO_EP = 1 << 41;
        /// Endpoints connect to a socket address.
        const CONNECT_TO_SOCKADDR = 1 << 42;
        /// Active messages may be delivered more than once.
        const AM_DUP = 1 << 43;
        /// Callbacks may be invoked from the progress call only.
        const CB_SYNC = 1 << 44;
        /// Callbacks may be invoked from an async context.
        const CB_ASYNC = 1 << 45;
        /// Endpoints have a built-in keepalive.
        const EP_KEEPALIVE = 1 << 46;
        /// Hardware tag matching: eager short.
        const TAG_EAGER_SHORT = 1 << 50;
        /// Hardware tag matching: eager bcopy.
        const TAG_EAGER_BCOPY = 1 << 51;
        /// Hardware tag matching: eager zcopy.
        const TAG_EAGER_ZCOPY = 1 << 52;
        /// Hardware tag matching: rendezvous zcopy.
        const TAG_RNDV_ZCOPY = 1 << 53;
        /// The interface reaches other hosts.
        const INTER_NODE = 1 << 54;
    }
}

bitflags! {
    /// Event capabilities of an interface (`UCT_IFACE_FLAG_EVENT_*`) and the events to arm.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct EventFlags: u64 {
        /// Send completion events.
        const SEND_COMP = 1 << 0;
        /// Receive events for tag and active messages.
        const RECV = 1 << 1;
        /// Receive events for messages sent with the signaled flag.
        const RECV_SIG = 1 << 2;
        /// Events are delivered through a file descriptor.
        const FD = 1 << 3;
        /// Events are delivered through an async callback.
        const ASYNC_CB = 1 << 4;
    }
}

/// An atomic operation (`uct_atomic_op_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOp {
    /// Add.
    Add = 0,
    /// Bitwise and.
    And = 1,
    /// Bitwise or.
    Or = 2,
    /// Bitwise xor.
    Xor = 3,
    /// Swap.
    Swap = 4,
    /// Compare and swap.
    Cswap = 5,
}

impl AtomicOp {
    /// Every operation.
    pub const ALL: [AtomicOp; 6] =
        [AtomicOp::Add, AtomicOp::And, AtomicOp::Or, AtomicOp::Xor, AtomicOp::Swap, AtomicOp::Cswap];

    /// The operation's bit in an [`AtomicOps`] mask.
    pub const fn bit(self) -> AtomicOps {
        AtomicOps::from_bits_truncate(1 << self as u32)
    }

    /// The new memory value for a non-compare operation: `old op value`.
    /// For [`AtomicOp::Cswap`] this is `value` (the caller compares first).
    pub fn apply64(self, old: u64, value: u64) -> u64 {
        match self {
            AtomicOp::Add => old.wrapping_add(value),
            AtomicOp::And => old & value,
            AtomicOp::Or => old | value,
            AtomicOp::Xor => old ^ value,
            AtomicOp::Swap | AtomicOp::Cswap => value,
        }
    }

    /// 32-bit version of [`AtomicOp::apply64`].
    pub fn apply32(self, old: u32, value: u32) -> u32 {
        self.apply64(old as u64, value as u64) as u32
    }
}

bitflags! {
    /// A set of [`AtomicOp`]s.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AtomicOps: u32 {
        /// Add.
        const ADD = 1 << 0;
        /// And.
        const AND = 1 << 1;
        /// Or.
        const OR = 1 << 2;
        /// Xor.
        const XOR = 1 << 3;
        /// Swap.
        const SWAP = 1 << 4;
        /// Compare and swap.
        const CSWAP = 1 << 5;
    }
}

impl AtomicOps {
    /// True when `op` is in the set.
    pub fn has(self, op: AtomicOp) -> bool {
        self.contains(op.bit())
    }
}

/// Atomic capabilities for one operand width.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicCaps {
    /// Operations supported without a result (post).
    pub op_flags: AtomicOps,
    /// Operations supported with a fetched result.
    pub fop_flags: AtomicOps,
}

/// Limits of one operation family (put, get or am).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCaps {
    /// Largest short payload, in bytes.
    pub max_short: usize,
    /// Largest buffered payload, in bytes.
    pub max_bcopy: usize,
    /// Smallest zero-copy payload, in bytes.
    pub min_zcopy: usize,
    /// Largest zero-copy payload, in bytes.
    pub max_zcopy: usize,
    /// Optimal alignment of zero-copy buffers.
    pub opt_zcopy_align: usize,
    /// MTU used for alignment.
    pub align_mtu: usize,
    /// Largest number of iov entries per operation.
    pub max_iov: usize,
    /// Largest user header of a zero-copy active message (am only).
    pub max_hdr: usize,
}

/// Hardware tag-matching limits (`uct_iface_attr_t::cap.tag`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagCaps {
    /// Smallest receive buffer that may be posted.
    pub recv_min_recv: usize,
    /// Largest posted receive.
    pub recv_max_zcopy: usize,
    /// Largest iov count of a posted receive.
    pub recv_max_iov: usize,
    /// Largest number of receives posted to hardware at once.
    pub recv_max_outstanding: usize,
    /// Eager limits.
    pub eager: OpCaps,
    /// Rendezvous limits (`max_zcopy`, `max_hdr`, `max_iov`).
    pub rndv: OpCaps,
    /// The matching is done by a software model of the adapter (in the receiver's progress),
    /// not by the adapter: semantics as offload, performance not (an extension of UCX's
    /// attributes, shown by `ucx_info -d`).
    pub emulated: bool,
}

/// `f(x) = c + m * x` (UCX `ucs_linear_func_t`), e.g. latency in seconds as a function of the
/// number of endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinearFunc {
    /// Constant term.
    pub c: f64,
    /// Slope.
    pub m: f64,
}

impl LinearFunc {
    /// Evaluates the function.
    pub fn apply(&self, x: f64) -> f64 {
        self.c + self.m * x
    }
}

/// Bandwidth model in bytes per second: dedicated per process plus shared between processes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BandwidthModel {
    /// Bandwidth each process gets on its own.
    pub dedicated: f64,
    /// Bandwidth shared among all processes using the device.
    pub shared: f64,
}

/// Interface attributes (`uct_iface_attr_t`).
#[derive(Clone, Debug, Default)]
pub struct IfaceAttr {
    /// Capability flags.
    pub flags: IfaceFlags,
    /// Event capabilities.
    pub event_flags: EventFlags,
    /// Put limits.
    pub put: OpCaps,
    /// Get limits.
    pub get: OpCaps,
    /// Active message limits.
    pub am: OpCaps,
    /// Tag-matching offload limits (zero when absent).
    pub tag: TagCaps,
    /// 32-bit atomics.
    pub atomic32: AtomicCaps,
    /// 64-bit atomics.
    pub atomic64: AtomicCaps,
    /// Length of the device address.
    pub device_addr_len: usize,
    /// Length of the interface address (0 when the transport connects to endpoints only).
    pub iface_addr_len: usize,
    /// Length of an endpoint address (0 when the transport connects to interfaces only).
    pub ep_addr_len: usize,
    /// Largest private data of a connection request.
    pub max_conn_priv: usize,
    /// Largest number of endpoints.
    pub max_num_eps: usize,
    /// Send overhead, seconds.
    pub overhead: f64,
    /// Bandwidth model.
    pub bandwidth: BandwidthModel,
    /// Latency model, seconds as a function of the number of endpoints.
    pub latency: LinearFunc,
    /// Priority of the device (higher is preferred among equals).
    pub priority: u8,
}

/// Kind of device a transport runs on (`uct_device_type_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// Network device.
    Net,
    /// Shared memory.
    Shm,
    /// Accelerator.
    Acc,
    /// Loopback within the process.
    SelfDev,
}

impl DeviceType {
    /// UCX's short name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Net => "network",
            DeviceType::Shm => "intra-node",
            DeviceType::Acc => "accelerator",
            DeviceType::SelfDev => "loopback",
        }
    }
}

/// A transport on a device, as listed by a memory domain (`uct_tl_resource_desc_t`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlResource {
    /// Transport name, e.g. `posix`.
    pub tl_name: String,
    /// Device name, e.g. `memory`.
    pub dev_name: String,
    /// Kind of device.
    pub dev_type: DeviceType,
    /// Prefixes of the transport's `UCX_*` settings, most specific first (`RC_VERBS_`, `RC_`,
    /// `IB_`): a setting named with one of them (`RC_TIMEOUT`) is the transport's setting
    /// without it (`TIMEOUT`), the form [`crate::IfaceParams::config`] takes.
    pub config_prefixes: &'static [&'static str],
}

impl TlResource {
    /// `tl/dev`, the name resources are opened by.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.tl_name, self.dev_name)
    }
}

bitflags! {
    /// Memory domain capabilities (`UCT_MD_FLAG_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MdFlags: u64 {
        /// Can allocate memory.
        const ALLOC = 1 << 0;
        /// Can register memory.
        const REG = 1 << 1;
        /// Operations need a memory handle.
        const NEED_MEMH = 1 << 2;
        /// Remote access needs a remote key.
        const NEED_RKEY = 1 << 3;
        /// Memory advice.
        const ADVISE = 1 << 4;
        /// Allocation at a fixed address.
        const FIXED = 1 << 5;
        /// A remote key can be turned into a local pointer.
        const RKEY_PTR = 1 << 6;
        /// Registrations can be invalidated.
        const INVALIDATE = 1 << 8;
    }
}

bitflags! {
    /// Access rights of a registration (`UCT_MD_MEM_ACCESS_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MemAccess: u32 {
        /// Remote put.
        const REMOTE_PUT = 1 << 5;
        /// Remote get.
        const REMOTE_GET = 1 << 6;
        /// Remote atomics.
        const REMOTE_ATOMIC = 1 << 7;
        /// Local read.
        const LOCAL_READ = 1 << 8;
        /// Local write.
        const LOCAL_WRITE = 1 << 9;
        /// Everything.
        const ALL = Self::REMOTE_PUT.bits() | Self::REMOTE_GET.bits()
            | Self::REMOTE_ATOMIC.bits() | Self::LOCAL_READ.bits() | Self::LOCAL_WRITE.bits();
        /// Remote memory access without atomics.
        const RMA = Self::REMOTE_PUT.bits() | Self::REMOTE_GET.bits()
            | Self::LOCAL_READ.bits() | Self::LOCAL_WRITE.bits();
    }
}

/// Memory domain attributes (`uct_md_attr_t`).
#[derive(Clone, Debug, Default)]
pub struct MdAttr {
    /// Capabilities.
    pub flags: MdFlags,
    /// Largest allocation.
    pub max_alloc: usize,
    /// Largest registration.
    pub max_reg: usize,
    /// Size of a packed remote key.
    pub rkey_packed_size: usize,
    /// Registration cost, seconds: `c + m * length`.
    pub reg_cost: LinearFunc,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_match_ucx() {
        assert_eq!(IfaceFlags::GET_SHORT.bits(), 1 << 8);
        assert_eq!(IfaceFlags::EP_CHECK.bits(), 1 << 39);
        assert_eq!(IfaceFlags::TAG_RNDV_ZCOPY.bits(), 1 << 53);
        assert_eq!(AtomicOp::Cswap.bit(), AtomicOps::CSWAP);
        assert_eq!(MemAccess::ALL.bits(), 0x3e0);
    }

    #[test]
    fn atomic_model() {
        assert_eq!(AtomicOp::Add.apply64(u64::MAX, 2), 1);
        assert_eq!(AtomicOp::Xor.apply32(0b1100, 0b1010), 0b0110);
        assert_eq!(AtomicOp::Swap.apply64(5, 9), 9);
    }
}
