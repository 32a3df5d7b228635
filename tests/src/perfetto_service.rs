//! Perfetto's real tracing service for the tests: traced and traced_probes
//! on sockets of their own, and heapprofd targets started with the glibc
//! preload library, every one in its own process group and killed with it
//! from a Drop guard, even when the test panics.
//!
//! The tools (traced, traced_probes, perfetto, libheapprofd_glibc_preload.so,
//! built from Perfetto's source) are found through `VITALS_PERFETTO_DIR`
//! (what `cargo xtask test` sets), then `../shared/tools/perfetto` beside the
//! checkout or its main checkout. Not found: the calling test fails; it
//! never skips.

use std::{
    io::{BufRead, BufReader, Read},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::{trace_processor::checkout_roots, workload_bin};

const ENV: &str = "VITALS_PERFETTO_DIR";
const NEEDED: [&str; 4] = [
    "traced",
    "traced_probes",
    "perfetto",
    "libheapprofd_glibc_preload.so",
];

/// The directory holding Perfetto's tools.
pub fn perfetto_dir() -> PathBuf {
    let complete = |d: &Path| NEEDED.iter().all(|f| d.join(f).is_file());
    if let Some(d) = std::env::var_os(ENV).map(PathBuf::from) {
        assert!(
            complete(&d),
            "{ENV}={} lacks one of {NEEDED:?}; unset it to look in ../shared/tools/perfetto",
            d.display()
        );
        return d;
    }
    let candidates: Vec<PathBuf> = checkout_roots()
        .into_iter()
        .map(|r| r.join("../shared/tools/perfetto"))
        .collect();
    candidates
        .iter()
        .find(|d| complete(d))
        .cloned()
        .unwrap_or_else(|| {
            panic!("Perfetto's tools not found: set {ENV}, or place {NEEDED:?} in one of {candidates:?}")
        })
}

/// A child in its own process group: Drop SIGKILLs the whole group (a
/// heapprofd target's forked heapprofd, a CLI's perfetto client) and reaps
/// the child.
pub struct Group {
    pub child: Child,
    /// The leader was reaped, so its pid, the group's id, may belong to
    /// someone else by now: no group kill after that.
    reaped: bool,
}

impl Group {
    pub fn spawn(cmd: &mut Command) -> Self {
        let child = cmd
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        Self {
            child,
            reaped: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill_group(&self) {
        let pgid = nix::unistd::Pid::from_raw(-(self.child.id() as i32));
        let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
    }

    /// Waits for the leader to exit, collecting its piped output, then
    /// kills what is left of its group.
    pub fn output(&mut self) -> Output {
        fn read_all(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        }
        let out = read_all(self.child.stdout.take());
        let err = read_all(self.child.stderr.take());
        // Wait without reaping (WNOWAIT): while the leader is a zombie its
        // pid cannot be reused, so the group kill cannot hit another group.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let flags = nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT;
        nix::sys::wait::waitid(nix::sys::wait::Id::Pid(pid), flags).unwrap();
        self.kill_group();
        let status = self.child.wait().unwrap();
        self.reaped = true;
        Output {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill_group();
            let _ = self.child.wait();
        }
    }
}

/// traced and traced_probes on private sockets in a temporary directory.
pub struct PerfettoService {
    // Dropped first (fields drop in order): the processes go before the
    // directory holding their sockets.
    _probes: Group,
    _traced: Group,
    pub dir: tempfile::TempDir,
    pub tools: PathBuf,
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl PerfettoService {
    pub fn start() -> Self {
        let tools = perfetto_dir();
        let dir = tempfile::tempdir().unwrap();
        let envs = sockets(dir.path());
        let log = |name: &str| std::fs::File::create(dir.path().join(name)).unwrap();
        let traced = Group::spawn(
            Command::new(tools.join("traced"))
                .envs(envs.clone())
                .stdout(log("traced.log"))
                .stderr(log("traced.err")),
        );
        wait_for("traced's sockets", Duration::from_secs(10), || {
            envs.iter().all(|(_, p)| p.exists())
        });
        let probes = Group::spawn(
            Command::new(tools.join("traced_probes"))
                .envs(envs.clone())
                .stdout(log("probes.log"))
                .stderr(log("probes.err")),
        );
        let service = Self {
            _probes: probes,
            _traced: traced,
            dir,
            tools,
        };
        // linux.process_stats must be registered before a session starts,
        // or the session runs without the ProcessTree that names the pids.
        service.wait_for_data_source("linux.process_stats");
        service
    }

    /// traced's pid (its process group's leader).
    pub fn traced_pid(&self) -> u32 {
        self._traced.pid()
    }

    /// PERFETTO_PRODUCER_SOCK_NAME and PERFETTO_CONSUMER_SOCK_NAME: every
    /// client of this service (perfetto, a preloaded target) needs both.
    pub fn env(&self) -> Vec<(&'static str, PathBuf)> {
        sockets(self.dir.path())
    }

    pub fn perfetto_bin(&self) -> PathBuf {
        self.tools.join("perfetto")
    }

    /// Polls `perfetto --query` until a producer registered `name`.
    pub fn wait_for_data_source(&self, name: &str) {
        self.wait_for_query(&format!("data source {name}"), name);
    }

    /// Polls `perfetto --query` until a tracing session named `name` runs.
    pub fn wait_for_session(&self, name: &str) {
        self.wait_for_query(&format!("tracing session {name}"), name);
    }

    /// Polls `perfetto --query` (the service's own state: producers, data
    /// sources, sessions) until its output holds `text`.
    fn wait_for_query(&self, what: &str, text: &str) {
        let query = || {
            Command::new(self.perfetto_bin())
                .arg("--query")
                .envs(self.env())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains(text))
                .unwrap_or(false)
        };
        wait_for(
            &format!("{what} in `perfetto --query`"),
            Duration::from_secs(20),
            query,
        );
    }
}

fn sockets(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("PERFETTO_PRODUCER_SOCK_NAME", dir.join("producer.sock")),
        ("PERFETTO_CONSUMER_SOCK_NAME", dir.join("consumer.sock")),
    ]
}

/// `vitals-workload heap-churn` started the way heapprofd can profile it on
/// Linux: the glibc preload library in LD_PRELOAD (it forks its own
/// heapprofd, which registers android.heapprofd with traced), argv[0] the
/// name heapprofd matches. Runs until dropped.
pub struct HeapTarget {
    // Fields drop in order: stdin closes (the workload's way out), then
    // the group is killed, which also ends the forked heapprofd.
    _stdin: Option<ChildStdin>,
    group: Group,
}

impl HeapTarget {
    pub fn start(service: &PerfettoService, name: &str) -> Self {
        let mut group = Group::spawn(
            Command::new(workload_bin())
                .arg0(name)
                .arg("heap-churn")
                .env(
                    "LD_PRELOAD",
                    service.tools.join("libheapprofd_glibc_preload.so"),
                )
                .envs(service.env())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        let stdin = group.child.stdin.take();
        let mut out = BufReader::new(group.child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "workload said {line:?}");
        // The preload library's heapprofd says so on stderr once it is
        // connected to traced; a session started before that would find
        // no android.heapprofd producer for this process.
        let (tx, rx) = mpsc::channel();
        let err = BufReader::new(group.child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for l in err.lines().map_while(Result::ok) {
                if l.contains("Connected to the service") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the preload library's heapprofd did not connect to traced");
        Self {
            _stdin: stdin,
            group,
        }
    }

    pub fn pid(&self) -> u32 {
        self.group.pid()
    }
}

/// Who is traced's consumer (`heapprofd.consumer`, which captures share):
/// the exec'd `perfetto` client or vitalsd's in-process SDK session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    PerfettoClient,
    InProcess,
}

impl Route {
    /// Its name in the config and in the stored metadata.
    pub fn name(self) -> &'static str {
        match self {
            Route::PerfettoClient => "perfetto_client",
            Route::InProcess => "in_process",
        }
    }

    /// `vitalsd heap`'s arguments choosing this route; `perfetto` is the
    /// client binary.
    pub fn args(self, perfetto: &Path) -> Vec<String> {
        let mut v = vec!["--consumer".into(), self.name().into()];
        if self == Route::PerfettoClient {
            v.extend(["--perfetto-bin".into(), perfetto.to_str().unwrap().into()]);
        }
        v
    }

    /// The `[heapprofd]` table choosing this route in a config file.
    pub fn config(self, perfetto: &Path) -> String {
        format!(
            "[heapprofd]\nconsumer = \"{}\"\nperfetto_bin = \"{}\"\n",
            self.name(),
            perfetto.display()
        )
    }
}

/// One #[test] per [`Route`] for the function `$name(Route)`.
#[macro_export]
macro_rules! per_route {
    ($name:ident) => {
        mod $name {
            #[test]
            fn perfetto_client() {
                super::$name($crate::perfetto_service::Route::PerfettoClient);
            }
            #[test]
            fn in_process() {
                super::$name($crate::perfetto_service::Route::InProcess);
            }
        }
    };
}
