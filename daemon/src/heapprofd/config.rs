//! A typed heap-profile request, its validation, and the TraceConfig it
//! becomes.
//!
//! The TraceConfig is what a trusted platform component hands to traced
//! through the `perfetto` command-line client: an `android.heapprofd` data
//! source for the native heap, and `linux.process_stats` so RSS (and the
//! ProcessTree that names the profiled pids) sits beside the heap profile.
//!
//! We never set `DataSourceConfig.session_initiator`: traced overwrites it,
//! setting SESSION_INITIATOR_TRUSTED_SYSTEM only when the consumer's uid is
//! 1000 (system) or statsd (see TracingServiceImpl: "session_initiator is set
//! by the service, not the consumer"). Trust therefore comes from running the
//! client as uid 1000, which the runner logs and checks.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::perfetto::protos::{
    self, heapprofd_config::ContinuousDumpConfig, trace_config, DataSourceConfig, HeapprofdConfig,
    ProcessStatsConfig, TraceConfig,
};

/// Name of heapprofd's data source as registered with traced.
pub const HEAPPROFD_DATA_SOURCE: &str = "android.heapprofd";
/// Name of traced_probes' process stats data source.
pub const PROCESS_STATS_DATA_SOURCE: &str = "linux.process_stats";

/// heapprofd's own default (one sample per 4 KiB allocated on average).
pub const DEFAULT_SAMPLING_INTERVAL_BYTES: u64 = 4096;
/// heapprofd's default shared-memory ring between client and heapprofd.
pub const DEFAULT_SHMEM_SIZE_BYTES: u64 = 8 * 1024 * 1024;
/// RSS polling period of linux.process_stats.
pub const DEFAULT_PROC_STATS_POLL_MS: u32 = 1000;
/// Buffer 0: heap dumps. The size Perfetto's own heap_profile script uses
/// (62 MiB): one dump of a large process with many callstacks is tens of MB.
pub const DEFAULT_HEAP_BUFFER_KB: u32 = 63488;
/// Buffer 1: process stats, kept separate so a large final heap dump cannot
/// overwrite the RSS series (and vice versa).
pub const DEFAULT_PROCESS_STATS_BUFFER_KB: u32 = 2048;
/// How long traced waits for data sources to flush at the end. heapprofd
/// dumps the whole profile on flush, which takes seconds for big processes.
pub const DEFAULT_FLUSH_TIMEOUT_MS: u32 = 30_000;
/// traced rejects a session whose unique_session_name is already in use, so
/// this also keeps two vitalsd instances (daemon + CLI) from overlapping.
pub const DEFAULT_UNIQUE_SESSION_NAME: &str = "vitalsd_heapprofd";
/// TraceConfig.bugreport_score of vitalsd's heapprofd sessions: > 0 makes a
/// session that is running when a bugreport is taken eligible for
/// `perfetto --save-for-bugreport` (dumpstate runs it), which saves the
/// session with the highest score. Below Traceur's 500, so a trace a user
/// started on purpose wins over an automatic one.
pub const DEFAULT_BUGREPORT_SCORE: i32 = 100;
/// Default upper bound of a session's duration (configurable).
pub const DEFAULT_MAX_DURATION_MS: u32 = 10 * 60 * 1000;

/// Characters that would make a glob. heapprofd compares names with `==`
/// after normalisation, so a `*` would silently match nothing.
const GLOB_CHARS: &[char] = &['*', '?', '[', ']'];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinuousDump {
    /// Delay before the first dump.
    pub phase_ms: u32,
    /// Period between dumps (leak windows: compare successive dumps).
    pub interval_ms: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptiveSampling {
    /// Shared-memory fill level (bytes) above which heapprofd raises the
    /// sampling interval instead of overrunning the buffer.
    pub shmem_threshold: u64,
    /// Cap on the raised interval; 0 lets heapprofd choose.
    pub max_sampling_interval_bytes: u64,
}

/// Which heaps to record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Heaps {
    /// heapprofd's default: the libc malloc heap only.
    #[default]
    Malloc,
    /// Every heap registered via the heapprofd custom-allocator API.
    All,
    /// These heaps by name (e.g. "libc.malloc", "com.android.art").
    Named(Vec<String>),
}

