//! Process-wide memory unmap events, as UCX's UCM provides them to registration caches.
//!
//! A registered region keeps the physical pages it had when it was registered. If the program
//! unmaps that memory (or releases its pages with `madvise(MADV_DONTNEED)`, or shrinks the
//! heap over it) and later gets new memory at the same address, a cached registration would
//! silently refer to the old pages. [`install`] hooks the C library functions that unmap
//! memory so every such call is reported here first, before the memory goes away; a
//! registration cache ([`crate::rcache`]) drains the reports with an [`EventCursor`] and drops
//! the affected regions.
//!
//! # How the hooks work (x86-64 Linux, glibc)
//! Like UCM's "bistro" mode, the functions' machine code is patched in memory, so calls from
//! inside glibc (`free()` returning a large block through its internal `__munmap` alias,
//! `realloc()` moving one with `mremap`, `malloc_trim()` shrinking the heap through `sbrk` ->
//! `brk`) are caught as well, which symbol interposition would miss. Unlike UCM, the hook does
//! not replace the function: it detours the single `mov eax, <nr>` instruction in front of
//! the `syscall` instruction to a recorder and comes back, so glibc's own code makes the call
//! and sets `errno` exactly as before. Hooked: `munmap`, `mremap`, `madvise`, `shmdt`, `brk`
//! (hence `sbrk`) and `mmap` (for `MAP_FIXED` over existing memory).
//!
//! Before patching a function, [`install`] checks that its code is what it expects: located
//! through `dlopen("libc.so.6", RTLD_NOLOAD)`/`dlsym`, confirmed by `dladdr1` to start a
//! symbol in `libc.so*`, with the symbol's size; the `mov eax, <nr>; syscall` pair must be the
//! function's first instruction (the plain wrapper) or be reached from the entry through a
//! short prologue of recognised instructions, and be the only `syscall` in the function. A
//! function that does not match is left alone and reported by [`status`]: with any hook
//! missing, [`install`] fails and caches run without caching.
//!
//! # The recorder
//! It may run in any thread, inside `free()` with malloc's locks held, or in a signal
//! handler: it only writes atomics into a fixed-size ring (4096 events) and never allocates,
//! locks or panics. Each consumer has its own cursor over the ring; one that falls more than
//! a ring's length behind is told to drop everything ([`UnmapEvent::All`]).
//!
//! # Configuration (UCX's UCM variables)
//! | variable | default | meaning |
//! |---|---|---|
//! | `UCX_MEM_EVENTS` | `yes` | `no` disables the hooks: [`install`] fails, caches do not cache |
//! | `UCX_MEM_MMAP_HOOK_MODE` | `bistro` | `none` disables the hooks; `reloc` is not implemented (fails) |
//!
//! Not covered: other C libraries and statically linked programs ([`install`] fails), raw
//! `syscall(SYS_munmap, ...)` calls, memory changed by other means (another process
//! truncating a shared file, `io_uring`); such code can call [`report_unmap`] itself, like
//! UCM's `ucm_vm_munmap`.

mod decode;
mod ring;
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod x86_64;

use std::fmt;
use std::sync::OnceLock;

use crate::config::Config;
use crate::Status;

pub use ring::UnmapEvent;

/// The process-wide event ring.
static RING: ring::Ring<{ ring::RING_SIZE }> = ring::Ring::new();

/// The outcome of the first [`install`].
static STATUS: OnceLock<HooksStatus> = OnceLock::new();

static NOT_INSTALLED: HooksStatus = HooksStatus { state: HooksState::NotInstalled, functions: Vec::new() };

crate::config_enum! {
    /// How UCM installs its mmap hooks (`UCX_MEM_MMAP_HOOK_MODE`).
    pub enum MmapHookMode {
        /// No hooks.
        None = "none",
        /// ELF relocation-table patching (not implemented here).
        Reloc = "reloc",
        /// Binary instrumentation of libc's code.
        Bistro = "bistro",
    }
}

