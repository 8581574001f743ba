//! The tests of the `-t` list: the layer each measures, its operation, its pattern, and what
//! the run and the report need to know about it (UCX 1.13's table, in its order).

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
pub fn valid_tests() -> String {
    TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
}