/// A request for one heapprofd session. Defaults are heapprofd's own, except
/// where noted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeapProfileRequest {
    /// Process names as heapprofd matches them: the normalised cmdline.
    pub process_names: Vec<String>,
    pub pids: Vec<u64>,
    pub duration_ms: u32,
    pub sampling_interval_bytes: u64,
    pub shmem_size_bytes: u64,
    /// Block the target's malloc when the shared buffer is full instead of
    /// dropping the profile; off because it stalls the profiled process.
    pub block_client: bool,
    pub block_client_timeout_us: Option<u32>,
    pub continuous_dump: Option<ContinuousDump>,
    pub heaps: Heaps,
    /// Only profile apps installed by these installers (e.g. com.android.vending).
    pub target_installed_by: Vec<String>,
    /// Guardrails: heapprofd stops profiling (hit_guardrail) past these.
    pub max_heapprofd_memory_kb: Option<u32>,
    pub max_heapprofd_cpu_secs: Option<u64>,
    pub adaptive_sampling: Option<AdaptiveSampling>,
    /// Do not profile processes that start during the session.
    pub no_startup: bool,
    /// Do not profile processes already running.
    pub no_running: bool,
    pub proc_stats_poll_ms: u32,
    pub heap_buffer_kb: u32,
    pub process_stats_buffer_kb: u32,
    pub flush_timeout_ms: u32,
    pub unique_session_name: Option<String>,
    /// > 0 lets a bugreport taken during/after the session pick this trace.
    pub bugreport_score: Option<i32>,
}

impl Default for HeapProfileRequest {
    fn default() -> Self {
        Self {
            process_names: Vec::new(),
            pids: Vec::new(),
            duration_ms: 30_000,
            sampling_interval_bytes: DEFAULT_SAMPLING_INTERVAL_BYTES,
            shmem_size_bytes: DEFAULT_SHMEM_SIZE_BYTES,
            block_client: false,
            block_client_timeout_us: None,
            continuous_dump: None,
            heaps: Heaps::Malloc,
            target_installed_by: Vec::new(),
            max_heapprofd_memory_kb: None,
            max_heapprofd_cpu_secs: None,
            adaptive_sampling: None,
            no_startup: false,
            no_running: false,
            proc_stats_poll_ms: DEFAULT_PROC_STATS_POLL_MS,
            heap_buffer_kb: DEFAULT_HEAP_BUFFER_KB,
            process_stats_buffer_kb: DEFAULT_PROCESS_STATS_BUFFER_KB,
            flush_timeout_ms: DEFAULT_FLUSH_TIMEOUT_MS,
            unique_session_name: Some(DEFAULT_UNIQUE_SESSION_NAME.to_owned()),
            bugreport_score: Some(DEFAULT_BUGREPORT_SCORE),
        }
    }
}

/// Limits the daemon's configuration puts on requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_duration_ms: u32,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_duration_ms: DEFAULT_MAX_DURATION_MS,
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("no target: give at least one process name or pid")]
    NoTarget,
    #[error(
        "process name {name:?} contains {glob:?}: heapprofd matches names exactly, not as globs"
    )]
    Wildcard { name: String, glob: char },
    #[error("process name {name:?} is empty after normalisation")]
    EmptyName { name: String },
    #[error("pid 0 is not a process")]
    PidZero,
    #[error(
        "sampling_interval_bytes must be > 0 (heapprofd default {DEFAULT_SAMPLING_INTERVAL_BYTES})"
    )]
    SamplingIntervalZero,
    #[error("no_running together with no_startup would profile no process at all")]
    NoRunningAndNoStartup,
    #[error("duration must be > 0 ms")]
    DurationZero,
    #[error("duration {requested_ms} ms is above the configured maximum {max_ms} ms")]
    DurationTooLong { requested_ms: u32, max_ms: u32 },
    #[error("heap list is empty; use Heaps::Malloc for the default heap")]
    NoHeaps,
    #[error("continuous dump interval must be > 0 ms")]
    DumpIntervalZero,
}

