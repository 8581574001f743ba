//! The line protocol between a test and the peer program it started: the peer prints the lines
//! meant for the test with [`say`] and takes commands from [`commands`]; the test drives it
//! through a [`Peer`], which never waits without a limit.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// Prefix of the lines a peer means for the test; its other output passes through to stderr.
pub const PREFIX: &str = "PEER< ";

/// How long a peer that was told to finish (its stdin closed) gets before it is killed.
const GRACE: Duration = Duration::from_secs(10);

/// Prints `line` for the test (in the peer).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // A test that went away closes the pipe: the peer's next read of stdin then ends it.
    let _ = writeln!(out, "{PREFIX}{line}");
    let _ = out.flush();
}

/// The test's commands, one per line, read from stdin on a thread (in the peer). The channel
/// disconnects when the test closes the pipe or exits.
pub fn commands() -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// A waker that does nothing, for loops that poll a future and progress between polls.
pub fn noop_waker() -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable};
    fn clone(_: *const ()) -> RawWaker {
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    // SAFETY: the vtable's functions ignore the data pointer and do nothing.
    unsafe { std::task::Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// A peer process as the test sees it. Dropping it closes the peer's stdin (which ends every
/// peer program) and reaps it, killing it if it is still there after a grace period.
pub struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    what: String,
}

/// Starts the ucp peer program at `exe` (a test's `env!("CARGO_BIN_EXE_ucp-peer")`) as
/// `ucp-peer MODE ADDR ARGS...`, ADDR being `w`'s address, over the transports `tls` with the
/// `UCX_*` settings `cfg` (`("RNDV_THRESH", "4096")` is `UCX_RNDV_THRESH=4096`).
pub fn start_ucp_peer(exe: &str, mode: &str, args: &[&str], w: &ucp::Worker, tls: &str, cfg: &[(&str, &str)]) -> Peer {
    let mut cmd = Command::new(exe);
    cmd.args([mode, &crate::text::hex(w.address())]).args(args).env("UCX_TLS", tls);
    for (k, v) in cfg {
        cmd.env(format!("UCX_{k}"), v);
    }
    Peer::start(cmd, &format!("ucp-peer {mode} over {tls}"))
}

impl Peer {
    /// Waits for the peer's `addr A` line (progressing `w`, at most `limit`) and connects an
    /// endpoint of `w` to the worker address A.
    pub fn connect(&mut self, w: &ucp::Worker, limit: Duration) -> ucp::Endpoint {
        let a = self.expect("addr", limit, || {
            w.progress();
        });
        w.ep_create(&crate::text::unhex(&a).expect("an address in hex")).expect("an endpoint to the peer")
    }

    /// Starts `cmd` with piped stdin and stdout; `what` names it in failure messages.
    pub fn start(mut cmd: Command, what: &str) -> Peer {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e}"));
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                match l.strip_prefix(PREFIX) {
                    Some(rest) => {
                        if tx.send(rest.to_string()).is_err() {
                            break;
                        }
                    }
                    None => eprintln!("{l}"),
                }
            }
        });
        Peer { child, stdin, lines, what: what.to_string() }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends the command `line`.
    pub fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap_or_else(|| panic!("{}: input already closed", self.what));
        writeln!(stdin, "{line}").and_then(|()| stdin.flush()).unwrap_or_else(|e| panic!("{}: {line}: {e}", self.what));
    }

    /// The next line from the peer, if one is there.
    pub fn try_line(&mut self) -> Option<String> {
        match self.lines.try_recv() {
            Ok(l) => Some(l),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                panic!("{}: exited ({:?}) while a line was awaited", self.what, self.child.wait())
            }
        }
    }

    /// The next line from the peer, calling `progress` while it waits (the peer may need this
    /// process's progress to get there). Panics after `limit` or when the peer exits first.
    pub fn line(&mut self, limit: Duration, mut progress: impl FnMut()) -> String {
        let t = Instant::now();
        loop {
            if let Some(l) = self.try_line() {
                return l;
            }
            progress();
            assert!(t.elapsed() < limit, "{}: no line in {limit:?}", self.what);
        }
    }

    /// The next line, which must start with `word` and a space (or be `word`); returns the
    /// rest.
    pub fn expect(&mut self, word: &str, limit: Duration, progress: impl FnMut()) -> String {
        let l = self.line(limit, progress);
        match l.strip_prefix(word) {
            Some("") => String::new(),
            Some(rest) if rest.starts_with(' ') => rest[1..].to_string(),
            _ => panic!("{}: expected '{word} ...', got '{l}'", self.what),
        }
    }

    /// Sends `line` and returns the answer (see [`Peer::line`]).
    pub fn ask(&mut self, line: &str, limit: Duration, progress: impl FnMut()) -> String {
        self.tell(line);
        self.line(limit, progress)
    }

    /// Closes the peer's stdin (most peers finish then) and waits for it to exit, calling
    /// `progress` meanwhile; panics after `limit`.
    pub fn finish(&mut self, limit: Duration, mut progress: impl FnMut()) -> ExitStatus {
        self.stdin.take();
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("child status") {
                return st;
            }
            progress();
            if t.elapsed() > limit {
                let _ = self.child.kill();
                panic!("{}: still running after {limit:?}", self.what);
            }
        }
    }

    /// Kills the peer and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stdin.take();
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // The output closes when the peer exits: wait for that rather than polling.
        let deadline = Instant::now() + GRACE;
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(_) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    eprintln!("{}: still running {GRACE:?} after its input closed; killed", self.what);
                    let _ = self.child.kill();
                    break;
                }
            }
        }
        let _ = self.child.wait();
    }
}

/// True when thread `tid` of process `pid` is blocked in the kernel (state `S`, e.g. in
/// `epoll_wait`), read from `/proc`. A test uses it to know that a peer (or a thread) went to
/// sleep before it sends what must wake it.
pub fn asleep(pid: u32, tid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else { return false };
    // The state follows the command name, which is in parentheses and may contain anything.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("S")
}
