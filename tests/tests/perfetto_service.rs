//! heapprofd for real (issue #16), through both consumer routes: `vitalsd
//! heap` and a rule's heap profile run a session against a real traced on
//! private sockets, either by exec'ing Perfetto's own `perfetto` client
//! (perfetto_client) or as traced's consumer themselves through the
//! Perfetto SDK (in_process), profiling `vitals-workload heap-churn`
//! started with heapprofd's glibc preload library. Every test runs once per
//! route (`<test>::perfetto_client`, `<test>::in_process`) with the same
//! assertions. The stored profile is
//! judged by trace_processor (the importer the Perfetto UI runs): its
//! allocations belong to the target's process, their stacks resolve to the
//! workload's own function, and the figures vitalsd reports are the ones
//! trace_processor computes from the same file.
//!
//! Needs the PerfettoService tool (`cargo xtask test` sets
//! VITALS_PERFETTO_DIR) and trace_processor; without them every test here
//! fails, it never skips.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use serde_json::Value;
use vitals_tests::{
    daemon::Daemon,
    per_route,
    perfetto_service::{Group, HeapTarget, PerfettoService, Route},
    require_root,
    trace_processor::{trace_processor, TraceProcessor, IMPORT_ERRORS_SQL},
    vitalsd_bin,
};

/// The workload's allocating function (tests/src/bin/vitals-workload.rs).
const CHURN_FN: &str = "vitals_heap_churn";
/// At most 15 bytes: it is also the comm, which rules match.
const TARGET: &str = "vitals-churn";

per_route!(vitalsd_heap_profiles_a_preloaded_process_as_trace_processor_sees_it);
per_route!(a_target_not_running_gets_no_profile_and_is_named_as_not_running);
per_route!(a_refused_session_is_reported_with_traceds_reason_and_stores_nothing);
per_route!(traced_not_running_is_a_clear_error_and_nothing_is_stored);
per_route!(a_rule_heap_profiles_its_offender_through_the_real_service);

