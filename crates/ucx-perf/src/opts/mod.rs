//! The command line of `ucx-perf`, option for option that of `ucx_perftest` (UCX 1.13).
//!
//! Files by job: `getopt` splits the words as glibc does, `apply` sets each option on the
//! parameters (the engines' own types, [`ucx_perf::params`]), `validate` checks a test as the
//! reference does, `batch` expands `-b` files, `help` prints `-h`.
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

mod apply;
mod batch;
mod getopt;
mod help;
#[cfg(test)]
mod tests;
mod validate;

use std::path::PathBuf;

use ucx_perf::params::*;

use apply::{apply_test_opt, parse_cpus, parse_num};
use getopt::{getopt, Item};

pub use batch::expand_batch;
pub use help::help_text;
pub use validate::{missing_device_error, unknown_resource_error, validate};

/// Options of the command line only (not valid in batch files).
const MAIN_OPTS: &str = "p:b:6NfvIc:P:h";
/// Test options, valid on the command line and in batch files.
const TEST_OPTS: &str = "t:n:s:W:O:w:D:i:H:oSCIqM:r:E:T:d:x:A:BUem:R:lz";

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // built once per process
pub enum Parsed {
    /// Run the test(s).
    Run(PerfParams),
    /// `-h`: print this text to stdout and exit 0.
    Help(String),
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
