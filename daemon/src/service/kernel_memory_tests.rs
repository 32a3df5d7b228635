//! The kernel memory `vitalsd run` computes for a machine other than this
//! one (`run_kernel_memory`): #22 item 4's figure for a phone.

use super::{run_kernel_memory, RunMapMemory};
use crate::{
    bpf::{
        memory::{total_bytes, MapMemory},
        MachineBounds,
    },
    config::Config,
};

fn by_name(maps: &[MapMemory], name: &str) -> u64 {
    maps.iter().find(|m| m.def.name == name).unwrap().bytes
}

/// The default config on a phone: pid_max 32768, 8 possible CPUs, 4 KiB
/// pages, the tp_btf programs (run_delay) and ring buffers. #22 item 4's
/// target: at most 4 MiB of map memory held for the daemon's life; a
/// capture's own maps come on top while it runs.
#[test]
fn the_default_config_on_an_8_cpu_phone() {
    let phone = MachineBounds {
        pid_max: 32768,
        possible_cpus: 8,
    };
    let cfg = Config::default();
    let RunMapMemory {
        held: maps,
        per_capture: capture,
    } = run_kernel_memory(&cfg, phone, true, 4096).unwrap();
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    for m in &maps {
        println!("{:<18} {:>9} bytes", m.def.name, m.bytes);
    }
    for m in &capture {
        println!("{:<18} {:>9} bytes a capture", m.def.name, m.bytes);
    }
    let (held, per_capture) = (total_bytes(&maps), total_bytes(&capture));
    println!(
        "held {held} bytes, {:.2} MiB; a capture's own maps {per_capture} bytes, {:.2} MiB",
        mib(held),
        mib(per_capture)
    );
    // One 88-byte record a possible tid, in a page-aligned mmap array.
    assert_eq!(by_name(&maps, "TASKS_BY_TID"), 4096 + 32768 * 88);
    // No per-process array: every tid has a slot.
    assert_eq!(by_name(&maps, "FAULTS_BY_TGID"), 2 * 4096);
    // Two intervals of 2048 exits a second, 128 bytes a short record
    // with the ring's header: 512 KiB.
    assert_eq!(by_name(&maps, "EXITED_RING"), 538_952);
    // The capture's maps: made by each capture, at the configured sizes.
    // 256 KiB of ring buffer a CPU.
    assert_eq!(by_name(&capture, "CAPTURE_EVENTS"), 2_117_960);
    let names: Vec<&str> = capture.iter().map(|m| m.def.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "CAPTURE_EVENTS",
            "CAPTURE_STACKS",
            "CAPTURE_FAULT_CTR",
            "OFFCPU_START",
            "OFFCPU_AWAIT_USER"
        ]
    );
    // What the daemon holds of them between captures: the plain maps at
    // their minimum (one page of ring, one entry) and one-slot outers.
    for name in names {
        assert!(by_name(&maps, name) < 32 << 10, "{name}");
    }
    for outer in [
        "SLOT_EVENTS",
        "SLOT_STACKS",
        "SLOT_FAULT_CTR",
        "SLOT_OFFCPU_ST",
        "SLOT_AWAIT_USER",
    ] {
        assert_eq!(by_name(&maps, outer), 320, "{outer}");
    }
    assert!(held <= 4 << 20, "{held} bytes held");
    assert!(per_capture > 3 << 20, "{per_capture} bytes a capture");
}

/// The classic programs (bpfloader's, and kernels without BTF) keep a
/// wakeup time per tid: 8 bytes more a possible tid.
#[test]
fn the_classic_programs_add_the_wakeup_array() {
    let phone = MachineBounds {
        pid_max: 32768,
        possible_cpus: 8,
    };
    let cfg = Config::default();
    let tp_btf = run_kernel_memory(&cfg, phone, true, 4096).unwrap().held;
    let classic = run_kernel_memory(&cfg, phone, false, 4096).unwrap().held;
    assert_eq!(
        by_name(&classic, "WAKE_TS_ARRAY") - by_name(&tp_btf, "WAKE_TS_ARRAY"),
        (32768 - 1) * 8
    );
    assert_eq!(
        total_bytes(&classic) - total_bytes(&tp_btf),
        (32768 - 1) * 8
    );
}
