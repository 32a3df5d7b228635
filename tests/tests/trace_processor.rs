//! trace_processor is the judge (issue #13): every kind of trace vitalsd
//! writes (`record`, `record --sched`, `record --faults`, a service capture
//! and its `vitalsctl export`) is imported by trace_processor_shell, the
//! importer the Perfetto UI runs, and queried for what a user would see:
//! processes with their names, argv and counters, threads under the right
//! process, the CPU timeline with the thread states the kernel reported,
//! fault samples whose stacks resolve, and no import error.
//!
//! The finder (tests/src/trace_processor.rs) looks in `$TRACE_PROCESSOR_SHELL`,
//! then `../shared/tools/`, then the `perfetto` package's download; without
//! one every test here fails, naming the three. Each test asks for it first,
//! so that failure comes before any recording.
//!
//! Three tests hold defects known from review (fixed on branch tpfix; each
//! failed before its fix):
//! - `threads_whose_tgid_was_never_seen_are_not_attached_to_pid_0`
//! - `a_pid_reused_within_one_recording_is_two_processes_each_with_its_own_tracks_and_row`
//! - `short_lived_processes_are_named_in_the_table_and_in_the_process_table`

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;
use vitals_tests::{
    daemon::Daemon,
    trace_processor::{trace_processor, Row, TraceProcessor, IMPORT_ERRORS_SQL},
    *,
};
use vitalsd::control::Request;

/// A trace file and the shell that judges it.
struct Imported {
    tp: TraceProcessor,
    path: PathBuf,
}

impl Imported {
    fn new(tp: &TraceProcessor, path: &Path) -> Self {
        Self {
            tp: tp.clone(),
            path: path.to_owned(),
        }
    }

    fn q(&self, sql: &str) -> Vec<Row> {
        self.tp.query(&self.path, sql)
    }

    /// A query that returns exactly one row.
    fn one(&self, sql: &str) -> Row {
        let mut rows = self.q(sql);
        assert_eq!(rows.len(), 1, "expected one row from {sql}: {rows:?}");
        rows.pop().unwrap()
    }
}

fn int(r: &Row, col: &str) -> i64 {
    match &r[col] {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
            .unwrap_or_else(|| panic!("{col} is not an integer in {r:?}")),
        v => panic!("{col} is {v} in {r:?}"),
    }
}

fn float(r: &Row, col: &str) -> f64 {
    r[col]
        .as_f64()
        .unwrap_or_else(|| panic!("{col} is not a number in {r:?}"))
}

fn text<'a>(r: &'a Row, col: &str) -> Option<&'a str> {
    r[col].as_str()
}

/// Every stat trace_processor counts as an error or as data loss, printed
/// for the record, and asserted absent except for the names in `declared`:
/// losses the trace itself declares (the caller says why).
fn assert_import_errors(t: &Imported, kind: &str, declared: &[&str]) -> Vec<Row> {
    let rows = t.q(IMPORT_ERRORS_SQL);
    eprintln!("import errors/data loss of the {kind} trace: {rows:?}");
    let unexplained: Vec<&Row> = rows
        .iter()
        .filter(|r| !declared.contains(&text(r, "name").unwrap_or("")))
        .collect();
    assert!(
        unexplained.is_empty(),
        "trace_processor reports import errors in the {kind} trace ({}): {unexplained:?}",
        t.path.display()
    );
    rows
}

// ---------------------------------------------------------------------------
// What the UI shows, printed (run with --nocapture to read it).