/// `vitalsd heap ARGS` with the sockets in `service_env`, run to its end in
/// a process group of its own.
fn vitalsd_heap(service_env: Vec<(&'static str, PathBuf)>, dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(vitalsd_bin());
    cmd.arg("heap")
        .args(args)
        .arg("--state-file")
        .arg(dir.join("ratelimit.json"))
        .envs(service_env)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Group::spawn(&mut cmd).output()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What trace_processor finds for one process in a heap profile.
#[derive(Debug)]
struct Imported {
    /// heap_profile_allocation rows of the process, and of any other.
    rows: u64,
    rows_elsewhere: u64,
    /// Sums of the positive rows (allocations) and of the negative (frees).
    allocations: u64,
    allocated_bytes: u64,
    frees: u64,
    freed_bytes: u64,
    /// Allocated bytes whose stack holds the workload's function.
    churn_bytes: u64,
    /// The stacks' distinct frames in the workload's binary, and those of
    /// them without a name.
    workload_frames: u64,
    unnamed_workload_frames: u64,
}

fn as_u64(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_i64().map(|i| i.max(0) as u64))
        .unwrap_or(0)
}

/// Imports `trace` and reads what it holds for `pid`, failing on any
/// import error.
fn import(tp: &TraceProcessor, trace: &Path, pid: u32) -> Imported {
    let upid = format!("(select upid from process where pid = {pid})");
    let totals = format!(
        "select count(*) as rows, \
         sum(case when count > 0 then count else 0 end) as allocations, \
         sum(case when size > 0 then size else 0 end) as allocated_bytes, \
         sum(case when count < 0 then -count else 0 end) as frees, \
         sum(case when size < 0 then -size else 0 end) as freed_bytes \
         from heap_profile_allocation where upid = {upid}"
    );
    let elsewhere =
        format!("select count(*) as n from heap_profile_allocation where upid is not {upid}");
    // Every allocation row's callsite and its ancestors: the whole stack.
    let stacks = format!(
        "with recursive anc(alloc, site) as ( \
           select id, callsite_id from heap_profile_allocation \
             where size > 0 and upid = {upid} \
           union all \
           select anc.alloc, c.parent_id from anc join stack_profile_callsite c \
             on c.id = anc.site where c.parent_id is not null) "
    );
    // The bytes of the rows with the workload's function in their stack.
    let churn = format!(
        "{stacks} select coalesce(sum(size), 0) as bytes from heap_profile_allocation \
         where id in (select anc.alloc from anc \
           join stack_profile_callsite c on c.id = anc.site \
           join stack_profile_frame f on f.id = c.frame_id \
           where f.name like '%{CHURN_FN}%')"
    );
    // The stacks' frames in the workload's binary (not stripped, so each
    // must have a name; heapprofd's stripped preload library has frames
    // without one, which is not ours to judge).
    let frames = format!(
        "{stacks} select count(distinct f.id) as frames, \
           count(distinct case when f.name is null or f.name = '' then f.id end) as unnamed \
         from anc join stack_profile_callsite c on c.id = anc.site \
         join stack_profile_frame f on f.id = c.frame_id \
         join stack_profile_mapping m on m.id = f.mapping \
         where m.name like '%/vitals-workload'"
    );
    let r = tp.query_many(
        trace,
        &[IMPORT_ERRORS_SQL, &totals, &elsewhere, &churn, &frames],
    );
    assert!(r[0].is_empty(), "import errors: {:?}", r[0]);
    let t = &r[1][0];
    Imported {
        rows: as_u64(&t["rows"]),
        rows_elsewhere: as_u64(&r[2][0]["n"]),
        allocations: as_u64(&t["allocations"]),
        allocated_bytes: as_u64(&t["allocated_bytes"]),
        frees: as_u64(&t["frees"]),
        freed_bytes: as_u64(&t["freed_bytes"]),
        churn_bytes: as_u64(&r[3][0]["bytes"]),
        workload_frames: as_u64(&r[4][0]["frames"]),
        unnamed_workload_frames: as_u64(&r[4][0]["unnamed"]),
    }
}

/// The profile belongs to the target and its stacks resolve: every
/// allocation row is the target's, the stacks' frames in the workload's
/// binary are named, and every allocated byte has the workload's function
/// in its stack (during the session only its thread allocates: the main
/// thread is blocked reading stdin).
fn assert_attributed(i: &Imported) {
    assert!(i.rows > 0 && i.allocations > 0, "no allocations: {i:?}");
    assert_eq!(i.rows_elsewhere, 0, "rows outside the target: {i:?}");
    assert!(i.workload_frames > 0, "{i:?}");
    assert_eq!(i.unnamed_workload_frames, 0, "{i:?}");
    assert_eq!(
        i.churn_bytes, i.allocated_bytes,
        "bytes without {CHURN_FN} in their stack: {i:?}"
    );
}

/// (allocations, allocated, freed) from the summary line `vitalsd heap`
/// printed for `pid`.
fn printed(stdout: &str, pid: u32) -> (u64, u64, u64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("pid {pid} ")))
        .unwrap_or_else(|| panic!("no line for pid {pid}:\n{stdout}"));
    let (_, rest) = line.split_once(": ").unwrap();
    let n: Vec<u64> = rest
        .split(", ")
        .take(3)
        .map(|part| part.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    (n[0], n[1], n[2])
}

fn vitalsd_heap_profiles_a_preloaded_process_as_trace_processor_sees_it(route: Route) {
    require_root();
    let tp = trace_processor();
    let service = PerfettoService::start();
    let target = HeapTarget::start(&service, TARGET);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("heap.pftrace");
    let args = heap_args(&service, route, TARGET, "3s", &out);
    let o = vitalsd_heap(service.env(), dir.path(), &strs(&args));
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", text(&o.stderr));
    let i = import(&tp, &out, target.pid());
    assert_attributed(&i);
    // The summary's figures are trace_processor's, from the same file.
    let (allocations, allocated, freed) = printed(&stdout, target.pid());
    assert_eq!(
        (allocations, allocated, freed),
        (i.allocations, i.allocated_bytes, i.freed_bytes),
        "{stdout}"
    );
    let meta: Value =
        serde_json::from_slice(&std::fs::read(vitalsd::heapprofd::metadata_path(&out)).unwrap())
            .unwrap();
    assert_eq!(meta["consumer"], route.name(), "{meta}");
    let p = &meta["outcome"]["processes"][0];
    assert_eq!(as_u64(&p["pid"]), u64::from(target.pid()), "{meta}");
    assert_eq!(as_u64(&p["frees"]), i.frees, "{meta}");
    assert_eq!(p["issues"], serde_json::json!([]), "{meta}");
    println!("{stdout}");
}

