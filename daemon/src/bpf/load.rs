//! Loading the embedded object with aya and attaching it: the fault
//! source, the scheduler programs (tp_btf where the kernel's BTF allows,
//! else classic tracepoints in the fixed or portable layout), the
//! load-time settings (tracefs field offsets, map sizes, frozen globals),
//! and with `PinMode::PinTo` pinning everything instead of attaching.

use std::{collections::HashMap, path::Path};

use aya::{
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        BtfTracePoint, PerfEvent, TracePoint,
    },
    Btf, Ebpf, EbpfLoader,
};
use vitals_common::{fixed_layout, names};

use super::{
    attach_err, btf,
    capture_maps::{load_capture_tier, object_without_ringbuf},
    features::{self, possible_cpu_count, read_pid_max, VMLINUX_BTF},
    pinned_map_path, pinned_prog_path, program, program_err,
    tracefs::Tracefs,
    Accounting, AccountingConfig, BpfError, CaptureTransport, CaptureTransportChoice, FaultSource,
    FaultSourceChoice, Features, MapRead, PinMode, SchedPrograms, TracepointLayout, EBPF_OBJECT,
};

/// Above this pid_max the wakeup array would cost more than 2 MiB; use the
/// bounded hash instead (systemd hosts set pid_max to 4194304).
pub const WAKE_ARRAY_MAX_PIDS: u32 = 1 << 18;

