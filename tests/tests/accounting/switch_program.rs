//! Which tp_btf sched_switch program the kernel holds: `sched_switch_btf`
//! (5.18+, prev_state passed) or `switch_pre5_18` (prev's state read from
//! the task), as the kernel's own program list names them.

use vitals_tests::*;
use vitalsd::bpf::{Accounting, AccountingConfig, FaultSourceChoice, SchedPrograms};

/// This process's tp_btf sched_switch programs as the kernel names them
/// (BPF_OBJ_NAME_LEN: 15 characters).
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = bpf_stats::programs_of(std::process::id() as i32)
        .into_iter()
        .map(|p| p.name)
        .filter(|n| n.starts_with("sched_switch_bt") || n.starts_with("switch_pre5_18"))
        .collect();
    names.dedup();
    names
}

/// tp_btf with the pre-5.18 sched_switch program (prev's state read from
/// the task), also on a kernel whose prototype passes prev_state.
pub fn load_task_state() -> Accounting {
    require_root();
    let acc = Accounting::load(&AccountingConfig {
        fault_source: FaultSourceChoice::Off,
        force_switch_task_state: true,
        ..Default::default()
    })
    .expect("loading the accounting programs");
    assert_eq!(acc.sched_programs(), SchedPrograms::Btf);
    assert_eq!(names(), ["switch_pre5_18"]);
    acc
}
