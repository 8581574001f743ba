//! Two network namespaces joined by a veth pair, made by a test and removed when it ends, so
//! that tcp crosses a real network device instead of loopback. Needs root and `ip` (iproute2);
//! [`NetPair::new`] says why when it cannot.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One side of the pair.
#[derive(Clone, Debug)]
pub struct Side {
    /// The namespace's name.
    pub ns: String,
    /// The veth device in it.
    pub dev: String,
    /// Its IPv4 address.
    pub ip: Ipv4Addr,
}

/// Namespaces `a` and `b`, each with one end of a veth pair, addressed in one /24.
#[derive(Debug)]
pub struct NetPair {
    /// The first namespace.
    pub a: Side,
    /// The second namespace.
    pub b: Side,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if !out.status.success() {
        return Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

impl NetPair {
    /// Makes the namespaces and the veth pair, both ends up (loopback too).
    pub fn new() -> Result<NetPair, String> {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            return Err("network namespaces need root".into());
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let net = (pid % 200) as u8;
        let sub = (n % 250) as u8;
        let side = |x: &str, host: u8| Side {
            ns: format!("ucxrs-{pid}-{n}{x}"),
            dev: format!("ucx{}{n}{x}", pid % 100_000),
            ip: Ipv4Addr::new(10, 100 + net % 100, sub, host),
        };
        let pair = NetPair { a: side("a", 1), b: side("b", 2) };
        pair.setup().inspect_err(|_| drop_ns(&pair))?;
        Ok(pair)
    }

    fn setup(&self) -> Result<(), String> {
        let (a, b) = (&self.a, &self.b);
        ip(&["netns", "add", &a.ns])?;
        ip(&["netns", "add", &b.ns])?;
        ip(&["link", "add", &a.dev, "netns", &a.ns, "type", "veth", "peer", "name", &b.dev, "netns", &b.ns])?;
        for s in [a, b] {
            ip(&["-n", &s.ns, "addr", "add", &format!("{}/24", s.ip), "dev", &s.dev])?;
            ip(&["-n", &s.ns, "link", "set", &s.dev, "up"])?;
            ip(&["-n", &s.ns, "link", "set", "lo", "up"])?;
        }
        // A device is listed by the transports once it runs (has carrier), a moment after.
        let t = std::time::Instant::now();
        while ![a, b].iter().all(|s| running(s)) {
            if t.elapsed() > std::time::Duration::from_secs(10) {
                return Err("the veth pair does not come up".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(())
    }

    /// `exe args...` to run inside `side`'s namespace (through `ip netns exec`).
    pub fn command(side: &Side, exe: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &side.ns, exe]).args(args);
        c
    }

    /// Takes `side`'s device down (the link between the namespaces is gone).
    pub fn link_down(side: &Side) -> Result<(), String> {
        ip(&["-n", &side.ns, "link", "set", &side.dev, "down"])
    }
}

/// Whether `side`'s device is up with carrier (`LOWER_UP`).
fn running(side: &Side) -> bool {
    Command::new("ip")
        .args(["-n", &side.ns, "-o", "link", "show", "dev", &side.dev])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("LOWER_UP"))
}

fn drop_ns(p: &NetPair) {
    // Removing a namespace removes its end of the pair, and with it the other end.
    let _ = ip(&["netns", "del", &p.a.ns]);
    let _ = ip(&["netns", "del", &p.b.ns]);
}

impl Drop for NetPair {
    fn drop(&mut self) {
        drop_ns(self);
    }
}
