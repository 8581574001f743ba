//! The `-h` text, as `ucx_perftest` prints it.

use ucx_perf::params::*;

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
         \x20                       generic - Generic datatype (pack/unpack callbacks; ucx-rs)\n\
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
