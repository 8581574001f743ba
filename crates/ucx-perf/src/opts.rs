//! The command line of `ucx-perf`, option for option that of `ucx_perftest` (UCX 1.13).
//!
//! [`parse`] turns the arguments into [`Parsed::Run`] with a [`PerfParams`] (or
//! [`Parsed::Help`]); every error is one line naming the flag or value and the valid choices.
//! [`expand_batch`] reads the `-b` batch files into the list of tests to run, each line's
//! options merged over the command line's, and [`validate`] checks a test's parameters the way
//! the reference does before it touches a transport (message sizes, layouts, AM header, ...).
//!
//! Facts mirrored from the reference:
//! - options are single letters in getopt style: `-n100` and `-n 100` both work, flags cluster
//!   (`-lf`), options and the server host name may come in any order, `--` ends the options;
//! - the first argument that is not an option is the server's host name: with it the process
//!   is the client, without it (and without `-l`) the server, which takes the test parameters
//!   from the client (see `rte::Rte::exchange_params`);
//! - `-I` on the command line asks for extra output information, in a batch file it asks for
//!   a context with wakeup (as `ucx_perftest`);
//! - `-O 0` (the default) means the test's own window: 32 for `tag_bw`, `tag_sync_bw`,
//!   `ucp_put_bw`, `ucp_am_bw`, 1 for every other test;
//! - `-n 0` means no iteration limit;
//! - atomic tests ignore `-D` (the reference runs `fadd -D bcopy` although `-h` says bcopy and
//!   zcopy "cannot be used for atomics"), so they are accepted here too.
//!
//! Where it differs on purpose: errors are one line (no usage dump) and checked before any
//! output; numbers must be numbers (`atoi` made `-n abc` zero); a second host name, `-P`
//! (MPI) and `-S` are errors; `-d` may be left out for a transport with one device (see
//! [`missing_device_error`]); `-D shortiov` with put/get (the reference hangs) and `-D short`
//! with get (it fails after printing the header) are refused up front; batch files are read
//! and every test validated before the first runs, and `-l` in a batch line needs `-l` on
//! the command line.

use std::path::{Path, PathBuf};

/// Default `-p`: the TCP port of the bootstrap connection.
pub const DEFAULT_PORT: u16 = 13337;
/// Default `-n`.
pub const DEFAULT_ITERS: u64 = 1_000_000;
/// Default `-w`.
pub const DEFAULT_WARMUP: u64 = 10_000;
/// Default `-R`.
pub const DEFAULT_PERCENTILE: f64 = 50.0;
/// Default and largest `-W` for active-message tests.
pub const MAX_FC_WINDOW: u32 = 127;
/// Default `-H` for UCT tests (the header is part of the message).
pub const DEFAULT_AM_HDR_SIZE: usize = 8;
/// Most CPUs `-c` may list.
pub const MAX_CPUS: usize = 1024;
/// Most batch files `-b` may name (more are ignored, as in the reference).
pub const MAX_BATCH_FILES: usize = 32;

/// Options of the command line only (not valid in batch files).
const MAIN_OPTS: &str = "p:b:6NfvIc:P:h";
/// Test options, valid on the command line and in batch files.
const TEST_OPTS: &str = "t:n:s:W:O:w:D:i:H:oSCIqM:r:E:T:d:x:A:BUem:R:lz";

/// Which layer a test measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// Transport layer (`uct`).
    Uct,
    /// Protocol layer (`ucp`).
    Ucp,
}

/// The operation a test performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// Active message.
    Am,
    /// Remote write.
    Put,
    /// Remote read.
    Get,
    /// Atomic add (no reply).
    Add,
    /// Atomic fetch-and-add.
    Fadd,
    /// Atomic swap.
    Swap,
    /// Atomic compare-and-swap.
    Cswap,
    /// Tag-matched send/receive.
    Tag,
    /// Synchronous tag-matched send/receive.
    TagSync,
    /// Stream send/receive.
    Stream,
}

impl Command {
    /// True for the atomic operations (message size 4 or 8 bytes, arguments by value).
    pub fn is_atomic(self) -> bool {
        matches!(self, Command::Add | Command::Fadd | Command::Swap | Command::Cswap)
    }
}

/// How the two sides exchange messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Each side answers the other's message: latencies are half the round trip.
    PingPong,
    /// One side sends, the other only receives (or answers requests).
    StreamUni,
}

/// A test of the `-t` list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TestKind {
    /// `am_lat`: UCT active message latency.
    AmLat,
    /// `put_lat`: UCT put latency.
    PutLat,
    /// `add_lat`: UCT atomic add latency.
    AddLat,
    /// `get`: UCT get latency / bandwidth / message rate.
    Get,
    /// `fadd`: UCT atomic fetch-and-add latency / rate.
    Fadd,
    /// `swap`: UCT atomic swap latency / rate.
    Swap,
    /// `cswap`: UCT atomic compare-and-swap latency / rate.
    Cswap,
    /// `am_bw`: UCT active message bandwidth / message rate.
    AmBw,
    /// `put_bw`: UCT put bandwidth / message rate.
    PutBw,
    /// `add_mr`: UCT atomic add message rate.
    AddMr,
    /// `tag_lat`: UCP tag match latency.
    TagLat,
    /// `tag_bw`: UCP tag match bandwidth.
    TagBw,
    /// `tag_sync_lat`: UCP tag sync match latency.
    TagSyncLat,
    /// `tag_sync_bw`: UCP tag sync match bandwidth.
    TagSyncBw,
    /// `ucp_put_lat`: UCP put latency.
    UcpPutLat,
    /// `ucp_put_bw`: UCP put bandwidth.
    UcpPutBw,
    /// `ucp_get`: UCP get latency / bandwidth / message rate.
    UcpGet,
    /// `ucp_add`: UCP atomic add bandwidth / message rate.
    UcpAdd,
    /// `ucp_fadd`: UCP atomic fetch-and-add latency / bandwidth / rate.
    UcpFadd,
    /// `ucp_swap`: UCP atomic swap latency / bandwidth / rate.
    UcpSwap,
    /// `ucp_cswap`: UCP atomic compare-and-swap latency / bandwidth / rate.
    UcpCswap,
    /// `stream_bw`: UCP stream bandwidth.
    StreamBw,
    /// `stream_lat`: UCP stream latency.
    StreamLat,
    /// `ucp_am_lat`: UCP am latency.
    UcpAmLat,
    /// `ucp_am_bw`: UCP am bandwidth / message rate.
    UcpAmBw,
}

/// One row of the test table: what `-h` lists and what the run needs to know.
struct TestInfo {
    kind: TestKind,
    name: &'static str,
    api: Api,
    command: Command,
    pattern: Pattern,
    desc: &'static str,
    /// "latency" or "overhead": the label of the latency columns.
    lat_label: &'static str,
    /// Outstanding operations when `-O` is 0.
    window: u32,
}

// A table row constructor: the columns are the reference's, so they stay positional.
#[allow(clippy::too_many_arguments)]
const fn t(
    kind: TestKind,
    name: &'static str,
    api: Api,
    command: Command,
    pattern: Pattern,
    desc: &'static str,
    lat_label: &'static str,
    window: u32,
) -> TestInfo {
    TestInfo { kind, name, api, command, pattern, desc, lat_label, window }
}

