//! The imported trace as the tests query it: the shell and file together,
//! typed column reads, the import-error check every trace kind passes, and
//! the printout of what the UI would show.

use super::*;

/// A trace file and the shell that judges it.
pub struct Imported {
    tp: TraceProcessor,
    path: PathBuf,
}

impl Imported {
    pub fn new(tp: &TraceProcessor, path: &Path) -> Self {
        Self {
            tp: tp.clone(),
            path: path.to_owned(),
        }
    }

    pub fn q(&self, sql: &str) -> Vec<Row> {
        self.tp.query(&self.path, sql)
    }

    /// A query that returns exactly one row.
    pub fn one(&self, sql: &str) -> Row {
        let mut rows = self.q(sql);
        assert_eq!(rows.len(), 1, "expected one row from {sql}: {rows:?}");
        rows.pop().unwrap()
    }
}

pub fn int(r: &Row, col: &str) -> i64 {
    match &r[col] {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
            .unwrap_or_else(|| panic!("{col} is not an integer in {r:?}")),
        v => panic!("{col} is {v} in {r:?}"),
    }
}

pub fn float(r: &Row, col: &str) -> f64 {
    r[col]
        .as_f64()
        .unwrap_or_else(|| panic!("{col} is not a number in {r:?}"))
}

pub fn text<'a>(r: &'a Row, col: &str) -> Option<&'a str> {
    r[col].as_str()
}

/// Every stat trace_processor counts as an error or as data loss, printed
/// for the record, and asserted absent except for the names in `declared`:
/// losses the trace itself declares (the caller says why).
pub fn assert_import_errors(t: &Imported, kind: &str, declared: &[&str]) -> Vec<Row> {
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
pub fn print_ui_view(t: &Imported, kind: &str, pid: Option<u32>) {
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
