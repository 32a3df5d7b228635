//! Loading, attaching and reading the eBPF accounting programs, split the
//! way aya splits aya-obj from aya.
//!
//! The kernel side keeps monotonic counters; this module only reads them
//! (plain hashes per task and per process; per-CPU arrays summed over
//! *possible* CPUs) and drains the EXITED map of final counters of freed
//! tasks. It never clears a live map.
//!
//! - `object`: what needs no kernel, unit-tested without root: the
//!   embedded object and its layout (which program serves which event,
//!   the maps each path reads, pin names, map sizes), the object rewrite
//!   for kernels without ringbuf, BTF parsing (`object::btf`), tracepoint
//!   format parsing (`object::format`) and the kernel feature table
//!   (`object::feature_table`);
//! - `features` and `tracefs`: probing this kernel and reading its
//!   tracefs, for the load;
//! - `programs`: the handle, `Accounting`: loading and attaching with aya,
//!   attaching bpfloader's pins, the links, the capture tier's kernel end;
//! - `mapped`: the arrays read through mmap, not bpf() (no blind
//!   windows from our own reads);
//! - `counters`: reading the maps (`Accounting::read`) and folding what
//!   was read (`counters::totals`);
//! - `config` (what the caller asks for), `denied` (`open`: eBPF, or
//!   /proc-only and why).
//!
//! The capture transport that drives the capture tier (lending its
//! output, the capture flag, the stack map) is `events::transport`'s.
//! This file holds the error type; the public items are re-exported here,
//! so callers name them `bpf::X`.

mod config;
pub mod counters;
pub mod denied;
mod features;
pub mod mapped;
pub mod object;
mod programs;
mod stale;
pub mod tracefs;

use std::path::PathBuf;

use aya::{maps::MapError, programs::ProgramError, EbpfError};
use thiserror::Error;

pub use self::config::{
    capture_ring_bytes, exited_entries, AccountingChoice, AccountingConfig, EventMemory,
    EventSizing, EventTransportChoice, FaultSourceChoice, MachineBounds, MapLimits, OffcpuSettings,
    PinMode, DEFAULT_EXITS_PER_SECOND, DEFAULT_STACK_ENTRIES, MAX_EXITED, MIN_EXITED,
};
pub use self::counters::{totals, BpfSnapshot};
pub use self::denied::{open, Opened, ProcOnly};
pub use self::features::Features;
pub use self::object::{
    bpfloader_prog_path,
    feature_table::{markdown_table, Feature, FeatureRow},
    perf_pages_per_cpu, pinned_map_path, pinned_prog_path, EventTransport, MapRead, SchedPrograms,
    TracepointLayout,
};
pub(crate) use self::programs::IdleTransport;
pub use self::programs::{memory, Accounting, WAKE_ARRAY_MAX_PIDS};
use self::tracefs::TracefsError;
pub use crate::accounting::FaultSource;

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
        source: counters::batch::BatchError,
    },
    #[error(transparent)]
    Mapped(#[from] mapped::MappedError),
    #[error("reading {path}: {source}")]
    Kallsyms {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no kernel text symbol {symbol} (or a specialised copy of it) in {path}")]
    NoSymbol { symbol: &'static str, path: PathBuf },
}

pub(crate) fn map_err(name: &'static str) -> impl Fn(MapError) -> BpfError {
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
