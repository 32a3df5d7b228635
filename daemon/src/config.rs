//! The daemon's configuration: TOML, every key documented with its default,
//! unknown keys and bad values rejected with the key named.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use crate::bpf::{AccountingChoice, FaultSourceChoice};

mod capture;
mod file;
mod rules;
pub use capture::{BackendChoice, CaptureSettings};
use file::read_config_file;
pub use file::{bounded, MAX_CONFIG_BYTES, MAX_MESSAGE_BYTES};
pub use rules::{Metric, Prelude, RecordingSpec, Rule, Watch};

/// Where the OEM puts it on Android, and on Linux hosts.
pub const DEFAULT_PATH_ANDROID: &str = "/vendor/etc/vitalsd.toml";
pub const DEFAULT_PATH_LINUX: &str = "/etc/vitalsd.toml";

pub fn default_path() -> &'static Path {
    Path::new(if cfg!(target_os = "android") {
        DEFAULT_PATH_ANDROID
    } else {
        DEFAULT_PATH_LINUX
    })
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
    /// Only a regular file can be read without blocking and read again at
    /// SIGHUP: open(2) of a FIFO blocks until a writer comes, and a pipe
    /// (`--config <(…)`) is empty the second time.
    #[error("config {path}: not a regular file ({kind}); write the config to a file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("config {path}: larger than {limit_bytes} bytes")]
    TooLarge { path: PathBuf, limit_bytes: u64 },
    /// An empty file is a mistake (a truncated write, a `>` redirect gone
    /// wrong), not a request for every default.
    #[error("config {path}: empty (a config that wants every default says so with a comment)")]
    Empty { path: PathBuf },
}

/// The longest duration any key or flag takes. Longer values are errors,
/// not panics: `Duration::from_secs_f64` panics past `Duration::MAX`, and
/// `Instant + d` panics on overflow far below it (a cooldown of 1e15 s).
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 86400);

/// The longest capture or heap profile a rule or request may ask for (the
/// control socket caps manual ones at the same).
pub const MAX_CAPTURE_DURATION: Duration = Duration::from_secs(3600);

/// Bound of `sampling.max_tasks`: the per-task maps are preallocated, about
/// 64 bytes a task plus the hash element's own overhead (one value per
/// task since TASKS stopped being per-CPU).
pub const MAX_TASKS: u32 = 1 << 22;

/// "10s", "500ms", "2m", "1h", "7d", or bare seconds; positive, at least
/// 1 ms and at most `MAX_DURATION`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e3)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600e3)
    } else if let Some(n) = s.strip_suffix('d') {
        (n, 86400e3)
    } else {
        (s, 1e3)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?} (examples: 10s, 500ms, 2m, 7d)"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("duration {s:?} must be positive"));
    }
    let ms = v * mult_ms;
    if ms < 1.0 {
        return Err(format!("duration {s:?} is shorter than 1ms"));
    }
    match Duration::try_from_secs_f64(ms / 1e3) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        _ => Err(format!(
            "duration {s:?} is longer than the {} days any setting takes",
            MAX_DURATION.as_secs() / 86400
        )),
    }
}

/// A duration written as a string in TOML ("30s").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            s.serialize_str(&format!("{}s", ms / 1000))
        } else {
            s.serialize_str(&format!("{ms}ms"))
        }
    }
}

fn fault_source_de<'de, D: Deserializer<'de>>(d: D) -> Result<FaultSourceChoice, D::Error> {
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

fn fault_source_ser<S: Serializer>(v: &FaultSourceChoice, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match v {
        FaultSourceChoice::Auto => "auto",
        FaultSourceChoice::Tracepoint => "tracepoint",
        FaultSourceChoice::PerfEvent => "perf",
        FaultSourceChoice::Off => "off",
    })
}

