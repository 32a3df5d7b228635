//! vitalsctl: the command-line client of vitalsd's control socket.
//! Human tables by default, `--json` for tools. Every string the daemon
//! relays from elsewhere (process names, rule names, errors) is printed
//! through `printable`, so it cannot drive the terminal or break a table.
//! A closed stdout (`vitalsctl top | head`) ends it as SIGPIPE ends other
//! tools, quietly.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::Value;
use vitalsd::control::{printable, Client, Request};

/// A write to stdout failed: told apart from the socket's errors, so that
/// only a closed stdout (EPIPE) ends us quietly.
#[derive(Debug, thiserror::Error)]
#[error("writing to stdout: {0}")]
struct StdoutError(std::io::Error);

/// `println!` that returns stdout's error instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(StdoutError)
    };
}

/// `print!`, likewise.
macro_rules! out {
    ($($arg:tt)*) => {
        write!(std::io::stdout().lock(), $($arg)*).map_err(StdoutError)
    };
}

/// A string field of the daemon's answer, safe to print.
fn text<'a>(v: &'a Value, default: &'a str) -> std::borrow::Cow<'a, str> {
    printable(v.as_str().unwrap_or(default))
}

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

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<StdoutError>()
                .is_some_and(|StdoutError(io)| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            // The reader went away (`| head`): end as the default SIGPIPE
            // disposition ends `cat` or `ps` there, with no message; Rust
            // ignores SIGPIPE, so restore it and raise it.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
            }
            ExitCode::from(128 + libc::SIGPIPE as u8)
        }
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
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
            "vitalsd {}: {} samples every {} ms, faults from {}\naccounting: {}, captures on {}\ntier: {} ({}){}\ncapabilities: {}\ncpu busy {}  loadavg {}\ntriggers fired {}, skipped {}\nbpf drops {}\nprocfs drops {}\nperfetto producer {}{}\nstore {}: {} captures, {} bytes; newest {}\n{}",
            text(&v["version"], "?"),
            v["samples"],
            v["interval_ms"],
            text(&v["fault_source"], "?"),
            text(&v["accounting"], "?"),
            text(&v["capture_backend"], "?"),
            text(&v["tier"], "?"),
            text(&v["tier_gives"], "?"),
            match v["sched_procfs"].as_object() {
                Some(m) if !m.is_empty() => format!("\nschedstat source {}", v["sched_procfs"]),
                _ => String::new(),
            },
            text(&v["capabilities"], "?"),
            v["local_busy_pct"].as_f64().map(|p| format!("{p:.1}%")).unwrap_or("-".into()),
            loadavg(&v["loadavg"]),
            v["triggers_fired"],
            printable(&v["triggers_skipped"].to_string()),
            v["bpf_drops"],
            v["procfs_drops"],
            v["producer"],
            v["producer_error"].as_str().map(|e| format!(" (last error: {})", printable(e))).unwrap_or_default(),
            text(&st["dir"], "?"),
            st["captures"],
            st["bytes"],
            text(&st["newest"], "-"),
            match &v["capture"] {
                Value::Null => "no capture running".to_string(),
                cap => format!("capture running: {} ({})", text(&cap["id"], "?"), text(&cap["rule"], "?")),
            }
        )
    })
}

