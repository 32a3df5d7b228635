//! Recordings: `vitalsd record` (the pipeline for a bounded window with
//! the trace-file sink, `Recording`) and a daemon capture's window (the
//! same sink fed the daemon's ticks, `record_fed`), streamed into a
//! Perfetto trace, with a summary (`vitalsd record`'s top table).

use std::{
    fs::File,
    io::BufWriter,
    path::PathBuf,
    sync::{atomic::AtomicBool, mpsc},
    time::{Duration, Instant},
};

use thiserror::Error;

pub mod backend;
mod recording;
mod summary;
mod tier;

use self::recording::Recording;
pub use self::summary::{RecordSummary, SummaryRow};
use self::tier::Tier;

use crate::{
    accounting::{self, CounterOrigin},
    bpf::{
        self,
        denied::{self, ProcOnly},
        AccountingConfig, BpfError, FaultSource, Opened,
    },
    events::{EventOptions, EventsError},
    perfetto::{PerfettoError, TraceWriter},
    pipeline::Pipeline,
    privileges::{self, PrivilegeError},
    procfs::sampler::SamplerError,
    sources::{ebpf::Programs, Tick},
    system::{self, SystemError},
};

#[derive(Debug, Error)]
pub enum RecordError {
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error(transparent)]
    Perfetto(#[from] PerfettoError),
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error(transparent)]
    System(#[from] SystemError),
    #[error(transparent)]
    Procfs(#[from] SamplerError),
    #[error(transparent)]
    Capture(#[from] EventsError),
    /// A capture records kernel events, which only the eBPF programs see.
    #[error(
        "a capture needs eBPF, but accounting is {0}; without eBPF, a running daemon's \
         captures (`vitalsctl capture`, rules) record through Perfetto's own data sources \
         (capture.backend = \"auto\" or \"perfetto\")"
    )]
    CaptureNeedsBpf(ProcOnly),
    /// The daemon's tick a fed recording was to take failed (its read
    /// error, as the daemon logged it).
    #[error("{0}")]
    Sample(String),
    #[error("creating trace file {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub duration: Duration,
    pub out: PathBuf,
    pub interval: Duration,
    pub proc_root: PathBuf,
    /// Drop to `privileges::STEADY_STATE_CAPS` after attaching.
    pub drop_privileges: bool,
    /// High-fidelity capture for the whole recording (`--sched`,
    /// `--faults`); needs `accounting.capture` sizing.
    pub capture: EventOptions,
    /// Stop once the trace holds this many bytes (checked after each
    /// sample, so it may pass the cap by one interval's packets; the store
    /// cuts a committed capture at its own limit). None: no cap.
    pub max_bytes: Option<u64>,
}

/// Runs until `duration` passes or `stop` is set; whoever sets `stop`
/// should unpark the calling thread so it notices at once. Loads its own
/// programs as `accounting` asks (`opts.capture` needs its `capture`
/// sizing), or runs /proc-only when BPF is denied or not asked for.
pub fn record(
    accounting: &AccountingConfig,
    opts: &RecordOptions,
    stop: &AtomicBool,
) -> Result<RecordSummary, RecordError> {
    let programs = match bpf::open(accounting).inspect_err(|e| log::debug!("loading: {e:#?}"))? {
        Opened::Ebpf(acc) => Ok(Programs::new(acc)),
        Opened::ProcOnly(why) => {
            log_proc_only(&why, "recording");
            Err(why)
        }
    };
    let attached = attach(opts, programs.clone())?;
    let hz = system::clock_ticks_per_second()?;
    // Declared before the recording, so dropped after it: an error drops
    // the writer and the capture before the programs.
    let mut pipeline = Pipeline::open(&opts.proc_root, hz, programs.ok());
    if let Some(e) = pipeline.scan_only().procfs_error.take() {
        return Err(e.into());
    }
    let origin = pipeline.origin();
    let mut recording = Recording::start(attached, pipeline.last(), origin, |_| Ok(()))?;
    recording.run(opts, stop, &mut pipeline)?;
    recording.finish(opts, pipeline.summary())
}

/// The trace file writer of a recording.
pub type FileTraceWriter = TraceWriter<BufWriter<File>>;

/// What a recording fed by a pipeline running elsewhere (the daemon's)
/// takes: the programs (/proc-only: why there are none), the last tick
/// before it (naming the processes alive), where its counters come from,
/// and each tick from now on (a failed one: why).
pub struct Feed {
    pub programs: Result<Programs, ProcOnly>,
    pub first: Tick,
    pub origin: Option<CounterOrigin>,
    pub ticks: mpsc::Receiver<Result<Tick, String>>,
}

