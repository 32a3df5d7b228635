//! Loading the embedded object with aya and attaching it: the fault
//! source, the scheduler programs (tp_btf where the kernel's BTF allows,
//! else classic tracepoints in the fixed or portable layout), the
//! load-time settings (tracefs field offsets, map sizes, frozen globals),
//! and with `PinMode::PinTo` pinning everything instead of attaching.

use std::{collections::HashMap, path::Path};

use aya::{
    programs::{perf_event::SoftwareEvent, BtfTracePoint, PerfEvent},
    Btf, Ebpf, EbpfLoader,
};
use vitals_common::{fixed_layout, names};

use super::{
    attach::{attach_perf_sw, attach_tracepoint, pin_maps},
    attach_err, btf,
    capture_maps::{capture_map_sizes, load_capture_tier, object_without_ringbuf, AlignedObject},
    features::{self, log_missing, possible_cpu_count, read_pid_max, Feature, VMLINUX_BTF},
    object::{pinned_map_path, sched_program, EBPF_OBJECT},
    program, program_err,
    tracefs::Tracefs,
    Accounting, AccountingConfig, BpfError, CaptureTransport, FaultSource, FaultSourceChoice,
    Features, MapRead, PinMode, SchedPrograms, TracepointLayout,
};

/// Above this pid_max the wakeup array would cost more than 2 MiB; use the
/// bounded hash instead (systemd hosts set pid_max to 4194304).
pub const WAKE_ARRAY_MAX_PIDS: u32 = 1 << 18;

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
        let sched_programs = attach_sched(
            &mut ebpf,
            cfg.runq_wait,
            layout,
            settings.btf_offsets.is_some(),
            pin_to,
        )?;
        let fault_source = attach_fault_source(&mut ebpf, fault_source, cfg.fault_source, pin_to)?;
        if let Some(dir) = pin_to {
            pin_maps(&ebpf, dir)?;
        }
        log::info!(
            "eBPF accounting {}: fault source {}; scheduler programs {}; wakeup times in {}; {} possible CPUs; BTF {}; capture transport {}",
            if pin_to.is_some() { "loaded" } else { "attached" },
            fault_source.describe(),
            match sched_programs {
                SchedPrograms::Btf => "tp_btf".to_string(),
                SchedPrograms::Classic => format!("classic tracepoints, {layout:?} layout"),
            },
            if settings.wake_array { "an array (pid_max small)" } else { "a bounded hash" },
            settings.nr_cpus,
            if features.btf_vmlinux { "yes" } else { "no" },
            match cfg.capture {
                Some(_) => settings.transport.name(),
                None => "none (capture not configured)",
            }
        );
        let ring = load_capture_tier(
            &mut ebpf,
            waking_layout,
            cfg.capture,
            settings.transport,
            settings.page,
            pin_to,
        )?;
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
            capture_sizing: cfg.capture,
            transport: settings.transport,
            ring,
            capture_lent: false,
            pinned_waking: None,
            waking_link: None,
            map_read: MapRead::Batch,
        })
    }
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