/// heapprofd's cmdline normalisation (perfetto src/profiling/common/
/// proc_cmdline.cc, `NormalizeCmdLine`): keep the first argument, cut it at
/// the first '@' (Android app processes like "com.foo@1" or zygote-forked
/// "name@variant"), then take what follows the last '/'. The cut happens
/// before the basename, so "/a@b/c" becomes "a".
pub fn normalize_cmdline(cmdline: &str) -> &str {
    let first = cmdline.split('\0').next().unwrap_or("");
    let first = first.split('@').next().unwrap_or("");
    match first.rfind('/') {
        Some(i) => &first[i + 1..],
        None => first,
    }
}

fn normalisation_warning(given: &str, normalised: &str) -> String {
    format!(
        "process name {given:?} is matched as {normalised:?}: heapprofd compares the normalised \
         cmdline (basename of the first argument, cut at the first '@'), so the config names \
         {normalised:?}"
    )
}

impl HeapProfileRequest {
    /// One warning per target name that heapprofd's normalisation changes,
    /// showing both forms; the TraceConfig carries the normalised one, since
    /// the given one could never match.
    pub fn normalisation_warnings(&self) -> Vec<String> {
        self.process_names
            .iter()
            .filter_map(|n| {
                let norm = normalize_cmdline(n);
                (norm != n && !norm.is_empty()).then(|| normalisation_warning(n, norm))
            })
            .collect()
    }

    /// Checks the request against heapprofd's matching rules and our limits.
    /// Returns the first problem found.
    pub fn validate(&self, limits: &RequestLimits) -> Result<(), ConfigError> {
        if self.process_names.is_empty() && self.pids.is_empty() {
            return Err(ConfigError::NoTarget);
        }
        for name in &self.process_names {
            if let Some(glob) = name.chars().find(|c| GLOB_CHARS.contains(c)) {
                return Err(ConfigError::Wildcard {
                    name: name.clone(),
                    glob,
                });
            }
            let normalised = normalize_cmdline(name);
            if normalised.is_empty() {
                return Err(ConfigError::EmptyName { name: name.clone() });
            }
            if normalised != name {
                log::warn!("{}", normalisation_warning(name, normalised));
            }
        }
        if self.pids.contains(&0) {
            return Err(ConfigError::PidZero);
        }
        if self.sampling_interval_bytes == 0 {
            return Err(ConfigError::SamplingIntervalZero);
        }
        if self.no_running && self.no_startup {
            return Err(ConfigError::NoRunningAndNoStartup);
        }
        if self.duration_ms == 0 {
            return Err(ConfigError::DurationZero);
        }
        if self.duration_ms > limits.max_duration_ms {
            return Err(ConfigError::DurationTooLong {
                requested_ms: self.duration_ms,
                max_ms: limits.max_duration_ms,
            });
        }
        if matches!(&self.heaps, Heaps::Named(h) if h.is_empty()) {
            return Err(ConfigError::NoHeaps);
        }
        if matches!(self.continuous_dump, Some(d) if d.interval_ms == 0) {
            return Err(ConfigError::DumpIntervalZero);
        }
        Ok(())
    }

    /// Keys the rate limiter charges: one per target.
    pub fn target_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .process_names
            .iter()
            .map(|n| format!("name:{n}"))
            .chain(self.pids.iter().map(|p| format!("pid:{p}")))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Validates, then builds the TraceConfig.
    pub fn trace_config(&self, limits: &RequestLimits) -> Result<TraceConfig, ConfigError> {
        self.validate(limits)?;
        Ok(self.build_trace_config())
    }

