//! What a hostile or careless peer of the control socket cannot take from
//! the daemon: its descriptors (stalled requests, connect storms), its
//! sampling, its log, a uid's slots (readers that never read), the socket
//! itself (a second daemon), the allowlist after a reload, files outside
//! the store; and who reaches the socket on a Linux host (`control.group`).

use vitalsd::control::slots::{ADMISSION, TOTAL};

use super::*;

/// Samples lost to read errors, over all sources.
fn samples_lost(st: &Value) -> u64 {
    st["sample_errors"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
}

/// A few samples in: the daemon's steady state, before a test's peers.
fn settled(d: &Daemon) -> Value {
    d.wait_status("a few samples", Duration::from_secs(20), |st| {
        st["samples"].as_u64().unwrap_or(0) >= 4
    })
}

/// Waits until `n` more samples than `before` were taken.
fn more_samples(d: &Daemon, before: &Value, n: u64) -> Value {
    let from = before["samples"].as_u64().unwrap();
    d.wait_status("sampling to go on", Duration::from_secs(60), |st| {
        st["samples"].as_u64().unwrap_or(0) >= from + n
    })
}

/// A stored manual capture's id.
fn stored_capture(d: &Daemon, duration_s: f64, sched: bool) -> String {
    let v = d.call(&Request::Capture {
        duration_s,
        sched,
        faults: false,
        offcpu: None,
    });
    let id = v["id"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned();
    d.wait_status("the capture to be stored", Duration::from_secs(60), |st| {
        st["capture"].is_null() && d.list().iter().any(|m| m["id"] == id.as_str())
    });
    id
}

/// This test process may open `n` descriptors (it plays many peers).
fn allow_open_files(n: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < n {
        assert!(hard >= n, "RLIMIT_NOFILE hard limit {hard} < {n}");
        setrlimit(Resource::RLIMIT_NOFILE, n, hard).unwrap();
    }
}

/// The review's case: 1100 connections of an allowlisted uid, each
/// sending a request length and nothing more, under RLIMIT_NOFILE 1024.
/// Evicted ones kept their socket for the 10 s body timeout, accept hit
/// EMFILE and procfs scans failed ("Too many open files").
#[test]
fn stalled_request_bodies_cost_neither_descriptors_nor_samples() {
    allow_open_files(4096);
    let d = Daemon::start_with_nofile("", 1024);
    let st0 = settled(&d);
    let fds_before = d.fd_targets().len();
    let most_fds = FdWatch::start(d.pid());
    let mut stalled = Vec::new();
    for _ in 0..1100 {
        let mut s = UnixStream::connect(d.socket()).unwrap();
        s.write_all(&100u32.to_be_bytes()).unwrap();
        stalled.push(s);
    }
    let st = more_samples(&d, &st0, 8);
    let most_fds = most_fds.stop();
    eprintln!("daemon descriptors: {fds_before} before the peers, at most {most_fds} during");
    drop(stalled);
    assert_eq!(samples_lost(&st), samples_lost(&st0), "{st}\n{}", d.log());
    assert_eq!(st["control"]["accept_errors"], 0, "{st}");
    // Peers hold at most the socket's budget; +8 for the daemon's own
    // passing descriptors (a procfs scan holds a directory and a file) and
    // our status calls.
    let budget = TOTAL + ADMISSION;
    assert!(
        most_fds <= fds_before + budget + 8,
        "the daemon held {most_fds} descriptors ({fds_before} before the peers, budget {budget})"
    );
    assert!(!d.log().contains("Too many open files"), "{}", d.log());
}

/// The most descriptors a process held while watched, from /proc/<pid>/fd.
struct FdWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl FdWatch {
    fn start(pid: i32) -> Self {
        use std::sync::{atomic::AtomicBool, Arc};
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut most = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let n = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
                most = most.max(n);
            }
            most
        });
        Self { stop, thread }
    }

    /// Stops watching; the most descriptors seen.
    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// A connect/close storm from a refused uid and from an allowlisted one:
