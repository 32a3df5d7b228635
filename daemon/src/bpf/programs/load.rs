//! Loading the embedded object with aya and attaching it: the fault
//! source, the scheduler programs (tp_btf where the kernel's BTF allows,
//! else classic tracepoints in the fixed or portable layout) with the
//! load-time settings `settings` chose, and with `PinMode::PinTo` pinning
//! everything instead of attaching.

use std::{collections::HashMap, path::Path};

use aya::{
    programs::{perf_event::SoftwareEvent, BtfTracePoint, PerfEvent, TracePoint},
    Btf, Ebpf, Endianness,
};
use vitals_common::{fixed_layout, names};

use super::{
    super::stale::StaleSweep,
    super::{
        attach_err,
        features::{self, VMLINUX_BTF},
        object::{
            btf::{KernelBtf, SwitchPrototype},
            feature_table::{log_missing, Feature},
            pinned_map_path, sched_program, EventTransport, MapRead, SchedPrograms,
            TracepointLayout,
        },
        program_err,
        tracefs::Tracefs,
        AccountingConfig, BpfError, FaultSource, FaultSourceChoice, Features, PinMode,
    },
    attach::{attach_perf_sw, attach_tracepoint, pin_maps},
    capture_slots::CaptureSlots,
    capture_tier::{load_capture_tier, IdleTransport, TransportSlot},
    free_misses::FreeMisses,
    program,
    settings::{FieldOffsets, LoadSettings},
    Accounting,
};

impl Accounting {
    /// Mounts tracefs if needed, probes, loads and attaches everything.
    pub fn load(cfg: &AccountingConfig) -> Result<Self, BpfError> {
        if let PinMode::AttachFrom(dir) = &cfg.pins {
            // No capability is asked for here: on Android vitalsd holds
            // none, and SELinux alone gates opening the pins, the map
            // syscalls and perf_event_open (perf_event_paranoid -1,
            // unprivileged_bpf_disabled 0; sepolicy/vitalsd.te). A refusal
            // shows as EPERM/EACCES from the syscall itself.
            if pinned_map_path(dir, names::TASKS).exists() {
                return Self::attach_pinned(cfg, dir);
            }
            log::info!(
                "no pinned vitals objects in {}; loading with aya",
                dir.display()
            );
        }
        check_capabilities()?;
        let pin_to = match &cfg.pins {
            PinMode::PinTo(dir) => Some(dir.as_path()),
            _ => None,
        };
        let tracefs = Tracefs::find_or_mount()?;
        let features = Features::probe(&tracefs)?;
        features::require_program_features()?;
        let fault_source = choose_fault_source(cfg.fault_source, &features)?;
        features::require_tracepoints(&tracefs)?;
        let offsets = FieldOffsets::read(&tracefs)?;
        let settings = LoadSettings::choose(cfg, &features, pin_to.is_some())?;
        let mut ebpf = settings.load(cfg, &offsets)?;
        let layout = offsets.layout(&tracefs, cfg.force_portable_layout)?;
        let waking_layout = offsets.waking_layout(cfg.force_portable_layout);
        // sched_process_free before the programs that insert tasks: a task
        // sched_switch counted and that was freed before this attached
        // would stay in TASKS for good, a process that never ends and is
        // no longer in /proc to be named.
        attach_tracepoint(
            &mut ebpf,
            names::PROG_SCHED_PROCESS_FREE,
            "sched",
            "sched_process_free",
            pin_to,
        )?;
        let (sched_programs, wait_from_kernel, switch_in) = attach_sched(
            &mut ebpf,
            cfg.runq_wait,
            settings.offcpu.is_some(),
            cfg.capture.is_some(),
            layout,
            settings.btf_offsets.as_ref(),
            pin_to,
        )?;
        let free_misses = follow_exec_and_free(&mut ebpf, &tracefs, sched_programs, pin_to)?;
        let fault_source = attach_fault_source(&mut ebpf, fault_source, cfg.fault_source, pin_to)?;
        if let Some(dir) = pin_to {
            pin_maps(&ebpf, dir)?;
        }
        log::info!(
            "eBPF accounting {}: fault source {}; scheduler programs {}; runqueue wait {}; off-CPU {}; {} possible CPUs; BTF {}; capture transport {}",
            if pin_to.is_some() { "loaded" } else { "attached" },
            fault_source.describe(),
            describe_sched_programs(sched_programs, &settings, layout),
            match (cfg.runq_wait, wait_from_kernel, settings.wake_array) {
                (false, _, _) => "off",
                (true, true, _) => "from the kernel's sched_info.run_delay",
                (true, false, true) => "from wakeup times in an array (pid_max small)",
                (true, false, false) => "from wakeup times in a bounded hash",
            },
            match settings.offcpu {
                Some(o) => format!("on (long block {} µs)", o.long_block_us),
                None => "off".to_string(),
            },
            settings.nr_cpus,
            if features.btf_vmlinux { "yes" } else { "no" },
            match cfg.capture {
                Some(_) => settings.transport.name(),
                None => "none (capture not configured)",
            }
        );
        let (ring, per_capture) = load_capture(&mut ebpf, waking_layout, cfg, &settings, pin_to)?;
        let switch_counters =
            blind_window_witness(&ebpf, cfg.capture.is_some(), sched_programs, pin_to);
        Ok(Self {
            ebpf: Some(ebpf),
            pinned_maps: HashMap::new(),
            pinned_programs: Vec::new(),
            fault_source,
            features,
            limits: cfg.limits,
            layout,
            waking_layout,
            sched_programs,
            runq_wait: cfg.runq_wait,
            wait_from_kernel: cfg.runq_wait && wait_from_kernel,
            offcpu: settings.offcpu,
            capture_sizing: cfg.capture,
            transport: settings.transport,
            slot: TransportSlot {
                idle: ring,
                lent: false,
                switch_counters,
                per_capture,
            },
            pinned_waking: None,
            waking_link: None,
            switch_in,
            switch_in_link: None,
            map_read: MapRead::Batch,
            mapped: Default::default(),
            free_misses,
            stale: StaleSweep::for_this_host(),
        })
    }
}