    fn build_trace_config(&self) -> TraceConfig {
        let opt_true = |b: bool| b.then_some(true);
        let (heaps, all_heaps) = match &self.heaps {
            Heaps::Malloc => (Vec::new(), None),
            Heaps::All => (Vec::new(), Some(true)),
            Heaps::Named(h) => (h.clone(), None),
        };
        let heapprofd = HeapprofdConfig {
            sampling_interval_bytes: Some(self.sampling_interval_bytes),
            adaptive_sampling_shmem_threshold: self.adaptive_sampling.map(|a| a.shmem_threshold),
            adaptive_sampling_max_sampling_interval_bytes: self
                .adaptive_sampling
                .map(|a| a.max_sampling_interval_bytes),
            process_cmdline: self
                .process_names
                .iter()
                .map(|n| normalize_cmdline(n).to_owned())
                .collect(),
            pid: self.pids.clone(),
            target_installed_by: self.target_installed_by.clone(),
            heaps,
            all_heaps,
            max_heapprofd_memory_kb: self.max_heapprofd_memory_kb,
            max_heapprofd_cpu_secs: self.max_heapprofd_cpu_secs,
            continuous_dump_config: self.continuous_dump.map(|d| ContinuousDumpConfig {
                dump_phase_ms: Some(d.phase_ms),
                dump_interval_ms: Some(d.interval_ms),
            }),
            shmem_size_bytes: Some(self.shmem_size_bytes),
            // Always explicit, so the config says what we meant even if
            // heapprofd's default ever changes.
            block_client: Some(self.block_client),
            block_client_timeout_us: self.block_client_timeout_us,
            no_startup: opt_true(self.no_startup),
            no_running: opt_true(self.no_running),
            ..Default::default()
        };
        let process_stats = ProcessStatsConfig {
            // A ProcessTree at start names the profiled pids (heapprofd's
            // dumps carry only pids), so the outcome can be matched to names.
            scan_all_processes_on_start: Some(true),
            proc_stats_poll_ms: Some(self.proc_stats_poll_ms),
            ..Default::default()
        };
        let ring = trace_config::buffer_config::FillPolicy::RingBuffer as i32;
        TraceConfig {
            buffers: vec![
                trace_config::BufferConfig {
                    size_kb: Some(self.heap_buffer_kb),
                    fill_policy: Some(ring),
                    ..Default::default()
                },
                trace_config::BufferConfig {
                    size_kb: Some(self.process_stats_buffer_kb),
                    fill_policy: Some(ring),
                    ..Default::default()
                },
            ],
            data_sources: vec![
                trace_config::DataSource {
                    config: Some(DataSourceConfig {
                        name: Some(HEAPPROFD_DATA_SOURCE.to_owned()),
                        target_buffer: Some(0),
                        // session_initiator deliberately unset: see module docs.
                        heapprofd_config: Some(heapprofd),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                trace_config::DataSource {
                    config: Some(DataSourceConfig {
                        name: Some(PROCESS_STATS_DATA_SOURCE.to_owned()),
                        target_buffer: Some(1),
                        process_stats_config: Some(process_stats),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            duration_ms: Some(self.duration_ms),
            // No write_into_file: traced keeps the data in its buffers and
            // the client, as the session's consumer, reads them back over
            // the consumer socket at the end and writes them to its stdout
            // (heapprofd/runner.rs: on Android perfetto and traced may not
            // open our files). A client stopped by SIGTERM still ends the
            // session that way and writes what was collected.
            write_into_file: Some(false),
            flush_timeout_ms: Some(self.flush_timeout_ms),
            unique_session_name: self.unique_session_name.clone(),
            bugreport_score: self.bugreport_score,
            ..Default::default()
        }
    }
}

/// The encoded TraceConfig as the `perfetto --config -` client reads it
/// (binary proto; text would need `--txt`).
pub fn encode(config: &TraceConfig) -> Vec<u8> {
    use prost::Message;
    config.encode_to_vec()
}

/// Finds the heapprofd config inside a TraceConfig (for tests and the fake
/// client).
pub fn heapprofd_config(config: &TraceConfig) -> Option<&protos::HeapprofdConfig> {
    config
        .data_sources
        .iter()
        .filter_map(|d| d.config.as_ref())
        .find(|c| c.name.as_deref() == Some(HEAPPROFD_DATA_SOURCE))
        .and_then(|c| c.heapprofd_config.as_ref())
}
