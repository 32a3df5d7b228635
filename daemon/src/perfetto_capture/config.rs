//! The TraceConfig of a Perfetto-backend capture: the data sources that
//! give the CPU timeline and the process and system counters without eBPF,
//! plus vitalsd's own `linux.vitals`, in one bounded buffer.

use std::time::Duration;

use crate::{
    event_set::EventSet,
    perfetto::protos::{
        ftrace_config::CompactSchedConfig, sys_stats_config::StatCounters, trace_config,
        DataSourceConfig, FtraceConfig, ProcessStatsConfig, SysStatsConfig, TraceConfig,
    },
};

/// The ftrace events trace_processor needs for the CPU timeline: slices and
/// thread states (sched_switch, sched_waking), threads and processes that
/// start, get renamed and end during the window (wakeup_new, newtask,
/// rename, exit, free), so short-lived processes are named.
pub const SCHED_EVENTS: [&str; 7] = [
    "sched/sched_switch",
    "sched/sched_waking",
    "sched/sched_wakeup_new",
    "task/task_newtask",
    "task/task_rename",
    "sched/sched_process_exit",
    "sched/sched_process_free",
];

pub const FTRACE_DATA_SOURCE: &str = "linux.ftrace";
pub const PROCESS_STATS_DATA_SOURCE: &str = "linux.process_stats";
pub const SYS_STATS_DATA_SOURCE: &str = "linux.sys_stats";

/// traced rejects a session whose unique_session_name is in use: one
/// Perfetto-backend capture at a time across vitalsd instances.
pub const UNIQUE_SESSION_NAME: &str = "vitalsd_capture";

/// What traced's own packets (the config, clock snapshots, system info,
/// stats) may add beyond the buffer: kept out of the byte cap so the trace
/// read back stays within it. traced's service packets are a few KiB.
const SERVICE_HEADROOM_BYTES: u64 = 32 << 10;

pub use crate::heapprofd::in_session::{HeapInSession, FLUSH_TIMEOUT_MS};

/// One capture's request.
#[derive(Debug, Clone)]
pub struct CaptureRequest {
    pub duration: Duration,
    /// `sched`: the CPU timeline (linux.ftrace sched events); `faults`:
    /// asked for fault hotspots, which this backend has as counters only.
    pub events: EventSet,
    /// store.max_capture_bytes: the buffer and the trace stay within it.
    pub max_bytes: u64,
    /// vitalsd's own data source (`producer.data_source`), when the
    /// producer is enabled.
    pub vitals_data_source: Option<String>,
    /// sys_stats and process_stats poll period.
    pub poll: Duration,
    /// A heap profile in the same session (a rule's heap_profile).
    pub heap: Option<HeapInSession>,
}

impl CaptureRequest {
    /// The buffer's size: the byte cap less traced's service packets, in
    /// whole KiB (traced sizes buffers in KiB), at least 4 KiB (one page).
    pub fn buffer_kb(&self) -> u32 {
        let bytes = self.max_bytes.saturating_sub(SERVICE_HEADROOM_BYTES);
        (bytes / 1024).clamp(4, u64::from(u32::MAX)) as u32
    }

    /// How long traced may wait for the data sources' last flush.
    pub fn flush_timeout_ms(&self) -> u32 {
        self.heap.as_ref().map_or(FLUSH_TIMEOUT_MS, |h| {
            h.flush_timeout_ms.max(FLUSH_TIMEOUT_MS)
        })
    }

