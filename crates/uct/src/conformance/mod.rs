//! Transport conformance kit (feature `conformance`).
//!
//! Reusable checks of the transport contract. Each takes [`Options`] naming a resource
//! (`tl/dev`, e.g. `self/memory0`) and returns a [`Verdict`]: `Passed`, or `Skipped` with the
//! capability the transport does not advertise. A violation panics with a message saying what
//! was expected, so the checks are meant to run inside `#[test]` functions:
//!
//! ```ignore
//! #[test]
//! fn self_am_sizes() {
//!     uct_shm::register();
//!     uct::conformance::am_sizes(&Options::new("self/memory0")).assert_ran();
//! }
//! ```
//!
//! Every wait is bounded in iterations and time ([`Options::timeout`]); nothing sleeps.
//!
//! # Across processes
//!
//! With [`Options::across_processes`] the receiving side of every check (its interface,
//! handlers, kept descriptors and target memory) lives in an *agent* process, and the test
//! process only sends. The agent is a small program that registers the transports and calls
//! [`serve_agent`]; the two talk over the agent's stdin and stdout, one request line and one
//! answer line at a time. [`peer_failure`] then also kills the agent and checks that the
//! survivor notices. The workspace's agent is the `tests` package's `kit-agent` binary, which
//! that package's integration tests start through Cargo's `CARGO_BIN_EXE_kit-agent`:
//!
//! ```ignore
//! // src/bin/kit-agent.rs
//! fn main() {
//!     uct_shm::register();
//!     uct::conformance::serve_agent();
//! }
//!
//! // tests/kit.rs
//! #[test]
//! fn posix_across_processes() {
//!     uct_shm::register();
//!     let agent = AgentCommand::program(env!("CARGO_BIN_EXE_kit-agent"));
//!     let opts = Options::new("posix/memory").across_processes(agent);
//!     for (name, verdict) in uct::conformance::run_all(&opts) { /* ... */ }
//! }
//! ```

mod am;
mod peer;
mod rma;
mod setup;
mod tag;

pub use am::{am_invalid, am_keep_desc, am_reentrant, am_sizes, am_zcopy_iov, pending_fairness};
pub use peer::{serve_agent, AgentCommand};
pub use rma::{atomics, ep_check, flush, peer_failure, put_get, rkey_unpack_garbage};
pub use setup::{Options, Pair, Target};
pub use tag::tag_matching;

/// Outcome of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every assertion held.
    Passed,
    /// Not applicable: the transport does not advertise what the check needs.
    Skipped(String),
}

impl Verdict {
    /// Panics unless the check passed or was legitimately skipped; returns whether it ran.
    pub fn assert_ran(&self) -> bool {
        match self {
            Verdict::Passed => true,
            Verdict::Skipped(why) => {
                eprintln!("conformance check skipped: {why}");
                false
            }
        }
    }
}

/// Turns among this process's busy-polling tests (the test harness runs tests on parallel
/// threads, and two busy-polling sides already fill a small machine).
static TURNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes this process's turn for a busy-polling test; the next one waits until the guard goes.
pub fn take_turn() -> std::sync::MutexGuard<'static, ()> {
    TURNS.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`run_all`] for a test binary: it takes a turn ([`take_turn`]), prints every verdict, and
/// panics on a skipped check unless `may_skip(check, reason, across_processes)` allows it.
/// (`tag_matching` may skip on interfaces opened without tag handlers: transports offer tag
/// matching only with them.) Returns the verdicts.
pub fn run_checked(opts: &Options, may_skip: impl Fn(&str, &str, bool) -> bool) -> Vec<(&'static str, Verdict)> {
    let _turn = take_turn();
    let remote = opts.agent.is_some();
    let results = run_all(opts);
    for (name, v) in &results {
        eprintln!("{} ({}): {name}: {v:?}", opts.resource, if remote { "two processes" } else { "one process" });
        if let Verdict::Skipped(why) = v {
            let no_tag = *name == "tag_matching" && !opts.tag_handlers;
            assert!(no_tag || may_skip(name, why, remote), "{}: {name} skipped: {why}", opts.resource);
        }
    }
    results
}

/// Runs every check, returning `(name, verdict)` pairs.
pub fn run_all(opts: &Options) -> Vec<(&'static str, Verdict)> {
    vec![
        ("am_sizes", am_sizes(opts)),
        ("am_invalid", am_invalid(opts)),
        ("am_keep_desc", am_keep_desc(opts)),
        ("am_reentrant", am_reentrant(opts)),
        ("am_zcopy_iov", am_zcopy_iov(opts)),
        ("pending_fairness", pending_fairness(opts)),
        ("flush", flush(opts)),
        ("put_get", put_get(opts)),
        ("atomics", atomics(opts)),
        ("ep_check", ep_check(opts)),
        ("rkey_unpack_garbage", rkey_unpack_garbage(opts)),
        ("peer_failure", peer_failure(opts)),
        ("tag_matching", tag_matching(opts)),
    ]
}
