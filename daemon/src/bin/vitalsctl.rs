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
use serde::Serialize;
use vitalsd::{
    control::{
        printable,
        protocol::{OffcpuAsk, Status},
        render, Client,
    },
    heapprofd::TraceOutcome,
    store::EntryMeta,
};

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
        /// Off-CPU stacks (each long block's, and its waker's) of the
        /// processes the daemon's config lists in capture.offcpu_watch;
        /// implies --sched.
        #[arg(long)]
        offcpu: bool,
        /// Watch this process too (repeatable); implies --offcpu.
        #[arg(long)]
        offcpu_pid: Vec<u32>,
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
            offcpu,
            offcpu_pid,
            no_wait,
        } => {
            let offcpu =
                (offcpu || !offcpu_pid.is_empty()).then_some(OffcpuAsk { pids: offcpu_pid });
            let sched = sched || offcpu.is_some();
            capture(&mut c, json, duration, (sched, faults, offcpu), no_wait)?
        }
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
    show(json, &c.status()?, render::status)
}

/// `vitalsctl top`: the busiest processes every `interval`, redrawn in
/// place, or once.
fn top(c: &mut Client, json: bool, n: usize, once: bool, interval: Duration) -> Result<()> {
    loop {
        let v = c.top(n)?;
        if json {
            outln!("{}", as_json(&v))?;
        } else {
            // Clear the screen and home the cursor: refresh in place.
            if !once {
                out!("\x1b[2J\x1b[H")?;
            }
            out!("{}", render::top(&v))?;
        }
        std::io::stdout().flush().map_err(StdoutError)?;
        if once {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

/// `vitalsctl capture`: start a manual capture and, unless `no_wait`, wait
/// until it is stored.
fn capture(
    c: &mut Client,
    json: bool,
    duration: Duration,
    (sched, faults, offcpu): (bool, bool, Option<OffcpuAsk>),
    no_wait: bool,
) -> Result<()> {
    let v = c.capture(duration.as_secs_f64(), sched, faults, offcpu)?;
    let id = v.id.clone();
    if !json {
        eprintln!("capture {id} started ({duration:?})");
    }
    if !no_wait {
        let m = wait_stored(
            c,
            &id,
            |s| s.daemon.capture.as_ref(),
            "manual",
            duration,
            json,
        )?;
        print_stored(&m, json)?;
    } else if json {
        outln!("{}", as_json(&v))?;
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
    let id = c.heap(name, pid, duration.as_secs_f64())?.id;
    if !json {
        eprintln!("heapprofd session {id} started ({duration:?})");
    }
    let m = wait_stored(
        c,
        &id,
        |s| s.daemon.heap_session.as_ref(),
        "manual-heap",
        duration,
        json,
    )?;
    print_stored(&m, json)?;
    if !json {
        // What each profile caught: sampled allocations and their bytes.
        let outcome = heap_outcome(&m).unwrap_or_default();
        for p in &outcome.processes {
            outln!(
                "  pid {} {}: {} sampled allocation(s), {} B allocated, {} B freed, issues {}",
                p.pid,
                printable(p.name.as_deref().unwrap_or("?")),
                p.allocations,
                p.allocated_bytes,
                p.freed_bytes,
                printable(&as_json(&p.issues).to_string())
            )?;
        }
        for t in &outcome.targets {
            outln!("  target {}", printable(&as_json(t).to_string()))?;
        }
    }
    Ok(())
}

/// `vitalsctl list`: one line per stored capture.
fn list(c: &mut Client, json: bool) -> Result<()> {
    show(json, &c.list()?, |v| render::list(v))
}

/// What heapprofd's session report in an entry's metadata says of each
/// profile; None when it holds none (no profile, or an unreadable trace).
fn heap_outcome(m: &EntryMeta) -> Option<TraceOutcome> {
    #[derive(serde::Deserialize)]
    struct Report {
        outcome: Option<TraceOutcome>,
    }
    let report: Report = serde_json::from_value(m.heapprofd.clone()?).ok()?;
    report.outcome
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
    show(json, &c.delete(id)?, |v| {
        format!("deleted {}\n", printable(&v.deleted))
    })
}

/// `vitalsctl config`: the daemon's effective config as TOML.
fn config(c: &mut Client, json: bool) -> Result<()> {
    show(json, &c.config()?, |v| {
        format!("# {}\n{}", printable(&v.path), printable_lines(&v.toml))
    })
}

/// `vitalsctl dump`: the bugreport section.
fn dump(c: &mut Client, json: bool) -> Result<()> {
    show(json, &c.dump()?, |v| printable_lines(&v.text))
}

/// Multi-line text with each line made printable (its newlines kept).
fn printable_lines(s: &str) -> String {
    s.split('\n').map(printable).collect::<Vec<_>>().join("\n")
}

/// Polls until capture `id` is listed (returns its metadata), showing
/// progress; fails with the daemon's recorded outcome if it stops running
/// without being stored. `progress` picks the status field of the running
/// job, `rule` the trigger name its outcome is recorded under.
fn wait_stored(
    c: &mut Client,
    id: &str,
    progress: Progress,
    rule: &str,
    duration: Duration,
    json: bool,
) -> Result<EntryMeta> {
    let deadline = std::time::Instant::now() + duration + Duration::from_secs(120);
    loop {
        if let Some(m) = c.list()?.into_iter().find(|m| m.id == id) {
            if !json {
                eprintln!();
            }
            return Ok(m);
        }
        let st = c.status()?;
        if progress(&st).map(|p| p.id.as_str()) != Some(id) {
            let why = st
                .daemon
                .recent_triggers
                .iter()
                .rev()
                .find(|t| t.rule == rule)
                .map(|t| t.outcome.to_string())
                .unwrap_or_else(|| "unknown".into());
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

/// The running job `wait_stored` waits for, in a status answer.
type Progress = fn(&Status) -> Option<&vitalsd::control::protocol::RecordingProgress>;

/// One stored capture's metadata: JSON, or a line for people.
fn print_stored(m: &EntryMeta, json: bool) -> Result<(), StdoutError> {
    if json {
        outln!("{}", as_json(m))
    } else {
        outln!(
            "stored {}: {} bytes, {}",
            printable(&m.id),
            m.trace_bytes,
            printable(&m.status.to_string())
        )
    }
}

/// A reply as `--json` prints it: through `serde_json::Value`, whose maps
/// keep their keys sorted, as vitalsctl has always printed them.
fn as_json(v: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

fn show<T: Serialize>(json: bool, v: &T, human: impl Fn(&T) -> String) -> Result<()> {
    if json {
        outln!("{}", as_json(v))?;
    } else {
        let s = human(v);
        out!("{s}")?;
        if !s.ends_with('\n') {
            outln!()?;
        }
    }
    std::io::stdout().flush().map_err(StdoutError)?;
    Ok(())
}