impl Accounting {
    /// Mounts tracefs if needed, probes, loads and attaches everything.
    pub fn load(cfg: &AccountingConfig) -> Result<Self, BpfError> {
        check_capabilities()?;
        if let PinMode::AttachFrom(dir) = &cfg.pins {
            if pinned_map_path(dir, names::TASKS).exists() {
                return Self::attach_pinned(cfg, dir);
            }
            log::info!(
                "no pinned vitals objects in {}; loading with aya",
                dir.display()
            );
        }
        let pin_to = match &cfg.pins {
            PinMode::PinTo(dir) => Some(dir.as_path()),
            _ => None,
        };
        let tracefs = Tracefs::find_or_mount()?;
        let features = Features::probe(&tracefs)?;
        let fault_source = match (cfg.fault_source, features.page_fault_user_tracepoint) {
            (FaultSourceChoice::Off, _) => FaultSource::None,
            (FaultSourceChoice::PerfEvent, _) | (FaultSourceChoice::Auto, false) => {
                FaultSource::PerfEvent
            }
            (FaultSourceChoice::Tracepoint | FaultSourceChoice::Auto, true) => {
                FaultSource::Tracepoint
            }
            (FaultSourceChoice::Tracepoint, false) => return Err(BpfError::NoFaultTracepoint),
        };
        features::require_tracepoints(&tracefs)?;

        let switch = tracefs.format("sched", "sched_switch")?;
        let wakeup = tracefs.format("sched", "sched_wakeup")?;
        let free = tracefs.format("sched", "sched_process_free")?;
        let waking = tracefs.format("sched", "sched_waking")?;
        let capture_offsets: [(&str, u32, u32); 7] = [
            (
                names::G_SWITCH_PREV_PRIO,
                switch.offset_of("prev_prio", 4)?,
                fixed_layout::SWITCH_PREV_PRIO,
            ),
            (
                names::G_SWITCH_NEXT_COMM,
                switch.offset_of("next_comm", 16)?,
                fixed_layout::SWITCH_NEXT_COMM,
            ),
            (
                names::G_SWITCH_NEXT_PRIO,
                switch.offset_of("next_prio", 4)?,
                fixed_layout::SWITCH_NEXT_PRIO,
            ),
            (
                names::G_WAKING_COMM,
                waking.offset_of("comm", 16)?,
                fixed_layout::WAKING_COMM,
            ),
            (
                names::G_WAKING_PID,
                waking.offset_of("pid", 4)?,
                fixed_layout::WAKING_PID,
            ),
            (
                names::G_WAKING_PRIO,
                waking.offset_of("prio", 4)?,
                fixed_layout::WAKING_PRIO,
            ),
            (
                names::G_WAKING_TARGET_CPU,
                waking.offset_of("target_cpu", 4)?,
                fixed_layout::WAKING_TARGET_CPU,
            ),
        ];
        let offsets: [(&str, u32); 5] = [
            (names::G_SWITCH_PREV_PID, switch.offset_of("prev_pid", 4)?),
            (
                names::G_SWITCH_PREV_STATE,
                switch.offset_of("prev_state", 8)?,
            ),
            (names::G_SWITCH_NEXT_PID, switch.offset_of("next_pid", 4)?),
            (names::G_WAKEUP_PID, wakeup.offset_of("pid", 4)?),
            (names::G_FREE_PID, free.offset_of("pid", 4)?),
        ];
        let nr_cpus = possible_cpu_count()? as u32;

        // Wakeup times in an array indexed by tid when pid_max keeps it
        // small (8 bytes a pid): its lookups are inlined, a hash's are not.
        // Not fatal: Android's policy does not grant pid_max (see
        // android::NOT_GRANTED), and the bounded hash works everywhere.
        let pid_max = read_pid_max().unwrap_or_else(|e| {
            log::warn!("{e}; keeping wakeup times in the bounded hash");
            u32::MAX
        });
        let wake_array = pid_max <= WAKE_ARRAY_MAX_PIDS && !cfg.force_wake_hash;
        let (wake_array_len, wake_hash_len) = if wake_array {
            (pid_max, 1)
        } else {
            (1, cfg.limits.max_tasks)
        };
        let wake_array_flag = u32::from(wake_array);
        let track_wait_flag = u32::from(cfg.runq_wait);
        // Only the capture tier uses CAPTURE_EVENTS, but the map exists in
        // the object whatever runs, so probe even without a capture.
        let ringbuf_ok = features::ringbuf_map_supported(cfg.assume_no_ringbuf);
        let transport = match (cfg.capture.map(|c| c.transport), ringbuf_ok) {
            (Some(CaptureTransportChoice::PerfArray), _) | (_, false) => {
                if cfg.capture.map(|c| c.transport) == Some(CaptureTransportChoice::RingBuf) {
                    return Err(BpfError::NoRingBuf);
                }
                CaptureTransport::PerfArray
            }
            _ => CaptureTransport::RingBuf,
        };
        let transport_flag = transport.rodata();
        let patched;
        let object: &[u8] = if ringbuf_ok {
            EBPF_OBJECT
        } else {
            // aya creates every map in the object and fails the load when
            // one cannot be created; EbpfLoader::allow_unsupported_maps does
            // not help (it only lets aya *wrap* map types it has no Rust
            // type for, after the kernel created them). So on a kernel
            // without ringbuf, CAPTURE_EVENTS is rewritten into a 1-entry
            // ARRAY in a copy of the object. The programs still reference
            // it, but only from the ringbuf branch of `emit`, which the
            // verifier never walks: CAPTURE_TRANSPORT is 1 in frozen .rodata.
            log::info!("kernel has no BPF_MAP_TYPE_RINGBUF: capture uses the perf event array");
            patched = object_without_ringbuf(EBPF_OBJECT)?;
            patched.bytes()
        };
        // Raw tracepoints where the kernel's BTF describes them as the
        // programs expect; classic ones otherwise (and always for pins:
        // bpfloader attaches only classic tracepoints).
        let btf_offsets =
            if cfg.force_classic_tracepoints || pin_to.is_some() || !features.btf_vmlinux {
                None
            } else {
                match btf::task_struct_offsets(Path::new(VMLINUX_BTF)) {
                    Ok(o) => Some(o),
                    Err(e) => {
                        log::info!("{e}; attaching the classic scheduler tracepoints");
                        None
                    }
                }
            };
        let task_offsets = btf_offsets.map(|o| {
            [
                (names::G_TASK_PID, o.pid),
                (names::G_TASK_TGID, o.tgid),
                (names::G_TASK_PRIO, o.prio),
                (names::G_TASK_COMM, o.comm),
                (names::G_TASK_EXIT_STATE, o.exit_state),
            ]
        });
        let mut loader = EbpfLoader::new();
        for (name, off) in task_offsets.iter().flatten() {
            loader.override_global(name, off, true);
        }
        loader
            .override_global(names::G_CAPTURE_TRANSPORT, &transport_flag, true)
            .override_global(names::G_NR_CPUS, &nr_cpus, true)
            .override_global(names::G_WAKE_ARRAY, &wake_array_flag, true)
            .override_global(names::G_TRACK_WAIT, &track_wait_flag, true)
            .map_max_entries(names::TASKS, cfg.limits.max_tasks)
            .map_max_entries(names::WAKE_TS, wake_hash_len)
            .map_max_entries(names::WAKE_TS_ARRAY, wake_array_len)
            .map_max_entries(names::PROCESS_FAULTS, cfg.limits.max_processes)
            .map_max_entries(names::EXITED, cfg.limits.max_exited);
        for (name, off) in &offsets {
            if *name == names::G_FREE_PID && cfg.free_pid_from_record {
                continue;
            }
            loader.override_global(name, off, true);
        }
        for (name, off, _) in &capture_offsets {
            loader.override_global(name, off, true);
        }
        // Without a capture configured the capture maps take their minimum
        // size, so the always-on tier's memory does not grow.
        let sizing = cfg.capture;
        let page = crate::system::page_size_bytes()? as u32;
        loader
            .map_max_entries(
                names::CAPTURE_EVENTS,
                // The ring buffer goes unused with the perf array: minimum.
                match (sizing, transport, ringbuf_ok) {
                    (_, _, false) => 1,
                    (Some(c), CaptureTransport::RingBuf, _) => {
                        c.ring_bytes.max(page).next_power_of_two()
                    }
                    _ => page,
                },
            )
            .map_max_entries(
                names::CAPTURE_STACKS,
                sizing.map_or(1, |c| c.stack_entries.max(1)),
            )
            .map_max_entries(
                names::CAPTURE_FAULT_CTR,
                sizing.map_or(1, |c| c.fault_processes.max(1)),
            );
        let mut ebpf = loader.load(object).map_err(BpfError::Load)?;
        // EbpfLoader::new() parsed vmlinux BTF (aya 0.14 always does, and
        // hides it); free that before parsing it again for the tp_btf
        // loads, so start-up holds one parse at a time, not two.
        drop(loader);
        crate::system::release_free_heap();
        let vmlinux_btf = if btf_offsets.is_some() {
            Btf::from_sys_fs().ok()
        } else {
            None
        };

        let wakeup_new = tracefs.format("sched", "sched_wakeup_new")?;
        let fixed_matches = offsets[0].1 == fixed_layout::SWITCH_PREV_PID
            && offsets[1].1 == fixed_layout::SWITCH_PREV_STATE
            && offsets[2].1 == fixed_layout::SWITCH_NEXT_PID
            && offsets[3].1 == fixed_layout::WAKEUP_PID
            && wakeup_new.offset_of("pid", 4)? == fixed_layout::WAKEUP_PID
            && capture_offsets.iter().all(|(_, off, fixed)| off == fixed);
        let layout = if fixed_matches && !cfg.force_portable_layout {
            TracepointLayout::Fixed
        } else {
            TracepointLayout::Portable
        };
        let mut events = vec!["sched_switch"];
        if cfg.runq_wait {
            events.extend(["sched_wakeup", "sched_wakeup_new"]);
        }
        let mut sched_programs = SchedPrograms::Classic;
        if let (Some(_), Some(btf)) = (&btf_offsets, &vmlinux_btf) {
            // A kernel or policy that refuses them (verifier, LSM) costs
            // the cheaper attach, not the accounting.
            match attach_btf_sched(&mut ebpf, &events, btf) {
                Ok(()) => sched_programs = SchedPrograms::Btf,
                Err(e) => log::warn!("{e}; attaching the classic scheduler tracepoints"),
            }
        }
        drop(vmlinux_btf);
        crate::system::release_free_heap();
        if sched_programs == SchedPrograms::Classic {
            for event in &events {
                let name = sched_program(SchedPrograms::Classic, layout, event);
                attach_tracepoint(&mut ebpf, name, "sched", event, pin_to)?;
            }
        }
        attach_tracepoint(
            &mut ebpf,
            names::PROG_SCHED_PROCESS_FREE,
            "sched",
            "sched_process_free",
            pin_to,
        )?;
        match fault_source {
            FaultSource::Tracepoint => attach_tracepoint(
                &mut ebpf,
                names::PROG_PAGE_FAULT_USER,
                "exceptions",
                "page_fault_user",
                pin_to,
            )?,
            FaultSource::PerfEvent => {
                let cpus = crate::system::online_cpus(std::path::Path::new("/sys"))?;
                attach_perf_sw(
                    &mut ebpf,
                    names::PROG_PERF_MINFLT,
                    SoftwareEvent::PageFaultsMin,
                    &cpus,
                    pin_to,
                )?;
                attach_perf_sw(
                    &mut ebpf,
                    names::PROG_PERF_MAJFLT,
                    SoftwareEvent::PageFaultsMaj,
                    &cpus,
                    pin_to,
                )?;
            }
            FaultSource::None => {}
        }
        if let Some(dir) = pin_to {
            // Internal maps (.rodata, .bss) stay with the programs that use
            // them; bpffs refuses names with a '.' anyway.
            for (name, map) in ebpf.maps().filter(|(n, _)| !n.starts_with('.')) {
                let path = pinned_map_path(dir, name);
                map.pin(&path).map_err(|e| BpfError::Pin {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            }
            log::info!(
                "eBPF programs and maps pinned in {} (not attached)",
                dir.display()
            );
        }
        log::info!(
            "eBPF accounting {}: fault source {}; scheduler programs {}; wakeup times in {}; {} possible CPUs; BTF {}; capture transport {}",
            if pin_to.is_some() { "loaded" } else { "attached" },
            fault_source.describe(),
            match sched_programs {
                SchedPrograms::Btf => "tp_btf".to_string(),
                SchedPrograms::Classic => format!("classic tracepoints, {layout:?} layout"),
            },
            if wake_array { "an array (pid_max small)" } else { "a bounded hash" },
            nr_cpus,
            if features.btf_vmlinux { "yes" } else { "no" },
            match sizing {
                Some(_) => transport.name(),
                None => "none (capture not configured)",
            }
        );
        let ring = load_capture_tier(&mut ebpf, layout, sizing, transport, page)?;
        Ok(Self {
            ebpf: Some(ebpf),
            pinned_maps: HashMap::new(),
            pinned_programs: Vec::new(),
            fault_source,
            features,
            limits: cfg.limits,
            layout,
            sched_programs,
            runq_wait: cfg.runq_wait,
            capture_sizing: sizing,
            transport,
            ring,
            waking_link: None,
            map_read: MapRead::Batch,
        })
    }
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

/// The program for scheduler `event` ("sched_switch", "sched_wakeup",
/// "sched_wakeup_new").
fn sched_program(kind: SchedPrograms, layout: TracepointLayout, event: &str) -> &'static str {
    use names::*;
    let [switch, wakeup, wakeup_new] = match (kind, layout) {
        (SchedPrograms::Btf, _) => [
            PROG_SCHED_SWITCH_BTF,
            PROG_SCHED_WAKEUP_BTF,
            PROG_SCHED_WAKEUP_NEW_BTF,
        ],
        (SchedPrograms::Classic, TracepointLayout::Fixed) => [
            PROG_SCHED_SWITCH_FIXED,
            PROG_SCHED_WAKEUP_FIXED,
            PROG_SCHED_WAKEUP_NEW_FIXED,
        ],
        (SchedPrograms::Classic, TracepointLayout::Portable) => {
            [PROG_SCHED_SWITCH, PROG_SCHED_WAKEUP, PROG_SCHED_WAKEUP_NEW]
        }
    };
    match event {
        "sched_switch" => switch,
        "sched_wakeup" => wakeup,
        _ => wakeup_new,
    }
}

/// Loads (verifies) every tp_btf scheduler program, then attaches them;
/// all or none: on an error the ones loaded are unloaded again, which
/// detaches them.
fn attach_btf_sched(ebpf: &mut Ebpf, events: &[&str], btf: &Btf) -> Result<(), BpfError> {
    let result = (|| {
        for event in events {
            let name = sched_program(SchedPrograms::Btf, TracepointLayout::Fixed, event);
            program::<BtfTracePoint>(ebpf, name)?
                .load(event, btf)
                .map_err(program_err(name))?;
        }
        for event in events {
            let name = sched_program(SchedPrograms::Btf, TracepointLayout::Fixed, event);
            program::<BtfTracePoint>(ebpf, name)?
                .attach()
                .map_err(attach_err(name, format!("tp_btf/{event}")))?;
        }
        Ok(())
    })();
    if result.is_err() {
        for event in events {
            let name = sched_program(SchedPrograms::Btf, TracepointLayout::Fixed, event);
            if let Ok(p) = program::<BtfTracePoint>(ebpf, name) {
                let _ = p.unload();
            }
        }
    }
    result
}

/// Loads `name` and attaches it, or with `pin_to` pins it there instead.
fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &'static str,
    category: &str,
    event: &str,
    pin_to: Option<&Path>,
) -> Result<(), BpfError> {
    let prog: &mut TracePoint = program(ebpf, name)?;
    prog.load().map_err(program_err(name))?;
    if let Some(dir) = pin_to {
        let path = pinned_prog_path(dir, name);
        return prog.pin(&path).map_err(|e| BpfError::Pin {
            path,
            message: e.to_string(),
        });
    }
    prog.attach(category, event)
        .map_err(attach_err(name, format!("tracepoint {category}/{event}")))?;
    Ok(())
}

/// One perf software event per online CPU with sample_period 1, so the
/// program runs on every counted fault, in the faulting task's context.
fn attach_perf_sw(
    ebpf: &mut Ebpf,
    name: &'static str,
    event: SoftwareEvent,
    cpus: &[u32],
    pin_to: Option<&Path>,
) -> Result<(), BpfError> {
    let prog: &mut PerfEvent = program(ebpf, name)?;
    prog.load().map_err(program_err(name))?;
    if let Some(dir) = pin_to {
        let path = pinned_prog_path(dir, name);
        return prog.pin(&path).map_err(|e| BpfError::Pin {
            path,
            message: e.to_string(),
        });
    }
    for &cpu in cpus {
        prog.attach(
            PerfEventConfig::Software(event),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Period(1),
            false,
        )
        .map_err(attach_err(
            name,
            format!("perf software event {event:?} on cpu {cpu}"),
        ))?;
    }
    Ok(())
}
