//! Syscall-site detours in glibc, x86-64 Linux.
//!
//! For each hooked function, [`super::decode`] finds its `mov eax, <nr>; syscall` pair. The
//! 5-byte `mov eax, imm32` is replaced with a 5-byte `jmp rel32` to a stub in a page placed
//! within ±2 GiB of libc. The stub loads the address of its site record into `rax` and jumps
//! (`movabs r11, imm64; jmp r11`) to [`ENTRY`], which saves the registers, calls
//! [`record_syscall`] with them, restores them, loads the syscall number into `eax` (what the
//! replaced instruction did) and jumps back to the original `syscall` instruction. libc's
//! own code then makes the system call and sets `errno` exactly as before.
//!
//! Why this shape:
//! - One whole instruction is replaced by one instruction of the same length, so every
//!   instruction boundary of the function stays where it was: a thread preempted anywhere in
//!   the function, or blocked in its system call, resumes correctly after patching.
//! - `rax`, `rcx` and `r11` are dead at the site (the `mov` writes `eax`, `syscall` clobbers
//!   `rcx`/`r11`), so the stub and the entry may use them.
//! - The five bytes are written in three steps, the first and last as one atomic 8-byte
//!   store each: `jmp $` (a 2-byte spin on the site), then the last three bytes of the jump,
//!   then its first two bytes. A thread reaching the site meanwhile spins for a moment
//!   instead of decoding a half-written instruction.

use std::arch::global_asm;
use std::cell::UnsafeCell;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use super::decode::{self, Site};
use super::{FunctionHook, HooksState, HooksStatus, PatchedSite};

/// A hooked function: its name in libc and its system call.
struct Spec {
    name: &'static CStr,
    nr: u32,
}

/// The functions hooked, in the order they are reported.
const SPECS: [Spec; 6] = [
    Spec { name: c"munmap", nr: libc::SYS_munmap as u32 },
    Spec { name: c"mremap", nr: libc::SYS_mremap as u32 },
    Spec { name: c"madvise", nr: libc::SYS_madvise as u32 },
    Spec { name: c"shmdt", nr: libc::SYS_shmdt as u32 },
    Spec { name: c"brk", nr: libc::SYS_brk as u32 },
    Spec { name: c"mmap", nr: libc::SYS_mmap as u32 },
];

/// `dladdr1` request for the ELF symbol (`RTLD_DL_SYMENT` in glibc's `<dlfcn.h>`).
const RTLD_DL_SYMENT: libc::c_int = 1;
/// `membarrier` commands (`<linux/membarrier.h>`).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 6;

const PAGE: usize = 4096;
/// Bytes per stub in the stub page.
const STUB_SIZE: usize = 32;
/// Offset of the site records in the stub page.
const RECORDS_OFFSET: usize = 2048;
/// How far from libc a stub may be: the `jmp rel32` reaches ±2 GiB; keep a margin.
const REACH: usize = (1 << 31) - (1 << 24);

/// What the stub hands to [`ENTRY`] in `rax`; lives in the stub page (read-only once built).
/// [`ENTRY`] reads `nr` at offset 0 and `resume` at offset 8.
#[repr(C)]
struct SiteRecord {
    nr: u32,
    _pad: u32,
    resume: usize,
}

const _: () = assert!(std::mem::size_of::<SiteRecord>() == 16);
const _: () = assert!(std::mem::offset_of!(SiteRecord, resume) == 8);
const _: () = assert!(RECORDS_OFFSET + SPECS.len() * 16 <= PAGE && SPECS.len() * STUB_SIZE <= RECORDS_OFFSET);

/// Registers as [`ENTRY`] saves them, lowest address first.
#[repr(C)]
struct SavedRegs {
    rcx: usize,
    r9: usize,
    r8: usize,
    r10: usize,
    rdx: usize,
    rsi: usize,
    rdi: usize,
    site: *const SiteRecord,
}

