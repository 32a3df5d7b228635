//! `cargo xtask android-bpf`: rewrites the aya-built eBPF object into the
//! ELF format Android's bpfloader reads from /system/etc/bpf, as
//! `target/dist/bpf/vitals.o`.
//!
//! On Android user builds only bpfloader may load BPF programs (SELinux
//! neverallow); vitalsd then attaches what it pinned
//! (`daemon/src/bpf/pins.rs`, `PinMode::AttachFrom`).
//!
//! Checked against the real loader by `cargo xtask android-check` (1a):
//! AOSP's Loader.cpp, built for the host, loads this object into a fresh
//! bpffs and vitalsd counts from its pins. The format below was read from
//! AOSP source (files cited at each fact); the tests at the bottom check
//! the structure without a loader.
//!
//! Facts used (AOSP system/bpf, as mirrored by LineageOS/android_system_bpf):
//! - `include/bpf/bpf_map_def.h`: `struct bpf_map_def` is 120 bytes, align 4
//!   (type, key_size, value_size, max_entries, map_flags, zero, gid, mode,
//!   bpfloader_min_ver, bpfloader_max_ver, min_kver, max_kver,
//!   selinux_context[32], pin_subdir[32], shared, pad0[3], uid);
//!   `struct bpf_prog_def` is 92 bytes (uid, gid, min_kver, max_kver,
//!   optional, pad0[3], bpfloader_min_ver, bpfloader_max_ver,
//!   selinux_context[32], pin_subdir[32]); DEFAULT_BPFLOADER_MAX_VER 0x10000.
//! - `include/bpf/bpf_helpers.h`: KVER(a,b,c) = a<<24 | b<<16 | c,
//!   KVER_INF = 0xFFFFFFFF.
//! - `libbpf_android/Loader.cpp` (bpfloader v0.25) and `loader/Loader.cpp`:
//!   * program sections are recognised by prefix (`tracepoint/`,
//!     `perf_event/`, ...), the whole section is one program, and its pin is
//!     `/sys/fs/bpf/<subdir>prog_<obj>_<section, '/' -> '_'>`;
//!   * the relocations of a code section must be the *next* section, named
//!     `.rel<section>`; each relocation whose symbol's name is a symbol of
//!     the `maps` section gets that map's fd (ld_imm64 only); all others
//!     are silently ignored;
//!   * map names are the symbols of the `maps` section sorted by st_value,
//!     paired by index with the defs: so exactly one symbol per def, and no
//!     section symbol there; pins are `map_<obj>_<name>`;
//!   * a code section's prog def is the `progs` symbol named
//!     `<first STT_FUNC symbol of the section>_def`;
//!   * symbol names are read through the *section-header* string table
//!     (getSymName uses e_shstrndx), so symbols and sections must share one
//!     string table. `object`'s ELF writer always emits a separate .strtab,
//!     which is why this file lays the ELF out itself with `object`'s ELF
//!     types;
//!   * `license` is required; `critical` optional (we leave it out: a
//!     failure to load vitals must not fail boot); `bpfloader_min_ver`,
//!     `bpfloader_max_ver`, `size_of_bpf_map_def`, `size_of_bpf_prog_def`
//!     are sections whose first 4 bytes are read as LE u32;
//!   * a `.BTF` section makes v0.25 exec btfloader for the maps: we drop
//!     BTF (the maps need none).
//! - The newest platform loader (system/bpf `loader/Loader.cpp`, 2025) only
//!   reads /vendor/etc/bpf and only `skfilter/` sections; newer releases
//!   load /system/etc/bpf through mainline NetBpfLoad. Which loader a given
//!   device runs is a per-release question this object cannot answer.
//!
//! Load-time settings: aya sets the `.rodata` globals at load; bpfloader
//! cannot (it has no BPF_PSEUDO_MAP_VALUE), so every `.rodata` read in the
//! kept programs is folded here to its compiled-in default. The kept
//! programs are the `*_fixed` ones (no field offsets needed); FREE_PID_OFF
//! defaults to 0, "tell `pid`'s offset from the record" (it moved from 24
//! to 12 when `comm` became `__data_loc`).
//!
//! Map types and sizes come from the aya object as they are (TASKS and
//! PROCESS_FAULTS are plain BPF_MAP_TYPE_HASH since the 5.10 floor work):
//! bpfloader cannot resize, so the object's compiled-in max_entries (= the
//! daemon's MapLimits defaults) are what Android gets.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use object::{
    elf,
    read::elf::{ElfFile64, FileHeader as _},
    LittleEndian as LE, Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget,
    SectionIndex, SymbolKind, U16, U32, U64,
};

