//! # ucx-perf - a drop-in for `ucx_perftest`
//!
//! Same tests, flags, defaults and output as the reference's UCT side:
//!
//! ```text
//! ucx-perf -l -t am_lat -x posix                 # one process, loopback
//! ucx-perf -t am_bw -x posix -d memory           # server: waits on TCP port -p (13337)
//! ucx-perf 127.0.0.1 -t am_bw -x posix -d memory # client: connects, both run, client prints
//! mpiexec -n 2 ucx-perf -t tag_lat                # a launcher's job: rank 0 serves, rank 1 prints
//! ```
//! Command line, output and bootstrap are in `opts`, `report` and `rte`; the tests themselves
//! in the library (`ucx_perf::uct_tests`).

use std::io::Write;
use std::process::ExitCode;

use ucx_perf::meter::Measured;
use ucx_perf::params::PerfParams;
use ucx_perf::ucp_tests::{self, UcpTestSpec};
use ucx_perf::uct_tests::{self, Exchange, UctTestSpec};

mod opts;
mod report;
mod rte;

use opts::Parsed;
use report::{PerfResult, Reporter};
use rte::Rte;

/// The bootstrap connection as the test engine's out-of-band channel.
struct Oob<'a>(&'a mut Rte);

impl Exchange for Oob<'_> {
    fn exchange(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        self.0.exchange(mine).map_err(|e| format!("exchange with the peer failed: {e}"))
    }

    fn barrier(&mut self, progress: &mut dyn FnMut()) -> Result<(), String> {
        self.0.barrier_with(progress).map_err(|e| format!("barrier with the peer failed: {e}"))
    }
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("ucx-perf: {msg}");
    ExitCode::from(1)
}

/// Resolves `-x`/`-d` against the resources found here: `tl/dev`.
fn resource(p: &PerfParams) -> Result<String, String> {
    let all = uct::query_resources();
    let names: Vec<String> = all.iter().map(|r| r.tl.full_name()).collect();
    let Some(tl) = p.tl.as_deref() else {
        return Err(format!("no transport given (use -x; valid: {})", names.join(", ")));
    };
    let devices: Vec<String> = all.iter().filter(|r| r.tl.tl_name == tl).map(|r| r.tl.dev_name.clone()).collect();
    match p.dev.as_deref() {
        Some(dev) if devices.iter().any(|d| d == dev) => Ok(format!("{tl}/{dev}")),
        Some(dev) => Err(opts::unknown_resource_error(tl, dev, &names)),
        None if devices.len() == 1 => Ok(format!("{tl}/{}", devices[0])),
        None if devices.is_empty() => Err(opts::unknown_resource_error(tl, "", &names)),
        None => Err(opts::missing_device_error(tl, &devices)),
    }
}

fn result(m: &Measured, msg_size: usize) -> PerfResult {
    PerfResult {
        iters: m.iters,
        bytes: m.iters * msg_size as u64,
        elapsed_s: m.elapsed_s,
        lat_percentile_us: m.lat_percentile_us,
        lat_avg_us: m.lat_avg_us,
        lat_overall_us: m.lat_overall_us,
        bw_avg_mbs: m.bw_avg_mbs,
        bw_overall_mbs: m.bw_overall_mbs,
        msgrate_avg: m.msgrate_avg,
        msgrate_overall: m.msgrate_overall,
    }
}

fn set_affinity(cpus: &[usize]) -> Result<(), String> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= libc::CPU_SETSIZE as usize {
            return Err(format!("invalid CPU {c}"));
        }
        // SAFETY: `c` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: valid set of the right size, for this thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(format!("cannot set CPU affinity to {cpus:?}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn run(p: PerfParams) -> Result<(), String> {
    set_affinity(&p.cpus)?;
    // Started by a launcher (mpiexec, srun, mpirun): rank 0 serves, rank 1 connects.
    let mut pmi = if p.loopback || p.server.is_some() {
        None
    } else {
        rte::launcher::detect(2).map_err(|e| format!("launcher: {e}"))?
    };
    let mut rte = if p.loopback {
        Rte::loopback()
    } else if let Some(pmi) = pmi.as_deref_mut() {
        Rte::launched(pmi, p.ipv6).map_err(|e| format!("{} bootstrap: {e}", pmi.name()))?
    } else if let Some(host) = p.server.as_deref() {
        Rte::connect(host, p.port, Some(p.ipv6), rte::CONNECT_RETRY)
            .map_err(|e| format!("cannot connect to {host}:{}: {e}", p.port))?
    } else {
        Rte::server(p.port, p.ipv6).map_err(|e| format!("cannot listen on port {}: {e}", p.port))?
    };
    // A peer that stops answering ends the run with an error instead of a hang.
    rte.set_timeout(Some(std::time::Duration::from_secs(300))).map_err(|e| e.to_string())?;
    let p = if p.loopback { p } else { rte.exchange_params(&p)? };
    for w in p.warnings() {
        eprintln!("ucx-perf: warning: {w}");
    }
    let index = rte.group_index() as u8;
    let tests = opts::expand_batch(&p)?;
    // Resolve every resource first: a bad -x/-d is one error line, before any output.
    let resources = tests
        .iter()
        .map(|t| {
            if t.test.is_uct() {
                resource(t)
            } else {
                UcpTestSpec { params: t, index }.check().map(|()| String::new())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = std::io::stdout().lock();
    let mut reporter = Reporter::new(&p, rte.is_server());
    reporter.header(&mut out).map_err(|e| e.to_string())?;
    for (t, res) in tests.iter().zip(resources) {
        if tests.len() > 1 && !p.loopback {
            rte.verify_params(t)?;
        }
        reporter.begin_test(&mut out, t).map_err(|e| e.to_string())?;
        let msg = t.message_size();
        let prints = reporter.prints_results();
        let mut io_err = None;
        let mut rep = |m: &Measured, fin: bool| {
            if !prints {
                return;
            }
            let r = result(m, msg);
            let w = if fin { reporter.final_row(&mut out, &r) } else { reporter.progress(&mut out, &r) };
            if let Err(e) = w.and_then(|_| out.flush()) {
                io_err.get_or_insert(e);
            }
        };
        if t.test.is_uct() {
            uct_tests::run(&UctTestSpec { params: t, resource: &res, index }, &mut Oob(&mut rte), &mut rep)?;
        } else {
            ucp_tests::run(&UcpTestSpec { params: t, index }, &mut Oob(&mut rte), &mut rep)?;
        }
        if let Some(e) = io_err {
            return Err(format!("cannot write results: {e}"));
        }
    }
    rte.close();
    if let Some(pmi) = pmi.as_deref_mut() {
        pmi.finalize().map_err(|e| format!("{}: {e}", pmi.name()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    ucs::log::init();
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let p = match opts::parse(&args) {
        Ok(Parsed::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(p)) => p,
        Err(e) => return fail(e),
    };
    match run(p) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