/// The capture tier (`load_capture_tier`) and, where each capture makes
/// its own maps, their slots.
fn load_capture(
    ebpf: &mut Ebpf,
    waking_layout: TracepointLayout,
    cfg: &AccountingConfig,
    settings: &LoadSettings,
    pin_to: Option<&Path>,
) -> Result<(Option<IdleTransport>, Option<CaptureSlots>), BpfError> {
    let ring = load_capture_tier(
        ebpf,
        waking_layout,
        cfg.capture,
        settings.transport,
        settings.page,
        pin_to,
        settings.per_capture_maps,
    )?;
    let slots = match settings.capture_sizes(cfg) {
        Some(sizes) => Some(CaptureSlots::take(
            ebpf,
            sizes,
            settings.transport == EventTransport::RingBuf,
        )?),
        None => None,
    };
    Ok((ring, slots))
}

/// The classic programs' exec follower (`attach_exec_follower`), and the
/// sched_process_free watched for skipped runs; neither for `pin_to`.
fn follow_exec_and_free(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    sched: SchedPrograms,
    pin_to: Option<&Path>,
) -> Result<FreeMisses, BpfError> {
    if pin_to.is_some() {
        return Ok(FreeMisses::default());
    }
    if sched == SchedPrograms::Classic {
        attach_exec_follower(ebpf, tracefs);
    }
    watch_free(ebpf, sched)
}

/// The attached sched_process_free (tp_btf with the tp_btf scheduler
/// programs, else classic), watched for runs the kernel skipped.
fn watch_free(ebpf: &mut Ebpf, sched: SchedPrograms) -> Result<FreeMisses, BpfError> {
    let fd_err = |name| move |e: aya::programs::ProgramError| program_err(name)(e);
    Ok(match sched {
        SchedPrograms::Btf => {
            let name = names::PROG_SCHED_PROCESS_FREE_BTF;
            let p = program::<BtfTracePoint>(ebpf, name)?;
            FreeMisses::watch(p.fd().map_err(fd_err(name))?)
        }
        SchedPrograms::Classic => {
            let name = names::PROG_SCHED_PROCESS_FREE;
            let p = program::<TracePoint>(ebpf, name)?;
            FreeMisses::watch(p.fd().map_err(fd_err(name))?)
        }
    })
}

