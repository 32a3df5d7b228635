//! A tracefs instance of the kernel's own tracer: the tests' witness of
//! which tracepoints fired. Its probe runs in the same tracepoint call as
//! the BPF programs', and it writes its ring buffer whatever
//! `bpf_prog_active` says, so it also sees what the classic programs are
//! skipped for. Stamps are CLOCK_BOOTTIME (trace_clock "boot", Perfetto's
//! clock). Removed on drop.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub struct Ftrace {
    dir: PathBuf,
    events: Vec<String>,
}

/// One record: the CPU whose buffer held it and its text line
/// ("<comm>-<pid> [000] d..2. 123.456789: sched_switch: ...").
#[derive(Debug, Clone)]
pub struct FtraceLine {
    pub cpu: u32,
    pub line: String,
}

impl Ftrace {
    /// Records `events` ("sched/sched_switch") in a new instance named
    /// after `what` and this process.
    pub fn start(what: &str, events: &[&str]) -> Self {
        let root = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.join("instances").is_dir())
            .expect("tracefs not mounted");
        let dir = root.join(format!("instances/vitals-{what}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let t = Self {
            dir,
            events: events.iter().map(|e| e.to_string()).collect(),
        };
        t.write("trace_clock", "boot");
        t.write("buffer_size_kb", "8192");
        // Reading a buffer while recording would pause the instance for
        // the read (5.11+, the option's default); older kernels lack it.
        let _ = std::fs::write(t.dir.join("options/pause-on-trace"), "0");
        for e in &t.events {
            t.write(&format!("events/{e}/enable"), "1");
        }
        t.write("tracing_on", "1");
        t
    }

    fn write(&self, file: &str, v: &str) {
        std::fs::write(self.dir.join(file), v).unwrap_or_else(|e| panic!("{file}: {e}"));
    }

    /// Stops recording.
    pub fn stop(&self) {
        self.write("tracing_on", "0");
    }

    /// Every record so far, CPU by CPU, each CPU's in order, and whether
    /// a CPU's buffer overran (then the records are no reference).
    pub fn lines(&self) -> (Vec<FtraceLine>, bool) {
        let mut overrun = false;
        let mut out = Vec::new();
        let mut cpu = 0u32;
        while self.dir.join(format!("per_cpu/cpu{cpu}")).is_dir() {
            let base = self.dir.join(format!("per_cpu/cpu{cpu}"));
            let stats = std::fs::read_to_string(base.join("stats")).unwrap();
            overrun |= stats
                .lines()
                .filter_map(|l| l.strip_prefix("overrun:"))
                .any(|n| n.trim().parse::<u64>().map_or(true, |n| n > 0));
            let text = std::fs::read_to_string(base.join("trace")).unwrap();
            out.extend(
                text.lines()
                    .filter(|l| !l.starts_with('#'))
                    .map(|l| FtraceLine {
                        cpu,
                        line: l.to_owned(),
                    }),
            );
            cpu += 1;
        }
        (out, overrun)
    }

    /// The pid of every sched_process_free this instance recorded (it
    /// must record `sched/sched_process_free`), a pid freed twice twice.
    pub fn frees(&self) -> Vec<u32> {
        let (frees, overrun) = self.free_records();
        assert!(!overrun, "the ftrace buffer overran: no reference");
        frees.into_iter().map(|(pid, _)| pid).collect()
    }

    /// Every sched_process_free record with the pid it freed, and whether
    /// a CPU's buffer overran.
    pub fn free_records(&self) -> (Vec<(u32, FtraceLine)>, bool) {
        let (lines, overrun) = self.lines();
        let frees = lines
            .into_iter()
            .filter(|l| l.is("sched_process_free"))
            .filter_map(|l| Some((u32::try_from(l.field("pid")?).ok()?, l)))
            .collect();
        (frees, overrun)
    }

