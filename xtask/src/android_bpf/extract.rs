//! Reading the aya object: its maps, and each kept program as one
//! self-contained section's code with its map relocations, `.rodata`
//! settings folded to constants and called functions linked in.

use anyhow::{bail, ensure, Context, Result};
use object::{
    read::elf::ElfFile64, LittleEndian as LE, Object, ObjectSection, ObjectSymbol, RelocationFlags,
    RelocationTarget, SectionIndex, SymbolKind,
};

use super::{ProgSpec, BPFLOADER_SETTINGS};

/// One map from the aya object's legacy `maps` section
/// (aya's bpf_map_def: type, key_size, value_size, max_entries, map_flags, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapInfo {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
}

pub(super) struct Prog {
    pub(super) spec: &'static ProgSpec,
    pub(super) code: Vec<u8>,
    /// (offset in code, map index)
    pub(super) relocs: Vec<(u64, usize)>,
}

pub(super) const INSN: usize = 8;
pub(super) const BPF_LD_IMM64: u8 = 0x18;
pub(super) const BPF_CALL: u8 = 0x85;
pub(super) const R_BPF_64_64: u32 = 1;

pub(super) fn u32_at(d: &[u8], off: usize) -> Result<u32> {
    let b = d
        .get(off..off + 4)
        .with_context(|| format!("read past end at {off}"))?;
    Ok(u32::from_le_bytes(b.try_into().unwrap()))
}

pub fn read_maps(obj: &ElfFile64<LE>) -> Result<(SectionIndex, Vec<(u64, MapInfo)>)> {
    let sec = obj
        .section_by_name("maps")
        .context("no `maps` section in the aya object")?;
    let data = sec.data()?;
    let mut maps = Vec::new();
    for sym in obj.symbols() {
        if sym.section_index() != Some(sec.index()) || sym.kind() == SymbolKind::Section {
            continue;
        }
        let off = sym.address() as usize;
        maps.push((
            sym.address(),
            MapInfo {
                name: sym.name()?.to_owned(),
                map_type: u32_at(data, off)?,
                key_size: u32_at(data, off + 4)?,
                value_size: u32_at(data, off + 8)?,
                max_entries: u32_at(data, off + 12)?,
                map_flags: u32_at(data, off + 16)?,
            },
        ));
    }
    maps.sort_by_key(|(a, _)| *a);
    ensure!(!maps.is_empty(), "no map symbols in `maps`");
    Ok((sec.index(), maps))
}

/// Reads `len` bytes of .rodata at `off` as the little-endian value a
/// load of that size gives.
fn rodata_value(rodata: &[u8], off: usize, len: usize) -> Result<u64> {
    let b = rodata
        .get(off..off + len)
        .with_context(|| format!(".rodata read past end at {off}+{len}"))?;
    let mut v = [0u8; 8];
    v[..len].copy_from_slice(b);
    Ok(u64::from_le_bytes(v))
}

/// The value bpfloader's object gets for the `.rodata` setting at
/// `addr` when it is one of [`BPFLOADER_SETTINGS`]; None: keep the
/// compiled-in default.
pub(super) fn rodata_setting(
    obj: &ElfFile64<LE>,
    rodata: SectionIndex,
    addr: usize,
    len: usize,
) -> Option<u64> {
    let sym = obj.symbols().find(|s| {
        s.section_index() == Some(rodata)
            && s.address() as usize == addr
            && s.size() as usize == len
            && s.kind() == SymbolKind::Data
    })?;
    let name = sym.name().ok()?;
    BPFLOADER_SETTINGS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
}

