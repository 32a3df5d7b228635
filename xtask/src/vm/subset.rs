//! Which kernel tests the matrix runs: the files, the CI subset (with the
//! arches each applies to), the tests `--full` leaves out and why, and the
//! tests of one arch only. `checks.rs` turns these into the guest's script
//! and reads its results.

use super::Arch;

/// The test files of the matrix (tests/tests/<file>.rs).
pub const TEST_FILES: &[&str] = &[
    "accounting",
    "blind_windows",
    "capture",
    "cts_tier",
    "offcpu",
    "pins",
    "record",
    "reuse",
];

/// The CI subset, per the issue: load and attach, on-CPU time, faults,
/// voluntary switches, an exited child, the sched capture, pins.
/// (file, test, arches it applies to; empty = all)
pub(super) const CI_SUBSET: &[(&str, &str, &[Arch])] = &[
    // On-CPU time against utime+stime, with the default (tp_btf) programs.
    ("accounting", "oncpu_time_matches_utime_plus_stime", &[]),
    // A running spinner against /proc/<pid>/schedstat: within 5 %, and never
    // above the kernel's figure read after it.
    (
        "accounting",
        "running_task_inflight_time_matches_schedstat",
        &[],
    ),
    // Faults against minflt from the source `auto` picks: the tracepoint on
    // x86, perf software events on arm64.
    ("accounting", "faults_match_minflt_default_source", &[]),
    // The perf source on x86 too (on arm64 it is the default above).
    (
        "accounting",
        "faults_match_minflt_perf_source_forced",
        &[Arch::X86_64],
    ),
    ("accounting", "sleeping_child_switches_voluntarily", &[]),
    // #22 item 1: on-CPU time and runqueue wait are the kernel's own
    // (schedstat sum_exec_runtime, run_delay; status switch counts) on
    // each kernel, tp_btf on all of them (5.10's pre-5.18 prototype too).
    // Guest seconds each (x86_64 5.10 / arm64 5.10): run_delay 8 / 8,
    // waker 8 / 10, loopback flood 9 / 11, timer storm 9 / 13. The
    // softirq (NET_RX) path is arch-independent code, so x86_64 only; the
    // timer storm's hard-irq path is the waker's, so the host alone.
    (
        "accounting",
        "runq_wait_and_switches_are_the_kernels_beside_a_spinner",
        &[],
    ),
    (
        "accounting",
        "oncpu_time_is_the_kernels_charge_beside_a_frequent_waker",
        &[],
    ),
    (
        "accounting",
        "oncpu_time_is_the_kernels_charge_beside_a_loopback_flood",
        &[Arch::X86_64],
    ),
    ("accounting", "exited_child_keeps_its_final_counters", &[]),
    // record --sched, decoded with the official schema: >= 2N switches for
    // a ping-pong of N.
    (
        "capture",
        "pipe_ping_pong_gives_every_switch_sleeping_prev_state_and_monotonic_cpus",
        &[],
    ),
    (
        "pins",
        "daemon_attaches_pinned_programs_and_reads_pinned_maps",
        &[],
    ),
    // The classic programs (bpfloader's kind) with the recorder on a
    // spinner's CPU: no switch missed on stock kernels (9 s x86_64, 14 s
    // arm64). Also the matrix's explicit classic check beside
    // running_task's second half, now that every cell gets tp_btf.
    (
        "record",
        "classic_programs_miss_no_switch_with_the_reader_beside_a_spinner",
        &[],
    ),
    // The CTS tier's always-on accounting (no eBPF) against the kernel's
    // own figures on each kernel: schedstat, run_delay and status, and
    // short-lived threads against getrusage.
    ("cts_tier", "spinner_oncpu_matches_schedstat", &[]),
    ("cts_tier", "pinned_spinners_wait_as_run_delay_says", &[]),
    ("cts_tier", "sleeper_switches_equal_status", &[]),
    ("cts_tier", "short_lived_threads_keep_their_time", &[]),
    // Off-CPU accounting (#24) with the programs the kernel gets by default
    // and with the classic ones: S/D time within the workload's calls and
    // all of them but the schedstat on-CPU and run_delay, and who woke it.
    ("offcpu", "blocked_time_and_wakers_default_programs", &[]),
    ("offcpu", "blocked_time_and_wakers_classic", &[]),
    // record --offcpu-pid, queried by trace_processor on the host over the
    // relay: the blocked and the waker's stacks name the workload's
    // functions (on the cells of CELLS_ONLY).
    (
        "offcpu",
        "offcpu_capture_stacks_name_the_blocked_and_the_waking_function",
        &[],
    ),
    // A block in a page fault (userfaultfd): its user stack, taken at the
    // switch-in where a switch-in program attaches, names the faulting
    // function (on the cells of CELLS_ONLY).
    (
        "offcpu",
        "offcpu_capture_stacks_a_block_in_a_page_fault_at_the_faulting_function",
        &[],
    ),
    // A daemon's off-CPU capture leaves out a block begun before it: on
    // tp_btf with a switch-in program (kprobes in these guests) its blocks
    // come from the always-on accounting, which times that one too (on
    // the cells of CELLS_ONLY).
    (
        "offcpu",
        "a_daemon_capture_leaves_out_a_block_begun_before_it",
        &[],
    ),
    // #22 item 2: a classic --sched capture marks where bpf_prog_active
    // blinded its programs, against ftrace's sched_switch; on the
    // preempt=full cell (guest.rs CELL_CMDLINE) a bpf() call preempted by
    // a spinner really blinds its CPU.
    (
        "blind_windows",
        "classic_capture_marks_every_switch_ftrace_saw_and_it_missed",
        &[],
    ),
];

