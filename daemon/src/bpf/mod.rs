//! Loading, attaching and reading the eBPF accounting programs.
//!
//! The kernel side keeps monotonic counters; this module only reads them
//! (summing per-CPU slots over *possible* CPUs) and drains the EXITED map of
//! final counters of freed tasks. It never clears a live map.

pub mod batch;
pub mod btf;
mod capture_maps;
mod config;
mod features;
mod pins;
mod read;
pub mod totals;
pub mod tracefs;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use aya::{
    maps::MapError,
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        trace_point::TracePointLinkId,
        BtfTracePoint, PerfEvent, ProgramError, TracePoint,
    },
    Btf, Ebpf, EbpfError, EbpfLoader,
};
use thiserror::Error;
use vitals_common::{fixed_layout, names};

pub use self::capture_maps::{
    perf_pages_per_cpu, CaptureOutput, CaptureTransport, CaptureTransportChoice,
};
pub use self::config::{
    AccountingConfig, CaptureSizing, FaultSource, FaultSourceChoice, MapLimits, PinMode,
};
pub use self::features::{Features, SchedPrograms, TracepointLayout};
pub use self::pins::{bpfloader_prog_path, pinned_map_path, pinned_prog_path};
pub use self::read::{BpfSnapshot, MapRead};
use self::{
    capture_maps::{load_capture_tier, object_without_ringbuf},
    features::{possible_cpu_count, read_pid_max, VMLINUX_BTF},
    pins::PinnedProgram,
    tracefs::{Tracefs, TracefsError},
};

/// The object built from `ebpf-programs/` by build.rs, 8-byte aligned as
/// the ELF parser wants (aya's include_bytes_aligned!).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("VITALS_EBPF_OBJ"));

#[derive(Debug, Error)]
pub enum BpfError {
    #[error(
        "loading eBPF needs {missing} (effective capabilities: {have}); run as root or grant them \
         (on Android user builds only bpfloader may load programs)"
    )]
    MissingCapabilities { missing: String, have: String },
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error("loading the eBPF object: {0} (loading BPF needs CAP_BPF and CAP_PERFMON, or root)")]
    Load(#[source] EbpfError),
    #[error("eBPF program `{name}`: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("attaching `{name}` to {target}: {source}")]
    Attach {
        name: &'static str,
        target: String,
        #[source]
        source: ProgramError,
    },
    #[error("pinning {path}: {message} (is a bpffs mounted there?)")]
    Pin { path: PathBuf, message: String },
    #[error("eBPF object has no map or program `{0}`")]
    Missing(&'static str),
    #[error("eBPF map `{name}`: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("the kernel has no tracepoint {0}; vitalsd cannot account scheduling without it")]
    NoTracepoint(&'static str),
    #[error("fault source `tracepoint` was requested but exceptions/page_fault_user does not exist on this kernel (arm64 has none); use `perf` or `auto`")]
    NoFaultTracepoint,
    #[error(transparent)]
    System(#[from] crate::system::SystemError),
    #[error(
        "capture requested but the capture maps were not sized at load (AccountingConfig::capture)"
    )]
    CaptureNotConfigured,
    #[error("a capture is already running")]
    CaptureRunning,
    #[error("capture transport `ringbuf` was requested but this kernel has no BPF_MAP_TYPE_RINGBUF (Linux 5.8+); use `perf` or `auto`")]
    NoRingBuf,
    #[error("opening the capture perf buffer of cpu {cpu}: {message}")]
    PerfBuffer { cpu: u32, message: String },
    #[error("reading map {name}: {source}")]
    Batch {
        name: &'static str,
        #[source]
        source: batch::BatchError,
    },
}

/// Above this pid_max the wakeup array would cost more than 2 MiB; use the
/// bounded hash instead (systemd hosts set pid_max to 4194304).
pub const WAKE_ARRAY_MAX_PIDS: u32 = 1 << 18;

/// The loaded and attached accounting programs.
pub struct Accounting {
    /// The aya object (None when attached from pins).
    ebpf: Option<Ebpf>,
    /// Maps opened from pins; looked up before `ebpf`'s.
    pinned_maps: HashMap<&'static str, aya::maps::Map>,
    /// Programs opened from pins; dropping one detaches its links.
    #[allow(dead_code)]
    pinned_programs: Vec<PinnedProgram>,
    fault_source: FaultSource,
    features: Features,
    limits: MapLimits,
    layout: TracepointLayout,
    sched_programs: SchedPrograms,
    runq_wait: bool,
    capture_sizing: Option<CaptureSizing>,
    /// Where capture records go (meaningful only with `capture_sizing`).
    transport: CaptureTransport,
    /// The transport's buffers, while no capture holds them.
    ring: Option<CaptureOutput>,
    /// sched_waking link while a capture with FLAG_SCHED runs.
    waking_link: Option<TracePointLinkId>,
    /// How per-CPU hashes are read; `Batch` falls back to `Iterate` for
    /// good on a kernel without batch lookups.
    map_read: MapRead,
}

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

    /// Where capture records go (set at load).
    pub fn capture_transport(&self) -> CaptureTransport {
        self.transport
    }

    /// Is `runq_wait_ns` measured? When not, it is not zero but unknown.
    pub fn runq_wait(&self) -> bool {
        self.runq_wait
    }

    /// The classic programs' layout (sched_waking during captures, and the
    /// scheduler programs when `sched_programs` is `Classic`).
    pub fn layout(&self) -> TracepointLayout {
        self.layout
    }

    pub fn sched_programs(&self) -> SchedPrograms {
        self.sched_programs
    }

    pub fn fault_source(&self) -> FaultSource {
        self.fault_source
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    pub fn limits(&self) -> MapLimits {
        self.limits
    }

    fn map(&self, name: &'static str) -> Result<&aya::maps::Map, BpfError> {
        self.pinned_maps
            .get(name)
            .or_else(|| self.ebpf.as_ref().and_then(|e| e.map(name)))
            .ok_or(BpfError::Missing(name))
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut aya::maps::Map, BpfError> {
        if self.pinned_maps.contains_key(name) {
            return self
                .pinned_maps
                .get_mut(name)
                .ok_or(BpfError::Missing(name));
        }
        self.ebpf
            .as_mut()
            .and_then(|e| e.map_mut(name))
            .ok_or(BpfError::Missing(name))
    }

    /// Where the programs came from: "pins" or "aya".
    pub fn source(&self) -> &'static str {
        if self.ebpf.is_none() {
            "pins"
        } else {
            "aya"
        }
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

fn map_err(name: &'static str) -> impl Fn(MapError) -> BpfError {
    move |source| BpfError::Map { name, source }
}

fn program_err(name: &'static str) -> impl FnOnce(ProgramError) -> BpfError {
    move |source| BpfError::Program { name, source }
}

fn attach_err(
    name: &'static str,
    target: impl Into<String>,
) -> impl FnOnce(ProgramError) -> BpfError {
    let target = target.into();
    move |source| BpfError::Attach {
        name,
        target,
        source,
    }
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

/// Program `name` of the object, as its program type.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, BpfError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(BpfError::Missing(name))?
        .try_into()
        .map_err(program_err(name))
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