const LAT: &str = "latency";
const OVH: &str = "overhead";

/// In the order of the reference's `-h` list.
const TESTS: [TestInfo; 25] = {
    use Api::*;
    use Command::*;
    use Pattern::*;
    [
        t(TestKind::AmLat, "am_lat", Uct, Am, PingPong, "active message latency", LAT, 1),
        t(TestKind::PutLat, "put_lat", Uct, Put, PingPong, "put latency", LAT, 1),
        t(TestKind::AddLat, "add_lat", Uct, Add, PingPong, "atomic add latency", LAT, 1),
        t(TestKind::Get, "get", Uct, Get, StreamUni, "get latency / bandwidth / message rate", LAT, 1),
        t(TestKind::Fadd, "fadd", Uct, Fadd, StreamUni, "atomic fetch-and-add latency / rate", LAT, 1),
        t(TestKind::Swap, "swap", Uct, Swap, StreamUni, "atomic swap latency / rate", LAT, 1),
        t(TestKind::Cswap, "cswap", Uct, Cswap, StreamUni, "atomic compare-and-swap latency / rate", LAT, 1),
        t(TestKind::AmBw, "am_bw", Uct, Am, StreamUni, "active message bandwidth / message rate", OVH, 1),
        t(TestKind::PutBw, "put_bw", Uct, Put, StreamUni, "put bandwidth / message rate", OVH, 1),
        t(TestKind::AddMr, "add_mr", Uct, Add, StreamUni, "atomic add message rate", OVH, 1),
        t(TestKind::TagLat, "tag_lat", Ucp, Tag, PingPong, "tag match latency", LAT, 1),
        t(TestKind::TagBw, "tag_bw", Ucp, Tag, StreamUni, "tag match bandwidth", OVH, 32),
        t(TestKind::TagSyncLat, "tag_sync_lat", Ucp, TagSync, PingPong, "tag sync match latency", LAT, 1),
        t(TestKind::TagSyncBw, "tag_sync_bw", Ucp, TagSync, StreamUni, "tag sync match bandwidth", OVH, 32),
        t(TestKind::UcpPutLat, "ucp_put_lat", Ucp, Put, PingPong, "put latency", LAT, 1),
        t(TestKind::UcpPutBw, "ucp_put_bw", Ucp, Put, StreamUni, "put bandwidth", OVH, 32),
        t(TestKind::UcpGet, "ucp_get", Ucp, Get, StreamUni, "get latency / bandwidth / message rate", LAT, 1),
        t(TestKind::UcpAdd, "ucp_add", Ucp, Add, StreamUni, "atomic add bandwidth / message rate", OVH, 1),
        t(
            TestKind::UcpFadd,
            "ucp_fadd",
            Ucp,
            Fadd,
            StreamUni,
            "atomic fetch-and-add latency / bandwidth / rate",
            LAT,
            1,
        ),
        t(TestKind::UcpSwap, "ucp_swap", Ucp, Swap, StreamUni, "atomic swap latency / bandwidth / rate", LAT, 1),
        t(
            TestKind::UcpCswap,
            "ucp_cswap",
            Ucp,
            Cswap,
            StreamUni,
            "atomic compare-and-swap latency / bandwidth / rate",
            LAT,
            1,
        ),
        t(TestKind::StreamBw, "stream_bw", Ucp, Stream, StreamUni, "stream bandwidth", OVH, 1),
        t(TestKind::StreamLat, "stream_lat", Ucp, Stream, PingPong, "stream latency", LAT, 1),
        t(TestKind::UcpAmLat, "ucp_am_lat", Ucp, Am, PingPong, "am latency", LAT, 1),
        t(TestKind::UcpAmBw, "ucp_am_bw", Ucp, Am, StreamUni, "am bandwidth / message rate", OVH, 32),
    ]
};

impl TestKind {
    /// Every test, in the order of the `-h` list.
    pub const ALL: [TestKind; 25] = {
        let mut all = [TestKind::AmLat; 25];
        let mut i = 0;
        while i < TESTS.len() {
            all[i] = TESTS[i].kind;
            i += 1;
        }
        all
    };

    fn info(self) -> &'static TestInfo {
        // The table is in declaration order, so the discriminant is the index.
        &TESTS[self as usize]
    }

    /// The `-t` name, e.g. `am_lat`.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The test by its `-t` name.
    pub fn from_name(name: &str) -> Option<TestKind> {
        TESTS.iter().find(|t| t.name == name).map(|t| t.kind)
    }

    /// The line of the `-h` list after the name, e.g. `UCT active message latency`.
    pub fn description(self) -> String {
        let api = match self.api() {
            Api::Uct => "UCT",
            Api::Ucp => "UCP",
        };
        format!("{api} {}", self.info().desc)
    }

    /// The description without the API, as the header box's `Test:` line shows it.
    pub fn short_description(self) -> &'static str {
        self.info().desc
    }

    /// The layer the test measures.
    pub fn api(self) -> Api {
        self.info().api
    }

    /// True for the transport-layer (UCT) tests.
    pub fn is_uct(self) -> bool {
        self.api() == Api::Uct
    }

    /// The operation.
    pub fn command(self) -> Command {
        self.info().command
    }

    /// Ping-pong or one-way stream.
    pub fn pattern(self) -> Pattern {
        self.info().pattern
    }

    /// The label over the latency columns: `latency` or `overhead` (bandwidth tests).
    pub fn latency_label(self) -> &'static str {
        self.info().lat_label
    }

    /// Outstanding operations when `-O` is 0.
    pub fn default_window(self) -> u32 {
        self.info().window
    }
}

/// The `-t` names joined for error messages.
fn valid_tests() -> String {
    TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
}

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
}