/// sizeof(struct bpf_map_def), include/bpf/bpf_map_def.h.
pub const MAP_DEF_SIZE: usize = 120;
/// sizeof(struct bpf_prog_def), include/bpf/bpf_map_def.h.
pub const PROG_DEF_SIZE: usize = 92;
/// include/bpf/bpf_map_def.h DEFAULT_BPFLOADER_MAX_VER (v1.0, exclusive).
pub const BPFLOADER_MAX_VER: u32 = 0x10000;
pub const BPFLOADER_MIN_VER: u32 = 0;
/// bpf_helpers.h KVER_INF.
pub const KVER_INF: u32 = 0xFFFF_FFFF;
/// android_filesystem_config.h AID_ROOT / AID_SYSTEM.
pub const AID_ROOT: u32 = 0;
pub const AID_SYSTEM: u32 = 1000;
/// Map pins: rw for root and group system (vitalsd runs as system and
/// writes CAPTURE, deletes EXITED entries).
pub const MAP_MODE: u32 = 0o660;

/// bpf_helpers.h KVER.
pub const fn kver(a: u32, b: u32, c: u32) -> u32 {
    (a << 24) + (b << 16) + c
}

/// linux/bpf.h.
pub const BPF_MAP_TYPE_RINGBUF: u32 = 27;
/// linux/bpf.h.
pub const BPF_MAP_TYPE_PERF_EVENT_ARRAY: u32 = 4;
/// A perf event array declared with max_entries 0 is sized by aya to the
/// possible CPUs at load; bpfloader passes max_entries through and the
/// kernel refuses 0 with EINVAL (array_map_alloc_check), which is what
/// AOSP's real loader hit. 256 slots (8 bytes each) cover the possible CPUs
/// of any Android device; bpf_perf_event_output(BPF_F_CURRENT_CPU) only
/// needs an index per CPU.
pub const PERF_EVENT_ARRAY_ENTRIES: u32 = 256;
/// Largest Android page size (16K arm64 kernels).
pub const RINGBUF_MIN_BYTES: u32 = 16384;

/// The object name bpfloader derives from `vitals.o`.
pub const OBJ_NAME: &str = "vitals";

/// `.rodata` settings whose compiled-in default does not suit bpfloader,
/// by symbol name, with the value folded in instead. None today: the one
/// there was (NR_CPUS, bounding sched_process_free's walk over per-CPU
/// slots, which overflowed bpfloader's 1 MiB verifier log at its default)
/// went with that walk when the exit path stopped needing per-CPU maps.
pub const BPFLOADER_SETTINGS: [(&str, u64); 0] = [];

pub struct ProgSpec {
    /// Function symbol in the aya object.
    pub func: &'static str,
    /// Section name in the Android object (the pin name derives from it).
    pub section: &'static str,
    pub min_kver: u32,
}

/// The always-on set and sched_waking. The `*_fixed` tracepoint programs
/// need no tracefs-derived offsets (bpfloader cannot set them); the
/// portable ones stay out. sched_waking_fixed only emits capture records:
/// vitalsd attaches it for a capture's length (user builds capture
/// through these pins too, #12). The perf_event fault
/// programs are in: page_fault_user exists only on x86, so on arm64 they
/// are the fault source. bpfloader only loads and pins them; vitalsd
/// attaches them with perf_event_open + PERF_EVENT_IOC_SET_BPF, exactly as
/// for its own pins (needs perf_event permission in vitalsd's sepolicy).
/// min_kver 5.8: the programs use the ring buffer map and
/// bpf_ktime_get_boot_ns; sched_process_free needs nothing newer (it used
/// bpf_map_lookup_percpu_elem, 5.19, while TASKS was a per-CPU hash).
pub const PROGRAMS: [ProgSpec; 8] = [
    ProgSpec {
        func: "sched_switch_fixed",
        section: "tracepoint/sched/sched_switch",
        min_kver: kver(5, 8, 0),
    },
    ProgSpec {
        func: "sched_wakeup_fixed",
        section: "tracepoint/sched/sched_wakeup",
        min_kver: kver(5, 8, 0),
    },
    ProgSpec {
        func: "sched_wakeup_new_fixed",
        section: "tracepoint/sched/sched_wakeup_new",
        min_kver: kver(5, 8, 0),
    },
    ProgSpec {
        func: "sched_process_free",
        section: "tracepoint/sched/sched_process_free",
        min_kver: kver(5, 8, 0),
    },
    ProgSpec {
        func: "page_fault_user",
        section: "tracepoint/exceptions/page_fault_user",
        min_kver: kver(5, 8, 0),
    },
    ProgSpec {
        func: "perf_minflt",
        section: "perf_event/minflt",
        min_kver: kver(5, 8, 0),
    },
    ProgSpec {
        func: "perf_majflt",
        section: "perf_event/majflt",
        min_kver: kver(5, 8, 0),
    },
    ProgSpec {
        func: "sched_waking_fixed",
        section: "tracepoint/sched/sched_waking",
        min_kver: kver(5, 8, 0),
    },
];

