//! The records bpfloader reads from the `maps` and `progs` sections:
//! Android's `struct bpf_map_def` and `struct bpf_prog_def`
//! (include/bpf/bpf_map_def.h), byte for byte.

use super::{
    extract::MapInfo, kver, ProgSpec, AID_ROOT, AID_SYSTEM, BPFLOADER_MAX_VER, BPFLOADER_MIN_VER,
    BPF_MAP_TYPE_PERF_EVENT_ARRAY, BPF_MAP_TYPE_RINGBUF, CAPTURE_MAP_ENTRIES, KVER_INF,
    MAP_DEF_SIZE, MAP_MODE, PERF_EVENT_ARRAY_ENTRIES, PHONE_MAP_ENTRIES, PROG_DEF_SIZE,
    RINGBUF_MIN_BYTES,
};

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
    let fixed = CAPTURE_MAP_ENTRIES
        .iter()
        .chain(&PHONE_MAP_ENTRIES)
        .find(|(n, _)| *n == m.name);
    let max_entries = if let Some(&(_, entries)) = fixed {
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

/// The Android bpf_prog_def for one program.
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