// The common hook entry. On arrival: rax = site record, the syscall arguments in rdi, rsi,
// rdx, r10, r8, r9, and the stack of the interrupted libc code, whose 128-byte red zone must
// survive and whose alignment is unknown. Saves flags, the argument registers and xmm0-15
// (libc code may keep values in them across the system call), calls `record_syscall` on a
// 16-byte aligned stack, restores everything, then does what the replaced `mov eax, nr` did
// and resumes at the original `syscall` instruction.
global_asm!(
    ".pushsection .text.ucs_rs_memhooks_entry,\"ax\",@progbits",
    ".p2align 4",
    ".globl ucs_rs_memhooks_entry",
    ".hidden ucs_rs_memhooks_entry",
    ".type ucs_rs_memhooks_entry,@function",
    "ucs_rs_memhooks_entry:",
    "lea rsp, [rsp - 128]",
    "pushfq",
    "push rbp",
    "mov rbp, rsp",
    "and rsp, -16",
    "push rax",
    "push rdi",
    "push rsi",
    "push rdx",
    "push r10",
    "push r8",
    "push r9",
    "push rcx",
    "sub rsp, 256",
    "movaps [rsp + 0], xmm0",
    "movaps [rsp + 16], xmm1",
    "movaps [rsp + 32], xmm2",
    "movaps [rsp + 48], xmm3",
    "movaps [rsp + 64], xmm4",
    "movaps [rsp + 80], xmm5",
    "movaps [rsp + 96], xmm6",
    "movaps [rsp + 112], xmm7",
    "movaps [rsp + 128], xmm8",
    "movaps [rsp + 144], xmm9",
    "movaps [rsp + 160], xmm10",
    "movaps [rsp + 176], xmm11",
    "movaps [rsp + 192], xmm12",
    "movaps [rsp + 208], xmm13",
    "movaps [rsp + 224], xmm14",
    "movaps [rsp + 240], xmm15",
    "lea rdi, [rsp + 256]",
    "call {record}",
    "movaps xmm0, [rsp + 0]",
    "movaps xmm1, [rsp + 16]",
    "movaps xmm2, [rsp + 32]",
    "movaps xmm3, [rsp + 48]",
    "movaps xmm4, [rsp + 64]",
    "movaps xmm5, [rsp + 80]",
    "movaps xmm6, [rsp + 96]",
    "movaps xmm7, [rsp + 112]",
    "movaps xmm8, [rsp + 128]",
    "movaps xmm9, [rsp + 144]",
    "movaps xmm10, [rsp + 160]",
    "movaps xmm11, [rsp + 176]",
    "movaps xmm12, [rsp + 192]",
    "movaps xmm13, [rsp + 208]",
    "movaps xmm14, [rsp + 224]",
    "movaps xmm15, [rsp + 240]",
    "add rsp, 256",
    "pop rcx",
    "pop r9",
    "pop r8",
    "pop r10",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "pop rax",
    "mov rsp, rbp",
    "pop rbp",
    "popfq",
    "lea rsp, [rsp + 128]",
    "mov r11, [rax + 8]",
    "mov eax, dword ptr [rax]",
    "jmp r11",
    ".size ucs_rs_memhooks_entry, . - ucs_rs_memhooks_entry",
    ".popsection",
    record = sym record_syscall,
);

extern "C" {
    /// The assembly entry above; only its address is used.
    #[link_name = "ucs_rs_memhooks_entry"]
    fn ENTRY();
}

/// Called by [`ENTRY`] before the hooked system call runs. Must not allocate, lock or panic:
/// it may run inside `free()` with malloc's locks held, or in a signal handler.
///
/// # Safety
/// `regs` points to the frame [`ENTRY`] built, whose `site` is a record in the stub page.
unsafe extern "C" fn record_syscall(regs: *const SavedRegs) {
    // SAFETY: ENTRY passes a pointer to the registers it just pushed on its own stack; they
    // stay there until this function returns.
    let regs = unsafe { &*regs };
    // SAFETY: `site` is the record address the stub loaded into rax: a `SiteRecord` in the
    // stub page, which is never unmapped.
    let nr = unsafe { (*regs.site).nr };
    let args = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8];
    for event in unmapped_by(nr, args, current_brk).into_iter().flatten() {
        super::record(event);
    }
}