/// Folds `rA = <.rodata + k> ll; ...; rA = *(uN *)(rA + off)` into
/// `ja +0; ja +0; ...; rA = <value>`. Only that shape, with no jump,
/// write or read of rA in between and no jump landing in between, is
/// accepted; anything else is an error rather than a guess.
fn fold_rodata_load(
    code: &mut [u8],
    at: usize,
    base: u64,
    value: impl Fn(usize, usize) -> Result<u64>,
) -> Result<()> {
    let n = code.len() / INSN;
    let i = at / INSN;
    let reg = code[at + 1] & 0x0f;
    let imm = i32::from_le_bytes(code[at + 4..at + 8].try_into().unwrap()) as i64;
    let targets = jump_targets(code);
    let mut j = i + 2;
    while j < n {
        let p = j * INSN;
        let (op, dst, src) = (code[p], code[p + 1] & 0x0f, code[p + 1] >> 4);
        let class = op & 0x07;
        ensure!(
            !targets.contains(&j),
            "insn {j}: jump target between .rodata address (insn {i}) and its load"
        );
        if class == 0x01 && op & 0xe0 == 0x60 && src == reg {
            // BPF_LDX | BPF_MEM from the .rodata pointer.
            ensure!(
                dst == reg || overwrites_unread(code, j + 1, reg, &targets),
                "insn {j}: .rodata load into another register, r{reg} still live"
            );
            let len = match op & 0x18 {
                0x00 => 4,
                0x08 => 2,
                0x10 => 1,
                _ => 8,
            };
            let off = i16::from_le_bytes(code[p + 2..p + 4].try_into().unwrap()) as i64;
            let addr = (base as i64 + imm + off) as usize;
            let v = value(addr, len)?;
            // mov32 for <= 4 bytes (zero-extends like the load did); mov64
            // sign-extends its imm, so 8-byte values must fit in i32 >= 0.
            let op = if len == 8 {
                ensure!(v <= i32::MAX as u64, "8-byte .rodata value {v} too big");
                0xb7 // BPF_ALU64 | BPF_MOV | BPF_K
            } else {
                0xb4 // BPF_ALU | BPF_MOV | BPF_K
            };
            code[p..p + INSN].copy_from_slice(&[op, dst, 0, 0, 0, 0, 0, 0]);
            code[p + 4..p + 8].copy_from_slice(&(v as u32).to_le_bytes());
            // ld_imm64 (two slots) -> two `ja +0`.
            for k in [at, at + INSN] {
                code[k..k + INSN].copy_from_slice(&[0x05, 0, 0, 0, 0, 0, 0, 0]);
            }
            return Ok(());
        }
        ensure!(
            !(class == 0x05 || class == 0x06),
            "insn {j}: branch between .rodata address (insn {i}) and its load"
        );
        ensure!(
            dst != reg && src != reg,
            "insn {j}: r{reg} used between .rodata address (insn {i}) and its load"
        );
        j += if op == BPF_LD_IMM64 { 2 } else { 1 };
    }
    bail!("insn {i}: .rodata address never loaded from")
}

/// Whether insn `j` (no jump lands on it) writes `reg` without reading
/// it: then a load from the .rodata pointer in `reg` into another register
/// just before it leaves the pointer dead, and folding the load into a
/// constant in that register is exact (the compiler does this when it
/// reuses the pointer's register at once).
fn overwrites_unread(code: &[u8], j: usize, reg: u8, targets: &[usize]) -> bool {
    let p = j * INSN;
    let Some(insn) = code.get(p..p + INSN) else {
        return false;
    };
    let (op, dst, src) = (insn[0], insn[1] & 0x0f, insn[1] >> 4);
    let writes = match op {
        // BPF_LDX | BPF_MEM, any size.
        op if op & 0x07 == 0x01 && op & 0xe0 == 0x60 => src != reg,
        // mov32/mov64 of an immediate, and ld_imm64.
        0xb4 | 0xb7 | BPF_LD_IMM64 => true,
        // mov32/mov64 from a register.
        0xbc | 0xbf => src != reg,
        _ => false,
    };
    writes && dst == reg && !targets.contains(&j)
}

fn jump_targets(code: &[u8]) -> Vec<usize> {
    let mut t = Vec::new();
    let mut i = 0;
    while i * INSN < code.len() {
        let p = i * INSN;
        let op = code[p];
        let class = op & 0x07;
        if (class == 0x05 || class == 0x06) && op != 0x85 && op != 0x95 {
            let off = i16::from_le_bytes(code[p + 2..p + 4].try_into().unwrap()) as i64;
            t.push((i as i64 + 1 + off) as usize);
        }
        i += if op == BPF_LD_IMM64 { 2 } else { 1 };
    }
    t
}