impl UcpDatatype {
    /// The `-D` word.
    pub fn name(self) -> &'static str {
        match self {
            UcpDatatype::Contig => "contig",
            UcpDatatype::Iov => "iov",
        }
    }

    /// The datatype by its `-D` word.
    pub fn from_name(s: &str) -> Option<UcpDatatype> {
        match s {
            "contig" => Some(UcpDatatype::Contig),
            "iov" => Some(UcpDatatype::Iov),
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

/// `-M`: thread support level of the UCP progress engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadMode {
    /// Only the master thread uses the worker.
    Single,
    /// One thread at a time.
    Serialized,
    /// Many threads at once.
    Multi,
}

impl ThreadMode {
    /// The `-M` word.
    pub fn name(self) -> &'static str {
        match self {
            ThreadMode::Single => "single",
            ThreadMode::Serialized => "serialized",
            ThreadMode::Multi => "multi",
        }
    }

    /// The mode by its `-M` word.
    pub fn from_name(s: &str) -> Option<ThreadMode> {
        [ThreadMode::Single, ThreadMode::Serialized, ThreadMode::Multi].into_iter().find(|m| m.name() == s)
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

/// Everything the command line (and a batch-file line) sets; defaults as `ucx_perftest`.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfParams {
    /// `-t`. Meaningful only when [`has_test`](Self::has_test) is true.
    pub test: TestKind,
    /// False when no `-t` was given (a server, or a command line whose batch files name the
    /// tests); `test` then holds `AmLat` as a placeholder.
    pub has_test: bool,
    /// `-s`: the message is the concatenation of these sizes (default `[8]`).
    pub msg_sizes: Vec<usize>,
    /// `-n`: measured iterations (default 1000000; 0 = no limit).
    pub iters: u64,
    /// `-w`: warm-up iterations (default 10000).
    pub warmup: u64,
    /// `-c`: CPUs to bind to (empty = leave the affinity alone).
    pub cpus: Vec<usize>,
    /// `-O`: most uncompleted sends; 0 (the default) is resolved to the test's window once
    /// the test is known, so a runnable [`PerfParams`] always has it >= 1.
    pub max_outstanding: u32,
    /// `-i`: distance between consecutive scatter-gather entries (0 = packed).
    pub iov_stride: usize,
    /// `-l`: both sides in this process.
    pub loopback: bool,
    /// `-o`: the responder does not progress in one-sided tests.
    pub no_responder_progress: bool,
    /// `-B`: register memory with the non-blocking flag.
    pub map_nonblock: bool,
    /// `-R`: percentile rank of the first latency column, 0.0..=100.0 (default 50.0).
    pub percentile: f64,
    /// `-p`: bootstrap TCP port (default 13337).
    pub port: u16,
    /// The positional host name: present on the client.
    pub server: Option<String>,
    /// `-6`: bootstrap over IPv6.
    pub ipv6: bool,
    /// `-d`: device of the UCT test. `None` is accepted for UCT tests (the reference
    /// requires `-d`): the caller then takes the transport's only device or reports the
    /// choices with [`missing_device_error`].
    pub dev: Option<String>,
    /// `-x`: transport of the UCT test.
    pub tl: Option<String>,
    /// `-D` for UCT tests (default short).
    pub layout: DataLayout,
    /// `-D` for UCP tests: send side (default contig).
    pub ucp_send_datatype: UcpDatatype,
    /// `-D` for UCP tests: receive side (default contig).
    pub ucp_recv_datatype: UcpDatatype,
    /// `-W`: flow-control window of active-message bandwidth tests (default 127; validated
    /// <= 127 for active-message tests only, as in the reference).
    pub fc_window: u32,
    /// `-H` for UCT tests: AM header size, part of the message size (default 8).
    pub am_hdr_size: usize,
    /// `-H` for UCP tests: AM header size, on top of the message size (default 0).
    pub ucp_am_hdr_size: usize,
    /// `-m`: memory type of the send buffer.
    pub send_mem: MemoryType,
    /// `-m`: memory type of the receive buffer.
    pub recv_mem: MemoryType,
    /// `-f`: print only the final row.
    pub final_only: bool,
    /// `-v`: CSV output.
    pub csv: bool,
    /// `-N`: thousands separators.
    pub numeric: bool,
    /// `-I` on the command line: print extra information after each row.
    pub extra_info: bool,
    /// `-b`: batch files, nested in the given order.
    pub batch_files: Vec<PathBuf>,
    /// Names of the batch lines this test comes from, one per batch file (filled by
    /// [`expand_batch`]; empty without batch files).
    pub batch_names: Vec<String>,
    /// `-M` (UCP).
    pub thread_mode: ThreadMode,
    /// `-T`: threads (UCP; default 1).
    pub threads: u32,
    /// `-A`.
    pub async_mode: AsyncMode,
    /// `-E` (UCP); `None` = the test's choice.
    pub wait_mode: Option<WaitMode>,
    /// `-C`: wildcard tag (UCP tag tests).
    pub wildcard: bool,
    /// `-U`: force the unexpected flow with tag probe (UCP tag tests).
    pub force_unexpected: bool,
    /// `-I` in a batch file: context with wakeup (UCP).
    pub wakeup: bool,
    /// `-e`: endpoints with error handling (UCP).
    pub err_handling: bool,
    /// `-z`: pass pre-registered memory handles (UCP).
    pub prereg: bool,
    /// `-r recv_data`: stream tests use the receive-data API (UCP).
    pub stream_recv_data: bool,
    /// `-q`: no error messages from the test library.
    pub quiet: bool,
}

impl Default for PerfParams {
    fn default() -> Self {
        PerfParams {
            test: TestKind::AmLat,
            has_test: false,
            msg_sizes: vec![8],
            iters: DEFAULT_ITERS,
            warmup: DEFAULT_WARMUP,
            cpus: Vec::new(),
            max_outstanding: 0,
            iov_stride: 0,
            loopback: false,
            no_responder_progress: false,
            map_nonblock: false,
            percentile: DEFAULT_PERCENTILE,
            port: DEFAULT_PORT,
            server: None,
            ipv6: false,
            dev: None,
            tl: None,
            layout: DataLayout::Short,
            ucp_send_datatype: UcpDatatype::Contig,
            ucp_recv_datatype: UcpDatatype::Contig,
            fc_window: MAX_FC_WINDOW,
            am_hdr_size: DEFAULT_AM_HDR_SIZE,
            ucp_am_hdr_size: 0,
            send_mem: MemoryType::Host,
            recv_mem: MemoryType::Host,
            final_only: false,
            csv: false,
            numeric: false,
            extra_info: false,
            batch_files: Vec::new(),
            batch_names: Vec::new(),
            thread_mode: ThreadMode::Single,
            threads: 1,
            async_mode: AsyncMode::ThreadSpinlock,
            wait_mode: None,
            wildcard: false,
            force_unexpected: false,
            wakeup: false,
            err_handling: false,
            prereg: false,
            stream_recv_data: false,
            quiet: false,
        }
    }
}

impl PerfParams {
    /// Bytes per message: the sum of the `-s` list.
    pub fn message_size(&self) -> usize {
        self.msg_sizes.iter().fold(0usize, |a, &s| a.saturating_add(s))
    }

    /// True for ping-pong tests (latencies are half a round trip).
    pub fn is_pingpong(&self) -> bool {
        self.test.pattern() == Pattern::PingPong
    }

    /// The process waits for a client: no host name and not loopback.
    pub fn is_server(&self) -> bool {
        self.server.is_none() && !self.loopback
    }

    /// Sets `max_outstanding` to the test's window if it is 0 (the reference does this once
    /// the test is known: after the command line, or after each batch line).
    pub fn resolve_window(&mut self) {
        if self.max_outstanding == 0 {
            self.max_outstanding = self.test.default_window();
        }
    }

    /// Warnings the reference prints but runs anyway (`-d`/`-x` given to a UCP test,
    /// `-o` with an active-message test).
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if !self.has_test {
            return w;
        }
        if self.test.api() == Api::Ucp {
            if let Some(d) = &self.dev {
                w.push(format!("-d '{d}' ignored for UCP test; see NOTES section in help message"));
            }
            if let Some(x) = &self.tl {
                w.push(format!("-x '{x}' ignored for UCP test; see NOTES section in help message"));
            }
        } else if self.test.command() == Command::Am && self.no_responder_progress {
            w.push("running active-message test with one-sided progress (-o)".to_string());
        }
        w
    }
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // built once per process
pub enum Parsed {
    /// Run the test(s).
    Run(PerfParams),
    /// `-h`: print this text to stdout and exit 0.
    Help(String),
}

/// The full `-h` text, with `program` in the usage line.
pub fn help_text(program: &str) -> String {
    use std::fmt::Write as _;
    let d = PerfParams::default();
    let mut s = String::new();
    // Infallible: writing to a String.
    let _ = write!(
        s,
        "  Usage: {program} [ server-hostname ] [ options ]\n\
         \n  Common options:\n     -t <test>      test to run:\n"
    );
    for k in TestKind::ALL {
        let _ = writeln!(s, "    {:>13} - {}", k.name(), k.description());
    }
    let _ = write!(
        s,
        "\n     -s <size>      list of scatter-gather sizes for single message ({})\n\
         \x20                   for example: \"-s 16,48,8192,8192,14\"\n\
         \x20    -m <send mem type>[,<recv mem type>]\n\
         \x20                   memory type of message for sender and receiver (host)\n\
         \x20                       host - System memory\n\
         \x20    -n <iters>     number of iterations to run ({})\n\
         \x20    -w <iters>     number of warm-up iterations ({})\n\
         \x20    -c <cpulist>   set affinity to this CPU list (separated by comma) (off)\n\
         \x20    -O <count>     maximal number of uncompleted outstanding sends ({})\n\
         \x20    -i <offset>    distance between consecutive scatter-gather entries ({})\n\
         \x20    -l             use loopback connection\n\
         \x20                   in this case, the process will communicate with itself,\n\
         \x20                   so passing server hostname is not allowed\n\
         \x20    -o             do not progress the responder in one-sided tests\n\
         \x20    -B             register memory with NONBLOCK flag\n\
         \x20    -b <file>      read and execute tests from a batch file: every line in the\n\
         \x20                   file is a test to run, first word is test name, the rest of\n\
         \x20                   the line is command-line arguments for the test.\n\
         \x20    -R <rank>      percentile rank of the percentile data in latency tests ({:.1})\n\
         \x20    -p <port>      TCP port to use for data exchange ({})\n\
         \x20    -6             Use IPv6 address for in data exchange\n\
         \x20    -h             show this help message\n\
         \n  Output format:\n\
         \x20    -N             use numeric formatting (thousands separator)\n\
         \x20    -f             print only final numbers\n\
         \x20    -v             print CSV-formatted output\n\
         \x20    -I             print extra information about the operation\n\
         \n  UCT only:\n\
         \x20    -d <device>    device to use for testing\n\
         \x20    -x <tl>        transport to use for testing\n\
         \x20    -D <layout>    data layout for sender side:\n\
         \x20                       short    - short messages (default, cannot be used for get)\n\
         \x20                       shortiov - short io-vector messages (only for active messages)\n\
         \x20                       bcopy    - copy-out (cannot be used for atomics)\n\
         \x20                       zcopy    - zero-copy (cannot be used for atomics)\n\
         \x20    -W <count>     flow control window size, for active messages ({})\n\
         \x20    -H <size>      active message header size ({}), included in message size\n\
         \x20    -A <mode>      asynchronous progress mode (thread_spinlock)\n\
         \x20                       thread_spinlock - separate progress thread with spin locking\n\
         \x20                       thread_mutex - separate progress thread with mutex locking\n\
         \x20                       signal - signal-based timer\n\
         \n  UCP only:\n\
         \x20    -T <threads>   number of threads in the test ({})\n\
         \x20    -M <thread>    thread support level for progress engine (single)\n\
         \x20                       single     - only the master thread can access\n\
         \x20                       serialized - one thread can access at a time\n\
         \x20                       multi      - multiple threads can access\n\
         \x20    -D <layout>[,<layout>]\n\
         \x20                   data layout for sender and receiver side (contig)\n\
         \x20                       contig - Continuous datatype\n\
         \x20                       iov    - Scatter-gather list\n\
         \x20    -C             use wild-card tag for tag tests\n\
         \x20    -U             force unexpected flow by using tag probe\n\
         \x20    -r <mode>      receive mode for stream tests (recv)\n\
         \x20                       recv       : Use ucp_stream_recv_nb\n\
         \x20                       recv_data  : Use ucp_stream_recv_data_nb\n\
         \x20    -I             create context with wakeup feature enabled\n\
         \x20    -e             create endpoints with error handling support\n\
         \x20    -E <mode>      wait mode for tests\n\
         \x20                       poll       : repeatedly call worker_progress\n\
         \x20                       sleep      : go to sleep after posting requests\n\
         \x20    -H <size>      active message header size ({}), not included in message size\n\
         \x20    -z             pass pre-registered memory handle\n\
         \n   NOTE: When running UCP tests, transport and device should be specified by\n\
         \x20        environment variables: UCX_TLS and UCX_[SELF|SHM|NET]_DEVICES.\n\n",
        d.msg_sizes[0],
        d.iters,
        d.warmup,
        d.max_outstanding,
        d.iov_stride,
        d.percentile,
        d.port,
        d.fc_window,
        d.am_hdr_size,
        d.threads,
        d.ucp_am_hdr_size,
    );
    s
}

/// One result of the getopt scan.
#[derive(Debug, PartialEq)]
enum Item {
    Opt(char, Option<String>),
    Positional(String),
}

/// Splits `args` the way glibc `getopt` does with `optstring`: options may cluster and take
/// their argument attached or from the next word, non-options are collected in order
/// wherever they appear, `--` ends the options.
fn getopt(args: &[String], optstring: &str) -> Result<Vec<Item>, String> {
    let spec = |c: char| -> Option<bool> {
        let i = optstring.find(c)?;
        Some(optstring[i + c.len_utf8()..].starts_with(':'))
    };
    let mut items = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            items.extend(args[i..].iter().cloned().map(Item::Positional));
            break;
        }
        let Some(cluster) = a.strip_prefix('-').filter(|c| !c.is_empty()) else {
            items.push(Item::Positional(a.clone()));
            continue;
        };
        for (pos, c) in cluster.char_indices() {
            if c == ':' {
                return Err(invalid_option(c));
            }
            match spec(c) {
                None => return Err(invalid_option(c)),
                Some(false) => items.push(Item::Opt(c, None)),
                Some(true) => {
                    let rest = &cluster[pos + c.len_utf8()..];
                    let arg = if !rest.is_empty() {
                        rest.to_string()
                    } else if i < args.len() {
                        i += 1;
                        args[i - 1].clone()
                    } else {
                        return Err(format!("option -{c} requires an argument (run with -h for help)"));
                    };
                    items.push(Item::Opt(c, Some(arg)));
                    break;
                }
            }
        }
    }
    Ok(items)
}