fn accounting_de<'de, D: Deserializer<'de>>(d: D) -> Result<AccountingChoice, D::Error> {
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

fn accounting_ser<S: Serializer>(v: &AccountingChoice, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.name())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub sampling: Sampling,
    pub store: StoreConfig,
    pub control: Control,
    pub budget: Budget,
    pub conditions: Conditions,
    pub heapprofd: HeapprofdSettings,
    pub producer: ProducerSettings,
    pub capture: CaptureSettings,
    #[serde(rename = "rule")]
    pub rules: Vec<Rule>,
}

/// `vitalsd run` as a producer of the system tracing service (traced), in
/// builds with the `producer` feature; see docs/android.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProducerSettings {
    /// Register the data source. With no session listing it, the daemon
    /// only keeps an idle connection to traced.
    pub enabled: bool,
    /// The data source name trace configs list.
    pub data_source: String,
}

impl Default for ProducerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            data_source: "linux.vitals".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sampling {
    /// Always-on sampling interval of the eBPF maps and procfs.
    pub interval: Dur,
    /// How much history is kept in memory (bounded: history / interval samples).
    pub history: Dur,
    /// "auto": eBPF, or /proc only when BPF is denied (no CAP_BPF, bpf(2)
    /// refused, no BPF in the kernel); "bpf": eBPF or exit; "proc": /proc
    /// only.
    #[serde(deserialize_with = "accounting_de", serialize_with = "accounting_ser")]
    pub accounting: AccountingChoice,
    #[serde(
        deserialize_with = "fault_source_de",
        serialize_with = "fault_source_ser"
    )]
    pub fault_source: FaultSourceChoice,
    pub max_tasks: u32,
    /// Thread exits a second the exited-task map absorbs between two
    /// reads; sizes it with `interval` (`bpf::exited_entries`).
    pub exits_per_second: u32,
    pub runq_wait: bool,
    /// Off-CPU accounting (eBPF tier; README "Off-CPU time").
    pub offcpu: bool,
    /// A block at least this long is a long block (1ms..1h).
    pub long_block: Dur,
    /// Bound of the (wakee, waker) process-pair map.
    pub max_waker_pairs: u32,
    /// Attach the classic sched tracepoints even where the kernel's BTF
    /// allows tp_btf (which costs less per switch; see `bpf::SchedPrograms`).
    pub classic_tracepoints: bool,
    /// Processes kept per history sample (the busiest by CPU, faults, RSS).
    pub history_processes: usize,
    /// bpffs directory of pinned programs and maps to attach: on Android
    /// /sys/fs/bpf, where bpfloader pins vitals.o's prog_vitals_* and
    /// map_vitals_* (init/vitalsd.toml); used when they are there, else the
    /// daemon loads its own object.
    pub pin_dir: Option<PathBuf>,
    pub proc_root: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub dir: PathBuf,
    pub quota_bytes: u64,
    /// One capture stops (kept, marked cut) once its trace reaches this;
    /// the store also keeps no capture over half its quota.
    pub max_capture_bytes: u64,
    pub max_captures: usize,
    pub max_age: Dur,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    pub socket: PathBuf,
    /// Peers (SO_PEERCRED uid) allowed to talk to the daemon.
    pub allowed_uids: Vec<u32>,
    pub max_request_bytes: u32,
    /// The socket's group (a name or a gid), as docker's group: its members
    /// may connect, and `allowed_uids` still decides who is served. Unset:
    /// root's group. Linux hosts only; on Android init's `socket` line sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Rule-triggered captures.
    pub captures_per_hour: u32,
    pub captures_per_day: u32,
    /// Manual captures (`vitalsctl capture`): their own budget, so asking
    /// by hand neither spends nor is blocked by the rules' budget.
    pub manual_captures_per_hour: u32,
    pub manual_captures_per_day: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Conditions {
    /// Skip triggered captures while any thermal zone is above this (m°C).
    pub max_thermal_millicelsius: Option<i64>,
    /// Skip triggered captures unless a power supply reports charging/full.
    pub require_charging: bool,
    pub thermal_root: PathBuf,
    pub power_supply_root: PathBuf,
}

