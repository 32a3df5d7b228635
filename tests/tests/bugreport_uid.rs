//! The bugreport route: dumpstate drops to uid 2000 (shell) with gid shell
//! and no group system (frameworks/native/cmds/dumpstate DropRootUser), then
//! runs `vitalsctl dump` and `vitalsctl export`. The control socket is the
//! one init creates from init/vitalsd.rc's `socket` line, so this test
//! creates it the same way (owner, group and mode read from the .rc), hands
//! it to `vitalsd run` through ANDROID_SOCKET_vitalsd, and connects as
//! uid 2000 without group 1000: it must be served exactly when 2000 is in
//! `control.allowed_uids`, and every other uid refused.

use std::{
    os::unix::{fs::PermissionsExt, io::AsRawFd, net::UnixListener, process::CommandExt},
    path::PathBuf,
    process::{Child, Command, Output},
    time::{Duration, Instant},
};

use serde_json::Value;
use vitals_tests::*;
use vitalsd::control::{Client, Request};

/// android_filesystem_config.h.
fn aid(name: &str) -> u32 {
    match name {
        "root" => 0,
        "system" => 1000,
        "shell" => 2000,
        other => panic!("no AID for {other} in this test"),
    }
}

/// (mode, uid, gid) of `socket vitalsd stream MODE USER GROUP` in the .rc.
fn rc_socket() -> (u32, u32, u32) {
    let rc = std::fs::read_to_string(workspace_root().join("init/vitalsd.rc")).unwrap();
    let line = rc
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("socket vitalsd "))
        .expect("init/vitalsd.rc has no `socket vitalsd` line");
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f[2], "stream", "{line}");
    (u32::from_str_radix(f[3], 8).unwrap(), aid(f[4]), aid(f[5]))
}

struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
}

