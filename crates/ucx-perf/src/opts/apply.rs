//! Setting each option on the parameters: numbers, lists, names of tests, layouts, modes.

use ucx_perf::params::*;

use super::getopt::invalid_option;

/// Parses the decimal argument of option `opt`.
pub(super) fn parse_num<T: std::str::FromStr>(opt: char, s: &str) -> Result<T, String> {
    s.parse::<T>().map_err(|_| {
        let range = if opt == 'p' { "0..65535" } else { "a non-negative integer" };
        format!("invalid value for -{opt}: '{s}' (expected {range})")
    })
}

pub(super) fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
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

pub(super) fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    s.split(',').map(|tok| tok.parse::<usize>()).collect::<Result<Vec<_>, _>>().map_err(|_| {
        format!("invalid message size list for -s: '{s}' (expected sizes separated by commas, e.g. 16,48,8192)")
    })
}

/// Applies one test option (valid on the command line and in batch files). `-I` here is the
/// batch-file meaning (wakeup); the command line handles its own `-I` before.
pub(super) fn apply_test_opt(p: &mut PerfParams, c: char, arg: &str) -> Result<(), String> {
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
            p.thread_mode = thread_mode_from_name(arg)
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

pub(super) fn parse_mem_type(s: &str) -> Result<MemoryType, String> {
    MemoryType::from_name(s).ok_or_else(|| format!("unsupported memory type for -m: '{s}' (valid: host)"))
}

pub(super) fn parse_layout(p: &mut PerfParams, arg: &str) -> Result<(), String> {
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
                 for UCP tests contig, iov or generic, optionally ,contig ,iov or ,generic for the receiver)"
            ))
        }
    }
    Ok(())
}