/// `vitalsd heap --duration D --out OUT --name NAME` through `route`
/// (with `service`'s perfetto client).
fn heap_args(
    service: &PerfettoService,
    route: Route,
    name: &str,
    duration: &str,
    out: &Path,
) -> Vec<String> {
    let mut args = route.args(&service.perfetto_bin());
    args.extend(
        [
            "--name",
            name,
            "--duration",
            duration,
            "--out",
            out.to_str().unwrap(),
        ]
        .map(String::from),
    );
    args
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A name nothing runs under: the session completes, the trace holds the
/// process list and no profile, and vitalsd fails saying the target is not
/// running. trace_processor confirms both from the stored trace.
fn a_target_not_running_gets_no_profile_and_is_named_as_not_running(route: Route) {
    require_root();
    let tp = trace_processor();
    let service = PerfettoService::start();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("heap.pftrace");
    let absent = "vitals-absent";
    let args = heap_args(&service, route, absent, "1s", &out);
    let o = vitalsd_heap(service.env(), dir.path(), &strs(&args));
    let stdout = text(&o.stdout);
    assert!(!o.status.success(), "{stdout}");
    assert!(stdout.contains("session: completed"), "{stdout}");
    assert!(
        stdout.contains(&format!("name:{absent}: no profile")) && stdout.contains("not running"),
        "{stdout}"
    );
    let r = tp.query_many(
        &out,
        &[
            IMPORT_ERRORS_SQL,
            "select count(*) as n from heap_profile_allocation",
            "select count(*) as n from process",
            &format!("select count(*) as n from process where name like '%{absent}%'"),
        ],
    );
    assert!(r[0].is_empty(), "import errors: {:?}", r[0]);
    assert_eq!(as_u64(&r[1][0]["n"]), 0);
    // The process list was there (the diagnosis rests on it) and lacks it.
    assert!(as_u64(&r[2][0]["n"]) > 1);
    assert_eq!(as_u64(&r[3][0]["n"]), 0);
}

/// traced refuses a second session under the same unique_session_name
/// while the first runs: the real client then exits 0 without a trace,
/// the SDK reads back nothing. vitalsd reports the refusal with traced's
/// reason on both routes and stores nothing; the first session is
/// unharmed.
fn a_refused_session_is_reported_with_traceds_reason_and_stores_nothing(route: Route) {
    require_root();
    let tp = trace_processor();
    let service = PerfettoService::start();
    let target = HeapTarget::start(&service, TARGET);
    let dir = tempfile::tempdir().unwrap();
    let first_out = dir.path().join("first.pftrace");
    let first_args = heap_args(&service, route, TARGET, "4s", &first_out);
    let first_dir = dir.path().join("first");
    std::fs::create_dir(&first_dir).unwrap();
    let mut first = Group::spawn(
        Command::new(vitalsd_bin())
            .arg("heap")
            .args(&first_args)
            .arg("--state-file")
            .arg(first_dir.join("ratelimit.json"))
            .envs(service.env())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    service.wait_for_session(vitalsd::heapprofd::config::DEFAULT_UNIQUE_SESSION_NAME);

    let out = dir.path().join("second.pftrace");
    let args = heap_args(&service, route, TARGET, "1s", &out);
    let o = vitalsd_heap(service.env(), dir.path(), &strs(&args));
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{stdout}");
    // traced's own words ("A trace with this unique session name already
    // exists"): from the client's "Service error: ", or through the SDK's
    // error callback.
    assert!(
        stderr.contains("traced refused the session") && stderr.contains("already exists"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("nothing stored"), "{stdout}");
    assert!(!out.exists());
    assert!(!vitalsd::heapprofd::metadata_path(&out).exists());

    let first = first.output();
    assert!(first.status.success(), "{}", text(&first.stdout));
    assert_attributed(&import(&tp, &first_out, target.pid()));
}

/// No traced at all (sockets nobody listens on): a clear error naming
/// traced, quickly, and nothing stored.
fn traced_not_running_is_a_clear_error_and_nothing_is_stored(route: Route) {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let tools = vitals_tests::perfetto_service::perfetto_dir();
    let out = dir.path().join("heap.pftrace");
    let env = vec![
        (
            "PERFETTO_PRODUCER_SOCK_NAME",
            dir.path().join("producer.sock"),
        ),
        (
            "PERFETTO_CONSUMER_SOCK_NAME",
            dir.path().join("consumer.sock"),
        ),
    ];
    let mut args = route.args(&tools.join("perfetto"));
    args.extend(
        ["--name", TARGET, "--duration", "1s", "--out"]
            .map(String::from)
            .into_iter()
            .chain([out.to_str().unwrap().to_owned()]),
    );
    let o = vitalsd_heap(env, dir.path(), &strs(&args));
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(!o.status.success(), "{stdout}");
    assert!(
        stderr.contains("traced is not running") && stderr.contains("consumer.sock"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("nothing stored"), "{stdout}");
    assert!(!out.exists());
    assert!(!vitalsd::heapprofd::metadata_path(&out).exists());
}

/// A rule in `vitalsd run` whose offender is on its heap allowlist: the
/// daemon profiles the offender by pid through the real service and stores
/// the profile; trace_processor finds the target's allocations in it, with
/// the totals the stored outcome reports.
fn a_rule_heap_profiles_its_offender_through_the_real_service(route: Route) {
    require_root();
    let tp = trace_processor();
    let service = PerfettoService::start();
    let target = HeapTarget::start(&service, TARGET);
    // The churn takes ~20 % of a CPU (it spins between rounds); above 5 %
    // for 1 s fires, which an idle process never reaches.
    let config = format!(
        "{}\n[[rule]]\nname = \"churn\"\n\
         metric = {{ kind = \"process_cpu_pct\", process = \"{TARGET}\" }}\n\
         threshold = 5\nwindow = \"1s\"\ncooldown = \"1h\"\n\
         capture = {{ duration = \"3s\", sched = false, heap_profile = true, \
         heap_allowlist = [\"{TARGET}\"] }}\n",
        route.config(&service.perfetto_bin())
    );
    let d = Daemon::start_with_env(&config, service.env());
    d.wait_status(
        "the capture and the heap profile",
        Duration::from_secs(90),
        |st| {
            st["store"]["captures"] == 2 && st["capture"].is_null() && st["heap_session"].is_null()
        },
    );
    let list = d.list();
    let heap = list
        .iter()
        .find(|m| !m["heapprofd"].is_null())
        .unwrap_or_else(|| panic!("no heap profile: {list:?}\n{}", d.log()));
    assert_eq!(heap["trigger"]["rule"], "churn");
    assert_eq!(heap["status"], "complete", "{heap}");
    let h = &heap["heapprofd"];
    assert_eq!(h["consumer"], route.name(), "{h}");
    assert_eq!(as_u64(&h["request"]["pids"][0]), u64::from(target.pid()));
    let id = heap["id"].as_str().unwrap();
    let i = import(&tp, &d.store().join(format!("{id}.pftrace")), target.pid());
    assert_attributed(&i);
    let p = &h["outcome"]["processes"][0];
    assert_eq!(as_u64(&p["pid"]), u64::from(target.pid()), "{h}");
    assert_eq!(
        (
            as_u64(&p["allocations"]),
            as_u64(&p["allocated_bytes"]),
            as_u64(&p["freed_bytes"])
        ),
        (i.allocations, i.allocated_bytes, i.freed_bytes),
        "{h}"
    );
}

/// The daemon's threads named `heapprofd-sdk` (the in-process consumer's
/// session threads), from /proc.
fn sdk_threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "heapprofd-sdk")
        })
        .count()
}