/// heapprofd sessions, started as the trusted system initiator (see
/// `heapprofd`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeapprofdSettings {
    /// Who is traced's consumer: "perfetto_client" (exec `perfetto_bin`)
    /// or "in_process" (the daemon, through the Perfetto SDK; needs the
    /// `producer` build feature). See docs/android.md.
    pub consumer: crate::heapprofd::ConsumerRoute,
    pub perfetto_bin: PathBuf,
    pub sampling_interval_bytes: u64,
    /// Longest session a request may ask for.
    pub max_duration: Dur,
    pub system_per_hour: u32,
    pub system_per_day: u32,
    pub target_per_hour: u32,
    pub target_per_day: u32,
    /// Processes (normalised cmdline) a manual heap profile
    /// (`vitalsctl heap`) may target, beside every rule's heap_allowlist.
    /// Empty, with no rule allowlist either: manual profiles are refused.
    pub allowlist: Vec<String>,
    /// Installers a manual heap profile's target must come from; empty = any.
    pub installers: Vec<String>,
}

impl Default for HeapprofdSettings {
    fn default() -> Self {
        let r = crate::heapprofd::RateLimits::default();
        Self {
            consumer: crate::heapprofd::ConsumerRoute::default(),
            perfetto_bin: PathBuf::from(crate::heapprofd::DEFAULT_PERFETTO_BIN),
            sampling_interval_bytes: 4096,
            max_duration: Dur(Duration::from_secs(600)),
            system_per_hour: r.system_per_hour,
            system_per_day: r.system_per_day,
            target_per_hour: r.target_per_hour,
            target_per_day: r.target_per_day,
            allowlist: Vec::new(),
            installers: Vec::new(),
        }
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            interval: Dur(Duration::from_secs(1)),
            history: Dur(Duration::from_secs(600)),
            accounting: AccountingChoice::Auto,
            fault_source: FaultSourceChoice::Auto,
            max_tasks: crate::bpf::MapLimits::default().max_tasks,
            exits_per_second: crate::bpf::DEFAULT_EXITS_PER_SECOND,
            runq_wait: true,
            offcpu: true,
            long_block: Dur(Duration::from_millis(16)),
            max_waker_pairs: crate::bpf::OffcpuSettings::default().max_waker_pairs,
            classic_tracepoints: false,
            history_processes: 16,
            pin_dir: None,
            proc_root: PathBuf::from("/proc"),
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from(if cfg!(target_os = "android") {
                "/data/misc/vitalsd"
            } else {
                "/var/lib/vitalsd"
            }),
            quota_bytes: 256 << 20,
            // A minute of `--sched` on a busy 8-core phone is ~30-60 MB.
            max_capture_bytes: 64 << 20,
            max_captures: 50,
            max_age: Dur(Duration::from_secs(7 * 86400)),
        }
    }
}

impl Default for Control {
    fn default() -> Self {
        Self::default_for(cfg!(target_os = "android"))
    }
}

impl Control {
    /// The defaults on Android (`true`) or a Linux host; tests of the
    /// Android files check the Android ones on any host.
    pub fn default_for(android: bool) -> Self {
        Self {
            socket: PathBuf::from(if android {
                "/dev/socket/vitalsd"
            } else {
                "/run/vitalsd/vitalsd.sock"
            }),
            // root and system (AID_SYSTEM).
            allowed_uids: vec![0, 1000],
            max_request_bytes: 64 * 1024,
            group: None,
        }
    }
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            captures_per_hour: 4,
            captures_per_day: 20,
            manual_captures_per_hour: 6,
            manual_captures_per_day: 30,
        }
    }
}

impl Default for Conditions {
    fn default() -> Self {
        Self {
            max_thermal_millicelsius: None,
            require_charging: false,
            thermal_root: PathBuf::from("/sys/class/thermal"),
            power_supply_root: PathBuf::from("/sys/class/power_supply"),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            sampling: Sampling::default(),
            store: StoreConfig::default(),
            control: Control::default(),
            budget: Budget::default(),
            conditions: Conditions::default(),
            heapprofd: HeapprofdSettings::default(),
            producer: ProducerSettings::default(),
            capture: CaptureSettings::default(),
            rules: vec![Rule {
                name: "system-cpu-busy".into(),
                metric: Metric::SystemCpuBusyPct,
                threshold: 90.0,
                window: Dur(Duration::from_secs(30)),
                cooldown: Dur(Duration::from_secs(30 * 60)),
                capture: RecordingSpec::default(),
            }],
        }
    }
}

