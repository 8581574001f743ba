//! The libc hooks in a real process: memory is really mapped, registered in a cache (with a
//! counting backend), then unmapped or released through libc, directly or from inside glibc
//! (`free`, `realloc`, `sbrk`); the next `get` must register afresh and the old registration
//! must be gone once unused. Also: libc's results and `errno` are what they were.
//!
//! The hooks are process-wide, hence this separate test binary.

#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

mod rcache_support;

use std::ptr;
use std::sync::{Mutex, MutexGuard};

use rcache_support::{Counting, PAGE};
use ucs::memhooks;
use ucs::rcache::{Rcache, RcacheParams, UnmapEvents};

/// The hooks and the event ring are process-wide, and some events invalidate every cache
/// (`shmdt`, a consumer falling behind the ring): the tests take turns so that one test's events
/// cannot turn another's expected hit into a miss.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn cache() -> (Rcache<Counting>, Counting) {
    let backend = Counting::default();
    let params = RcacheParams { alignment: PAGE, events: UnmapEvents::Required, ..Default::default() };
    let cache = Rcache::new(backend.clone(), params).unwrap();
    assert!(cache.is_caching() && cache.has_unmap_events(), "{}", memhooks::status());
    (cache, backend)
}

fn map(len: usize) -> usize {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_errno(v: i32) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = v };
}

/// Registers `[addr, addr + len)` and releases it (cached, unused); returns its id.
fn cached(cache: &Rcache<Counting>, addr: usize, len: usize) -> u64 {
    let id = cache.get(addr, len, 0).unwrap().reg().id;
    assert_eq!(cache.get(addr, len, 0).unwrap().reg().id, id, "second get hits");
    id
}

/// Asserts `[addr, addr + len)` is registered afresh and `old` was deregistered.
fn assert_reregistered(cache: &Rcache<Counting>, backend: &Counting, addr: usize, len: usize, old: u64) {
    let new = cache.get(addr, len, 0).unwrap().reg().id;
    assert_ne!(new, old, "the old registration was served after the memory went away");
    assert!(!backend.is_live(old), "old registration {old} not deregistered");
    assert!(cache.stats().invalidations >= 1);
}

#[test]
fn every_function_is_hooked() {
    let _serial = serial();
    memhooks::install().unwrap_or_else(|_| panic!("{}", memhooks::status()));
    let st = memhooks::status();
    eprintln!("{st}");
    let names: Vec<_> = st.functions.iter().map(|f| f.name).collect();
    assert_eq!(names, ["munmap", "mremap", "madvise", "shmdt", "brk", "mmap"]);
    for f in &st.functions {
        let site = f.result.as_ref().unwrap();
        assert_eq!(site.bytes[0], 0xb8, "{}: mov eax, imm32", f.name);
        assert_eq!(&site.bytes[5..], &[0x0f, 0x05], "{}: syscall", f.name);
        // SAFETY: the patched site is mapped libc code.
        let now = unsafe { std::slice::from_raw_parts((site.function + site.offset) as *const u8, 5) };
        assert_eq!(now[0], 0xe9, "{}: the site now holds a jmp rel32", f.name);
    }
    assert!(memhooks::install().is_ok(), "idempotent");
}