/// The context-switch counters that reveal blind windows to the classic
/// sched_switch programs during a capture (`switch_counters`). Not for
/// tp_btf (never blind) nor pins (the fds would close with this process).
/// Without them a capture still marks the windows `switch_missed` finds.
fn blind_window_witness(
    ebpf: &aya::Ebpf,
    capture: bool,
    sched: SchedPrograms,
    pin_to: Option<&std::path::Path>,
) -> super::SwitchCounters {
    if !capture || sched != SchedPrograms::Classic || pin_to.is_some() {
        return Default::default();
    }
    super::SwitchCounters::open(ebpf).unwrap_or_else(|e| {
        log::warn!("blind windows: only those a running-task mismatch shows: {e}");
        Default::default()
    })
}

/// The fault source for `choice` on this kernel.
fn choose_fault_source(
    choice: FaultSourceChoice,
    features: &Features,
) -> Result<FaultSource, BpfError> {
    Ok(match (choice, features.page_fault_user_tracepoint) {
        (FaultSourceChoice::Off, _) => FaultSource::None,
        (FaultSourceChoice::PerfEvent, _) => FaultSource::PerfEvent,
        (FaultSourceChoice::Auto, false) => {
            log_missing(
                Feature::PageFaultTracepoint,
                "no exceptions/page_fault_user in tracefs",
            );
            FaultSource::PerfEvent
        }
        (FaultSourceChoice::Tracepoint | FaultSourceChoice::Auto, true) => FaultSource::Tracepoint,
        (FaultSourceChoice::Tracepoint, false) => return Err(BpfError::NoFaultTracepoint),
    })
}

/// The scheduler events to attach: sched_switch; sched_wakeup and
/// sched_wakeup_new where runqueue wait is on and the switch program
/// cannot read the kernel's own (`wait_from_kernel`: tp_btf with
/// `sched_info.run_delay`); with `offcpu` the off-CPU sched_waking. Each a
/// decision of its own.
fn sched_events(runq_wait: bool, wait_from_kernel: bool, offcpu: bool) -> Vec<&'static str> {
    let mut events = vec!["sched_switch"];
    if runq_wait && !wait_from_kernel {
        events.extend(["sched_wakeup", "sched_wakeup_new"]);
    }
    if offcpu {
        events.push("sched_waking");
    }
    events
}

/// Attaches the scheduler programs (`sched_events`): as tp_btf programs
/// with `kernel_btf` (aya gets only its attach targets) where the
/// kernel takes them, else as classic
/// tracepoints in `layout` (with `pin_to` pinned there instead). Returns
/// which, whether runqueue wait comes from run_delay, and whether the
/// off-CPU capture's switch-in program loaded (`switch_in::load`).
fn attach_sched(
    ebpf: &mut Ebpf,
    runq_wait: bool,
    offcpu: bool,
    capture: bool,
    layout: TracepointLayout,
    kernel_btf: Option<&KernelBtf>,
    pin_to: Option<&Path>,
) -> Result<(SchedPrograms, bool, Option<super::switch_in::SwitchIn>), BpfError> {
    // Some(whether their task_struct has sched_info.run_delay) with BTF.
    let btf_run_delay = kernel_btf.map(|k| k.task.run_delay.is_some());
    // aya needs only the attach targets' ids from vmlinux BTF, which our
    // own one-pass lookup found: give it those, not all of vmlinux to parse.
    let vmlinux_btf =
        match kernel_btf.map(|k| Btf::parse(&k.attach_targets_btf(), Endianness::default())) {
            Some(Ok(btf)) => Some(btf),
            Some(Err(e)) => {
                log_missing(
                    Feature::KernelBtf,
                    format!("{VMLINUX_BTF}'s attach targets: {e}"),
                );
                None
            }
            None => None,
        };
    let mut sched_programs = SchedPrograms::Classic;
    let mut switch_in = None;
    let run_delay = btf_run_delay == Some(true);
    if let Some(btf) = &vmlinux_btf {
        if btf_run_delay == Some(false) {
            log::info!(
                "no task_struct.sched_info.run_delay in {VMLINUX_BTF} (CONFIG_SCHED_INFO off): \
                 runqueue wait from the sched_wakeup programs' timestamps"
            );
        }
        // A kernel or policy that refuses them (verifier, LSM) costs
        // the cheaper attach, not the accounting.
        let switch = kernel_btf.map_or(SwitchPrototype::StateArgument, |k| k.switch);
        // sched_process_free first, as the classic one was attached first
        // (see `Accounting::load`).
        let mut events = vec!["sched_process_free"];
        events.extend(sched_events(runq_wait, run_delay, offcpu));
        match attach_btf_sched(ebpf, &events, switch, btf) {
            Ok(()) => {
                sched_programs = SchedPrograms::Btf;
                drop_classic_free(ebpf);
                if offcpu && capture && pin_to.is_none() {
                    switch_in = super::switch_in::load(ebpf, kernel_btf, btf);
                }
            }
            // Surprising where the probes said yes, hence a warning.
            Err(e) => log::warn!(
                "{}",
                Feature::KernelBtf.missing_message(format!("loading the tp_btf programs: {e}"))
            ),
        }
    }
    drop(vmlinux_btf);
    crate::system::release_free_heap();
    if sched_programs == SchedPrograms::Classic {
        for event in sched_events(runq_wait, false, offcpu) {
            let name = sched_program(SchedPrograms::Classic, layout, event);
            attach_tracepoint(ebpf, name, "sched", event, pin_to)?;
        }
    }
    // The classic programs get no task pointer, so never run_delay.
    Ok((
        sched_programs,
        sched_programs == SchedPrograms::Btf && run_delay,
        switch_in,
    ))
}