pub(super) fn extract_prog(
    obj: &ElfFile64<LE>,
    spec: &'static ProgSpec,
    maps_idx: SectionIndex,
    maps: &[(u64, MapInfo)],
) -> Result<Prog> {
    let sym = obj
        .symbols()
        .find(|s| s.kind() == SymbolKind::Text && s.name() == Ok(spec.func))
        .with_context(|| format!("program {} not in the aya object", spec.func))?;
    let sec = obj.section_by_index(sym.section_index().context("undefined program")?)?;
    let (start, size) = (sym.address(), sym.size());
    ensure!(
        size > 0 && size % INSN as u64 == 0,
        "{}: bad size",
        spec.func
    );
    let mut code = sec
        .data()?
        .get(start as usize..(start + size) as usize)
        .context("program past its section")?
        .to_vec();
    let found = relocate(
        obj,
        spec,
        &sec,
        start..start + size,
        &mut code,
        maps_idx,
        maps,
    )?;
    link_callees(obj, spec, &mut code, found.calls)?;
    let relocs = found.relocs;
    Ok(Prog { spec, code, relocs })
}

/// What relocating a program's code found.
struct Relocated {
    /// (offset in code, map index)
    relocs: Vec<(u64, usize)>,
    calls: Vec<Call>,
}

/// (call insn offset, callee address, callee size, callee section)
type Call = (usize, u64, u64, Option<SectionIndex>);

/// Applies the relocations of `range` of `sec` to `code`: map loads are
/// kept for bpfloader (imm cleared), `.rodata` loads folded, calls
/// returned for [`link_callees`].
fn relocate(
    obj: &ElfFile64<LE>,
    spec: &ProgSpec,
    sec: &object::read::elf::ElfSection64<LE>,
    range: std::ops::Range<u64>,
    code: &mut [u8],
    maps_idx: SectionIndex,
    maps: &[(u64, MapInfo)],
) -> Result<Relocated> {
    let start = range.start;
    let rodata = obj.section_by_name(".rodata");
    let mut relocs = Vec::new();
    let mut calls = Vec::new();
    for (off, rel) in sec.relocations() {
        if !range.contains(&off) {
            continue;
        }
        let at = (off - start) as usize;
        let RelocationTarget::Symbol(si) = rel.target() else {
            bail!("{}: relocation at {off} without a symbol", spec.func);
        };
        let target = obj.symbol_by_index(si)?;
        let tsec = target.section_index();
        if code[at] == BPF_CALL {
            calls.push((at, target.address(), target.size(), tsec));
            continue;
        }
        ensure!(
            code[at] == BPF_LD_IMM64,
            "{}: relocation at {off} on insn {:#x}, not ld_imm64 (calls to other functions are \
             not supported by bpfloader: one program per section)",
            spec.func,
            code[at]
        );
        if let RelocationFlags::Elf { r_type } = rel.flags() {
            ensure!(
                r_type == R_BPF_64_64,
                "{}: relocation type {r_type}",
                spec.func
            );
        }
        let imm = i32::from_le_bytes(code[at + 4..at + 8].try_into().unwrap()) as i64;
        if tsec == Some(maps_idx) {
            let addr = (target.address() as i64 + imm) as u64;
            let m = maps
                .iter()
                .position(|(a, _)| *a == addr)
                .with_context(|| format!("{}: no map at maps+{addr}", spec.func))?;
            // bpfloader overwrites imm with the fd; keep it clean.
            code[at + 4..at + 8].copy_from_slice(&[0; 4]);
            relocs.push((at as u64, m));
        } else if let Some(ro) = rodata.as_ref().filter(|r| Some(r.index()) == tsec) {
            let data = ro.data()?;
            let value = |addr: usize, len: usize| match rodata_setting(obj, ro.index(), addr, len) {
                Some(v) => Ok(v),
                None => rodata_value(data, addr, len),
            };
            fold_rodata_load(code, at, target.address(), value)
                .with_context(|| format!("{}: folding a .rodata setting", spec.func))?;
        } else if tsec
            .and_then(|i| obj.section_by_index(i).ok())
            .is_some_and(|s| s.name() == Ok(".maps"))
        {
            // A `SLOT_*` outer: only under PER_CAPTURE_MAPS, folded to 0.
            ensure!(
                BPFLOADER_SETTINGS.contains(&("PER_CAPTURE_MAPS", 0)),
                "{}: relocation to the per-capture outer {:?}, but PER_CAPTURE_MAPS is not folded \
                 to 0 for bpfloader",
                spec.func,
                target.name()
            );
            // A plain 0 in code the verifier never walks: no map fd.
            code[at + 4..at + 8].copy_from_slice(&[0; 4]);
        } else {
            bail!(
                "{}: relocation to {:?} (only maps and .rodata are supported)",
                spec.func,
                target.name()
            );
        }
    }
    Ok(Relocated { relocs, calls })
}

