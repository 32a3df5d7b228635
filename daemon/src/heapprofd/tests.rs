//! Unit tests: validation errors, the TraceConfig decoded by the official
//! schema, and outcome parsing of synthetic heapprofd traces.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use prost::Message;

use super::*;
use crate::perfetto::protos::{
    self,
    profile_packet::{HeapSample, ProcessHeapSamples},
    trace_packet::Data,
    TracePacket,
};

fn req(names: &[&str]) -> HeapProfileRequest {
    HeapProfileRequest {
        process_names: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn limits() -> RequestLimits {
    RequestLimits::default()
}

#[test]
fn normalisation_matches_heapprofd() {
    assert_eq!(
        normalize_cmdline("/system/bin/surfaceflinger"),
        "surfaceflinger"
    );
    assert_eq!(normalize_cmdline("com.foo.bar@1.2"), "com.foo.bar");
    // Cut at '@' before taking the basename, as NormalizeCmdLine does.
    assert_eq!(normalize_cmdline("/a@b/c"), "a");
    assert_eq!(normalize_cmdline("app_process\0--arg"), "app_process");
    assert_eq!(normalize_cmdline("system_server"), "system_server");
}

#[test]
fn validation_errors() {
    let l = limits();
    assert_eq!(req(&[]).validate(&l), Err(ConfigError::NoTarget));
    for (name, glob) in [("surface*", '*'), ("sf?", '?'), ("[ab]c", '[')] {
        assert_eq!(
            req(&[name]).validate(&l),
            Err(ConfigError::Wildcard {
                name: name.into(),
                glob
            })
        );
    }
    // A name normalisation changes: accepted with a warning showing both
    // forms, and the config carries the normalised name.
    let r = req(&["/system/bin/surfaceflinger", "com.foo@1"]);
    assert_eq!(r.validate(&l), Ok(()));
    let w = r.normalisation_warnings();
    assert_eq!(w.len(), 2);
    assert!(
        w[0].contains("/system/bin/surfaceflinger") && w[0].contains("\"surfaceflinger\""),
        "{w:?}"
    );
    assert!(
        w[1].contains("com.foo@1") && w[1].contains("\"com.foo\""),
        "{w:?}"
    );
    assert!(req(&["surfaceflinger"]).normalisation_warnings().is_empty());
    let cfg = r.trace_config(&l).unwrap();
    assert_eq!(
        config::heapprofd_config(&cfg).unwrap().process_cmdline,
        vec!["surfaceflinger".to_string(), "com.foo".to_string()]
    );
    assert_eq!(
        req(&["/bin/"]).validate(&l),
        Err(ConfigError::EmptyName {
            name: "/bin/".into()
        })
    );
    let r = HeapProfileRequest {
        pids: vec![0],
        ..Default::default()
    };
    assert_eq!(r.validate(&l), Err(ConfigError::PidZero));
    let r = HeapProfileRequest {
        sampling_interval_bytes: 0,
        ..req(&["x"])
    };
    assert_eq!(r.validate(&l), Err(ConfigError::SamplingIntervalZero));
    let r = HeapProfileRequest {
        no_running: true,
        no_startup: true,
        ..req(&["x"])
    };
    assert_eq!(r.validate(&l), Err(ConfigError::NoRunningAndNoStartup));
    let r = HeapProfileRequest {
        duration_ms: 0,
        ..req(&["x"])
    };
    assert_eq!(r.validate(&l), Err(ConfigError::DurationZero));
    let r = HeapProfileRequest {
        duration_ms: 60_001,
        ..req(&["x"])
    };
    let small = RequestLimits {
        max_duration_ms: 60_000,
    };
    assert_eq!(
        r.validate(&small),
        Err(ConfigError::DurationTooLong {
            requested_ms: 60_001,
            max_ms: 60_000
        })
    );
    assert_eq!(r.validate(&l), Ok(()));
    let r = HeapProfileRequest {
        heaps: Heaps::Named(vec![]),
        ..req(&["x"])
    };
    assert_eq!(r.validate(&l), Err(ConfigError::NoHeaps));
    let r = HeapProfileRequest {
        continuous_dump: Some(ContinuousDump {
            phase_ms: 0,
            interval_ms: 0,
        }),
        ..req(&["x"])
    };
    assert_eq!(r.validate(&l), Err(ConfigError::DumpIntervalZero));
    // The builder refuses what validate refuses.
    assert!(req(&["a*"]).trace_config(&l).is_err());
}

#[test]
fn defaults_and_no_session_initiator() {
    let cfg = req(&["surfaceflinger"]).trace_config(&limits()).unwrap();
    let h = config::heapprofd_config(&cfg).unwrap();
    assert_eq!(h.sampling_interval_bytes, Some(4096));
    assert_eq!(h.shmem_size_bytes, Some(8 * 1024 * 1024));
    assert_eq!(h.block_client, Some(false));
    assert_eq!(h.process_cmdline, vec!["surfaceflinger".to_string()]);
    // traced sets the initiator from the consumer's uid; we never do.
    for ds in &cfg.data_sources {
        assert_eq!(ds.config.as_ref().unwrap().session_initiator, None);
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn python() -> PathBuf {
    let p = std::env::var_os("VITALS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    assert!(
        p.exists(),
        "{} not found: create the venv with the `perfetto` package (or set VITALS_PYTHON)",
        p.display()
    );
    p
}

/// Decodes `cfg` with the official schema (PyPI perfetto) and returns the JSON.
fn official_decode(cfg: &protos::TraceConfig) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.pb");
    std::fs::write(&file, cfg.encode_to_vec()).unwrap();
    let out = Command::new(python())
        .arg(workspace_root().join("tests/python/decode_config.py"))
        .arg(&file)
        .output()
        .expect("running decode_config.py");
    assert!(
        out.status.success(),
        "decode_config.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn trace_config_decodes_with_official_schema_into_exactly_the_requested_fields() {
    let r = HeapProfileRequest {
        process_names: vec!["surfaceflinger".into(), "com.android.systemui".into()],
        pids: vec![1234],
        duration_ms: 20_000,
        sampling_interval_bytes: 8192,
        shmem_size_bytes: 16 << 20,
        block_client: true,
        block_client_timeout_us: Some(500),
        continuous_dump: Some(ContinuousDump {
            phase_ms: 1000,
            interval_ms: 5000,
        }),
        heaps: Heaps::Named(vec!["libc.malloc".into(), "com.android.art".into()]),
        target_installed_by: vec!["com.android.vending".into()],
        max_heapprofd_memory_kb: Some(65536),
        max_heapprofd_cpu_secs: Some(30),
        adaptive_sampling: Some(AdaptiveSampling {
            shmem_threshold: 4 << 20,
            max_sampling_interval_bytes: 65536,
        }),
        no_startup: true,
        no_running: false,
        proc_stats_poll_ms: 500,
        heap_buffer_kb: 32768,
        process_stats_buffer_kb: 1024,
        flush_timeout_ms: 15_000,
        unique_session_name: Some("vitalsd_heapprofd_test".into()),
        bugreport_score: Some(50),
    };
    let got = official_decode(&r.trace_config(&limits()).unwrap());
    // proto3-JSON: 64-bit integers are strings, enums are names.
    let want = serde_json::json!({
        "buffers": [
            {"size_kb": 32768, "fill_policy": "RING_BUFFER"},
            {"size_kb": 1024, "fill_policy": "RING_BUFFER"}
        ],
        "data_sources": [
            {"config": {
                "name": "android.heapprofd",
                "target_buffer": 0,
                "heapprofd_config": {
                    "sampling_interval_bytes": "8192",
                    "adaptive_sampling_shmem_threshold": "4194304",
                    "adaptive_sampling_max_sampling_interval_bytes": "65536",
                    "process_cmdline": ["surfaceflinger", "com.android.systemui"],
                    "pid": ["1234"],
                    "target_installed_by": ["com.android.vending"],
                    "heaps": ["libc.malloc", "com.android.art"],
                    "max_heapprofd_memory_kb": 65536,
                    "max_heapprofd_cpu_secs": "30",
                    "continuous_dump_config": {"dump_phase_ms": 1000, "dump_interval_ms": 5000},
                    "shmem_size_bytes": "16777216",
                    "block_client": true,
                    "block_client_timeout_us": 500,
                    "no_startup": true
                }
            }},
            {"config": {
                "name": "linux.process_stats",
                "target_buffer": 1,
                "process_stats_config": {
                    "scan_all_processes_on_start": true,
                    "proc_stats_poll_ms": 500
                }
            }}
        ],
        "duration_ms": 20000,
        "write_into_file": false,
        "flush_timeout_ms": 15000,
        "unique_session_name": "vitalsd_heapprofd_test",
        "bugreport_score": 50
    });
    assert_eq!(got, want, "decoded:\n{got:#}");
}

#[test]
fn all_heaps_and_defaults_decode() {
    let r = HeapProfileRequest {
        heaps: Heaps::All,
        unique_session_name: None,
        ..req(&["system_server"])
    };
    let got = official_decode(&r.trace_config(&limits()).unwrap());
    let h = &got["data_sources"][0]["config"]["heapprofd_config"];
    assert_eq!(
        h,
        &serde_json::json!({
            "sampling_interval_bytes": "4096",
            "process_cmdline": ["system_server"],
            "all_heaps": true,
            "shmem_size_bytes": "8388608",
            "block_client": false
        })
    );
    assert!(got.get("unique_session_name").is_none());
    // A bugreport taken while the session runs picks it up.
    assert_eq!(
        got["bugreport_score"],
        crate::heapprofd::config::DEFAULT_BUGREPORT_SCORE
    );
    assert_eq!(got["duration_ms"], 30000);
}

// ---- outcome parsing ----

fn trace(packets: Vec<TracePacket>) -> Vec<u8> {
    protos::Trace { packet: packets }.encode_to_vec()
}

fn tree(procs: &[(i32, &str)]) -> TracePacket {
    TracePacket {
        data: Some(Data::ProcessTree(protos::ProcessTree {
            processes: procs
                .iter()
                .map(|(pid, cmd)| protos::process_tree::Process {
                    pid: Some(*pid),
                    cmdline: vec![cmd.to_string()],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn dump(d: ProcessHeapSamples) -> TracePacket {
    TracePacket {
        data: Some(Data::ProfilePacket(protos::ProfilePacket {
            process_dumps: vec![d],
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn heap(pid: u64) -> ProcessHeapSamples {
    ProcessHeapSamples {
        pid: Some(pid),
        heap_name: Some("libc.malloc".into()),
        sampling_interval_bytes: Some(4096),
        orig_sampling_interval_bytes: Some(4096),
        samples: vec![Default::default(); 3],
        stats: Some(protos::profile_packet::ProcessStats {
            heap_samples: Some(10),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn outcome_flags_per_process() {
    let r = HeapProfileRequest {
        pids: vec![20],
        ..req(&["surfaceflinger"])
    };
    let bytes = trace(vec![
        tree(&[(10, "/system/bin/surfaceflinger"), (20, "app@x")]),
        dump(heap(10)),
        dump(ProcessHeapSamples {
            buffer_overran: Some(true),
            hit_guardrail: Some(true),
            stats: Some(protos::profile_packet::ProcessStats {
                unwinding_errors: Some(7),
                heap_samples: Some(12),
                ..Default::default()
            }),
            ..heap(10)
        }),
        dump(ProcessHeapSamples {
            rejected_concurrent: Some(true),
            disconnected: Some(true),
            buffer_corrupted: Some(true),
            client_error: Some(1),
            samples: vec![],
            ..heap(20)
        }),
    ]);
    let o = outcome::outcome_from_bytes(&bytes, &r);
    assert_eq!(o.packets, 4);
    assert_eq!(o.torn_tail_bytes, 0);
    let sf = &o.processes[0];
    assert_eq!((sf.pid, sf.name.as_deref()), (10, Some("surfaceflinger")));
    // Two untimed dumps; the totals are the last one's, not their sum.
    assert_eq!(sf.dumps, 2);
    assert_eq!(sf.callstacks, 3);
    assert_eq!(sf.unwinding_errors, 7);
    assert_eq!(sf.heap_samples, 12);
    assert_eq!(
        sf.issues,
        vec![
            Issue::BufferOverran,
            Issue::HitGuardrail,
            Issue::UnwindingErrors
        ]
    );
    assert!(!sf.usable());
    let app = &o.processes[1];
    assert_eq!(app.name.as_deref(), Some("app"));
    assert_eq!(
        app.issues,
        vec![
            Issue::RejectedConcurrent,
            Issue::BufferCorrupted,
            Issue::Disconnected,
            Issue::ClientError
        ]
    );
    assert_eq!(
        app.client_error.as_deref(),
        Some("CLIENT_ERROR_HIT_TIMEOUT")
    );
    assert_eq!(
        o.targets,
        vec![
            TargetOutcome {
                target: "name:surfaceflinger".into(),
                status: TargetStatus::Profiled { pids: vec![10] }
            },
            TargetOutcome {
                target: "pid:20".into(),
                status: TargetStatus::Profiled { pids: vec![20] }
            },
        ]
    );
}

#[test]
fn no_profile_reports_likely_causes() {
    let r = req(&["surfaceflinger"]);
    // Running but not profiled: not profileable.
    let o = outcome::outcome_from_bytes(&trace(vec![tree(&[(10, "surfaceflinger")])]), &r);
    assert!(o.processes.is_empty());
    let TargetStatus::NoProfile { likely_causes } = &o.targets[0].status else {
        panic!("{:?}", o.targets)
    };
    assert!(
        likely_causes[0].contains("not profileable"),
        "{likely_causes:?}"
    );
    assert!(!o.all_targets_profiled());
    // Not running; a similar name suggests a mismatch.
    let o = outcome::outcome_from_bytes(&trace(vec![tree(&[(10, "surfaceflinger_v2")])]), &r);
    let TargetStatus::NoProfile { likely_causes } = &o.targets[0].status else {
        panic!()
    };
    assert!(
        likely_causes[0].contains("not running"),
        "{likely_causes:?}"
    );
    assert!(
        likely_causes[1].contains("name mismatch")
            && likely_causes[1].contains("surfaceflinger_v2"),
        "{likely_causes:?}"
    );
    // Pid not in the process list.
    let r = HeapProfileRequest {
        pids: vec![99],
        ..Default::default()
    };
    let o = outcome::outcome_from_bytes(&trace(vec![tree(&[(10, "x")])]), &r);
    let TargetStatus::NoProfile { likely_causes } = &o.targets[0].status else {
        panic!()
    };
    assert!(likely_causes[0].contains("pid 99"), "{likely_causes:?}");
}

#[test]
fn torn_tail_keeps_whole_packets() {
    let r = req(&["surfaceflinger"]);
    let mut bytes = trace(vec![dump(heap(10))]);
    let whole = bytes.len();
    bytes.extend_from_slice(&trace(vec![dump(heap(10))])[..5]);
    let o = outcome::outcome_from_bytes(&bytes, &r);
    assert_eq!(o.packets, 1);
    assert_eq!(o.torn_tail_bytes, (bytes.len() - whole) as u64);
    // Single target: the dump is attributed even without a ProcessTree.
    assert_eq!(
        o.targets[0].status,
        TargetStatus::Profiled { pids: vec![10] }
    );
}

#[test]
fn metadata_lands_beside_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("heap.pftrace");
    let p = write_metadata(&out, &serde_json::json!({"a": 1})).unwrap();
    assert_eq!(p, dir.path().join("heap.pftrace.meta.json"));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    assert_eq!(v["a"], 1);
}

fn sample(callstack: u64, allocs: u64, alloc_b: u64, frees: u64, freed_b: u64) -> HeapSample {
    HeapSample {
        callstack_id: Some(callstack),
        alloc_count: Some(allocs),
        self_allocated: Some(alloc_b),
        free_count: Some(frees),
        self_freed: Some(freed_b),
        ..Default::default()
    }
}

/// The totals are allocations and bytes of the last dump of each heap: a
/// dump repeats everything since profiling began, and a dump split over
/// packets (same timestamp) is one dump whose parts add up.
#[test]
fn totals_come_from_the_last_dump_of_each_heap() {
    let r = req(&["surfaceflinger"]);
    let at = |ts: u64, heap_name: &str, samples: Vec<HeapSample>| ProcessHeapSamples {
        timestamp: Some(ts),
        heap_name: Some(heap_name.into()),
        samples,
        ..heap(10)
    };
    let bytes = trace(vec![
        tree(&[(10, "surfaceflinger")]),
        // First dump at t=100: superseded by the second.
        dump(at(100, "libc.malloc", vec![sample(1, 5, 5000, 1, 1000)])),
        // Second dump at t=200, split over two packets.
        dump(at(200, "libc.malloc", vec![sample(1, 7, 7000, 2, 2000)])),
        dump(at(200, "libc.malloc", vec![sample(2, 3, 12288, 0, 0)])),
        // Another heap, one dump.
        dump(at(150, "custom", vec![sample(3, 4, 400, 4, 400)])),
    ]);
    let o = outcome::outcome_from_bytes(&bytes, &r);
    let p = &o.processes[0];
    assert_eq!(p.dumps, 3);
    assert_eq!(p.callstacks, 2 + 1);
    assert_eq!(p.allocations, 7 + 3 + 4);
    assert_eq!(p.allocated_bytes, 7000 + 12288 + 400);
    assert_eq!(p.frees, 2 + 4);
    assert_eq!(p.freed_bytes, 2000 + 400);
    assert_eq!(p.unreleased_bytes(), 7000 + 12288 - 2000);
    assert_eq!(p.heaps, vec!["custom".to_string(), "libc.malloc".into()]);
}
