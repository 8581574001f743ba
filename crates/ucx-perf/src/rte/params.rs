//! The test parameters on the wire: the client sends its parameters as `name value` lines
//! under a versioned header; the server decodes them strictly and keeps its own output and
//! machine-local options.

use ucx_perf::params::{
    thread_mode_from_name, thread_mode_name, AsyncMode, DataLayout, MemoryType, PerfParams, TestKind, UcpDatatype,
    WaitMode,
};

use super::PARAMS_HEADER;

/// The client's parameters with the server's local options kept.
pub(super) fn merge_local(mut theirs: PerfParams, local: &PerfParams) -> PerfParams {
    theirs.server = local.server.clone();
    theirs.port = local.port;
    theirs.ipv6 = local.ipv6;
    theirs.cpus.clone_from(&local.cpus);
    theirs.final_only = local.final_only;
    theirs.csv = local.csv;
    theirs.numeric = local.numeric;
    theirs.extra_info = local.extra_info;
    theirs.batch_files.clone_from(&local.batch_files);
    theirs.batch_names.clone_from(&local.batch_names);
    theirs
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            c => o.push(c),
        }
    }
    o
}

fn unescape(s: &str) -> Result<String, String> {
    let mut o = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            o.push(c);
            continue;
        }
        match it.next() {
            Some('\\') => o.push('\\'),
            Some('n') => o.push('\n'),
            Some('r') => o.push('\r'),
            _ => return Err(format!("bad escape in '{s}'")),
        }
    }
    Ok(o)
}

fn opt_str(v: &Option<String>) -> String {
    match v {
        None => "-".to_string(),
        Some(s) => format!("={}", escape(s)),
    }
}

fn b(v: bool) -> u8 {
    u8::from(v)
}

/// The test parameters as text lines `key value` (machine-local ones left out), in a fixed
/// order so two encodings compare byte for byte.
pub(super) fn encode_params(p: &PerfParams) -> String {
    let sizes: Vec<String> = p.msg_sizes.iter().map(usize::to_string).collect();
    let mut s = format!(
        "{PARAMS_HEADER}\n\
         test {}\n\
         msg_sizes {}\n\
         iters {}\n\
         warmup {}\n\
         max_outstanding {}\n\
         iov_stride {}\n\
         loopback {}\n\
         no_responder_progress {}\n\
         map_nonblock {}\n\
         percentile {}\n\
         dev {}\n\
         tl {}\n\
         layout {}\n\
         ucp_send_datatype {}\n\
         ucp_recv_datatype {}\n\
         fc_window {}\n\
         am_hdr_size {}\n\
         ucp_am_hdr_size {}\n\
         send_mem {}\n\
         recv_mem {}\n\
         thread_mode {}\n\
         threads {}\n\
         async_mode {}\n\
         wait_mode {}\n\
         wildcard {}\n\
         force_unexpected {}\n\
         wakeup {}\n\
         err_handling {}\n\
         prereg {}\n\
         stream_recv_data {}\n\
         quiet {}\n",
        if p.has_test { p.test.name() } else { "-" },
        sizes.join(","),
        p.iters,
        p.warmup,
        p.max_outstanding,
        p.iov_stride,
        b(p.loopback),
        b(p.no_responder_progress),
        b(p.map_nonblock),
        p.percentile,
        opt_str(&p.dev),
        opt_str(&p.tl),
        p.layout.name(),
        p.ucp_send_datatype.name(),
        p.ucp_recv_datatype.name(),
        p.fc_window,
        p.am_hdr_size,
        p.ucp_am_hdr_size,
        p.send_mem.name(),
        p.recv_mem.name(),
        thread_mode_name(p.thread_mode),
        p.threads,
        p.async_mode.name(),
        p.wait_mode.map_or("-", |w| w.name()),
        b(p.wildcard),
        b(p.force_unexpected),
        b(p.wakeup),
        b(p.err_handling),
        b(p.prereg),
        b(p.stream_recv_data),
        b(p.quiet),
    );
    for n in &p.batch_names {
        s.push_str(&format!("batch_name ={}\n", escape(n)));
    }
    s
}

