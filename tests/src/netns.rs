//! Two network namespaces joined by a veth pair, made by a test and removed when it ends, so
//! that tcp crosses a real network device instead of loopback. Needs root and `ip` (iproute2);
//! [`NetPair::new`] says why when it cannot.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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
    /// Its address (IPv4, or IPv6 alone: see [`NetPair::new_v6`]).
    pub ip: IpAddr,
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
    /// Makes the namespaces and the veth pair, both ends up (loopback too), addressed in an
    /// IPv4 /24.
    pub fn new() -> Result<NetPair, String> {
        Self::make(false)
    }

    /// The same with IPv6 addresses only (a /64 of unique local addresses, no duplicate
    /// detection, so they are usable at once; IPv6 switched on in both namespaces).
    pub fn new_v6() -> Result<NetPair, String> {
        Self::make(true)
    }

    fn make(v6: bool) -> Result<NetPair, String> {
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
            ip: if v6 {
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0x7563, u16::from(net), u16::from(sub), 0, 0, 0, u16::from(host)))
            } else {
                IpAddr::V4(Ipv4Addr::new(10, 100 + net % 100, sub, host))
            },
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
            match s.ip {
                IpAddr::V4(x) => ip(&["-n", &s.ns, "addr", "add", &format!("{x}/24"), "dev", &s.dev])?,
                IpAddr::V6(x) => {
                    let on = Command::new("ip")
                        .args(["netns", "exec", &s.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0"])
                        .status()
                        .map_err(|e| format!("sysctl: {e}"))?;
                    if !on.success() {
                        return Err("cannot switch IPv6 on in a namespace".into());
                    }
                    ip(&["-n", &s.ns, "-6", "addr", "add", &format!("{x}/64"), "dev", &s.dev, "nodad"])?
                }
            }
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
