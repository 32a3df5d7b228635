//! vitalsctl as a shell tool: a closed pipe ends it quietly, a failed
//! export leaves the file it would replace alone, and names a process
//! chose are printed escaped, as `ps` prints them.

use std::os::unix::process::ExitStatusExt;

use super::*;

/// A stored manual capture's id.
fn stored_capture(d: &Daemon) -> String {
    let v = d.call(&Request::Capture {
        duration_s: 0.3,
        sched: false,
        faults: false,
        offcpu: None,
    });
    let id = v["id"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned();
    d.wait_status("the capture to be stored", Duration::from_secs(60), |st| {
        st["capture"].is_null() && d.list().iter().any(|m| m["id"] == id.as_str())
    });
    id
}

/// `vitalsctl top | head`, `dump | true`: the reader is gone. vitalsctl
/// panicked ("failed printing to stdout: Broken pipe", exit 101); it must
/// end as `cat` does there, by SIGPIPE, saying nothing.
#[test]
fn vitalsctl_ends_quietly_when_its_reader_goes_away() {
    let d = Daemon::start("");
    let id = stored_capture(&d);
    let cases: [&[&str]; 9] = [
        &["top", "--once"],
        &["top"],
        &["dump"],
        &["config"],
        &["status"],
        &["list"],
        &["--json", "status"],
        &["--json", "top", "--once"],
        &["export", &id, "-"],
    ];
    for args in cases {
        let (read_end, write_end) = nix::unistd::pipe().unwrap();
        // The reader is gone before the first write.
        drop(read_end);
        let out = Command::new(vitalsd_bin().with_file_name("vitalsctl"))
            .arg("--socket")
            .arg(d.socket())
            .args(args)
            .stdout(Stdio::from(write_end))
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "vitalsctl {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "vitalsctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `vitalsctl export <wrong id> file` truncated an existing file to 0
/// bytes: the file was created before the daemon answered.
#[test]
fn a_failed_export_leaves_an_existing_file_alone() {
    let d = Daemon::start("");
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("trace.pftrace");
    std::fs::write(&file, b"an earlier export").unwrap();
    let out = d.vitalsctl(&["export", "no-such-capture", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(std::fs::read(&file).unwrap(), b"an earlier export");
    let entries = || std::fs::read_dir(out_dir.path()).unwrap().count();
    assert_eq!(entries(), 1, "a temporary file was left behind");
    // A good export replaces it whole.
    let id = stored_capture(&d);
    let out = d.vitalsctl(&["export", &id, file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        std::fs::read(d.store().join(format!("{id}.pftrace"))).unwrap()
    );
    assert_eq!(entries(), 1);
}

/// A process of any uid may name itself `\e]0;owned\a\e[2J…`: `top`
/// printed it raw to root's terminal, and a newline in argv[0] split its
/// row. Its name, and the rule's offender in `dump`, must come out escaped.
#[test]
fn hostile_process_names_are_printed_escaped() {
    let name = "\x1b]0;owned\x07\x1b[2J\nfake row";
    let d = Daemon::start(
        r#"
[[rule]]
name = "hostile-name"
metric = { kind = "process_cpu_pct", process = "\u001b]0;owned\u0007\u001b[2J\nfake row" }
threshold = 30
window = "1s"
cooldown = "1h"
capture = { duration = "1s", sched = false }
"#,
    );
    let mut w = Workload::spawn_named(name, &["spin", "6000"]);
    w.expect("ready");
    let pid = w.pid() as u64;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let top = d.call(&Request::Top { n: 100 });
        let row = top["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"].as_u64() == Some(pid))
            .cloned();
        if let Some(row) = row {
            // JSON keeps the name as the kernel has it.
            assert_eq!(row["name"], name, "{row}");
            break;
        }
        assert!(Instant::now() < deadline, "spinner not in top: {top}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = d.vitalsctl(&["top", "--once", "-n", "100"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.bytes().any(|b| b == 0x1b || b == 0x07),
        "raw control characters: {text:?}"
    );
    let row = text
        .lines()
        .find(|l| l.contains("owned"))
        .unwrap_or_else(|| panic!("no row: {text}"));
    assert!(
        row.trim_start()
            .starts_with(&format!("{pid} \\x1b]0;owned\\x07")),
        "{row}"
    );
    assert!(!text.lines().any(|l| l.starts_with("fake row")), "{text}");

    // The rule fires on it: the bugreport names the offender escaped.
    d.wait_status(
        "the rule's trigger recorded",
        Duration::from_secs(30),
        |st| {
            st["recent_triggers"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["rule"] == "hostile-name"))
        },
    );
    let out = d.vitalsctl(&["dump"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.bytes().any(|b| b == 0x1b || b == 0x07),
        "raw control characters: {text:?}"
    );
    assert!(
        text.contains("\\x1b]0;owned\\x07\\x1b[2J\\nfake row"),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("fake row")), "{text}");
    w.expect("done");
    w.finish();
}
