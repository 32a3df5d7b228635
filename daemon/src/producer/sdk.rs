//! The producer's side of its data source: what the SDK's callbacks
//! (through `crate::perfetto_sdk::data_source`, the one place that talks to
//! the SDK) hand to the producer's thread.
//!
//! The SDK calls the callbacks on its own IPC thread; they only parse the
//! config and hand events to the producer's thread, which does all writing
//! (`DataSource::trace` writes on the calling thread's per-instance writer).

use std::sync::{atomic::Ordering, mpsc::Sender, Arc};

use crate::perfetto_sdk::data_source::{self, Callbacks, DataSource, FlushGuard, StopGuard};

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

/// Connects to the system backend and registers `name`, its callbacks
/// sending [`Event`]s to `events`.
pub(super) fn register(
    name: &str,
    events: Sender<Event>,
    shared: Arc<Shared>,
) -> Result<DataSource, ProducerError> {
    let (setup_tx, start_tx, stop_tx, flush_tx) =
        (events.clone(), events.clone(), events.clone(), events);
    let setup_shared = shared;
    let callbacks = Callbacks {
        on_setup: Box::new(move |inst, ds_config| {
            // At once, so the very next sampling tick is handed over.
            setup_shared.active.fetch_add(1, Ordering::Relaxed);
            let config = config::legacy_config(ds_config).and_then(|s| config::parse(&s));
            if let Err(e) = &config {
                log::error!("perfetto data source instance {inst}: {e}; it gets no data");
                setup_shared.stats.config_error(e.to_string());
            }
            let _ = setup_tx.send(Event::Setup { inst, config });
        }),
        on_start: Box::new(move |inst, ()| {
            let _ = start_tx.send(Event::Start { inst });
        }),
        on_stop: Box::new(move |inst, guard| {
            let _ = stop_tx.send(Event::Stop { inst, guard });
        }),
        on_flush: Box::new(move |inst, guard| {
            let _ = flush_tx.send(Event::Flush { inst, guard });
        }),
    };
    data_source::register(name, callbacks).map_err(|source| ProducerError::Register {
        name: name.to_owned(),
        source,
    })
}
