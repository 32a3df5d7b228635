//! The kernel memory `vitalsd run` computes for a machine other than this
//! one (`run_kernel_memory`): #22 item 4's figure for a phone.

use super::run_kernel_memory;
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
/// pages, the tp_btf programs (run_delay) and ring buffers.
#[test]
fn the_default_config_on_an_8_cpu_phone() {
    let phone = MachineBounds {
        pid_max: 32768,
        possible_cpus: 8,
    };
    let maps = run_kernel_memory(&Config::default(), phone, true, 4096).unwrap();
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    for m in &maps {
        println!("{:<18} {:>9} bytes", m.def.name, m.bytes);
    }
    let total = total_bytes(&maps);
    println!("total {total} bytes, {:.2} MiB", mib(total));
    // One 88-byte record a possible tid, in a page-aligned mmap array.
    assert_eq!(by_name(&maps, "TASKS_BY_TID"), 4096 + 32768 * 88);
    // No per-process array: every tid has a slot.
    assert_eq!(by_name(&maps, "FAULTS_BY_TGID"), 2 * 4096);
    // 256 KiB a CPU.
    assert_eq!(by_name(&maps, "CAPTURE_EVENTS"), 2_117_960);
    // Two intervals of 2048 exits a second, 128 bytes a short record
    // with the ring's header: 512 KiB.
    assert_eq!(by_name(&maps, "EXITED_RING"), 538_952);
    // The capture tier (ring, stacks, fault-sampling and off-CPU
    // LRU maps) and the always-on maps.
    let capture: u64 = [
        "CAPTURE_EVENTS",
        "CAPTURE_STACKS",
        "CAPTURE_FAULT_CTR",
        "OFFCPU_START",
        "OFFCPU_AWAIT_USER",
    ]
    .iter()
    .map(|n| by_name(&maps, n))
    .sum();
    println!(
        "capture tier {:.2} MiB, always-on {:.2} MiB",
        mib(capture),
        mib(total - capture)
    );
    assert!(total < 8 << 20, "{total}");
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
    let tp_btf = run_kernel_memory(&cfg, phone, true, 4096).unwrap();
    let classic = run_kernel_memory(&cfg, phone, false, 4096).unwrap();
    assert_eq!(
        by_name(&classic, "WAKE_TS_ARRAY") - by_name(&tp_btf, "WAKE_TS_ARRAY"),
        (32768 - 1) * 8
    );
    assert_eq!(
        total_bytes(&classic) - total_bytes(&tp_btf),
        (32768 - 1) * 8
    );
}