impl Daemon {
    /// `vitalsd run` on a socket made as init makes it, with `allowed_uids`.
    fn start(allowed_uids: &[u32]) -> Self {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        // uid 2000 must be able to reach the socket's directory.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let sock = dir.path().join("vitalsd");
        let (mode, uid, gid) = rc_socket();
        // init (service_utils CreateSocket): bind, then chown and chmod;
        // the daemon gets the bound socket and listens itself.
        let listener = UnixListener::bind(&sock).unwrap();
        std::os::unix::fs::chown(&sock, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(mode)).unwrap();
        let fd = listener.as_raw_fd();
        // Inherited across exec, as init's socket is.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
        let uids: Vec<String> = allowed_uids.iter().map(u32::to_string).collect();
        let config = format!(
            "[sampling]\ninterval = \"250ms\"\nhistory = \"1m\"\n[store]\ndir = \"{}\"\n\
             [control]\nsocket = \"{}\"\nallowed_uids = [{}]\n",
            dir.path().join("store").display(),
            sock.display(),
            uids.join(", ")
        );
        std::fs::write(dir.path().join("vitalsd.toml"), config).unwrap();
        let child = Command::new(vitalsd_bin())
            .args(["run", "--config"])
            .arg(dir.path().join("vitalsd.toml"))
            .env("ANDROID_SOCKET_vitalsd", fd.to_string())
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .unwrap();
        drop(listener);
        let d = Self { child, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Client::connect(&d.socket())
            .and_then(|mut c| c.status())
            .is_err()
        {
            assert!(Instant::now() < deadline, "daemon not up: {}", d.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        // Still init's socket: the daemon did not bind one of its own
        // (that would be root's, and replace ours).
        let md = std::fs::metadata(d.socket()).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (md.mode() & 0o777, md.uid(), md.gid()),
            (mode, uid, gid),
            "the daemon replaced the socket init made: {}",
            d.log()
        );
        d
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("vitalsd")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn call(&self, req: &Request) -> Value {
        Client::connect(&self.socket())
            .unwrap()
            .call(req)
            .unwrap_or_else(|e| panic!("{req:?}: {e}\n{}", self.log()))
    }

    /// `vitalsctl ARGS` as `uid`:`gid` with no supplementary groups (std's
    /// Command clears them when it changes uid).
    fn vitalsctl_as(&self, uid: u32, gid: u32, args: &[&str]) -> Output {
        Command::new(vitalsd_bin().with_file_name("vitalsctl"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .uid(uid)
            .gid(gid)
            .output()
            .unwrap()
    }

    /// A stored capture to export.
    fn capture(&self) -> String {
        let v = self.call(&Request::Capture {
            duration_s: 0.5,
            sched: false,
            faults: false,
            offcpu: None,
        });
        let id = v["id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = self.call(&Request::Status {});
            if st["store"]["newest"] == id.as_str() {
                return id;
            }
            assert!(
                Instant::now() < deadline,
                "no capture: {st}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn refused(&self) -> u64 {
        self.call(&Request::Status {})["control"]["refused_uid"]
            .as_u64()
            .unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Refused, either by the socket's mode (connect: EACCES) or by the
/// daemon's SO_PEERCRED check.
fn assert_refused(o: &Output, uid: u32) {
    let t = text(o);
    assert!(!o.status.success(), "uid {uid} was served: {t}");
    assert!(
        t.contains(&format!("uid {uid} is not allowed")) || t.contains("ermission denied"),
        "uid {uid}: {t}"
    );
}

#[test]
fn the_socket_is_what_init_makes_from_the_rc() {
    let (mode, uid, gid) = rc_socket();
    // Not world-reachable; group shell lets dumpstate (gid 2000) connect.
    assert_eq!((mode, uid, gid), (0o660, 1000, 2000));
}

#[test]
fn dumpstate_uid_is_served_once_allowlisted() {
    let d = Daemon::start(&[0, 1000, 2000]);
    let id = d.capture();
    let dump = d.vitalsctl_as(2000, 2000, &["dump"]);
    assert!(dump.status.success(), "dump as 2000: {}", text(&dump));
    assert!(
        String::from_utf8_lossy(&dump.stdout).contains(&id),
        "the dump names the newest capture {id}: {}",
        text(&dump)
    );
    let export = d.vitalsctl_as(2000, 2000, &["export", &id, "-"]);
    assert!(export.status.success(), "export as 2000: {}", text(&export));
    let trace = d.dir.path().join("exported.pftrace");
    std::fs::write(&trace, &export.stdout).unwrap();
    assert_eq!(
        export.stdout,
        std::fs::read(d.dir.path().join("store").join(format!("{id}.pftrace"))).unwrap(),
        "export streams the stored trace byte for byte"
    );
    decode_trace(&trace);

    // Every other uid is refused: one in group shell (DAC lets it connect,
    // the allowlist refuses it), an app uid, nobody.
    let before = d.refused();
    assert_refused(&d.vitalsctl_as(2001, 2000, &["dump"]), 2001);
    assert_eq!(d.refused(), before + 1, "the daemon's check refused 2001");
    assert_refused(&d.vitalsctl_as(10057, 10057, &["dump"]), 10057);
    assert_refused(&d.vitalsctl_as(65534, 65534, &["status"]), 65534);
}

#[test]
fn dumpstate_uid_is_refused_unless_allowlisted() {
    let d = Daemon::start(&[0, 1000]);
    let before = d.refused();
    for args in [&["dump"][..], &["export", "x", "-"][..]] {
        let o = d.vitalsctl_as(2000, 2000, args);
        assert_refused(&o, 2000);
        assert!(
            text(&o).contains("uid 2000 is not allowed"),
            "the socket let 2000 in and the allowlist refused it: {}",
            text(&o)
        );
    }
    assert_eq!(d.refused(), before + 2);
    // The allowlisted uids still are served.
    let ok = d.vitalsctl_as(1000, 1000, &["dump"]);
    assert!(ok.status.success(), "{}", text(&ok));
}
