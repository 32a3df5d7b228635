//! Log lines a peer can cause, throttled: at most one per key (a refused
//! uid, accept failing) per period, saying how many were held back, so a
//! connect storm costs the log one line a minute, not one per connection.
//! The events themselves are counted in status whether logged or not.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

/// One line per key per this.
pub const LOG_PERIOD: Duration = Duration::from_secs(60);
/// Keys remembered at once; past it, lines for new keys are held back
/// until a period has passed (a peer cannot grow the map).
const MAX_KEYS: usize = 256;

#[derive(Debug, Default)]
pub struct LogThrottle {
    last: Mutex<HashMap<String, (Instant, u64)>>,
    /// Lines held back, over all keys (status: `log_lines_suppressed`).
    pub suppressed: AtomicU64,
}

impl LogThrottle {
    /// `Some(n)` when a line for `key` may be logged now, `n` being how
    /// many were held back since its last line; None to hold it back.
    pub fn allow(&self, key: &str, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap();
        if let Some((at, held)) = last.get_mut(key) {
            if now.duration_since(*at) < LOG_PERIOD {
                *held += 1;
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let n = std::mem::take(held);
            *at = now;
            return Some(n);
        }
        if last.len() >= MAX_KEYS {
            last.retain(|_, (at, _)| now.duration_since(*at) < LOG_PERIOD);
            if last.len() >= MAX_KEYS {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        last.insert(key.to_owned(), (now, 0));
        Some(0)
    }

    /// Logs `line` at warn level unless held back, with the held-back count.
    pub fn warn(&self, key: &str, line: impl FnOnce() -> String) {
        if let Some(held) = self.allow(key, Instant::now()) {
            if held > 0 {
                log::warn!("{} ({held} more like it not logged)", line());
            } else {
                log::warn!("{}", line());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_and_period_with_the_held_back_count() {
        let t = LogThrottle::default();
        let t0 = Instant::now();
        assert_eq!(t.allow("uid 5", t0), Some(0));
        for _ in 0..1000 {
            assert_eq!(t.allow("uid 5", t0 + Duration::from_secs(1)), None);
        }
        // Another key has its own line.
        assert_eq!(t.allow("uid 6", t0), Some(0));
        assert_eq!(t.allow("uid 5", t0 + LOG_PERIOD), Some(1000));
        assert_eq!(t.suppressed.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn new_keys_cannot_grow_the_map() {
        let t = LogThrottle::default();
        let t0 = Instant::now();
        for k in 0..MAX_KEYS {
            assert!(t.allow(&k.to_string(), t0).is_some());
        }
        assert_eq!(t.allow("one too many", t0), None);
        assert_eq!(t.last.lock().unwrap().len(), MAX_KEYS);
        // Once the period is over, old keys make room.
        assert_eq!(t.allow("one too many", t0 + LOG_PERIOD), Some(0));
    }
}