    pub fn trace_config(&self) -> TraceConfig {
        let poll_ms = self.poll.as_millis().clamp(100, 60_000) as u32;
        let mut data_sources = Vec::new();
        let source = |config: DataSourceConfig| trace_config::DataSource {
            config: Some(DataSourceConfig {
                target_buffer: Some(0),
                ..config
            }),
            ..Default::default()
        };
        if self.events.sched {
            data_sources.push(source(DataSourceConfig {
                name: Some(FTRACE_DATA_SOURCE.into()),
                ftrace_config: Some(FtraceConfig {
                    ftrace_events: SCHED_EVENTS.iter().map(|e| (*e).to_owned()).collect(),
                    compact_sched: Some(CompactSchedConfig {
                        enabled: Some(true),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }));
        }
        data_sources.push(source(DataSourceConfig {
            name: Some(PROCESS_STATS_DATA_SOURCE.into()),
            process_stats_config: Some(ProcessStatsConfig {
                // Names every process and thread alive at the start; the
                // sched events name the ones born during the window.
                scan_all_processes_on_start: Some(true),
                record_thread_names: Some(true),
                proc_stats_poll_ms: Some(poll_ms),
                ..Default::default()
            }),
            ..Default::default()
        }));
        data_sources.push(source(DataSourceConfig {
            name: Some(SYS_STATS_DATA_SOURCE.into()),
            sys_stats_config: Some(SysStatsConfig {
                stat_period_ms: Some(poll_ms),
                stat_counters: vec![
                    StatCounters::StatCpuTimes as i32,
                    StatCounters::StatForkCount as i32,
                ],
                ..Default::default()
            }),
            ..Default::default()
        }));
        if let Some(name) = &self.vitals_data_source {
            data_sources.push(source(DataSourceConfig {
                name: Some(name.clone()),
                ..Default::default()
            }));
        }
        // DISCARD: once the buffer is full, later data is dropped (traced
        // counts chunks_discarded), so the trace keeps the start of the
        // window and never exceeds the cap.
        let mut buffers = vec![trace_config::BufferConfig {
            size_kb: Some(self.buffer_kb()),
            fill_policy: Some(trace_config::buffer_config::FillPolicy::Discard as i32),
            ..Default::default()
        }];
        if let Some(heap) = &self.heap {
            // Half the cap for heapprofd's dump, in a buffer of its own so
            // the timeline cannot crowd it out; a ring, as heapprofd's own
            // sessions, so the final dump is the one kept.
            let heap_kb = self.buffer_kb() / 2;
            buffers[0].size_kb = Some(self.buffer_kb() - heap_kb);
            buffers.push(trace_config::BufferConfig {
                size_kb: Some(heap_kb.max(4)),
                fill_policy: Some(trace_config::buffer_config::FillPolicy::RingBuffer as i32),
                ..Default::default()
            });
            let mut ds = heap.data_source.clone();
            if let Some(c) = ds.config.as_mut() {
                c.target_buffer = Some(1);
            }
            data_sources.push(ds);
        }
        TraceConfig {
            buffers,
            data_sources,
            duration_ms: Some(self.duration.as_millis().clamp(1, u128::from(u32::MAX)) as u32),
            // As heapprofd's sessions: traced keeps the data and the
            // consumer reads it back (no write_into_file, which on Android
            // would need traced to open our files). max_file_size_bytes
            // bounds a file traced writes itself, should a config ever ask.
            write_into_file: Some(false),
            max_file_size_bytes: Some(self.max_bytes),
            flush_timeout_ms: Some(self.flush_timeout_ms()),
            unique_session_name: Some(UNIQUE_SESSION_NAME.into()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heapprofd::{config::HEAPPROFD_DATA_SOURCE, HeapProfileRequest};

    fn request(max_bytes: u64) -> CaptureRequest {
        CaptureRequest {
            duration: Duration::from_secs(10),
            events: EventSet {
                sched: true,
                faults: false,
            },
            max_bytes,
            vitals_data_source: Some("linux.vitals".into()),
            poll: Duration::from_secs(1),
            heap: None,
        }
    }

    fn names(c: &TraceConfig) -> Vec<&str> {
        c.data_sources
            .iter()
            .filter_map(|d| d.config.as_ref()?.name.as_deref())
            .collect()
    }

    #[test]
    fn sched_capture_asks_for_the_timeline_the_stats_and_our_counters() {
        let c = request(64 << 20).trace_config();
        assert_eq!(
            names(&c),
            [
                FTRACE_DATA_SOURCE,
                PROCESS_STATS_DATA_SOURCE,
                SYS_STATS_DATA_SOURCE,
                "linux.vitals"
            ]
        );
        let ftrace = c.data_sources[0]
            .config
            .as_ref()
            .unwrap()
            .ftrace_config
            .as_ref()
            .unwrap();
        assert_eq!(ftrace.ftrace_events, SCHED_EVENTS);
        assert_eq!(ftrace.compact_sched.unwrap().enabled, Some(true));
        let ps = c.data_sources[1]
            .config
            .as_ref()
            .unwrap()
            .process_stats_config
            .as_ref()
            .unwrap();
        assert_eq!(
            (ps.scan_all_processes_on_start, ps.record_thread_names),
            (Some(true), Some(true))
        );
        assert_eq!(c.duration_ms, Some(10_000));
        assert_eq!(c.unique_session_name.as_deref(), Some(UNIQUE_SESSION_NAME));
    }

    #[test]
    fn the_buffer_discards_within_the_byte_cap() {
        let c = request(64 << 10).trace_config();
        assert_eq!(c.buffers.len(), 1);
        let b = &c.buffers[0];
        assert_eq!(
            b.fill_policy,
            Some(trace_config::buffer_config::FillPolicy::Discard as i32)
        );
        let size = u64::from(b.size_kb.unwrap()) * 1024;
        assert_eq!(size + SERVICE_HEADROOM_BYTES, 64 << 10);
        assert_eq!(c.max_file_size_bytes, Some(64 << 10));
        assert!(c
            .data_sources
            .iter()
            .all(|d| d.config.as_ref().unwrap().target_buffer == Some(0)));
    }

    #[test]
    fn a_heap_profile_gets_half_the_cap_in_a_buffer_of_its_own() {
        let heap = HeapProfileRequest {
            pids: vec![42],
            duration_ms: 10_000,
            ..HeapProfileRequest::default()
        };
        let heap_config = heap
            .trace_config(&crate::heapprofd::RequestLimits::default())
            .unwrap();
        let mut r = request(1 << 20);
        r.heap = HeapInSession::new(heap, &heap_config);
        let c = r.trace_config();
        assert_eq!(names(&c).last(), Some(&HEAPPROFD_DATA_SOURCE));
        let ds = c.data_sources.last().unwrap().config.as_ref().unwrap();
        assert_eq!(ds.target_buffer, Some(1));
        assert_eq!(ds.heapprofd_config.as_ref().unwrap().pid, [42]);
        let sizes: Vec<u32> = c.buffers.iter().map(|b| b.size_kb.unwrap()).collect();
        assert_eq!(sizes.len(), 2);
        assert_eq!(
            sizes[0] + sizes[1],
            r.buffer_kb(),
            "within the cap: {sizes:?}"
        );
        assert_eq!(c.flush_timeout_ms, heap_config.flush_timeout_ms);
    }

    #[test]
    fn without_sched_no_ftrace_and_without_producer_no_vitals() {
        let mut r = request(1 << 20);
        r.events.sched = false;
        r.vitals_data_source = None;
        assert_eq!(
            names(&r.trace_config()),
            [PROCESS_STATS_DATA_SOURCE, SYS_STATS_DATA_SOURCE]
        );
    }
}
