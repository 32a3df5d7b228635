//! The rounds of `cargo xtask bench offcpu`, run by this same xtask binary
//! inside the KVM guest (Debian's 6.1 kernel with its headers, so bcc can
//! compile): `perf bench sched pipe` pinned to CPU 0, the configurations
//! interleaved per round with a rotating order, and each one's throughput
//! loss paired with offwaketime's in the same round (bench_overhead.rs's
//! design: pairing within a round cancels the drift between rounds on a
//! shared host).

use std::{
    collections::HashMap,
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::bench_overhead::{median, perf_bench, watch_for_marker};
use crate::util::Group;

/// bcc's front end (clang) compiles offwaketime's C at start: seconds on
/// a CPU, over 100 s under TCG on a loaded host.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(900);
/// offwaketime symbolises and prints every stack it kept when stopped.
const STOP_TIMEOUT: Duration = Duration::from_secs(600);
/// A tool's start-up has ended once its process used less than this
/// CPU over `QUIET_WINDOW` (a sixth of a vCPU: vitalsd's steady state
/// under TCG is 30-100 ms a second, its capture's first flushes several
/// hundred).
const QUIET_CPU_MS: f64 = 170.0;
const QUIET_WINDOW: Duration = Duration::from_secs(1);
/// How long a tool may take to quiet down after its marker.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Where the recordings go: the guest's disk, deleted after each run.
const TRACE: &str = "/root/bench-offcpu.pftrace";
const OFFWAKETIME: &str = "/usr/sbin/offwaketime-bpfcc";
/// vitalsd's standard output, its summary at exit: the last run's.
pub(super) const SUMMARY: &str = "/root/bench-offcpu-summary.txt";

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum Config {
    Nothing,
    /// The off-CPU capture of every thread, stacks of long blocks only:
    /// offwaketime's job, like for like.
    VitalsdOffcpu,
    /// The same with the sched timeline beside it (every switch and
    /// waking written): what rule captures record.
    VitalsdOffcpuSched,
    /// Always-on accounting only, off-CPU accounting (part 1) included.
    Vitalsd,
    /// Always-on accounting without part 1 (no sched_waking program):
    /// today's programs before it; the default's difference is its cost.
    VitalsdNoOffcpu,
    /// bcc's offwaketime, every thread, until stopped.
    Offwaketime,
    /// `--baseline`'s build, `record --offcpu`.
    BaselineOffcpu,
}

impl Config {
    pub(super) fn name(self) -> &'static str {
        match self {
            Config::Nothing => "nothing attached",
            Config::VitalsdOffcpu => "vitalsd record --offcpu",
            Config::VitalsdOffcpuSched => "vitalsd record --offcpu --sched",
            Config::Vitalsd => "vitalsd record",
            Config::VitalsdNoOffcpu => "vitalsd record --no-offcpu",
            Config::Offwaketime => "offwaketime-bpfcc",
            Config::BaselineOffcpu => "baseline record --offcpu",
        }
    }

    /// The tool's log line after which its steady state begins. A
    /// capture's is "capture started" (its maps made, the switch-in
    /// attached), not the accounting's attach before it: perf bench runs
    /// two seconds here, and starting it meanwhile counted a capture's
    /// start (making a stack map of thousands of buckets, emulated) as
    /// throughput loss. offwaketime's header likewise comes after its
    /// attach.
    fn marker(self) -> &'static str {
        match self {
            Config::VitalsdOffcpu | Config::VitalsdOffcpuSched | Config::BaselineOffcpu => {
                "capture started"
            }
            Config::Offwaketime => "Tracing blocked time",
            _ => "eBPF accounting attached",
        }
    }

    pub(super) fn vitalsd_args(self) -> Option<&'static [&'static str]> {
        match self {
            Config::VitalsdOffcpu | Config::BaselineOffcpu => Some(&["--offcpu"]),
            Config::VitalsdOffcpuSched => Some(&["--offcpu", "--sched"]),
            Config::Vitalsd => Some(&[]),
            Config::VitalsdNoOffcpu => Some(&["--no-offcpu"]),
            Config::Nothing | Config::Offwaketime => None,
        }
    }
}

const CONFIGS: [Config; 6] = [
    Config::Nothing,
    Config::VitalsdOffcpu,
    Config::VitalsdOffcpuSched,
    Config::Vitalsd,
    Config::VitalsdNoOffcpu,
    Config::Offwaketime,
];