#[test]
fn libc_results_and_errno_are_unchanged() {
    let _serial = serial();
    memhooks::install().unwrap();
    let p = map(4 * PAGE);
    // SAFETY: every call is on our own mapping `p`, or has invalid arguments the
    // kernel rejects.
    unsafe {
        std::ptr::write_bytes(p as *mut u8, 0xab, 4 * PAGE);

        assert_eq!(libc::munmap((p + 1) as *mut _, PAGE), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(libc::madvise((p + 1) as *mut _, PAGE, libc::MADV_DONTNEED), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(libc::mremap((p + 1) as *mut _, PAGE, 2 * PAGE, 0), libc::MAP_FAILED);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(
            libc::mmap(ptr::null_mut(), 0, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0),
            libc::MAP_FAILED
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(libc::shmdt((p + 1) as *const _), -1);
        assert_eq!(errno(), libc::EINVAL);

        // Successes leave errno alone.
        set_errno(4321);
        assert_eq!(libc::madvise(p as *mut _, PAGE, libc::MADV_WILLNEED), 0);
        assert_eq!(*(p as *const u8), 0xab, "WILLNEED keeps the data");
        assert_eq!(libc::madvise(p as *mut _, PAGE, libc::MADV_DONTNEED), 0);
        assert_eq!(*(p as *const u8), 0, "DONTNEED still drops the page");
        let q = libc::mremap(p as *mut _, 4 * PAGE, 64 * PAGE, libc::MREMAP_MAYMOVE);
        assert_ne!(q, libc::MAP_FAILED);
        assert_eq!(*((q as usize + PAGE) as *const u8), 0xab, "mremap keeps the data");
        let r = libc::mmap(
            (q as usize + PAGE) as *mut _,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        assert_eq!(r as usize, q as usize + PAGE);
        assert_eq!(*(r as *const u8), 0, "MAP_FIXED replaced the page");
        let brk = libc::sbrk(0);
        assert_ne!(brk as isize, -1);
        assert_eq!(libc::brk(brk), 0);
        assert_eq!(libc::munmap(q, 64 * PAGE), 0);
        assert_eq!(errno(), 4321);
    }
}

#[test]
fn munmap_invalidates() {
    let _serial = serial();
    let (cache, backend) = cache();
    let p = map(4 * PAGE);
    let old = cached(&cache, p, 4 * PAGE);
    let before = cache.stats().unmap_events;
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::munmap(p as *mut _, 4 * PAGE) }, 0);
    // Map the same address again if it is still free: new pages, same addresses.
    // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping.
    let again = unsafe {
        libc::mmap(
            p as *mut _,
            4 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_reregistered(&cache, &backend, p + PAGE, PAGE, old);
    assert!(cache.stats().unmap_events > before);
    if again != libc::MAP_FAILED {
        // SAFETY: our new mapping.
        unsafe { libc::munmap(again, 4 * PAGE) };
    }
}

#[test]
fn munmap_of_memory_in_use() {
    let _serial = serial();
    let (cache, backend) = cache();
    let p = map(2 * PAGE);
    let h = backend.hold(cache.get(p, 2 * PAGE, 0).unwrap());
    // SAFETY: our mapping.
    assert_eq!(unsafe { libc::munmap(p as *mut _, PAGE) }, 0);
    let new = cache.get(p, PAGE, 0).unwrap();
    assert_ne!(new.reg().id, h.id());
    assert!(backend.is_live(h.id()), "in use: not deregistered under its user");
    assert!(!h.h().is_cached());
    let old = h.id();
    drop(h);
    assert!(!backend.is_live(old), "deregistered when released");
    drop(new);
    // SAFETY: the rest of our mapping.
    unsafe { libc::munmap((p + PAGE) as *mut _, PAGE) };
}

#[test]
fn free_of_a_large_vec_is_caught_inside_glibc() {
    let _serial = serial();
    let (cache, backend) = cache();
    // Above glibc's largest dynamic mmap threshold (32 MiB): malloc maps it, free unmaps it
    // with its internal `__munmap`.
    let len = 64 << 20;
    let mut v = vec![0u8; len];
    v[len - 1] = 1;
    let addr = v.as_ptr() as usize;
    let old = cached(&cache, addr, len);
    drop(v);
    assert_reregistered(&cache, &backend, addr, len, old);
}

#[test]
fn realloc_of_a_large_vec_is_caught_inside_glibc() {
    let _serial = serial();
    let (cache, backend) = cache();
    let len = 64 << 20;
    let mut v: Vec<u8> = Vec::with_capacity(len);
    v.resize(len, 7);
    let addr = v.as_ptr() as usize;
    let old = cached(&cache, addr, len);
    v.reserve(2 * len); // realloc of an mmapped chunk: glibc's mremap
    assert_eq!(v[len - 1], 7);
    assert_reregistered(&cache, &backend, addr, len, old);
}

#[test]
fn madvise_dontneed_invalidates_and_willneed_does_not() {
    let _serial = serial();
    let (cache, backend) = cache();
    let p = map(8 * PAGE);
    let keep = cached(&cache, p, 2 * PAGE);
    let gone = cached(&cache, p + 4 * PAGE, 2 * PAGE);
    // SAFETY: our mapping.
    unsafe {
        assert_eq!(libc::madvise(p as *mut _, 2 * PAGE, libc::MADV_WILLNEED), 0);
        assert_eq!(libc::madvise((p + 5 * PAGE) as *mut _, PAGE, libc::MADV_DONTNEED), 0);
    }
    assert_eq!(cache.get(p, 2 * PAGE, 0).unwrap().reg().id, keep, "WILLNEED releases nothing");
    assert_reregistered(&cache, &backend, p + 4 * PAGE, 2 * PAGE, gone);
    // SAFETY: our mapping.
    unsafe { libc::munmap(p as *mut _, 8 * PAGE) };
}

#[test]
fn mremap_invalidates() {
    let _serial = serial();
    let (cache, backend) = cache();
    let p = map(2 * PAGE);
    let old = cached(&cache, p, 2 * PAGE);
    // SAFETY: our mapping.
    let q = unsafe { libc::mremap(p as *mut _, 2 * PAGE, 16 * PAGE, libc::MREMAP_MAYMOVE) };
    assert_ne!(q, libc::MAP_FAILED);
    assert_reregistered(&cache, &backend, p, 2 * PAGE, old);
    // SAFETY: our mapping.
    unsafe { libc::munmap(q, 16 * PAGE) };
}

#[test]
fn mmap_fixed_over_registered_memory_invalidates() {
    let _serial = serial();
    let (cache, backend) = cache();
    let p = map(4 * PAGE);
    let old = cached(&cache, p, 4 * PAGE);
    // SAFETY: replaces a page of our own mapping.
    let r = unsafe {
        libc::mmap(
            (p + 2 * PAGE) as *mut _,
            PAGE,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(r as usize, p + 2 * PAGE);
    assert_reregistered(&cache, &backend, p, PAGE, old);
    // SAFETY: our mapping.
    unsafe { libc::munmap(p as *mut _, 4 * PAGE) };
}

#[test]
fn shmdt_invalidates_everything() {
    let _serial = serial();
    let (cache, backend) = cache();
    // SAFETY: a private System V segment, attached, detached and removed here.
    unsafe {
        let id = libc::shmget(libc::IPC_PRIVATE, 2 * PAGE, libc::IPC_CREAT | 0o600);
        assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
        let p = libc::shmat(id, ptr::null(), 0);
        libc::shmctl(id, libc::IPC_RMID, ptr::null_mut());
        assert_ne!(p as isize, -1);
        let old = cached(&cache, p as usize, 2 * PAGE);
        let other = map(PAGE);
        let unrelated = cached(&cache, other, PAGE);
        assert_eq!(libc::shmdt(p), 0);
        assert_reregistered(&cache, &backend, p as usize, 2 * PAGE, old);
        // The segment's size is not known to the hook: everything was dropped.
        assert_ne!(cache.get(other, PAGE, 0).unwrap().reg().id, unrelated);
        libc::munmap(other as *mut _, PAGE);
    }
}

/// Runs `f` in a forked child (single-threaded, so it may move the program break) and
/// asserts it exits cleanly.
fn in_child(f: impl FnOnce()) {
    // SAFETY: the child runs `f` and `_exit`s; glibc's fork handlers keep malloc usable in it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: status {status:#x}");
}

#[test]
fn heap_shrink_through_sbrk_invalidates() {
    let _serial = serial();
    memhooks::install().unwrap();
    in_child(|| {
        // SAFETY: in the single-threaded child, malloc is told never to extend the heap
        // (every new chunk is mmapped) nor trim it, so only this code moves the break.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 0);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
        let (cache, backend) = cache();
        // SAFETY: grows the heap by 16 pages that only this code uses, then gives them back.
        unsafe {
            let start = libc::sbrk(0) as usize;
            assert_ne!(libc::sbrk(16 * PAGE as libc::intptr_t) as isize, -1);
            let area = (start + PAGE - 1) & !(PAGE - 1);
            let old = cached(&cache, area, 8 * PAGE);
            // sbrk calls glibc's internal __brk, the hooked code.
            assert_ne!(libc::sbrk(-(16 * PAGE as libc::intptr_t)) as isize, -1);
            assert_eq!(libc::sbrk(0) as usize, start);
            assert_reregistered(&cache, &backend, area, 8 * PAGE, old);
        }
    });
}

#[test]
fn munmap_in_a_signal_handler_is_reported() {
    let _serial = serial();
    use std::sync::atomic::{AtomicUsize, Ordering};
    static TARGET: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn on_signal(_: libc::c_int) {
        let p = TARGET.load(Ordering::SeqCst);
        // SAFETY: the mapping the test made for this; munmap is async-signal-safe.
        unsafe { libc::munmap(p as *mut _, PAGE) };
    }
    let (cache, backend) = cache();
    let p = map(PAGE);
    let old = cached(&cache, p, PAGE);
    TARGET.store(p, Ordering::SeqCst);
    // SAFETY: installs a handler for SIGURG (ignored by default; nothing else in the test
    // binary uses it) and raises it on this thread.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        assert_eq!(libc::sigaction(libc::SIGURG, &sa, ptr::null_mut()), 0);
        assert_eq!(libc::raise(libc::SIGURG), 0);
    }
    assert_reregistered(&cache, &backend, p, PAGE, old);
}

#[test]
fn events_from_other_threads_reach_the_cache() {
    let _serial = serial();
    let (cache, backend) = cache();
    let p = map(4 * PAGE);
    let old = cached(&cache, p, 4 * PAGE);
    std::thread::spawn(move || {
        // SAFETY: the test's mapping, handed to this thread.
        assert_eq!(unsafe { libc::munmap(p as *mut _, 4 * PAGE) }, 0);
    })
    .join()
    .unwrap();
    assert_reregistered(&cache, &backend, p, 4 * PAGE, old);
}

#[test]
fn reported_unmaps_invalidate() {
    let _serial = serial();
    let (cache, backend) = cache();
    let base = 0x5a5a_0000_0000; // made up: the backend touches no memory
    let old = cached(&cache, base, 2 * PAGE);
    memhooks::report_unmap(base + 100, 10); // rounded out to the page
    assert_reregistered(&cache, &backend, base, PAGE, old);
}
