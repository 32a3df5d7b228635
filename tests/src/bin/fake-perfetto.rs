//! A test double of the `perfetto` command-line client for the heapprofd
//! runner tests.
//!
//! Accepts exactly `--config - --out -`, reads a binary TraceConfig from
//! stdin, checks that it decodes, names android.heapprofd with a target, and
//! leaves session_initiator unset (traced sets it; a consumer cannot). Then,
//! depending on FAKE_PERFETTO_MODE:
//!
//! - `success`: sleeps duration_ms, writes a trace with the config, a
//!   ProcessTree and a ProfilePacket per target to stdout (the file the
//!   runner opened: on Android perfetto may only write it), exits 0;
//! - `overrun`: the same with buffer_overran set;
//! - `no-profile`: config and ProcessTree but no ProfilePacket, exits 0;
//! - `refused`: what the real client does when traced refuses the session
//!   (here: its unique_session_name is in use): logs "Service error: ..."
//!   and exits 0 without writing anything;
//! - `exit1`: prints the real client's error for an unreachable traced,
//!   exits 1;
//! - `hang`: waits for SIGTERM, then writes the success trace and exits 0,
//!   as the real client stops the session and flushes on SIGTERM;
//! - `hang-hard`: ignores SIGTERM and sleeps (needs SIGKILL).
//!
//! FAKE_PERFETTO_CONFIG_OUT, if set, receives the raw stdin bytes. Named
//! targets get pids from 4242 up. Like the real heapprofd, a dump carries
//! a timestamp and one HeapSample per callstack with cumulative counts.

use std::{
    io::{Read, Write},
    process::exit,
    time::Duration,
};

use nix::sys::signal::{signal, SigHandler, SigSet, Signal};
use prost::Message;
use vitalsd::heapprofd::config::{heapprofd_config, HEAPPROFD_DATA_SOURCE};
use vitalsd::perfetto::protos::{
    self, profile_packet::ProcessHeapSamples, trace_packet::Data, TraceConfig, TracePacket,
};

const FIRST_FAKE_PID: u64 = 4242;

fn fail(msg: &str) -> ! {
    eprintln!("fake-perfetto: {msg}");
    exit(2)
}

fn parse_args() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [c, dash, o, out] if c == "--config" && dash == "-" && o == "--out" && out == "-" => {}
        _ => fail(&format!("expected `--config - --out -`, got {args:?}")),
    }
}

fn read_config() -> TraceConfig {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .unwrap_or_else(|e| fail(&format!("reading stdin: {e}")));
    if let Some(p) = std::env::var_os("FAKE_PERFETTO_CONFIG_OUT") {
        std::fs::write(&p, &bytes).unwrap_or_else(|e| fail(&format!("writing {p:?}: {e}")));
    }
    let cfg = TraceConfig::decode(bytes.as_slice())
        .unwrap_or_else(|e| fail(&format!("stdin is not a TraceConfig: {e}")));
    let Some(h) = heapprofd_config(&cfg) else {
        fail(&format!("no {HEAPPROFD_DATA_SOURCE} data source"))
    };
    if h.process_cmdline.is_empty() && h.pid.is_empty() {
        fail("heapprofd config has no target");
    }
    for ds in &cfg.data_sources {
        if ds
            .config
            .as_ref()
            .and_then(|c| c.session_initiator)
            .is_some()
        {
            fail("session_initiator is set by traced, not by the consumer");
        }
    }
    cfg
}

/// (pid, name) of every target: named ones get fake pids.
fn targets(cfg: &TraceConfig) -> Vec<(u64, String)> {
    let h = heapprofd_config(cfg).unwrap();
    let mut out: Vec<(u64, String)> = h
        .process_cmdline
        .iter()
        .enumerate()
        .map(|(i, n)| (FIRST_FAKE_PID + i as u64, n.clone()))
        .collect();
    out.extend(h.pid.iter().map(|&p| (p, format!("proc{p}"))));
    out
}

fn packet(data: Data) -> TracePacket {
    TracePacket {
        data: Some(data),
        trusted_packet_sequence_id: Some(1),
        ..Default::default()
    }
}

fn write_trace(cfg: &TraceConfig, mode: &str) {
    let t = targets(cfg);
    let interval = heapprofd_config(cfg).unwrap().sampling_interval_bytes;
    let mut packets = vec![
        packet(Data::TraceConfig(cfg.clone())),
        packet(Data::ProcessTree(protos::ProcessTree {
            processes: t
                .iter()
                .map(|(pid, name)| protos::process_tree::Process {
                    pid: Some(*pid as i32),
                    ppid: Some(1),
                    cmdline: vec![format!("/system/bin/{name}"), "--flag".into()],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })),
    ];
    if mode != "no-profile" {
        let dumps = t
            .iter()
            .map(|(pid, _)| ProcessHeapSamples {
                pid: Some(*pid),
                heap_name: Some("libc.malloc".into()),
                sampling_interval_bytes: interval,
                orig_sampling_interval_bytes: interval,
                buffer_overran: (mode == "overrun").then_some(true),
                timestamp: Some(1_000_000_000),
                samples: vec![
                    protos::profile_packet::HeapSample {
                        callstack_id: Some(1),
                        self_allocated: Some(3 * 4096),
                        alloc_count: Some(3),
                        self_freed: Some(4096),
                        free_count: Some(1),
                        ..Default::default()
                    },
                    protos::profile_packet::HeapSample {
                        callstack_id: Some(2),
                        self_allocated: Some(64 * 1024),
                        alloc_count: Some(1),
                        ..Default::default()
                    },
                ],
                stats: Some(protos::profile_packet::ProcessStats {
                    unwinding_errors: Some(0),
                    heap_samples: Some(4),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        packets.push(packet(Data::ProfilePacket(protos::ProfilePacket {
            process_dumps: dumps,
            index: Some(0),
            ..Default::default()
        })));
    }
    let bytes = protos::Trace { packet: packets }.encode_to_vec();
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)
        .and_then(|()| out.flush())
        .unwrap_or_else(|e| fail(&format!("writing the trace to stdout: {e}")));
}

fn main() {
    parse_args();
    let mode = std::env::var("FAKE_PERFETTO_MODE").unwrap_or_else(|_| "success".into());
    // Block SIGTERM before anything else so `hang` can sigwait for it.
    let mut term = SigSet::empty();
    term.add(Signal::SIGTERM);
    if mode == "hang" {
        term.thread_block().unwrap();
    }
    let cfg = read_config();
    match mode.as_str() {
        "success" | "overrun" | "no-profile" => {
            std::thread::sleep(Duration::from_millis(cfg.duration_ms().into()));
            write_trace(&cfg, &mode);
        }
        "refused" => {
            eprintln!(
                "[1.000]    perfetto_cmd.cc:1262 Service error: A trace with this unique \
                 session name ({}) already exists",
                cfg.unique_session_name()
            );
        }
        "exit1" => {
            eprintln!(
                "[1.000]    perfetto_cmd.cc:1216 Could not connect to the traced socket \
                 /dev/socket/traced_consumer. Ensure traced is running or use tracebox."
            );
            exit(1);
        }
        "hang" => {
            term.wait().unwrap();
            write_trace(&cfg, "success");
        }
        "hang-hard" => {
            // SAFETY: SIG_IGN installs no handler code.
            unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }.unwrap();
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        other => fail(&format!("unknown FAKE_PERFETTO_MODE {other:?}")),
    }
}
