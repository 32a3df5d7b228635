//! The kernel memory the BPF maps take, computed rather than measured: for
//! a machine other than this one (a phone's 8 CPUs), and as the bound a
//! loaded daemon's fdinfo `memlock` is checked against. Every map is
//! preallocated, so its memory is fixed by its definition in the object
//! (type, key and value size, flags) and the max_entries the loader gives
//! it (`LoadSettings::map_sizes`).
//!
//! The formulas are the kernel's `map_mem_usage` callbacks (Linux 6.4+,
//! what fdinfo `memlock` reports there): `array_map_mem_usage`,
//! `htab_map_mem_usage`, `ringbuf_map_mem_usage`, `stack_map_mem_usage`.
//! The fixed parts are the sizes of kernel structs on Linux 6.18 x86_64
//! (`struct bpf_array`, `bpf_htab`, `htab_elem`, ...), which other
//! versions and configs move by a few hundred bytes a map; the
//! per-entry parts, which are the megabytes, are exact.

use object::{Object, ObjectSection, ObjectSymbol};
use vitals_common::mapped::BPF_F_MMAPABLE;

use vitals_common::names;

use super::{
    super::{
        config::MachineBounds,
        object::{EventTransport, EBPF_OBJECT},
        AccountingConfig, BpfError,
    },
    settings::{LoadSettings, SizingKernel},
};

/// One map as the object defines it (aya-ebpf's `bpf_map_def` in the
/// `maps` section: type, key size, value size, max entries, flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapDef {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

/// A map and the kernel memory it takes, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapMemory {
    pub def: MapDef,
    pub bytes: u64,
}

const HASH: u32 = 1;
const ARRAY: u32 = 2;
const PERF_EVENT_ARRAY: u32 = 4;
const PERCPU_ARRAY: u32 = 6;
const STACK_TRACE: u32 = 7;
const LRU_HASH: u32 = 9;
const ARRAY_OF_MAPS: u32 = 12;
const RINGBUF: u32 = 27;

