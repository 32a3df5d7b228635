//! One scan of procfs into a raw [`Sample`]: counters and clocks, no deltas.
//!
//! Cost matters (the always-on tier): buffers, the path and the pid list are
//! reused across scans, directories are listed with getdents64 into a reused
//! buffer (glibc's opendir adds an fstat per directory), and each file is one
//! open + one read + one close. Failures are counted, never fatal: a process
//! can exit at any point of the scan.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::{debug, warn};
use thiserror::Error;

use super::cmdline::parse_cmdline;
use super::loadavg::{read_loadavg, LoadAvg};
use super::pid_stat::{parse_pid_stat, PidStat};
use super::pid_status::{parse_pid_status, PidStatus};
use super::pressure::{read_pressure, PsiResource, PsiState};
use super::stat::{read_stat, SystemStat};
use super::{is_vanished, read_into, read_task_file, ProcPath, ReadOutcome};
use crate::clock::ClockPair;

#[derive(Debug, Error)]
pub enum SamplerError {
    #[error("listing {path}: {source}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What to read besides the per-task stat files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleOptions {
    /// Also read /proc/<pid>/task/<tid>/stat for every thread.
    pub threads: bool,
    /// Also read /proc/<pid>/status (uid, RSS, swap). Re-read when the
    /// process's stat shows it ran, faulted or its RSS moved, and at least
    /// every `STATUS_REFRESH_SCANS` scans; reused in between (an idle
    /// process's status does not change, and reading every one every
    /// second was a fifth of the daemon's idle CPU).
    pub status: bool,
    /// Read /proc/<pid>/cmdline once per process instance.
    pub cmdline: bool,
}

/// Failures met during one scan. They are folded into the window's
/// `DropCounters` by the tasks room (`sources::tasks`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanCounts {
    /// Reads that failed for a reason other than the task exiting
    /// (EACCES under hidepid/SELinux, parse errors, ...).
    pub read_failures: u64,
    /// Pids listed by readdir that were gone when opened (ENOENT/ESRCH).
    pub vanished_pids: u64,
    /// Same for tids under /proc/<pid>/task.
    pub vanished_tids: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSample {
    pub stat: PidStat,
    pub status: Option<PidStatus>,
    /// Shared with the sampler's per-instance cache: read once per
    /// (pid, starttime).
    pub cmdline: Option<Arc<str>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSample {
    /// The owning process.
    pub tgid: i32,
    /// `stat.pid` is the tid.
    pub stat: PidStat,
}

/// Raw counters from one scan, with the clocks read just before it.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub clock: Option<ClockPair>,
    /// None if /proc/stat could not be read (counted in `counts`).
    pub system: Option<SystemStat>,
    pub loadavg: Option<LoadAvg>,
    /// cpu, memory, io; None if the read failed for another reason than PSI
    /// being unavailable.
    pub pressure: [Option<PsiState>; 3],
    pub processes: Vec<ProcessSample>,
    /// Empty unless `SampleOptions::threads`.
    pub threads: Vec<ThreadSample>,
    /// Pids (and, with threads, tids) that exist but whose stat could not be
    /// read or parsed. The tracker keeps their instances alive but cannot
    /// give them a delta, instead of reporting them as exited.
    pub unreadable_pids: Vec<i32>,
    pub unreadable_tids: Vec<i32>,
    pub counts: ScanCounts,
}

/// Summary of one scan, for the benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanStats {
    pub processes: usize,
    pub threads: usize,
    pub counts: ScanCounts,
    /// This process's VmHWM after the scans. Not ru_maxrss: that carries the
    /// parent's high-water mark across a vfork+exec.
    pub peak_rss_kb: Option<u64>,
}

/// The one-line form `vitalsd scan` prints and `cargo xtask bench scan`
/// parses.
impl std::fmt::Display for ScanStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "processes={} threads={} read_failures={} vanished_pids={} vanished_tids={} peak_rss_kb={}",
            self.processes,
            self.threads,
            self.counts.read_failures,
            self.counts.vanished_pids,
            self.counts.vanished_tids,
            self.peak_rss_kb.map(|k| k.to_string()).unwrap_or_else(|| "-".into()),
        )
    }
}