/// one log line per refused uid, not one per connection (the review saw
/// 82,600), every refusal counted, no accept error, no sample lost.
#[test]
fn a_connect_storm_is_logged_once_counted_and_costs_no_samples() {
    allow_open_files(4096);
    let d = Daemon::start_with_nofile("", 1024);
    d.open_socket_to_all();
    let st0 = settled(&d);
    let fds_before = d.fd_targets().len();
    let most_fds = FdWatch::start(d.pid());
    let refused: Vec<std::thread::JoinHandle<u64>> = (0..4)
        .map(|_| {
            let sock = d.socket();
            std::thread::spawn(move || {
                as_uid(65534, 65534, move || {
                    let mut n = 0;
                    for _ in 0..1000 {
                        let mut s = UnixStream::connect(&sock).unwrap();
                        let resp: Value =
                            serde_json::from_slice(&read_frame(&mut s, 1 << 20).unwrap()).unwrap();
                        assert!(resp["error"].as_str().unwrap().contains("not allowed"));
                        n += 1;
                    }
                    n
                })
            })
        })
        .collect();
    // Meanwhile root connects and hangs up, 4 x 2000 times over.
    let hang_ups: Vec<std::thread::JoinHandle<()>> = (0..4)
        .map(|_| {
            let sock = d.socket();
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    drop(UnixStream::connect(&sock).unwrap());
                }
            })
        })
        .collect();
    let refusals: u64 = refused.into_iter().map(|t| t.join().unwrap()).sum();
    hang_ups.into_iter().for_each(|t| t.join().unwrap());
    let st = more_samples(&d, &st0, 4);
    let most_fds = most_fds.stop();
    eprintln!("daemon descriptors: {fds_before} before the peers, at most {most_fds} during");
    // As above: the budget, and the daemon's own passing descriptors.
    let budget = TOTAL + ADMISSION;
    assert!(
        most_fds <= fds_before + budget + 8,
        "the daemon held {most_fds} descriptors ({fds_before} before the storm, budget {budget})"
    );
    assert_eq!(refusals, 4000);
    assert!(
        st["control"]["refused_uid"].as_u64().unwrap() >= refusals,
        "{st}"
    );
    let log = d.log();
    let lines = log.matches("refused uid 65534").count();
    // One a minute: this test runs for well under that, allow a slow day.
    assert!((1..=3).contains(&lines), "{lines} refusal lines:\n{log}");
    assert!(
        st["control"]["log_lines_suppressed"].as_u64().unwrap() >= refusals - 3,
        "{st}"
    );
    assert_eq!(st["control"]["accept_errors"], 0, "{st}");
    assert_eq!(samples_lost(&st), samples_lost(&st0), "{st}\n{log}");
}

/// Descriptors of the daemon open on `path`, deleted or not.
fn open_on(d: &Daemon, path: &std::path::Path) -> usize {
    let p = path.display().to_string();
    d.fd_targets().iter().filter(|t| t.starts_with(&p)).count()
}