/// Reads [`encode_params`]' text back, checking every field; local options get defaults.
pub(super) fn decode_params(blob: &[u8]) -> Result<PerfParams, String> {
    let text = std::str::from_utf8(blob).map_err(|_| "the client's parameters are not UTF-8".to_string())?;
    let mut lines = text.lines();
    if lines.next() != Some(PARAMS_HEADER) {
        return Err("the client's parameters are in an unknown format (another ucx-perf version?)".to_string());
    }
    let mut p = PerfParams::default();
    let mut seen = std::collections::HashSet::new();
    for line in lines {
        let (key, val) = line.split_once(' ').ok_or_else(|| format!("bad parameter line '{line}'"))?;
        if key != "batch_name" && !seen.insert(key) {
            return Err(format!("parameter '{key}' sent twice"));
        }
        let bad = || format!("bad value for parameter '{key}': '{val}'");
        let num = |v: &str| v.parse::<u64>().map_err(|_| bad());
        let flag = |v: &str| match v {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(bad()),
        };
        let ostr = |v: &str| -> Result<Option<String>, String> {
            match v {
                "-" => Ok(None),
                _ => v.strip_prefix('=').map(unescape).transpose()?.map(Some).ok_or_else(bad),
            }
        };
        let small = |v: &str| -> Result<u32, String> { num(v)?.try_into().map_err(|_| bad()) };
        let size = |v: &str| -> Result<usize, String> { num(v)?.try_into().map_err(|_| bad()) };
        match key {
            "test" => {
                p.has_test = val != "-";
                if p.has_test {
                    p.test = TestKind::from_name(val).ok_or_else(bad)?;
                }
            }
            "msg_sizes" => p.msg_sizes = val.split(',').map(size).collect::<Result<_, _>>()?,
            "iters" => p.iters = num(val)?,
            "warmup" => p.warmup = num(val)?,
            "max_outstanding" => p.max_outstanding = small(val)?,
            "iov_stride" => p.iov_stride = size(val)?,
            "loopback" => p.loopback = flag(val)?,
            "no_responder_progress" => p.no_responder_progress = flag(val)?,
            "map_nonblock" => p.map_nonblock = flag(val)?,
            "percentile" => {
                p.percentile = val.parse::<f64>().ok().filter(|r| (0.0..=100.0).contains(r)).ok_or_else(bad)?
            }
            "dev" => p.dev = ostr(val)?,
            "tl" => p.tl = ostr(val)?,
            "layout" => p.layout = DataLayout::from_name(val).ok_or_else(bad)?,
            "ucp_send_datatype" => p.ucp_send_datatype = UcpDatatype::from_name(val).ok_or_else(bad)?,
            "ucp_recv_datatype" => p.ucp_recv_datatype = UcpDatatype::from_name(val).ok_or_else(bad)?,
            "fc_window" => p.fc_window = small(val)?,
            "am_hdr_size" => p.am_hdr_size = size(val)?,
            "ucp_am_hdr_size" => p.ucp_am_hdr_size = size(val)?,
            "send_mem" => p.send_mem = MemoryType::from_name(val).ok_or_else(bad)?,
            "recv_mem" => p.recv_mem = MemoryType::from_name(val).ok_or_else(bad)?,
            "thread_mode" => p.thread_mode = thread_mode_from_name(val).ok_or_else(bad)?,
            "threads" => p.threads = small(val)?,
            "async_mode" => p.async_mode = AsyncMode::from_name(val).ok_or_else(bad)?,
            "wait_mode" => {
                p.wait_mode = if val == "-" { None } else { Some(WaitMode::from_name(val).ok_or_else(bad)?) }
            }
            "wildcard" => p.wildcard = flag(val)?,
            "force_unexpected" => p.force_unexpected = flag(val)?,
            "wakeup" => p.wakeup = flag(val)?,
            "err_handling" => p.err_handling = flag(val)?,
            "prereg" => p.prereg = flag(val)?,
            "stream_recv_data" => p.stream_recv_data = flag(val)?,
            "quiet" => p.quiet = flag(val)?,
            "batch_name" => p.batch_names.push(ostr(val)?.ok_or_else(bad)?),
            _ => return Err(format!("unknown parameter '{key}' (another ucx-perf version?)")),
        }
    }
    const KEYS: usize = 31;
    if seen.len() != KEYS {
        return Err(format!("the client's parameters are incomplete ({} of {KEYS} fields)", seen.len()));
    }
    Ok(p)
}
