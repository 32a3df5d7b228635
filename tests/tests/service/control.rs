//! The control socket: who may ask (peer credentials, the allowlist, the
//! manual budget), and what bad or idle clients cannot do to the others.

use super::*;

#[test]
fn a_uid_not_allowed_is_refused() {
    let d = Daemon::start("");
    // Let anyone reach the socket so the daemon's own check is what refuses.
    std::fs::set_permissions(d.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = Command::new(vitalsd_bin().with_file_name("vitalsctl"))
        .args(["--socket"])
        .arg(d.socket())
        .arg("status")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uid 65534 is not allowed"), "{err}");
    let st = d.call(&Request::Status {});
    assert_eq!(st["control"]["refused_uid"], 1, "{st}");
}

#[test]
fn garbage_and_oversized_requests_get_errors_while_others_are_served() {
    let d = Daemon::start("");
    let mut good = Client::connect(&d.socket()).unwrap();
    assert!(good.call::<Value>(&Request::Status {}).is_ok());

    // Random bytes inside a valid frame: an error, and the connection lives.
    let mut bad = UnixStream::connect(d.socket()).unwrap();
    let mut seed = 0x9e3779b97f4a7c15u64;
    let junk: Vec<u8> = (0..512)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    write_frame(&mut bad, &junk).unwrap();
    let resp: Value = serde_json::from_slice(&read_frame(&mut bad, 1 << 20).unwrap()).unwrap();
    assert_eq!(resp["ok"], false);
    assert!(
        resp["error"].as_str().unwrap().contains("malformed"),
        "{resp}"
    );
    write_frame(&mut bad, br#"{"cmd":"reboot"}"#).unwrap();
    let resp: Value = serde_json::from_slice(&read_frame(&mut bad, 1 << 20).unwrap()).unwrap();
    assert_eq!(resp["ok"], false);
    write_frame(&mut bad, br#"{"cmd":"list"}"#).unwrap();
    let resp: Value = serde_json::from_slice(&read_frame(&mut bad, 1 << 20).unwrap()).unwrap();
    assert_eq!(resp["ok"], true, "the same connection still works");

    // An oversized frame: refused, connection closed.
    let mut big = UnixStream::connect(d.socket()).unwrap();
    big.write_all(&(100u32 << 20).to_be_bytes()).unwrap();
    let resp: Value = serde_json::from_slice(&read_frame(&mut big, 1 << 20).unwrap()).unwrap();
    assert!(
        resp["error"]
            .as_str()
            .unwrap()
            .contains("exceeds the limit"),
        "{resp}"
    );
    let mut rest = Vec::new();
    assert_eq!(
        big.read_to_end(&mut rest).unwrap_or(0),
        0,
        "connection closed"
    );

    // Raw random bytes with no framing at all, then a client that stalls.
    let mut raw = UnixStream::connect(d.socket()).unwrap();
    raw.write_all(&junk).unwrap();
    let _stalled = {
        let mut s = UnixStream::connect(d.socket()).unwrap();
        s.write_all(&10u32.to_be_bytes()).unwrap();
        s
    };

    // The well-behaved client is served throughout.
    let st: Value = good.call(&Request::Status {}).unwrap();
    assert!(st["control"]["bad_requests"].as_u64().unwrap() >= 2, "{st}");
    assert!(
        st["control"]["oversized_requests"].as_u64().unwrap() >= 1,
        "{st}"
    );
    assert!(good.call::<Value>(&Request::Top { n: 5 }).is_ok());
}

/// Manual requests follow the rules' policy: heap profiles only of
/// allowlisted processes, captures within their own budget and the device
/// conditions; each refusal says why and is counted in status.
#[test]
fn manual_requests_obey_the_allowlist_the_manual_budget_and_the_conditions() {
    let thermal = tempfile::tempdir().unwrap();
    let zone = thermal.path().join("thermal_zone0");
    std::fs::create_dir_all(&zone).unwrap();
    std::fs::write(zone.join("temp"), "30000\n").unwrap();
    let d = Daemon::start(&format!(
        "{}[budget]\nmanual_captures_per_hour = 1\n[conditions]\nmax_thermal_millicelsius = 45000\nthermal_root = \"{}\"\n",
        heap_config(""),
        thermal.path().display()
    ));
    let out = d.vitalsctl(&["heap", "--name", "not-listed", "--duration", "300ms"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not on the allowlist"), "{err}");

    let capture = || {
        Client::connect(&d.socket())
            .unwrap()
            .call(&Request::Capture {
                duration_s: 1.0,
                sched: false,
                faults: false,
                offcpu: None,
            })
            .map_err(|e| e.to_string())
    };
    // Too hot: refused, whoever asks.
    std::fs::write(zone.join("temp"), "60000\n").unwrap();
    let e = capture().unwrap_err();
    assert!(e.contains("thermal"), "{e}");
    std::fs::write(zone.join("temp"), "30000\n").unwrap();
    let v: Value = capture().unwrap();
    let id = v["id"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned();
    d.wait_status("the capture to end", Duration::from_secs(30), |st| {
        st["capture"].is_null() && d.list().iter().any(|m| m["id"] == id.as_str())
    });
    // The manual budget (1 an hour) is spent.
    let e = capture().unwrap_err();
    assert!(e.contains("budget_per_hour"), "{e}");
    let st = d.wait_status("the refusals counted", Duration::from_secs(10), |st| {
        !st["manual_refused"]["budget_per_hour"].is_null()
    });
    assert_eq!(st["manual_refused"]["thermal"], 1, "{st}");
    assert_eq!(st["manual_refused"]["budget_per_hour"], 1, "{st}");
}

/// 64 idle connections from an allowlisted uid neither block accept nor
/// starve the next request: idle ones are evicted to make room, counted.
#[test]
fn idle_connections_cannot_starve_the_control_socket() {
    let d = Daemon::start("");
    let idle: Vec<UnixStream> = (0..64)
        .map(|_| UnixStream::connect(d.socket()).unwrap())
        .collect();
    // The old server took a slot per connection before reading a byte and
    // never timed the header out: with 32 slots held, this never answered.
    let mut s = UnixStream::connect(d.socket()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write_frame(&mut s, br#"{"cmd":"status"}"#).unwrap();
    let v: Value = serde_json::from_slice(&read_frame(&mut s, 1 << 24).unwrap()).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    // Every idle connection past the uid's 16 slots was closed to make room.
    d.wait_status(
        "the idle connections evicted",
        Duration::from_secs(10),
        |st| st["control"]["idle_closed"].as_u64().unwrap() >= 64 + 1 - 16,
    );
    drop(idle);
}
