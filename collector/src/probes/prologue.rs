//! Where on a function its uprobe costs least.
//!
//! x86 uprobes emulate a few instructions at the probed address (branches, pushes) and
//! single-step any other one out of line: a second trap per hit. In this kind of VM
//! that trap is most of a hit's cost: 10.7 us a call with the probe on a `cmpl`,
//! 1.3 us with it on the `je` that follows (same function, same BPF program).
//!
//! NVIDIA's libcuda (535.261 and 550.163 read) begins every API entry point with its
//! deinitialised check, `cmpl $imm32, disp32(%rip)`, then `je`, then an indirect `jmp`
//! into the implementation. A compare writes the flags only, and the conditional jump is
//! the next instruction on every path: at the `je` each argument register, the stack
//! pointer and the return address on the stack are what they were at the entry, so a
//! probe there (entry or return) sees the same call and skips the single step. Any other
//! first instruction keeps the probe on the entry. (A jump from elsewhere straight to the
//! `je` would be counted as a call too; the driver's entries are stubs of their own, and
//! compilers do not jump into an exported function past its first instruction.)

use std::path::Path;

/// Offset of the instruction after a leading guard compare (`cmp` of an immediate with
/// a RIP-relative memory operand) when a conditional jump follows it; 0 otherwise.
pub(super) fn guard_len(code: &[u8]) -> u64 {
    if !cfg!(target_arch = "x86_64") {
        return 0;
    }
    let rex_w = usize::from(code.first() == Some(&0x48));
    let Some(&[opcode, modrm]) = code.get(rex_w..rex_w + 2) else {
        return 0;
    };
    // ModRM 0x3d: mod 00, reg 7 (/7 is CMP in the immediate group), rm 101 (RIP + disp32).
    if modrm != 0x3d {
        return 0;
    }
    let immediate = match opcode {
        0x81 => 4,
        0x83 => 1,
        0x80 if rex_w == 0 => 1,
        _ => return 0,
    };
    let len = rex_w + 2 + 4 + immediate;
    let is_jcc = matches!(
        code.get(len..),
        Some([0x70..=0x7f, _, ..] | [0x0f, 0x80..=0x8f, _, _, _, _, ..])
    );
    if is_jcc {
        len as u64
    } else {
        0
    }
}

/// For each of `symbols`, where its probe goes relative to the symbol (`guard_len` of
/// its first bytes in `file`): 0 for a symbol the file does not define, and for all of
/// them when the file cannot be read as an ELF object (the attach then says why).
pub(super) fn guard_offsets(file: &Path, symbols: &[&str]) -> Vec<u64> {
    let mut offsets = vec![0; symbols.len()];
    if let Some(code) = first_bytes(file, symbols) {
        for (offset, code) in offsets.iter_mut().zip(code) {
            *offset = code.map_or(0, |c| guard_len(&c));
        }
    }
    offsets
}

/// Longest guard and jump `guard_len` recognises: REX.W, opcode, ModRM, disp32, imm32,
/// then a six-byte `jcc rel32`.
const PROLOGUE_BYTES: u64 = 17;

