//! Config tests: parsing, defaults, key-naming errors and ranges, and
//! proptests that no value makes the parser panic.

use super::*;
use crate::event_set::EventSet;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("test.toml"), text)
}

#[test]
fn empty_file_is_the_defaults() {
    assert_eq!(parse("").unwrap(), Config::default());
}

#[test]
fn defaults_round_trip_through_toml() {
    let d = Config::default();
    assert_eq!(parse(&d.to_toml()).unwrap(), d);
}

#[test]
fn unknown_key_is_named() {
    let e = parse("[sampling]\nintervall = \"1s\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("intervall"), "{e}");
    let e = parse("bogus = 1\n").unwrap_err().to_string();
    assert!(e.contains("bogus"), "{e}");
}

#[test]
fn bad_values_name_the_key() {
    let e = parse("[sampling]\ninterval = \"fast\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("interval") || e.contains("fast"), "{e}");
    let e = parse("[sampling]\ninterval = \"10ms\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("sampling.interval"), "{e}");
    let e = parse("[store]\nquota_bytes = 5\n").unwrap_err().to_string();
    assert!(e.contains("store.quota_bytes"), "{e}");
    let e = parse("[capture]\nbuffer_bytes = 3000000\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("capture.buffer_bytes") && e.contains("power of two"),
        "{e}"
    );
    let e = parse("[capture]\nstack_entries = 1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("capture.stack_entries"), "{e}");
    let e = parse(
        "[[rule]]\nname = \"x\"\nmetric = { kind = \"psi_avg10\", resource = \"gpu\", full = false }\nthreshold = 5\nwindow = \"10s\"\ncooldown = \"1m\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("metric.resource"), "{e}");
    let e = parse("[[rule]]\nname = \"x\"\nmetric = { kind = \"nope\" }\nthreshold = 5\nwindow = \"10s\"\ncooldown = \"1m\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn rules_parse() {
    let c = parse(
        r#"
[sampling]
interval = "200ms"
history = "1m"

[[rule]]
name = "spinner"
metric = { kind = "process_cpu_pct", process = "vitals-workload" }
threshold = 50
window = "1s"
cooldown = "1h"
capture = { duration = "2s", sched = false }
"#,
    )
    .unwrap();
    assert_eq!(c.rules.len(), 1);
    assert_eq!(c.rules[0].capture.duration.0, Duration::from_secs(2));
    assert!(!c.rules[0].capture.events.sched);
    assert_eq!(c.history_len(), 300);
}

/// What users see today: a rule's capture records the CPU timeline
/// unless it names `sched`/`faults` (`vitalsctl capture` and `vitalsd
/// record` default to no events: `event_set` tests those).
#[test]
fn a_rules_capture_records_sched_unless_it_says_otherwise() {
    let rule = |capture: &str| {
        let text = format!(
            "[[rule]]\nname = \"r\"\nmetric = {{ kind = \"system_cpu_busy_pct\" }}\n\
             threshold = 90\nwindow = \"10s\"\ncooldown = \"1m\"\n{capture}"
        );
        parse(&text).unwrap().rules[0].capture.events
    };
    let sched_only = EventSet {
        sched: true,
        faults: false,
    };
    assert_eq!(rule(""), sched_only);
    assert_eq!(rule("capture = { duration = \"5s\" }\n"), sched_only);
    assert_eq!(
        rule("capture = { faults = true }\n"),
        EventSet {
            sched: true,
            faults: true
        }
    );
    assert_eq!(
        rule("capture = { sched = false }\n"),
        EventSet {
            sched: false,
            faults: false
        }
    );
    // The file's keys are still `sched` and `faults`: a typo is an error.
    let e = parse(
        "[[rule]]\nname = \"r\"\nmetric = { kind = \"system_cpu_busy_pct\" }\n\
         threshold = 90\nwindow = \"10s\"\ncooldown = \"1m\"\ncapture = { shed = true }\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("shed"), "{e}");
}

/// `capture = { offcpu = true }` and `[capture] offcpu_watch`: a
/// process rule watches its offender; a system-wide rule needs the list
/// (or offcpu_watch_all); every bad input names its key.
#[test]
fn offcpu_capture_keys_parse_and_bad_ones_name_the_key() {
    let cfg = |capture_table: &str, metric: &str, capture: &str| {
        parse(&format!(
            "{capture_table}\n[[rule]]\nname = \"r\"\nmetric = {metric}\n\
             threshold = 2\nwindow = \"10s\"\ncooldown = \"1m\"\ncapture = {capture}\n"
        ))
    };
    const PROCESS: &str = r#"{ kind = "main_thread_long_blocks", process = "app" }"#;
    const SYSTEM: &str = r#"{ kind = "system_cpu_busy_pct" }"#;
    let c = cfg("", PROCESS, "{ offcpu = true }").unwrap();
    assert!(c.rules[0].capture.offcpu);
    // The CPU timeline stays on (a rule's default): the blocks are cut
    // from it.
    assert!(c.rules[0].capture.events.sched);
    assert!(c.capture.offcpu_watch.is_empty() && !c.capture.offcpu_watch_all);
    assert!(
        !cfg("", PROCESS, "{ duration = \"2s\" }").unwrap().rules[0]
            .capture
            .offcpu
    );
    let c = cfg(
        "[capture]\noffcpu_watch = [\"surfaceflinger\", \"system_server\"]",
        SYSTEM,
        "{ offcpu = true, faults = true }",
    )
    .unwrap();
    assert_eq!(c.capture.offcpu_watch, ["surfaceflinger", "system_server"]);
    assert!(c.rules[0].capture.offcpu && c.rules[0].capture.events.faults);
    let c = cfg(
        "[capture]\noffcpu_watch_all = true",
        SYSTEM,
        "{ offcpu = true }",
    )
    .unwrap();
    assert!(c.capture.offcpu_watch_all);
    // Round trip through the effective config.
    assert_eq!(parse(&c.to_toml()).unwrap(), c);

    let err = |t: &str, m: &str, cap: &str| cfg(t, m, cap).unwrap_err().to_string();
    let e = err("", SYSTEM, "{ offcpu = true }");
    assert!(
        e.contains("capture.offcpu") && e.contains("offcpu_watch") && e.contains("system-wide"),
        "{e}"
    );
    let e = err("", PROCESS, "{ offcpu = true, sched = false }");
    assert!(e.contains("offcpu needs the CPU timeline"), "{e}");
    let e = err("", PROCESS, "{ ofcpu = true }");
    assert!(e.contains("ofcpu"), "{e}");
    let e = err("", PROCESS, "{ offcpu = \"yes\" }");
    assert!(e.contains("offcpu") || e.contains("yes"), "{e}");
    let e = err("[capture]\noffcpu_watch = [\"sys*\"]", PROCESS, "{}");
    assert!(
        e.contains("capture.offcpu_watch") && e.contains("no globs"),
        "{e}"
    );
    let e = err(
        "[capture]\noffcpu_watch = [\"/system/bin/surfaceflinger\"]",
        PROCESS,
        "{}",
    );
    assert!(
        e.contains("capture.offcpu_watch") && e.contains("sys"),
        "{e}"
    );
    let e = err("[capture]\noffcpu_watch = [\"\"]", PROCESS, "{}");
    assert!(e.contains("capture.offcpu_watch"), "{e}");
    let e = err(
        "[capture]\noffcpu_watch = \"surfaceflinger\"",
        PROCESS,
        "{}",
    );
    assert!(e.contains("offcpu_watch"), "{e}");
    let e = err(
        "[capture]\noffcpu_watch = [\"a\"]\noffcpu_watch_all = true",
        PROCESS,
        "{}",
    );
    assert!(e.contains("capture.offcpu_watch_all"), "{e}");
    let many: Vec<String> = (0..65).map(|i| format!("\"p{i}\"")).collect();
    let e = err(
        &format!("[capture]\noffcpu_watch = [{}]", many.join(", ")),
        PROCESS,
        "{}",
    );
    assert!(e.contains("at most 64"), "{e}");
    let e = err(
        "[capture]\nbackend = \"perfetto\"",
        PROCESS,
        "{ offcpu = true }",
    );
    assert!(e.contains("capture.offcpu") && e.contains("ebpf"), "{e}");
}

#[test]
fn durations() {
    assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(
        parse_duration("7d").unwrap(),
        Duration::from_secs(7 * 86400)
    );
    assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
    assert!(parse_duration("0s").is_err());
    assert!(parse_duration("abc").is_err());
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("1e20s").is_err());
    assert!(parse_duration("1e-9s").is_err());
    assert!(parse_duration("367d").is_err());
    assert_eq!(parse_duration("366d").unwrap(), MAX_DURATION);
}

#[test]
fn huge_durations_are_errors_that_name_the_key_not_panics() {
    for (text, key) in [
        ("[sampling]\nhistory = \"1e20s\"\n", "history"),
        ("[store]\nmax_age = \"1e300d\"\n", "max_age"),
        ("[heapprofd]\nmax_duration = \"2h\"\n", "heapprofd.max_duration"),
        (
            "[[rule]]\nname = \"x\"\nmetric = { kind = \"loadavg_per_cpu\" }\nthreshold = 1\nwindow = \"1s\"\ncooldown = \"1e20s\"\n",
            "cooldown",
        ),
        (
            "[[rule]]\nname = \"x\"\nmetric = { kind = \"loadavg_per_cpu\" }\nthreshold = 1\nwindow = \"1s\"\ncooldown = \"1m\"\ncapture = { duration = \"2h\" }\n",
            "capture.duration",
        ),
        ("[sampling]\nmax_tasks = 4294967295\n", "sampling.max_tasks"),
        ("[sampling]\nexits_per_second = 0\n", "sampling.exits_per_second"),
        (
            "[sampling]\nexits_per_second = 1000001\n",
            "sampling.exits_per_second",
        ),
        ("[sampling]\nhistory_processes = 0\n", "sampling.history_processes"),
        ("[sampling]\nlong_block = \"2h\"\n", "sampling.long_block"),
        ("[sampling]\nmax_waker_pairs = 8\n", "sampling.max_waker_pairs"),
        (
            "[conditions]\nmax_thermal_millicelsius = 9223372036854775807\n",
            "conditions.max_thermal_millicelsius",
        ),
        ("[budget]\ncaptures_per_hour = 4294967295\n", "budget"),
        ("[store]\nmax_capture_bytes = 1024\n", "store.max_capture_bytes"),
        (
            "[[rule]]\nname = \"manual\"\nmetric = { kind = \"loadavg_per_cpu\" }\nthreshold = 1\nwindow = \"1s\"\ncooldown = \"1m\"\n",
            "rule[0].name",
        ),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text:?}: {e}");
    }
}

proptest::proptest! {
    /// No string makes the parser panic, and what it accepts is in range.
    #[test]
    fn parse_duration_never_panics(s in ".{0,40}") {
        if let Ok(d) = parse_duration(&s) {
            proptest::prop_assert!(d >= Duration::from_millis(1) && d <= MAX_DURATION);
        }
    }

    /// Numbers of any magnitude with every unit: in range or an error.
    #[test]
    fn parse_duration_takes_any_number_with_a_unit(
        v in proptest::num::f64::ANY,
        unit in proptest::sample::select(vec!["", "ms", "s", "m", "h", "d"]),
    ) {
        let s = format!("{v}{unit}");
        if let Ok(d) = parse_duration(&s) {
            proptest::prop_assert!(d >= Duration::from_millis(1) && d <= MAX_DURATION);
        }
    }

    /// A whole config file with arbitrary duration and integer values
    /// parses or fails with an error; it never panics.
    #[test]
    fn config_with_arbitrary_values_never_panics(
        dur in ".{0,24}",
        n in proptest::num::i64::ANY,
    ) {
        let text = format!(
            "[sampling]\nhistory = {dur:?}\nmax_tasks = {n}\n[store]\nmax_age = {dur:?}\nquota_bytes = {n}\n"
        );
        let _ = parse(&text);
    }
}

#[test]
fn heapprofd_consumer_names_the_route_and_refuses_what_the_build_lacks() {
    use crate::heapprofd::ConsumerRoute;
    assert_eq!(
        parse("").unwrap().heapprofd.consumer,
        ConsumerRoute::PerfettoClient
    );
    assert_eq!(
        parse("[heapprofd]\nconsumer = \"perfetto_client\"\n")
            .unwrap()
            .heapprofd
            .consumer,
        ConsumerRoute::PerfettoClient
    );
    // An unknown route: toml's error quotes the line, key and all, and
    // lists the routes.
    let e = parse("[heapprofd]\nconsumer = \"sdk\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("consumer = \"sdk\"") && e.contains("in_process"),
        "{e}"
    );
    let in_process = parse("[heapprofd]\nconsumer = \"in_process\"\n");
    if cfg!(feature = "producer") {
        assert_eq!(
            in_process.unwrap().heapprofd.consumer,
            ConsumerRoute::InProcess
        );
    } else {
        // Without the SDK: refused at the config check, never a silent
        // fall back to the client.
        let e = in_process.unwrap_err().to_string();
        assert!(
            e.contains("heapprofd.consumer") && e.contains("producer"),
            "{e}"
        );
    }
}

/// Runs `Config::load` on a thread: a load that blocks is a failure, not
/// a hung test. `unblock` ends a blocked load (writes the FIFO).
fn load_within(path: &Path, unblock: impl FnOnce()) -> Result<Config, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_owned();
    let t = std::thread::spawn(move || {
        let _ = tx.send(Config::load(&p).map_err(|e| e.to_string()));
    });
    let r = rx.recv_timeout(Duration::from_secs(10));
    if r.is_err() {
        unblock();
    }
    t.join().unwrap();
    r.expect("Config::load blocked")
}

#[test]
fn load_of_an_empty_or_blank_file_is_an_error_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("vitalsd.toml");
    for text in ["", " \n\t\n"] {
        std::fs::write(&p, text).unwrap();
        let e = load_within(&p, || {}).unwrap_err();
        assert!(e.contains("empty") && e.contains("vitalsd.toml"), "{e}");
    }
    // Every default, said on purpose.
    std::fs::write(&p, "# all defaults\n").unwrap();
    assert_eq!(load_within(&p, || {}).unwrap(), Config::default());
}

#[test]
fn load_of_a_fifo_fails_at_once_instead_of_waiting_for_a_writer() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("vitalsd.toml");
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let e = load_within(&p, || {
        // A writer ends the blocked open(2).
        let _ = std::fs::OpenOptions::new().write(true).open(&p);
    })
    .unwrap_err();
    assert!(
        e.contains("not a regular file") && e.contains("FIFO") && e.contains("vitalsd.toml"),
        "{e}"
    );
    // A directory too.
    let e = load_within(d.path(), || {}).unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
}

#[test]
fn load_reads_no_more_than_the_size_limit() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("vitalsd.toml");
    // 400 MB of NULs, sparse: reading it whole would take 400 MB of memory.
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(400 << 20).unwrap();
    drop(f);
    let e = load_within(&p, || {}).unwrap_err();
    assert!(
        e.contains(&format!("larger than {MAX_CONFIG_BYTES} bytes")),
        "{e}"
    );
    // Just over the limit, in comments that would parse: refused; at the
    // limit: read.
    let mut text = "#".repeat(MAX_CONFIG_BYTES as usize);
    text.replace_range(MAX_CONFIG_BYTES as usize - 1.., "\n");
    std::fs::write(&p, &text).unwrap();
    assert_eq!(load_within(&p, || {}).unwrap(), Config::default());
    text.push('\n');
    std::fs::write(&p, &text).unwrap();
    assert!(load_within(&p, || {}).unwrap_err().contains("larger than"));
}