crate::config_table! {
    /// UCM's memory-event configuration (`UCX_MEM_*`), read by [`install`] with prefix `MEM_`.
    pub struct MemHooksConfig {
        pub events: bool = ("EVENTS", "yes", "Enable memory events."),
        pub mmap_hook_mode: MmapHookMode = ("MMAP_HOOK_MODE", "bistro", "MMAP hook mode: none, reloc, bistro."),
    }
}

/// Overall state of the hooks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HooksState {
    /// [`install`] has not been called.
    NotInstalled,
    /// Every function is hooked.
    Installed,
    /// Disabled by configuration (the text says which variable).
    Disabled(String),
    /// Not possible here, or some functions could not be hooked (the text says which).
    Unsupported(String),
}

/// Where a function was patched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatchedSite {
    /// Address of the function.
    pub function: usize,
    /// Offset of the patched `mov eax, <nr>` from the function's entry.
    pub offset: usize,
    /// True when the function is the plain wrapper (`mov eax, <nr>; syscall` first).
    pub wrapper: bool,
    /// The bytes checked at the site before patching (`b8 <nr:le32> 0f 05`).
    pub bytes: [u8; 7],
}

/// The outcome for one function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionHook {
    /// libc function name.
    pub name: &'static str,
    /// Where it was patched, or why not.
    pub result: Result<PatchedSite, String>,
}

/// What [`install`] did: see [`status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HooksStatus {
    /// Overall state.
    pub state: HooksState,
    /// One entry per function it tried to hook (empty when it tried none).
    pub functions: Vec<FunctionHook>,
}

impl HooksStatus {
    /// True when every function is hooked.
    pub fn is_installed(&self) -> bool {
        self.state == HooksState::Installed
    }

    /// Why the hooks are not installed, if they are not.
    pub fn reason(&self) -> Option<&str> {
        match &self.state {
            HooksState::NotInstalled => Some("memory hooks not installed"),
            HooksState::Installed => None,
            HooksState::Disabled(why) | HooksState::Unsupported(why) => Some(why),
        }
    }

    /// Names of the hooked functions.
    pub fn hooked(&self) -> Vec<&'static str> {
        self.functions.iter().filter(|f| f.result.is_ok()).map(|f| f.name).collect()
    }
}

impl fmt::Display for HooksStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            None => f.write_str("memory hooks installed:")?,
            Some(why) => write!(f, "memory hooks not installed ({why}):")?,
        }
        for func in &self.functions {
            match &func.result {
                Ok(site) => write!(f, " {}+{}", func.name, site.offset)?,
                Err(_) => write!(f, " {}(missing)", func.name)?,
            }
        }
        Ok(())
    }
}

/// Installs the hooks once per process (later calls return the first outcome); thread-safe.
/// `Ok` when every function is hooked, else `Err(Unsupported)` with the reason in
/// [`status`]. Reads `UCX_MEM_EVENTS` and `UCX_MEM_MMAP_HOOK_MODE` on the first call.
///
/// Best called early, before threads start (registration caches call it when created):
/// patching is built to be safe while other threads run libc code, but a program that
/// unmaps memory before the hooks exist has nothing reported for it.
pub fn install() -> Result<(), Status> {
    let status = STATUS.get_or_init(|| {
        let status = install_now();
        match &status.state {
            HooksState::Installed => tracing::debug!("{status}"),
            _ => tracing::info!("{status}"),
        }
        status
    });
    if status.is_installed() {
        Ok(())
    } else {
        Err(Status::Unsupported)
    }
}

