//! Finds the `mov eax, <nr>; syscall` instruction pair of a libc syscall wrapper.
//!
//! The hook replaces exactly that `mov eax, imm32` (5 bytes) with a `jmp rel32` (5 bytes), so
//! the site must be a real instruction boundary on the path every call takes. This module
//! checks it with a deliberately small x86-64 length decoder that walks the function from its
//! entry and knows only the instruction forms of glibc's wrapper prologues (stack setup,
//! register moves, tests, compares, conditional branches). Anything else means "not a wrapper
//! we understand": the function is not patched.
//!
//! Pure functions over byte slices, so they are tested on any platform.

/// Longest prologue walked before the syscall site.
const MAX_WALK: usize = 96;

/// A checked patch site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Site {
    /// Offset of the `mov eax, imm32` from the function entry.
    pub offset: usize,
    /// True when the site is the function's first instruction (after an optional
    /// `endbr64`): the plain `mov eax, nr; syscall` wrapper.
    pub wrapper: bool,
    /// Instructions decoded before the site.
    pub prologue_insns: usize,
}

/// Byte pattern at the site: `mov eax, nr` then `syscall`.
pub(crate) fn site_bytes(nr: u32) -> [u8; 7] {
    let n = nr.to_le_bytes();
    [0xb8, n[0], n[1], n[2], n[3], 0x0f, 0x05]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

/// Finds the syscall site for syscall `nr` in `code`, the whole function (its ELF symbol
/// size). Requirements: the site is reached from the entry through decodable instructions
/// only, and it is the only `syscall` byte pair (`0f 05`) anywhere in the function.
pub(crate) fn find_syscall_site(code: &[u8], nr: u32) -> Result<Site, String> {
    let want = site_bytes(nr);
    let mut at = 0;
    let mut insns = 0;
    let site = loop {
        if at >= code.len() || at > MAX_WALK {
            return Err(format!("no `mov eax, {nr}; syscall` within the first {at} bytes"));
        }
        let rest = code.get(at..).unwrap_or_default();
        if rest.starts_with(&want) {
            let after_endbr = insns == 1 && code.starts_with(&ENDBR64);
            break Site { offset: at, wrapper: insns == 0 || after_endbr, prologue_insns: insns };
        }
        match insn_len(rest) {
            Some(len) => {
                at += len;
                insns += 1;
            }
            None => {
                let shown = rest.get(..rest.len().min(8)).unwrap_or_default();
                return Err(format!("unrecognised instruction at +{at}: {}", hex(shown)));
            }
        }
    };
    let syscalls: Vec<usize> =
        code.windows(2).enumerate().filter(|(_, w)| w == &[0x0f, 0x05]).map(|(i, _)| i).collect();
    if syscalls != [site.offset + 5] {
        return Err(format!("expected one syscall instruction, found `0f 05` at offsets {syscalls:?}"));
    }
    Ok(site)
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Length of the ModRM operand (ModRM byte, SIB, displacement) starting at `b[0]`.
fn modrm_len(b: &[u8]) -> Option<usize> {
    let modrm = *b.first()?;
    let md = modrm >> 6;
    let rm = modrm & 7;
    if md == 3 {
        return Some(1);
    }
    let mut len = 1;
    if rm == 4 {
        let sib = *b.get(1)?;
        len += 1;
        if md == 0 && sib & 7 == 5 {
            len += 4; // no base: disp32
        }
    } else if md == 0 && rm == 5 {
        len += 4; // rip-relative disp32
    }
    len += match md {
        1 => 1,
        2 => 4,
        _ => 0,
    };
    Some(len)
}

/// Length of the instruction at `b[0]`, for the forms glibc's wrapper prologues use; `None`
/// for anything else (including every unconditional control transfer).
pub(crate) fn insn_len(b: &[u8]) -> Option<usize> {
    if b.starts_with(&ENDBR64) {
        return Some(4);
    }
    let mut i = 0;
    if matches!(b.first(), Some(0x64 | 0x65)) {
        i += 1; // fs/gs segment override (stack-protector canary load)
    }
    let mut rex = 0u8;
    if let Some(&p) = b.get(i) {
        if p & 0xf0 == 0x40 {
            rex = p;
            i += 1;
        }
    }
    let op = *b.get(i)?;
    i += 1;
    let modrm_reg = |b: &[u8], i: usize| b.get(i).map(|m| (m >> 3) & 7);
    let len = match op {
        0x50..=0x5f => i,                                       // push/pop reg
        0x70..=0x7f => i + 1,                                   // jcc rel8: the walk follows the fall-through path
        0xb8..=0xbf => i + if rex & 0x08 != 0 { 8 } else { 4 }, // mov reg, imm32/imm64
        // add/or/and/sub/xor/cmp/test/mov/lea with a ModRM operand, no immediate
        0x01 | 0x03 | 0x09 | 0x0b | 0x21 | 0x23 | 0x29 | 0x2b | 0x31 | 0x33 | 0x39 | 0x3b | 0x85 | 0x89 | 0x8b
        | 0x8d => i + modrm_len(b.get(i..)?)?,
        0x83 | 0xc1 => i + modrm_len(b.get(i..)?)? + 1, // group 1 / shift, imm8
        0x81 => i + modrm_len(b.get(i..)?)? + 4,        // group 1, imm32
        0xf6 if modrm_reg(b, i)? == 0 => i + modrm_len(b.get(i..)?)? + 1, // test r/m8, imm8
        0xf7 if modrm_reg(b, i)? == 0 => i + modrm_len(b.get(i..)?)? + 4, // test r/m32, imm32
        0xc7 if modrm_reg(b, i)? == 0 => i + modrm_len(b.get(i..)?)? + 4, // mov r/m, imm32
        0x0f => match b.get(i)? {
            0x80..=0x8f => i + 5, // jcc rel32
            _ => return None,
        },
        _ => return None,
    };
    (len <= b.len()).then_some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        s.split_whitespace().map(|h| u8::from_str_radix(h, 16).unwrap()).collect()
    }

    // Machine code of Debian glibc 2.36 (x86_64) wrappers, as the hooks find them.
    const MUNMAP: &str =
        "b8 0b 00 00 00 0f 05 48 3d 01 f0 ff ff 73 01 c3 48 8b 0d c9 13 0d 00 f7 d8 64 89 01 48 83 c8 ff c3";
    const BRK: &str =
        "b8 0c 00 00 00 0f 05 48 8b 15 e2 51 0d 00 48 89 02 48 39 f8 72 0a 31 c0 c3 0f 1f 80 00 00 00 00 \
                       48 8b 05 79 51 0d 00 64 c7 00 0c 00 00 00 b8 ff ff ff ff c3";
    const MMAP: &str =
        "41 89 ca 41 f7 c1 ff 0f 00 00 75 14 b8 09 00 00 00 0f 05 48 3d 00 f0 ff ff 77 25 c3 0f 1f 40 00 \
                        48 8b 05 19 14 0d 00 64 c7 00 16 00 00 00 48 c7 c0 ff ff ff ff c3";
    const MREMAP: &str = "48 83 ec 58 4c 89 44 24 40 64 48 8b 04 25 28 00 00 00 48 89 44 24 18 31 c0 83 f9 07 77 5a \
                          41 89 ca 45 31 c0 f6 c1 06 75 27 b8 19 00 00 00 0f 05 48 3d 00 f0 ff ff 77 58 48 8b 54 24 18 \
                          64 48 2b 14 25 28 00 00 00 75 5d 48 83 c4 58 c3";

    #[test]
    fn glibc_236_wrappers() {
        assert_eq!(find_syscall_site(&unhex(MUNMAP), 11), Ok(Site { offset: 0, wrapper: true, prologue_insns: 0 }));
        assert_eq!(find_syscall_site(&unhex(BRK), 12), Ok(Site { offset: 0, wrapper: true, prologue_insns: 0 }));
        assert_eq!(find_syscall_site(&unhex(MMAP), 9), Ok(Site { offset: 12, wrapper: false, prologue_insns: 3 }));
        assert_eq!(find_syscall_site(&unhex(MREMAP), 25), Ok(Site { offset: 41, wrapper: false, prologue_insns: 11 }));
    }

    #[test]
    fn endbr64_before_the_wrapper() {
        let code = unhex(&format!("f3 0f 1e fa {MUNMAP}"));
        assert_eq!(find_syscall_site(&code, 11), Ok(Site { offset: 4, wrapper: true, prologue_insns: 1 }));
    }

    #[test]
    fn refuses_what_it_does_not_understand() {
        // Another syscall number.
        assert!(find_syscall_site(&unhex(MUNMAP), 12).unwrap_err().contains("unrecognised instruction at +5"));
        // Already patched (a jmp at the entry, as UCX's bistro leaves it).
        let patched = unhex("e9 10 20 30 40 0f 05 c3");
        assert!(find_syscall_site(&patched, 11).unwrap_err().contains("unrecognised instruction at +0"));
        // A second syscall instruction elsewhere in the function.
        let two = unhex(&format!("{MUNMAP} b8 0b 00 00 00 0f 05 c3"));
        assert!(find_syscall_site(&two, 11).unwrap_err().contains("[5, 38]"));
        // A call before the site.
        let call = unhex("e8 00 00 00 00 b8 0b 00 00 00 0f 05 c3");
        assert!(find_syscall_site(&call, 11).is_err());
        // Truncated function.
        assert!(find_syscall_site(&unhex("48 83 ec"), 11).is_err());
        assert!(find_syscall_site(&[], 11).is_err());
    }

    #[test]
    fn lengths() {
        for (code, len) in [
            ("64 48 8b 04 25 28 00 00 00", 9),
            ("4c 89 44 24 40", 5),
            ("48 89 84 24 00 01 00 00", 8),
            ("48 8b 05 79 51 0d 00", 7),
            ("48 81 ec 00 01 00 00", 7),
            ("41 54", 2),
            ("48 b8 01 02 03 04 05 06 07 08", 10),
            ("0f 84 10 00 00 00", 6),
            ("f6 c1 06", 3),
        ] {
            assert_eq!(insn_len(&unhex(code)), Some(len), "{code}");
        }
        for code in ["c3", "e8 00 00 00 00", "eb fe", "f7 d8", "0f 05", "ff e0"] {
            assert_eq!(insn_len(&unhex(code)), None, "{code}");
        }
    }

    #[test]
    fn never_panics_on_any_prefix_of_real_code() {
        for code in [MUNMAP, BRK, MMAP, MREMAP] {
            let code = unhex(code);
            for end in 0..=code.len() {
                for start in 0..end {
                    let _ = insn_len(&code[start..end]);
                    let _ = find_syscall_site(&code[start..end], 9);
                }
            }
        }
    }
}
