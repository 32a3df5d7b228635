//! The producer's thread: takes the SDK's events and the sampling loop's
//! ticks, and writes every due instance's packets through the SDK.

use std::{
    collections::{HashMap, HashSet},
    sync::{atomic::Ordering, mpsc, Arc},
    time::{Duration, Instant},
};

use super::{
    connection::{Change, ConnectionWatch},
    instance::Instance,
    sdk::Event,
    ProducerOptions, Shared, Stats, TickData,
};
use crate::{
    perfetto_sdk::data_source::{DataSource, FlushGuard, Sink, StopGuard},
    process_tracks::ProcessIdentity,
};

/// Perfetto's limit of concurrent instances of one data source
/// (kMaxDataSourceInstances).
const MAX_INSTANCES: usize = 8;

/// How often the connection to traced is looked at.
const CONNECTION_POLL: Duration = Duration::from_secs(1);

/// What the guards of a forced write acknowledge.
enum Ack {
    Stop(StopGuard),
    Flush(FlushGuard),
}

pub(super) struct Worker {
    sdk: DataSource,
    events: mpsc::Receiver<Event>,
    shared: Arc<Shared>,
    watch: ConnectionWatch,
    opts: ProducerOptions,
    instances: [Option<Instance>; MAX_INSTANCES],
    latest: Option<Box<TickData>>,
    /// The processes of the last procfs scan, by pid.
    known: HashMap<u32, ProcessIdentity>,
}

impl Worker {
    pub(super) fn new(
        sdk: DataSource,
        events: mpsc::Receiver<Event>,
        shared: Arc<Shared>,
        watch: ConnectionWatch,
        opts: ProducerOptions,
    ) -> Self {
        Self {
            sdk,
            events,
            shared,
            watch,
            opts,
            instances: Default::default(),
            latest: None,
            known: HashMap::new(),
        }
    }

