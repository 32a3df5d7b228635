//! heapprofd profiles through the daemon: `vitalsctl heap`, and a rule
//! profiling its allowlisted offender beside the capture.

use super::*;

#[test]
fn vitalsctl_heap_stores_the_profile_with_heapprofds_outcome() {
    let mut d = Daemon::start(&heap_config(""));
    let out = d.vitalsctl(&["heap", "--name", "surfaceflinger", "--duration", "300ms"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let list = d.list();
    assert_eq!(list.len(), 1, "{list:?}");
    let m = &list[0];
    assert_eq!(m["trigger"]["rule"], "manual-heap");
    assert_eq!(m["status"], "complete", "{m}");
    let h = &m["heapprofd"];
    assert_eq!(h["status"]["kind"], "completed", "{h}");
    assert_eq!(h["request"]["process_names"][0], "surfaceflinger");
    assert!(!h["trace_config_hex"].as_str().unwrap().is_empty());
    let targets = h["outcome"]["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 1, "{h}");
    // The profile itself decodes with the official schema.
    let id = m["id"].as_str().unwrap();
    let t = decode_trace(&d.store().join(format!("{id}.pftrace")));
    assert!(t["profile_packets"].as_u64().unwrap() >= 1, "{t}");
    // No stray sidecar next to it; the rate-limit history persists under state/.
    let names: Vec<String> = std::fs::read_dir(d.store())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".meta.json")), "{names:?}");
    assert!(d.store().join("state/heapprofd_ratelimit.json").exists());
    // perfetto's output directory is emptied into the store.
    let left: Vec<_> = std::fs::read_dir(d.store().join("heapprofd"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Across a restart the per-target limit (2 an hour by default) holds:
    // one more is allowed, the third is refused.
    d.stop();
    d.spawn();
    assert_eq!(d.list().len(), 1, "restart kept the profile");
    let heap =
        |d: &Daemon| d.vitalsctl(&["heap", "--name", "surfaceflinger", "--duration", "200ms"]);
    assert!(heap(&d).status.success(), "{}", d.log());
    let third = heap(&d);
    assert!(!third.status.success());
    let err = String::from_utf8_lossy(&third.stderr);
    assert!(
        err.to_lowercase().contains("rate") || err.contains("limit"),
        "{err}"
    );
}

#[test]
fn a_rule_heap_profiles_its_allowlisted_offender_beside_the_capture() {
    let rule = SPINNER_RULE.replace(
        "capture = { duration = \"1s\", sched = false }",
        "capture = { duration = \"1s\", sched = false, heap_profile = true, heap_allowlist = [\"vitals-workload\"] }",
    );
    let d = Daemon::start(&format!("{}\n{rule}", heap_config("")));
    let mut w = Workload::spawn(&["spin", "4000"]);
    w.expect("ready");
    d.wait_status(
        "the capture and the heap profile",
        Duration::from_secs(30),
        |st| {
            st["store"]["captures"] == 2 && st["capture"].is_null() && st["heap_session"].is_null()
        },
    );
    w.expect("done");
    let pid = w.pid();
    w.finish();
    let list = d.list();
    let heap = list
        .iter()
        .find(|m| !m["heapprofd"].is_null())
        .unwrap_or_else(|| panic!("no heap profile: {list:?}"));
    assert_eq!(heap["trigger"]["rule"], "spinner");
    assert_eq!(
        heap["heapprofd"]["request"]["pids"][0].as_u64(),
        Some(pid as u64)
    );
    assert!(list
        .iter()
        .any(|m| m["heapprofd"].is_null() && m["trigger"]["rule"] == "spinner"));
}