/// Tracepoint field offsets from the tracefs format files, which the
/// classic programs get as globals.
struct FieldOffsets {
    /// Fields the always-on programs read.
    sched: [(&'static str, u32); 5],
    /// Fields the capture records copy, with the offset `fixed_layout`
    /// expects each at.
    capture: [(&'static str, u32, u32); 7],
}

impl FieldOffsets {
    fn read(tracefs: &Tracefs) -> Result<Self, BpfError> {
        let switch = tracefs.format("sched", "sched_switch")?;
        let wakeup = tracefs.format("sched", "sched_wakeup")?;
        let free = tracefs.format("sched", "sched_process_free")?;
        let waking = tracefs.format("sched", "sched_waking")?;
        let capture = [
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
        let sched = [
            (names::G_SWITCH_PREV_PID, switch.offset_of("prev_pid", 4)?),
            (
                names::G_SWITCH_PREV_STATE,
                switch.offset_of("prev_state", 8)?,
            ),
            (names::G_SWITCH_NEXT_PID, switch.offset_of("next_pid", 4)?),
            (names::G_WAKEUP_PID, wakeup.offset_of("pid", 4)?),
            (names::G_FREE_PID, free.offset_of("pid", 4)?),
        ];
        Ok(Self { sched, capture })
    }

    /// `Fixed` where every field the always-on programs read sits where
    /// `fixed_layout` says (sched_switch, including the fields it copies
    /// into capture records, and sched_wakeup(_new)'s pid), unless a test
    /// forces the portable programs. sched_waking is judged apart
    /// (`waking_layout`): it is capture-only, and before Linux 5.14 its
    /// template still had `success` at 32, pushing `target_cpu` to 36,
    /// which must not cost the always-on programs their fast layout.
    fn layout(
        &self,
        tracefs: &Tracefs,
        force_portable: bool,
    ) -> Result<TracepointLayout, BpfError> {
        let wakeup_new = tracefs.format("sched", "sched_wakeup_new")?;
        let fixed_matches = self.sched[0].1 == fixed_layout::SWITCH_PREV_PID
            && self.sched[1].1 == fixed_layout::SWITCH_PREV_STATE
            && self.sched[2].1 == fixed_layout::SWITCH_NEXT_PID
            && self.sched[3].1 == fixed_layout::WAKEUP_PID
            && wakeup_new.offset_of("pid", 4)? == fixed_layout::WAKEUP_PID
            && self.capture[..SWITCH_CAPTURE_FIELDS]
                .iter()
                .all(|(_, off, fixed)| off == fixed);
        Ok(if fixed_matches && !force_portable {
            TracepointLayout::Fixed
        } else {
            TracepointLayout::Portable
        })
    }

    /// The layout of the capture-only sched_waking program.
    fn waking_layout(&self, force_portable: bool) -> TracepointLayout {
        let fixed_matches = self.capture[SWITCH_CAPTURE_FIELDS..]
            .iter()
            .all(|(_, off, fixed)| off == fixed);
        if fixed_matches && !force_portable {
            TracepointLayout::Fixed
        } else {
            TracepointLayout::Portable
        }
    }
}

/// `FieldOffsets::capture` lists sched_switch's fields first, then
/// sched_waking's.
const SWITCH_CAPTURE_FIELDS: usize = 3;

/// What the load sets in the object besides the field offsets, chosen
/// from the config and the kernel before anything is loaded.
struct LoadSettings {
    /// Possible CPUs (for the log line; per-CPU maps are sized by aya).
    nr_cpus: u32,
    /// Wakeup times in the array indexed by tid, not the bounded hash.
    wake_array: bool,
    wake_array_len: u32,
    wake_hash_len: u32,
    ringbuf_ok: bool,
    transport: CaptureTransport,
    /// The object rewritten without BPF_MAP_TYPE_RINGBUF, where the kernel
    /// has none; None: the embedded object as it is.
    patched: Option<AlignedObject>,
    /// `struct task_struct` offsets for the tp_btf programs; None: attach
    /// the classic tracepoints.
    btf_offsets: Option<btf::TaskStructOffsets>,
    page: u32,
}

impl LoadSettings {
    fn choose(
        cfg: &AccountingConfig,
        features: &Features,
        pinning: bool,
    ) -> Result<Self, BpfError> {
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
        // Only the capture tier uses CAPTURE_EVENTS, but the map exists in
        // the object whatever runs, so probe even without a capture.
        let ringbuf_ok = features::ringbuf_map_supported(cfg.assume_no_ringbuf);
        let transport = CaptureTransport::choose(cfg.capture.map(|c| c.transport), ringbuf_ok)?;
        let patched = if ringbuf_ok {
            None
        } else {
            // aya creates every map in the object and fails the load when
            // one cannot be created; EbpfLoader::allow_unsupported_maps does
            // not help (it only lets aya *wrap* map types it has no Rust
            // type for, after the kernel created them). So on a kernel
            // without ringbuf, CAPTURE_EVENTS is rewritten into a 1-entry
            // ARRAY in a copy of the object. The programs still reference
            // it, but only from the ringbuf branch of `emit`, which the
            // verifier never walks: CAPTURE_TRANSPORT is 1 in frozen .rodata.
            log_missing(Feature::RingBuf, "the kernel refused to create one");
            Some(object_without_ringbuf(EBPF_OBJECT)?)
        };
        Ok(Self {
            nr_cpus,
            wake_array,
            wake_array_len,
            wake_hash_len,
            ringbuf_ok,
            transport,
            patched,
            btf_offsets: choose_btf_offsets(cfg, features, pinning),
            page: crate::system::page_size_bytes()? as u32,
        })
    }

    /// The globals the load freezes in .rodata, as (name, value).
    fn globals(&self, cfg: &AccountingConfig, offsets: &FieldOffsets) -> Vec<(&'static str, u32)> {
        let mut globals = Vec::new();
        if let Some(o) = self.btf_offsets {
            globals.extend([
                (names::G_TASK_PID, o.pid),
                (names::G_TASK_TGID, o.tgid),
                (names::G_TASK_PRIO, o.prio),
                (names::G_TASK_COMM, o.comm),
                (names::G_TASK_EXIT_STATE, o.exit_state),
            ]);
        }
        globals.extend([
            (names::G_CAPTURE_TRANSPORT, self.transport.rodata()),
            (names::G_WAKE_ARRAY, u32::from(self.wake_array)),
            (names::G_TRACK_WAIT, u32::from(cfg.runq_wait)),
        ]);
        let free_pid_unset = |name: &str| name == names::G_FREE_PID && cfg.free_pid_from_record;
        globals.extend(
            offsets
                .sched
                .iter()
                .filter(|(name, _)| !free_pid_unset(name)),
        );
        globals.extend(offsets.capture.iter().map(|&(name, off, _)| (name, off)));
        globals
    }

    /// Every map's max_entries.
    fn map_sizes(&self, cfg: &AccountingConfig) -> [(&'static str, u32); 8] {
        let [events, stacks, fault_ctr] =
            capture_map_sizes(cfg.capture, self.transport, self.ringbuf_ok, self.page);
        [
            (names::TASKS, cfg.limits.max_tasks),
            (names::WAKE_TS, self.wake_hash_len),
            (names::WAKE_TS_ARRAY, self.wake_array_len),
            (names::PROCESS_FAULTS, cfg.limits.max_processes),
            (names::EXITED, cfg.limits.max_exited),
            events,
            stacks,
            fault_ctr,
        ]
    }

    /// Loads the object with these settings and `offsets`: creates the
    /// maps and leaves the programs unloaded.
    fn load(&self, cfg: &AccountingConfig, offsets: &FieldOffsets) -> Result<Ebpf, BpfError> {
        let globals = self.globals(cfg, offsets);
        let mut loader = EbpfLoader::new();
        for (name, value) in &globals {
            loader.override_global(name, value, true);
        }
        for (name, entries) in self.map_sizes(cfg) {
            loader.map_max_entries(name, entries);
        }
        let object = self
            .patched
            .as_ref()
            .map_or(EBPF_OBJECT, AlignedObject::bytes);
        let ebpf = loader.load(object).map_err(BpfError::Load)?;
        // EbpfLoader::new() parsed vmlinux BTF (aya 0.14 always does, and
        // hides it); free that before attach_sched parses it again for the
        // tp_btf loads, so start-up holds one parse at a time, not two.
        drop(loader);
        crate::system::release_free_heap();
        Ok(ebpf)
    }
}

/// Raw tracepoints where the kernel's BTF describes them as the programs
/// expect; classic ones otherwise (and always for pins: bpfloader attaches
/// only classic tracepoints).
fn choose_btf_offsets(
    cfg: &AccountingConfig,
    features: &Features,
    pinning: bool,
) -> Option<btf::TaskStructOffsets> {
    if cfg.force_classic_tracepoints || pinning {
        return None;
    }
    if !features.btf_vmlinux {
        log_missing(Feature::KernelBtf, format!("no {VMLINUX_BTF}"));
        return None;
    }
    match btf::task_struct_offsets(Path::new(VMLINUX_BTF)) {
        Ok(o) => Some(o),
        Err(e @ btf::BtfError::Prototype { .. }) => {
            log_missing(Feature::BtfSchedSwitch, e);
            None
        }
        Err(e) => {
            log_missing(Feature::KernelBtf, e);
            None
        }
    }
}

/// Attaches sched_switch, and with `runq_wait` sched_wakeup and
/// sched_wakeup_new: as tp_btf programs with `try_btf` where the kernel
/// takes them, else as classic tracepoints in `layout` (with `pin_to`
/// pinned there instead).
fn attach_sched(
    ebpf: &mut Ebpf,
    runq_wait: bool,
    layout: TracepointLayout,
    try_btf: bool,
    pin_to: Option<&Path>,
) -> Result<SchedPrograms, BpfError> {
    let mut events = vec!["sched_switch"];
    if runq_wait {
        events.extend(["sched_wakeup", "sched_wakeup_new"]);
    }
    let vmlinux_btf = if try_btf {
        match Btf::from_sys_fs() {
            Ok(btf) => Some(btf),
            Err(e) => {
                log_missing(Feature::KernelBtf, format!("parsing {VMLINUX_BTF}: {e}"));
                None
            }
        }
    } else {
        None
    };
    let mut sched_programs = SchedPrograms::Classic;
    if let Some(btf) = &vmlinux_btf {
        // A kernel or policy that refuses them (verifier, LSM) costs
        // the cheaper attach, not the accounting.
        match attach_btf_sched(ebpf, &events, btf) {
            Ok(()) => sched_programs = SchedPrograms::Btf,
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
        for event in &events {
            let name = sched_program(SchedPrograms::Classic, layout, event);
            attach_tracepoint(ebpf, name, "sched", event, pin_to)?;
        }
    }
    Ok(sched_programs)
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
