//! The hook between the daemon and its Perfetto producer (`producer/`):
//! started with the daemon, fed by the sampling tick, counted in status.
//! Without the `producer` feature these do nothing.

use super::Service;

/// The producer, when built in.
#[cfg(feature = "producer")]
pub(super) type MaybeProducer = Option<crate::producer::Producer>;
/// Never `Some` without the feature.
#[cfg(not(feature = "producer"))]
pub(super) type MaybeProducer = Option<std::convert::Infallible>;

/// Registers the data source if the config asks for it; the second value
/// says why a configured producer is not running. A producer that cannot
/// start costs the daemon nothing else: logged, and it runs on. It runs in
/// either tier (`origin`: the eBPF programs or the procfs scheduler
/// source); with neither there are no per-task counters for its data
/// source, and it does not start.
#[cfg(feature = "producer")]
pub(super) fn start(
    cfg: &crate::config::Config,
    origin: Option<crate::accounting::CounterOrigin>,
    proc_only: Option<&crate::bpf::denied::ProcOnly>,
) -> (MaybeProducer, Option<String>) {
    if !cfg.producer.enabled {
        return (None, None);
    }
    let Some(origin) = origin else {
        let why = match proc_only {
            Some(why) => {
                format!("not started: accounting is {why} and the kernel has no schedstat")
            }
            None => "not started: no per-task accounting".to_owned(),
        };
        log::warn!("perfetto producer {why}: its data source has no per-task counters");
        return (None, Some(why));
    };
    match crate::producer::Producer::start(crate::producer::ProducerOptions {
        data_source: cfg.producer.data_source.clone(),
        origin,
        sampling_interval: cfg.sampling.interval.0,
    }) {
        Ok(p) => (Some(p), None),
        Err(e) => {
            log::error!("perfetto producer not started: {e}");
            (None, Some(format!("not started: {e}")))
        }
    }
}

#[cfg(not(feature = "producer"))]
pub(super) fn start(
    _: &crate::config::Config,
    _: Option<crate::accounting::CounterOrigin>,
    _: Option<&crate::bpf::denied::ProcOnly>,
) -> (MaybeProducer, Option<String>) {
    (None, None)
}

impl Service {
    /// Hands this tick to the producer, without waiting; nothing is built
    /// while no tracing session has the data source.
    #[cfg(feature = "producer")]
    pub(super) fn feed_producer(&self) {
        use crate::process_tracks::ProcessIdentity;
        let Some(p) = &self.producer else { return };
        let tick = self.pipeline.last();
        p.offer(|| crate::producer::TickData {
            ts_boot_ns: tick.rows_boottime_ns,
            rows: tick.rows.clone(),
            processes: if tick.scanned {
                tick.sample
                    .processes
                    .iter()
                    .map(ProcessIdentity::of)
                    .collect()
            } else {
                Vec::new()
            },
            history: p.prelude_wanted().map(|d| {
                self.history
                    .last_span(d.as_nanos() as u64)
                    .into_iter()
                    .cloned()
                    .collect()
            }),
        });
    }

    #[cfg(not(feature = "producer"))]
    pub(super) fn feed_producer(&self) {}

    /// The producer's counters for `vitalsctl status`.
    #[cfg(feature = "producer")]
    pub(super) fn producer_status(
        &self,
    ) -> (std::collections::BTreeMap<String, u64>, Option<String>) {
        match &self.producer {
            Some(p) => (
                p.stats().counters(),
                p.stats().last_error.lock().unwrap().clone(),
            ),
            None => (Default::default(), self.producer_off.clone()),
        }
    }

    #[cfg(not(feature = "producer"))]
    pub(super) fn producer_status(
        &self,
    ) -> (std::collections::BTreeMap<String, u64>, Option<String>) {
        debug_assert!(self.producer.is_none());
        (Default::default(), self.producer_off.clone())
    }
}