/// bpfloader loads one section as one program, so the functions it calls
/// (compiler builtins such as memset, in .text) are appended to it and
/// the calls re-aimed: static linking of BPF subprograms. Callees must
/// be leaves without relocations.
fn link_callees(
    obj: &ElfFile64<LE>,
    spec: &ProgSpec,
    code: &mut Vec<u8>,
    calls: Vec<Call>,
) -> Result<()> {
    let main_len = code.len();
    let mut placed: Vec<(u64, usize)> = Vec::new();
    for (at, addr, size, tsec) in calls {
        let callee = obj.section_by_index(tsec.context("call to an undefined function")?)?;
        ensure!(
            callee
                .relocations()
                .all(|(o, _)| o < addr || o >= addr + size),
            "{}: callee at {addr} has relocations",
            spec.func
        );
        ensure!(size > 0, "{}: callee at {addr} has no size", spec.func);
        let start = match placed.iter().find(|(a, _)| *a == addr) {
            Some(&(_, s)) => s,
            None => {
                let s = code.len();
                let body = callee
                    .data()?
                    .get(addr as usize..(addr + size) as usize)
                    .context("callee past its section")?;
                for k in (0..body.len()).step_by(INSN) {
                    ensure!(
                        body[k] != BPF_CALL || body[k + 1] >> 4 != 1,
                        "{}: callee at {addr} calls further",
                        spec.func
                    );
                }
                code.extend_from_slice(body);
                placed.push((addr, s));
                s
            }
        };
        ensure!(at < main_len, "call outside the program");
        let imm = (start / INSN) as i64 - (at / INSN) as i64 - 1;
        code[at + 1] = (code[at + 1] & 0x0f) | (1 << 4); // BPF_PSEUDO_CALL
        code[at + 4..at + 8].copy_from_slice(&(imm as i32).to_le_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod fold_tests {
    use super::*;

    fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; INSN] {
        let mut i = [0u8; INSN];
        i[0] = op;
        i[1] = dst | (src << 4);
        i[2..4].copy_from_slice(&off.to_le_bytes());
        i[4..8].copy_from_slice(&imm.to_le_bytes());
        i
    }

    /// r1 = .rodata + 8 ll; w2 = *(u32 *)(r1 + 0); `then`; exit.
    fn program(then: [u8; INSN]) -> Vec<u8> {
        [
            insn(BPF_LD_IMM64, 1, 0, 0, 8),
            insn(0, 0, 0, 0, 0),
            insn(0x61, 2, 1, 0, 0),
            then,
            insn(0x95, 0, 0, 0, 0),
        ]
        .concat()
    }

    /// The pointer's register overwritten at once: the load folds into a
    /// constant in the load's own destination.
    #[test]
    fn a_load_into_another_register_folds_when_the_pointer_dies_at_once() {
        // r1 = *(u64 *)(r10 - 0x60): r1 written, not read.
        let mut code = program(insn(0x79, 1, 10, -0x60, 0));
        fold_rodata_load(&mut code, 0, 100, |addr, len| {
            assert_eq!((addr, len), (108, 4));
            Ok(7)
        })
        .unwrap();
        assert_eq!(&code[2 * INSN..3 * INSN], &insn(0xb4, 2, 0, 0, 7));
        assert_eq!(&code[..INSN], &insn(0x05, 0, 0, 0, 0));
    }

    /// The pointer read again after the load, or not overwritten: refused.
    #[test]
    fn a_load_into_another_register_is_refused_while_the_pointer_lives() {
        for then in [
            insn(0x61, 3, 1, 4, 0), // w3 = *(u32 *)(r1 + 4): r1 read
            insn(0x0f, 1, 1, 0, 0), // r1 += r1: read and written
            insn(0xbf, 3, 1, 0, 0), // r3 = r1
            insn(0x05, 0, 0, 0, 0), // ja: r1 still live beyond
        ] {
            let mut code = program(then);
            let err = fold_rodata_load(&mut code, 0, 100, |_, _| Ok(7)).unwrap_err();
            assert!(err.to_string().contains("another register"), "{err}");
        }
    }
}