    /// Polls `frees()` until `done` holds or `limit` passed: a task's
    /// free runs an RCU grace period after its reaping, which a loaded
    /// machine can stretch past any fixed sleep. Returns the last frees.
    pub fn wait_for(&self, limit: Duration, done: impl Fn(&[u32]) -> bool) -> Vec<u32> {
        let deadline = Instant::now() + limit;
        loop {
            let frees = self.frees();
            if done(&frees) || Instant::now() >= deadline {
                return frees;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pids of `pids` whose sched_process_free ran while a thread of
    /// pid 1 was current. This VM's kernel runs no BPF program then (the
    /// VM agent; README, Kernel support): their frees reached the tracer
    /// but not vitalsd. On a stock kernel they are seen like any other.
    pub fn freed_under_pid1(&self, pids: &[u32]) -> HashSet<u32> {
        let pid1_threads: HashSet<i32> = procfs::process::Process::new(1)
            .and_then(|p| p.tasks())
            .map(|tasks| tasks.flatten().map(|t| t.tid).collect())
            .unwrap_or_default();
        // An overrun loses records, so fewer frees are left out: the
        // callers then check more, never less.
        let (frees, _) = self.free_records();
        frees
            .into_iter()
            .filter(|(pid, l)| {
                pids.contains(pid) && l.current_tid().is_some_and(|t| pid1_threads.contains(&t))
            })
            .map(|(pid, _)| pid)
            .collect()
    }

    /// The pids of `pids` freed once `limit` passed or all were.
    pub fn wait_for_frees(&self, pids: &[u32], limit: Duration) -> HashSet<u32> {
        let of_pids = |frees: &[u32]| -> HashSet<u32> {
            frees.iter().copied().filter(|p| pids.contains(p)).collect()
        };
        of_pids(&self.wait_for(limit, |f| of_pids(f).len() == pids.len()))
    }
}

impl FtraceLine {
    /// Whether this is a record of `event` ("sched_switch").
    pub fn is(&self, event: &str) -> bool {
        self.line.contains(&format!(": {event}: "))
    }

    /// The record's stamp, in µs.
    pub fn ts_us(&self) -> Option<u64> {
        // After the "[cpu]" field: a comm may hold ": ".
        let after_cpu = &self.line[self.line.find("] ")?..];
        let head = after_cpu.split(": ").next()?;
        let (s, us) = head.rsplit(' ').next()?.split_once('.')?;
        Some(s.parse::<u64>().ok()? * 1_000_000 + us.parse::<u64>().ok()?)
    }

    /// The tid of the task that was current when the record was written
    /// (the `<comm>-<tid>` before the `[cpu]` field).
    pub fn current_tid(&self) -> Option<i32> {
        let head = &self.line[..self.line.find(" [")?];
        head.trim_end().rsplit('-').next()?.parse().ok()
    }

    /// The integer field `name` of the record ("prev_pid").
    pub fn field(&self, name: &str) -> Option<i64> {
        self.line
            .split(&format!(" {name}="))
            .nth(1)?
            .split(' ')
            .next()?
            .parse()
            .ok()
    }
}

impl Drop for Ftrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        for e in &self.events {
            let _ = std::fs::write(self.dir.join(format!("events/{e}/enable")), "0");
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::FtraceLine;

    #[test]
    fn the_current_task_is_the_tid_before_the_cpu_field() {
        let line = |s: &str| FtraceLine {
            cpu: 1,
            line: s.to_owned(),
        };
        let free = line(
            " tokio-rt-worker-75      [001] .Ns1. 64368.192033: sched_process_free: \
             comm=vitals-workload pid=5864 prio=120",
        );
        assert_eq!(free.current_tid(), Some(75));
        assert_eq!(free.field("pid"), Some(5864));
        // A comm may hold '-' and spaces.
        let idle =
            line("   Web Content-x-4012   [000] d..2. 1.000001: sched_switch: prev_pid=4012");
        assert_eq!(idle.current_tid(), Some(4012));
        assert_eq!(line("<idle>-0 [000] ...").current_tid(), Some(0));
    }
}
