//! Rate limits on heapprofd sessions, persisted so a restart of vitalsd (or a
//! crash loop) cannot reset them.
//!
//! Defaults come from Android's ProfilingManager cost buckets: a
//! system-triggered session costs 5 units, and the budgets are 20 per hour
//! and 50 per day system-wide, 10 per hour and 20 per day per process. That
//! is 4/hour and 10/day system-wide, 2/hour and 4/day per target.
//!
//! Times are wall-clock (UNIX seconds) because the state outlives boots,
//! where CLOCK_BOOTTIME restarts at zero.

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use thiserror::Error;

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    pub system_per_hour: u32,
    pub system_per_day: u32,
    pub target_per_hour: u32,
    pub target_per_day: u32,
}

impl Default for RateLimits {
    fn default() -> Self {
        Self {
            system_per_hour: 4,
            system_per_day: 10,
            target_per_hour: 2,
            target_per_day: 4,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    Hour,
    Day,
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Window::Hour => "hour",
            Window::Day => "day",
        })
    }
}

#[derive(Debug, Error)]
pub enum RateLimitError {
    #[error("system-wide heap profile limit reached: {used} of {limit} sessions in the last {window}; next slot in {retry_after:?}")]
    System {
        window: Window,
        used: u32,
        limit: u32,
        retry_after: Duration,
    },
    #[error("heap profile limit for {target} reached: {used} of {limit} sessions in the last {window}; next slot in {retry_after:?}")]
    Target {
        target: String,
        window: Window,
        used: u32,
        limit: u32,
        retry_after: Duration,
    },
    #[error("reading rate-limit state {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing rate-limit state {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// UNIX seconds when the session started.
    at: u64,
    targets: Vec<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    version: u32,
    sessions: Vec<Entry>,
}