fn install_now() -> HooksStatus {
    let state = |state| HooksStatus { state, functions: Vec::new() };
    let config = match MemHooksConfig::read(&["MEM_"]) {
        Ok(config) => config,
        Err(e) => return state(HooksState::Disabled(format!("invalid configuration: {e}"))),
    };
    if !config.events {
        return state(HooksState::Disabled("disabled by UCX_MEM_EVENTS=n".into()));
    }
    match config.mmap_hook_mode {
        MmapHookMode::None => state(HooksState::Disabled("disabled by UCX_MEM_MMAP_HOOK_MODE=none".into())),
        MmapHookMode::Reloc => {
            state(HooksState::Unsupported("UCX_MEM_MMAP_HOOK_MODE=reloc is not implemented (use bistro)".into()))
        }
        MmapHookMode::Bistro => platform_install(),
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn platform_install() -> HooksStatus {
    x86_64::install()
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
fn platform_install() -> HooksStatus {
    HooksStatus {
        state: HooksState::Unsupported("memory hooks need x86-64 Linux with glibc".into()),
        functions: Vec::new(),
    }
}

/// What [`install`] did, or [`HooksState::NotInstalled`] before it was called.
pub fn status() -> &'static HooksStatus {
    STATUS.get().unwrap_or(&NOT_INSTALLED)
}

/// Records an unmap event. Async-signal-safe; never allocates, locks or panics.
#[inline]
pub(crate) fn record(event: UnmapEvent) {
    match event {
        UnmapEvent::Range { addr, len } => RING.push(addr, len),
        UnmapEvent::All => RING.push(0, usize::MAX),
    }
}

/// Reports that `[addr, addr + len)` is about to be unmapped or its pages released, for code
/// that does so without the hooked libc functions (raw system calls, another allocator's
/// own syscalls); UCM's `ucm_vm_munmap`. Call it before the memory goes away. Safe to call
/// anywhere, including signal handlers.
pub fn report_unmap(addr: usize, len: usize) {
    record(UnmapEvent::Range { addr, len });
}

/// Number of events recorded so far in this process (a generation counter).
pub fn generation() -> u64 {
    RING.head()
}

/// A consumer's position in the process-wide event stream: sees every event recorded after
/// it was created. One per cache; not shared between threads.
#[derive(Debug)]
pub struct EventCursor {
    cursor: ring::Cursor,
}

impl EventCursor {
    /// A cursor that sees the events recorded from now on.
    pub fn new() -> Self {
        EventCursor { cursor: RING.cursor() }
    }

    /// True when events arrived since the last [`poll`](Self::poll): two atomic loads.
    #[inline]
    pub fn has_events(&self) -> bool {
        RING.has_news(&self.cursor)
    }

    /// Passes every event since the last call to `f` and returns how many. After lost
    /// events, `f` gets one [`UnmapEvent::All`]. An event can be passed twice (when an
    /// earlier one was still being written): handle them idempotently.
    pub fn poll(&mut self, f: impl FnMut(UnmapEvent)) -> usize {
        RING.drain(&mut self.cursor, f)
    }
}

impl Default for EventCursor {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_events_reach_every_cursor() {
        let mut a = EventCursor::new();
        let mut b = EventCursor::new();
        let base = 0x7e57_0000_0000;
        report_unmap(base, 4096);
        for cursor in [&mut a, &mut b] {
            assert!(cursor.has_events());
            let mut seen = Vec::new();
            cursor.poll(|e| seen.push(e));
            // Other tests of this binary may report events too.
            assert!(seen.contains(&UnmapEvent::Range { addr: base, len: 4096 }) || seen.contains(&UnmapEvent::All));
        }
    }

    #[test]
    fn status_display() {
        let st = HooksStatus {
            state: HooksState::Unsupported("not hooked: mmap: x".into()),
            functions: vec![
                FunctionHook {
                    name: "munmap",
                    result: Ok(PatchedSite {
                        function: 0x1000,
                        offset: 0,
                        wrapper: true,
                        bytes: decode::site_bytes(11),
                    }),
                },
                FunctionHook { name: "mmap", result: Err("x".into()) },
            ],
        };
        assert_eq!(st.to_string(), "memory hooks not installed (not hooked: mmap: x): munmap+0 mmap(missing)");
        assert_eq!(st.hooked(), ["munmap"]);
        assert!(!st.is_installed());
        assert_eq!(NOT_INSTALLED.reason(), Some("memory hooks not installed"));
    }
}
