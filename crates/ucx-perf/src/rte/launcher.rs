//! Starting `ucx-perf` as a two-rank job under the launchers users have, without linking MPI:
//!
//! - **PMI-1** (`mpiexec` of MPICH's hydra, `srun --mpi=pmi2` of Slurm): the "simple" wire
//!   protocol over the socket the launcher hands down in `PMI_FD` - text lines
//!   `cmd=NAME key=value ...` (`init`, `get_maxes`, `get_my_kvsname`, `put`, `barrier_in`,
//!   `get`, `finalize`); rank and size from `PMI_RANK` and `PMI_SIZE`. Values are hex-encoded
//!   (no spaces) and at most the server's `vallen_max` (1024 by default).
//! - **PMIx** (Open MPI's `mpirun`): `libpmix.so.2` loaded at run time (`PMIX_NAMESPACE` and
//!   `PMIX_RANK` in the environment say it is there): `PMIx_Init`, `PMIx_Put` + `PMIx_Commit`,
//!   `PMIx_Fence`, `PMIx_Get`, `PMIx_Finalize`.
//!
//! Either way the launcher's key-value store only carries rank 0's bootstrap address: rank 0
//! listens on a free port and publishes `ip,ip,...:port` (every address of its network devices,
//! loopback last), everyone meets at a barrier, and rank 1 connects to the first address that
//! answers. From there the bootstrap is the one of the server/client pair ([`super::Rte`]):
//! rank 0 is the server, rank 1 the client, and the client prints the results.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

/// The key rank 0 publishes its bootstrap address under.
pub const ADDR_KEY: &str = "ucxperf-addr";

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// A launcher's process-management interface.
pub trait Pmi {
    /// The launcher's name, for messages.
    fn name(&self) -> &'static str;
    /// This process's rank.
    fn rank(&self) -> u32;
    /// How many ranks the job has.
    fn size(&self) -> u32;
    /// Publishes `key` = `value` (made visible to the others by the next [`Pmi::fence`]).
    fn put(&mut self, key: &str, value: &[u8]) -> io::Result<()>;
    /// Waits for every rank; what was put before is visible afterwards.
    fn fence(&mut self) -> io::Result<()>;
    /// The value `rank` put under `key`.
    fn get(&mut self, rank: u32, key: &str) -> io::Result<Vec<u8>>;
    /// Leaves the job's process management.
    fn finalize(&mut self) -> io::Result<()>;
}

/// The launcher this process runs under, if any: PMI-1 when `PMI_FD` is set, else PMIx when
/// `PMIX_NAMESPACE` is. A PMI-1 job whose size is not `ranks` is refused before any PMI
/// traffic (ranks that leave in the middle of it upset hydra).
pub fn detect(ranks: u32) -> io::Result<Option<Box<dyn Pmi>>> {
    if let Ok(fd) = std::env::var("PMI_FD") {
        let size = env_u32("PMI_SIZE")?;
        if size != ranks {
            return Err(wrong_size("PMI-1", size, ranks));
        }
        return Ok(Some(Box::new(Pmi1::init(&fd)?)));
    }
    if std::env::var_os("PMIX_NAMESPACE").is_some() && std::env::var_os("PMIX_RANK").is_some() {
        return Ok(Some(Box::new(pmix::Pmix::init()?)));
    }
    Ok(None)
}

