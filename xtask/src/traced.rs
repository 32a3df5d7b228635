//! traced (+ traced_probes) on private sockets for the benches, each in its
//! own process group and killed on drop, even when a bench fails.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{suites::Tool, util::Group};

pub struct Traced {
    tools: PathBuf,
    dir: PathBuf,
    pub traced: Group,
    pub probes: Option<Group>,
}

impl Traced {
    /// Starts traced, and traced_probes if `probes`, with sockets in `dir`.
    pub fn start(dir: &Path, probes: bool) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let tools = Tool::PerfettoService.find().map_err(|why| {
            anyhow::anyhow!("Perfetto's tools: {why}; {}", Tool::PerfettoService.how())
        })?;
        let spawn = |tool: &str| -> Result<Group> {
            let mut c = Command::new(tools.join(tool));
            c.envs(env(dir)).stdout(Stdio::null()).stderr(Stdio::null());
            Group::spawn(&mut c).with_context(|| format!("starting {tool}"))
        };
        let traced = spawn("traced")?;
        let mut t = Self {
            tools: tools.clone(),
            dir: dir.to_owned(),
            traced,
            probes: None,
        };
        t.wait_for("", Duration::from_secs(20))?;
        if probes {
            t.probes = Some(spawn("traced_probes")?);
            t.wait_for("linux.process_stats", Duration::from_secs(20))?;
        }
        Ok(t)
    }

    pub fn env(&self) -> [(&'static str, PathBuf); 2] {
        env(&self.dir)
    }

    /// Waits until traced answers and, unless `data_source` is empty, a
    /// producer has registered it.
    pub fn wait_for(&self, data_source: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = Command::new(self.tools.join("perfetto"))
                .envs(self.env())
                .arg("--query")
                .stderr(Stdio::null())
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            if out.status.success()
                && (data_source.is_empty()
                    || text
                        .lines()
                        .any(|l| l.split_whitespace().next() == Some(data_source)))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("traced did not list {data_source:?} within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts a session with the text TraceConfig `config`, writing to
    /// `out`; the caller waits for (or drops) the client.
    pub fn session(&self, config: &str, out: &Path) -> Result<Group> {
        let cfg = self.dir.join("session.pbtxt");
        std::fs::write(&cfg, config)?;
        let mut c = Command::new(self.tools.join("perfetto"));
        c.envs(self.env())
            .args(["--txt", "-c"])
            .arg(&cfg)
            .arg("-o")
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Group::spawn(&mut c).context("starting perfetto")
    }
}

fn env(dir: &Path) -> [(&'static str, PathBuf); 2] {
    [
        ("PERFETTO_PRODUCER_SOCK_NAME", dir.join("producer.sock")),
        ("PERFETTO_CONSUMER_SOCK_NAME", dir.join("consumer.sock")),
    ]
}