/// VmHWM of the calling process, from the real /proc.
fn own_peak_rss_kb(buf: &mut Vec<u8>) -> Option<u64> {
    read_into(Path::new("/proc/self/status"), buf).ok()?;
    let line = buf
        .split(|&b| b == b'\n')
        .find(|l| l.starts_with(b"VmHWM:"))?;
    super::parse_u64("VmHWM", super::fields(&line[6..]).next()?).ok()
}

pub struct Sampler {
    root: PathBuf,
    opts: SampleOptions,
    buf: Vec<u8>,
    path: ProcPath,
    dirent_buf: Vec<u8>,
    pids: Vec<u32>,
    tids: Vec<u32>,
    /// (pid, starttime), i.e. one process instance -> what is kept of it
    /// between scans; dropped in the first scan that does not see it.
    instances: HashMap<(i32, u64), InstanceCache>,
    generation: u64,
}

#[derive(Default)]
struct InstanceCache {
    seen_generation: u64,
    /// Read once per instance (`SampleOptions::cmdline`).
    cmdline: Option<Arc<str>>,
    status: Option<CachedStatus>,
}

/// The most scans a process's status is reused for while its stat does
/// not change (uid changes by setuid need not show in stat).
pub const STATUS_REFRESH_SCANS: u64 = 10;

struct CachedStatus {
    status: PidStatus,
    /// The stat fields that move when status's figures can: CPU time,
    /// faults, threads, RSS.
    fingerprint: (u64, u64, u64, u64, u64, Option<u64>),
    read_generation: u64,
}

fn status_fingerprint(s: &PidStat) -> (u64, u64, u64, u64, u64, Option<u64>) {
    (
        s.utime_ticks,
        s.stime_ticks,
        s.minflt,
        s.majflt,
        s.num_threads,
        s.rss_pages,
    )
}

impl Sampler {
    pub fn new(proc_root: impl Into<PathBuf>, opts: SampleOptions) -> Self {
        let root: PathBuf = proc_root.into();
        Sampler {
            path: ProcPath::new(&root),
            root,
            opts,
            buf: Vec::with_capacity(4096),
            dirent_buf: vec![0u8; 64 * 1024],
            pids: Vec::new(),
            tids: Vec::new(),
            instances: HashMap::new(),
            generation: 0,
        }
    }

    pub fn options(&self) -> SampleOptions {
        self.opts
    }

    /// Scans into a new [`Sample`].
    pub fn sample(&mut self) -> Result<Sample, SamplerError> {
        let mut s = Sample::default();
        self.sample_into(&mut s)?;
        Ok(s)
    }

