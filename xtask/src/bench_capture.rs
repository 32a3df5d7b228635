//! `cargo xtask bench capture`: what the capture tier writes and loses
//! under the heaviest scheduler load there is.
//!
//! `perf bench sched pipe` runs at full speed (unpinned, both CPUs) while
//! `vitalsd record --sched --duration 5s` captures. Then the trace is
//! decoded with the official schema and we report: sched_switch events
//! written, bytes of the FtraceEventBundle packets per switch (framing
//! included; wakings and intern tables are in there too) and of the switch
//! columns alone, and ring-buffer loss (the kernel's per-CPU counter as
//! vitalsd reports it, and bundles flagged lost_events). Targets: <= 10
//! bytes per switch, no loss at the default buffer size.
//!
//! `--transport perf` runs the same over the per-CPU perf event array (the
//! fallback for kernels without ringbuf), with the same total buffer bytes.

use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::util::{output, workspace_root};

const MEASURE: &str = r#"
import sys
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

def varint_len(n):
    l = 1
    while n >= 0x80:
        n >>= 7
        l += 1
    return l

t = pb.Trace()
t.ParseFromString(open(sys.argv[1], "rb").read())
switches = wakings = bundle_bytes = switch_bytes = lost_bundles = bundles = 0
for p in t.packet:
    if p.WhichOneof("data") != "ftrace_events":
        continue
    b = p.ftrace_events
    n = len(p.SerializeToString())
    bundle_bytes += 1 + varint_len(n) + n
    bundles += 1
    lost_bundles += 1 if b.lost_events else 0
    cs = b.compact_sched
    switches += len(cs.switch_timestamp)
    wakings += len(cs.waking_timestamp)
    only = pb.FtraceEventBundle.CompactSched()
    for f in ("switch_timestamp", "switch_prev_state", "switch_next_pid",
              "switch_next_prio", "switch_next_comm_index"):
        getattr(only, f).extend(getattr(cs, f))
    switch_bytes += len(only.SerializeToString())
print(switches, wakings, bundles, bundle_bytes, switch_bytes, lost_bundles)
"#;

pub fn run(transport: &str) -> Result<()> {
    let root = workspace_root();
    let vitalsd = root.join("target/release/vitalsd");
    if !vitalsd.exists() {
        bail!(
            "{} missing: cargo build --release -p vitalsd",
            vitalsd.display()
        );
    }
    let python = root.join(".venv/bin/python");
    let trace = root.join("target/bench-capture.pftrace");

    let mut perf = Command::new("perf")
        .args(["bench", "sched", "pipe", "-l", "1000000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf bench sched pipe")?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    let rec = Command::new(&vitalsd)
        .args([
            "record",
            "--sched",
            "--duration",
            "5s",
            "--top",
            "5",
            "--capture-transport",
            transport,
            "--out",
        ])
        .arg(&trace)
        .env("RUST_LOG", "warn")
        .output()
        .context("running vitalsd record --sched");
    let _ = perf.kill();
    let _ = perf.wait();
    let rec = rec?;
    let table = String::from_utf8_lossy(&rec.stdout).into_owned();
    if !rec.status.success() {
        bail!(
            "vitalsd record failed: {}: {}",
            rec.status,
            String::from_utf8_lossy(&rec.stderr)
        );
    }
    let capture_line = table
        .lines()
        .find(|l| l.starts_with("capture: "))
        .context("no capture line in vitalsd output")?
        .to_owned();
    // "... ring buffer lost: <n> sched, <m> fault records ..."
    let lost_sched: u64 = capture_line
        .split("ring buffer lost: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("no ring buffer loss figure")?;

    let m = output(Command::new(&python).args(["-c", MEASURE]).arg(&trace))?;
    let v: Vec<u64> = m
        .split_whitespace()
        .map(|x| x.parse())
        .collect::<Result<_, _>>()
        .with_context(|| format!("measure output {m:?}"))?;
    let [switches, wakings, bundles, bundle_bytes, switch_bytes, lost_bundles] = v[..] else {
        bail!("measure output {m:?}");
    };
    let per = |b: u64| b as f64 / switches.max(1) as f64;
    println!("cargo xtask bench capture --transport {transport}: vitalsd record --sched --capture-transport {transport} --duration 5s during perf bench sched pipe (unpinned)");
    println!(
        "  sched_switch events written   {switches} ({:.0}/s)",
        switches as f64 / 5.0
    );
    println!("  sched_waking events written   {wakings}");
    println!("  FtraceEventBundle packets     {bundles}, {bundle_bytes} bytes");
    println!(
        "  bytes per switch, all bundle bytes (incl. wakings)  {:.2}",
        per(bundle_bytes)
    );
    println!(
        "  bytes per switch, switch columns only               {:.2}",
        per(switch_bytes)
    );
    println!(
        "  ring-buffer lost sched records {lost_sched}; bundles flagged lost_events {lost_bundles}"
    );
    println!("  vitalsd: {capture_line}");
    Ok(())
}