/// The program break, from the kernel (glibc's `__curbrk` is not consulted: the kernel's
/// value is the truth, and a raw system call leaves `errno` alone).
fn current_brk() -> usize {
    let ret: usize;
    // SAFETY: brk(0) changes nothing and returns the current break; the syscall instruction
    // clobbers only rax (the result), rcx and r11, all declared.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_brk as usize => ret,
            in("rdi") 0usize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// The ranges system call `nr` with arguments `a` is about to unmap or release; `brk` gives
/// the current program break. Mirrors UCM's dispatch: munmap; mremap's old range (and, with
/// `MREMAP_FIXED`, the target range it replaces); madvise with DONTNEED/DONTNEED_LOCKED/
/// FREE/REMOVE; brk below the current break; mmap with `MAP_FIXED` over existing memory;
/// shmdt, whose size is not known here, as everything. Runs in the hook: lazy and wrapping
/// arithmetic only, nothing that can panic.
pub(super) fn unmapped_by(nr: u32, a: [usize; 5], brk: impl FnOnce() -> usize) -> [Option<super::UnmapEvent>; 2] {
    use super::UnmapEvent::{All, Range};
    let [a0, a1, a2, a3, a4] = a;
    match nr as libc::c_long {
        libc::SYS_munmap => [Some(Range { addr: a0, len: a1 }), None],
        libc::SYS_mremap => {
            let fixed = a3 & libc::MREMAP_FIXED as usize != 0;
            [Some(Range { addr: a0, len: a1 }), fixed.then_some(Range { addr: a4, len: a2 })]
        }
        libc::SYS_madvise => {
            let releases = matches!(
                a2 as libc::c_int,
                libc::MADV_DONTNEED | libc::MADV_DONTNEED_LOCKED | libc::MADV_FREE | libc::MADV_REMOVE
            );
            [releases.then_some(Range { addr: a0, len: a1 }), None]
        }
        libc::SYS_shmdt => [Some(All), None],
        libc::SYS_brk => {
            if a0 == 0 {
                return [None, None];
            }
            let current = brk();
            [(a0 < current).then(|| Range { addr: a0, len: current.wrapping_sub(a0) }), None]
        }
        libc::SYS_mmap => {
            let flags = a3 as libc::c_int;
            let replaces = flags & libc::MAP_FIXED != 0 && flags & libc::MAP_FIXED_NOREPLACE == 0 && a0 != 0;
            [replaces.then_some(Range { addr: a0, len: a1 }), None]
        }
        _ => [None, None],
    }
}

/// Held while libc code is being patched, and by `fork` (through `pthread_atfork`): a child
/// forked mid-patch would otherwise inherit a site left as `jmp $`, with no thread to finish
/// it.
struct ForkLock(UnsafeCell<libc::pthread_mutex_t>);

// SAFETY: the mutex is only used through pthread calls, which synchronise.
unsafe impl Sync for ForkLock {}

static FORK_LOCK: ForkLock = ForkLock(UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER));

extern "C" fn fork_lock() {
    // SAFETY: a statically initialised mutex that is never destroyed.
    unsafe { libc::pthread_mutex_lock(FORK_LOCK.0.get()) };
}

extern "C" fn fork_unlock() {
    // SAFETY: as above; called by the thread that locked it (in the child: the same thread).
    unsafe { libc::pthread_mutex_unlock(FORK_LOCK.0.get()) };
}

/// A function found in libc, with its checked site.
struct Located {
    spec_index: usize,
    function: usize,
    site: Site,
}