/// Sixteen exports whose reader never reads held all of their uid's slots
/// (and the deleted capture's space) for as long as they stalled: the
/// send timeout drops them, frees the slots and closes the trace.
#[test]
fn exports_whose_reader_stalls_are_dropped_and_free_the_trace() {
    let d = Daemon::start("allowed_uids = [0, 65534]\n");
    d.open_socket_to_all();
    // Larger than a socket's send buffer (net.core.wmem_default, 208 KiB),
    // so the daemon's writes block on a reader that does not read.
    let storm = SwitchStorm::start();
    let id = stored_capture(&d, 2.0, true);
    drop(storm);
    let trace = d.store().join(format!("{id}.pftrace"));
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(
        size > 1 << 20,
        "capture of {size} bytes is too small to stall"
    );
    let stalled: Vec<UnixStream> = (0..16)
        .map(|_| {
            let (sock, id) = (d.socket(), id.clone());
            as_uid(65534, 65534, move || {
                let mut s = UnixStream::connect(&sock).unwrap();
                write_frame(
                    &mut s,
                    &serde_json::to_vec(&Request::Export { id }).unwrap(),
                )
                .unwrap();
                s
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while open_on(&d, &trace) < 16 {
        assert!(Instant::now() < deadline, "exports never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    d.call(&Request::Delete { id: id.clone() });
    // Dropped by the send timeout: the deleted trace is closed at last.
    let st = d.wait_status(
        "the stalled exports dropped",
        Duration::from_secs(60),
        |st| st["control"]["write_timeouts"].as_u64().unwrap_or(0) >= 16,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_on(&d, &trace) > 0 {
        assert!(
            Instant::now() < deadline,
            "the deleted trace is still open: {:?}\n{st}",
            d.fd_targets()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The uid is served again.
    let sock = d.socket();
    let v = as_uid(65534, 65534, move || {
        Client::connect(&sock)
            .unwrap()
            .call::<Value>(&Request::List {})
            .map_err(|e| e.to_string())
    });
    assert!(v.is_ok(), "{v:?}");
    drop(stalled);
}

/// A second daemon with its own store but the same socket path removed
/// the live daemon's socket as "stale" and left it unreachable. It must
/// refuse to start instead, and the first one keep serving.
#[test]
fn a_second_daemon_on_the_same_socket_refuses_to_start() {
    let d = Daemon::start("");
    let other = tempfile::tempdir().unwrap();
    let cfg = config(other.path(), "").replace(
        &other.path().join("vitalsd.sock").display().to_string(),
        &d.socket().display().to_string(),
    );
    std::fs::write(other.path().join("vitalsd.toml"), cfg).unwrap();
    let child = Command::new(vitalsd_bin())
        .process_group(0)
        .args(["run", "--config"])
        .arg(other.path().join("vitalsd.toml"))
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(other.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    // Killed with its group on drop if it does not exit by itself.
    let mut second = Daemon {
        child: Some(child),
        dir: other,
        envs: Vec::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = second.child.as_mut().unwrap().try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the second daemon is running: {}",
            second.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    second.child = None;
    assert!(!status.success(), "{status}");
    assert!(
        second.log().contains("another process is serving"),
        "{}",
        second.log()
    );
    assert!(d.call(&Request::Status {})["samples"].as_u64().is_some());
}

/// A uid that a reload removes from `allowed_uids` kept its open
/// connection and went on running `config` and `delete`.
#[test]
fn a_uid_removed_by_a_reload_loses_its_open_connection() {
    let d = Daemon::start("allowed_uids = [0, 65534]\n");
    d.open_socket_to_all();
    let sock = d.socket();
    let mut c = as_uid(65534, 65534, move || Client::connect(&sock).unwrap());
    assert!(c.call::<Value>(&Request::Config {}).is_ok());
    std::fs::write(
        d.config_path(),
        config(d.dir.path(), "allowed_uids = [0]\n"),
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.call(&Request::Config {})["toml"]
        .as_str()
        .unwrap()
        .contains("allowed_uids = [0]\n")
    {
        assert!(Instant::now() < deadline, "no reload: {}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let e = c
        .call::<Value>(&Request::Config {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("uid 65534 is not allowed"), "{e}");
    // And the connection is closed: nothing more is served on it.
    assert!(c
        .call::<Value>(&Request::Delete {
            id: "whatever".into()
        })
        .is_err());
    let st = d.call(&Request::Status {});
    assert_eq!(st["control"]["refused_uid_revoked"], 1, "{st}");
}

/// Export opened `<id>.pftrace` following symlinks: one planted there
/// served a file from outside the store.
#[test]
fn export_does_not_follow_a_symlink_out_of_the_store() {
    let d = Daemon::start("");
    let id = stored_capture(&d, 0.3, false);
    let secret = d.dir.path().join("secret");
    std::fs::write(&secret, b"outside the store").unwrap();
    let trace = d.store().join(format!("{id}.pftrace"));
    std::fs::remove_file(&trace).unwrap();
    std::os::unix::fs::symlink(&secret, &trace).unwrap();
    let mut out = Vec::new();
    let r = Client::connect(&d.socket()).unwrap().export(&id, &mut out);
    assert!(
        out.is_empty(),
        "served through the symlink: {:?}",
        String::from_utf8_lossy(&out)
    );
    let e = r.unwrap_err().to_string();
    assert!(e.contains("symbolic links"), "{e}");
}

/// On a Linux host the socket was root:root 0660, so an allowlisted
/// non-root uid got EACCES before its uid was ever checked. With
/// `control.group`, a member of that group reaches the socket and the
/// allowlist decides: a throwaway uid and gid (in no group file, not
/// root, not in group root) is served; other uids are refused.
#[test]
fn control_group_lets_an_allowlisted_non_root_uid_in_and_no_other() {
    let (uid, gid) = (4242, 4242);
    let d = Daemon::start(&format!("allowed_uids = [0, {uid}]\ngroup = \"{gid}\"\n"));
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(d.socket()).unwrap();
    assert_eq!((md.mode() & 0o777, md.gid()), (0o660, gid));
    // std's Command drops supplementary groups when it changes uid.
    let vitalsctl_as = |uid: u32, gid: u32| {
        Command::new(vitalsd_bin().with_file_name("vitalsctl"))
            .arg("--socket")
            .arg(d.socket())
            .arg("status")
            .uid(uid)
            .gid(gid)
            .output()
            .unwrap()
    };
    let ok = vitalsctl_as(uid, gid);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("samples every"));
    // Outside the group: the socket's mode refuses it.
    let out = vitalsctl_as(4243, 4243);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Permission denied"), "{err}");
    // In the group but not allowlisted: the daemon refuses it.
    let out = vitalsctl_as(4244, gid);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("uid 4244 is not allowed"), "{err}");
}