/// max_entries of the capture tier's maps in vitals.o. The aya object
/// declares them at their minimum and vitalsd sizes them at load when it
/// configures captures; bpfloader cannot resize, so vitals.o carries the
/// sizes a device's captures run with, reserved from boot (about 5 MiB of
/// kernel memory in all). Smaller than the daemon's default
/// (`CaptureSizing`, 8 MiB ring) for a phone: 4 MiB of ring buffer is
/// ~100 ms of the heaviest sched load measured (perf bench sched pipe,
/// ~40 MB/s of records), 20 of the drain's 5 ms polls; 1024 user stacks
/// of ~1 KiB; 4096 processes' fault-sampling counters.
pub const CAPTURE_MAP_ENTRIES: [(&str, u32); 3] = [
    ("CAPTURE_EVENTS", 4 << 20),
    ("CAPTURE_STACKS", 1024),
    ("CAPTURE_FAULT_CTR", 4096),
];

/// The pin bpfloader creates for a program section (Loader.cpp).
pub fn prog_pin_name(section: &str) -> String {
    format!("prog_{OBJ_NAME}_{}", section.replace('/', "_"))
}

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

struct Prog {
    spec: &'static ProgSpec,
    code: Vec<u8>,
    /// (offset in code, map index)
    relocs: Vec<(u64, usize)>,
}

const INSN: usize = 8;
const BPF_LD_IMM64: u8 = 0x18;
const BPF_CALL: u8 = 0x85;
const R_BPF_64_64: u32 = 1;

