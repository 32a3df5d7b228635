//! The init side: `init/vitalsd.rc` (capabilities, service options, data
//! directories), the systemd unit, the control socket init creates, and the
//! example Android config.

use std::{
    collections::{BTreeSet, HashSet},
    path::Path,
};

use super::{read, repo};
use crate::android::ANDROID_PATHS;

// ---------------------------------------------------------------- init .rc

/// The lines of one `service <name>` block of an init .rc file.
fn rc_service_block<'a>(rc: &'a str, name: &str) -> Vec<&'a str> {
    let mut lines = rc.lines();
    let header = format!("service {name} ");
    lines
        .by_ref()
        .find(|l| l.starts_with(&header))
        .unwrap_or_else(|| panic!("no `service {name}` in the .rc"));
    lines
        .take_while(|l| l.starts_with(char::is_whitespace) || l.is_empty())
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

fn rc_option<'a>(block: &[&'a str], option: &str) -> Vec<&'a str> {
    block
        .iter()
        .filter_map(|l| l.strip_prefix(option).filter(|r| r.starts_with(' ')))
        .flat_map(str::split_whitespace)
        .collect()
}

/// "CAP_BPF" -> "BPF", init's spelling.
fn daemon_caps_init_names() -> BTreeSet<String> {
    crate::service::DAEMON_CAPS
        .iter()
        .map(|c| c.to_string().trim_start_matches("CAP_").to_owned())
        .collect()
}

/// On Android vitalsd holds no capability: it attaches from bpfloader's
/// pins, which needs none where SELinux gates bpf(2) and perf_event_open
/// (tests/tests/pins.rs attaches with none), and AOSP's policy grants
/// neither capability2 bpf nor perfmon, so any the .rc granted would only
/// be AVC denials. (The systemd unit, for Linux hosts that load their own
/// programs, grants DAEMON_CAPS: below.)
#[test]
fn rc_grants_no_capability() {
    let rc = read("init/vitalsd.rc");
    let block = rc_service_block(&rc, "vitalsd");
    let granted = rc_option(&block, "capabilities");
    assert!(
        granted.is_empty(),
        "init/vitalsd.rc grants {granted:?}: on Android vitalsd needs none and the policy \
         allows none"
    );
    assert!(
        block.iter().any(|l| l.starts_with("user system")),
        "vitalsd runs as uid system (traced's trusted consumer), which starts with no capability"
    );
}

#[test]
fn systemd_unit_grants_the_same_capabilities() {
    let unit = read("init/vitalsd.service");
    let want: BTreeSet<String> = daemon_caps_init_names()
        .into_iter()
        .map(|c| format!("CAP_{c}"))
        .collect();
    for key in ["CapabilityBoundingSet=", "AmbientCapabilities="] {
        let line = unit
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("vitalsd.service has no {key}"));
        let got: BTreeSet<String> = line.split_whitespace().map(str::to_owned).collect();
        assert_eq!(got, want, "{key}");
    }
    assert!(unit.contains("ExecStart=/usr/local/bin/vitalsd run"));
    assert!(unit.contains("RuntimeDirectory=vitalsd"));
    assert!(unit.contains("StateDirectory=vitalsd"));
}

#[test]
fn rc_service_shape() {
    let rc = read("init/vitalsd.rc");
    let block = rc_service_block(&rc, "vitalsd");
    assert!(rc.contains("service vitalsd /system/bin/vitalsd run\n"));
    assert_eq!(rc_option(&block, "user"), ["system"]);
    let groups: HashSet<&str> = rc_option(&block, "group").into_iter().collect();
    for g in ["system", "readproc", "readtracefs"] {
        assert!(groups.contains(g), "group {g}");
    }
    assert_eq!(rc_option(&block, "class"), ["late_start"]);
    assert!(block.contains(&"disabled"), "started by the property only");
    // The socket the daemon inherits (control::server::bind_or_inherit).
    let socket = rc_option(&block, "socket");
    // Group shell: dumpstate connects as uid/gid 2000 (tests/tests/bugreport_uid.rs).
    assert_eq!(socket, ["vitalsd", "stream", "0660", "system", "shell"]);
    let default_socket = crate::config::Control::default_for(true).socket;
    assert_eq!(
        default_socket.file_name().unwrap(),
        socket[0],
        "ANDROID_SOCKET_<name> is derived from the configured socket's file name"
    );
    assert!(block
        .iter()
        .any(|l| l.starts_with("onrestart ")
            && l.contains("/system/bin/vitalsd cleanup-after-crash")));
    for (value, action) in [("1", "start"), ("0", "stop")] {
        let trigger = format!("on property:persist.vitals.enable={value}\n    {action} vitalsd\n");
        assert!(rc.contains(&trigger), "missing:\n{trigger}");
    }
    // The property is labelled.
    assert!(read("sepolicy/property_contexts").contains("persist.vitals.enable "));
}

