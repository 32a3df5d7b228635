//! Shared harness of the kernel integration tests: controlled workloads,
//! the reference values the kernel itself reports, the official Perfetto
//! decoder, and trace_processor (see [`trace_processor`]).

pub mod bpf_stats;
pub mod bpffs;
pub mod daemon;
pub mod ftrace;
pub mod kernel_clock;
pub mod perfetto_service;
pub mod pid;
pub mod proc_stat;
pub mod tmpfs;
pub mod trace_processor;
pub mod traced;

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// These tests need the kernel. They fail (never skip) when not root, so CI
/// cannot go green without having run them.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "kernel integration tests need root (CAP_BPF, tracefs, perf events); run `cargo xtask test` as root"
    );
}

/// A running `vitals-workload` child.
pub struct Workload {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

pub fn workload_bin() -> PathBuf {
    let exe = std::env::var_os("VITALS_WORKLOAD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // Integration tests run from target/<profile>/deps/; cargo builds
            // the package's binaries into target/<profile>/ before them.
            let me = std::env::current_exe().unwrap();
            me.parent()
                .unwrap()
                .parent()
                .unwrap()
                .join("vitals-workload")
        });
    assert!(exe.exists(), "{} missing", exe.display());
    exe
}

/// The `fake-perfetto` test double of the perfetto command-line client
/// (tests/src/bin/fake-perfetto.rs), built next to `vitals-workload`.
pub fn fake_perfetto_bin() -> PathBuf {
    let exe = std::env::var_os("VITALS_FAKE_PERFETTO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let me = std::env::current_exe().unwrap();
            me.parent().unwrap().parent().unwrap().join("fake-perfetto")
        });
    assert!(exe.exists(), "{} missing", exe.display());
    exe
}

impl Workload {
    pub fn spawn(args: &[&str]) -> Self {
        Self::spawn_exe(&workload_bin(), args)
    }

    /// The workload run from another copy of its binary.
    pub fn spawn_exe(exe: &Path, args: &[&str]) -> Self {
        Self::spawn_command(Command::new(exe).args(args))
    }

    /// The workload with `arg0` as its argv[0], the name top shows.
    pub fn spawn_named(arg0: &str, args: &[&str]) -> Self {
        Self::spawn_command(Command::new(workload_bin()).arg0(arg0).args(args))
    }

    fn spawn_command(command: &mut Command) -> Self {
        let mut child = command
            // Its own group, which the guard kills with what it started.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning vitals-workload");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Blocks until the workload prints `line`.
    pub fn expect(&mut self, line: &str) {
        let mut got = String::new();
        self.stdout
            .read_line(&mut got)
            .expect("reading workload stdout");
        assert_eq!(got.trim(), line, "workload said {got:?}, expected {line:?}");
    }

    /// The next line the workload prints.
    pub fn read_line(&mut self) -> String {
        let mut got = String::new();
        self.stdout
            .read_line(&mut got)
            .expect("reading workload stdout");
        got.trim().to_owned()
    }

    /// `children`' pids ("child <pid>" as each is reaped) until "done".
    pub fn read_children(&mut self) -> Vec<u32> {
        let mut pids = Vec::new();
        loop {
            let line = self.read_line();
            if line == "done" {
                return pids;
            }
            pids.push(numbers_after(&line, "child")[0] as u32);
        }
    }

    /// The numbers of the next line, which must be `<word> <n>...`.
    pub fn read_numbers(&mut self, word: &str) -> Vec<i64> {
        numbers_after(&self.read_line(), word)
    }

    /// `pingpong n`: two threads passing a byte over pipes n times; returns
    /// the workload (waiting for `go`) and its two tids.
    pub fn spawn_ping_pong(n: u64) -> (Self, Vec<i64>) {
        let mut w = Self::spawn(&["pingpong", &n.to_string()]);
        let tids = w.read_numbers("tids");
        assert_eq!(tids.len(), 2, "workload said tids {tids:?}");
        (w, tids)
    }

    /// Lets a workload waiting for a line go on.
    pub fn go(&mut self) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(b"go\n").unwrap();
        s.flush().unwrap();
    }