/// The first bytes of each defined dynamic symbol of `symbols` in `file`.
fn first_bytes(file: &Path, symbols: &[&str]) -> Option<Vec<Option<Vec<u8>>>> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let cache = object::ReadCache::new(std::fs::File::open(file).ok()?);
    let elf = object::File::parse(&cache).ok()?;
    let mut found = vec![None; symbols.len()];
    for sym in elf.dynamic_symbols() {
        if !sym.is_definition() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        // Versioned names (`SSL_read@@OPENSSL_3.0.0`) are matched as aya resolves them.
        let base = name.split('@').next().unwrap_or(name);
        let Some(i) = symbols.iter().position(|s| *s == base) else {
            continue;
        };
        let Some(section) = sym
            .section_index()
            .and_then(|i| elf.section_by_index(i).ok())
        else {
            continue;
        };
        // A symbol outside its section (a damaged file) reads nothing.
        let Some(left) = (section.address() + section.size()).checked_sub(sym.address()) else {
            continue;
        };
        if let Ok(Some(bytes)) = section.data_range(sym.address(), PROLOGUE_BYTES.min(left)) {
            found[i] = Some(bytes.to_vec());
        }
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first 12 bytes of cuGraphLaunch in NVIDIA's libcuda 535.261.03 (Debian's
    /// libcuda1): `cmpl $0x321cba00,0x18d8e3e(%rip)`, `je +0xc`. 550.163.01's entry points
    /// have the same shape with another displacement.
    const DRIVER_535: [u8; 12] = [
        0x81, 0x3d, 0x3e, 0x8e, 0x8d, 0x01, 0x00, 0xba, 0x1c, 0x32, 0x74, 0x0c,
    ];

    #[test]
    fn the_drivers_guard_is_skipped_to_its_jump() {
        if !cfg!(target_arch = "x86_64") {
            return assert_eq!(guard_len(&DRIVER_535), 0);
        }
        assert_eq!(guard_len(&DRIVER_535), 10);
        // The same compare with a near jump, an 8-bit immediate, a byte or a quad compare.
        let near = [0x81, 0x3d, 0, 0, 0, 0, 0, 0, 0, 0, 0x0f, 0x84, 1, 0, 0, 0];
        assert_eq!(guard_len(&near), 10);
        assert_eq!(guard_len(&[0x83, 0x3d, 1, 2, 3, 4, 5, 0x75, 0x02]), 7);
        assert_eq!(guard_len(&[0x80, 0x3d, 1, 2, 3, 4, 5, 0x74, 0x02]), 7);
        assert_eq!(guard_len(&[0x48, 0x83, 0x3d, 1, 2, 3, 4, 5, 0x74, 0x02]), 8);
    }

    #[test]
    fn anything_else_stays_on_the_entry() {
        // The compare alone, cut short, or followed by something not a conditional jump.
        assert_eq!(guard_len(&DRIVER_535[..10]), 0);
        assert_eq!(guard_len(&DRIVER_535[..11]), 0);
        assert_eq!(guard_len(&DRIVER_535[..5]), 0);
        let mut then_mov = DRIVER_535;
        then_mov[10] = 0x89;
        assert_eq!(guard_len(&then_mov), 0);
        // A near jcc cut short.
        assert_eq!(guard_len(&[0x83, 0x3d, 1, 2, 3, 4, 5, 0x0f, 0x84, 0]), 0);
        // Compares through a register (ModRM other than RIP-relative) write nothing
        // either, but are not what the driver does: left alone.
        assert_eq!(guard_len(&[0x83, 0x7f, 0x08, 0x00, 0x74, 0x02]), 0);
        // libssl's `sub $0x8,%rsp`, a frame's `push %rbp`, a tail call's `mov`, endbr64.
        assert_eq!(guard_len(&[0x48, 0x83, 0xec, 0x08]), 0);
        assert_eq!(guard_len(&[0x55, 0x48, 0x89, 0xe5]), 0);
        assert_eq!(guard_len(&[0x48, 0x89, 0xfe, 0x31, 0xff]), 0);
        assert_eq!(guard_len(&[0xf3, 0x0f, 0x1e, 0xfa]), 0);
        // REX.W with a byte compare is not an instruction gcc emits: left alone.
        assert_eq!(guard_len(&[0x48, 0x80, 0x3d, 1, 2, 3, 4, 5, 0x74, 0x02]), 0);
        assert_eq!(guard_len(&[]), 0);
    }

    #[test]
    fn files_that_are_not_elf_or_lack_the_symbol_give_zero() {
        assert_eq!(
            guard_offsets(Path::new("/nonexistent"), &["cuInit", "cuGraphLaunch"]),
            vec![0, 0]
        );
        let not_elf = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        assert_eq!(guard_offsets(&not_elf, &["cuInit"]), vec![0]);
        let libc =
            super::super::discover::mapped(&[std::process::id()], |n| n.starts_with("libc.so"));
        let libc = libc.first().expect("this test process maps libc");
        assert_eq!(guard_offsets(libc, &["cuGraphLaunch"]), vec![0]);
    }
}