/// A tool attached for one run; its process group dies with it.
pub(super) struct Tool {
    group: Group,
    reader: std::thread::JoinHandle<()>,
}

impl Tool {
    /// Starts `cfg` and returns once its programs are attached and its
    /// start-up is over (`settle`), with the time each took.
    pub(super) fn start(
        cfg: Config,
        vitalsd: &Path,
        baseline: Option<&Path>,
        settle: Duration,
    ) -> Result<Option<(Tool, Duration, Duration)>> {
        let started = Instant::now();
        let (mut group, marker) = if let Some(args) = cfg.vitalsd_args() {
            let bin = match cfg {
                Config::BaselineOffcpu => baseline.context("no --baseline")?,
                _ => vitalsd,
            };
            let mut c = Command::new(bin);
            c.args([
                "record",
                "--duration",
                "1h",
                "--interval",
                "1s",
                "--out",
                TRACE,
            ])
            .args(args)
            .env("RUST_LOG", "info")
            // Its summary (what the capture wrote) for `cost`'s report.
            .stdout(Stdio::from(
                std::fs::File::create(SUMMARY).with_context(|| format!("creating {SUMMARY}"))?,
            ))
            .stderr(Stdio::piped());
            let g = Group::spawn(&mut c).context("starting vitalsd")?;
            (g, cfg.marker())
        } else if cfg == Config::Offwaketime {
            let mut c = Command::new(OFFWAKETIME);
            // Unbuffered: its header goes to a pipe, and it is printed
            // right after the attach (offwaketime.py), our only sign of it.
            c.env("PYTHONUNBUFFERED", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let g = Group::spawn(&mut c).context("starting offwaketime")?;
            (g, cfg.marker())
        } else {
            return Ok(None);
        };
        let out: Box<dyn Read + Send> = match group.0.stderr.take() {
            Some(e) if cfg.vitalsd_args().is_some() => Box::new(e),
            err => {
                // offwaketime: its stderr (warnings) is shown, stdout scanned.
                if let Some(mut e) = err {
                    std::thread::spawn(move || {
                        let mut s = String::new();
                        let _ = e.read_to_string(&mut s);
                        for l in s.lines().take(20) {
                            eprintln!("  offwaketime stderr: {l}");
                        }
                    });
                }
                Box::new(group.0.stdout.take().context("no stdout")?)
            }
        };
        let (rx, reader) = watch_for_marker(out, marker);
        if rx.recv_timeout(ATTACH_TIMEOUT).is_err() {
            bail!(
                "{} did not attach within {} s",
                cfg.name(),
                ATTACH_TIMEOUT.as_secs()
            );
        }
        let took = started.elapsed();
        let tool = Tool { group, reader };
        let settled = tool.settle(cfg, settle)?;
        Ok(Some((tool, took, settled)))
    }

    /// Waits out the tool's one-time work after its marker: at least
    /// `least`, then until its own CPU over the last second is below
    /// `QUIET_CPU_MS`. That work is start-up, not steady-state loss:
    /// vitalsd's first sampling tick and process naming, and a capture's
    /// first flushes, which symbolise the stacks of every process whose
    /// block ended since it started (seconds under TCG; one-time per
    /// process image). offwaketime symbolises only after it is stopped.
    fn settle(&self, cfg: Config, least: Duration) -> Result<Duration> {
        let started = Instant::now();
        std::thread::sleep(least);
        let mut before = self.cpu_ms()?;
        loop {
            std::thread::sleep(QUIET_WINDOW);
            let now = self.cpu_ms()?;
            if now - before < QUIET_CPU_MS {
                return Ok(started.elapsed());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                bail!(
                    "{} still used {:.0} ms of CPU a second {} s after its start-up",
                    cfg.name(),
                    now - before,
                    SETTLE_TIMEOUT.as_secs()
                );
            }
            before = now;
        }
    }

    /// The tool's own CPU time so far (all its threads), in ms. Under
    /// single-threaded TCG its vCPU's time is taken from perf bench's, so
    /// it is part of the loss.
    fn cpu_ms(&self) -> Result<f64> {
        let pid = self.pid();
        let stat = procfs::process::Process::new(pid as i32)
            .and_then(|p| p.stat())
            .with_context(|| format!("reading /proc/{pid}/stat"))?;
        Ok(cpu_ms_of(&stat))
    }

    pub(super) fn pid(&self) -> u32 {
        self.group.0.id()
    }

    /// SIGINT (both tools end cleanly on it), then waits for the exit.
    pub(super) fn stop(mut self) -> Result<()> {
        self.group.signal(libc::SIGINT);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while self.group.0.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("did not stop within {} s of SIGINT", STOP_TIMEOUT.as_secs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(self.group);
        let _ = self.reader.join();
        let _ = std::fs::remove_file(TRACE);
        Ok(())
    }
}

/// utime + stime of a /proc stat (a process's: all its threads; or one
/// task's), in ms.
pub(super) fn cpu_ms_of(stat: &procfs::process::Stat) -> f64 {
    (stat.utime + stat.stime) as f64 * 1000.0 / procfs::ticks_per_second() as f64
}

/// Per config, the median and quartiles of CPU figures in ms.
fn print_cpu(cpu_ms: &HashMap<Config, Vec<f64>>) {
    print_spreads(cpu_ms, |c, (m, q1, q3)| {
        format!("  {:<28} {m:>6.0} ms ({q1:.0} .. {q3:.0})", c.name())
    });
}

/// Per config, by name, one line of the median and quartiles of `v`.
fn print_spreads(v: &HashMap<Config, Vec<f64>>, line: impl Fn(Config, (f64, f64, f64)) -> String) {
    let mut rows: Vec<(&Config, &Vec<f64>)> = v.iter().collect();
    rows.sort_by_key(|(c, _)| c.name());
    for (c, v) in rows {
        println!("{}", line(*c, spread(v.clone())));
    }
}

/// Median and quartiles (nearest rank) of `v`.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
    (median(v.clone()), q(0.25), q(0.75))
}

pub fn run(
    rounds: usize,
    loops: u64,
    vitalsd: PathBuf,
    baseline: Option<PathBuf>,
    least_settle_s: u64,
) -> Result<()> {
    let settle = Duration::from_secs(least_settle_s);
    anyhow::ensure!(rounds > 0, "--rounds must be at least 1");
    let mut configs = CONFIGS.to_vec();
    if baseline.is_some() {
        configs.push(Config::BaselineOffcpu);
    }
    println!(
        "guest kernel {}, {} CPUs online",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")?.trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "perf bench sched pipe -l {loops}, taskset -c 0, {rounds} interleaved rounds, each after its tool's start-up, at least {least_settle_s} s and until its own CPU is below {QUIET_CPU_MS} ms a second"
    );
    let mut ops: HashMap<Config, Vec<f64>> = HashMap::new();
    let mut attach_s: HashMap<Config, Vec<f64>> = HashMap::new();
    let mut tool_cpu_ms: HashMap<Config, Vec<f64>> = HashMap::new();
    let mut startup_cpu_ms: HashMap<Config, Vec<f64>> = HashMap::new();
    let mut settle_s: HashMap<Config, Vec<f64>> = HashMap::new();
    for round in 0..rounds {
        // Rotate the order so drift on the shared host hits every config alike.
        for i in 0..configs.len() {
            let cfg = configs[(i + round) % configs.len()];
            let tool = Tool::start(cfg, &vitalsd, baseline.as_deref(), settle)?;
            let cpu_before = tool.as_ref().map(|(t, ..)| t.cpu_ms()).transpose()?;
            let result = perf_bench(loops);
            if let Some((t, took, settled)) = tool {
                attach_s.entry(cfg).or_default().push(took.as_secs_f64());
                settle_s.entry(cfg).or_default().push(settled.as_secs_f64());
                let before = cpu_before.unwrap_or(0.0);
                startup_cpu_ms.entry(cfg).or_default().push(before);
                tool_cpu_ms
                    .entry(cfg)
                    .or_default()
                    .push(t.cpu_ms()? - before);
                t.stop().with_context(|| cfg.name())?;
            }
            let o = result?;
            println!("  round {round}: {:<28} {:>10.0} ops/s", cfg.name(), o);
            ops.entry(cfg).or_default().push(o);
        }
    }
    report(&ops, rounds, &attach_s, &tool_cpu_ms, &startup_cpu_ms);
    println!("settling, from the marker until the tool's own CPU was quiet (median, quartiles), not in the loss above:");
    print_spreads(&settle_s, |c, (m, q1, q3)| {
        format!("  {:<28} {m:.1} s ({q1:.1} .. {q3:.1})", c.name())
    });
    let mut measured = vec![
        Config::VitalsdOffcpu,
        Config::Vitalsd,
        Config::VitalsdNoOffcpu,
        Config::Offwaketime,
    ];
    if baseline.is_some() {
        measured.push(Config::BaselineOffcpu);
    }
    super::cost::report(&measured, loops, &vitalsd, baseline.as_deref(), settle)
}

fn report(
    ops: &HashMap<Config, Vec<f64>>,
    rounds: usize,
    attach_s: &HashMap<Config, Vec<f64>>,
    tool_cpu_ms: &HashMap<Config, Vec<f64>>,
    startup_cpu_ms: &HashMap<Config, Vec<f64>>,
) {
    let this = |c: Config, r: usize| ops[&c][r];
    let loss = |c: Config, r: usize| 1.0 - this(c, r) / this(Config::Nothing, r);
    let base = median(ops[&Config::Nothing].clone());
    println!("\nmedian ops/s, and throughput loss against nothing attached paired within each round (median, quartiles):");
    println!("  {:<28} {:>10.0} ops/s", Config::Nothing.name(), base);
    let mut rows: Vec<Config> = CONFIGS[1..].to_vec();
    if ops.contains_key(&Config::BaselineOffcpu) {
        rows.push(Config::BaselineOffcpu);
    }
    for c in rows {
        let (m, q1, q3) = spread((0..rounds).map(|r| loss(c, r) * 100.0).collect());
        println!(
            "  {:<28} {:>10.0} ops/s  loss {m:>5.1}%  ({q1:.1} .. {q3:.1})",
            c.name(),
            median(ops[&c].clone())
        );
    }
    println!("\nloss ratio to offwaketime, paired within each round (median, quartiles):");
    for c in [
        Config::VitalsdOffcpu,
        Config::VitalsdOffcpuSched,
        Config::Vitalsd,
        Config::VitalsdNoOffcpu,
    ] {
        let ratios = (0..rounds)
            .map(|r| loss(c, r) / loss(Config::Offwaketime, r).max(1e-9))
            .collect();
        let (m, q1, q3) = spread(ratios);
        println!("  {:<28} {m:.2}  ({q1:.2} .. {q3:.2})", c.name());
    }
    println!("  (target: vitalsd record --offcpu below half of offwaketime's loss, ratio < 0.50)");
    if ops.contains_key(&Config::BaselineOffcpu) {
        let base = Config::BaselineOffcpu;
        let ratios = (0..rounds)
            .map(|r| loss(base, r) / loss(Config::Offwaketime, r).max(1e-9))
            .collect();
        let (m, q1, q3) = spread(ratios);
        println!("  {:<28} {m:.2}  ({q1:.2} .. {q3:.2})", base.name());
        let (m, q1, q3) = spread(
            (0..rounds)
                .map(|r| loss(Config::VitalsdOffcpu, r) / loss(base, r).max(1e-9))
                .collect(),
        );
        println!(
            "this build's --offcpu loss / the baseline's, paired within each round: median {m:.2} ({q1:.2} .. {q3:.2}; 1.00: no change)"
        );
    }
    // Part 1's always-on cost: one sched_waking per wakeup, two a round
    // trip of the pipe, this workload's worst case.
    let part1 = (0..rounds)
        .map(|r| {
            (this(Config::VitalsdNoOffcpu, r) - this(Config::Vitalsd, r)) / this(Config::Nothing, r)
                * 100.0
        })
        .collect();
    let (m, q1, q3) = spread(part1);
    println!(
        "always-on off-CPU accounting's cost (--no-offcpu minus default, % of nothing-attached ops/s, paired within each round): median {m:.1} points ({q1:.1} .. {q3:.1})"
    );
    println!("the tool's own CPU during perf bench (its process, all threads; median, quartiles):");
    print_cpu(tool_cpu_ms);
    println!("the tool's own CPU before perf bench: its start-up and the settling after it (median, quartiles):");
    print_cpu(startup_cpu_ms);
    println!("start-up, from launch to the marker (median, quartiles), not in the loss above:");
    print_spreads(attach_s, |c, (m, q1, q3)| {
        format!(
            "  {:<28} {m:.1} s ({q1:.1} .. {q3:.1}) to \"{}\"",
            c.name(),
            c.marker()
        )
    });
}
