//! Checks of the process model a `record` or a capture imports into:
//! processes with name and argv, threads under their process, counter
//! tracks equal to the printed table, and the system-wide tracks, each
//! against /proc read here independently.

use super::*;

/// `total=` of the `some` line of /proc/pressure/<resource> (µs), if the
/// kernel has PSI.
pub fn psi_some_total_us(resource: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/pressure/{resource}")).ok()?;
    s.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("total="))?
        .parse()
        .ok()
}

pub fn ticks_to_ns(ticks: u64) -> f64 {
    (ticks as u128 * 1_000_000_000 / clk_tck() as u128) as f64
}

// ---------------------------------------------------------------------------
// Checks shared by the trace kinds.

/// The one process `pid` has in the trace: named by argv[0], with the full
/// argv as cmdline, started by this test process. Returns its upid.
pub fn check_process(t: &Imported, pid: u32, argv: &[&str]) -> i64 {
    let p = t.one(&format!(
        "select p.upid as upid, p.name as name, p.cmdline as cmdline, pp.pid as ppid \
         from process p left join process pp on pp.upid = p.parent_upid where p.pid = {pid}"
    ));
    assert_eq!(text(&p, "name"), Some(argv[0]), "name of {pid}: {p:?}");
    assert_eq!(
        text(&p, "cmdline"),
        Some(argv.join(" ").as_str()),
        "argv of {pid}: {p:?}"
    );
    assert_eq!(
        p["ppid"].as_i64(),
        Some(std::process::id() as i64),
        "parent of {pid}: {p:?}"
    );
    // Its main thread is its own.
    let main = t.one(&format!("select upid, name from thread where tid = {pid}"));
    assert_eq!(main["upid"], p["upid"], "main thread of {pid}: {main:?}");
    int(&p, "upid")
}

/// Where the trace's threads come from, which decides who they may be.
#[derive(Clone, Copy, PartialEq)]
pub enum Threads {
    /// `record` without capture: ProcessTree has processes only, so each
    /// thread is a process's main thread.
    MainOnly,
    /// Fault samples add the threads that faulted, each with its pid.
    Samples,
    /// A capture: threads come from the switch and waking records, named
    /// in ProcessTree with their tgid.
    Sched,
}

/// Threads belong to a process: none is attached to pid 0 (swapper) unless
/// it is tid 0, and none that ran is left without a process.
pub fn check_threads(t: &Imported, kind: Threads) {
    let at_pid0 = t.q(
        "select t.utid as utid, t.tid as tid, t.name as name from thread t \
         join process p using(upid) where p.pid = 0 and t.tid != 0",
    );
    assert!(
        at_pid0.is_empty(),
        "{} threads attached to pid 0 (swapper): {:?}",
        at_pid0.len(),
        &at_pid0[..at_pid0.len().min(10)]
    );
    match kind {
        Threads::MainOnly => {
            let odd = t.q(
                "select t.tid as tid, p.pid as pid from thread t left join process p using(upid) \
                 where t.tid != 0 and (p.pid is null or p.pid != t.tid)",
            );
            assert!(
                odd.is_empty(),
                "threads not the main thread of their process: {odd:?}"
            );
        }
        Threads::Samples => {
            let orphans = t.q("select t.tid as tid, t.name as name from thread t \
                 where t.tid != 0 and t.upid is null");
            assert!(orphans.is_empty(), "threads without a process: {orphans:?}");
        }
        Threads::Sched => {
            // "No slice is parented to an unknown thread": every thread the
            // timeline shows running has a name and a process.
            let unknown = t.q(
                "select t.utid as utid, t.tid as tid, t.name as name, t.upid as upid, \
                        count(*) as slices \
                 from sched_slice s join thread t using(utid) \
                 where t.tid != 0 and (t.upid is null or t.name is null) group by t.utid",
            );
            assert!(
                unknown.is_empty(),
                "{} threads with slices but no name or process: {:?}",
                unknown.len(),
                &unknown[..unknown.len().min(10)]
            );
        }
    }
}

/// One process instance's counter tracks: track name -> (last value, unit).
pub type Tracks = HashMap<String, (f64, String)>;

