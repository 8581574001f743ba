//! The parameters of a run (`ucx_perf_params_t`): what the command line and batch files set,
//! and what the test engines ([`crate::uct_tests`], [`crate::ucp_tests`]) take as they are -
//! one vocabulary from the options to the engines.

use std::path::PathBuf;

mod kinds;
mod test;

pub use kinds::{
    thread_mode_from_name, thread_mode_name, AsyncMode, DataLayout, MemoryType, ThreadMode, UcpDatatype, WaitMode,
};
pub use test::{valid_tests, Api, Command, Pattern, TestKind};

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
    /// choices with `missing_device_error`.
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
    /// Names of the batch lines this test comes from, one per batch file (filled by the batch
    /// expansion; empty without batch files).
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

    /// Measured iterations, with `-n 0` (no limit) as the largest count.
    pub fn iters_limit(&self) -> u64 {
        if self.iters == 0 {
            u64::MAX
        } else {
            self.iters
        }
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