fn invalid_option(c: char) -> String {
    format!("invalid option -{c} (run with -h for help)")
}

/// Parses the arguments (without the program name) as `ucx_perftest` does.
///
/// A client (host name given) or a loopback run (`-l`) without batch files is validated in
/// full ([`validate`]); a server's test parameters come from its client, and batch runs are
/// validated test by test by [`expand_batch`].
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    if args.iter().take_while(|a| *a != "--").any(|a| a == "--help") {
        return Ok(Parsed::Help(help_text("ucx-perf")));
    }
    let optstring = format!("{MAIN_OPTS}{TEST_OPTS}");
    let mut p = PerfParams::default();
    let mut positionals = Vec::new();
    for item in getopt(args, &optstring)? {
        match item {
            Item::Positional(s) => positionals.push(s),
            Item::Opt(c, arg) => {
                let arg = arg.unwrap_or_default();
                match c {
                    'p' => p.port = parse_num(c, &arg)?,
                    '6' => p.ipv6 = true,
                    'b' => {
                        // The reference keeps the first 32 and ignores the rest.
                        if p.batch_files.len() < MAX_BATCH_FILES {
                            p.batch_files.push(PathBuf::from(arg));
                        }
                    }
                    'N' => p.numeric = true,
                    'f' => p.final_only = true,
                    'v' => p.csv = true,
                    'I' => p.extra_info = true,
                    'c' => p.cpus = parse_cpus(&arg)?,
                    'P' => return Err("option -P: MPI mode is not available in this build".to_string()),
                    'h' => return Ok(Parsed::Help(help_text("ucx-perf"))),
                    _ => apply_test_opt(&mut p, c, &arg)?,
                }
            }
        }
    }
    let mut positionals = positionals.into_iter();
    if let Some(host) = positionals.next() {
        if p.loopback {
            return Err(
                "conflicting arguments: server hostname argument is not allowed in loopback (-l) mode".to_string()
            );
        }
        if host.is_empty() {
            return Err("empty server host name".to_string());
        }
        p.server = Some(host);
    }
    if let Some(extra) = positionals.next() {
        return Err(format!("unexpected argument '{extra}' (only one server host name is allowed)"));
    }
    if p.batch_files.is_empty() {
        if p.has_test {
            p.resolve_window();
        }
        if !p.is_server() {
            validate(&p)?;
        }
    }
    Ok(Parsed::Run(p))
}