/// A traced that hangs (SIGSTOP: its sockets still accept, nothing
/// answers) holds the in-process consumer's SDK call past the deadline.
/// The thread blocked in it cannot be interrupted, but it must be the
/// only one: the sessions after it are refused at once, saying why,
/// instead of each leaving a thread behind. Once traced answers again
/// the thread ends.
#[test]
fn a_hung_traced_costs_the_in_process_consumer_one_thread_not_one_per_session() {
    require_root();
    let service = PerfettoService::start();
    let config = format!(
        "{}allowlist = [\"{TARGET}\"]\n\
         system_per_hour = 100\nsystem_per_day = 100\ntarget_per_hour = 100\ntarget_per_day = 100\n",
        Route::InProcess.config(&service.perfetto_bin())
    );
    let d = Daemon::start_with_env(&config, service.env());
    d.wait_status("a sample", Duration::from_secs(10), |st| {
        st["samples"].as_u64().unwrap_or(0) > 0
    });
    let traced = nix::unistd::Pid::from_raw(service.traced_pid() as i32);
    nix::sys::signal::kill(traced, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let mut outputs = Vec::new();
    for _ in 0..3 {
        let o = d.vitalsctl(&["heap", "--name", TARGET, "--duration", "1s"]);
        assert!(!o.status.success(), "{}", text(&o.stdout));
        outputs.push(format!("{}{}", text(&o.stdout), text(&o.stderr)));
    }
    let stuck = sdk_threads(d.pid());
    nix::sys::signal::kill(traced, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(
        stuck, 1,
        "session threads left behind by 3 sessions against a hung traced"
    );
    assert!(
        outputs[0].contains("did not answer"),
        "the first session: {}\n{}",
        outputs[0],
        d.log()
    );
    for o in &outputs[1..] {
        assert!(
            o.contains("previous in-process session"),
            "{o}\n{}",
            d.log()
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sdk_threads(d.pid()) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned session thread did not end once traced answered\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