    pub(super) fn run(mut self) {
        let mut last_poll = Instant::now() - CONNECTION_POLL;
        loop {
            match self.events.recv_timeout(CONNECTION_POLL) {
                Ok(event) => self.handle(event),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            if last_poll.elapsed() >= CONNECTION_POLL {
                last_poll = Instant::now();
                self.poll_connection();
            }
        }
    }

    fn poll_connection(&mut self) {
        let stats = &self.shared.stats;
        match self.watch.poll() {
            Change::None => {}
            Change::Connected { reconnect } => {
                if reconnect {
                    Stats::add(&stats.reconnects, 1);
                    log::info!("perfetto: reconnected to traced");
                } else {
                    log::info!("perfetto: connected to traced");
                }
            }
            Change::Lost => {
                Stats::add(&stats.disconnects, 1);
                log::warn!("perfetto: lost the connection to traced; the SDK reconnects");
            }
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Setup { inst, config } => {
                let slot = &mut self.instances[inst as usize % MAX_INSTANCES];
                *slot = config.ok().map(|c| {
                    if c.interval < self.opts.sampling_interval {
                        log::warn!(
                            "perfetto instance {inst}: interval {:?} is below vitalsd's sampling interval {:?}; writing every sample",
                            c.interval, self.opts.sampling_interval
                        );
                    }
                    Instance::new(c, self.opts.origin)
                });
            }
            Event::Start { inst } => {
                Stats::add(&self.shared.stats.sessions_started, 1);
                if let Some(i) = self.instances[inst as usize % MAX_INSTANCES].as_mut() {
                    i.started = true;
                }
                self.update_prelude_wanted();
                // Write at once: a short session still gets the processes
                // and the counters as of the last sample.
                self.write(Some((inst, None)));
            }
            Event::Tick(tick) => {
                self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                update_known(&mut self.known, &tick);
                self.latest = Some(tick);
                self.write(None);
                self.update_prelude_wanted();
            }
            Event::Flush { inst, guard } => {
                Stats::add(&self.shared.stats.flushes, 1);
                self.write(Some((inst, Some(Ack::Flush(guard)))));
            }
            Event::Stop { inst, guard } => {
                Stats::add(&self.shared.stats.sessions_stopped, 1);
                self.write(Some((inst, Some(Ack::Stop(guard)))));
                self.instances[inst as usize % MAX_INSTANCES] = None;
                if self.shared.active.fetch_sub(1, Ordering::Relaxed) == 1 {
                    // No session left, so no ticks come until the next one
                    // is set up: this one would be stale at its start.
                    self.latest = None;
                }
                self.update_prelude_wanted();
            }
        }
    }

    /// The longest prelude a started instance waits for, for the sampling
    /// loop to attach the history to its next tick.
    fn update_prelude_wanted(&self) {
        let ms = self
            .instances
            .iter()
            .flatten()
            .filter(|i| i.started && i.prelude_pending)
            .map(|i| i.config.prelude.as_millis() as u64)
            .max()
            .unwrap_or(0);
        self.shared.prelude_ms.store(ms, Ordering::Relaxed);
    }

    /// Writes every due instance from the latest tick; `forced` is written
    /// whether due or not and then committed before its guard (if any) is
    /// released. A guard whose instance the SDK no longer iterates is
    /// released at once.
    fn write(&mut self, forced: Option<(u32, Option<Ack>)>) {
        let (forced_inst, mut ack) = match forced {
            Some((i, a)) => (Some(i), a),
            None => (None, None),
        };
        let slack_ns = self.opts.sampling_interval.as_nanos() as u64 / 2;
        let (instances, latest, known, stats) = (
            &mut self.instances,
            self.latest.as_deref(),
            &self.known,
            &self.shared.stats,
        );
        self.sdk.trace(|idx, cleared, sink| {
            let is_forced = forced_inst == Some(idx);
            if let Some(inst) = instances[idx as usize % MAX_INSTANCES].as_mut() {
                if cleared {
                    inst.reset_generation();
                }
                if let Some(tick) = latest
                    .filter(|t| inst.started && (is_forced || inst.due(t.ts_boot_ns, slack_ns)))
                {
                    write_instance(inst, tick, known, sink, stats);
                }
            }
            if is_forced {
                match ack.take() {
                    Some(Ack::Stop(g)) => sink.flush_then(g),
                    Some(Ack::Flush(g)) => sink.flush_then(g),
                    None => {}
                }
            }
        });
        // Not iterated (the session is gone, or traced): nothing to commit.
        drop(ack);
    }
}

/// Names from this tick's scan; a process gone before the scan keeps its
/// name (and starttime, so its tracks keep their key) while the eBPF rows
/// still have it (its final, `ended` row included), and is forgotten the
/// tick after.
fn update_known(known: &mut HashMap<u32, ProcessIdentity>, tick: &TickData) {
    if tick.processes.is_empty() {
        return;
    }
    let rows: HashSet<u32> = tick.rows.iter().map(|r| r.tgid).collect();
    let scanned: HashMap<u32, ProcessIdentity> =
        tick.processes.iter().map(|p| (p.pid, p.clone())).collect();
    known.retain(|pid, _| !scanned.contains_key(pid) && rows.contains(pid));
    known.extend(scanned);
}

/// One instance's packets for `tick`, handed to the SDK, and the drops the
/// SDK counted since the last look.
fn write_instance(
    inst: &mut Instance,
    tick: &TickData,
    known: &HashMap<u32, ProcessIdentity>,
    sink: &mut Sink<'_, '_>,
    stats: &Stats,
) {
    if let Err(e) = inst.write(tick, known) {
        // Cannot happen with a Vec (no I/O); the encoders reject only
        // non-finite values, which would be a bug upstream of here.
        Stats::add(&stats.encode_errors, 1);
        log::error!("perfetto: encoding a tick: {e}");
    }
    let mut n = 0;
    inst.take_packets(|body| {
        sink.packet(body);
        n += 1;
    });
    Stats::add(&stats.packets_written, n);
    let drops = sink.drop_count();
    if drops > inst.drop_count {
        Stats::add(&stats.smb_drops, drops - inst.drop_count);
        inst.drop_count = drops;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::totals::ProcessCounters;

    fn id(pid: u32, starttime_ticks: u64) -> ProcessIdentity {
        ProcessIdentity {
            pid,
            ppid: 1,
            comm: format!("p{pid}"),
            starttime_ticks,
            cmdline: std::sync::Arc::from(""),
        }
    }

    fn tick(rows: &[(u32, bool)], scanned: &[ProcessIdentity]) -> TickData {
        TickData {
            ts_boot_ns: 0,
            rows: rows
                .iter()
                .map(|&(tgid, ended)| ProcessCounters {
                    tgid,
                    ended,
                    ..Default::default()
                })
                .collect(),
            processes: scanned.to_vec(),
            history: None,
        }
    }

    #[test]
    fn a_process_gone_before_the_scan_keeps_its_identity_until_its_final_row() {
        let mut known = HashMap::new();
        update_known(
            &mut known,
            &tick(&[(7, false), (8, false)], &[id(7, 70), id(8, 80)]),
        );
        // 8 exited before this scan; its row is still live.
        update_known(&mut known, &tick(&[(7, false), (8, false)], &[id(7, 70)]));
        assert_eq!(known[&8].starttime_ticks, 80);
        // Its final row: still named for that write.
        update_known(&mut known, &tick(&[(7, false), (8, true)], &[id(7, 70)]));
        assert_eq!(known[&8].starttime_ticks, 80);
        // Then forgotten; a reused pid takes the scan's identity.
        update_known(&mut known, &tick(&[(7, false)], &[id(7, 70)]));
        assert!(!known.contains_key(&8));
        update_known(&mut known, &tick(&[(8, false)], &[id(8, 99)]));
        assert_eq!(known[&8].starttime_ticks, 99);
        // A failed scan (no processes) changes nothing.
        update_known(&mut known, &tick(&[], &[]));
        assert_eq!(known.len(), 1);
    }
}