/// Parses the decimal argument of option `opt`.
fn parse_num<T: std::str::FromStr>(opt: char, s: &str) -> Result<T, String> {
    s.parse::<T>().map_err(|_| {
        let range = if opt == 'p' { "0..65535" } else { "a non-negative integer" };
        format!("invalid value for -{opt}: '{s}' (expected {range})")
    })
}

fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for tok in s.split(',') {
        let cpu = tok.trim().parse::<usize>().map_err(|_| {
            format!("invalid cpu list for -c: '{s}' (expected cpu numbers separated by commas, e.g. 0,1)")
        })?;
        if cpus.len() == MAX_CPUS {
            return Err(format!("number of listed cpus exceeds the maximum supported value ({MAX_CPUS})"));
        }
        cpus.push(cpu);
    }
    Ok(cpus)
}

fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    s.split(',').map(|tok| tok.parse::<usize>()).collect::<Result<Vec<_>, _>>().map_err(|_| {
        format!("invalid message size list for -s: '{s}' (expected sizes separated by commas, e.g. 16,48,8192)")
    })
}

/// Applies one test option (valid on the command line and in batch files). `-I` here is the
/// batch-file meaning (wakeup); the command line handles its own `-I` before.
fn apply_test_opt(p: &mut PerfParams, c: char, arg: &str) -> Result<(), String> {
    match c {
        't' => {
            p.test = TestKind::from_name(arg)
                .ok_or_else(|| format!("invalid test name: '{arg}' (valid: {})", valid_tests()))?;
            p.has_test = true;
        }
        'n' => p.iters = parse_num(c, arg)?,
        'w' => p.warmup = parse_num(c, arg)?,
        's' => p.msg_sizes = parse_sizes(arg)?,
        'W' => p.fc_window = parse_num(c, arg)?,
        'O' => p.max_outstanding = parse_num(c, arg)?,
        'i' => p.iov_stride = parse_num(c, arg)?,
        'H' => {
            let h = parse_num(c, arg)?;
            p.am_hdr_size = h;
            p.ucp_am_hdr_size = h;
        }
        'T' => p.threads = parse_num(c, arg)?,
        'D' => parse_layout(p, arg)?,
        'd' => p.dev = Some(arg.to_string()),
        'x' => p.tl = Some(arg.to_string()),
        'o' => p.no_responder_progress = true,
        'B' => p.map_nonblock = true,
        'q' => p.quiet = true,
        'C' => p.wildcard = true,
        'U' => p.force_unexpected = true,
        'I' => p.wakeup = true,
        'e' => p.err_handling = true,
        'z' => p.prereg = true,
        'l' => p.loopback = true,
        'M' => {
            p.thread_mode = ThreadMode::from_name(arg)
                .ok_or_else(|| format!("invalid thread mode for -M: '{arg}' (valid: single, serialized, multi)"))?
        }
        'A' => {
            p.async_mode = AsyncMode::from_name(arg).ok_or_else(|| {
                format!("invalid async mode for -A: '{arg}' (valid: thread_spinlock, thread_mutex, signal)")
            })?
        }
        'E' => {
            p.wait_mode = Some(
                WaitMode::from_name(arg)
                    .ok_or_else(|| format!("invalid wait mode for -E: '{arg}' (valid: poll, sleep)"))?,
            )
        }
        'r' => {
            p.stream_recv_data = match arg {
                "recv" => false,
                "recv_data" => true,
                _ => return Err(format!("invalid receive mode for -r: '{arg}' (valid: recv, recv_data)")),
            }
        }
        'R' => {
            let r: f64 = arg.trim().parse().unwrap_or(f64::NAN);
            if !(0.0..=100.0).contains(&r) {
                return Err(format!("invalid percentile rank for -R: '{arg}' (valid: 0.0 to 100.0)"));
            }
            p.percentile = r;
        }
        'm' => {
            let mut it = arg.split(',');
            let send = parse_mem_type(it.next().unwrap_or(""))?;
            let recv = match it.next() {
                Some(r) => parse_mem_type(r)?,
                None => send,
            };
            p.send_mem = send;
            p.recv_mem = recv;
        }
        'S' => return Err("option -S is not supported (run with -h for help)".to_string()),
        _ => return Err(invalid_option(c)),
    }
    Ok(())
}

fn parse_mem_type(s: &str) -> Result<MemoryType, String> {
    MemoryType::from_name(s).ok_or_else(|| format!("unsupported memory type for -m: '{s}' (valid: host)"))
}

fn parse_layout(p: &mut PerfParams, arg: &str) -> Result<(), String> {
    if let Some(l) = DataLayout::from_name(arg) {
        p.layout = l;
        return Ok(());
    }
    let mut it = arg.splitn(2, ',');
    let send = it.next().and_then(UcpDatatype::from_name);
    let recv = it.next().map(UcpDatatype::from_name);
    match (send, recv) {
        (Some(s), None) => p.ucp_send_datatype = s,
        (Some(s), Some(Some(r))) => {
            p.ucp_send_datatype = s;
            p.ucp_recv_datatype = r;
        }
        _ => {
            return Err(format!(
                "invalid data layout '{arg}' (valid: short, shortiov, bcopy, zcopy; \
                 for UCP tests contig or iov, optionally ,contig or ,iov for the receiver)"
            ))
        }
    }
    Ok(())
}