/// Prints what the Perfetto UI would show of this trace: trace_processor's
/// own metadata metric (the UI's "Info and stats" page), the process list
/// with vitalsd's counters under `pid`, the CPU timeline if there is one and
/// the fault-sample flamegraph of `pid` if there are samples.
fn print_ui_view(t: &Imported, kind: &str, pid: Option<u32>) {
    let meta = t.tp.run(&[
        "--run-metrics",
        "trace_metadata",
        "--metrics-output",
        "text",
        t.path.to_str().unwrap(),
    ]);
    eprintln!(
        "==== {kind}: what the UI shows ({}; {})\n{meta}",
        t.path.display(),
        t.tp.version()
    );
    let overview = t.one(
        "select (select count(*) from process) as processes, \
                (select count(*) from thread) as threads, \
                (select count(distinct upid) from process_counter_track) as processes_with_counters, \
                (select count(*) from counter_track) as counter_tracks, \
                (select count(*) from sched_slice) as sched_slices, \
                (select count(*) from thread_state) as thread_states, \
                (select count(*) from perf_sample) as perf_samples",
    );
    eprintln!("overview: {overview:?}");
    if let Some(pid) = pid {
        for r in t.q(&format!(
            "select p.upid as upid, p.pid as pid, p.name as process, p.cmdline as cmdline, \
                    t.name as track, t.unit as unit, \
                    (select count(*) from counter c where c.track_id = t.id) as n, \
                    (select c.value from counter c where c.track_id = t.id order by c.ts desc limit 1) as last \
             from process p join process_counter_track t using(upid) \
             where p.pid = {pid} order by p.upid, t.name"
        )) {
            eprintln!("  process {pid} track: {r:?}");
        }
    }
    if int(&overview, "sched_slices") > 0 {
        for r in t.q(
            "select cpu, count(*) as slices, sum(utid = 0) as idle_slices, \
                    sum(case when utid != 0 then dur else 0 end) as busy_ns \
             from sched_slice group by cpu order by cpu",
        ) {
            eprintln!("  CPU timeline: {r:?}");
        }
        for r in t.q(
            "select t.tid as tid, t.name as thread, p.pid as pid, p.name as process, \
                    count(*) as slices, sum(s.dur) as running_ns \
             from sched_slice s join thread t using(utid) left join process p using(upid) \
             where t.tid != 0 group by s.utid order by running_ns desc limit 8",
        ) {
            eprintln!("  busiest thread: {r:?}");
        }
    }
    if let (Some(pid), true) = (pid, int(&overview, "perf_samples") > 0) {
        // A top-down flamegraph's heaviest stacks: each sample's callsite
        // chain, root first, as the UI's flamegraph nests them.
        for r in t.q(&format!(
            "with recursive anc(leaf, id) as ( \
               select distinct s.callsite_id, s.callsite_id from perf_sample s \
                 join thread t using(utid) join process p using(upid) \
                 where p.pid = {pid} and s.callsite_id is not null \
               union all \
               select anc.leaf, c.parent_id from anc join stack_profile_callsite c on c.id = anc.id \
                 where c.parent_id is not null), \
             stacks as ( \
               select leaf, group_concat(name, ' > ') as stack from ( \
                 select anc.leaf as leaf, coalesce(f.name, '[' || m.name || ']') as name \
                 from anc join stack_profile_callsite c on c.id = anc.id \
                 join stack_profile_frame f on f.id = c.frame_id \
                 join stack_profile_mapping m on m.id = f.mapping \
                 order by anc.leaf, c.depth) group by leaf) \
             select count(*) as samples, st.stack as stack from perf_sample s \
               join thread t using(utid) join process p using(upid) \
               join stacks st on st.leaf = s.callsite_id \
             where p.pid = {pid} group by st.stack order by samples desc limit 3"
        )) {
            eprintln!("  flamegraph stack: {r:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// Kernel reference values.

/// /proc/stat per-CPU times in USER_HZ ticks, by CPU number, parsed here so
/// the reference is independent of vitalsd's parser.
fn proc_stat_ticks() -> BTreeMap<u32, HashMap<&'static str, u64>> {
    const FIELDS: [&str; 8] = [
        "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
    ];
    let s = std::fs::read_to_string("/proc/stat").unwrap();
    s.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu: u32 = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: HashMap<&str, u64> = FIELDS
                .iter()
                .zip(f)
                .map(|(n, v)| (*n, v.parse().unwrap()))
                .collect();
            Some((cpu, v))
        })
        .collect()
}

/// `total=` of the `some` line of /proc/pressure/<resource> (µs), if the
/// kernel has PSI.
fn psi_some_total_us(resource: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/pressure/{resource}")).ok()?;
    s.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("total="))?
        .parse()
        .ok()
}

fn ticks_to_ns(ticks: u64) -> f64 {
    (ticks as u128 * 1_000_000_000 / clk_tck() as u128) as f64
}

// ---------------------------------------------------------------------------
// Checks shared by the trace kinds.