#[test]
fn errors_quoting_the_file_are_bounded() {
    // A bad line of 200 KiB: toml quotes it.
    let long = "x".repeat(200 << 10);
    let e = parse(&format!("[sampling]\ninterval = \"{long}\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.len() < 2 * MAX_MESSAGE_BYTES, "{} bytes", e.len());
    assert!(e.contains("[truncated: "), "{e}");
    // A rule's name in the key, a value in the message.
    let e = parse(&format!(
        "[[rule]]\nname = \"{long}\"\nmetric = {{ kind = \"psi_avg10\", resource = \"{long}\", full = false }}\nthreshold = 5\nwindow = \"10s\"\ncooldown = \"1m\"\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.len() < 3 * MAX_MESSAGE_BYTES, "{} bytes", e.len());
    assert!(e.contains("[truncated: "), "{e}");
}

#[test]
fn bounded_cuts_at_a_char_boundary_and_says_so() {
    assert_eq!(bounded("short", 10), "short");
    let s = "é".repeat(10); // 20 bytes
    let b = bounded(&s, 5);
    assert_eq!(b, "éé… [truncated: 20 bytes in all]");
}

#[test]
fn the_capture_backend_and_prelude_keys_read() {
    let c: Config = toml::from_str("[capture]\nbackend = \"perfetto\"\n").unwrap();
    assert_eq!(c.capture.backend, crate::config::BackendChoice::Perfetto);
    assert!(toml::from_str::<Config>("[capture]\nbackend = \"bpf\"\n").is_err());
    let rule = |prelude: &str| {
        format!(
            "[[rule]]\nname = \"r\"\nmetric = {{ kind = \"system_cpu_busy_pct\" }}\n\
             threshold = 90\nwindow = \"1s\"\ncooldown = \"1m\"\n\
             capture = {{ prelude = \"{prelude}\" }}\n"
        )
    };
    let c: Config = toml::from_str(&rule("ring")).unwrap();
    assert_eq!(c.rules[0].capture.prelude, Prelude::Ring);
    assert!(toml::from_str::<Config>(&rule("rings")).is_err());
}