    /// Closes stdin and reaps the child.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let st = self.child.wait().unwrap();
        assert!(st.success(), "workload exited with {st}");
    }
}

impl Drop for Workload {
    /// A workload a test did not finish (it failed first) is killed with
    /// its process group and reaped.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// The kernel's own per-process accounting, read with the `procfs` crate
/// (not our parser) so it is an independent reference.
pub struct KernelStat {
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub minflt: u64,
    pub majflt: u64,
    pub voluntary_ctxt_switches: u64,
    pub nonvoluntary_ctxt_switches: u64,
}

pub fn kernel_stat(pid: u32) -> KernelStat {
    let p = procfs::process::Process::new(pid as i32).expect("open /proc/<pid>");
    let st = p.stat().expect("/proc/<pid>/stat");
    let status = p.status().expect("/proc/<pid>/status");
    KernelStat {
        utime_ticks: st.utime,
        stime_ticks: st.stime,
        minflt: st.minflt,
        majflt: st.majflt,
        voluntary_ctxt_switches: status.voluntary_ctxt_switches.unwrap_or(0),
        nonvoluntary_ctxt_switches: status.nonvoluntary_ctxt_switches.unwrap_or(0),
    }
}

/// Waits until every thread of `pid` sleeps (a workload blocked reading
/// its stdin), so kernel figures read a moment apart agree: a workload
/// that has just printed a line may still fault or run before it blocks.
pub fn wait_blocked(pid: u32) {
    wait_tasks(pid, "blocked", |_| true);
}

/// [`wait_blocked`], and the main thread is the only one left: joined
/// threads that still run their exit paths are gone too.
pub fn wait_blocked_alone(pid: u32) {
    wait_tasks(pid, "blocked alone", |tids| tids == [pid as i32]);
}

/// [`wait_blocked`] with exactly `threads` threads beside the main one:
/// a workload that starts its threads all at once has them all, asleep.
/// Returns those threads' tids.
pub fn wait_blocked_with_threads(pid: u32, threads: usize) -> Vec<u32> {
    let tids = wait_tasks(pid, &format!("blocked with {threads} threads"), |tids| {
        tids.len() == threads + 1
    });
    tids.into_iter()
        .map(|t| t as u32)
        .filter(|&t| t != pid)
        .collect()
}

/// Polls (10 s at most) until every task of `pid` sleeps and the tids
/// listed satisfy `tids_ok`; returns those tids.
fn wait_tasks(pid: u32, what: &str, tids_ok: impl Fn(&[i32]) -> bool) -> Vec<i32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let p = procfs::process::Process::new(pid as i32).unwrap();
    loop {
        let tasks: Vec<_> = p.tasks().unwrap().flatten().collect();
        let tids: Vec<i32> = tasks.iter().map(|t| t.tid).collect();
        let asleep = tasks.iter().all(|t| t.stat().is_ok_and(|s| s.state == 'S'));
        if asleep && tids_ok(&tids) {
            return tids;
        }
        assert!(std::time::Instant::now() < deadline, "{pid} never {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The scheduler's own per-task figures from /proc/<pid>/schedstat:
/// sum_exec_runtime and run_delay (ns). run_delay is only maintained while
/// sched_info accounting is on: see [`DelayAcct`].
pub fn schedstat(pid: u32) -> (u64, u64) {
    let s = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.schedstat())
        .expect("/proc/<pid>/schedstat");
    (s.sum_exec_runtime, s.run_delay)
}

/// Waits until thread `tid` of `pid` is blocked in read(2) (on `fd`, when
/// given): its /proc/<pid>/task/<tid>/syscall (`<nr> <arg0 in hex> ...`
/// while it is in a syscall, `running` while it runs) shows read, and
/// its state is S, so it is in the call and off the CPU, not entering it.
/// Panics after 30 s.
pub fn wait_blocked_in_read(pid: i32, tid: i32, fd: Option<i32>) {
    let path = format!("/proc/{pid}/task/{tid}/syscall");
    let want = match fd {
        Some(fd) => format!("{} {:#x} ", libc::SYS_read, fd),
        None => format!("{} ", libc::SYS_read),
    };
    let sleeping = || {
        procfs::process::Process::new(pid)
            .and_then(|p| p.task_from_tid(tid))
            .and_then(|t| t.stat())
            .is_ok_and(|st| st.state == 'S')
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.starts_with(&want) && sleeping() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "thread {tid} of {pid} never blocked in read: {path} says {text:?}"
        );
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// Sets sysctls (paths under /proc/sys) for the life of the guard and puts
/// the old values back on drop, also when a later write of the same call
/// panics.
pub struct Sysctls(Vec<(&'static str, String)>);

impl Sysctls {
    pub fn set(values: &[(&'static str, &str)]) -> Self {
        let mut guard = Self(Vec::new());
        for (path, value) in values {
            let was =
                std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
            // Some values are one-way until reboot (unprivileged_bpf_disabled=1).
            std::fs::write(path, value)
                .unwrap_or_else(|e| panic!("writing {value} to {path}: {e}"));
            guard.0.push((*path, was.trim().to_owned()));
        }
        guard
    }
}

impl Drop for Sysctls {
    fn drop(&mut self) {
        for (path, value) in self.0.iter().rev() {
            if let Err(e) = std::fs::write(path, value) {
                eprintln!("restoring {path} to {value}: {e}");
            }
        }
    }
}

/// Turns on kernel.task_delayacct (which keeps sched_info.run_delay, our
/// independent reference for runqueue wait) until the guard drops. None
/// before Linux 5.14, which has no such sysctl: there delay accounting is
/// on unless booted with `nodelayacct` (and CONFIG_SCHEDSTATS keeps
/// sched_info on regardless); the tests' own check that run_delay grew
/// says so if it is not.
pub struct DelayAcct;

impl DelayAcct {
    const SYSCTL: &'static str = "/proc/sys/kernel/task_delayacct";

    /// Before Linux 5.14 there is no such sysctl: delay accounting is on
    /// from boot unless `nodelayacct` is given, and run_delay kept; then
    /// there is nothing to set (an empty guard).
    pub fn enable() -> Sysctls {
        if std::path::Path::new(Self::SYSCTL).exists() {
            Sysctls::set(&[(Self::SYSCTL, "1")])
        } else {
            Sysctls(Vec::new())
        }
    }
}

/// Drop counter `name` from the `map drops: k=v ...` line that `vitalsd
/// record` prints.
pub fn map_drop(table: &str, name: &str) -> u64 {
    table
        .lines()
        .find_map(|l| l.strip_prefix("map drops: "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the map drops line:\n{table}"))
}

/// This host's Firecracker guest kernel fires no sched_switch or syscall
/// tracepoint in its pid 1's threads (README "Reliability"): a few misses
/// a second that no program can avoid. Stock kernels trace every switch.
pub fn untraced_pid1() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").is_ok_and(|r| r.trim().contains("-fc"))
}

/// The running kernel's (major, minor), from uname(2): the tests' own
/// reading of which program kind a kernel must get.
pub fn kernel_version() -> (u32, u32) {
    let uts = nix::sys::utsname::uname().expect("uname");
    let release = uts.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// CLOCK_BOOTTIME in ns: the clock of vitalsd's capture records
/// (bpf_ktime_get_boot_ns), of ftrace under traced_probes and of the
/// traces trace_processor reads.
pub fn boottime_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("clock_gettime(CLOCK_BOOTTIME)");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

pub fn clk_tck() -> u64 {
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    assert!(v > 0);
    v as u64
}

/// The numbers of a workload line `<word> <n>...`; panics naming the line
/// otherwise.
pub fn numbers_after(line: &str, word: &str) -> Vec<i64> {
    line.strip_prefix(word)
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|rest| rest.split_whitespace().map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| panic!("workload said {line:?}, not {word} and numbers"))
}

/// Asserts |a - b| <= pct% of b.
pub fn assert_within_pct(what: &str, a: f64, b: f64, pct: f64) {
    let tol = b.abs() * pct / 100.0;
    assert!(
        (a - b).abs() <= tol,
        "{what}: {a} is not within {pct}% of reference {b} (tolerance {tol})"
    );
}

/// The Python with the official `perfetto` package (`cargo xtask setup`
/// installs it into .venv).
pub fn python() -> PathBuf {
    let p = std::env::var_os("VITALS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    assert!(
        p.exists(),
        "{} missing: run `cargo xtask setup` to install the official perfetto package",
        p.display()
    );
    p
}

/// Decodes a trace with the official schema (tests/python/trace_summary.py).
pub fn decode_trace(path: &Path) -> serde_json::Value {
    decode_trace_with(path, &[])
}

/// Same, with extra options, e.g. `--capture` (CompactSched per bundle
/// and perf samples with their frames resolved).
pub fn decode_trace_with(path: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(python())
        .arg(workspace_root().join("tests/python/trace_summary.py"))
        .args(args)
        .arg(path)
        .output()
        .expect("running trace_summary.py");
    assert!(
        out.status.success(),
        "official decoder rejected {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("trace_summary.py JSON")
}

/// The vitalsd binary `cargo xtask test` built.
pub fn vitalsd_bin() -> PathBuf {
    let p = std::env::var_os("VITALSD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/vitalsd"));
    assert!(
        p.exists(),
        "{} missing: build it first (`cargo xtask test` does)",
        p.display()
    );
    p
}

/// bpftrace running a script, as a second implementation to compare with.
pub struct Bpftrace {
    child: Child,
    out: std::sync::mpsc::Receiver<String>,
}

impl Bpftrace {
    /// Starts bpftrace and returns once its probes are attached.
    pub fn start(script: &str) -> Self {
        let mut child = Command::new("bpftrace")
            .args(["-e", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bpftrace (cargo xtask setup installs it)");
        let stdout = child.stdout.take().unwrap();
        let (attached_tx, attached_rx) = std::sync::mpsc::channel();
        let (out_tx, out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut all = String::new();
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 {
                if line.starts_with("Attaching") {
                    let _ = attached_tx.send(());
                }
                all.push_str(&line);
                line.clear();
            }
            let _ = out_tx.send(all);
        });
        attached_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("bpftrace did not attach");
        // "Attaching N probes..." comes just before the attach itself.
        std::thread::sleep(std::time::Duration::from_millis(500));
        Self { child, out }
    }

    /// SIGINT, then everything it printed (END blocks included).
    pub fn stop(mut self) -> String {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        self.out
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_default()
    }
}

/// `vitalsd record` running in the background.
pub struct Recording {
    pub child: Child,
    /// The last lines of its log after `marker`, for a failure's message
    /// (a panic's message is there).
    log_tail: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
}

impl Recording {
    /// Starts `vitalsd record ARGS` and returns once its log (stderr) shows
    /// `marker`, e.g. "eBPF accounting attached" or "capture started".
    pub fn start(args: &[&str], marker: &str) -> Self {
        require_root();
        let mut child = Command::new(vitalsd_bin())
            .arg("record")
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning vitalsd record");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                err.read_line(&mut line).unwrap() > 0,
                "vitalsd exited before logging {marker:?}"
            );
            if line.contains(marker) {
                break;
            }
        }
        // Keep draining stderr so the recorder never blocks on it, keeping
        // the last lines.
        let log_tail =
            std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let tail = log_tail.clone();
        std::thread::spawn(move || {
            let mut l = String::new();
            while err.read_line(&mut l).unwrap_or(0) > 0 {
                let mut t = tail.lock().unwrap();
                if t.len() == 40 {
                    t.pop_front();
                }
                t.push_back(std::mem::take(&mut l));
            }
        });
        Self { child, log_tail }
    }

    /// Waits for it to finish successfully; returns what it printed.
    pub fn wait(self) -> String {
        let out = self.child.wait_with_output().unwrap();
        if !out.status.success() {
            // The drain thread reaches EOF once the process is gone.
            std::thread::sleep(std::time::Duration::from_millis(200));
            let tail: String = self.log_tail.lock().unwrap().iter().cloned().collect();
            panic!(
                "vitalsd record failed: {}\n--- the end of its log ---\n{tail}",
                out.status
            );
        }
        String::from_utf8(out.stdout).unwrap()
    }
}

/// A `perf bench sched pipe` switch storm in its own process group. perf
/// forks a partner process; killing only the parent left the partner
/// spinning through the rest of the suite, so Drop kills the whole group.
pub struct SwitchStorm(Child);

impl SwitchStorm {
    pub fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let child = Command::new("perf")
            .args(["bench", "sched", "pipe", "-l", "100000000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("perf (cargo xtask setup installs linux-perf)");
        Self(child)
    }
}

impl Drop for SwitchStorm {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// One row of the top table `vitalsd record` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRow {
    pub pid: u32,
    /// As printed: at most 20 characters, without the `*` of an ended process.
    pub name: String,
    /// The process exited during the recording (`*` after its name).
    pub ended: bool,
    /// ONCPU_MS exactly as printed (three decimals).
    pub oncpu_ms: String,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// RUNQ_MS as printed (`-` when not measured).
    pub runq_ms: String,
    pub faults: u64,
}

/// Every process row of a printed top table, in printed order.
///
/// `PID PROCESS ONCPU_MS CORE_EQ% VOL_SW INVOL_SW RUNQ_MS FAULTS`: the name
/// may hold spaces, so it is what lies between the pid and the six numeric
/// columns at the end.
pub fn table_rows(table: &str) -> Vec<TableRow> {
    let mut in_table = false;
    let mut rows = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() == Some(&"PID") && fields.get(1) == Some(&"PROCESS") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let Some(pid) = fields.first().and_then(|p| p.parse::<u32>().ok()) else {
            // The legend after the rows ends the table.
            break;
        };
        assert!(fields.len() >= 8, "short table row: {line:?}");
        let n = fields.len();
        // The name: the text between the pid and the numeric columns, as
        // printed (padding trimmed).
        let after_pid = line.trim_start()[fields[0].len()..].trim_start();
        let mut name_end = after_pid.len();
        for f in fields[n - 6..].iter().rev() {
            name_end = after_pid[..name_end].trim_end().len() - f.len();
        }
        let printed = after_pid[..name_end].trim_end();
        let (name, ended) = match printed.strip_suffix('*') {
            Some(n) => (n.to_owned(), true),
            None => (printed.to_owned(), false),
        };
        let num = |i: usize| -> u64 {
            fields[i]
                .parse()
                .unwrap_or_else(|_| panic!("column {i} of {line:?} is not a count"))
        };
        rows.push(TableRow {
            pid,
            name,
            ended,
            oncpu_ms: fields[n - 6].to_owned(),
            voluntary_switches: num(n - 4),
            involuntary_switches: num(n - 3),
            runq_ms: fields[n - 2].to_owned(),
            faults: num(n - 1),
        });
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_keep_names_with_spaces_and_the_ended_mark() {
        let table = "vitalsd record: 3.26 s, 6 samples, faults from x\n\
            \x20   PID PROCESS                  ONCPU_MS  CORE_EQ%    VOL_SW  INVOL_SW     RUNQ_MS    FAULTS\n\
            \x20 27750 vitals-workload           934.177      28.7         0       370    2210.994         0\n\
            \x20 27914 rust-lld*                 824.328      25.3        68       277    4174.047     35744\n\
            \x20    12 Web Content*                1.000       0.1         1         2           -         3\n\
            (* = exited during the recording; CORE_EQ% = on-CPU time / wall time, may exceed 100%)\n\
            map drops: task_map_full=0\n";
        let rows = table_rows(table);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].name, "vitals-workload");
        assert!(!rows[0].ended);
        assert_eq!(rows[0].oncpu_ms, "934.177");
        assert_eq!(rows[0].involuntary_switches, 370);
        assert_eq!((rows[1].name.as_str(), rows[1].ended), ("rust-lld", true));
        assert_eq!(rows[1].faults, 35744);
        assert_eq!(
            (rows[2].name.as_str(), rows[2].ended),
            ("Web Content", true)
        );
        assert_eq!(rows[2].runq_ms, "-");
    }
}