    /// Scans into `out`, reusing its vectors' capacity. Only failing to list
    /// the proc root itself is an error; everything else is counted.
    pub fn sample_into(&mut self, out: &mut Sample) -> Result<(), SamplerError> {
        self.generation += 1;
        out.processes.clear();
        out.threads.clear();
        out.unreadable_pids.clear();
        out.unreadable_tids.clear();
        out.counts = ScanCounts::default();
        out.clock = Some(ClockPair::now());

        out.system = match read_stat(&self.root, &mut self.buf) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!("{e}");
                out.counts.read_failures += 1;
                None
            }
        };
        out.loadavg = match read_loadavg(&self.root, &mut self.buf) {
            Ok(l) => Some(l),
            Err(e) => {
                warn!("{e}");
                out.counts.read_failures += 1;
                None
            }
        };
        for (slot, res) in out.pressure.iter_mut().zip(PsiResource::ALL) {
            *slot = match read_pressure(&self.root, res, &mut self.buf) {
                Ok(s) => Some(s),
                Err(e) => {
                    warn!("{e}");
                    out.counts.read_failures += 1;
                    None
                }
            };
        }

        let root = self.root.clone();
        let mut pids = std::mem::take(&mut self.pids);
        if let Err(source) = list_numeric(&root, &mut self.dirent_buf, &mut pids) {
            self.pids = pids;
            return Err(SamplerError::ReadDir { path: root, source });
        }
        for &pid in &pids {
            self.scan_process(pid, out);
        }
        self.pids = pids;

        let generation = self.generation;
        self.instances
            .retain(|_, c| c.seen_generation == generation);
        Ok(())
    }

    fn set_path(&mut self, parts: std::fmt::Arguments<'_>) -> &Path {
        self.path.set(parts)
    }

    /// Reads the file at `self.path` into `self.buf`.
    fn read_current(&mut self) -> ReadOutcome {
        read_task_file(self.path.get(), &mut self.buf)
    }

    fn parse_stat_current(&mut self, out: &mut Sample) -> Option<PidStat> {
        match parse_pid_stat(&self.buf) {
            Ok(s) => Some(s),
            Err(e) => {
                debug!("parsing {}: {e}", self.path.get().display());
                out.counts.read_failures += 1;
                None
            }
        }
    }

    fn scan_process(&mut self, pid: u32, out: &mut Sample) {
        self.set_path(format_args!("/{pid}/stat"));
        let stat = match self.read_current() {
            ReadOutcome::Ok => match self.parse_stat_current(out) {
                Some(s) => s,
                None => {
                    out.unreadable_pids.push(pid as i32);
                    return;
                }
            },
            ReadOutcome::Vanished => {
                out.counts.vanished_pids += 1;
                return;
            }
            ReadOutcome::Failed => {
                out.counts.read_failures += 1;
                out.unreadable_pids.push(pid as i32);
                return;
            }
        };

        let (mut status, mut cmdline) = (None, None);
        if self.opts.status || self.opts.cmdline {
            // Taken out while the files are read (they need &mut self).
            let key = (stat.pid, stat.starttime_ticks);
            let mut cache = self.instances.remove(&key).unwrap_or_default();
            cache.seen_generation = self.generation;
            if self.opts.status {
                status = self.status_for(pid, &stat, &mut cache.status, out);
            }
            if self.opts.cmdline {
                cmdline = self.cmdline_for(pid, &mut cache.cmdline, out);
            }
            self.instances.insert(key, cache);
        }

        out.processes.push(ProcessSample {
            stat,
            status,
            cmdline,
        });

        if self.opts.threads {
            self.scan_threads(pid, out);
        }
    }

    /// This process's status: the cached one while its stat is unchanged
    /// and the cache is younger than STATUS_REFRESH_SCANS, else read.
    fn status_for(
        &mut self,
        pid: u32,
        stat: &PidStat,
        cached: &mut Option<CachedStatus>,
        out: &mut Sample,
    ) -> Option<PidStatus> {
        let fingerprint = status_fingerprint(stat);
        let generation = self.generation;
        if let Some(c) = cached {
            if c.fingerprint == fingerprint && generation - c.read_generation < STATUS_REFRESH_SCANS
            {
                return Some(c.status);
            }
        }
        self.set_path(format_args!("/{pid}/status"));
        let status = match self.read_current() {
            ReadOutcome::Ok => match parse_pid_status(&self.buf) {
                Ok(s) => s,
                Err(e) => {
                    debug!("parsing /{pid}/status: {e}");
                    out.counts.read_failures += 1;
                    return None;
                }
            },
            // The stat row is still good; the process exited since.
            ReadOutcome::Vanished => return None,
            ReadOutcome::Failed => {
                out.counts.read_failures += 1;
                return None;
            }
        };
        *cached = Some(CachedStatus {
            status,
            fingerprint,
            read_generation: generation,
        });
        Some(status)
    }

    /// This process instance's cmdline, read once.
    fn cmdline_for(
        &mut self,
        pid: u32,
        cached: &mut Option<Arc<str>>,
        out: &mut Sample,
    ) -> Option<Arc<str>> {
        if let Some(c) = cached {
            return Some(c.clone());
        }
        self.set_path(format_args!("/{pid}/cmdline"));
        match self.read_current() {
            ReadOutcome::Ok => {
                let c: Arc<str> = parse_cmdline(&self.buf).into();
                *cached = Some(c.clone());
                Some(c)
            }
            ReadOutcome::Vanished => None,
            ReadOutcome::Failed => {
                out.counts.read_failures += 1;
                None
            }
        }
    }

    fn scan_threads(&mut self, pid: u32, out: &mut Sample) {
        let mut tids = std::mem::take(&mut self.tids);
        self.set_path(format_args!("/{pid}/task"));
        let listed = list_numeric(self.path.get(), &mut self.dirent_buf, &mut tids);
        match listed {
            Ok(()) => {}
            Err(e) if is_vanished(&e) => {
                // The process exited after its stat was read.
                self.tids = tids;
                return;
            }
            Err(e) => {
                debug!("listing /{pid}/task: {e}");
                out.counts.read_failures += 1;
                self.tids = tids;
                return;
            }
        }
        for &tid in &tids {
            self.set_path(format_args!("/{pid}/task/{tid}/stat"));
            match self.read_current() {
                ReadOutcome::Ok => match self.parse_stat_current(out) {
                    Some(stat) => out.threads.push(ThreadSample {
                        tgid: pid as i32,
                        stat,
                    }),
                    None => out.unreadable_tids.push(tid as i32),
                },
                ReadOutcome::Vanished => out.counts.vanished_tids += 1,
                ReadOutcome::Failed => {
                    out.counts.read_failures += 1;
                    out.unreadable_tids.push(tid as i32);
                }
            }
        }
        self.tids = tids;
    }
}