/// The error of a job with `size` ranks where `ranks` are needed.
pub fn wrong_size(launcher: &str, size: u32, ranks: u32) -> io::Error {
    err(format!("ucx-perf runs as a job of {ranks} ranks; {launcher} started {size} (use -n {ranks})"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// The PMI-1 "simple" protocol client.
pub struct Pmi1 {
    rd: BufReader<UnixStream>,
    wr: UnixStream,
    rank: u32,
    size: u32,
    kvsname: String,
    vallen_max: usize,
}

/// Parses `cmd=NAME key=value ...`.
fn parse_line(line: &str) -> HashMap<String, String> {
    line.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn env_u32(name: &str) -> io::Result<u32> {
    let v = std::env::var(name).map_err(|_| err(format!("PMI_FD is set but {name} is not")))?;
    v.parse().map_err(|_| err(format!("{name}={v} is not a number")))
}

impl Pmi1 {
    /// Takes over the socket `PMI_FD` names and says hello.
    fn init(fd: &str) -> io::Result<Pmi1> {
        let fd: i32 = fd.parse().map_err(|_| err(format!("PMI_FD={fd} is not a descriptor number")))?;
        // SAFETY: fstat only reads the descriptor's metadata into a local struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; an invalid descriptor gives an error, checked.
        if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(err(format!("PMI_FD={fd} is not an open socket")));
        }
        // SAFETY: the launcher handed this descriptor to this process for PMI; nothing else in
        // the process uses it, so the stream may own (and close) it.
        let wr = unsafe { UnixStream::from_raw_fd(fd) };
        let rd = BufReader::new(wr.try_clone()?);
        let (rank, size) = (env_u32("PMI_RANK")?, env_u32("PMI_SIZE")?);
        let mut p = Pmi1 { rd, wr, rank, size, kvsname: String::new(), vallen_max: 1024 };
        let r = p.call("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init")?;
        if r.get("pmi_version").map(String::as_str) != Some("1") {
            return Err(err(format!("the launcher speaks PMI version {:?}, not 1", r.get("pmi_version"))));
        }
        let maxes = p.call("cmd=get_maxes", "maxes")?;
        if let Some(v) = maxes.get("vallen_max").and_then(|v| v.parse().ok()) {
            p.vallen_max = v;
        }
        p.kvsname = p.call("cmd=get_my_kvsname", "my_kvsname")?.remove("kvsname").ok_or_else(|| err("no kvsname"))?;
        Ok(p)
    }

    /// Sends `line`, reads the answer, which must be `cmd=expect` with `rc` 0 if it has one.
    fn call(&mut self, line: &str, expect: &str) -> io::Result<HashMap<String, String>> {
        self.wr.write_all(line.as_bytes())?;
        self.wr.write_all(b"\n")?;
        let mut answer = String::new();
        if self.rd.read_line(&mut answer)? == 0 {
            return Err(err(format!("the launcher closed PMI_FD (answering '{line}')")));
        }
        let m = parse_line(answer.trim_end());
        if m.get("cmd").map(String::as_str) != Some(expect) {
            return Err(err(format!("PMI: '{line}' was answered '{}', expected cmd={expect}", answer.trim_end())));
        }
        if let Some(rc) = m.get("rc").filter(|rc| rc.as_str() != "0") {
            let msg = m.get("msg").cloned().unwrap_or_default();
            return Err(err(format!("PMI: '{line}' failed: rc={rc} {msg}")));
        }
        Ok(m)
    }
}

impl Pmi for Pmi1 {
    fn name(&self) -> &'static str {
        "PMI-1"
    }

    fn rank(&self) -> u32 {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn put(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        let v = hex(value);
        if v.len() > self.vallen_max {
            return Err(err(format!("PMI: a value of {} hex digits, more than {}", v.len(), self.vallen_max)));
        }
        let line = format!("cmd=put kvsname={} key={key} value={v}", self.kvsname);
        self.call(&line, "put_result").map(|_| ())
    }

    fn fence(&mut self) -> io::Result<()> {
        self.call("cmd=barrier_in", "barrier_out").map(|_| ())
    }

    fn get(&mut self, _rank: u32, key: &str) -> io::Result<Vec<u8>> {
        let line = format!("cmd=get kvsname={} key={key}", self.kvsname);
        let v =
            self.call(&line, "get_result")?.remove("value").ok_or_else(|| err("PMI: get_result without a value"))?;
        unhex(&v).ok_or_else(|| err(format!("PMI: the value of {key} is not hex")))
    }

    fn finalize(&mut self) -> io::Result<()> {
        self.call("cmd=finalize", "finalize_ack").map(|_| ())
    }
}

/// `ip,ip,...:port`: where rank 0 listens.
pub fn encode_addrs(ips: &[IpAddr], port: u16) -> Vec<u8> {
    let list: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
    format!("{}:{port}", list.join(",")).into_bytes()
}

/// The addresses of [`encode_addrs`], validated.
pub fn decode_addrs(b: &[u8]) -> io::Result<Vec<SocketAddr>> {
    let s = std::str::from_utf8(b).map_err(|_| err("rank 0's address is not text"))?;
    let (ips, port) = s.rsplit_once(':').ok_or_else(|| err(format!("rank 0's address '{s}' has no port")))?;
    let port: u16 = port.parse().map_err(|_| err(format!("rank 0's address '{s}' has a bad port")))?;
    let addrs = ips
        .split(',')
        .map(|ip| ip.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, port)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| err(format!("rank 0's address '{s}' has a bad IP address")))?;
    if addrs.is_empty() {
        return Err(err("rank 0 published no address"));
    }
    Ok(addrs)
}

/// This host's addresses for rank 0 to publish: every device's, loopback last (a peer on
/// another host cannot use it; one on this host can use any).
pub fn local_ips() -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = uct_tcp::md::devices()
        .into_iter()
        .filter(|d| d.scope_id == 0) // link-local IPv6 needs a scope a peer cannot know
        .map(|d| d.addr)
        .collect();
    ips.sort_by_key(|ip| ip.is_loopback());
    if ips.is_empty() {
        ips.push(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    }
    ips
}

/// PMIx through `libpmix.so.2`, loaded at run time.
mod pmix {
    use std::ffi::{c_char, c_int, c_void, CStr, CString};
    use std::io;

    use super::{err, Pmi};

    const NSLEN: usize = 256; // PMIX_MAX_NSLEN + 1
    const PMIX_SUCCESS: c_int = 0;
    const PMIX_GLOBAL: u8 = 3;
    const PMIX_BYTE_OBJECT: u16 = 27;

    /// `pmix_proc_t`.
    #[repr(C)]
    struct Proc {
        nspace: [c_char; NSLEN],
        rank: u32,
    }

    /// `pmix_byte_object_t`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct ByteObject {
        bytes: *mut c_char,
        size: usize,
    }

    /// `pmix_value_t`: the type, then a union whose largest member is 24 bytes.
    #[repr(C)]
    struct Value {
        ty: u16,
        data: ValueData,
    }

    #[repr(C)]
    union ValueData {
        bo: ByteObject,
        _size: [u64; 3],
    }

    const _: () = assert!(std::mem::size_of::<Proc>() == 260);
    const _: () = assert!(std::mem::size_of::<Value>() == 32);
    const _: () = assert!(std::mem::offset_of!(Value, data) == 8);

    type InitFn = unsafe extern "C" fn(*mut Proc, *mut c_void, usize) -> c_int;
    type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
    type CommitFn = unsafe extern "C" fn() -> c_int;
    type FenceFn = unsafe extern "C" fn(*const Proc, usize, *const c_void, usize) -> c_int;
    type GetFn = unsafe extern "C" fn(*const Proc, *const c_char, *const c_void, usize, *mut *mut Value) -> c_int;
    type FinalizeFn = unsafe extern "C" fn(*const c_void, usize) -> c_int;
    type ValueFreeFn = unsafe extern "C" fn(*mut Value, usize);

    pub struct Pmix {
        me: Proc,
        size: u32,
        put: PutFn,
        commit: CommitFn,
        fence: FenceFn,
        get: GetFn,
        finalize: FinalizeFn,
        value_free: Option<ValueFreeFn>,
        finalized: bool,
    }

    /// The address of `name` in `lib`.
    fn sym(lib: *mut c_void, name: &CStr) -> io::Result<*mut c_void> {
        // SAFETY: `lib` is a handle dlopen returned; `name` is NUL-terminated.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        if p.is_null() {
            return Err(err(format!("libpmix.so.2 has no {}", name.to_string_lossy())));
        }
        Ok(p)
    }

    impl Pmix {
        pub fn init() -> io::Result<Pmix> {
            // RTLD_GLOBAL: the library's own plugins resolve its symbols.
            // SAFETY: a NUL-terminated library name; the handle is checked.
            let lib = unsafe { libc::dlopen(c"libpmix.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            if lib.is_null() {
                // SAFETY: dlerror returns a NUL-terminated message or null.
                let why = unsafe { libc::dlerror() };
                let why = if why.is_null() {
                    String::new()
                } else {
                    // SAFETY: non-null, NUL-terminated, valid until the next dl call.
                    unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
                };
                return Err(err(format!(
                    "PMIX_NAMESPACE is set (Open MPI's mpirun) but libpmix.so.2 cannot be loaded: {why} \
                     (install libpmix2)"
                )));
            }
            // SAFETY: each symbol is PMIx's function of that name, whose C signature the
            // function-pointer type repeats (PMIx 4 API).
            let (init, put, commit, fence, get, finalize) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, InitFn>(sym(lib, c"PMIx_Init")?),
                    std::mem::transmute::<*mut c_void, PutFn>(sym(lib, c"PMIx_Put")?),
                    std::mem::transmute::<*mut c_void, CommitFn>(sym(lib, c"PMIx_Commit")?),
                    std::mem::transmute::<*mut c_void, FenceFn>(sym(lib, c"PMIx_Fence")?),
                    std::mem::transmute::<*mut c_void, GetFn>(sym(lib, c"PMIx_Get")?),
                    std::mem::transmute::<*mut c_void, FinalizeFn>(sym(lib, c"PMIx_Finalize")?),
                )
            };
            let value_free = sym(lib, c"PMIx_Value_free")
                .ok()
                // SAFETY: as above, `void PMIx_Value_free(pmix_value_t *v, size_t n)`.
                .map(|p| unsafe { std::mem::transmute::<*mut c_void, ValueFreeFn>(p) });
            let mut me = Proc { nspace: [0; NSLEN], rank: 0 };
            // SAFETY: `me` is a writable pmix_proc_t; no info array.
            let rc = unsafe { init(&mut me, std::ptr::null_mut(), 0) };
            if rc != PMIX_SUCCESS {
                return Err(err(format!("PMIx_Init failed: {rc}")));
            }
            let size = std::env::var("OMPI_COMM_WORLD_SIZE")
                .ok()
                .and_then(|s| s.parse().ok())
                .or_else(|| std::env::var("PMIX_SIZE").ok().and_then(|s| s.parse().ok()))
                .unwrap_or(0);
            let mut p = Pmix { me, size, put, commit, fence, get, finalize, value_free, finalized: false };
            if p.size == 0 {
                p.size = p.job_size()?;
            }
            Ok(p)
        }

        /// `pmix.job.size` of this namespace (when the environment does not say).
        fn job_size(&mut self) -> io::Result<u32> {
            let v = self.get_raw(u32::MAX - 1, c"pmix.job.size")?; // PMIX_RANK_WILDCARD
            let n = match v {
                Got::U32(n) => n,
                _ => return Err(err("PMIx: pmix.job.size is not a number")),
            };
            Ok(n)
        }

        fn get_raw(&mut self, rank: u32, key: &CStr) -> io::Result<Got> {
            let who = Proc { nspace: self.me.nspace, rank };
            let mut val: *mut Value = std::ptr::null_mut();
            // SAFETY: a valid proc, a NUL-terminated key, no info; `val` receives a value the
            // library allocated.
            let rc = unsafe { (self.get)(&who, key.as_ptr(), std::ptr::null(), 0, &mut val) };
            if rc != PMIX_SUCCESS || val.is_null() {
                return Err(err(format!("PMIx_Get({}) from rank {rank} failed: {rc}", key.to_string_lossy())));
            }
            // SAFETY: the library returned a valid value; its type says which member is set.
            let got = unsafe {
                match (*val).ty {
                    PMIX_BYTE_OBJECT => {
                        let bo = (*val).data.bo;
                        if bo.bytes.is_null() {
                            Got::Bytes(Vec::new())
                        } else {
                            Got::Bytes(std::slice::from_raw_parts(bo.bytes as *const u8, bo.size).to_vec())
                        }
                    }
                    // PMIX_UINT32
                    14 => Got::U32(*(std::ptr::addr_of!((*val).data) as *const u32)),
                    other => Got::Other(other),
                }
            };
            if let Some(free) = self.value_free {
                // SAFETY: one value the library allocated, freed once.
                unsafe { free(val, 1) };
            }
            Ok(got)
        }
    }

    enum Got {
        Bytes(Vec<u8>),
        U32(u32),
        Other(u16),
    }

    impl Pmi for Pmix {
        fn name(&self) -> &'static str {
            "PMIx"
        }

        fn rank(&self) -> u32 {
            self.me.rank
        }

        fn size(&self) -> u32 {
            self.size
        }

        fn put(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
            let key = CString::new(key).map_err(|_| err("a key with a NUL"))?;
            let mut bytes = value.to_vec();
            let mut v = Value {
                ty: PMIX_BYTE_OBJECT,
                data: ValueData { bo: ByteObject { bytes: bytes.as_mut_ptr() as *mut c_char, size: bytes.len() } },
            };
            // SAFETY: a NUL-terminated key and a byte-object value the library copies.
            let rc = unsafe { (self.put)(PMIX_GLOBAL, key.as_ptr(), &mut v) };
            if rc != PMIX_SUCCESS {
                return Err(err(format!("PMIx_Put failed: {rc}")));
            }
            // SAFETY: no arguments.
            let rc = unsafe { (self.commit)() };
            if rc != PMIX_SUCCESS {
                return Err(err(format!("PMIx_Commit failed: {rc}")));
            }
            Ok(())
        }

        fn fence(&mut self) -> io::Result<()> {
            // SAFETY: no procs (the whole namespace), no info.
            let rc = unsafe { (self.fence)(std::ptr::null(), 0, std::ptr::null(), 0) };
            if rc != PMIX_SUCCESS {
                return Err(err(format!("PMIx_Fence failed: {rc}")));
            }
            Ok(())
        }

        fn get(&mut self, rank: u32, key: &str) -> io::Result<Vec<u8>> {
            let key = CString::new(key).map_err(|_| err("a key with a NUL"))?;
            match self.get_raw(rank, &key)? {
                Got::Bytes(b) => Ok(b),
                Got::U32(_) => Err(err("PMIx: a number where bytes were put")),
                Got::Other(t) => Err(err(format!("PMIx: a value of type {t} where bytes were put"))),
            }
        }

        fn finalize(&mut self) -> io::Result<()> {
            if std::mem::replace(&mut self.finalized, true) {
                return Ok(());
            }
            // SAFETY: no info.
            let rc = unsafe { (self.finalize)(std::ptr::null(), 0) };
            if rc != PMIX_SUCCESS {
                return Err(err(format!("PMIx_Finalize failed: {rc}")));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_bad_ones_are_refused() {
        let ips: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
        let a = decode_addrs(&encode_addrs(&ips, 4242)).unwrap();
        assert_eq!(a, vec!["10.0.0.1:4242".parse().unwrap(), "[::1]:4242".parse().unwrap()]);
        for bad in ["", "1.2.3.4", "1.2.3.4:x", "1.2.3.4:99999", "nope:1", ",:1"] {
            assert!(decode_addrs(bad.as_bytes()).is_err(), "{bad}");
        }
        assert_eq!(unhex(&hex(b"\x00\xffab")).unwrap(), b"\x00\xffab");
        assert!(unhex("abc").is_none() && unhex("zz").is_none());
    }

    #[test]
    fn pmi1_lines_parse() {
        let m = parse_line("cmd=get_result rc=0 msg=success value=abcd");
        assert_eq!(m["cmd"], "get_result");
        assert_eq!(m["value"], "abcd");
    }
}
