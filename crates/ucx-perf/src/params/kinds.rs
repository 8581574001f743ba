//! The values of the options that choose how a test runs: data layouts and datatypes (`-D`),
//! memory types (`-m`), thread modes (`-M`, UCX's `ucs_thread_mode_t` itself), asynchronous
//! progress (`-A`) and waiting (`-E`).

pub use ucs::ThreadMode;

/// `-D` for UCT tests: how the sender hands data to the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataLayout {
    /// Inline from the caller's buffer (default; not for `get`).
    Short,
    /// Inline from an io-vector (active messages only).
    ShortIov,
    /// Packed into a transport buffer.
    Bcopy,
    /// Zero-copy from registered memory.
    Zcopy,
}

impl DataLayout {
    /// The `-D` word.
    pub fn name(self) -> &'static str {
        match self {
            DataLayout::Short => "short",
            DataLayout::ShortIov => "shortiov",
            DataLayout::Bcopy => "bcopy",
            DataLayout::Zcopy => "zcopy",
        }
    }

    /// As the header box's `Data layout:` line shows it.
    pub fn display_name(self) -> &'static str {
        match self {
            DataLayout::ShortIov => "short iov",
            other => other.name(),
        }
    }

    /// The layout by its `-D` word.
    pub fn from_name(s: &str) -> Option<DataLayout> {
        [DataLayout::Short, DataLayout::ShortIov, DataLayout::Bcopy, DataLayout::Zcopy]
            .into_iter()
            .find(|l| l.name() == s)
    }
}

/// `-D` for UCP tests: the datatype of each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UcpDatatype {
    /// One contiguous buffer (default).
    Contig,
    /// A scatter-gather list.
    Iov,
    /// A generic datatype (pack/unpack callbacks; an extension: the reference has contig
    /// and iov only).
    Generic,
}

impl UcpDatatype {
    /// The `-D` word.
    pub fn name(self) -> &'static str {
        match self {
            UcpDatatype::Contig => "contig",
            UcpDatatype::Iov => "iov",
            UcpDatatype::Generic => "generic",
        }
    }

    /// The datatype by its `-D` word.
    pub fn from_name(s: &str) -> Option<UcpDatatype> {
        match s {
            "contig" => Some(UcpDatatype::Contig),
            "iov" => Some(UcpDatatype::Iov),
            "generic" => Some(UcpDatatype::Generic),
            _ => None,
        }
    }
}

/// `-m`: memory types of the send and receive buffers (only host memory here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryType {
    /// System memory.
    Host,
}

impl MemoryType {
    /// The `-m` word, as the header box shows it.
    pub fn name(self) -> &'static str {
        match self {
            MemoryType::Host => "host",
        }
    }

    /// The memory type by its `-m` word.
    pub fn from_name(s: &str) -> Option<MemoryType> {
        (s == "host").then_some(MemoryType::Host)
    }
}

/// `-A`: how asynchronous progress runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncMode {
    /// A progress thread with spin locking (default; `thread` is an alias).
    ThreadSpinlock,
    /// A progress thread with mutex locking.
    ThreadMutex,
    /// A signal-based timer.
    Signal,
}

impl AsyncMode {
    /// The `-A` word.
    pub fn name(self) -> &'static str {
        match self {
            AsyncMode::ThreadSpinlock => "thread_spinlock",
            AsyncMode::ThreadMutex => "thread_mutex",
            AsyncMode::Signal => "signal",
        }
    }

    /// The mode by its `-A` word (`thread` is `thread_spinlock`).
    pub fn from_name(s: &str) -> Option<AsyncMode> {
        match s {
            "thread" | "thread_spinlock" => Some(AsyncMode::ThreadSpinlock),
            "thread_mutex" => Some(AsyncMode::ThreadMutex),
            "signal" => Some(AsyncMode::Signal),
            _ => None,
        }
    }
}

/// `-E`: how UCP tests wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitMode {
    /// Call worker progress repeatedly.
    Poll,
    /// Sleep on the worker's wakeup after posting.
    Sleep,
}

impl WaitMode {
    /// The `-E` word.
    pub fn name(self) -> &'static str {
        match self {
            WaitMode::Poll => "poll",
            WaitMode::Sleep => "sleep",
        }
    }

    /// The mode by its `-E` word.
    pub fn from_name(s: &str) -> Option<WaitMode> {
        [WaitMode::Poll, WaitMode::Sleep].into_iter().find(|m| m.name() == s)
    }
}

/// The `-M` words of the thread modes (UCX's `ucs_thread_mode_names`).
pub fn thread_mode_name(m: ThreadMode) -> &'static str {
    match m {
        ThreadMode::Single => "single",
        ThreadMode::Serialized => "serialized",
        ThreadMode::Multi => "multi",
    }
}

/// The thread mode by its `-M` word.
pub fn thread_mode_from_name(s: &str) -> Option<ThreadMode> {
    [ThreadMode::Single, ThreadMode::Serialized, ThreadMode::Multi].into_iter().find(|&m| thread_mode_name(m) == s)
}