/// Detaches the classic sched_process_free once its tp_btf twin runs:
/// `trace_call_bpf()` skips the classic one while `bpf_prog_active` is
/// raised on its CPU (another process's map syscall), which would leave a
/// freed task's counters behind (`free_missed`). A task freed while both
/// ran is handled once: the second finds its slot already free.
fn drop_classic_free(ebpf: &mut Ebpf) {
    let name = names::PROG_SCHED_PROCESS_FREE;
    if let Err(e) =
        program::<TracePoint>(ebpf, name).and_then(|p| p.unload().map_err(program_err(name)))
    {
        // Both stay attached: each free is still handled once.
        log::warn!("{e}");
    }
}

/// The classic programs' sched_process_exec program, which follows a
/// non-leader thread's exec (it takes the leader's pid on the CPU) so that
/// it does not count as a missed switch (`ebpf-programs/src/exec.rs`; the
/// tp_btf program tells by the task pointer). It reads the record at
/// `fixed_layout`'s offsets, so only where the format has them. Not for
/// pins: bpfloader's object has no such program. Best effort: without it,
/// such an exec counts one switch_missed as before.
fn attach_exec_follower(ebpf: &mut Ebpf, tracefs: &Tracefs) {
    let fixed = tracefs
        .format("sched", "sched_process_exec")
        .and_then(|f| Ok((f.offset_of("pid", 4)?, f.offset_of("old_pid", 4)?)));
    let attached = match fixed {
        Ok(offsets) if offsets == (fixed_layout::EXEC_PID, fixed_layout::EXEC_OLD_PID) => {
            attach_tracepoint(
                ebpf,
                names::PROG_SCHED_PROCESS_EXEC,
                "sched",
                "sched_process_exec",
                None,
            )
            .map_err(|e| e.to_string())
        }
        Ok(offsets) => Err(format!(
            "sched_process_exec has pid, old_pid at {offsets:?}, not at the fixed layout's"
        )),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = attached {
        log::warn!("{e}; an exec from a non-leader thread counts as a switch_missed");
    }
}

/// Attaches (or with `pin_to` pins) the programs of `fault_source`, and
/// returns the fault source now counting: none where the perf events
/// cannot be opened and the source was `auto` (`Feature::PerfFaultEvents`).
fn attach_fault_source(
    ebpf: &mut Ebpf,
    fault_source: FaultSource,
    choice: FaultSourceChoice,
    pin_to: Option<&Path>,
) -> Result<FaultSource, BpfError> {
    match fault_source {
        FaultSource::Tracepoint => attach_tracepoint(
            ebpf,
            names::PROG_PAGE_FAULT_USER,
            "exceptions",
            "page_fault_user",
            pin_to,
        )?,
        FaultSource::PerfEvent => {
            let cpus = crate::system::online_cpus(Path::new("/sys"))?;
            let perf_progs = [
                (names::PROG_PERF_MINFLT, SoftwareEvent::PageFaultsMin),
                (names::PROG_PERF_MAJFLT, SoftwareEvent::PageFaultsMaj),
            ];
            let attached = perf_progs
                .iter()
                .try_for_each(|&(name, event)| attach_perf_sw(ebpf, name, event, &cpus, pin_to));
            match attached {
                Ok(()) => {}
                // perf_event_open or PERF_EVENT_IOC_SET_BPF refused (no
                // software events, a perf_event_paranoid or LSM policy):
                // no fault accounting rather than no accounting at all.
                Err(e @ BpfError::Attach { .. }) if choice == FaultSourceChoice::Auto => {
                    for (name, _) in perf_progs {
                        if let Ok(p) = program::<PerfEvent>(ebpf, name) {
                            // Unloading detaches the CPUs attached so far.
                            let _ = p.unload();
                        }
                    }
                    log_missing(Feature::PerfFaultEvents, e);
                    return Ok(FaultSource::None);
                }
                Err(e) => return Err(e),
            }
        }
        FaultSource::None => {}
    }
    Ok(fault_source)
}

/// Names the missing capability up front instead of surfacing a bare EPERM
/// from bpf(2) or perf_event_open(2). CAP_SYS_ADMIN implies both on kernels
/// before 5.8, and still does for BPF.
fn check_capabilities() -> Result<(), BpfError> {
    use caps::{CapSet, Capability};
    let have = caps::read(None, CapSet::Effective).unwrap_or_default();
    let admin = have.contains(&Capability::CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !admin && !have.contains(&Capability::CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !admin && !have.contains(&Capability::CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(BpfError::MissingCapabilities {
        missing: missing.join(" and "),
        have: crate::privileges::describe(&have),
    })
}

/// The tp_btf program for `event`; sched_switch's by the kernel's
/// prototype of it (`switch`).
fn btf_sched_program(event: &str, switch: SwitchPrototype) -> &'static str {
    match (event, switch) {
        ("sched_process_free", _) => names::PROG_SCHED_PROCESS_FREE_BTF,
        ("sched_switch", SwitchPrototype::StateInTask) => names::PROG_SWITCH_PRE5_18,
        _ => sched_program(SchedPrograms::Btf, TracepointLayout::Fixed, event),
    }
}

/// Loads (verifies) every tp_btf scheduler program, then attaches them;
/// all or none: on an error the ones loaded are unloaded again, which
/// detaches them.
fn attach_btf_sched(
    ebpf: &mut Ebpf,
    events: &[&str],
    switch: SwitchPrototype,
    btf: &Btf,
) -> Result<(), BpfError> {
    let result = (|| {
        for event in events {
            let name = btf_sched_program(event, switch);
            program::<BtfTracePoint>(ebpf, name)?
                .load(event, btf)
                .map_err(program_err(name))?;
        }
        for event in events {
            let name = btf_sched_program(event, switch);
            program::<BtfTracePoint>(ebpf, name)?
                .attach()
                .map_err(attach_err(name, format!("tp_btf/{event}")))?;
        }
        Ok(())
    })();
    if result.is_err() {
        for event in events {
            let name = btf_sched_program(event, switch);
            if let Ok(p) = program::<BtfTracePoint>(ebpf, name) {
                let _ = p.unload();
            }
        }
    }
    result
}

/// The scheduler programs attached, for the load log line.
fn describe_sched_programs(
    sched_programs: SchedPrograms,
    settings: &LoadSettings,
    layout: TracepointLayout,
) -> String {
    match sched_programs {
        SchedPrograms::Btf => match settings.btf_offsets.map(|k| k.switch) {
            Some(SwitchPrototype::StateInTask) => {
                "tp_btf (pre-5.18 sched_switch: prev's state read from the task)".to_string()
            }
            _ => "tp_btf".to_string(),
        },
        SchedPrograms::Classic => format!("classic tracepoints, {layout:?} layout"),
    }
}