/// `vitalsctl top`: the busiest processes every `interval`, redrawn in
/// place, or once.
fn top(c: &mut Client, json: bool, n: usize, once: bool, interval: Duration) -> Result<()> {
    loop {
        let v = c.call(&Request::Top { n })?;
        if json {
            outln!("{v}")?;
        } else {
            // Clear the screen and home the cursor: refresh in place.
            if !once {
                out!("\x1b[2J\x1b[H")?;
            }
            print_top(&v)?;
        }
        std::io::stdout().flush().map_err(StdoutError)?;
        if once {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

/// One `top` answer as a table.
fn print_top(v: &Value) -> Result<(), StdoutError> {
    outln!(
        "cpu busy {}  loadavg {}",
        v["local_busy_pct"]
            .as_f64()
            .map(|p| format!("{p:.1}%"))
            .unwrap_or("-".into()),
        loadavg(&v["loadavg"])
    )?;
    outln!(
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
    )?;
    for p in v["processes"].as_array().into_iter().flatten() {
        // eBPF columns: "-" on a process's first window.
        let e = &p["ebpf"];
        let ms = |k: &str| {
            e[k].as_f64()
                .map(|v| format!("{v:.1}"))
                .unwrap_or("-".into())
        };
        let n = |k: &str| e[k].as_u64().map(|v| v.to_string()).unwrap_or("-".into());
        outln!(
            "{:>7} {:<24} {:>9.1} {:>9.1} {:>9} {:>8} {:>7} {:>7} {:>8} {:>8} {:>10}",
            p["pid"].as_i64().unwrap_or(0),
            text(&p["name"], "?").chars().take(24).collect::<String>(),
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
        )?;
    }
    Ok(())
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
        print_stored(&m, json)?;
    } else if json {
        outln!("{v}")?;
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
    print_stored(&m, json)?;
    if !json {
        // What each profile caught: sampled allocations and their bytes.
        for p in m["heapprofd"]["outcome"]["processes"]
            .as_array()
            .into_iter()
            .flatten()
        {
            outln!(
                "  pid {} {}: {} sampled allocation(s), {} B allocated, {} B freed, issues {}",
                p["pid"],
                text(&p["name"], "?"),
                p["allocations"],
                p["allocated_bytes"],
                p["freed_bytes"],
                printable(&p["issues"].to_string())
            )?;
        }
        for t in m["heapprofd"]["outcome"]["targets"]
            .as_array()
            .into_iter()
            .flatten()
        {
            outln!("  target {}", printable(&t.to_string()))?;
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
                text(&m["id"], "?"),
                text(&m["trigger"]["rule"], "?"),
                m["trace_bytes"].as_u64().unwrap_or(0),
                m["duration_ms"].as_f64().unwrap_or(0.0) / 1000.0,
                text(&m["status"], "?")
            );
        }
        s
    })
}

/// stdout that remembers its own write error, to tell it from the socket's.
struct Stdout(Option<std::io::Error>);

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().lock().write(buf).inspect_err(|e| {
            self.0 = Some(std::io::Error::new(e.kind(), e.to_string()));
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().lock().flush().inspect_err(|e| {
            self.0 = Some(std::io::Error::new(e.kind(), e.to_string()));
        })
    }
}

/// `vitalsctl export`: the trace's bytes to `out`, or stdout for `-`.
/// A file is written under a temporary name beside it and renamed over
/// `out` only once the whole trace arrived: a wrong id or a cut stream
/// leaves an existing `out` as it was.
fn export(c: &mut Client, id: &str, out: &Path) -> Result<()> {
    if out.as_os_str() == "-" {
        let mut stdout = Stdout(None);
        let r = c.export(id, &mut stdout);
        if let Some(e) = stdout.0.take() {
            return Err(StdoutError(e).into());
        }
        r?;
        return Ok(());
    }
    let name = out
        .file_name()
        .with_context(|| format!("{} names no file", out.display()))?;
    let tmp = out.with_file_name(format!(
        ".{}.vitalsctl-{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| -> Result<u64> {
        // create_new: never through a planted file or symlink; mode 0666
        // before the umask, as File::create would.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        let n = c.export(id, &mut f)?;
        f.sync_all()?;
        std::fs::rename(&tmp, out)
            .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
        Ok(n)
    })();
    match written {
        Ok(n) => {
            eprintln!("wrote {n} bytes to {}", out.display());
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// `vitalsctl delete`.
fn delete(c: &mut Client, json: bool, id: String) -> Result<()> {
    show(json, c.call(&Request::Delete { id })?, |v| {
        format!("deleted {}\n", text(&v["deleted"], "?"))
    })
}

/// `vitalsctl config`: the daemon's effective config as TOML.
fn config(c: &mut Client, json: bool) -> Result<()> {
    show(json, c.call(&Request::Config {})?, |v| {
        format!(
            "# {}\n{}",
            text(&v["path"], "?"),
            printable_lines(v["toml"].as_str().unwrap_or(""))
        )
    })
}

/// `vitalsctl dump`: the bugreport section.
fn dump(c: &mut Client, json: bool) -> Result<()> {
    show(json, c.call(&Request::Dump {})?, |v| {
        printable_lines(v["text"].as_str().unwrap_or(""))
    })
}

/// Multi-line text with each line made printable (its newlines kept).
fn printable_lines(s: &str) -> String {
    s.split('\n').map(printable).collect::<Vec<_>>().join("\n")
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
fn print_stored(m: &Value, json: bool) -> Result<(), StdoutError> {
    if json {
        outln!("{m}")
    } else {
        outln!(
            "stored {}: {} bytes, {}",
            text(&m["id"], "?"),
            m["trace_bytes"],
            text(&m["status"], "?")
        )
    }
}

fn show(json: bool, v: Value, human: impl Fn(&Value) -> String) -> Result<()> {
    if json {
        outln!("{v}")?;
    } else {
        let s = human(&v);
        out!("{s}")?;
        if !s.ends_with('\n') {
            outln!()?;
        }
    }
    std::io::stdout().flush().map_err(StdoutError)?;
    Ok(())
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