/// A recording attached to a running pipeline for a daemon capture's
/// window: the capture tier (`opts.capture`) switched on in the
/// daemon's own programs, whose capture sizing was set when they loaded;
/// /proc-only, a capture fails with `CaptureNeedsBpf`. It takes the
/// pipeline's ticks until the first one at or after `duration`, until
/// `max_bytes`, or until the feed ends (the daemon stops); `prelude`
/// writes extra packets right after the trace's header (a triggered
/// capture writes the history that led to it).
pub fn record_fed(
    feed: Feed,
    opts: &RecordOptions,
    prelude: impl FnOnce(&mut FileTraceWriter) -> Result<(), PerfettoError>,
) -> Result<RecordSummary, RecordError> {
    let Feed {
        programs,
        first,
        origin,
        ticks,
    } = feed;
    let attached = attach(opts, programs)?;
    let mut recording = Recording::start(attached, &first, origin, prelude)?;
    let deadline = Instant::now() + opts.duration;
    // Blocks until the daemon's next tick; a dropped sender (the daemon
    // stopping, or cutting the capture) ends the recording.
    while let Ok(tick) = ticks.recv() {
        recording.take(&tick.map_err(RecordError::Sample)?)?;
        if Instant::now() >= deadline || recording.reached(opts.max_bytes) {
            break;
        }
    }
    recording.finish(opts, Vec::new())
}

/// What `attach` leaves for the rest of the recording.
struct Attached {
    /// No accounting: /proc-only, for the reason in `proc_only`.
    tier: Tier,
    proc_only: Option<ProcOnly>,
    file: File,
    capabilities_after_attach: Option<String>,
}

/// Everything that needs the privileges the daemon starts with, in the
/// order it needs them (the programs are loaded and attached already):
/// create the trace file, start the capture; then drop to the
/// steady-state capabilities.
fn attach(
    opts: &RecordOptions,
    accounting: Result<Programs, ProcOnly>,
) -> Result<Attached, RecordError> {
    let proc_only = accounting.as_ref().err().cloned();
    // Before the capability drop: afterwards root may no longer be able to
    // create it (no CAP_DAC_OVERRIDE). After the load, so a failed load
    // leaves no empty trace behind.
    let file = File::create(&opts.out).map_err(|source| RecordError::Create {
        path: opts.out.clone(),
        source,
    })?;
    // Before the capability drop: starting a capture attaches sched_waking.
    // /proc-only, a capture is `CaptureNeedsBpf`.
    let tier = Tier::start(accounting, &opts.capture, &opts.proc_root)?;
    let capabilities_after_attach = if opts.drop_privileges {
        // Symbolising another process's stack reads its /proc/<pid>/maps,
        // which ptrace_may_access() guards: keep CAP_SYS_PTRACE for that.
        let mut keep = privileges::STEADY_STATE_CAPS.to_vec();
        if opts.capture.events.faults || opts.capture.offcpu.is_some() {
            keep.push(caps::Capability::CAP_SYS_PTRACE);
        }
        // Kernel frames of off-CPU stacks: /proc/kallsyms shows addresses
        // (kallsyms_show_value) only with CAP_SYSLOG at kptr_restrict 0
        // or 1, unless perf_event_paranoid <= 1; never at 2.
        if opts.capture.offcpu.is_some() {
            keep.push(caps::Capability::CAP_SYSLOG);
        }
        let left = privileges::drop_to(&keep)?;
        Some(privileges::describe(&left))
    } else {
        None
    };
    Ok(Attached {
        tier,
        proc_only,
        file,
        capabilities_after_attach,
    })
}

/// "ebpf", or "proc-only (bpf denied: …)": the mode as status and the
/// summary state it.
pub fn accounting_mode(proc_only: Option<&ProcOnly>) -> String {
    match proc_only {
        None => "ebpf".into(),
        Some(why) => why.to_string(),
    }
}

/// The trace's note of the accounting mode and, /proc-only, of what the
/// trace lacks.
fn accounting_note(
    proc_only: Option<&ProcOnly>,
    fault_source: FaultSource,
    origin: Option<CounterOrigin>,
) -> String {
    let tier = crate::accounting::tier_of(origin);
    match proc_only {
        None => format!(
            "accounting: ebpf; tier {}: {}; faults from {}",
            tier.name(),
            tier.gives(),
            fault_source.name()
        ),
        Some(why) => format!(
            "accounting: {why}; tier {}: {}; unavailable: {}",
            tier.name(),
            tier.gives(),
            match tier {
                accounting::Tier::Ticks => denied::PROC_ONLY_MISSING,
                _ => denied::CTS_MISSING,
            }
        ),
    }
}

/// The one line saying BPF is off and why.
pub fn log_proc_only(why: &ProcOnly, what: &str) {
    match why {
        ProcOnly::Asked => log::info!("{what} /proc-only, as configured (accounting = proc)"),
        ProcOnly::Denied(denied) => log::warn!(
            "BPF denied: {denied}; {what} /proc-only, without {}",
            denied::PROC_ONLY_MISSING
        ),
    }
}

#[cfg(test)]
mod tests;