/// The last value of each of vitalsd's per-process counters, by pid: one
/// (upid, tracks) entry per process instance holding that pid.
pub fn process_counters(t: &Imported) -> HashMap<u32, Vec<(i64, Tracks)>> {
    let rows = t.q(
        "select p.pid as pid, p.upid as upid, t.name as track, t.unit as unit, \
                (select c.value from counter c where c.track_id = t.id order by c.ts desc limit 1) as last \
         from process_counter_track t join process p using(upid) \
         where t.name in ('oncpu_ns', 'runq_wait_ns', 'voluntary_switches', 'involuntary_switches') \
            or t.name like 'faults\\_%' escape '\\'",
    );
    let mut by_upid: BTreeMap<(u32, i64), Tracks> = BTreeMap::new();
    for r in &rows {
        let track = text(r, "track").unwrap().to_owned();
        let unit = text(r, "unit").unwrap_or("").to_owned();
        let e = by_upid
            .entry((int(r, "pid") as u32, int(r, "upid")))
            .or_default();
        assert!(
            e.insert(track.clone(), (float(r, "last"), unit)).is_none(),
            "two {track} tracks under one process: {r:?}"
        );
    }
    let mut out: HashMap<u32, Vec<_>> = HashMap::new();
    for ((pid, upid), tracks) in by_upid {
        out.entry(pid).or_default().push((upid, tracks));
    }
    out
}

/// The counter tracks of one process instance equal its printed row: name
/// and unit of each track, last values to the printed precision.
pub fn check_row_against_tracks(row: &TableRow, tracks: &Tracks) {
    let get = |name: &str| -> &(f64, String) {
        tracks
            .get(name)
            .unwrap_or_else(|| panic!("no {name} track for {row:?}: {tracks:?}"))
    };
    let (oncpu, unit) = get("oncpu_ns");
    assert_eq!(unit, "ns", "oncpu_ns unit");
    assert_eq!(
        format!("{:.3}", oncpu / 1e6),
        row.oncpu_ms,
        "oncpu of {row:?}"
    );
    let (vol, unit) = get("voluntary_switches");
    assert_eq!(unit, "count");
    assert_eq!(*vol as u64, row.voluntary_switches, "{row:?}");
    let (invol, unit) = get("involuntary_switches");
    assert_eq!(unit, "count");
    assert_eq!(*invol as u64, row.involuntary_switches, "{row:?}");
    if row.runq_ms != "-" {
        let (runq, unit) = get("runq_wait_ns");
        assert_eq!(unit, "ns");
        assert_eq!(format!("{:.3}", runq / 1e6), row.runq_ms, "runq of {row:?}");
    }
    let faults: Vec<_> = tracks
        .iter()
        .filter(|(n, _)| n.starts_with("faults_"))
        .collect();
    assert_eq!(faults.len(), 1, "one fault counter for {row:?}: {tracks:?}");
    assert_eq!(faults[0].1 .1, "count");
    assert_eq!(faults[0].1 .0 as u64, row.faults, "faults of {row:?}");
}

/// Every row of the printed table has its counter tracks, equal to it; the
/// workload's row among them.
pub fn check_counters_equal_table(t: &Imported, table: &str, workload: u32) {
    let rows = table_rows(table);
    assert!(
        rows.iter().any(|r| r.pid == workload),
        "workload {workload} not in the table:\n{table}"
    );
    let counters = process_counters(t);
    let mut compared = 0;
    for row in &rows {
        let instances = counters
            .get(&row.pid)
            .unwrap_or_else(|| panic!("no counter tracks for table row {row:?}"));
        if instances.len() != 1 {
            // A pid reused during the recording: see the pid-reuse test.
            assert_ne!(row.pid, workload, "{instances:?}");
            continue;
        }
        check_row_against_tracks(row, &instances[0].1);
        compared += 1;
    }
    eprintln!(
        "{compared} of {} table rows equal their counter tracks",
        rows.len()
    );
}