/// Tests of the CI subset that its guests run on these cells only (arch,
/// kernel series), for CI time; the host cell and `--full` run them
/// everywhere.
pub(super) const CELLS_ONLY: &[(&str, &[(Arch, &str)])] = &[
    // 18-28 s an x86_64 guest (a 2 s recording, symbolisation and two
    // trace_processor runs over the relay). 5.10 x86_64: the oldest
    // kernel, and kallsyms's per-CPU symbols first.
    (
        "offcpu_capture_stacks_name_the_blocked_and_the_waking_function",
        &[(Arch::X86_64, "5.10"), (Arch::Arm64, "6.1")],
    ),
    // The same shape of run; on the cells the test above leaves out.
    (
        "offcpu_capture_stacks_a_block_in_a_page_fault_at_the_faulting_function",
        &[(Arch::X86_64, "6.1"), (Arch::Arm64, "5.10")],
    ),
    // Both arches where the switch-in is a kprobe on tp_btf.
    (
        "a_daemon_capture_leaves_out_a_block_begun_before_it",
        &[(Arch::X86_64, "6.12"), (Arch::Arm64, "6.1")],
    ),
    // The one preempt=full cell (guest.rs CELL_CMDLINE): elsewhere a
    // guest's bpf() is not preempted, nothing is blind and the test has
    // nothing to check. 11-13 s an x86_64 6.1 guest (a 4 s recording and
    // two trace_processor runs over the relay; 6 runs).
    (
        "classic_capture_marks_every_switch_ftrace_saw_and_it_missed",
        &[(Arch::X86_64, "6.1")],
    ),
];

/// Tests `--full` leaves out, and why (`cargo xtask test` runs them all
/// on the host).
pub(super) const LEFT_OUT: &[(&str, &str)] = &[
    (
        "wakeup_wait_is_the_kernels_run_delay_on_tp_btf",
        "it runs bpftrace beside it (its figure reported), which a guest does not have",
    ),
    (
        "classic_wakeup_wait_matches_bpftrace",
        "its reference is bpftrace, which a guest does not have",
    ),
    (
        "exited_child_keeps_its_final_counters_with_the_pid_offset_from_the_record",
        "its precondition is the host kernel's sched_process_free layout (pid at 12); \
         6.12 and 6.1 have it at 24",
    ),
    (
        "procfs_core_equivalent_agrees_with_ebpf",
        "its reference is CPU time over a 1 s wall-clock window, which TCG \
         stretches (81 % core-equivalent against 97.6 % by eBPF, arm64 6.1)",
    ),
    (
        "always_on_read_copies_no_counters_through_bpf",
        "its witness is strace, which a guest does not have",
    ),
    (
        "classic_capture_marks_every_switch_ftrace_saw_and_it_missed",
        "it needs blindness to mark: the CI subset runs it in the preempt=full x86_64 6.1 \
         guest only (on 5.10 its workload's map also exceeds RLIMIT_MEMLOCK: EPERM)",
    ),
    (
        "exited_overflow_is_in_the_summary_and_the_trace",
        "expects 300 short-lived processes within 5 s of wall time; \
         TCG guests took 26 and 33 s (x86_64 and arm64 5.10)",
    ),
    (
        "batched_map_reads_match_iteration",
        "expects 400 threads started within 700 ms of wall time; \
         a TCG guest had started 114",
    ),
];

/// Tests that only apply to one arch.
pub(super) const ARCH_ONLY: &[(&str, Arch)] = &[
    // Asserts the x86 exceptions/page_fault_user tracepoint exists.
    ("faults_match_minflt_tracepoint_source", Arch::X86_64),
];
