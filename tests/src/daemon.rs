//! `vitalsd run` as a test daemon: a config of its own in a temporary
//! directory (store, control socket, log), started and stopped by the
//! tests, with helpers to call its control socket and `vitalsctl`.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use serde_json::Value;
use vitalsd::control::{Client, Request};

use crate::{require_root, vitalsd_bin};

/// A `vitalsd run` with its own config, store and control socket in a
/// temporary directory, in its own process group; the group (the daemon
/// and any perfetto client it runs) is killed on drop.
pub struct Daemon {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    /// Extra environment, e.g. the sockets of a private traced.
    pub envs: Vec<(&'static str, PathBuf)>,
}

/// The test config: 250 ms sampling, store and socket under `dir`, then `extra`.
pub fn config(dir: &Path, extra: &str) -> String {
    config_with(dir, &Tables::default(), extra)
}

/// Keys for the tables the test config opens itself (TOML allows a table
/// once), e.g. `accounting = "proc"` in `sampling`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tables<'a> {
    pub sampling: &'a str,
    pub store: &'a str,
}

/// [`config`] with more keys in its own tables.
pub fn config_with(dir: &Path, tables: &Tables, extra: &str) -> String {
    format!(
        r#"
[sampling]
interval = "250ms"
history = "1m"
{sampling}
[store]
{store_keys}
dir = "{store}"
[control]
socket = "{sock}"
{extra}
"#,
        store = dir.join("store").display(),
        sock = dir.join("vitalsd.sock").display(),
        sampling = tables.sampling,
        store_keys = tables.store,
    )
}

impl Daemon {
    pub fn start(extra_config: &str) -> Self {
        Self::start_with_env(extra_config, Vec::new())
    }

    /// [`Daemon::start`] with extra environment for the daemon (and the
    /// clients it execs).
    pub fn start_with_env(extra_config: &str, envs: Vec<(&'static str, PathBuf)>) -> Self {
        Self::start_with(&Tables::default(), extra_config, envs)
    }

    /// [`Daemon::start_with_env`] with more keys in the config's own tables.
    pub fn start_with(
        tables: &Tables,
        extra_config: &str,
        envs: Vec<(&'static str, PathBuf)>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("vitalsd.toml"),
            config_with(dir.path(), tables, extra_config),
        )
        .unwrap();
        let mut d = Self {
            child: None,
            dir,
            envs,
        };
        d.spawn();
        d
    }

    /// A daemon whose RLIMIT_NOFILE (soft and hard) is `nofile`, as a
    /// service manager may set it (systemd's default soft limit is 1024).
    pub fn start_with_nofile(extra_config: &str, nofile: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("vitalsd.toml"),
            config(dir.path(), extra_config),
        )
        .unwrap();
        let mut d = Self {
            child: None,
            dir,
            envs: Vec::new(),
        };
        d.spawn_with(|c| {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs
            // between fork and exec.
            unsafe {
                c.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: nofile,
                        rlim_max: nofile,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        });
        d
    }

    pub fn spawn(&mut self) {
        self.spawn_with(|_| {});
    }

    /// [`Daemon::spawn`], with `setup` applied to the command first.
    pub fn spawn_with(&mut self, setup: impl FnOnce(&mut Command)) {
        require_root();
        let _ = std::fs::remove_file(self.socket());
        let mut command = Command::new(vitalsd_bin());
        setup(&mut command);
        let child = command
            .env("FAKE_PERFETTO_MODE", "success")
            .envs(self.envs.iter().cloned())
            .process_group(0)
            .args(["run", "--config"])
            .arg(self.config_path())
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(self.dir.path().join("log")).unwrap())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Client::connect(&self.socket()).is_err() {
            assert!(
                Instant::now() < deadline,
                "daemon did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Lets any uid reach the socket (directory 0755, socket 0666), so the
    /// daemon's own uid check is what decides.
    pub fn open_socket_to_all(&self) {
        use std::os::unix::fs::PermissionsExt;
        let mode = |m| std::fs::Permissions::from_mode(m);
        std::fs::set_permissions(self.dir.path(), mode(0o755)).unwrap();
        std::fs::set_permissions(self.socket(), mode(0o666)).unwrap();
    }

    /// What the daemon's descriptors point to (/proc/<pid>/fd links).
    pub fn fd_targets(&self) -> Vec<String> {
        let dir = format!("/proc/{}/fd", self.pid());
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .map(|t| t.display().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("vitalsd.toml")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("vitalsd.sock")
    }

    pub fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    pub fn call(&self, req: &Request) -> Value {
        Client::connect(&self.socket())
            .unwrap()
            .call(req)
            .unwrap_or_else(|e| panic!("{req:?}: {e}\n{}", self.log()))
    }

    /// Runs `vitalsctl --socket <ours> ARGS` as root.
    pub fn vitalsctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(vitalsd_bin().with_file_name("vitalsctl"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .output()
            .unwrap()
    }

    pub fn list(&self) -> Vec<Value> {
        self.call(&Request::List {}).as_array().unwrap().clone()
    }

    /// Waits until a capture the daemon was asked for records: status
    /// lists it as soon as it is asked for, its programs run once the
    /// recording logs "capture started" (a second later in a TCG guest).
    pub fn wait_capture_recording(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.log().contains("capture started") {
            assert!(
                Instant::now() < deadline,
                "the capture never started:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the daemon's one capture to be stored (none running);
    /// its list entry and its trace's path.
    pub fn stored_capture(&self) -> (Value, PathBuf) {
        self.wait_status("the capture to be stored", Duration::from_secs(30), |st| {
            st["store"]["captures"] == 1 && st["capture"].is_null()
        });
        let m = self.list().remove(0);
        let path = self
            .store()
            .join(format!("{}.pftrace", m["id"].as_str().unwrap()));
        (m, path)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits for `cond` on the daemon's status, polling.
    pub fn wait_status(
        &self,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.call(&Request::Status {});
            if cond(&st) {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {st}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let st = c.wait().unwrap();
            assert!(st.success(), "daemon exited with {st}: {}", self.log());
        }
    }
}

/// Runs `f` on a thread of its own with uid `uid`, gid `gid` and no
/// supplementary groups: sockets it connects carry those credentials
/// (SO_PEERCRED and the socket file's permission check use the connecting
/// thread's). The kernel keeps credentials per thread; glibc's setuid()
/// would change every thread of the test, the raw syscalls change this
/// one only, and it ends with `f`.
pub fn as_uid<T: Send + 'static>(uid: u32, gid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: plain syscalls on this thread's credentials.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
        }
        f()
    })
    .join()
    .unwrap()
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pgid = nix::unistd::Pid::from_raw(-(c.id() as i32));
            let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = c.wait();
        }
    }
}
