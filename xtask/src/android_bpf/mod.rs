//! `cargo xtask android-bpf`: rewrites the aya-built eBPF object into the
//! ELF format Android's bpfloader reads from /system/etc/bpf, as
//! `target/dist/bpf/vitals.o`.
//!
//! On Android user builds only bpfloader may load BPF programs (SELinux
//! neverallow); vitalsd then attaches what it pinned
//! (`daemon/src/bpf/programs/pins.rs`, `PinMode::AttachFrom`).
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
//! Map types come from the aya object as they are (TASKS and
//! PROCESS_FAULTS are plain BPF_MAP_TYPE_HASH since the 5.10 floor work).
//! bpfloader cannot resize, so the sizes are fixed here: the always-on
//! maps for a phone's pid_max (`PHONE_MAP_ENTRIES`), the capture tier's
//! for its captures (`CAPTURE_MAP_ENTRIES`), the rest as the object
//! declares them.

//!
//! The rooms: `extract.rs` reads the aya object (maps, one program per
//! kept function, .rodata folded, callees linked in); `defs.rs` writes
//! the bpf_map_def / bpf_prog_def records; `layout.rs` lays out the ELF
//! the loader parses.

mod defs;
mod extract;
mod layout;
#[cfg(test)]
mod tests;

use std::path::Path;

use anyhow::{Context, Result};

pub use extract::read_maps;
pub use layout::convert;

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

/// `.rodata` settings folded in by symbol name instead of their
/// compiled-in default: the choices vitalsd's own load makes for a kernel
/// with ring buffers (vitals.o needs 5.8) whose pid_max is
/// [`PHONE_PID_MAX`] (`daemon/src/bpf/programs/settings.rs`, `sized`):
/// - PER_CAPTURE_MAPS 0: bpfloader creates no map-in-map, so the capture
///   maps are the plain ones, and the code that looks them up in the
///   `SLOT_*` outers (`ebpf-programs/src/capture_maps.rs`) is dead, its
///   relocations to `.maps` left unresolved (`extract` relies on it);
/// - EXIT_RING 1: freed tasks' records go to EXITED_RING (EXITED keeps
///   one entry);
/// - WAKE_ARRAY 1: the classic wakeup programs keep a task's runnable-since
///   time in WAKE_TS_ARRAY, indexed by tid (8 bytes a possible tid), not
///   in the WAKE_TS hash (80 bytes an entry);
/// - COUNT_PROCESS_FAULTS 0: TASKS_BY_TID covers every tid below pid_max,
///   so a process's faults are its threads' and the per-process counters
///   (FAULTS_BY_TGID, PROCESS_FAULTS) keep one entry.
pub const BPFLOADER_SETTINGS: [(&str, u64); 4] = [
    ("PER_CAPTURE_MAPS", 0),
    ("EXIT_RING", 1),
    ("WAKE_ARRAY", 1),
    ("COUNT_PROCESS_FAULTS", 0),
];

/// The pid_max vitals.o is sized for: the kernel's default
/// (PID_MAX_DEFAULT, 0x8000; the kernel raises it only past 32 possible
/// CPUs), which Android keeps. bpfloader cannot size a map at load, so on
/// a device with a larger pid_max the tids past it fall back to the
/// 16-entry TASKS hash and, once that is full, are counted in
/// `drops.bpf.tasks_map_full`; vitalsd logs the mismatch when it attaches
/// (`pins.rs`). An OEM whose kernel raises pid_max changes this.
pub const PHONE_PID_MAX: u32 = 32768;

/// max_entries of the always-on maps in vitals.o, for [`PHONE_PID_MAX`]
/// and [`BPFLOADER_SETTINGS`]: what vitalsd's own load gives them there
/// (`LoadSettings::map_sizes`), but PROCESS_FAULTS, which it keeps at 16
/// and COUNT_PROCESS_FAULTS 0 leaves unwritten. The object declares the
/// sizes for an unknown pid_max, 15 MiB of kernel memory in all on a
/// phone; android-check 1a holds the always-on total to 4 MiB.
pub const PHONE_MAP_ENTRIES: [(&str, u32); 7] = [
    ("TASKS_BY_TID", PHONE_PID_MAX),
    ("WAKE_TS_ARRAY", PHONE_PID_MAX),
    // Tids past TASKS_BY_TID: none below PHONE_PID_MAX.
    ("TASKS", 16),
    ("WAKE_TS", 1),
    ("FAULTS_BY_TGID", 1),
    ("PROCESS_FAULTS", 1),
    ("EXITED", 1),
];

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
/// sizes a device's captures run with, reserved from boot (3.8 MiB of
/// kernel memory in all): the ring buffer at what vitalsd's own load gives
/// an 8-CPU phone (256 KiB a possible CPU, `capture.buffer_bytes`), ~50 ms
/// of the heaviest sched load measured (perf bench sched pipe, ~40 MB/s of
/// records), 10 of the drain's 5 ms polls; 1024 user stacks of ~1 KiB;
/// 4096 processes' fault-sampling counters; 4096 blocked threads waiting
/// for their waking in an off-CPU capture (~64 B each).
pub const CAPTURE_MAP_ENTRIES: [(&str, u32); 4] = [
    ("CAPTURE_EVENTS", 2 << 20),
    ("CAPTURE_STACKS", 1024),
    ("CAPTURE_FAULT_CTR", 4096),
    ("OFFCPU_START", 4096),
];

/// The pin bpfloader creates for a program section (Loader.cpp).
pub fn prog_pin_name(section: &str) -> String {
    format!("prog_{OBJ_NAME}_{}", section.replace('/', "_"))
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