/// Lists the all-digit entries of a directory (pids or tids) into `out`,
/// with raw getdents64 into a reused buffer: no allocation per entry and no
/// fstat (which glibc's opendir does).
pub(crate) fn list_numeric(dir: &Path, buf: &mut [u8], out: &mut Vec<u32>) -> io::Result<()> {
    out.clear();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    let fd = file.as_raw_fd();
    loop {
        // SAFETY: fd is open for the duration; buf is a valid writable
        // region of buf.len() bytes.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd,
                buf.as_mut_ptr().cast::<libc::c_void>(),
                buf.len(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        let filled = &buf[..n as usize];
        let mut off = 0usize;
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen;
        //                          u8 d_type; char d_name[]; }
        while off + 19 <= filled.len() {
            let reclen = usize::from(u16::from_ne_bytes([filled[off + 16], filled[off + 17]]));
            if reclen == 0 || off + reclen > filled.len() {
                break;
            }
            let name = &filled[off + 19..off + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(id) = parse_id(name) {
                out.push(id);
            }
            off += reclen;
        }
    }
}

fn parse_id(name: &[u8]) -> Option<u32> {
    if name.is_empty() || name.len() > 10 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    name.iter().try_fold(0u32, |acc, &d| {
        acc.checked_mul(10)?.checked_add(u32::from(d - b'0'))
    })
}

/// `repeat` scans with one sampler (buffers reused, as in the daemon's
/// steady state); returns the last scan's stats. Used by `vitalsd scan`.
pub fn scan_repeat(
    proc_root: &Path,
    with_threads: bool,
    repeat: u32,
) -> Result<ScanStats, SamplerError> {
    let mut sampler = Sampler::new(
        proc_root,
        SampleOptions {
            threads: with_threads,
            status: false,
            cmdline: false,
        },
    );
    let mut s = Sample::default();
    for _ in 0..repeat.max(1) {
        sampler.sample_into(&mut s)?;
    }
    Ok(ScanStats {
        processes: s.processes.len(),
        threads: s.threads.len(),
        counts: s.counts,
        peak_rss_kb: own_peak_rss_kb(&mut sampler.buf),
    })
}

/// One scan with reusable-buffer readers, as the daemon's always-on tier does
/// it; used by the `scan` benchmark. Reads /proc/stat, loadavg, PSI and every
/// /proc/<pid>/stat (and /proc/<pid>/task/<tid>/stat with `with_threads`).
pub fn scan_once(proc_root: &Path, with_threads: bool) -> Result<ScanStats, SamplerError> {
    scan_repeat(proc_root, with_threads, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::testutil::{FakeProc, Task};

    #[test]
    fn scan_counts_processes_and_threads_of_a_fake_tree() {
        let fake = FakeProc::new();
        let c = [1, 0, 1, 10, 0, 0, 0, 0, 0, 0];
        fake.set_stat(c, &[(0, c)]);
        for pid in [1, 2] {
            let t = Task {
                pid,
                comm: "p",
                minflt: 0,
                majflt: 0,
                utime: 0,
                stime: 0,
                starttime: 1,
            };
            fake.set_process(&t);
        }
        fake.set_thread(
            2,
            &Task {
                pid: 3,
                comm: "t",
                minflt: 0,
                majflt: 0,
                utime: 0,
                stime: 0,
                starttime: 1,
            },
        );
        fake.write("self", "not a pid");
        let s = scan_once(fake.root(), true).unwrap();
        assert_eq!((s.processes, s.threads), (2, 3));
        assert!(s.peak_rss_kb.unwrap() > 0);
        assert!(s
            .to_string()
            .starts_with("processes=2 threads=3 read_failures=0"));
        let s = scan_once(fake.root(), false).unwrap();
        assert_eq!((s.processes, s.threads), (2, 0));
    }

    /// A process whose stat does not move keeps its last status (at most
    /// STATUS_REFRESH_SCANS scans); one that ran is read again. Its cmdline
    /// is read once per instance.
    #[test]
    fn status_is_reread_when_stat_moves_and_every_few_scans() {
        let fake = FakeProc::new();
        let c = [1, 0, 1, 10, 0, 0, 0, 0, 0, 0];
        fake.set_stat(c, &[(0, c)]);
        let mut t = Task {
            pid: 7,
            comm: "p",
            minflt: 0,
            majflt: 0,
            utime: 5,
            stime: 0,
            starttime: 1,
        };
        fake.set_process(&t);
        let rss = |kb: u64| format!("Name:\tp\nUid:\t1000\t1000\t1000\t1000\nVmRSS:\t {kb} kB\n");
        let mut sampler = Sampler::new(
            fake.root(),
            SampleOptions {
                status: true,
                cmdline: true,
                ..SampleOptions::default()
            },
        );
        let cmdline_now = |sampler: &mut Sampler| {
            sampler.sample().unwrap().processes[0]
                .cmdline
                .clone()
                .unwrap()
                .to_string()
        };
        let rss_now = |sampler: &mut Sampler| {
            sampler.sample().unwrap().processes[0]
                .status
                .unwrap()
                .vm_rss_kb
        };
        assert_eq!(rss_now(&mut sampler), Some(2048));
        fake.write("7/cmdline", "/usr/bin/other\0");
        assert_eq!(cmdline_now(&mut sampler), "/usr/bin/p\0--flag");
        // Status changes, stat does not: the cached status stands.
        fake.write("7/status", &rss(4096));
        assert_eq!(rss_now(&mut sampler), Some(2048));
        // The process ran (utime moved): read again.
        t.utime = 6;
        fake.set_process(&t);
        fake.write("7/status", &rss(4096));
        assert_eq!(rss_now(&mut sampler), Some(4096));
        // Unchanged stat: reused until STATUS_REFRESH_SCANS scans have
        // passed since the read, then read again.
        fake.write("7/status", &rss(8192));
        for _ in 1..STATUS_REFRESH_SCANS {
            assert_eq!(rss_now(&mut sampler), Some(4096));
        }
        assert_eq!(rss_now(&mut sampler), Some(8192));
        // A new instance of the pid (other starttime) is never served the
        // old one's status.
        t.starttime = 2;
        fake.set_process(&t);
        fake.write("7/status", &rss(16384));
        fake.write("7/cmdline", "/usr/bin/other\0");
        assert_eq!(rss_now(&mut sampler), Some(16384));
        assert_eq!(cmdline_now(&mut sampler), "/usr/bin/other");
    }

    #[test]
    fn missing_root_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            scan_once(&dir.path().join("nope"), false),
            Err(SamplerError::ReadDir { .. })
        ));
    }
}