/// Checks a test's parameters as the reference does before it opens a transport. Limits that
/// depend on the transport (largest short/bcopy/zcopy size, io-vector entries, whether the
/// transport/device exists) are the caller's: see [`unknown_resource_error`].
pub fn validate(p: &PerfParams) -> Result<(), String> {
    if !p.has_test {
        return Err(format!("missing test name: use -t <test> (valid: {})", valid_tests()));
    }
    let test = p.test;
    let name = test.name();
    let cmd = test.command();
    let size = p.message_size();
    if p.max_outstanding < 1 {
        return Err("max_outstanding (-O) must be at least 1".to_string());
    }
    let zero_size_ok =
        test.api() == Api::Ucp && matches!(cmd, Command::Am | Command::Tag | Command::TagSync | Command::Stream);
    if size < 1 && !zero_size_ok {
        return Err(format!("message size too small for test '{name}': need at least 1 byte (-s)"));
    }
    if p.iov_stride != 0 {
        if let Some(&big) = p.msg_sizes.iter().find(|&&s| s > p.iov_stride) {
            return Err(format!("buffer size {big} bigger than stride {} (-s, -i)", p.iov_stride));
        }
    }
    if test.api() == Api::Ucp {
        return Ok(());
    }

    // UCT tests from here on.
    // No -d is accepted (unlike the reference): the caller takes the transport's only device,
    // or reports the choices with `missing_device_error`.
    if p.tl.is_none() {
        return Err(format!("a transport must be specified with -x for UCT test '{name}' (e.g. -x posix)"));
    }
    if p.threads > 1 {
        return Err(format!("UCT tests do not support multi-thread mode (-T {})", p.threads));
    }
    if cmd.is_atomic() {
        // The layout is not used by atomics (the reference ignores -D for them).
        if size != 4 && size != 8 {
            return Err(format!("invalid message size {size} for atomic test '{name}' (valid: 4, 8)"));
        }
        return Ok(());
    }
    match (cmd, p.layout) {
        (Command::Get, DataLayout::Short) => {
            return Err(format!(
                "data layout 'short' cannot be used for test '{name}' (valid: bcopy, zcopy; e.g. -D bcopy)"
            ))
        }
        (Command::Get, DataLayout::ShortIov) | (Command::Put, DataLayout::ShortIov) => {
            return Err(format!(
                "data layout 'shortiov' is only for active messages, not for test '{name}' \
                 (valid: short, bcopy, zcopy)"
            ))
        }
        _ => {}
    }
    if cmd == Command::Am {
        if p.layout == DataLayout::Short && p.am_hdr_size != 8 {
            return Err(format!("short AM header size must be 8 bytes (-H {})", p.am_hdr_size));
        }
        if p.am_hdr_size > size {
            return Err(format!("AM header size ({}) is larger than message size ({size})", p.am_hdr_size));
        }
        if p.fc_window > MAX_FC_WINDOW {
            return Err(format!("AM flow-control window ({}) too large (valid: 0..{MAX_FC_WINDOW})", p.fc_window));
        }
        if p.layout == DataLayout::Zcopy && p.msg_sizes.len() > 1 && p.am_hdr_size > p.msg_sizes[0] {
            return Err(format!(
                "AM header size ({}) larger than the first IOV message size ({})",
                p.am_hdr_size, p.msg_sizes[0]
            ));
        }
    }
    Ok(())
}

/// The one-line error for a UCT test without `-d` whose transport has several devices (or
/// none); `devices` are that transport's devices.
pub fn missing_device_error(tl: &str, devices: &[String]) -> String {
    if devices.is_empty() {
        format!("transport '{tl}' has no devices here")
    } else {
        format!("a device must be specified with -d for transport '{tl}' (valid: {})", devices.join(", "))
    }
}

/// The one-line error for a `-x`/`-d` pair that no transport offers; `valid` lists the
/// available pairs as `tl/dev` (e.g. `posix/memory`).
pub fn unknown_resource_error(tl: &str, dev: &str, valid: &[String]) -> String {
    if valid.is_empty() {
        format!("cannot use {tl}/{dev}: no transports are available")
    } else {
        format!("cannot use {tl}/{dev} (valid: {})", valid.join(", "))
    }
}

/// The tests to run: without batch files the command line's test alone (validated); with
/// them, every combination of one line per batch file (files nested in `-b` order, lines in
/// file order), each line's options applied over the previous level's parameters, as the
/// reference does. Lines are split at blanks; empty lines and lines whose first word starts
/// with `#` are skipped; the first word names the test in the output (`batch_names`), the
/// rest are test options (not `-p -b -6 -N -f -v -c -h`; `-I` means wakeup there).
///
/// Unlike the reference, which reads a batch file as it runs it, every file is read and
/// every test validated before the first one runs.
pub fn expand_batch(params: &PerfParams) -> Result<Vec<PerfParams>, String> {
    if params.batch_files.is_empty() {
        let mut p = params.clone();
        if p.has_test {
            p.resolve_window();
        }
        validate(&p)?;
        return Ok(vec![p]);
    }
    let mut files = Vec::with_capacity(params.batch_files.len());
    for path in &params.batch_files {
        let bytes = std::fs::read(path).map_err(|e| format!("failed to open batch file '{}': {e}", path.display()))?;
        files.push((path.as_path(), String::from_utf8_lossy(&bytes).into_owned()));
    }
    let mut out = Vec::new();
    expand_level(params, &files, 0, &mut out)?;
    Ok(out)
}

fn expand_level(
    parent: &PerfParams,
    files: &[(&Path, String)],
    depth: usize,
    out: &mut Vec<PerfParams>,
) -> Result<(), String> {
    let Some((path, text)) = files.get(depth) else {
        validate(parent).map_err(|e| format!("in batch test '{}': {e}", parent.batch_names.join("/")))?;
        out.push(parent.clone());
        return Ok(());
    };
    for (lineno, line) in text.lines().enumerate() {
        let words: Vec<String> = line.split([' ', '\t', '\r']).filter(|w| !w.is_empty()).map(str::to_string).collect();
        let Some(first) = words.first() else { continue };
        if first.starts_with('#') {
            continue;
        }
        let prefix = format!("in batch file '{}' line {}: ", path.display(), lineno + 1);
        let mut p = parent.clone();
        apply_batch_line(&mut p, &words[1..]).map_err(|e| format!("{prefix}{e}"))?;
        if !p.has_test {
            return Err(format!("{prefix}missing test name (valid: {})", valid_tests()));
        }
        p.resolve_window();
        p.batch_names.truncate(depth);
        p.batch_names.push(first.clone());
        expand_level(&p, files, depth + 1, out)?;
    }
    Ok(())
}