/// SysStats as trace_processor's own cpu.times.* counters (one track per
/// CPU and field, within the kernel's /proc/stat before and after), PSI as
/// its psi.* tracks (within /proc/pressure's totals), and the loadavg and
/// PSI-average tracks vitalsd writes itself.
pub fn check_system_tracks(
    t: &Imported,
    stat_before: &BTreeMap<u32, HashMap<&'static str, u64>>,
    stat_after: &BTreeMap<u32, HashMap<&'static str, u64>>,
    psi_before: Option<u64>,
    psi_after: Option<u64>,
) {
    let fields = [
        ("cpu.times.user_ns", "user"),
        ("cpu.times.user_nice_ns", "nice"),
        ("cpu.times.system_mode_ns", "system"),
        ("cpu.times.idle_ns", "idle"),
        ("cpu.times.io_wait_ns", "iowait"),
        ("cpu.times.irq_ns", "irq"),
        ("cpu.times.softirq_ns", "softirq"),
        ("cpu.times.steal_ns", "steal"),
    ];
    let rows = t.q(
        "select t.name as name, t.cpu as cpu, \
                (select count(*) from counter c where c.track_id = t.id) as n, \
                (select c.value from counter c where c.track_id = t.id order by c.ts desc limit 1) as last \
         from cpu_counter_track t where t.name like 'cpu.times.%'",
    );
    let mut seen = HashSet::new();
    for r in &rows {
        let name = text(r, "name").unwrap();
        let cpu = int(r, "cpu") as u32;
        assert!(
            seen.insert((name.to_owned(), cpu)),
            "two {name} tracks for cpu {cpu}"
        );
        assert!(
            int(r, "n") >= 2,
            "{name} cpu {cpu}: fewer than two values: {r:?}"
        );
        let field = fields
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("unexpected cpu.times track {r:?}"))
            .1;
        // /proc/stat's iowait may decrease (Documentation/filesystems/proc.rst):
        // it has no bounds to check against.
        if field == "iowait" {
            continue;
        }
        let (lo, hi) = (
            ticks_to_ns(stat_before[&cpu][field]),
            ticks_to_ns(stat_after[&cpu][field]),
        );
        let last = float(r, "last");
        assert!(
            lo <= last && last <= hi,
            "{name} cpu {cpu}: {last} ns not within /proc/stat's {lo}..{hi}"
        );
    }
    for (name, _) in fields {
        for cpu in stat_after.keys() {
            assert!(
                seen.contains(&(name.to_owned(), *cpu)),
                "no {name} track for cpu {cpu}: {rows:?}"
            );
        }
    }

    if let (Some(before), Some(after)) = (psi_before, psi_after) {
        let psi: HashMap<String, Row> = t
            .q(
                "select t.name as name, (select count(*) from counter c where c.track_id = t.id) as n, \
                        (select c.value from counter c where c.track_id = t.id order by c.ts desc limit 1) as last \
                 from counter_track t where t.name like 'psi.%'",
            )
            .into_iter()
            .map(|r| (text(&r, "name").unwrap().to_owned(), r))
            .collect();
        for name in [
            "psi.cpu.some",
            "psi.mem.some",
            "psi.mem.full",
            "psi.io.some",
            "psi.io.full",
            "psi.cpu.some.avg10",
            "psi.memory.some.avg10",
            "psi.io.some.avg10",
        ] {
            let r = psi
                .get(name)
                .unwrap_or_else(|| panic!("no {name} track: {:?}", psi.keys()));
            assert!(int(r, "n") >= 2, "{r:?}");
        }
        let last = float(&psi["psi.cpu.some"], "last");
        assert!(
            before as f64 * 1e3 <= last && last <= after as f64 * 1e3,
            "psi.cpu.some {last} ns not within /proc/pressure/cpu's {before}..{after} µs"
        );
    }

    let load: HashMap<String, Row> = t
        .q("select t.name as name, t.unit as unit, \
                    (select count(*) from counter c where c.track_id = t.id) as n \
             from counter_track t where t.name like 'loadavg.%'")
        .into_iter()
        .map(|r| (text(&r, "name").unwrap().to_owned(), r))
        .collect();
    for (name, unit) in [
        ("loadavg.1m", "tasks"),
        ("loadavg.5m", "tasks"),
        ("loadavg.15m", "tasks"),
        ("loadavg.runnable_tasks", "count"),
    ] {
        let r = load
            .get(name)
            .unwrap_or_else(|| panic!("no {name} track: {:?}", load.keys()));
        assert_eq!(text(r, "unit"), Some(unit), "{r:?}");
        assert!(int(r, "n") >= 2, "{r:?}");
    }
}
