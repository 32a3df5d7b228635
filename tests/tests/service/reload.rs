//! Configuration: SIGHUP reloads that must keep the running config when
//! the new one is bad, and `--check-config` naming the bad keys.

use super::*;

#[test]
fn sighup_with_a_bad_config_keeps_the_running_one() {
    let d = Daemon::start("[budget]\ncaptures_per_hour = 3\n");
    let before = d.call(&Request::Config {})["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(before.contains("captures_per_hour = 3"));

    std::fs::write(
        d.config_path(),
        "[budget]\ncaptures_per_hour = \"many\"\nbogus_key = 1\n",
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    let st = d.wait_status("the reload error", Duration::from_secs(10), |st| {
        !st["last_reload_error"].is_null()
    });
    assert!(
        st["last_reload_error"]
            .as_str()
            .unwrap()
            .contains("vitalsd.toml"),
        "{st}"
    );
    assert_eq!(
        d.call(&Request::Config {})["toml"].as_str().unwrap(),
        before,
        "old config kept"
    );
    assert!(
        d.call(&Request::Status {})["samples"].as_u64().unwrap() > 0,
        "still sampling"
    );

    std::fs::write(
        d.config_path(),
        config(d.dir.path(), "[budget]\ncaptures_per_hour = 7\n"),
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    d.wait_status("the good reload", Duration::from_secs(10), |st| {
        st["last_reload_error"].is_null()
    });
    assert!(d.call(&Request::Config {})["toml"]
        .as_str()
        .unwrap()
        .contains("captures_per_hour = 7"));
}

/// `Duration::from_secs_f64` panics on 1e20 s; a reload with such a value
/// must be an error in status, not a dead main thread.
#[test]
fn sighup_with_a_1e20s_duration_keeps_the_running_config() {
    let d = Daemon::start("[budget]\ncaptures_per_hour = 3\n");
    let before = d.call(&Request::Config {})["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::write(
        d.config_path(),
        config(
            d.dir.path(),
            "[[rule]]\nname = \"x\"\nmetric = { kind = \"loadavg_per_cpu\" }\nthreshold = 1\nwindow = \"1s\"\ncooldown = \"1e20s\"\n",
        ),
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    let st = d.wait_status("the reload error", Duration::from_secs(10), |st| {
        !st["last_reload_error"].is_null()
    });
    let err = st["last_reload_error"].as_str().unwrap();
    assert!(err.contains("cooldown") && err.contains("1e20s"), "{st}");
    assert_eq!(
        d.call(&Request::Config {})["toml"].as_str().unwrap(),
        before,
        "old config kept"
    );
    let samples = d.call(&Request::Status {})["samples"].as_u64().unwrap();
    d.wait_status("sampling to go on", Duration::from_secs(10), |st| {
        st["samples"].as_u64().unwrap() > samples
    });
}

#[test]
fn check_config_names_bad_keys() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, "[store]\nquota = 5\n").unwrap();
    let out = Command::new(vitalsd_bin())
        .args(["check-config", "--config"])
        .arg(&p)
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("quota"));
    std::fs::write(&p, "[store]\nquota_bytes = 10485760\n").unwrap();
    let out = Command::new(vitalsd_bin())
        .args(["check-config", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("quota_bytes = 10485760"));
}

/// The running config before a bad reload, and a check that it is still
/// the one in force after it: same rendering, still sampling.
fn assert_reload_refused(d: &Daemon, before: &str, wanted: &[&str]) -> String {
    d.signal(libc::SIGHUP);
    let st = d.wait_status("the reload error", Duration::from_secs(10), |st| {
        !st["last_reload_error"].is_null()
    });
    let err = st["last_reload_error"].as_str().unwrap().to_owned();
    for w in wanted {
        assert!(err.contains(w), "{w:?} not in {err:?}");
    }
    assert_eq!(
        d.call(&Request::Config {})["toml"].as_str().unwrap(),
        before,
        "old config kept"
    );
    let samples = st["samples"].as_u64().unwrap();
    d.wait_status("sampling to go on", Duration::from_secs(10), |st| {
        st["samples"].as_u64().unwrap() > samples
    });
    err
}

/// An empty file at SIGHUP is an error, not every default (which would
/// widen allowed_uids to [0, 1000] and raise the quota).
#[test]
fn sighup_with_an_empty_config_file_keeps_the_running_one() {
    let d = Daemon::start("allowed_uids = [0]\n");
    let before = d.call(&Request::Config {})["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(before.contains("allowed_uids = [0]"), "{before}");
    std::fs::write(d.config_path(), "").unwrap();
    assert_reload_refused(&d, &before, &["vitalsd.toml", "empty"]);
}

/// A FIFO at the config path: open(2) would block the main loop until a
/// writer came (samples frozen, SIGTERM ignored). It is refused at once,
/// and the daemon still stops on SIGTERM.
#[test]
fn sighup_with_a_fifo_at_the_config_path_neither_blocks_nor_applies() {
    let mut d = Daemon::start("");
    let before = d.call(&Request::Config {})["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::remove_file(d.config_path()).unwrap();
    nix::unistd::mkfifo(
        &d.config_path(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    assert_reload_refused(&d, &before, &["vitalsd.toml", "not a regular file"]);
    d.stop();
}

/// A reload error quoting a 200 KiB line is stored and shown cut, with a
/// marker: status and dump stay small.
#[test]
fn a_reload_error_quoting_a_huge_line_is_bounded() {
    let d = Daemon::start("");
    let before = d.call(&Request::Config {})["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let long = "x".repeat(200 << 10);
    std::fs::write(
        d.config_path(),
        format!("[sampling]\ninterval = \"{long}\"\n"),
    )
    .unwrap();
    let err = assert_reload_refused(&d, &before, &["vitalsd.toml", "[truncated: "]);
    assert!(err.len() <= 4096, "{} bytes", err.len());
    let out = d.vitalsctl(&["dump"]);
    assert!(out.status.success());
    let dump = String::from_utf8_lossy(&out.stdout);
    let line = dump
        .lines()
        .find(|l| l.contains("last config reload failed"))
        .unwrap_or_else(|| panic!("no reload error in the dump:\n{dump}"));
    assert!(line.len() <= 4096 + 64, "{} bytes", line.len());
}

/// `--config <(…)`: a pipe is refused with the reason, at start as at a
/// reload (it could not be read again at SIGHUP).
#[test]
fn a_config_on_a_pipe_is_refused_with_the_reason() {
    let mut child = Command::new(vitalsd_bin())
        .args(["check-config", "--config", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A valid config: only the pipe is wrong. Dropped: the writer closes.
    // (The refusal may come first: EPIPE then is no failure.)
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(b"[budget]\ncaptures_per_hour = 3\n");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted a pipe: {err}");
    assert!(
        err.contains("/dev/stdin") && err.contains("not a regular file"),
        "{err}"
    );
}

/// A reload naming another store and socket: they take effect at the next
/// start, so `config` keeps showing the ones in use, while what a reload
/// does change (the budget) is applied.
#[test]
fn config_after_a_reload_shows_the_store_and_socket_in_use() {
    let d = Daemon::start("");
    let other = tempfile::tempdir().unwrap();
    std::fs::write(
        d.config_path(),
        config(other.path(), "[budget]\ncaptures_per_hour = 7\n"),
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    let toml = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let toml = d.call(&Request::Config {})["toml"]
                .as_str()
                .unwrap()
                .to_owned();
            if toml.contains("captures_per_hour = 7") {
                break toml;
            }
            assert!(Instant::now() < deadline, "not reloaded:\n{}", d.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert!(
        toml.contains(&d.store().display().to_string())
            && toml.contains(&d.socket().display().to_string()),
        "{toml}"
    );
    assert!(
        !toml.contains(&other.path().display().to_string()),
        "{toml}"
    );
}