fn errno_string() -> String {
    std::io::Error::last_os_error().to_string()
}

/// Finds `spec` in libc and checks its code.
fn locate(libc_handle: *mut c_void, spec: &Spec) -> Result<(usize, Site), String> {
    // SAFETY: `libc_handle` came from dlopen and is never closed; the name is NUL-terminated.
    let f = unsafe { libc::dlsym(libc_handle, spec.name.as_ptr()) };
    if f.is_null() {
        return Err("symbol not found in libc.so.6".into());
    }
    // SAFETY: all-zero is a valid Dl_info (null pointers), filled in by dladdr1.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers; RTLD_DL_SYMENT makes `sym` point to the ELF symbol, which
    // lives as long as the object (libc is never unloaded).
    let found = unsafe { libc::dladdr1(f, &mut info, &mut sym, RTLD_DL_SYMENT) };
    if found == 0 || sym.is_null() || info.dli_fname.is_null() {
        return Err("dladdr1 found no symbol information".into());
    }
    // SAFETY: dladdr1 filled `dli_fname` with the object's NUL-terminated path.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    if !file.rsplit('/').next().is_some_and(|base| base.starts_with("libc.so")) {
        return Err(format!("resolves to {file}, not libc"));
    }
    if info.dli_saddr != f {
        return Err(format!("{f:p} is not the start of a symbol in {file}"));
    }
    // SAFETY: with RTLD_DL_SYMENT, `sym` points to the function's Elf64_Sym.
    let size = unsafe { (*sym.cast::<libc::Elf64_Sym>()).st_size } as usize;
    if !(7..=PAGE).contains(&size) {
        return Err(format!("implausible function size {size}"));
    }
    // SAFETY: `[f, f + size)` is the function's code inside libc's mapped, readable text
    // segment, per its ELF symbol; it stays mapped for the life of the process.
    let code = unsafe { std::slice::from_raw_parts(f.cast::<u8>(), size) };
    let site = decode::find_syscall_site(code, spec.nr)?;
    let at = f as usize + site.offset;
    if at % 8 > 6 {
        return Err(format!("site +{} straddles an 8-byte word: cannot be patched atomically", site.offset));
    }
    Ok((f as usize, site))
}