/// Persisted session history with limits applied on admission.
#[derive(Debug)]
pub struct RateLimiter {
    path: PathBuf,
    limits: RateLimits,
    state: State,
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl RateLimiter {
    /// Loads the state file; a missing file is an empty history. A file that
    /// does not parse is logged and replaced on the next write: failing
    /// closed would block heap profiling on this device for good.
    pub fn load(path: impl Into<PathBuf>, limits: RateLimits) -> Result<Self, RateLimitError> {
        let path = path.into();
        let state = match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<State>(&bytes) {
                Ok(s) => s,
                Err(e) => {
                    log::warn!(
                        "rate-limit state {} is corrupt ({e}); starting from an empty history",
                        path.display()
                    );
                    State::default()
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => State::default(),
            Err(source) => return Err(RateLimitError::Read { path, source }),
        };
        Ok(Self {
            path,
            limits,
            state,
        })
    }

    /// An empty history that will be written to `path` (used when the
    /// existing file cannot be read at all).
    pub fn empty(path: impl Into<PathBuf>, limits: RateLimits) -> Self {
        Self {
            path: path.into(),
            limits,
            state: State::default(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn limits(&self) -> RateLimits {
        self.limits
    }

    /// Would a session on `targets` at `now` be admitted?
    pub fn check(&self, targets: &[String], now: SystemTime) -> Result<(), RateLimitError> {
        let now = unix_secs(now);
        let check =
            |window: Window, limit: u32, target: Option<&str>| -> Result<(), RateLimitError> {
                let span = match window {
                    Window::Hour => HOUR,
                    Window::Day => DAY,
                };
                // Entries from the future (clock stepped back) count as recent:
                // they were real sessions.
                let mut times: Vec<u64> = self
                    .state
                    .sessions
                    .iter()
                    .filter(|e| e.at + span > now)
                    .filter(|e| target.is_none_or(|t| e.targets.iter().any(|x| x == t)))
                    .map(|e| e.at)
                    .collect();
                let used = times.len() as u32;
                if used < limit {
                    return Ok(());
                }
                times.sort_unstable();
                // The slot frees when the oldest session that keeps us at the
                // limit leaves the window.
                let idx = (used - limit) as usize;
                let oldest = times.get(idx).copied().unwrap_or(now);
                let retry_after = Duration::from_secs((oldest + span).saturating_sub(now));
                Err(match target {
                    None => RateLimitError::System {
                        window,
                        used,
                        limit,
                        retry_after,
                    },
                    Some(t) => RateLimitError::Target {
                        target: t.to_owned(),
                        window,
                        used,
                        limit,
                        retry_after,
                    },
                })
            };
        check(Window::Hour, self.limits.system_per_hour, None)?;
        check(Window::Day, self.limits.system_per_day, None)?;
        for t in targets {
            check(Window::Hour, self.limits.target_per_hour, Some(t))?;
            check(Window::Day, self.limits.target_per_day, Some(t))?;
        }
        Ok(())
    }

    /// Charges a session and persists the history before returning, so a
    /// crash right after starting the session still counts it.
    pub fn record(&mut self, targets: &[String], now: SystemTime) -> Result<(), RateLimitError> {
        let at = unix_secs(now);
        // Forget what no window can see any more; keep far-future entries
        // out too (a clock that jumped back by years would otherwise block
        // profiling until it caught up).
        self.state
            .sessions
            .retain(|e| e.at + DAY > at && e.at < at + DAY);
        self.state.sessions.push(Entry {
            at,
            targets: targets.to_vec(),
        });
        self.state.version = 1;
        self.persist()
    }

    /// Write to a temporary file and rename over the old one, so a crash
    /// mid-write leaves either the old or the new history, never half.
    fn persist(&self) -> Result<(), RateLimitError> {
        let werr = |source| RateLimitError::Write {
            path: self.path.clone(),
            source,
        };
        let json = serde_json::to_vec_pretty(&self.state).map_err(|e| werr(e.into()))?;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(werr)?;
        }
        let mut f = fs::File::create(&tmp).map_err(werr)?;
        f.write_all(&json).map_err(werr)?;
        f.sync_all().map_err(werr)?;
        fs::rename(&tmp, &self.path).map_err(werr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn defaults_follow_profiling_manager_cost_buckets() {
        // cost 5: 20/h and 50/day system-wide, 10/h and 20/day per process.
        let l = RateLimits::default();
        assert_eq!((l.system_per_hour, l.system_per_day), (20 / 5, 50 / 5));
        assert_eq!((l.target_per_hour, l.target_per_day), (10 / 5, 20 / 5));
    }

    #[test]
    fn per_target_hourly_limit_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rl.json");
        let a = keys(&["name:surfaceflinger"]);
        let mut rl = RateLimiter::load(&path, RateLimits::default()).unwrap();
        for i in 0..2 {
            rl.check(&a, t(i)).unwrap();
            rl.record(&a, t(i)).unwrap();
        }
        drop(rl);
        // "Restart": a fresh limiter from the same file.
        let rl = RateLimiter::load(&path, RateLimits::default()).unwrap();
        match rl.check(&a, t(10)) {
            Err(RateLimitError::Target {
                target,
                window: Window::Hour,
                used: 2,
                limit: 2,
                retry_after,
            }) => {
                assert_eq!(target, "name:surfaceflinger");
                assert_eq!(retry_after, Duration::from_secs(HOUR - 10));
            }
            other => panic!("expected hourly target limit, got {other:?}"),
        }
        // Another target is still fine, and an hour later so is this one.
        rl.check(&keys(&["name:other"]), t(10)).unwrap();
        rl.check(&a, t(HOUR)).unwrap();
    }

    #[test]
    fn per_target_daily_and_system_limits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rl.json");
        let a = keys(&["pid:42"]);
        let mut rl = RateLimiter::load(&path, RateLimits::default()).unwrap();
        for i in 0..4 {
            let now = t(i * 2 * HOUR);
            rl.check(&a, now).unwrap();
            rl.record(&a, now).unwrap();
        }
        assert!(matches!(
            rl.check(&a, t(8 * HOUR)),
            Err(RateLimitError::Target {
                window: Window::Day,
                ..
            })
        ));
        // System-wide: 4 per hour across different targets.
        let base = 9 * HOUR;
        for i in 0..4 {
            let k = keys(&[&format!("name:p{i}")]);
            rl.check(&k, t(base + i)).unwrap();
            rl.record(&k, t(base + i)).unwrap();
        }
        assert!(matches!(
            rl.check(&keys(&["name:p9"]), t(base + 5)),
            Err(RateLimitError::System {
                window: Window::Hour,
                used: 4,
                ..
            })
        ));
        // 8 sessions so far today; 2 more an hour later reach 10/day.
        for i in 0..2 {
            let k = keys(&[&format!("name:q{i}")]);
            rl.check(&k, t(base + HOUR + i)).unwrap();
            rl.record(&k, t(base + HOUR + i)).unwrap();
        }
        let rl = RateLimiter::load(&path, RateLimits::default()).unwrap();
        assert!(matches!(
            rl.check(&keys(&["name:z"]), t(base + 2 * HOUR)),
            Err(RateLimitError::System {
                window: Window::Day,
                used: 10,
                limit: 10,
                ..
            })
        ));
    }

    #[test]
    fn configurable_limits_and_corrupt_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rl.json");
        fs::write(&path, b"{not json").unwrap();
        let limits = RateLimits {
            target_per_hour: 1,
            ..RateLimits::default()
        };
        let mut rl = RateLimiter::load(&path, limits).unwrap();
        let a = keys(&["name:x"]);
        rl.check(&a, t(0)).unwrap();
        rl.record(&a, t(0)).unwrap();
        assert!(rl.check(&a, t(1)).is_err());
        // The corrupt file was replaced by valid JSON.
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["sessions"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn unwritable_state_reports_path() {
        let dir = tempfile::tempdir().unwrap();
        // persist() creates a missing parent (the store's state/ directory),
        // so block the temporary file instead: a directory in its place.
        let path = dir.path().join("state/rl.json");
        fs::create_dir_all(dir.path().join("state/rl.json.tmp")).unwrap();
        let mut rl = RateLimiter::load(&path, RateLimits::default()).unwrap();
        match rl.record(&keys(&["name:x"]), t(0)) {
            Err(RateLimitError::Write { path: p, .. }) => assert_eq!(p, path),
            other => panic!("expected write error, got {other:?}"),
        }
    }
}
