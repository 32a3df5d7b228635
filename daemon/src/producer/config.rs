//! The data source's config: `DataSourceConfig.legacy_config`, a string we
//! parse ourselves, so an OEM's trace config needs no vitalsd proto:
//!
//! ```text
//! data_sources { config { name: "linux.vitals"
//!     legacy_config: "interval_ms=1000 counters=oncpu,runq_wait,switches,faults prelude_s=60" } }
//! ```
//!
//! `key=value` pairs separated by spaces, tabs, newlines or `;`. Every key
//! is optional; an unknown key, a repeated key or a bad value is an error
//! that names it (the session then gets no vitalsd data, and the error is in
//! the log and in `vitalsctl status`).

use std::time::Duration;

use thiserror::Error;

use crate::process_tracks::CounterKind;

/// `DataSourceConfig.legacy_config` (perfetto_trace.proto).
const LEGACY_CONFIG_FIELD: u32 = 1000;

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// The prelude replays the history ring, which keeps at most this much.
const MAX_PRELUDE: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("DataSourceConfig is not valid protobuf: {0}")]
    Protobuf(String),
    #[error("legacy_config is not UTF-8")]
    NotUtf8,
    #[error("legacy_config: `{0}` is not key=value")]
    NotKeyValue(String),
    #[error("legacy_config: unknown key `{0}` (known: interval_ms, counters, prelude_s)")]
    UnknownKey(String),
    #[error("legacy_config: `{0}` given twice")]
    Repeated(String),
    #[error("legacy_config: {key}={value}: {why}")]
    BadValue {
        key: &'static str,
        value: String,
        why: String,
    },
}

/// What one tracing session asks of the data source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceConfig {
    /// How often the counters are written.
    pub interval: Duration,
    /// Which per-process counters.
    pub counters: Vec<CounterKind>,
    /// How much of the history ring to write when the session starts.
    pub prelude: Duration,
}

impl Default for InstanceConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            counters: CounterKind::ALL.to_vec(),
            prelude: Duration::ZERO,
        }
    }
}

/// The legacy_config string of an encoded DataSourceConfig ("" if absent).
pub fn legacy_config(ds_config: &[u8]) -> Result<String, ConfigError> {
    let mut found = String::new();
    crate::perfetto_sdk::visit_fields(
        ds_config,
        |id, bytes| {
            if id == LEGACY_CONFIG_FIELD {
                found = std::str::from_utf8(bytes)
                    .map_err(|_| ConfigError::NotUtf8)?
                    .to_owned();
            }
            Ok(())
        },
        ConfigError::Protobuf,
    )?;
    Ok(found)
}

/// Parses a legacy_config string.
pub fn parse(text: &str) -> Result<InstanceConfig, ConfigError> {
    let mut cfg = InstanceConfig::default();
    let mut seen: Vec<&str> = Vec::new();
    for item in text
        .split(|c: char| c.is_whitespace() || c == ';')
        .filter(|s| !s.is_empty())
    {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| ConfigError::NotKeyValue(item.to_owned()))?;
        if seen.contains(&key) {
            return Err(ConfigError::Repeated(key.to_owned()));
        }
        seen.push(key);
        match key {
            "interval_ms" => {
                cfg.interval = duration("interval_ms", value, 1, MIN_INTERVAL, MAX_INTERVAL)?
            }
            "prelude_s" => {
                cfg.prelude = duration("prelude_s", value, 1000, Duration::ZERO, MAX_PRELUDE)?
            }
            "counters" => cfg.counters = counters(value)?,
            other => return Err(ConfigError::UnknownKey(other.to_owned())),
        }
    }
    Ok(cfg)
}

fn bad(key: &'static str, value: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::BadValue {
        key,
        value: value.to_owned(),
        why: why.into(),
    }
}

/// `value` in units of `unit_ms`, within [min, max].
fn duration(
    key: &'static str,
    value: &str,
    unit_ms: u64,
    min: Duration,
    max: Duration,
) -> Result<Duration, ConfigError> {
    let n: u64 = value
        .parse()
        .map_err(|_| bad(key, value, "not a whole number"))?;
    let d = Duration::from_millis(n.saturating_mul(unit_ms));
    if d < min || d > max {
        return Err(bad(
            key,
            value,
            format!("must be between {min:?} and {max:?}"),
        ));
    }
    Ok(d)
}

/// A comma-separated list of counter names, or `all`.
fn counters(value: &str) -> Result<Vec<CounterKind>, ConfigError> {
    if value == "all" {
        return Ok(CounterKind::ALL.to_vec());
    }
    let mut kinds = Vec::new();
    for name in value.split(',') {
        let kind = CounterKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                bad(
                    "counters",
                    value,
                    format!(
                        "unknown counter `{name}` (known: oncpu, runq_wait, switches, faults, offcpu, all)"
                    ),
                )
            })?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_is_the_default() {
        assert_eq!(parse("").unwrap(), InstanceConfig::default());
        assert_eq!(parse(" ;\n ").unwrap(), InstanceConfig::default());
    }

    #[test]
    fn every_key_is_read() {
        let c = parse("interval_ms=250; counters=oncpu,faults\nprelude_s=90").unwrap();
        assert_eq!(c.interval, Duration::from_millis(250));
        assert_eq!(c.counters, vec![CounterKind::OnCpu, CounterKind::Faults]);
        assert_eq!(c.prelude, Duration::from_secs(90));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert_eq!(
            parse("interval=5"),
            Err(ConfigError::UnknownKey("interval".into()))
        );
        assert_eq!(
            parse("interval_ms"),
            Err(ConfigError::NotKeyValue("interval_ms".into()))
        );
        assert_eq!(
            parse("prelude_s=1 prelude_s=2"),
            Err(ConfigError::Repeated("prelude_s".into()))
        );
        let e = parse("interval_ms=10").unwrap_err().to_string();
        assert!(e.contains("interval_ms=10") && e.contains("between"), "{e}");
        let e = parse("interval_ms=-1").unwrap_err().to_string();
        assert!(e.contains("not a whole number"), "{e}");
        let e = parse("counters=oncpu,cache_misses")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown counter `cache_misses`"), "{e}");
    }

    #[test]
    fn legacy_config_is_found_among_other_fields() {
        // name=1 "linux.vitals", target_buffer=2 0, legacy_config=1000 "a=b".
        let mut cfg = vec![0x0a, 12];
        cfg.extend_from_slice(b"linux.vitals");
        cfg.extend_from_slice(&[0x10, 0x00]);
        // Tag of field 1000, wire type 2: (1000 << 3) | 2 = 8002 = varint c2 3e.
        cfg.extend_from_slice(&[0xc2, 0x3e, 3]);
        cfg.extend_from_slice(b"a=b");
        assert_eq!(legacy_config(&cfg).unwrap(), "a=b");
        assert_eq!(legacy_config(&cfg[..16]).unwrap(), "");
    }
}