/// Maps one read-write page within [`REACH`] of every address in `[lo, hi]`.
fn map_near(lo: usize, hi: usize) -> Result<usize, String> {
    const STEP: usize = 1 << 21;
    for k in 1..(REACH / STEP) {
        let below = (lo & !(PAGE - 1)).checked_sub(k * STEP);
        let above = (hi & !(PAGE - 1)).checked_add(k * STEP);
        for hint in [below, above].into_iter().flatten() {
            if hint.abs_diff(lo).max(hint.abs_diff(hi)) > REACH || hint < 0x10000 {
                continue;
            }
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; a fresh
            // anonymous page is mapped or the call fails.
            let p = unsafe {
                libc::mmap(
                    hint as *mut c_void,
                    PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                continue;
            }
            let got = p as usize;
            if got.abs_diff(lo).max(got.abs_diff(hi)) <= REACH {
                return Ok(got);
            }
            // A kernel older than 4.17 takes the flag as a plain hint and may map elsewhere.
            // SAFETY: `p` is the page just mapped, used by nothing.
            unsafe { libc::munmap(p, PAGE) };
        }
    }
    Err("no free page within ±2 GiB of libc for the hook stubs".into())
}

/// Writes the stub of hook `i` (jumping to [`ENTRY`] with its record in rax) and its record.
///
/// # Safety
/// `page` is a writable page of [`PAGE`] bytes.
unsafe fn write_stub(page: usize, i: usize, nr: u32, resume: usize) {
    let record = page + RECORDS_OFFSET + i * std::mem::size_of::<SiteRecord>();
    let entry = ENTRY as *const () as usize;
    let mut stub = [0xccu8; STUB_SIZE]; // int3 padding
    stub[0..2].copy_from_slice(&[0x48, 0xb8]); // movabs rax, imm64
    stub[2..10].copy_from_slice(&(record as u64).to_le_bytes());
    stub[10..12].copy_from_slice(&[0x49, 0xbb]); // movabs r11, imm64
    stub[12..20].copy_from_slice(&(entry as u64).to_le_bytes());
    stub[20..23].copy_from_slice(&[0x41, 0xff, 0xe3]); // jmp r11
                                                       // SAFETY: the stub slot and the record slot lie inside the page (checked by the const
                                                       // assertions on the layout), which the caller guarantees writable and which nothing
                                                       // executes or reads yet.
    unsafe {
        std::ptr::copy_nonoverlapping(stub.as_ptr(), (page + i * STUB_SIZE) as *mut u8, STUB_SIZE);
        (record as *mut SiteRecord).write(SiteRecord { nr, _pad: 0, resume });
    }
}

/// Stores `bytes` at `addr`, one atomic compare-and-swap per aligned 8-byte word touched, so
/// an instruction fetch on another core sees each word either before or after.
///
/// # Safety
/// `[addr, addr + bytes.len())` is mapped writable, and only instruction fetches (no Rust
/// reads or writes) use it concurrently.
unsafe fn store_code(addr: usize, bytes: &[u8]) -> Result<(), String> {
    let mut done = 0;
    while done < bytes.len() {
        let at = addr + done;
        let word_addr = at & !7;
        let shift = at - word_addr;
        let n = (8 - shift).min(bytes.len() - done);
        // SAFETY: `word_addr` is 8-byte aligned and the whole word is inside the writable
        // range the caller made (the patch range is padded out to whole pages).
        let word = unsafe { AtomicU64::from_ptr(word_addr as *mut u64) };
        let old = word.load(SeqCst);
        let mut le = old.to_le_bytes();
        le[shift..shift + n].copy_from_slice(&bytes[done..done + n]);
        if word.compare_exchange(old, u64::from_le_bytes(le), SeqCst, SeqCst).is_err() {
            return Err(format!("code at {word_addr:#x} changed while patching"));
        }
        done += n;
    }
    Ok(())
}

/// Makes every thread of the process discard prefetched instructions, when the kernel
/// offers it (Linux 4.16+); harmless otherwise.
fn sync_cores() {
    // SAFETY: membarrier takes no pointers; an unsupported command returns an error.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) };
}

/// Replaces the `mov eax, imm32` at `site` with `jmp stub`.
///
/// # Safety
/// `site` is a checked site (the 7 bytes `mov eax, nr; syscall`) in libc's text segment,
/// and `stub` a finished stub.
unsafe fn patch(site: usize, stub: usize, nr: u32) -> Result<(), String> {
    let rel = i32::try_from(stub as i64 - (site as i64 + 5)).map_err(|_| "stub out of jmp range".to_string())?;
    let mut jmp = [0xe9u8; 5];
    jmp[1..].copy_from_slice(&rel.to_le_bytes());
    // SAFETY: the site's 7 bytes are inside libc's mapped text (checked by `locate`).
    let current = unsafe { std::slice::from_raw_parts(site as *const u8, 7) };
    if current != decode::site_bytes(nr) {
        return Err("site bytes changed since they were checked".into());
    }
    // Every aligned word `store_code` touches, in whole pages.
    let first = (site & !7) & !(PAGE - 1);
    let last = ((site + 4) | 7) & !(PAGE - 1);
    let len = last - first + PAGE;
    // SAFETY: the pages hold libc code; adding PROT_WRITE keeps them readable and
    // executable for every thread running in them, and only bytes of the site change.
    if unsafe { libc::mprotect(first as *mut c_void, len, libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) } != 0 {
        return Err(format!("mprotect(RWX) of libc text failed: {}", errno_string()));
    }
    let original = decode::site_bytes(nr);
    // SAFETY: the pages are writable now and only instruction fetch uses these bytes. One
    // atomic store (site % 8 <= 6 keeps both bytes in one word) turns the site into `jmp $`:
    // a thread arriving now spins instead of decoding a half-written instruction.
    let mut result = unsafe { store_code(site, &[0xeb, 0xfe]) };
    if result.is_ok() {
        sync_cores();
        // SAFETY: bytes 2..5 are inside the original 5-byte instruction, now behind the
        // spin: no thread executes them. Then one atomic store turns the spin into the
        // `jmp rel32`.
        result = unsafe { store_code(site + 2, &jmp[2..]).and_then(|()| store_code(site, &jmp[..2])) };
        if result.is_err() {
            // SAFETY: as above; the original instruction comes back, the spin bytes last.
            let _ = unsafe { store_code(site + 2, &original[2..5]).and_then(|()| store_code(site, &original[..2])) };
        }
    }
    sync_cores();
    // SAFETY: back to the text segment's own protection.
    if unsafe { libc::mprotect(first as *mut c_void, len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        tracing::warn!("memhooks: could not restore R-X on libc text at {first:#x}: {}", errno_string());
    }
    result
}

/// Finds, checks and patches every hooked function. Runs once per process.
pub(super) fn install() -> HooksStatus {
    // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to an already loaded libc
    // (taking a reference that is never released, so libc can never be unloaded).
    let handle = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return HooksStatus {
            state: HooksState::Unsupported("libc.so.6 is not loaded (statically linked program?)".into()),
            functions: Vec::new(),
        };
    }
    let mut outcomes: Vec<Result<PatchedSite, String>> = Vec::new();
    let mut located = Vec::new();
    for (spec_index, spec) in SPECS.iter().enumerate() {
        match locate(handle, spec) {
            Ok((function, site)) => {
                located.push(Located { spec_index, function, site });
                outcomes.push(Err("not patched".into()));
            }
            Err(e) => outcomes.push(Err(e)),
        }
    }
    if !located.is_empty() {
        // SAFETY: registration takes no pointers; failure (old kernel) is fine, sync_cores
        // then does nothing.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) };
        let lo = located.iter().map(|l| l.function).min().unwrap_or(0);
        let hi = located.iter().map(|l| l.function + l.site.offset + 5).max().unwrap_or(0);
        match map_near(lo, hi) {
            Err(e) => {
                for l in &located {
                    outcomes[l.spec_index] = Err(e.clone());
                }
            }
            Ok(page) => {
                for (i, l) in located.iter().enumerate() {
                    let site = l.function + l.site.offset;
                    // SAFETY: `page` is our fresh read-write page; `i < SPECS.len()`.
                    unsafe { write_stub(page, i, SPECS[l.spec_index].nr, site + 5) };
                }
                // SAFETY: the stub page is ours; from now on it is only executed and read.
                let sealed = unsafe { libc::mprotect(page as *mut c_void, PAGE, libc::PROT_READ | libc::PROT_EXEC) };
                // SAFETY: plain function pointers to handlers that only lock/unlock the
                // static mutex. On failure forks are simply not held off (a tiny window).
                unsafe { libc::pthread_atfork(Some(fork_lock), Some(fork_unlock), Some(fork_unlock)) };
                fork_lock();
                for (i, l) in located.iter().enumerate() {
                    let spec = &SPECS[l.spec_index];
                    let site = l.function + l.site.offset;
                    outcomes[l.spec_index] = if sealed != 0 {
                        Err(format!("mprotect(R-X) of the stub page failed: {}", errno_string()))
                    } else {
                        // SAFETY: `site` was checked by `locate`; the stub is written and
                        // executable.
                        unsafe { patch(site, page + i * STUB_SIZE, spec.nr) }.map(|()| PatchedSite {
                            function: l.function,
                            offset: l.site.offset,
                            wrapper: l.site.wrapper,
                            bytes: decode::site_bytes(spec.nr),
                        })
                    };
                }
                fork_unlock();
            }
        }
    }
    let functions: Vec<FunctionHook> = SPECS
        .iter()
        .zip(outcomes)
        .map(|(spec, result)| FunctionHook { name: spec.name.to_str().unwrap_or("?"), result })
        .collect();
    let missing: Vec<String> =
        functions.iter().filter_map(|f| f.result.as_ref().err().map(|e| format!("{}: {e}", f.name))).collect();
    let state = if missing.is_empty() {
        HooksState::Installed
    } else {
        HooksState::Unsupported(format!("not hooked: {}", missing.join("; ")))
    };
    HooksStatus { state, functions }
}

#[cfg(test)]
mod tests {
    use super::super::UnmapEvent::{All, Range};
    use super::*;

    fn ev(nr: libc::c_long, a: [usize; 5], brk: usize) -> [Option<super::super::UnmapEvent>; 2] {
        unmapped_by(nr as u32, a, || brk)
    }

    #[test]
    fn which_calls_unmap_what() {
        assert_eq!(
            ev(libc::SYS_munmap, [0x1000, 0x2000, 0, 0, 0], 0),
            [Some(Range { addr: 0x1000, len: 0x2000 }), None]
        );
        let mremap_fixed = (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as usize;
        assert_eq!(
            ev(libc::SYS_mremap, [0x1000, 0x2000, 0x3000, mremap_fixed, 0x9000], 0),
            [Some(Range { addr: 0x1000, len: 0x2000 }), Some(Range { addr: 0x9000, len: 0x3000 })]
        );
        assert_eq!(
            ev(libc::SYS_mremap, [0x1000, 0x2000, 0x3000, libc::MREMAP_MAYMOVE as usize, 0x9000], 0),
            [Some(Range { addr: 0x1000, len: 0x2000 }), None]
        );
        for advice in [libc::MADV_DONTNEED, libc::MADV_FREE, libc::MADV_REMOVE, libc::MADV_DONTNEED_LOCKED] {
            assert_eq!(
                ev(libc::SYS_madvise, [0x1000, 10, advice as usize, 0, 0], 0)[0],
                Some(Range { addr: 0x1000, len: 10 })
            );
        }
        for advice in [libc::MADV_WILLNEED, libc::MADV_NORMAL, libc::MADV_HUGEPAGE, libc::MADV_DONTFORK] {
            assert_eq!(ev(libc::SYS_madvise, [0x1000, 10, advice as usize, 0, 0], 0), [None, None]);
        }
        assert_eq!(ev(libc::SYS_shmdt, [0x1000, 0, 0, 0, 0], 0), [Some(All), None]);
        assert_eq!(ev(libc::SYS_brk, [0x5000, 0, 0, 0, 0], 0x8000), [Some(Range { addr: 0x5000, len: 0x3000 }), None]);
        assert_eq!(ev(libc::SYS_brk, [0x9000, 0, 0, 0, 0], 0x8000), [None, None], "growing");
        assert_eq!(ev(libc::SYS_brk, [0, 0, 0, 0, 0], 0x8000), [None, None], "query");
        let fixed = (libc::MAP_FIXED | libc::MAP_PRIVATE) as usize;
        assert_eq!(ev(libc::SYS_mmap, [0x1000, 0x2000, 3, fixed, 0], 0)[0], Some(Range { addr: 0x1000, len: 0x2000 }));
        let noreplace = (libc::MAP_FIXED_NOREPLACE | libc::MAP_PRIVATE) as usize;
        assert_eq!(ev(libc::SYS_mmap, [0x1000, 0x2000, 3, noreplace, 0], 0), [None, None]);
        assert_eq!(ev(libc::SYS_mmap, [0, 0x2000, 3, libc::MAP_PRIVATE as usize, 0], 0), [None, None]);
        assert_eq!(ev(libc::SYS_getpid, [1, 2, 3, 4, 5], 0), [None, None]);
    }
}
