//! Native-heap profiles of a named process through Perfetto's heapprofd,
//! started the way a trusted platform component does.
//!
//! - [`config`]: the typed request, its validation, and the TraceConfig it
//!   becomes (android.heapprofd + linux.process_stats);
//! - [`runner`]: one session at a time, with timeout and cancellation,
//!   through the configured consumer route: `client` runs
//!   `perfetto --config - --out -` with the binary config on stdin and a
//!   trace file it opened as stdout; [`in_process`] (`producer` feature)
//!   is traced's consumer itself through the Perfetto SDK and writes the
//!   trace it reads back into the same file;
//! - [`route`]: what the runner and both routes share (the route choice,
//!   settings, errors, how a session ended, the trace file it fills);
//! - [`ratelimit`]: persisted per-target and system-wide limits;
//! - [`outcome`]: heapprofd's per-process verdict read back from the trace,
//!   stored with the config in `<trace>.meta.json`.
//!
//! Trust: traced sets DataSourceConfig.session_initiator to
//! SESSION_INITIATOR_TRUSTED_SYSTEM only for consumers running as uid 1000
//! (system) or statsd; root is not enough and a consumer cannot set the field
//! itself. vitalsd therefore runs as `user system`, and either execs the
//! client, which keeps uid 1000, or is the consumer itself.

mod client;
pub mod config;
#[cfg(feature = "producer")]
pub mod in_process;
pub mod in_session;
pub mod outcome;
pub mod ratelimit;
pub mod route;
pub mod runner;

#[cfg(test)]
mod tests;

pub use config::{
    normalize_cmdline, AdaptiveSampling, ConfigError, ContinuousDump, HeapProfileRequest, Heaps,
    RequestLimits,
};
pub use outcome::{
    metadata_path, read_outcome, write_metadata, Issue, OutcomeError, ProcessOutcome,
    TargetOutcome, TargetStatus, TraceOutcome,
};
pub use ratelimit::{RateLimitError, RateLimiter, RateLimits};
pub use route::{ConsumerRoute, RunError, RunnerConfig, SessionStatus, DEFAULT_PERFETTO_BIN};
pub use runner::{SessionReport, SessionRunner};

/// Where the rate-limit history lives by default: in a `state/`
/// subdirectory of the store, because the store's start-up repair treats
/// every `*.json` in its own directory as capture metadata and would delete
/// this file as an orphan.
pub fn default_state_file() -> std::path::PathBuf {
    default_state_file_for(cfg!(target_os = "android"))
}

/// [`default_state_file`] on Android (`true`) or a Linux host.
pub fn default_state_file_for(android: bool) -> std::path::PathBuf {
    if android {
        "/data/misc/vitalsd/state/heapprofd_ratelimit.json".into()
    } else {
        "/var/lib/vitalsd/state/heapprofd_ratelimit.json".into()
    }
}

/// Where the heapprofd session traces go on Android: their own directory
/// (sepolicy/file_contexts: vitalsd_heapprofd_data_file). The runner
/// creates each file; the perfetto domain may only write to it.
pub const ANDROID_TRACE_DIR: &str = "/data/misc/vitalsd/heapprofd";
