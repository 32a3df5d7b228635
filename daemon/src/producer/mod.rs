//! `vitalsd run` as a producer of the system tracing service (traced): one
//! data source (by default `linux.vitals`) that puts vitalsd's per-process
//! counters into any tracing session that lists it, next to traced_probes'
//! and everyone else's data.
//!
//! - What it writes is what `vitalsd record` writes (the same encoders in
//!   `perfetto/` and `process_tracks`): per-process on-CPU time, runqueue
//!   wait, switches and faults as counter tracks under process tracks, a
//!   ProcessTree naming the processes, and optionally the history ring's
//!   last minutes (the prelude) when the session starts.
//! - Config: `DataSourceConfig.legacy_config`, parsed by [`config`].
//! - Perfetto's rules: SEQ_INCREMENTAL_STATE_CLEARED on the first packet of
//!   every incremental-state generation; flush on request; async stop
//!   (the data is committed before the stop is acknowledged).
//! - The sampling loop never waits on traced: it hands each tick's
//!   counters to this module's thread without blocking ([`Producer::offer`],
//!   which costs one atomic load while no session is active), and the
//!   SDK drops rather than stalls when the shared memory buffer is full.
//! - traced restarting: the SDK reconnects; [`connection`] counts it.
//!
//! One concern per file: `sdk` (the data source's callbacks; the SDK
//! calls themselves are `crate::perfetto_sdk`'s), `config`, `instance` (one
//! session's sequence), `worker` (the thread), `connection`, `stats`.

mod config;
mod connection;
mod instance;
mod sdk;
mod stats;
mod worker;

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc,
    },
    time::Duration,
};

use thiserror::Error;

use crate::{
    accounting::{CounterOrigin, ProcessCounters},
    history::VitalsSample,
    process_tracks::ProcessIdentity,
};

pub use config::{ConfigError, InstanceConfig};
pub use stats::Stats;

#[derive(Debug, Error)]
pub enum ProducerError {
    #[error("registering perfetto data source {name}: {source}")]
    Register {
        name: String,
        #[source]
        source: crate::perfetto_sdk::data_source::DataSourceError,
    },
    #[error("starting the producer thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the perfetto producer is already running in this process")]
    AlreadyStarted,
}

/// One sampling tick, as the sampling loop hands it over.
pub struct TickData {
    /// CLOCK_BOOTTIME, traced's default trace clock.
    pub ts_boot_ns: u64,
    /// Every process's cumulative counters (since vitalsd started), from
    /// the eBPF programs or the procfs scheduler source.
    pub rows: Vec<ProcessCounters>,
    /// This tick's procfs scan (empty if it failed): names the processes.
    pub processes: Vec<ProcessIdentity>,
    /// The history ring's last [`Producer::prelude_wanted`], when asked.
    pub history: Option<Vec<VitalsSample>>,
}

/// What the producer needs from the daemon at start.
#[derive(Debug, Clone)]
pub struct ProducerOptions {
    pub data_source: String,
    /// Which tier's counters the rows carry (names the tracks).
    pub origin: CounterOrigin,
    /// The daemon's sampling interval: the finest interval a session gets.
    pub sampling_interval: Duration,
}

/// State shared by the daemon, the producer's thread and the SDK's callbacks.
#[derive(Debug, Default)]
struct Shared {
    stats: Stats,
    /// Instances set up and not yet stopped.
    active: AtomicUsize,
    /// Ticks sent and not yet taken by the producer's thread.
    in_flight: AtomicUsize,
    /// The longest prelude (ms) a started instance still waits for; 0: none.
    prelude_ms: AtomicU64,
}

/// Ticks the producer's thread may have queued before more are dropped.
const MAX_IN_FLIGHT: usize = 2;

/// The running producer. Its thread and the SDK's connection live as long
/// as the process (the SDK's C API has no shutdown).
pub struct Producer {
    shared: Arc<Shared>,
    events: mpsc::Sender<sdk::Event>,
}

impl Producer {
    /// Connects to traced (in the background: the SDK retries until it is
    /// up) and registers the data source. Once per process.
    pub fn start(opts: ProducerOptions) -> Result<Self, ProducerError> {
        static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if STARTED.swap(true, Ordering::SeqCst) {
            return Err(ProducerError::AlreadyStarted);
        }
        let shared = Arc::new(Shared::default());
        let (events, rx) = mpsc::channel();
        let sdk = sdk::register(&opts.data_source, events.clone(), Arc::clone(&shared))?;
        let watch = connection::ConnectionWatch::new(connection::producer_socket_name());
        let worker = worker::Worker::new(sdk, rx, Arc::clone(&shared), watch, opts.clone());
        std::thread::Builder::new()
            .name("vitalsd-producer".into())
            .spawn(move || worker.run())
            .map_err(ProducerError::Thread)?;
        log::info!("perfetto data source {} registered", opts.data_source);
        Ok(Self { shared, events })
    }

    /// Whether any session has the data source; one relaxed load, so the
    /// sampling loop can skip all producer work while none has.
    pub fn active(&self) -> bool {
        self.shared.active.load(Ordering::Relaxed) > 0
    }

    /// How much history a starting session wants written first, if any.
    pub fn prelude_wanted(&self) -> Option<Duration> {
        match self.shared.prelude_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Hands a tick to the producer's thread unless it is still busy with
    /// earlier ones (then the tick is counted as dropped): never waits.
    /// `make` runs only when the tick will be sent.
    pub fn offer(&self, make: impl FnOnce() -> TickData) {
        if !self.active() {
            return;
        }
        if self.shared.in_flight.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
            Stats::add(&self.shared.stats.ticks_dropped, 1);
            return;
        }
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        if self
            .events
            .send(sdk::Event::Tick(Box::new(make())))
            .is_err()
        {
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }
}
