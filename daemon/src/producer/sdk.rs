//! The one file that talks to the Perfetto SDK: producer start-up, the data
//! source's registration and callbacks, and writing packets into traced's
//! shared memory buffer.
//!
//! The SDK calls the callbacks on its own IPC thread; they only parse the
//! config and hand events to the producer's thread, which does all writing
//! (`DataSource::trace` writes on the calling thread's per-instance writer).

use std::sync::{atomic::Ordering, mpsc::Sender, Arc};

use perfetto_sdk::{
    data_source::{
        DataSource, DataSourceArgsBuilder, DataSourceBufferExhaustedPolicy, FlushGuard, StopGuard,
        TraceContext, TraceContextBase,
    },
    producer::{Backends, Producer, ProducerInitArgsBuilder},
};
use perfetto_sdk_sys::{PerfettoDsImplTracerIterator, PerfettoDsTracerImplGetDropCount};

use super::{
    config::{self, ConfigError, InstanceConfig},
    ProducerError, Shared,
};

/// What the SDK's callbacks hand to the producer's thread.
pub(super) enum Event {
    Setup {
        inst: u32,
        config: Result<InstanceConfig, ConfigError>,
    },
    Start {
        inst: u32,
    },
    /// Perfetto's async stop: the instance keeps writing until the guard drops.
    Stop {
        inst: u32,
        guard: StopGuard,
    },
    Flush {
        inst: u32,
        guard: FlushGuard,
    },
    Tick(Box<super::TickData>),
}

/// The shared memory buffer size we ask traced for. Our packets per
/// interval are small (changed counters only); traced may pick another size.
const SHMEM_SIZE_HINT_KB: u32 = 256;

/// The registered data source.
pub(super) struct Sdk {
    ds: DataSource<'static>,
}

/// Connects to the system backend (PERFETTO_PRODUCER_SOCK_NAME, else the
/// platform's socket) and registers `name`. The SDK reconnects by itself
/// when traced restarts and registers the data source again.
pub(super) fn register(
    name: &str,
    events: Sender<Event>,
    shared: Arc<Shared>,
) -> Result<Sdk, ProducerError> {
    init_system_backend();
    let (setup_tx, start_tx, stop_tx, flush_tx) =
        (events.clone(), events.clone(), events.clone(), events);
    let setup_shared = shared;
    let args = DataSourceArgsBuilder::new()
        // Never stall the writer (and so the producer thread) on a full
        // shared memory buffer: drop, and the drop count says so.
        .buffer_exhausted_policy(DataSourceBufferExhaustedPolicy::Drop)
        .will_notify_on_stop(true)
        // traced's incremental_state_config.clear_period_ms: we then write
        // the track descriptors and ProcessTree again, so a ring buffer that
        // overwrote them still decodes.
        .handles_incremental_state_clear(true)
        .on_setup(move |inst, ds_config, _| {
            // At once, so the very next sampling tick is handed over.
            setup_shared.active.fetch_add(1, Ordering::Relaxed);
            let config = config::legacy_config(ds_config).and_then(|s| config::parse(&s));
            if let Err(e) = &config {
                log::error!("perfetto data source instance {inst}: {e}; it gets no data");
                setup_shared.stats.config_error(e.to_string());
            }
            let _ = setup_tx.send(Event::Setup { inst, config });
        })
        .on_start(move |inst, _| {
            let _ = start_tx.send(Event::Start { inst });
        })
        .on_stop(move |inst, args| {
            let _ = stop_tx.send(Event::Stop {
                inst,
                guard: args.postpone(),
            });
        })
        .on_flush(move |inst, args| {
            let _ = flush_tx.send(Event::Flush {
                inst,
                guard: args.postpone(),
            });
        })
        .build();
    let mut ds = DataSource::new();
    ds.register(name, args)
        .map_err(|source| ProducerError::Register {
            name: name.to_owned(),
            source,
        })?;
    Ok(Sdk { ds })
}

/// Initialises the SDK with the system backend, once per process: the
/// producer and the in-process heapprofd consumer
/// (`heapprofd::in_process`) share it, and either may come first.
pub(crate) fn init_system_backend() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        Producer::init(
            ProducerInitArgsBuilder::new()
                .backends(Backends::SYSTEM)
                .shmem_size_hint_kb(SHMEM_SIZE_HINT_KB)
                .build(),
        )
    });
}

/// One instance's writer for the duration of a `trace` callback.
pub(super) struct Sink<'c, 'a> {
    ctx: &'c mut TraceContext<'a>,
}

impl Sink<'_, '_> {
    /// Appends one encoded TracePacket (its fields, no length prefix).
    pub(super) fn packet(&mut self, body: &[u8]) {
        self.ctx.add_packet(|p| p.msg.append_bytes(body));
    }

    /// How many times this writer dropped data because traced's shared
    /// memory buffer was full (the SDK counts entries into drop mode, not
    /// packets).
    pub(super) fn drop_count(&self) -> u64 {
        let base: &TraceContextBase = self.ctx;
        // The safe crate keeps the tracer private and does not wrap
        // PerfettoDsTracerImplGetDropCount, so read the iterator it wraps.
        const _: () = assert!(
            std::mem::size_of::<TraceContextBase>()
                == std::mem::size_of::<PerfettoDsImplTracerIterator>()
        );
        // SAFETY: TraceContextBase's only field is the
        // PerfettoDsImplTracerIterator of this iteration (perfetto-sdk
        // 1.2.1, pinned in Cargo.toml; the size assertion above catches a
        // layout change), whose tracer is valid during the callback.
        unsafe {
            let it = &*(base as *const TraceContextBase as *const PerfettoDsImplTracerIterator);
            PerfettoDsTracerImplGetDropCount(it.tracer)
        }
    }

    /// Commits what this instance wrote, then releases `guard` (a stop or
    /// flush acknowledgement). Released at once rather than in the flush's
    /// completion callback: the SDK posts the commit and the
    /// acknowledgement to the same IPC task runner, in that order, so
    /// traced has the data first; and the callback never runs when traced
    /// went away, which would leave the instance slot stopping forever
    /// (the SDK's own data source example does the same).
    pub(super) fn flush_then<G>(&mut self, guard: G) {
        self.ctx.flush(|| {});
        drop(guard);
    }
}

impl Sdk {
    /// Calls `f` for each active instance: its index, whether its
    /// incremental state was cleared since the last call (traced asked, or
    /// it is new), and its sink.
    pub(super) fn trace(&self, mut f: impl FnMut(u32, bool, &mut Sink<'_, '_>)) {
        self.ds.trace(|ctx| {
            let inst = ctx.instance_index();
            let mut cleared = false;
            ctx.with_incremental_state(|_, state| {
                cleared = state.was_cleared;
                state.was_cleared = false;
            });
            f(inst, cleared, &mut Sink { ctx });
        });
    }
}