fn u32_at(d: &[u8], off: usize) -> Result<u32> {
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
fn rodata_setting(
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
            ensure!(dst == reg, "insn {j}: .rodata load into another register");
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
            code[p..p + INSN].copy_from_slice(&[op, reg, 0, 0, 0, 0, 0, 0]);
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

fn extract_prog(
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
    let rodata = obj.section_by_name(".rodata");
    let mut relocs = Vec::new();
    // (call insn offset, callee address, callee size, callee section)
    let mut calls = Vec::new();
    for (off, rel) in sec.relocations() {
        if off < start || off >= start + size {
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
            fold_rodata_load(&mut code, at, target.address(), value)
                .with_context(|| format!("{}: folding a .rodata setting", spec.func))?;
        } else {
            bail!(
                "{}: relocation to {:?} (only maps and .rodata are supported)",
                spec.func,
                target.name()
            );
        }
    }
    // bpfloader loads one section as one program, so the functions it calls
    // (compiler builtins such as memset, in .text) are appended to it and
    // the calls re-aimed: static linking of BPF subprograms. Callees must
    // be leaves without relocations.
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
    Ok(Prog { spec, code, relocs })
}

/// The Android bpf_map_def for one map.
pub fn map_def(m: &MapInfo) -> [u8; MAP_DEF_SIZE] {
    let mut d = [0u8; MAP_DEF_SIZE];
    let put = |d: &mut [u8; MAP_DEF_SIZE], off: usize, v: u32| {
        d[off..off + 4].copy_from_slice(&v.to_le_bytes())
    };
    put(&mut d, 0, m.map_type);
    put(&mut d, 4, m.key_size);
    put(&mut d, 8, m.value_size);
    // Ring buffers must be a page multiple; older bpfloaders (v0.25) pass
    // max_entries through unchanged, and arm64 devices may use 16K pages.
    let capture = CAPTURE_MAP_ENTRIES.iter().find(|(n, _)| *n == m.name);
    let max_entries = if let Some(&(_, entries)) = capture {
        entries
    } else if m.map_type == BPF_MAP_TYPE_RINGBUF {
        m.max_entries.max(RINGBUF_MIN_BYTES)
    } else if m.map_type == BPF_MAP_TYPE_PERF_EVENT_ARRAY && m.max_entries == 0 {
        PERF_EVENT_ARRAY_ENTRIES
    } else {
        m.max_entries
    };
    put(&mut d, 12, max_entries);
    put(&mut d, 16, m.map_flags);
    put(&mut d, 20, 0); // zero: must be AID_ROOT for old bpfloaders
    put(&mut d, 24, AID_SYSTEM); // gid
    put(&mut d, 28, MAP_MODE);
    put(&mut d, 32, BPFLOADER_MIN_VER);
    put(&mut d, 36, BPFLOADER_MAX_VER);
    put(&mut d, 40, kver(5, 8, 0)); // ring buffer map type
    put(&mut d, 44, KVER_INF);
    // selinux_context[32] @48, pin_subdir[32] @80: empty = defaults from
    // the .o location (/system/etc/bpf -> /sys/fs/bpf/, fs_bpf). A
    // `vitals/` subdir is not one of the loader's known domains
    // (lookupPinSubdir), so it would be rejected (-ENOTDIR).
    // shared @112 = false; uid @116 = AID_ROOT.
    put(&mut d, 116, AID_ROOT);
    d
}

pub fn prog_def(spec: &ProgSpec) -> [u8; PROG_DEF_SIZE] {
    let mut d = [0u8; PROG_DEF_SIZE];
    let put = |d: &mut [u8; PROG_DEF_SIZE], off: usize, v: u32| {
        d[off..off + 4].copy_from_slice(&v.to_le_bytes())
    };
    put(&mut d, 0, AID_ROOT); // uid
    put(&mut d, 4, AID_SYSTEM); // gid: pins are 0440, vitalsd opens them
    put(&mut d, 8, spec.min_kver);
    put(&mut d, 12, KVER_INF);
    // optional @16 = false; pad0 @17..20
    put(&mut d, 20, BPFLOADER_MIN_VER);
    put(&mut d, 24, BPFLOADER_MAX_VER);
    // selinux_context @28, pin_subdir @60: empty (defaults)
    d
}

/// A string table shared by section and symbol names (see module docs).
#[derive(Default)]
struct StrTab(Vec<u8>);

impl StrTab {
    fn add(&mut self, s: &str) -> u32 {
        if self.0.is_empty() {
            self.0.push(0);
        }
        let off = self.0.len() as u32;
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        off
    }
}

struct OutSection {
    name: u32,
    sh_type: u32,
    flags: u64,
    data: Vec<u8>,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
}

/// Builds the Android object from the aya object's bytes.
pub fn convert(input: &[u8]) -> Result<Vec<u8>> {
    let obj = ElfFile64::<LE>::parse(input).context("parsing the aya object")?;
    ensure!(
        obj.elf_header().e_machine(LE) == elf::EM_BPF,
        "not a BPF object"
    );
    let (maps_idx, maps) = read_maps(&obj)?;
    let progs = PROGRAMS
        .iter()
        .map(|spec| extract_prog(&obj, spec, maps_idx, &maps))
        .collect::<Result<Vec<_>>>()?;
    let license = obj
        .section_by_name("license")
        .context("no license section")?
        .data()?
        .to_vec();

    let mut strtab = StrTab::default();
    let mut secs: Vec<OutSection> = Vec::new();
    // [0] null, [1] .strtab (also the section-header string table),
    // [2] .symtab, then the rest.
    let strtab_name = strtab.add(".strtab");
    let symtab_name = strtab.add(".symtab");
    let progbits = |name: u32, flags: u64, data: Vec<u8>, align: u64| OutSection {
        name,
        sh_type: elf::SHT_PROGBITS,
        flags,
        data,
        link: 0,
        info: 0,
        align,
        entsize: 0,
    };
    // Symbols: (name, section index, value, size, type).
    let mut syms: Vec<(u32, u16, u64, u64, u8)> = Vec::new();
    const FIRST: usize = 3;
    let mut map_sym = Vec::new();
    for p in &progs {
        let code_idx = (FIRST + secs.len()) as u16;
        secs.push(progbits(
            strtab.add(p.spec.section),
            u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR),
            p.code.clone(),
            8,
        ));
        syms.push((
            strtab.add(p.spec.func),
            code_idx,
            0,
            p.code.len() as u64,
            elf::STT_FUNC,
        ));
        // Relocation section right after its code section (Loader.cpp).
        secs.push(OutSection {
            name: strtab.add(&format!(".rel{}", p.spec.section)),
            sh_type: elf::SHT_REL,
            flags: 0,
            data: Vec::new(), // filled once map symbol indices are known
            link: 2,
            info: u32::from(code_idx),
            align: 8,
            entsize: 16,
        });
    }
    let maps_sec = (FIRST + secs.len()) as u16;
    let mut maps_data = Vec::new();
    for (i, (_, m)) in maps.iter().enumerate() {
        maps_data.extend_from_slice(&map_def(m));
        map_sym.push(syms.len() + 1); // +1: the null symbol
        syms.push((
            strtab.add(&m.name),
            maps_sec,
            (i * MAP_DEF_SIZE) as u64,
            MAP_DEF_SIZE as u64,
            elf::STT_OBJECT,
        ));
    }
    secs.push(progbits(
        strtab.add("maps"),
        u64::from(elf::SHF_ALLOC | elf::SHF_WRITE),
        maps_data,
        4,
    ));
    let progs_sec = (FIRST + secs.len()) as u16;
    let mut progs_data = Vec::new();
    for (i, p) in progs.iter().enumerate() {
        progs_data.extend_from_slice(&prog_def(p.spec));
        syms.push((
            strtab.add(&format!("{}_def", p.spec.func)),
            progs_sec,
            (i * PROG_DEF_SIZE) as u64,
            PROG_DEF_SIZE as u64,
            elf::STT_OBJECT,
        ));
    }
    secs.push(progbits(
        strtab.add("progs"),
        u64::from(elf::SHF_ALLOC),
        progs_data,
        4,
    ));
    secs.push(progbits(
        strtab.add("license"),
        u64::from(elf::SHF_ALLOC),
        license,
        1,
    ));
    for (name, v) in [
        ("bpfloader_min_ver", BPFLOADER_MIN_VER),
        ("bpfloader_max_ver", BPFLOADER_MAX_VER),
        ("size_of_bpf_map_def", MAP_DEF_SIZE as u32),
        ("size_of_bpf_prog_def", PROG_DEF_SIZE as u32),
    ] {
        secs.push(progbits(
            strtab.add(name),
            u64::from(elf::SHF_ALLOC),
            v.to_le_bytes().to_vec(),
            4,
        ));
    }
    // Relocation contents.
    for (k, p) in progs.iter().enumerate() {
        let mut d = Vec::new();
        for &(off, m) in &p.relocs {
            let r = elf::Rel64::<LE> {
                r_offset: U64::new(LE, off),
                r_info: U64::new(LE, ((map_sym[m] as u64) << 32) | u64::from(R_BPF_64_64)),
            };
            d.extend_from_slice(object::bytes_of(&r));
        }
        secs[2 * k + 1].data = d;
    }
    // Symbol table: null + globals (no locals, so sh_info = 1).
    let mut symtab = vec![0u8; 24];
    for &(name, shndx, value, size, ty) in &syms {
        let s = elf::Sym64::<LE> {
            st_name: U32::new(LE, name),
            st_info: (elf::STB_GLOBAL << 4) | ty,
            st_other: elf::STV_DEFAULT,
            st_shndx: U16::new(LE, shndx),
            st_value: U64::new(LE, value),
            st_size: U64::new(LE, size),
        };
        symtab.extend_from_slice(object::bytes_of(&s));
    }
    let mut all = vec![
        OutSection {
            name: strtab_name,
            sh_type: elf::SHT_STRTAB,
            flags: 0,
            data: strtab.0.clone(),
            link: 0,
            info: 0,
            align: 1,
            entsize: 0,
        },
        OutSection {
            name: symtab_name,
            sh_type: elf::SHT_SYMTAB,
            flags: 0,
            data: symtab,
            link: 1,
            info: 1,
            align: 8,
            entsize: 24,
        },
    ];
    all.extend(secs);
    Ok(write_elf(&all))
}

fn write_elf(secs: &[OutSection]) -> Vec<u8> {
    let align = |v: &mut Vec<u8>, a: usize| {
        while !v.len().is_multiple_of(a) {
            v.push(0)
        }
    };
    let mut out = vec![0u8; 64];
    let mut offsets = Vec::new();
    for s in secs {
        align(&mut out, s.align.max(1) as usize);
        offsets.push(out.len() as u64);
        out.extend_from_slice(&s.data);
    }
    align(&mut out, 8);
    let shoff = out.len() as u64;
    out.extend_from_slice(&[0u8; 64]); // null section header
    for (s, off) in secs.iter().zip(&offsets) {
        let h = elf::SectionHeader64::<LE> {
            sh_name: U32::new(LE, s.name),
            sh_type: U32::new(LE, s.sh_type),
            sh_flags: U64::new(LE, s.flags),
            sh_addr: U64::new(LE, 0),
            sh_offset: U64::new(LE, *off),
            sh_size: U64::new(LE, s.data.len() as u64),
            sh_link: U32::new(LE, s.link),
            sh_info: U32::new(LE, s.info),
            sh_addralign: U64::new(LE, s.align),
            sh_entsize: U64::new(LE, s.entsize),
        };
        out.extend_from_slice(object::bytes_of(&h));
    }
    let hdr = elf::FileHeader64::<LE> {
        e_ident: elf::Ident {
            magic: elf::ELFMAG,
            class: elf::ELFCLASS64,
            data: elf::ELFDATA2LSB,
            version: elf::EV_CURRENT,
            os_abi: elf::ELFOSABI_NONE,
            abi_version: 0,
            padding: [0; 7],
        },
        e_type: U16::new(LE, elf::ET_REL),
        e_machine: U16::new(LE, elf::EM_BPF),
        e_version: U32::new(LE, u32::from(elf::EV_CURRENT)),
        e_entry: U64::new(LE, 0),
        e_phoff: U64::new(LE, 0),
        e_shoff: U64::new(LE, shoff),
        e_flags: U32::new(LE, 0),
        e_ehsize: U16::new(LE, 64),
        e_phentsize: U16::new(LE, 0),
        e_phnum: U16::new(LE, 0),
        e_shentsize: U16::new(LE, 64),
        e_shnum: U16::new(LE, (secs.len() + 1) as u16),
        e_shstrndx: U16::new(LE, 1),
    };
    out[..64].copy_from_slice(object::bytes_of(&hdr));
    out
}

/// The aya-built object: `VITALS_EBPF_OBJ` when set (daemon/build.rs then
/// embeds that file too, so the daemon and vitals.o come from one object),
/// else what build.rs built.
pub fn aya_object(root: &Path) -> std::path::PathBuf {
    match std::env::var_os("VITALS_EBPF_OBJ") {
        Some(p) => p.into(),
        None => root.join("target/bpf/bpfel-unknown-none/release/vitals-ebpf"),
    }
}

/// `cargo xtask android-bpf`: build (through daemon/build.rs), convert,
/// write target/dist/bpf/vitals.o; returns its path.
pub fn run(root: &Path) -> Result<std::path::PathBuf> {
    crate::util::run(crate::util::cargo().args(["build", "-p", "vitalsd"]))?;
    write(root)
}

/// Converts the already-built aya object into target/dist/bpf/vitals.o.
pub fn write(root: &Path) -> Result<std::path::PathBuf> {
    let src = aya_object(root);
    let input = std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
    let out = convert(&input)?;
    let dest = root.join("target/dist/bpf/vitals.o");
    std::fs::create_dir_all(dest.parent().unwrap())?;
    std::fs::write(&dest, out)?;
    println!(
        "{} (bpfloader format; `cargo xtask android-check` loads it with AOSP's loader)",
        dest.display()
    );
    for p in &PROGRAMS {
        println!(
            "  {} -> /sys/fs/bpf/{}",
            p.section,
            prog_pin_name(p.section)
        );
    }
    Ok(dest)
}

/// Structural checks of the produced object against the AOSP layout,
/// without a loader: they parse the object the way Loader.cpp does and
/// check what it would find (android-check runs the real one).
#[cfg(test)]
mod tests {
    use super::*;

    fn aya_obj() -> Option<Vec<u8>> {
        let p = aya_object(&crate::util::workspace_root());
        match std::fs::read(&p) {
            Ok(d) => Some(d),
            Err(_) => {
                eprintln!(
                    "{} not built (cargo build -p vitalsd): skipped",
                    p.display()
                );
                None
            }
        }
    }

    #[test]
    fn layout_constants_match_aosp() {
        // bpf_map_def.h _Static_asserts.
        assert_eq!(MAP_DEF_SIZE, 120);
        assert_eq!(PROG_DEF_SIZE, 92);
        assert_eq!(kver(5, 19, 0), 0x0513_0000);
        // sched_process_free: no helper past the 5.10 floor any more.
        let d = prog_def(&PROGRAMS[3]);
        assert_eq!(PROGRAMS[3].func, "sched_process_free");
        assert_eq!(
            u32::from_le_bytes(d[8..12].try_into().unwrap()),
            kver(5, 8, 0)
        );
        assert_eq!(u32::from_le_bytes(d[24..28].try_into().unwrap()), 0x10000);
        assert_eq!(
            prog_pin_name(PROGRAMS[0].section),
            "prog_vitals_tracepoint_sched_sched_switch"
        );
    }

    #[test]
    fn every_setting_keeps_its_compiled_in_default_for_bpfloader() {
        let Some(input) = aya_obj() else { return };
        let aya = ElfFile64::<LE>::parse(&*input).unwrap();
        let rodata = aya.section_by_name(".rodata").unwrap().index();
        for name in ["FREE_PID_OFF", "TRACK_WAIT", "WAKE_ARRAY"] {
            let s = aya
                .symbols()
                .find(|s| s.name() == Ok(name))
                .unwrap_or_else(|| panic!("{name} not in the aya object"));
            let (a, n) = (s.address() as usize, s.size() as usize);
            assert_eq!(rodata_setting(&aya, rodata, a, n), None, "{name}");
        }
    }

    #[test]
    fn converted_object_has_bpfloader_structure() {
        let Some(input) = aya_obj() else { return };
        let aya = ElfFile64::<LE>::parse(&*input).unwrap();
        let (_, aya_maps) = read_maps(&aya).unwrap();
        let out = convert(&input).unwrap();
        let obj = ElfFile64::<LE>::parse(&*out).unwrap();
        let hdr = obj.elf_header();
        let shstrndx = hdr.e_shstrndx(LE) as usize;

        // Symbol names go through the section-header string table (Loader.cpp
        // getSymName): the symtab's string table must be that same section.
        let symtab = obj.section_by_name(".symtab").unwrap();
        let sections = hdr.sections(LE, &*out).unwrap();
        let symtab_hdr = sections.section(symtab.index()).unwrap();
        assert_eq!(symtab_hdr.sh_link.get(LE) as usize, shstrndx);

        // maps: N x 120 bytes, one symbol per def in st_value order, no
        // section symbol, and each def is our map.
        let maps = obj.section_by_name("maps").unwrap();
        let data = maps.data().unwrap();
        assert_eq!(data.len(), aya_maps.len() * MAP_DEF_SIZE);
        let mut map_syms: Vec<_> = obj
            .symbols()
            .filter(|s| s.section_index() == Some(maps.index()))
            .map(|s| (s.address(), s.name().unwrap().to_owned()))
            .collect();
        map_syms.sort();
        assert_eq!(map_syms.len(), aya_maps.len());
        for (i, ((addr, name), (_, m))) in map_syms.iter().zip(&aya_maps).enumerate() {
            assert_eq!(*addr as usize, i * MAP_DEF_SIZE);
            assert_eq!(name, &m.name);
            let f = |k: usize| u32_at(data, i * MAP_DEF_SIZE + k).unwrap();
            assert_eq!(f(0), m.map_type, "{name} type");
            assert_eq!(f(4), m.key_size, "{name} key_size");
            assert_eq!(f(8), m.value_size, "{name} value_size");
            if let Some((_, n)) = CAPTURE_MAP_ENTRIES.iter().find(|(c, _)| c == name) {
                assert_eq!(f(12), *n, "{name} max_entries");
            } else if m.map_type == BPF_MAP_TYPE_RINGBUF {
            } else if m.map_type == BPF_MAP_TYPE_PERF_EVENT_ARRAY && m.max_entries == 0 {
                // The kernel refuses 0 (AOSP's loader hit EINVAL there).
                assert_eq!(f(12), PERF_EVENT_ARRAY_ENTRIES, "{name} max_entries");
            } else {
                assert_eq!(f(12), m.max_entries, "{name} max_entries");
            }
            assert_eq!(f(20), 0, "{name}: `zero` must be 0 or bpfloader aborts");
            assert_eq!(f(36), BPFLOADER_MAX_VER);
            assert_eq!(f(44), KVER_INF);
        }
        // Every capture map sized above is one of the object's; the ring
        // buffer a page multiple on any Android page size.
        for (c, _) in CAPTURE_MAP_ENTRIES {
            assert!(aya_maps.iter().any(|(_, m)| m.name == c), "{c} not a map");
        }
        assert_eq!(CAPTURE_MAP_ENTRIES[0].1 % RINGBUF_MIN_BYTES, 0);
        // Spot-check against the source: TASKS and PROCESS_FAULTS are plain
        // hashes of u32 keys (no per-CPU map needs summing at free).
        for name in ["TASKS", "PROCESS_FAULTS"] {
            let m = aya_maps.iter().find(|(_, m)| m.name == name).unwrap();
            assert_eq!(m.1.map_type, 1, "{name}"); // BPF_MAP_TYPE_HASH
            assert_eq!(m.1.key_size, 4, "{name}");
        }

        // progs: one def per program, named <func>_def.
        let progs = obj.section_by_name("progs").unwrap();
        assert_eq!(progs.data().unwrap().len(), PROGRAMS.len() * PROG_DEF_SIZE);
        let prog_syms: Vec<String> = obj
            .symbols()
            .filter(|s| s.section_index() == Some(progs.index()))
            .map(|s| s.name().unwrap().to_owned())
            .collect();

        for spec in &PROGRAMS {
            let sec = obj.section_by_name(spec.section).unwrap();
            // First STT_FUNC of the section is the program; its def exists.
            let funcs: Vec<_> = obj
                .symbols()
                .filter(|s| s.section_index() == Some(sec.index()) && s.kind() == SymbolKind::Text)
                .collect();
            assert_eq!(funcs.len(), 1, "{}", spec.section);
            assert_eq!(funcs[0].name().unwrap(), spec.func);
            assert!(prog_syms.contains(&format!("{}_def", spec.func)));
            // The relocation section is the next one, named .rel<section>.
            let next = obj
                .section_by_index(SectionIndex(sec.index().0 + 1))
                .unwrap();
            assert_eq!(next.name().unwrap(), format!(".rel{}", spec.section));
            let code = sec.data().unwrap();
            // Every relocation: an ld_imm64 naming a map symbol at the
            // same place the aya object's relocation named the same map.
            let aya_sym = aya
                .symbols()
                .find(|s| s.name() == Ok(spec.func) && s.kind() == SymbolKind::Text)
                .unwrap();
            let aya_sec = aya
                .section_by_index(aya_sym.section_index().unwrap())
                .unwrap();
            let expected: Vec<(u64, String)> = aya_sec
                .relocations()
                .filter(|(o, _)| *o >= aya_sym.address() && *o < aya_sym.address() + aya_sym.size())
                .filter_map(|(o, r)| {
                    let RelocationTarget::Symbol(i) = r.target() else {
                        return None;
                    };
                    let t = aya.symbol_by_index(i).unwrap();
                    let in_maps =
                        aya.section_by_index(t.section_index()?).ok()?.name().ok()? == "maps";
                    in_maps.then(|| (o - aya_sym.address(), t.name().unwrap().to_owned()))
                })
                .collect();
            let mut got = Vec::new();
            for (off, r) in sec.relocations() {
                let RelocationTarget::Symbol(i) = r.target() else {
                    panic!()
                };
                let t = obj.symbol_by_index(i).unwrap();
                assert_eq!(t.section_index(), Some(maps.index()), "{}", spec.section);
                assert_eq!(code[off as usize], BPF_LD_IMM64);
                got.push((off, t.name().unwrap().to_owned()));
            }
            assert!(!got.is_empty(), "{}: no map relocations", spec.section);
            assert_eq!(got, expected, "{}", spec.section);
            // Nothing left pointing at .rodata (bpfloader would load address
            // 0): the ld_imm64s without a relocation must be exactly the
            // aya object's plain 64-bit constants (e.g. BPF_F_CURRENT_CPU),
            // same immediates; a .rodata pointer there had a relocation.
            let relocated: Vec<u64> = got.iter().map(|(o, _)| *o).collect();
            let aya_code = &aya_sec.data().unwrap()
                [aya_sym.address() as usize..(aya_sym.address() + aya_sym.size()) as usize];
            let aya_relocated: Vec<u64> = aya_sec
                .relocations()
                .map(|(o, _)| o.wrapping_sub(aya_sym.address()))
                .collect();
            let plain_constants = |code: &[u8], relocated: &[u64]| {
                let mut imms = Vec::new();
                let mut k = 0;
                while k + 2 * INSN <= code.len() {
                    if code[k] == BPF_LD_IMM64 {
                        if !relocated.contains(&(k as u64)) {
                            let lo = u32::from_le_bytes(code[k + 4..k + 8].try_into().unwrap());
                            let hi = u32::from_le_bytes(code[k + 12..k + 16].try_into().unwrap());
                            imms.push(u64::from(hi) << 32 | u64::from(lo));
                        }
                        k += 2 * INSN;
                    } else {
                        k += INSN;
                    }
                }
                imms.sort_unstable();
                imms
            };
            assert_eq!(
                plain_constants(code, &relocated),
                plain_constants(aya_code, &aya_relocated),
                "{}: unrelocated ld_imm64s differ from the aya object's constants",
                spec.section
            );
        }
        // Only our program sections are code sections bpfloader would see.
        let code_secs = obj
            .sections()
            .filter(|s| {
                let n = s.name().unwrap();
                n.starts_with("tracepoint/") || n.starts_with("perf_event/")
            })
            .count();
        assert_eq!(code_secs, PROGRAMS.len());

        assert_eq!(
            obj.section_by_name("license").unwrap().data().unwrap(),
            b"GPL\0"
        );
        for (name, v) in [
            ("bpfloader_min_ver", BPFLOADER_MIN_VER),
            ("bpfloader_max_ver", BPFLOADER_MAX_VER),
            ("size_of_bpf_map_def", 120),
            ("size_of_bpf_prog_def", 92),
        ] {
            let d = obj.section_by_name(name).unwrap().data().unwrap();
            assert_eq!(u32_at(d, 0).unwrap(), v, "{name}");
        }
        assert!(obj.section_by_name(".BTF").is_none());
    }
}
