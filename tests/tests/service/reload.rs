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
