//! /proc/stat: aggregate and per-CPU tick counters, ctxt, btime, processes,
//! procs_running, procs_blocked.
//!
//! Own parser rather than `procfs::KernelStats`: that one drops the CPU number
//! of each `cpuN` line (a plain Vec), so after a hotplug event the i-th entry
//! is a different CPU and per-CPU deltas would silently mix CPUs.

use std::path::Path;

use super::{fields, parse_u64, read_into, ParseError};

/// Reading or parsing the file failed; carries its path.
pub type StatError = super::FileError;

/// One `cpu` line, in USER_HZ ticks. `guest` and `guest_nice` are already
/// included in `user` and `nice` by the kernel (account_guest_time adds to
/// both), so they are kept for display only and never summed again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user_ticks: u64,
    pub nice_ticks: u64,
    pub system_ticks: u64,
    pub idle_ticks: u64,
    pub iowait_ticks: u64,
    pub irq_ticks: u64,
    pub softirq_ticks: u64,
    pub steal_ticks: u64,
    pub guest_ticks: u64,
    pub guest_nice_ticks: u64,
}

/// The formula behind [`CpuTimes::total_ticks`], printed next to every share
/// that divides by it.
pub const TOTAL_FORMULA: &str = "user+nice+system+idle+iowait+irq+softirq+steal";
/// The formula behind [`CpuTimes::local_busy_ticks`].
pub const LOCAL_BUSY_FORMULA: &str = "user+nice+system+irq+softirq";

impl CpuTimes {
    /// user+nice+system+idle+iowait+irq+softirq+steal. Guest time is inside
    /// user/nice already.
    pub fn total_ticks(&self) -> u64 {
        self.user_ticks
            .saturating_add(self.nice_ticks)
            .saturating_add(self.system_ticks)
            .saturating_add(self.idle_ticks)
            .saturating_add(self.iowait_ticks)
            .saturating_add(self.irq_ticks)
            .saturating_add(self.softirq_ticks)
            .saturating_add(self.steal_ticks)
    }