#[test]
fn rc_creates_every_data_directory_with_owner_and_mode() {
    let rc = read("init/vitalsd.rc");
    let post_fs_data: Vec<&str> = rc
        .split("\non ")
        .find(|b| b.starts_with("post-fs-data"))
        .expect("an `on post-fs-data` block")
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("mkdir "))
        .collect();
    let data_dirs = ANDROID_PATHS
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| p.starts_with("/data/") && p.ends_with('/'))
        .map(|p| p.trim_end_matches('/').to_owned())
        .chain(
            // heapprofd's rate-limit state directory.
            crate::heapprofd::default_state_file_for(true)
                .parent()
                .map(|p| p.display().to_string()),
        );
    for dir in data_dirs {
        let line = post_fs_data
            .iter()
            .find(|l| l.split_whitespace().nth(1) == Some(dir.as_str()))
            .unwrap_or_else(|| panic!("no `mkdir {dir}` in on post-fs-data"));
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            f.get(2..5),
            Some(&["0770", "system", "system"][..]),
            "{line}"
        );
    }
}

// ------------------------------------------------------- init's socket

#[test]
fn inherits_the_socket_init_created() {
    use std::os::fd::{AsRawFd, IntoRawFd};
    let dir = tempfile::tempdir().unwrap();
    // init binds /dev/socket/<name> and exports ANDROID_SOCKET_<name>.
    let name = format!("vitalsd_test_{}", std::process::id());
    let init_path = dir.path().join(&name);
    let fd = std::os::unix::net::UnixListener::bind(&init_path)
        .unwrap()
        .into_raw_fd();
    // SAFETY: the test owns the environment variable it sets (unique name).
    unsafe {
        std::env::set_var(
            crate::control::server::android_socket_env(&name),
            fd.to_string(),
        )
    };
    // The configured path's directory does not matter: the name picks the socket.
    let configured = dir.path().join("elsewhere").join(&name);
    let l = crate::control::server::bind_or_inherit(&configured, None).unwrap();
    assert_eq!(l.as_raw_fd(), fd);
    assert!(!configured.exists(), "must not bind a second socket");
    let _client = std::os::unix::net::UnixStream::connect(&init_path).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match l.accept() {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "no connection");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    }
    let flags = nix::fcntl::fcntl(&l, nix::fcntl::FcntlArg::F_GETFD).unwrap();
    assert_ne!(
        flags & libc::FD_CLOEXEC,
        0,
        "the heapprofd client must not inherit it"
    );

    // A variable naming something that is not a socket is an error, not a bind.
    let file = std::fs::File::create(dir.path().join("plain")).unwrap();
    let bad = format!("vitalsd_bad_{}", std::process::id());
    // SAFETY: as above.
    unsafe {
        std::env::set_var(
            crate::control::server::android_socket_env(&bad),
            file.as_raw_fd().to_string(),
        )
    };
    assert!(crate::control::server::bind_or_inherit(&dir.path().join(&bad), None).is_err());
}

#[test]
fn example_android_config_is_the_android_defaults() {
    let path = repo().join("init/vitalsd.toml");
    let cfg = crate::config::Config::load(&path).unwrap();
    assert_eq!(cfg.store.dir, Path::new("/data/misc/vitalsd"));
    assert_eq!(cfg.control, crate::config::Control::default_for(true));
    let default = crate::config::Config::default();
    assert_eq!(cfg.rules, default.rules);
    assert_eq!(cfg.budget, default.budget);
    assert_eq!(cfg.sampling.interval, default.sampling.interval);
}
