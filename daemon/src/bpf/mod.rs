//! Loading, attaching and reading the eBPF accounting programs.
//!
//! The kernel side keeps monotonic counters; this module only reads them
//! (plain hashes per task and per process; per-CPU arrays summed over
//! *possible* CPUs) and drains the EXITED map of final counters of freed
//! tasks. It never clears a live map.
//!
//! This file holds the error type, the embedded object and `Accounting`,
//! the handle on the loaded programs and their maps, with its accessors.
//! Its work is spread by concern, one `impl Accounting` each where it has
//! methods: `features` (what the kernel offers), `config` (what the caller
//! asks for), `load` (loading and attaching with aya), `pins` (bpffs pins,
//! attaching bpfloader's), `read` (the counters), `capture_maps` (the
//! capture tier's transport and maps). Their public items are re-exported
//! here, so callers name them `bpf::X`. The public submodules: `tracefs`
//! and `btf` (what load reads about tracepoints and `task_struct`),
//! `batch` (BPF_MAP_LOOKUP_BATCH for read), `totals` (cumulative counters
//! from successive snapshots).

pub mod batch;
pub mod btf;
mod capture_maps;
mod config;
pub mod denied;
mod features;
mod load;
mod pins;
mod read;
pub mod totals;
pub mod tracefs;

use std::{collections::HashMap, path::PathBuf};

use aya::{
    maps::MapError,
    programs::{trace_point::TracePointLinkId, ProgramError},
    Ebpf, EbpfError,
};
use thiserror::Error;

use self::capture_maps::IdleTransport;
pub use self::capture_maps::{
    perf_pages_per_cpu, CaptureOutput, CaptureTransport, CaptureTransportChoice,
};
pub use self::config::{
    exited_entries, AccountingConfig, CaptureMemory, CaptureSizing, FaultSource, FaultSourceChoice,
    MapLimits, PinMode, DEFAULT_EXITS_PER_SECOND, MAX_EXITED, MIN_EXITED,
};
pub use self::features::{
    markdown_table, Feature, FeatureRow, Features, SchedPrograms, TracepointLayout,
};
pub use self::load::WAKE_ARRAY_MAX_PIDS;
pub use self::pins::{bpfloader_prog_path, pinned_map_path, pinned_prog_path};
pub use self::read::{BpfSnapshot, MapRead};
use self::{pins::PinnedProgram, tracefs::TracefsError};

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
    /// A kernel feature every program needs is missing (`features::Feature`).
    #[error("{0}")]
    Unsupported(String),
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
    /// The capture-only sched_waking program's layout, judged apart.
    waking_layout: TracepointLayout,
    sched_programs: SchedPrograms,
    runq_wait: bool,
    capture_sizing: Option<CaptureSizing>,
    /// Where capture records go (meaningful only with `capture_sizing`).
    transport: CaptureTransport,
    /// The transport between captures (None: no capture tier).
    ring: Option<IdleTransport>,
    /// A capture holds the transport's output (`capture_start` lent it).
    capture_lent: bool,
    /// The pinned sched_waking program (attached from pins; None: `ebpf`'s).
    pinned_waking: Option<aya::programs::TracePoint>,
    /// sched_waking link while a capture with FLAG_SCHED runs.
    waking_link: Option<TracePointLinkId>,
    /// How the hashes are read; `Batch` falls back to `Iterate` for
    /// good on a kernel without batch lookups.
    map_read: MapRead,
}

impl Accounting {
    /// Where capture records go (set at load).
    pub fn capture_transport(&self) -> CaptureTransport {
        self.transport
    }

    /// Is `runq_wait_ns` measured? When not, it is not zero but unknown.
    pub fn runq_wait(&self) -> bool {
        self.runq_wait
    }

    /// The classic always-on programs' layout (the scheduler programs
    /// when `sched_programs` is `Classic`).
    pub fn layout(&self) -> TracepointLayout {
        self.layout
    }

    /// The layout of sched_waking, attached during captures.
    pub fn waking_layout(&self) -> TracepointLayout {
        self.waking_layout
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
