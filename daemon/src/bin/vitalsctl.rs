//! vitalsctl: the command-line client of vitalsd's control socket.
//! Human tables by default, `--json` for tools.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::Value;
use vitalsd::control::{Client, Request};

#[derive(Parser)]
#[command(name = "vitalsctl", version, about = "Talk to the vitalsd daemon")]
struct Cli {
    /// The daemon's control socket.
    #[arg(long, global = true, default_value = default_socket())]
    socket: PathBuf,
    /// Machine-readable output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

fn default_socket() -> &'static str {
    if cfg!(target_os = "android") {
        "/dev/socket/vitalsd"
    } else {
        "/run/vitalsd/vitalsd.sock"
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Daemon status: sampling, drops, triggers, store.
    Status,
    /// Busiest processes of the last window; refreshes in place.
    Top {
        #[arg(short, long, default_value_t = 15)]
        n: usize,
        /// Print once and exit.
        #[arg(long)]
        once: bool,
        #[arg(long, default_value = "1s", value_parser = vitalsd::config::parse_duration)]
        interval: Duration,
    },
    /// Record a capture now; waits until it is stored.
    Capture {
        #[arg(long, default_value = "10s", value_parser = vitalsd::config::parse_duration)]
        duration: Duration,
        #[arg(long)]
        sched: bool,
        #[arg(long)]
        faults: bool,
        /// Return as soon as the capture has started.
        #[arg(long)]
        no_wait: bool,
    },
    /// Profile a process's native heap with heapprofd (through the perfetto
    /// client, as the trusted system initiator); waits until it is stored.
    Heap {
        /// Process name as heapprofd matches it (normalised cmdline).
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        pid: Option<u64>,
        #[arg(long, default_value = "30s", value_parser = vitalsd::config::parse_duration)]
        duration: Duration,
    },
    /// Stored captures.
    List,
    /// Write a capture's trace to a file (or stdout with `-`).
    Export {
        id: String,
        out: PathBuf,
    },
    Delete {
        id: String,
    },
    /// The daemon's effective config.
    Config,
    /// The bugreport section (for dumpstate).
    Dump,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut c = Client::connect(&cli.socket)?;
    let json = cli.json;
    match cli.command {
        Cmd::Status => status(&mut c, json)?,
        Cmd::Top { n, once, interval } => top(&mut c, json, n, once, interval)?,
        Cmd::Capture {
            duration,
            sched,
            faults,
            no_wait,
        } => capture(&mut c, json, duration, sched, faults, no_wait)?,
        Cmd::Heap {
            name,
            pid,
            duration,
        } => heap(&mut c, json, name, pid, duration)?,
        Cmd::List => list(&mut c, json)?,
        Cmd::Export { id, out } => export(&mut c, &id, &out)?,
        Cmd::Delete { id } => delete(&mut c, json, id)?,
        Cmd::Config => config(&mut c, json)?,
        Cmd::Dump => dump(&mut c, json)?,
    }
    Ok(())
}

/// `vitalsctl status`: sampling, drops, triggers, store, running capture.
fn status(c: &mut Client, json: bool) -> Result<()> {
    show(json, c.call(&Request::Status {})?, |v| {
        let st = &v["store"];
        format!(
            "vitalsd {}: {} samples every {} ms, faults from {}\naccounting: {}, captures on {}\ncapabilities: {}\ncpu busy {}  loadavg {}\ntriggers fired {}, skipped {}\nbpf drops {}\nprocfs drops {}\nperfetto producer {}{}\nstore {}: {} captures, {} bytes; newest {}\n{}",
            v["version"].as_str().unwrap_or("?"),
            v["samples"],
            v["interval_ms"],
            v["fault_source"].as_str().unwrap_or("?"),
            v["accounting"].as_str().unwrap_or("?"),
            v["capture_backend"].as_str().unwrap_or("?"),
            v["capabilities"].as_str().unwrap_or("?"),
            v["local_busy_pct"].as_f64().map(|p| format!("{p:.1}%")).unwrap_or("-".into()),
            loadavg(&v["loadavg"]),
            v["triggers_fired"],
            v["triggers_skipped"],
            v["bpf_drops"],
            v["procfs_drops"],
            v["producer"],
            v["producer_error"].as_str().map(|e| format!(" (last error: {e})")).unwrap_or_default(),
            st["dir"].as_str().unwrap_or("?"),
            st["captures"],
            st["bytes"],
            st["newest"].as_str().unwrap_or("-"),
            match &v["capture"] {
                Value::Null => "no capture running".to_string(),
                cap => format!("capture running: {} ({})", cap["id"].as_str().unwrap_or("?"), cap["rule"].as_str().unwrap_or("?")),
            }
        )
    });
    Ok(())
}

/// `vitalsctl top`: the busiest processes every `interval`, redrawn in
/// place, or once.
fn top(c: &mut Client, json: bool, n: usize, once: bool, interval: Duration) -> Result<()> {
    loop {
        let v = c.call(&Request::Top { n })?;
        if json {
            println!("{v}");
        } else {
            // Clear the screen and home the cursor: refresh in place.
            if !once {
                print!("\x1b[2J\x1b[H");
            }
            print_top(&v);
        }
        std::io::stdout().flush()?;
        if once {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

/// One `top` answer as a table.
fn print_top(v: &Value) {
    println!(
        "cpu busy {}  loadavg {}",
        v["local_busy_pct"]
            .as_f64()
            .map(|p| format!("{p:.1}%"))
            .unwrap_or("-".into()),
        loadavg(&v["loadavg"])
    );
    println!(
        "{:>7} {:<24} {:>9} {:>9} {:>9} {:>8} {:>7} {:>7} {:>8} {:>8} {:>10}",
        "PID",
        "PROCESS",
        "CORE_EQ%",
        "MACHINE%",
        "ONCPU_MS",
        "RUNQ_MS",
        "VOL_SW",
        "INV_SW",
        "MINFLT",
        "MAJFLT",
        "RSS_KB"
    );
    for p in v["processes"].as_array().into_iter().flatten() {
        // eBPF columns: "-" on a process's first window.
        let e = &p["ebpf"];
        let ms = |k: &str| {
            e[k].as_f64()
                .map(|v| format!("{v:.1}"))
                .unwrap_or("-".into())
        };
        let n = |k: &str| e[k].as_u64().map(|v| v.to_string()).unwrap_or("-".into());
        println!(
            "{:>7} {:<24} {:>9.1} {:>9.1} {:>9} {:>8} {:>7} {:>7} {:>8} {:>8} {:>10}",
            p["pid"].as_i64().unwrap_or(0),
            p["name"]
                .as_str()
                .unwrap_or("?")
                .chars()
                .take(24)
                .collect::<String>(),
            p["core_equivalent_pct"].as_f64().unwrap_or(0.0),
            p["machine_share_pct"].as_f64().unwrap_or(0.0),
            ms("oncpu_ms"),
            ms("runq_wait_ms"),
            n("voluntary_switches"),
            n("involuntary_switches"),
            p["minflt"].as_u64().unwrap_or(0),
            p["majflt"].as_u64().unwrap_or(0),
            p["rss_kb"]
                .as_u64()
                .map(|k| k.to_string())
                .unwrap_or("-".into())
        );
    }
}

/// `vitalsctl capture`: start a manual capture and, unless `no_wait`, wait
/// until it is stored.
fn capture(
    c: &mut Client,
    json: bool,
    duration: Duration,
    sched: bool,
    faults: bool,
    no_wait: bool,
) -> Result<()> {
    let v = c.call(&Request::Capture {
        duration_s: duration.as_secs_f64(),
        sched,
        faults,
    })?;
    let id = v["id"].as_str().context("no capture id")?.to_owned();
    if !json {
        eprintln!("capture {id} started ({duration:?})");
    }
    if !no_wait {
        let m = wait_stored(c, &id, "capture", "manual", duration, json)?;
        print_stored(&m, json);
    } else if json {
        println!("{v}");
    }
    Ok(())
}

/// `vitalsctl heap`: start a heapprofd session and wait until it is stored.
fn heap(
    c: &mut Client,
    json: bool,
    name: Option<String>,
    pid: Option<u64>,
    duration: Duration,
) -> Result<()> {
    if name.is_none() && pid.is_none() {
        bail!("give --name or --pid");
    }
    let v = c.call(&Request::Heap {
        name,
        pid,
        duration_s: duration.as_secs_f64(),
    })?;
    let id = v["id"].as_str().context("no session id")?.to_owned();
    if !json {
        eprintln!("heapprofd session {id} started ({duration:?})");
    }
    let m = wait_stored(c, &id, "heap_session", "manual-heap", duration, json)?;
    print_stored(&m, json);
    if !json {
        // What each profile caught: sampled allocations and their bytes.
        for p in m["heapprofd"]["outcome"]["processes"]
            .as_array()
            .into_iter()
            .flatten()
        {
            println!(
                "  pid {} {}: {} sampled allocation(s), {} B allocated, {} B freed, issues {}",
                p["pid"],
                p["name"].as_str().unwrap_or("?"),
                p["allocations"],
                p["allocated_bytes"],
                p["freed_bytes"],
                p["issues"]
            );
        }
        for t in m["heapprofd"]["outcome"]["targets"]
            .as_array()
            .into_iter()
            .flatten()
        {
            println!("  target {t}");
        }
    }
    Ok(())
}

/// `vitalsctl list`: one line per stored capture.
fn list(c: &mut Client, json: bool) -> Result<()> {
    show(json, c.call(&Request::List {})?, |v| {
        let mut s = format!(
            "{:<40} {:<18} {:>10} {:>9}  {}\n",
            "ID", "RULE", "BYTES", "SECONDS", "STATUS"
        );
        for m in v.as_array().into_iter().flatten() {
            s += &format!(
                "{:<40} {:<18} {:>10} {:>9.1}  {}\n",
                m["id"].as_str().unwrap_or("?"),
                m["trigger"]["rule"].as_str().unwrap_or("?"),
                m["trace_bytes"].as_u64().unwrap_or(0),
                m["duration_ms"].as_f64().unwrap_or(0.0) / 1000.0,
                m["status"].as_str().unwrap_or("?")
            );
        }
        s
    });
    Ok(())
}

/// `vitalsctl export`: the trace's bytes to `out`, or stdout for `-`.
fn export(c: &mut Client, id: &str, out: &Path) -> Result<()> {
    let n = if out.as_os_str() == "-" {
        c.export(id, &mut std::io::stdout().lock())?
    } else {
        let mut f =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let n = c.export(id, &mut f)?;
        f.sync_all()?;
        n
    };
    if out.as_os_str() != "-" {
        eprintln!("wrote {n} bytes to {}", out.display());
    }
    Ok(())
}

/// `vitalsctl delete`.
fn delete(c: &mut Client, json: bool, id: String) -> Result<()> {
    show(json, c.call(&Request::Delete { id })?, |v| {
        format!("deleted {}\n", v["deleted"].as_str().unwrap_or("?"))
    });
    Ok(())
}

/// `vitalsctl config`: the daemon's effective config as TOML.
fn config(c: &mut Client, json: bool) -> Result<()> {
    show(json, c.call(&Request::Config {})?, |v| {
        format!(
            "# {}\n{}",
            v["path"].as_str().unwrap_or("?"),
            v["toml"].as_str().unwrap_or("")
        )
    });
    Ok(())
}

/// `vitalsctl dump`: the bugreport section.
fn dump(c: &mut Client, json: bool) -> Result<()> {
    show(json, c.call(&Request::Dump {})?, |v| {
        v["text"].as_str().unwrap_or("").to_string()
    });
    Ok(())
}

/// Polls until capture `id` is listed (returns its metadata), showing
/// progress; fails with the daemon's recorded outcome if it stops running
/// without being stored. `progress` is the status key of the running job,
/// `rule` the trigger name its outcome is recorded under.
fn wait_stored(
    c: &mut Client,
    id: &str,
    progress: &str,
    rule: &str,
    duration: Duration,
    json: bool,
) -> Result<Value> {
    let deadline = std::time::Instant::now() + duration + Duration::from_secs(120);
    loop {
        let list = c.call(&Request::List {})?;
        if let Some(m) = list
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["id"] == id)
        {
            if !json {
                eprintln!();
            }
            return Ok(m.clone());
        }
        let st = c.call(&Request::Status {})?;
        if st[progress]["id"] != id {
            let why = st["recent_triggers"]
                .as_array()
                .and_then(|t| t.iter().rev().find(|t| t["rule"] == rule))
                .and_then(|t| t["outcome"].as_str())
                .unwrap_or("unknown");
            bail!("{id} was not stored: {why}");
        }
        if std::time::Instant::now() > deadline {
            bail!("{id} still not stored");
        }
        if !json {
            eprint!(".");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One stored capture's metadata: JSON, or a line for people.
fn print_stored(m: &Value, json: bool) {
    if json {
        println!("{m}");
    } else {
        println!(
            "stored {}: {} bytes, {}",
            m["id"].as_str().unwrap_or("?"),
            m["trace_bytes"],
            m["status"].as_str().unwrap_or("?")
        );
    }
}

fn show(json: bool, v: Value, human: impl Fn(&Value) -> String) {
    if json {
        println!("{v}");
    } else {
        let s = human(&v);
        print!("{s}");
        if !s.ends_with('\n') {
            println!();
        }
    }
}

fn loadavg(v: &Value) -> String {
    match v.as_array() {
        Some(a) => a
            .iter()
            .map(|x| format!("{:.2}", x.as_f64().unwrap_or(0.0)))
            .collect::<Vec<_>>()
            .join(" "),
        None => "-".into(),
    }
}