fn apply_batch_line(p: &mut PerfParams, args: &[String]) -> Result<(), String> {
    let was_loopback = p.loopback;
    for item in getopt(args, TEST_OPTS)? {
        match item {
            Item::Positional(s) => return Err(format!("unexpected argument '{s}'")),
            Item::Opt(c, arg) => apply_test_opt(p, c, arg.as_deref().unwrap_or(""))?,
        }
    }
    if p.loopback && !was_loopback {
        return Err("-l must be given on the command line, not in a batch file".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn run(s: &str) -> PerfParams {
        match parse(&args(s)) {
            Ok(Parsed::Run(p)) => p,
            other => panic!("{s}: {other:?}"),
        }
    }

    fn err(s: &str) -> String {
        match parse(&args(s)) {
            Err(e) => e,
            other => panic!("{s}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_the_reference() {
        let p = run("");
        assert!(p.is_server() && !p.has_test);
        assert_eq!(p.msg_sizes, vec![8]);
        assert_eq!((p.iters, p.warmup, p.port, p.fc_window, p.am_hdr_size), (1_000_000, 10_000, 13337, 127, 8));
        assert_eq!(p.percentile, 50.0);
        assert_eq!(p.layout, DataLayout::Short);
        assert_eq!((p.threads, p.thread_mode), (1, ThreadMode::Single));
        assert_eq!(p.max_outstanding, 0, "unresolved without a test");
    }

    #[test]
    fn table_is_in_declaration_order() {
        for (i, k) in TestKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert_eq!(TestKind::from_name(k.name()), Some(*k));
        }
        assert_eq!(TestKind::AmLat.description(), "UCT active message latency");
        assert_eq!(TestKind::UcpAmBw.description(), "UCP am bandwidth / message rate");
        assert_eq!(TestKind::AmBw.latency_label(), "overhead");
        assert_eq!(TestKind::Get.latency_label(), "latency");
        assert_eq!(TestKind::Fadd.pattern(), Pattern::StreamUni);
        assert_eq!(TestKind::PutLat.command(), Command::Put);
        assert!(TestKind::AddMr.is_uct() && !TestKind::TagLat.is_uct());
    }

    #[test]
    fn loopback_client_and_server() {
        let p = run("-l -t am_lat -x posix -d memory -n 100000");
        assert!(p.loopback && !p.is_server() && p.server.is_none());
        assert_eq!((p.test, p.iters, p.max_outstanding), (TestKind::AmLat, 100_000, 1));
        assert_eq!((p.tl.as_deref(), p.dev.as_deref()), (Some("posix"), Some("memory")));

        // Host name first or last, as getopt permutes.
        let c = run("127.0.0.1 -t am_bw -x posix -d memory -p 23456");
        assert_eq!(c.server.as_deref(), Some("127.0.0.1"));
        assert_eq!(c.port, 23456);
        let c2 = run("-t am_bw -x posix -d memory -p 23456 127.0.0.1");
        assert_eq!(c, c2);

        // A server needs no test: it takes the client's.
        let s = run("-p 23456 -6 -f");
        assert!(s.is_server() && s.ipv6 && s.final_only);
    }

    #[test]
    fn getopt_forms() {
        let p = run("-l -tam_lat -xposix -dmemory -n100 -fvN -s 16,48,8192");
        assert_eq!(p.iters, 100);
        assert!(p.final_only && p.csv && p.numeric);
        assert_eq!(p.msg_sizes, vec![16, 48, 8192]);
        assert_eq!(p.message_size(), 16 + 48 + 8192);
        // The word after an option taking an argument is its argument, even if it looks
        // like an option.
        assert_eq!(err("-l -x posix -d memory -t -n"), format!("invalid test name: '-n' (valid: {})", valid_tests()));
        // `--` ends the options.
        let q = run("-t am_lat -x posix -d memory -- host");
        assert_eq!(q.server.as_deref(), Some("host"));
    }

    #[test]
    fn window_resolution() {
        assert_eq!(run("-l -t tag_bw").max_outstanding, 32);
        assert_eq!(run("-l -t ucp_am_bw").max_outstanding, 32);
        assert_eq!(run("-l -t tag_lat").max_outstanding, 1);
        assert_eq!(run("-l -t tag_bw -O 4").max_outstanding, 4);
        assert_eq!(run("-l -t am_bw -x posix -d memory").max_outstanding, 1);
    }

    #[test]
    fn dash_i_means_extra_info_on_the_command_line() {
        let p = run("-l -t am_lat -x posix -d memory -I");
        assert!(p.extra_info && !p.wakeup);
    }

    #[test]
    fn one_line_errors() {
        let e = err("-t foo");
        assert!(e.starts_with("invalid test name: 'foo' (valid: am_lat, put_lat, add_lat, get,"), "{e}");
        assert!(e.ends_with("ucp_am_lat, ucp_am_bw)"), "{e}");
        assert!(err("-t am_lat -D x").starts_with("invalid data layout 'x' (valid: short, shortiov, bcopy, zcopy"));
        assert_eq!(err("-k"), "invalid option -k (run with -h for help)");
        assert_eq!(err("-t"), "option -t requires an argument (run with -h for help)");
        assert_eq!(err("-n abc"), "invalid value for -n: 'abc' (expected a non-negative integer)");
        assert_eq!(err("-n -5"), "invalid value for -n: '-5' (expected a non-negative integer)");
        assert_eq!(err("-p 70000"), "invalid value for -p: '70000' (expected 0..65535)");
        assert_eq!(err("-R 200"), "invalid percentile rank for -R: '200' (valid: 0.0 to 100.0)");
        assert_eq!(err("-R nan"), "invalid percentile rank for -R: 'nan' (valid: 0.0 to 100.0)");
        assert_eq!(err("-M x"), "invalid thread mode for -M: 'x' (valid: single, serialized, multi)");
        assert!(err("-s 8,x").starts_with("invalid message size list for -s: '8,x'"));
        assert!(err("-s 8,").starts_with("invalid message size list"));
        assert_eq!(err("-m cuda"), "unsupported memory type for -m: 'cuda' (valid: host)");
        assert!(err("-c 1,x").starts_with("invalid cpu list for -c: '1,x'"));
        assert_eq!(
            err("-l -t am_lat localhost"),
            "conflicting arguments: server hostname argument is not allowed in loopback (-l) mode"
        );
        assert!(err("a b").starts_with("unexpected argument 'b'"));
        assert!(err("-l").starts_with("missing test name: use -t <test> (valid: am_lat,"));
        for e in [err("-l"), err("-t foo"), err("-l -t get -x posix -d memory")] {
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn combinations_the_reference_rejects() {
        // Without -d the caller picks the transport's device.
        assert_eq!(run("-l -t am_lat -x posix").dev, None);
        assert_eq!(
            err("-l -t am_lat -d memory"),
            "a transport must be specified with -x for UCT test 'am_lat' (e.g. -x posix)"
        );
        let base = "-l -x posix -d memory";
        assert!(err(&format!("{base} -t get")).starts_with("data layout 'short' cannot be used for test 'get'"));
        assert!(err(&format!("{base} -t put_lat -D shortiov")).starts_with("data layout 'shortiov' is only for"));
        assert_eq!(err(&format!("{base} -t am_lat -H 4")), "short AM header size must be 8 bytes (-H 4)");
        assert_eq!(
            err(&format!("{base} -t am_lat -D bcopy -H 16")),
            "AM header size (16) is larger than message size (8)"
        );
        assert!(err(&format!("{base} -t am_bw -W 128")).starts_with("AM flow-control window (128) too large"));
        assert!(err(&format!("{base} -t am_lat -s 0")).starts_with("message size too small"));
        assert_eq!(
            err(&format!("{base} -t fadd -s 16")),
            "invalid message size 16 for atomic test 'fadd' (valid: 4, 8)"
        );
        assert!(err(&format!("{base} -t am_lat -T 2")).starts_with("UCT tests do not support multi-thread"));
        assert_eq!(err(&format!("{base} -t put_bw -s 8,8 -i 4")), "buffer size 8 bigger than stride 4 (-s, -i)");
        // Accepted as the reference accepts them.
        run(&format!("{base} -t get -D bcopy"));
        run(&format!("{base} -t fadd -D bcopy -s 4"));
        run(&format!("{base} -t am_lat -D bcopy -H 0"));
        run(&format!("{base} -t put_bw -W 500"));
        run("-l -t tag_lat -s 0");
        // A server's own test options are not checked: the client's are used.
        run("-t get");
    }

    #[test]
    fn ucp_layouts_and_modes() {
        let p = run("-l -t tag_lat -D iov,contig -M multi -T 2 -A signal -E sleep -r recv_data -C -U -e -z -B -q");
        assert_eq!((p.ucp_send_datatype, p.ucp_recv_datatype), (UcpDatatype::Iov, UcpDatatype::Contig));
        assert_eq!(p.layout, DataLayout::Short, "UCT layout untouched");
        assert_eq!((p.thread_mode, p.threads, p.async_mode), (ThreadMode::Multi, 2, AsyncMode::Signal));
        assert_eq!(p.wait_mode, Some(WaitMode::Sleep));
        assert!(p.stream_recv_data && p.wildcard && p.force_unexpected && p.err_handling);
        assert!(p.prereg && p.map_nonblock && p.quiet);
        assert_eq!(run("-l -t tag_lat -D iov").ucp_recv_datatype, UcpDatatype::Contig);
        assert!(err("-l -t tag_lat -D iov,x").starts_with("invalid data layout 'iov,x'"));
        let w = run("-l -t tag_lat -d memory -x posix").warnings();
        assert_eq!(w.len(), 2);
        assert!(w[0].starts_with("-d 'memory' ignored for UCP test"));
    }

    #[test]
    fn help() {
        let Ok(Parsed::Help(h)) = parse(&args("-t am_lat -h")) else { panic!() };
        assert!(h.starts_with("  Usage: ucx-perf [ server-hostname ] [ options ]\n\n  Common options:\n"));
        assert!(h.contains("\n           am_lat - UCT active message latency\n"));
        assert!(h.contains("\n     tag_sync_lat - UCP tag sync match latency\n"));
        assert!(h.contains("     -R <rank>      percentile rank of the percentile data in latency tests (50.0)\n"));
        assert!(h.contains("     -W <count>     flow control window size, for active messages (127)\n"));
        assert!(h.contains("     -H <size>      active message header size (0), not included in message size\n"));
        assert!(h.ends_with("UCX_TLS and UCX_[SELF|SHM|NET]_DEVICES.\n\n"));
        assert!(matches!(parse(&args("--help")), Ok(Parsed::Help(_))));
    }

    #[test]
    fn unknown_resource() {
        let valid = vec!["posix/memory".to_string(), "sysv/memory".to_string()];
        assert_eq!(
            unknown_resource_error("foo", "bar", &valid),
            "cannot use foo/bar (valid: posix/memory, sysv/memory)"
        );
        assert_eq!(unknown_resource_error("foo", "bar", &[]), "cannot use foo/bar: no transports are available");
        let devs = vec!["mlx5_0:1".to_string(), "mlx5_1:1".to_string()];
        assert_eq!(
            missing_device_error("rc_verbs", &devs),
            "a device must be specified with -d for transport 'rc_verbs' (valid: mlx5_0:1, mlx5_1:1)"
        );
    }

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let d = std::env::temp_dir().join(format!("ucx-perf-opts-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            TempDir(d)
        }
        fn file(&self, name: &str, text: &str) -> String {
            let p = self.0.join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn batch_files_merge_over_the_command_line() {
        let d = TempDir::new("merge");
        let f =
            d.file("b1.txt", "# comment\nlat1 -t am_lat -n 1000\n\n  lat2\t-t put_lat -n 2000 -s 16\r\nbw -t tag_bw\n");
        let p = run(&format!("-l -x posix -d memory -w 5 -b {f}"));
        assert!(!p.has_test);
        let tests = expand_batch(&p).unwrap();
        assert_eq!(tests.len(), 3);
        assert_eq!((tests[0].test, tests[0].iters, tests[0].warmup), (TestKind::AmLat, 1000, 5));
        assert_eq!(tests[0].batch_names, vec!["lat1"]);
        assert_eq!((tests[1].test, tests[1].iters, tests[1].msg_sizes.clone()), (TestKind::PutLat, 2000, vec![16]));
        assert_eq!(tests[2].max_outstanding, 32, "window resolved per line");
        assert_eq!(tests[2].iters, 1_000_000, "lines do not leak into each other");
    }

    #[test]
    fn nested_batch_files() {
        let d = TempDir::new("nested");
        let a = d.file("a.txt", "A1 -t am_lat\nA2 -t put_lat\n");
        let b = d.file("b.txt", "B1 -s 16\nB2 -s 32 -I\n");
        let p = run(&format!("-l -x posix -d memory -b {a} -b {b}"));
        let tests = expand_batch(&p).unwrap();
        let names: Vec<String> = tests.iter().map(|t| t.batch_names.join("/")).collect();
        assert_eq!(names, ["A1/B1", "A1/B2", "A2/B1", "A2/B2"]);
        assert_eq!(tests[3].test, TestKind::PutLat);
        assert_eq!(tests[3].msg_sizes, vec![32]);
        assert!(tests[1].wakeup && !tests[1].extra_info, "-I in a batch file is wakeup");
    }

    #[test]
    fn batch_errors_name_file_and_line() {
        let d = TempDir::new("errors");
        let f = d.file("bad.txt", "ok -t am_lat\nbad -t nope\n");
        let e = expand_batch(&run(&format!("-l -x posix -d memory -b {f}"))).unwrap_err();
        assert!(e.starts_with(&format!("in batch file '{f}' line 2: invalid test name: 'nope'")), "{e}");
        let g = d.file("nt.txt", "x -n 5\n");
        let e = expand_batch(&run(&format!("-l -x posix -d memory -b {g}"))).unwrap_err();
        assert!(e.starts_with(&format!("in batch file '{g}' line 1: missing test name")), "{e}");
        let h = d.file("v.txt", "g -t get\n");
        let e = expand_batch(&run(&format!("-l -x posix -d memory -b {h}"))).unwrap_err();
        assert!(e.starts_with("in batch test 'g': data layout 'short' cannot be used"), "{e}");
        let i = d.file("f.txt", "g -t am_lat -f\n");
        let e = expand_batch(&run(&format!("-l -x posix -d memory -b {i}"))).unwrap_err();
        assert!(e.ends_with("line 1: invalid option -f (run with -h for help)"), "{e}");
        let e = expand_batch(&run("-l -b /nonexistent/ucx-perf-batch")).unwrap_err();
        assert!(e.starts_with("failed to open batch file '/nonexistent/ucx-perf-batch': "), "{e}");
    }

    #[test]
    fn no_batch_expands_to_the_command_line() {
        let p = run("-l -t am_lat -x posix -d memory");
        assert_eq!(expand_batch(&p).unwrap(), vec![p]);
    }
}
