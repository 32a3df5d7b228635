//! The real Perfetto service for the producer tests: traced (and optionally
//! traced_probes) on private sockets in a temporary directory, the
//! `perfetto` client against them, each process in its own process group
//! and killed on drop, even when the test panics.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use crate::{
    perfetto_service::{perfetto_dir, Group},
    require_root,
};

/// traced (+ traced_probes) on sockets of their own.
pub struct Traced {
    tools: PathBuf,
    pub dir: tempfile::TempDir,
    traced: Option<Group>,
    probes: Option<Group>,
}

impl Traced {
    /// Starts traced, and traced_probes if `probes` (for linux.* data
    /// sources), and waits until the consumer socket answers.
    pub fn start(probes: bool) -> Self {
        require_root();
        let mut t = Self {
            tools: perfetto_dir(),
            dir: tempfile::tempdir().unwrap(),
            traced: None,
            probes: None,
        };
        t.start_traced();
        if probes {
            let log = std::fs::File::create(t.dir.path().join("traced_probes.log")).unwrap();
            t.probes = Some(Group::spawn(t.command("traced_probes").stderr(log)));
            t.wait_for_data_source("linux.process_stats", Duration::from_secs(20));
        }
        t
    }

    pub fn producer_socket(&self) -> PathBuf {
        self.dir.path().join("producer.sock")
    }

    pub fn consumer_socket(&self) -> PathBuf {
        self.dir.path().join("consumer.sock")
    }

    /// The variables a producer or consumer reads to find this service.
    pub fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("PERFETTO_PRODUCER_SOCK_NAME", self.producer_socket()),
            ("PERFETTO_CONSUMER_SOCK_NAME", self.consumer_socket()),
        ]
    }

    fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(self.tools.join(tool));
        c.envs(self.env());
        c
    }

    /// (Re)starts traced; its sockets are created anew.
    pub fn start_traced(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("traced.log")).unwrap();
        self.traced = Some(Group::spawn(self.command("traced").stderr(log)));
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.query().is_none() {
            assert!(Instant::now() < deadline, "traced did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills traced (SIGKILL: a crash, no goodbye to producers).
    pub fn kill_traced(&mut self) {
        // Dropping the group SIGKILLs it and reaps traced.
        drop(self.traced.take());
        let _ = std::fs::remove_file(self.producer_socket());
        let _ = std::fs::remove_file(self.consumer_socket());
    }

    /// `perfetto --query`'s report (producers, data sources), None while
    /// traced does not answer.
    pub fn query(&self) -> Option<String> {
        let out = self.command("perfetto").arg("--query").output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until a producer has registered `name`.
    pub fn wait_for_data_source(&self, name: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let q = self.query().unwrap_or_default();
            if q.lines().any(|l| l.split_whitespace().next() == Some(name)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "data source {name} not registered within {timeout:?}:\n{q}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs a session with the text-format TraceConfig `config` into `out`.
    pub fn record(&self, config: &str, out: &Path) -> Output {
        let cfg = self.dir.path().join("session.pbtxt");
        std::fs::write(&cfg, config).unwrap();
        let output = self
            .command("perfetto")
            .arg("--txt")
            .arg("-c")
            .arg(&cfg)
            .arg("-o")
            .arg(out)
            .output()
            .expect("running perfetto");
        assert!(
            output.status.success(),
            "perfetto session failed: {}\ntraced: {}",
            String::from_utf8_lossy(&output.stderr),
            self.log("traced.log")
        );
        output
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }
}