/// The error for a value out of range at `key` of the file at `path`.
fn invalid(path: &Path, key: &str, message: String) -> Result<(), ConfigError> {
    // Keys name rules, and messages quote values: both come from the file.
    Err(ConfigError::Invalid {
        path: path.to_owned(),
        key: bounded(key, MAX_MESSAGE_BYTES).into_owned(),
        message: bounded(&message, MAX_MESSAGE_BYTES).into_owned(),
    })
}

impl Config {
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            // toml's message names the key and quotes the line.
            message: bounded(&e.to_string().trim().replace('\n', " "), MAX_MESSAGE_BYTES)
                .into_owned(),
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Reads and checks the file at `path`: a regular file of at most
    /// [`MAX_CONFIG_BYTES`], not empty.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(path, &read_config_file(path)?)
    }

    /// Checks what serde cannot: ranges and relations between keys. Every
    /// numeric key has a range, and an error names the key.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| invalid(path, key, message);
        let s = &self.sampling;
        if s.interval.0 < Duration::from_millis(100) {
            return bad("sampling.interval", "must be at least 100ms".into());
        }
        if s.history.0 < s.interval.0 {
            return bad("sampling.history", "must be at least one interval".into());
        }
        if s.history.0.as_secs_f64() / s.interval.0.as_secs_f64() > 100_000.0 {
            return bad(
                "sampling.history",
                "more than 100000 samples; raise the interval".into(),
            );
        }
        if !(16..=MAX_TASKS).contains(&s.max_tasks) {
            return bad(
                "sampling.max_tasks",
                format!("must be between 16 and {MAX_TASKS}"),
            );
        }
        if !(1..=1_000_000).contains(&s.exits_per_second) {
            return bad(
                "sampling.exits_per_second",
                "must be between 1 and 1000000".into(),
            );
        }
        if !(Duration::from_millis(1)..=Duration::from_secs(3600)).contains(&s.long_block.0) {
            return bad("sampling.long_block", "must be between 1ms and 1h".into());
        }
        if !(16..=1 << 20).contains(&s.max_waker_pairs) {
            return bad(
                "sampling.max_waker_pairs",
                "must be between 16 and 1048576".into(),
            );
        }
        if !(1..=10_000).contains(&s.history_processes) {
            return bad(
                "sampling.history_processes",
                "must be between 1 and 10000".into(),
            );
        }
        if let Err((key, message)) = self.capture.memory().check() {
            return bad(&format!("capture.{key}"), message);
        }
        if let Err((key, message)) = self.capture.check_offcpu() {
            return bad(&format!("capture.{key}"), message);
        }
        if self.store.quota_bytes < 1 << 20 {
            return bad("store.quota_bytes", "must be at least 1 MiB".into());
        }
        if self.store.max_capture_bytes < 64 << 10 {
            return bad("store.max_capture_bytes", "must be at least 64 KiB".into());
        }
        if self.store.max_captures == 0 {
            return bad("store.max_captures", "must be at least 1".into());
        }
        if self.control.max_request_bytes < 64 || self.control.max_request_bytes > 16 << 20 {
            return bad(
                "control.max_request_bytes",
                "must be between 64 and 16 MiB".into(),
            );
        }
        if self.control.group.as_deref().is_some_and(str::is_empty) {
            return bad(
                "control.group",
                "must name a group or a gid when set".into(),
            );
        }
        let b = &self.budget;
        if b.captures_per_hour.max(b.manual_captures_per_hour) > 3600
            || b.captures_per_day.max(b.manual_captures_per_day) > 86_400
        {
            return bad(
                "budget",
                "*_per_hour at most 3600, *_per_day at most 86400".into(),
            );
        }
        if let Some(t) = self.conditions.max_thermal_millicelsius {
            if !(-50_000..=200_000).contains(&t) {
                return bad(
                    "conditions.max_thermal_millicelsius",
                    "must be between -50000 and 200000 (m°C)".into(),
                );
            }
        }
        let h = &self.heapprofd;
        if let Err(message) = h.consumer.available() {
            return bad("heapprofd.consumer", message);
        }
        if h.sampling_interval_bytes == 0 || h.sampling_interval_bytes > 1 << 30 {
            return bad(
                "heapprofd.sampling_interval_bytes",
                "must be between 1 and 1 GiB".into(),
            );
        }
        if h.max_duration.0 > MAX_CAPTURE_DURATION {
            return bad(
                "heapprofd.max_duration",
                format!("must be at most {}s", MAX_CAPTURE_DURATION.as_secs()),
            );
        }
        self.validate_rules(path)
    }

    /// The `[[rule]]` tables: names, thresholds, windows, capture specs.
    fn validate_rules(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| invalid(path, key, message);
        let s = &self.sampling;
        let mut names = std::collections::HashSet::new();
        for (i, r) in self.rules.iter().enumerate() {
            let key = |k: &str| format!("rule[{i}] ({}).{k}", r.name);
            if r.name.is_empty() || !names.insert(r.name.clone()) {
                return bad(&format!("rule[{i}].name"), "empty or duplicate".into());
            }
            // The store tells manual captures by these names (they are
            // evicted before rule-triggered ones).
            if ["manual", "manual-heap"].contains(&r.name.as_str()) {
                return bad(
                    &format!("rule[{i}].name"),
                    format!("{:?} is reserved for manual captures", r.name),
                );
            }
            if !r.threshold.is_finite() || r.threshold < 0.0 {
                return bad(&key("threshold"), "must be a finite number >= 0".into());
            }
            if r.window.0 < s.interval.0 {
                return bad(
                    &key("window"),
                    "must be at least one sampling interval".into(),
                );
            }
            if r.window.0 > s.history.0 {
                return bad(&key("window"), "longer than sampling.history".into());
            }
            if r.capture.duration.0 < Duration::from_secs(1)
                || r.capture.duration.0 > MAX_CAPTURE_DURATION
            {
                return bad(
                    &key("capture.duration"),
                    format!("must be between 1s and {}s", MAX_CAPTURE_DURATION.as_secs()),
                );
            }
            if let Metric::PsiAvg10 { resource, .. } = &r.metric {
                if !["cpu", "memory", "io"].contains(&resource.as_str()) {
                    return bad(
                        &key("metric.resource"),
                        format!("{resource:?} is not cpu, memory or io"),
                    );
                }
            }
            if r.capture.offcpu {
                self.check_rule_offcpu(r)
                    .or_else(|m| bad(&key("capture.offcpu"), m))?;
            }
            if r.capture.heap_profile && r.capture.heap_allowlist.is_empty() {
                return bad(
                    &key("capture.heap_allowlist"),
                    "heap_profile needs an allowlist".into(),
                );
            }
        }
        Ok(())
    }

    /// A rule's `capture.offcpu`: a backend that records it, and processes
    /// to watch when the metric has no offending process.
    fn check_rule_offcpu(&self, r: &Rule) -> Result<(), String> {
        if self.capture.backend == BackendChoice::Perfetto {
            return Err(
                "off-CPU stacks are recorded by the ebpf capture backend only \
                        (capture.backend = \"perfetto\")"
                    .into(),
            );
        }
        if matches!(r.metric.watch(), Some(Watch::System { .. }))
            && !self.capture.offcpu_watches_without_offender()
        {
            return Err(
                "a system-wide metric has no offending process to watch: name \
                        processes in capture.offcpu_watch (or set capture.offcpu_watch_all)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The effective config, as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    pub fn history_len(&self) -> usize {
        (self.sampling.history.0.as_secs_f64() / self.sampling.interval.0.as_secs_f64()).ceil()
            as usize
    }
}

#[cfg(test)]
mod tests;