/// Every map of `obj`: the `maps` section's definitions and the `.rodata`
/// map aya makes of that section (one entry the section's size).
pub fn map_defs(obj: &[u8]) -> Result<Vec<MapDef>, BpfError> {
    let bad = || BpfError::Missing("the object's maps section");
    let file = object::File::parse(obj).map_err(|_| bad())?;
    let maps = file.section_by_name("maps").ok_or_else(bad)?;
    let data = maps.data().map_err(|_| bad())?;
    let word = |at: usize| -> Result<u32, BpfError> {
        let b = data.get(at..at + 4).ok_or_else(bad)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let mut out = Vec::new();
    for sym in file.symbols() {
        if sym.section_index() != Some(maps.index()) || sym.size() == 0 {
            continue;
        }
        let at = (sym.address() - maps.address()) as usize;
        out.push(MapDef {
            name: sym.name().map_err(|_| bad())?.to_owned(),
            map_type: word(at)?,
            key_size: word(at + 4)?,
            value_size: word(at + 8)?,
            max_entries: word(at + 12)?,
            flags: word(at + 16)?,
        });
    }
    // The `.maps` section's BTF-defined maps are the one-slot outers of
    // the per-capture maps (`capture_slots`): an array of 4-byte map ids.
    if let Some(outers) = file.section_by_name(".maps") {
        for sym in file.symbols() {
            if sym.section_index() != Some(outers.index()) || sym.size() == 0 {
                continue;
            }
            out.push(MapDef {
                name: sym.name().map_err(|_| bad())?.to_owned(),
                map_type: ARRAY_OF_MAPS,
                key_size: 4,
                value_size: 4,
                max_entries: 1,
                flags: 0,
            });
        }
    }
    if let Some(rodata) = file.section_by_name(".rodata") {
        out.push(MapDef {
            name: ".rodata".into(),
            map_type: ARRAY,
            key_size: 4,
            value_size: rodata.size() as u32,
            max_entries: 1,
            flags: 0,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Kernel struct sizes on Linux 6.18 x86_64 (see the module).
const BPF_ARRAY: u64 = 312;
const BPF_HTAB: u64 = 896;
/// `struct htab_elem` before its key.
const HTAB_ELEM: u64 = 48;
/// `struct bucket`: a list head and a raw spinlock.
const HTAB_BUCKET: u64 = 16;
/// HASHTAB_MAP_LOCK_COUNT ints per possible CPU.
const HTAB_LOCKS_PER_CPU: u64 = 8 * 4;
const BPF_RINGBUF_MAP: u64 = 304;
/// RINGBUF_NR_META_PAGES: the consumer page and two producer pages.
const RINGBUF_META_PAGES: u64 = 3;
const BPF_STACK_MAP: u64 = 320;
/// `struct stack_map_bucket` before its frames.
const STACK_BUCKET: u64 = 16;

/// The kernel memory of `def` created with `entries` max_entries on
/// `cpus` possible CPUs and `page`-byte pages.
pub fn map_bytes(def: &MapDef, entries: u32, cpus: u32, page: u32) -> u64 {
    let (n, cpus, page) = (u64::from(entries), u64::from(cpus), u64::from(page));
    let align8 = |v: u32| u64::from(v).next_multiple_of(8);
    let page_align = |v: u64| v.next_multiple_of(page);
    let ptr = 8;
    match def.map_type {
        ARRAY if def.flags & BPF_F_MMAPABLE != 0 => {
            page_align(BPF_ARRAY) + page_align(n * align8(def.value_size))
        }
        ARRAY => BPF_ARRAY + n * align8(def.value_size),
        PERCPU_ARRAY => BPF_ARRAY + n * ptr + n * align8(def.value_size) * cpus,
        // fd arrays hold a pointer an entry (`fd_array_map_alloc`).
        PERF_EVENT_ARRAY | ARRAY_OF_MAPS => BPF_ARRAY + n * ptr,
        HASH | LRU_HASH => {
            let elem = HTAB_ELEM + align8(def.key_size) + align8(def.value_size);
            let base = BPF_HTAB + n.next_power_of_two() * HTAB_BUCKET + HTAB_LOCKS_PER_CPU * cpus;
            if def.map_type == LRU_HASH {
                base + elem * n
            } else {
                // A preallocated hash has one spare element per CPU
                // (`extra_elems`) for updates of an existing key.
                base + elem * (n + cpus) + ptr * cpus
            }
        }
        STACK_TRACE => {
            BPF_STACK_MAP
                + n.next_power_of_two() * ptr
                + n * (STACK_BUCKET + u64::from(def.value_size))
        }
        RINGBUF => {
            let data_pages = n / page;
            BPF_RINGBUF_MAP
                + (RINGBUF_META_PAGES + data_pages) * page
                // The data pages are mapped twice (the wrap-around view).
                + (RINGBUF_META_PAGES + 2 * data_pages) * ptr
        }
        // No map of another type is in the object; a key and a value an
        // entry is the kernel's own rough figure for them.
        _ => n * (align8(def.key_size) + align8(def.value_size)),
    }
}

/// Every map of the embedded object with the kernel memory it takes when
/// the programs load with `cfg` on `machine`: a tp_btf kernel with
/// run_delay and ring buffers (`run_delay`: false for the classic
/// programs, whose wakeup programs keep a wakeup time per tid).
pub fn kernel_memory(
    cfg: &AccountingConfig,
    machine: MachineBounds,
    run_delay: bool,
    page: u32,
) -> Result<Vec<MapMemory>, BpfError> {
    let settings = sized_for(cfg, machine, run_delay, page)?;
    let sizes = settings.map_sizes(cfg);
    Ok(map_defs(EBPF_OBJECT)?
        .into_iter()
        .map(|def| {
            let entries = sizes
                .iter()
                .find(|(name, _)| *name == def.name)
                .map_or(def.max_entries, |&(_, e)| e);
            // aya sizes these two by the possible CPUs, whatever the
            // object says (the perf array: one buffer a CPU).
            let entries = match def.name.as_str() {
                "CAPTURE_PERF" => machine.possible_cpus,
                _ => entries,
            };
            MapMemory {
                bytes: map_bytes(&def, entries, machine.possible_cpus, page),
                def,
            }
        })
        .collect())
}

/// The maps a capture makes for itself on a load with `cfg` (the
/// daemon's own: `capture_slots`), each with the kernel memory it takes
/// while the capture runs; empty where the capture maps are the plain
/// ones, sized at load (`kernel_memory` has them).
pub fn capture_memory(
    cfg: &AccountingConfig,
    machine: MachineBounds,
    run_delay: bool,
    page: u32,
) -> Result<Vec<MapMemory>, BpfError> {
    let settings = sized_for(cfg, machine, run_delay, page)?;
    let Some(sizes) = settings.capture_sizes(cfg) else {
        return Ok(Vec::new());
    };
    let defs = map_defs(EBPF_OBJECT)?;
    let ring = settings.transport == EventTransport::RingBuf;
    Ok(sizes
        .into_iter()
        .filter(|&(name, _)| ring || name != names::CAPTURE_EVENTS)
        .filter_map(|(name, entries)| {
            let def = defs.iter().find(|d| d.name == name)?.clone();
            Some(MapMemory {
                bytes: map_bytes(&def, entries, machine.possible_cpus, page),
                def: MapDef {
                    max_entries: entries,
                    ..def
                },
            })
        })
        .collect())
}

/// The settings a load with `cfg` makes on `machine`: a kernel with ring
/// buffers, tp_btf programs reading run_delay or not (`run_delay`).
fn sized_for(
    cfg: &AccountingConfig,
    machine: MachineBounds,
    run_delay: bool,
    page: u32,
) -> Result<LoadSettings, BpfError> {
    let kernel = SizingKernel {
        run_delay,
        ringbuf_ok: true,
        page,
    };
    LoadSettings::sized(cfg, machine, kernel, false)
}

/// The sum of `maps`' bytes.
pub fn total_bytes(maps: &[MapMemory]) -> u64 {
    maps.iter().map(|m| m.bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(map_type: u32, key_size: u32, value_size: u32, flags: u32) -> MapDef {
        MapDef {
            name: String::new(),
            map_type,
            key_size,
            value_size,
            max_entries: 0,
            flags,
        }
    }

    /// Each kind of map against the `memlock` Linux 6.18 reported in
    /// fdinfo for it, on a 2-CPU x86_64 VM with 4 KiB pages.
    #[test]
    fn each_kind_matches_what_the_kernel_reported() {
        let m = BPF_F_MMAPABLE;
        for (d, entries, memlock) in [
            (def(ARRAY, 4, 128, m), 32768, 4_198_400),
            (def(ARRAY, 4, 24, m), 1, 8192),
            (def(ARRAY, 4, 24, m), 8192, 200_704),
            (def(ARRAY, 4, 112, 0), 1, 424),
            (def(PERCPU_ARRAY, 4, 168, 0), 1, 656),
            (def(PERCPU_ARRAY, 4, 8, 0), 4, 408),
            (def(PERF_EVENT_ARRAY, 4, 4, 0), 2, 328),
            (def(HASH, 4, 128, 0), 16, 4544),
            (def(HASH, 4, 24, 0), 16, 2672),
            (def(HASH, 16, 168, 0), 1, 1688),
            (def(LRU_HASH, 4, 40, 0), 4096, 459_712),
            (def(LRU_HASH, 4, 4, 0), 4096, 328_640),
            (def(STACK_TRACE, 4, 1016, 0), 1024, 1_065_280),
            (def(RINGBUF, 0, 0, 0), 512 << 10, 538_952),
            (def(RINGBUF, 0, 0, 0), 1 << 20, 1_065_288),
        ] {
            assert_eq!(
                map_bytes(&d, entries, 2, 4096),
                memlock,
                "{d:?} x {entries}"
            );
        }
    }
}