/// The one process `pid` has in the trace: named by argv[0], with the full
/// argv as cmdline, started by this test process. Returns its upid.
fn check_process(t: &Imported, pid: u32, argv: &[&str]) -> i64 {
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
enum Threads {
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
fn check_threads(t: &Imported, kind: Threads) {
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
type Tracks = HashMap<String, (f64, String)>;

/// The last value of each of vitalsd's per-process counters, by pid: one
/// (upid, tracks) entry per process instance holding that pid.
fn process_counters(t: &Imported) -> HashMap<u32, Vec<(i64, Tracks)>> {
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
fn check_row_against_tracks(row: &TableRow, tracks: &Tracks) {
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
fn check_counters_equal_table(t: &Imported, table: &str, workload: u32) {
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
fn check_system_tracks(
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

/// A `pingpong` workload's run, as its threads reported it.
struct PingPong {
    pid: u32,
    tids: Vec<i64>,
    /// tid -> (voluntary, involuntary) switches the kernel counted.
    switches: HashMap<i64, (i64, i64)>,
}

/// After `go`: waits for `done` and reads the threads' switch counts.
fn finish_ping_pong(w: &mut Workload, tids: Vec<i64>) -> PingPong {
    w.expect("done");
    let mut switches = HashMap::new();
    for _ in 0..2 {
        let line = w.read_line();
        let f: Vec<i64> = line
            .strip_prefix("csw ")
            .unwrap_or_else(|| panic!("workload said {line:?}"))
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        switches.insert(f[0], (f[1], f[2]));
    }
    PingPong {
        pid: w.pid(),
        tids,
        switches,
    }
}

/// The ping-pong on the CPU timeline: its two threads, named and under the
/// workload's process, ran at least 2N slices; each left the CPU blocked
/// (S/D) or runnable (R/R+) as often as the kernel counted its voluntary
/// and involuntary switches, up to the two a thread may make on its way
/// out after it read them; the thread tracks show the same sleeps.
/// `missed`: sched_switch events the kernel side counted as not delivered
/// to the programs during the recording (`switch_missed`, a declared drop:
/// a switch whose program did not run is in no record); a thread's slices
/// may fall short of the kernel's switch counts by at most that many.
fn check_ping_pong(t: &Imported, pp: &PingPong, n: u64, missed: i64) {
    let tids: Vec<String> = pp.tids.iter().map(|t| t.to_string()).collect();
    let tids = tids.join(", ");
    let threads = t.q(&format!(
        "select t.tid as tid, t.name as name, p.pid as pid from thread t \
         left join process p using(upid) where t.tid in ({tids})"
    ));
    assert_eq!(threads.len(), 2, "one thread per tid: {threads:?}");
    for th in &threads {
        assert_eq!(text(th, "name"), Some("vitals-workload"), "{th:?}");
        assert_eq!(th["pid"].as_i64(), Some(pp.pid as i64), "{th:?}");
    }
    let states = t.q(&format!(
        "select t.tid as tid, s.end_state as state, count(*) as n from sched_slice s \
         join thread t using(utid) where t.tid in ({tids}) group by 1, 2"
    ));
    let mut slices = 0;
    for &tid in &pp.tids {
        let count = |pred: &dyn Fn(&str) -> bool| -> i64 {
            states
                .iter()
                .filter(|r| int(r, "tid") == tid && text(r, "state").is_some_and(pred))
                .map(|r| int(r, "n"))
                .sum()
        };
        let blocked = count(&|s| s == "S" || s == "D");
        let runnable = count(&|s| s == "R" || s == "R+");
        let all: i64 = states
            .iter()
            .filter(|r| int(r, "tid") == tid)
            .map(|r| int(r, "n"))
            .sum();
        slices += all;
        let (vol, invol) = pp.switches[&tid];
        eprintln!(
            "thread {tid}: {all} slices, {blocked} ended blocked (kernel: {vol} voluntary), \
             {runnable} ended runnable (kernel: {invol} involuntary)"
        );
        assert!(
            (vol - missed..=vol + 2).contains(&blocked),
            "thread {tid}: {blocked} slices end in S/D, the kernel counted {vol} voluntary switches: {states:?}"
        );
        assert!(
            (invol - missed..=invol + 2).contains(&runnable),
            "thread {tid}: {runnable} slices end in R/R+, the kernel counted {invol} involuntary switches: {states:?}"
        );
        let sleeping = t.one(&format!(
            "select count(*) as n from thread_state ts join thread t using(utid) \
             where t.tid = {tid} and ts.state = 'S'"
        ));
        // A declared missed switch also splits or merges one S period.
        assert!(
            (int(&sleeping, "n") - count(&|s| s == "S")).abs() <= missed,
            "thread {tid}: {} S periods on its track vs {} slices ending in S ({missed} switches missed)",
            int(&sleeping, "n"),
            count(&|s| s == "S"),
        );
    }
    assert!(
        slices >= 2 * n as i64,
        "{slices} slices of {tids}, want >= {}",
        2 * n
    );
}

/// The number before the word `what` (e.g. "sched_switch") on the
/// `capture: ` line of the table.
fn capture_figure(table: &str, what: &str) -> u64 {
    let line = table
        .lines()
        .find(|l| l.starts_with("capture: "))
        .unwrap_or_else(|| panic!("no capture line in:\n{table}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words
        .iter()
        .position(|w| w.trim_end_matches(',') == what)
        .unwrap_or_else(|| panic!("no {what} in {line}"));
    words[i - 1].parse().unwrap()
}

/// Fault samples of `pid` resolve, through stack_profile_callsite and
/// stack_profile_frame, to `vitals_touch_pages` in the workload binary:
/// at least `min` samples, half of them or more through that frame.
fn check_fault_samples(t: &Imported, pid: u32, min: i64) {
    let r = t.one(&format!(
        "with recursive mine as ( \
           select s.id, s.callsite_id from perf_sample s join thread t using(utid) \
             join process p using(upid) where p.pid = {pid}), \
         chain(sample_id, callsite_id) as ( \
           select id, callsite_id from mine where callsite_id is not null \
           union all \
           select chain.sample_id, c.parent_id from chain \
             join stack_profile_callsite c on c.id = chain.callsite_id \
             where c.parent_id is not null) \
         select (select count(*) from mine) as samples, \
                (select count(*) from mine where callsite_id is null) as without_stack, \
                (select count(distinct chain.sample_id) from chain \
                   join stack_profile_callsite c on c.id = chain.callsite_id \
                   join stack_profile_frame f on f.id = c.frame_id \
                   where f.name like '%vitals_touch_pages%') as named, \
                (select group_concat(distinct m.name) from chain \
                   join stack_profile_callsite c on c.id = chain.callsite_id \
                   join stack_profile_frame f on f.id = c.frame_id \
                   join stack_profile_mapping m on m.id = f.mapping \
                   where f.name like '%vitals_touch_pages%') as mappings"
    ));
    eprintln!("fault samples of {pid}: {r:?}");
    let samples = int(&r, "samples");
    assert!(
        samples >= min,
        "{samples} perf_sample rows for {pid}, want >= {min}"
    );
    let named = int(&r, "named");
    assert!(
        named * 2 >= samples,
        "only {named} of {samples} samples resolve to vitals_touch_pages: {r:?}"
    );
    let wl = workload_bin();
    assert_eq!(
        text(&r, "mappings"),
        wl.to_str(),
        "vitals_touch_pages's frames map to the workload binary"
    );
}

fn record_args<'a>(trace: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "--interval",
        "500ms",
        "--top",
        "0",
        "--out",
        trace.to_str().unwrap(),
    ];
    v.extend_from_slice(extra);
    v
}

// ---------------------------------------------------------------------------
// The trace kinds.

/// `record`: a counter track per process per counter, with name and unit,
/// equal to the printed table; processes with their name and argv; threads
/// under their process; SysStats as cpu.times.*; PSI and loadavg tracks.
#[test]
fn record_imports_with_counters_equal_to_the_table_and_named_processes() {
    let tp = trace_processor();
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("record.pftrace");
    let (stat_before, psi_before) = (proc_stat_ticks(), psi_some_total_us("cpu"));
    let rec = Recording::start(
        &record_args(&trace, &["--duration", "3s"]),
        "eBPF accounting attached",
    );
    let mut w = Workload::spawn(&["spin", "1200"]);
    w.expect("ready");
    w.expect("done");
    let pid = w.pid();
    let table = rec.wait();
    let (stat_after, psi_after) = (proc_stat_ticks(), psi_some_total_us("cpu"));
    w.finish();

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record", Some(pid));
    assert_import_errors(&t, "record", &[]);
    let wl = workload_bin();
    check_process(&t, pid, &[wl.to_str().unwrap(), "spin", "1200"]);
    check_threads(&t, Threads::MainOnly);
    check_counters_equal_table(&t, &table, pid);
    check_system_tracks(&t, &stat_before, &stat_after, psi_before, psi_after);
}

/// `record --sched`: the ping-pong as the CPU timeline shows it, every
/// switch a slice, no thread unknown or under pid 0.
#[test]
fn sched_capture_imports_as_a_cpu_timeline_with_the_kernels_thread_states() {
    let tp = trace_processor();
    const N: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("sched.pftrace");
    let rec = Recording::start(
        &record_args(&trace, &["--duration", "4s", "--sched"]),
        "capture started",
    );
    let (mut w, tids) = Workload::spawn_ping_pong(N);
    w.go();
    let pp = finish_ping_pong(&mut w, tids);
    let table = rec.wait();
    w.finish();
    assert_eq!(capture_figure(&table, "sched"), 0, "records lost:\n{table}");
    // Switches the always-on programs found missing (prev not the CPU's
    // last next), for reading a thread-state mismatch below.
    eprintln!(
        "{}",
        table
            .lines()
            .find(|l| l.starts_with("map drops:"))
            .unwrap_or("no map drops line")
    );

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record --sched", Some(pp.pid));
    assert_import_errors(&t, "record --sched", &[]);
    check_threads(&t, Threads::Sched);
    check_ping_pong(&t, &pp, N, map_drop(&table, "switch_missed") as i64);
    check_counters_equal_table(&t, &table, pp.pid);
    // Every switch is a slice, but the first on each CPU: CompactSched
    // leaves its prev implicit, so trace_processor starts the timeline
    // there and counts it as compact_sched_switch_skipped (info).
    let r = t.one(
        "select (select count(*) from sched_slice) as slices, \
                (select coalesce(sum(value), 0) from stats where name = 'compact_sched_switch_skipped') as skipped, \
                (select count(distinct cpu) from sched_slice) as cpus",
    );
    let switches = capture_figure(&table, "sched_switch") as i64;
    assert_eq!(
        int(&r, "slices") + int(&r, "skipped"),
        switches,
        "slices + skipped vs the {switches} switches captured: {r:?}"
    );
    assert!(int(&r, "skipped") <= int(&r, "cpus") + 1, "{r:?}");
}

/// `record --faults`: the samples' callsites resolve to the function that
/// faulted.
#[test]
fn fault_capture_samples_resolve_to_the_faulting_function() {
    let tp = trace_processor();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("faults.pftrace");
    let rec = Recording::start(
        &record_args(
            &trace,
            &["--duration", "3s", "--faults", "--fault-period", "4"],
        ),
        "capture started",
    );
    let mut w = Workload::spawn(&["touch", "4000"]);
    w.expect("ready");
    w.go();
    w.expect("done");
    let pid = w.pid();
    // Alive until the recorder has symbolised.
    let table = rec.wait();
    w.finish();
    assert!(table.contains("fault samples"), "{table}");

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record --faults", Some(pid));
    assert_import_errors(&t, "record --faults", &[]);
    check_threads(&t, Threads::Samples);
    // 4000 faults at 1 in 4: about 1000 samples.
    check_fault_samples(&t, pid, 500);
    check_counters_equal_table(&t, &table, pid);
}

/// A capture of the service (`vitalsd run`), stored, and exported with
/// `vitalsctl export`: the same model as `record`'s, plus the history
/// prelude.
#[test]
fn service_capture_and_its_export_import_like_a_recording() {
    let tp = trace_processor();
    const N: u64 = 2000;
    let mut d = Daemon::start("");
    // A few seconds of history (sampled every 250 ms) for the prelude.
    d.wait_status("history", Duration::from_secs(20), |st| {
        st["samples"].as_u64().unwrap_or(0) >= 8
    });
    let (stat_before, psi_before) = (proc_stat_ticks(), psi_some_total_us("cpu"));
    let v = d.call(&Request::Capture {
        duration_s: 5.0,
        sched: true,
        faults: true,
    });
    let id = v["id"].as_str().unwrap().to_owned();
    d.wait_status("the capture to run", Duration::from_secs(10), |st| {
        st["capture"]["id"] == id.as_str()
    });
    // The status lists the capture as soon as it is asked for; its
    // programs attach after the recording has loaded them.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !d.log().contains("capture started") {
        assert!(
            Instant::now() < deadline,
            "capture never started: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (mut pp, tids) = Workload::spawn_ping_pong(N);
    let mut touch = Workload::spawn(&["touch", "4000"]);
    touch.expect("ready");
    pp.go();
    touch.go();
    let ping_pong = finish_ping_pong(&mut pp, tids);
    touch.expect("done");
    let st = d.call(&Request::Status {});
    assert_eq!(
        st["capture"]["id"],
        id.as_str(),
        "the workloads outlasted the capture; it must hold them whole: {st}"
    );
    d.wait_status("the capture to be stored", Duration::from_secs(30), |st| {
        st["capture"].is_null() && st["store"]["newest"] == id.as_str()
    });
    let (stat_after, psi_after) = (proc_stat_ticks(), psi_some_total_us("cpu"));
    let dir = tempfile::tempdir().unwrap();
    let exported = dir.path().join("exported.pftrace");
    let out = d.vitalsctl(&["export", &id, exported.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "vitalsctl export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored = d.store().join(format!("{id}.pftrace"));
    assert_eq!(
        std::fs::read(&exported).unwrap(),
        std::fs::read(&stored).unwrap(),
        "export is the stored capture"
    );
    let touch_pid = touch.pid();
    pp.finish();
    touch.finish();
    // The capture loads its own programs, which see the same switches as
    // the daemon's: the daemon's count bounds what the capture missed.
    let missed = d.call(&Request::Status {})["bpf_drops"]["switch_missed"]
        .as_i64()
        .unwrap_or(0);
    d.stop();

    let t = Imported::new(&tp, &exported);
    print_ui_view(&t, "service capture (vitalsctl export)", Some(touch_pid));
    assert_import_errors(&t, "service capture", &[]);
    check_threads(&t, Threads::Sched);
    let wl = workload_bin();
    check_process(
        &t,
        ping_pong.pid,
        &[wl.to_str().unwrap(), "pingpong", "2000"],
    );
    check_process(&t, touch_pid, &[wl.to_str().unwrap(), "touch", "4000"]);
    check_ping_pong(&t, &ping_pong, N, missed);
    // 4000 faults at the default 1 in 100.
    check_fault_samples(&t, touch_pid, 30);
    check_system_tracks(&t, &stat_before, &stat_after, psi_before, psi_after);
    // The process counters, as in `record` (no table to compare with here):
    // each of the ping-pong's switch counters holds at least what its two
    // threads counted.
    let counters = process_counters(&t);
    let instances = &counters[&ping_pong.pid];
    assert_eq!(instances.len(), 1, "{instances:?}");
    let tracks = &instances[0].1;
    let (vol, invol) = ping_pong
        .switches
        .values()
        .fold((0, 0), |(v, i), (a, b)| (v + a, i + b));
    assert!(
        tracks["voluntary_switches"].0 as i64 >= vol,
        "{tracks:?} vs {vol}"
    );
    assert!(
        tracks["involuntary_switches"].0 as i64 >= invol,
        "{tracks:?} vs {invol}"
    );
    assert_eq!(tracks["oncpu_ns"].1, "ns");
    // The history that led to the capture, under its own names.
    let h = t.one(
        "select count(*) as n from counter c join counter_track t on c.track_id = t.id \
         where t.name = 'history.cpu.local_busy_pct'",
    );
    assert!(int(&h, "n") >= 4, "history prelude missing: {h:?}");
}

/// A capture that loses records (a 4 KiB ring buffer under a switch storm)
/// declares it: trace_processor counts `ftrace_cpu_has_data_loss` for the
/// CPUs whose bundles carry `lost_events`, and nothing else.
///
/// Defect (issue #13, fixed): a thread seen in a switch or waking record
/// whose tgid never showed up (its switch-outs lost, or it exited before
/// the capture's last flush could read /proc/<tid>/status) is written in
/// ProcessTree without a tgid, and trace_processor reads the absent tgid as
/// 0: the thread lands under pid 0 (swapper).
#[test]
fn threads_whose_tgid_was_never_seen_are_not_attached_to_pid_0() {
    let tp = trace_processor();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("lossy.pftrace");
    let rec = Recording::start(
        &record_args(
            &trace,
            &["--duration", "3s", "--sched", "--capture-buffer-kb", "4"],
        ),
        "capture started",
    );
    // Short-lived children, each seen switching in, while a ping-pong
    // floods the ring buffer.
    let (mut pp, tids) = Workload::spawn_ping_pong(20000);
    let mut kids = Workload::spawn(&["children", "300", "2"]);
    kids.expect("ready");
    pp.go();
    kids.go();
    let table = rec.wait();
    let _ = finish_ping_pong(&mut pp, tids);
    while kids.read_line() != "done" {}
    pp.finish();
    kids.finish();
    let lost = capture_figure(&table, "sched");
    assert!(lost > 0, "the 4 KiB buffer lost nothing:\n{table}");

    // The writer's side, decoded with the official schema: every thread it
    // names carries its process.
    let decoded = decode_trace(&trace);
    let orphans: Vec<&Value> = decoded["process_tree"]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|th| th["tgid"].is_null())
        .collect();

    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record --sched, lossy", None);
    // The loss is declared per CPU (FtraceEventBundle.lost_events): expected.
    let errors = assert_import_errors(&t, "lossy record --sched", &["ftrace_cpu_has_data_loss"]);
    assert!(
        errors
            .iter()
            .any(|r| text(r, "name") == Some("ftrace_cpu_has_data_loss")),
        "the loss of {lost} records is not declared to trace_processor: {errors:?}"
    );
    assert!(
        orphans.is_empty(),
        "{} ProcessTree threads written without a tgid: {:?}",
        orphans.len(),
        &orphans[..orphans.len().min(10)]
    );
    check_threads(&t, Threads::Sched);
}

/// Defect (issue #13, fixed): a pid reused within one `record` kept the
/// dead process's identity: the new process got no ProcessTree entry of
/// its own and its counters went on the old process's tracks, and the
/// ended process's row was replaced by the new one's in the table.
#[test]
fn a_pid_reused_within_one_recording_is_two_processes_each_with_its_own_tracks_and_row() {
    let tp = trace_processor();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("reuse.pftrace");
    let rec = Recording::start(
        &[
            "--duration",
            "60s",
            "--interval",
            "200ms",
            "--top",
            "0",
            "--out",
            trace.to_str().unwrap(),
        ],
        "eBPF accounting attached",
    );
    let mut w = Workload::spawn(&["reuse-pid", "500", "250"]);
    w.expect("ready");
    w.go();
    let a = w.read_line();
    let pid: u32 = a
        .strip_prefix("a ")
        .unwrap_or_else(|| panic!("workload said {a:?}"))
        .parse()
        .unwrap();
    // A's end reaches the recording in samples of its own before B starts.
    std::thread::sleep(Duration::from_millis(1000));
    w.go();
    w.expect(&format!("b {pid}"));
    w.expect("done");
    std::thread::sleep(Duration::from_millis(600));
    unsafe { libc::kill(rec.child.id() as i32, libc::SIGINT) };
    let table = rec.wait();
    w.finish();

    let rows: Vec<TableRow> = table_rows(&table)
        .into_iter()
        .filter(|r| r.pid == pid)
        .collect();
    eprintln!("table rows of pid {pid}: {rows:?}");
    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record, pid reused", Some(pid));
    assert_import_errors(&t, "record (pid reuse)", &[]);
    let procs = t.q(&format!(
        "select upid, name, cmdline, start_ts, end_ts from process where pid = {pid} order by upid"
    ));
    eprintln!("trace_processor's processes with pid {pid}: {procs:?}");
    let counters = process_counters(&t);
    let instances = counters.get(&pid).cloned().unwrap_or_default();

    let mut names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        vec!["vitals-reuse-a", "vitals-reuse-b"],
        "both instances of pid {pid} in the table:\n{table}"
    );
    assert!(rows.iter().all(|r| r.ended), "{rows:?}");
    let cmdlines: Vec<&str> = procs.iter().filter_map(|p| text(p, "cmdline")).collect();
    assert_eq!(
        cmdlines,
        vec![
            "vitals-reuse-a spin-exit 500",
            "vitals-reuse-b spin-exit 250"
        ],
        "two processes with pid {pid}, each with its argv: {procs:?}"
    );
    assert_eq!(
        instances.len(),
        2,
        "counter tracks of two processes: {instances:?}"
    );
    // Each instance's tracks equal its own row: A's under A's upid.
    for (p, (upid, tracks)) in procs.iter().zip(&instances) {
        assert_eq!(int(p, "upid"), *upid, "{procs:?} vs {instances:?}");
        let argv0 = text(p, "name").unwrap();
        let row = rows
            .iter()
            .find(|r| r.name == argv0)
            .unwrap_or_else(|| panic!("no table row for {argv0}: {rows:?}"));
        check_row_against_tracks(row, tracks);
    }
}

/// Defect (issue #13, fixed): a process that exits before any procfs scan
/// sees it was named `<pid>`: in the table and in ProcessTree. The kernel
/// still knows its comm when it frees the task (sched_process_free carries
/// it). Recorded with --sched, whose switch records carry every child's
/// comm: the `<pid>` entry (written as the comm, cmdline_is_comm) also
/// overrides that name on the child's main thread.
#[test]
fn short_lived_processes_are_named_in_the_table_and_in_the_process_table() {
    let tp = trace_processor();
    const CHILDREN: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("children.pftrace");
    let rec = Recording::start(
        &record_args(&trace, &["--duration", "60s", "--sched"]),
        "capture started",
    );
    let mut w = Workload::spawn(&["children", &CHILDREN.to_string(), "5"]);
    w.expect("ready");
    w.go();
    let mut pids = Vec::new();
    loop {
        let line = w.read_line();
        if line == "done" {
            break;
        }
        let pid: u32 = line
            .strip_prefix("child ")
            .unwrap_or_else(|| panic!("workload said {line:?}"))
            .parse()
            .unwrap();
        pids.push(pid);
    }
    assert_eq!(pids.len(), CHILDREN);
    // The last children's frees reach a sample before the recording ends.
    std::thread::sleep(Duration::from_millis(1200));
    unsafe { libc::kill(rec.child.id() as i32, libc::SIGINT) };
    let table = rec.wait();
    w.finish();

    let rows = table_rows(&table);
    let t = Imported::new(&tp, &trace);
    print_ui_view(&t, "record, short-lived children", None);
    assert_import_errors(&t, "record (short-lived children)", &[]);
    let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    let procs = t.q(&format!(
        "select p.pid as pid, p.name as name, p.cmdline as cmdline, t.name as thread \
         from process p left join thread t on t.upid = p.upid and t.tid = p.pid \
         where p.pid in ({})",
        list.join(", ")
    ));
    let basename = |n: &str| n.rsplit('/').next().unwrap_or(n).to_owned();
    let mut unnamed_in_table = Vec::new();
    let mut unnamed_in_trace = Vec::new();
    for &pid in &pids {
        let mine: Vec<&TableRow> = rows.iter().filter(|r| r.pid == pid).collect();
        match mine.as_slice() {
            [r] if r.name == "vitals-workload" && r.ended => {}
            other => unnamed_in_table.push(format!("{pid}: {other:?}")),
        }
        let p: Vec<&Row> = procs
            .iter()
            .filter(|p| int(p, "pid") == pid as i64)
            .collect();
        match p.as_slice() {
            [p] if text(p, "name").map(basename).as_deref() == Some("vitals-workload")
                && text(p, "thread") == Some("vitals-workload") => {}
            other => unnamed_in_trace.push(format!("{pid}: {other:?}")),
        }
    }
    assert!(
        unnamed_in_table.is_empty() && unnamed_in_trace.is_empty(),
        "of {CHILDREN} short-lived children, {} not named in the table: {:?}; \
         {} not named in trace_processor's process table (process, main thread): {:?}",
        unnamed_in_table.len(),
        &unnamed_in_table[..unnamed_in_table.len().min(5)],
        unnamed_in_trace.len(),
        &unnamed_in_trace[..unnamed_in_trace.len().min(5)],
    );
}
