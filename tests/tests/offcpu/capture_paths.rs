//! The off-CPU capture tests' helpers: waiting for a thread's block,
//! recording a capture, and telling which path took its stacks.

use vitals_tests::*;

/// A 2 s `record` to `trace` with `watch` (`--offcpu`, `--offcpu-pid P`)
/// while workload `w` runs its rounds (after its "ready"): the summary it
/// printed and the BPF programs that ran during the rounds (run counts
/// on while they ran). The workload is still alive: the caller ends it.
pub(super) fn record_offcpu(
    w: &mut Workload,
    trace: &std::path::Path,
    watch: &[&str],
) -> (String, Vec<vitals_tests::bpf_stats::ProgRuns>) {
    let _stats = vitals_tests::bpf_stats::StatsEnabled::enable();
    let mut args = vec![
        "--duration",
        "2s",
        "--top",
        "0",
        "--out",
        trace.to_str().unwrap(),
    ];
    args.extend_from_slice(watch);
    let rec = Recording::start(&args, "capture started");
    let recorder = rec.child.id() as i32;
    let before = vitals_tests::bpf_stats::programs_of(recorder);
    w.go();
    w.expect("done");
    let ran = vitals_tests::bpf_stats::ran_between(
        &before,
        &vitals_tests::bpf_stats::programs_of(recorder),
    );
    // Alive until the recorder has symbolised its stacks.
    let printed = rec.wait();
    (printed, ran)
}

/// Where the capture's user stacks came from. On tp_btf a kernel with
/// kprobes (its kprobe PMU in sysfs, the independent witness) must have
/// run a switch-in program (fentry or kprobe, both named
/// `offcpu_switch_in*`, cut to 15 bytes by the kernel) and resolved at
/// least `blocks` long blocks' user stacks there; elsewhere (this
/// project's CI host has CONFIG_KPROBES off and refuses fentry) none ran
/// and every stack was walked at the switch-out.
pub(super) fn assert_user_stacks_path(
    btf: bool,
    ran: &[vitals_tests::bpf_stats::ProgRuns],
    printed: &str,
    blocks: usize,
) {
    let switch_in_runs: u64 = ran
        .iter()
        .filter(|p| p.name.starts_with("offcpu_switch_i"))
        .map(|p| p.run_cnt)
        .sum();
    let kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    let at_switch_in = user_stacks_at_switch_in(printed);
    eprintln!(
        "kprobes {kprobes}; switch-in runs {switch_in_runs}; user stacks at the switch-in {at_switch_in}"
    );
    if btf && kprobes {
        assert!(switch_in_runs > 0, "no switch-in program ran: {ran:?}");
    }
    if switch_in_runs > 0 {
        assert!(at_switch_in >= blocks as u64, "{printed}");
    } else {
        assert_eq!(at_switch_in, 0, "{printed}");
    }
}

/// The capture line's `user stacks: N at their switch-in`.
pub(super) fn user_stacks_at_switch_in(printed: &str) -> u64 {
    printed
        .split("user stacks: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no user-stack figures in {printed}"))
}

/// Where the always-on sched_waking is a tp_btf program (it has the
/// wakee's task), an off-CPU-only capture takes a long block's kernel
/// stack there, at its waking, and attaches no capture sched_waking
/// (classic, 350 ns a wakeup in the bench): that program must not have
/// run. On classic kernels the capture's own sched_waking does the work.
/// Returns whether it is the tp_btf path.
pub(super) fn assert_kernel_stack_taken_at_waking(
    ran: &[vitals_tests::bpf_stats::ProgRuns],
) -> bool {
    let runs = |prefix: &str| -> u64 {
        ran.iter()
            .filter(|p| p.name.starts_with(prefix))
            .map(|p| p.run_cnt)
            .sum()
    };
    // Kernel names are cut at 15 bytes: "offcpu_waking_b".
    let btf = ran.iter().any(|p| p.name.starts_with("offcpu_waking_b"));
    eprintln!("programs that ran during the blocks: {ran:?}");
    if btf {
        assert_eq!(runs("sched_waking"), 0, "capture sched_waking ran: {ran:?}");
    } else {
        assert!(runs("sched_waking") > 0, "no sched_waking ran: {ran:?}");
    }
    btf
}