    /// user+nice+system+irq+softirq: time this machine's CPUs did work for
    /// this kernel (steal went to another guest, iowait is idle).
    pub fn local_busy_ticks(&self) -> u64 {
        self.user_ticks
            .saturating_add(self.nice_ticks)
            .saturating_add(self.system_ticks)
            .saturating_add(self.irq_ticks)
            .saturating_add(self.softirq_ticks)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemStat {
    /// The `cpu` line: the kernel sums it over *possible* CPUs.
    pub total: CpuTimes,
    /// `cpuN` lines, online CPUs only (show_stat iterates online CPUs), so the
    /// set changes with hotplug. Sorted by CPU number as the kernel prints.
    pub per_cpu: Vec<(u32, CpuTimes)>,
    pub ctxt: u64,
    /// Boot time, seconds since the epoch.
    pub btime_s: u64,
    /// Forks since boot.
    pub processes: u64,
    pub procs_running: u64,
    pub procs_blocked: u64,
}

impl SystemStat {
    /// The online CPU set at the time of this sample.
    pub fn online_cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.per_cpu.iter().map(|(cpu, _)| *cpu)
    }
}

fn parse_cpu_times(rest: &[u8]) -> Result<CpuTimes, ParseError> {
    const NAMES: [&str; 10] = [
        "user",
        "nice",
        "system",
        "idle",
        "iowait",
        "irq",
        "softirq",
        "steal",
        "guest",
        "guest_nice",
    ];
    let mut v = [0u64; 10];
    let mut n = 0;
    // Extra trailing fields from a future kernel are ignored.
    for (slot, text) in v.iter_mut().zip(fields(rest)) {
        *slot = parse_u64(NAMES[n], text)?;
        n += 1;
    }
    // user..steal make up the total; a line without them is truncated.
    // guest/guest_nice (2.6.24/2.6.33) are informative only.
    if n < 8 {
        return Err(ParseError::MissingField(NAMES[n]));
    }
    Ok(CpuTimes {
        user_ticks: v[0],
        nice_ticks: v[1],
        system_ticks: v[2],
        idle_ticks: v[3],
        iowait_ticks: v[4],
        irq_ticks: v[5],
        softirq_ticks: v[6],
        steal_ticks: v[7],
        guest_ticks: v[8],
        guest_nice_ticks: v[9],
    })
}

fn single_value(name: &'static str, rest: &[u8]) -> Result<u64, ParseError> {
    parse_u64(name, fields(rest).next().unwrap_or(b""))
}

/// Parses the text of /proc/stat.
pub fn parse_stat(text: &[u8]) -> Result<SystemStat, ParseError> {
    let mut total = None;
    let mut per_cpu = Vec::new();
    let (mut ctxt, mut btime, mut processes) = (None, None, None);
    let (mut running, mut blocked) = (None, None);
    for line in text.split(|&b| b == b'\n') {
        let mut it = line.splitn(2, |&b| b == b' ');
        let key = it.next().unwrap_or(b"");
        let rest = it.next().unwrap_or(b"");
        match key {
            b"cpu" => total = Some(parse_cpu_times(rest)?),
            b"ctxt" => ctxt = Some(single_value("ctxt", rest)?),
            b"btime" => btime = Some(single_value("btime", rest)?),
            b"processes" => processes = Some(single_value("processes", rest)?),
            b"procs_running" => running = Some(single_value("procs_running", rest)?),
            b"procs_blocked" => blocked = Some(single_value("procs_blocked", rest)?),
            k if k.len() > 3 && k.starts_with(b"cpu") => {
                let id = parse_u64("cpu number", &k[3..])?;
                let id = u32::try_from(id).map_err(|_| ParseError::Malformed("cpu number"))?;
                per_cpu.push((id, parse_cpu_times(rest)?));
            }
            // intr, softirq, and anything newer: not ours.
            _ => {}
        }
    }
    Ok(SystemStat {
        total: total.ok_or(ParseError::MissingField("cpu"))?,
        per_cpu,
        ctxt: ctxt.ok_or(ParseError::MissingField("ctxt"))?,
        btime_s: btime.ok_or(ParseError::MissingField("btime"))?,
        processes: processes.ok_or(ParseError::MissingField("processes"))?,
        procs_running: running.ok_or(ParseError::MissingField("procs_running"))?,
        procs_blocked: blocked.ok_or(ParseError::MissingField("procs_blocked"))?,
    })
}

/// Reads `<proc_root>/stat` into `buf` and parses it.
pub fn read_stat(proc_root: &Path, buf: &mut Vec<u8>) -> Result<SystemStat, StatError> {
    let path = proc_root.join("stat");
    if let Err(source) = read_into(&path, buf) {
        return Err(StatError::Read { path, source });
    }
    parse_stat(buf).map_err(|source| StatError::Parse { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const SAMPLE: &str = "cpu  24068 3 4277 59835 385 1 65 11 7 2\n\
cpu0 11492 1 1945 30805 54 0 14 4 3 1\n\
cpu1 12575 2 2332 29029 331 1 50 7 4 1\n\
intr 1 2 3\nctxt 9876\nbtime 1700000000\nprocesses 4242\n\
procs_running 3\nprocs_blocked 1\nsoftirq 1 2 3\n";

    #[test]
    fn parses_all_fields() {
        let s = parse_stat(SAMPLE.as_bytes()).unwrap();
        assert_eq!(s.total.user_ticks, 24068);
        assert_eq!(s.total.nice_ticks, 3);
        assert_eq!(s.total.iowait_ticks, 385);
        assert_eq!(s.total.steal_ticks, 11);
        assert_eq!(s.total.guest_ticks, 7);
        assert_eq!(s.total.guest_nice_ticks, 2);
        assert_eq!(s.online_cpus().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(s.per_cpu[1].1.user_ticks, 12575);
        assert_eq!(
            (
                s.ctxt,
                s.btime_s,
                s.processes,
                s.procs_running,
                s.procs_blocked
            ),
            (9876, 1_700_000_000, 4242, 3, 1)
        );
    }

    #[test]
    fn guest_is_inside_user_and_not_added_again() {
        let s = parse_stat(SAMPLE.as_bytes()).unwrap();
        let t = s.total;
        assert_eq!(
            t.total_ticks(),
            24068 + 3 + 4277 + 59835 + 385 + 1 + 65 + 11
        );
        assert_eq!(t.local_busy_ticks(), 24068 + 3 + 4277 + 1 + 65);
    }

    #[test]
    fn extra_trailing_fields_are_ignored() {
        let text = SAMPLE.replace(
            "cpu0 11492 1 1945 30805 54 0 14 4 3 1",
            "cpu0 11492 1 1945 30805 54 0 14 4 3 1 99 98",
        );
        let s = parse_stat(text.as_bytes()).unwrap();
        assert_eq!(s.per_cpu[0].1.guest_nice_ticks, 1);
    }

    #[test]
    fn truncated_cpu_line_is_an_error() {
        let text = SAMPLE.replace(
            "cpu1 12575 2 2332 29029 331 1 50 7 4 1",
            "cpu1 12575 2 2332",
        );
        assert_eq!(
            parse_stat(text.as_bytes()),
            Err(ParseError::MissingField("idle"))
        );
        // Cut off mid-file: later required keys are missing.
        let cut = &SAMPLE[..SAMPLE.find("ctxt").unwrap()];
        assert_eq!(
            parse_stat(cut.as_bytes()),
            Err(ParseError::MissingField("ctxt"))
        );
    }

    #[test]
    fn hotplug_changes_cpu_set_with_ids() {
        let text = SAMPLE.replace("cpu0 11492 1 1945 30805 54 0 14 4 3 1\n", "");
        let s = parse_stat(text.as_bytes()).unwrap();
        assert_eq!(s.online_cpus().collect::<Vec<_>>(), vec![1]);
    }
}
