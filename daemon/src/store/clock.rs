//! How old a capture is, in a way that survives wall-clock jumps.
//!
//! The wall clock (CLOCK_REALTIME) jumps: phones often boot with a reset RTC
//! and jump forward by years at the first NTP or network time sync, and a
//! user can set it back. CLOCK_BOOTTIME never jumps and counts through
//! suspend, but restarts at each boot. So each capture records both, with
//! the boot id (`/proc/sys/kernel/random/boot_id`), at creation
//! ([`AgeBasis`]):
//! - on the same boot, its age is the CLOCK_BOOTTIME delta: exact;
//! - across a reboot only the wall clock spans the gap, so the age is the
//!   wall-clock delta, unless the wall clock is caught jumping. A jump is seen
//!   when, since the store's previous look, the wall clock moved more than
//!   CLOCK_BOOTTIME did, give or take a tolerance
//!   ([`JumpWatch`]); when a capture of this boot disagrees the same way
//!   (its wall stamp is then corrected, the age being known); or when the
//!   wall clock reads before a capture's creation or before 2020 (an RTC
//!   reset). Then the wall-clock age of the other boots' captures cannot be
//!   trusted, and their age restarts at the moment the jump was seen
//!   (persisted, `age_restarted`): they are kept up to `max_age` longer than
//!   they should, never dropped early.
//!
//! A jump that neither the running store nor a capture of the current boot
//! witnessed (one during a reboot, with no capture since) is invisible: the
//! wall clock is then trusted for the other boots' captures.
//!
//! The clock is injectable ([`StoreClock`]) so tests can jump it.

use std::fmt;

use super::meta::AgeBasis;

/// One reading of the clocks the store uses, taken together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockReading {
    pub unix_ms: u64,
    pub boottime_ms: u64,
    /// Empty when unknown.
    pub boot_id: String,
}

/// Where the store reads time from.
pub trait StoreClock: Send + fmt::Debug {
    fn now(&self) -> ClockReading;
}

/// The system's clocks.
#[derive(Debug, Clone)]
pub struct SystemClock {
    boot_id: String,
}

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

impl SystemClock {
    /// Reads the boot id once (it cannot change while we run).
    pub fn new() -> Self {
        let boot_id = match std::fs::read_to_string(BOOT_ID) {
            Ok(s) => s.trim().to_owned(),
            Err(e) => {
                log::warn!("store: reading {BOOT_ID}: {e}; capture ages use the wall clock only");
                String::new()
            }
        };
        Self { boot_id }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreClock for SystemClock {
    fn now(&self) -> ClockReading {
        ClockReading {
            unix_ms: super::now_unix_ms(),
            boottime_ms: crate::clock::boottime_ns() / 1_000_000,
            boot_id: self.boot_id.clone(),
        }
    }
}

impl AgeBasis {
    /// A basis at `now`.
    pub fn at(now: &ClockReading) -> Self {
        Self {
            unix_ms: now.unix_ms,
            boot_id: now.boot_id.clone(),
            boottime_ms: now.boottime_ms,
        }
    }

    /// Taken on the boot `now` belongs to (so CLOCK_BOOTTIME spans it).
    fn same_boot(&self, now: &ClockReading) -> bool {
        !self.boot_id.is_empty()
            && self.boot_id == now.boot_id
            && self.boottime_ms <= now.boottime_ms
    }
}

/// 2020-01-01T00:00:00Z. A wall clock before it is an RTC reset, not a time.
pub const PLAUSIBLE_UNIX_MS: u64 = 1_577_836_800_000;

/// How far the wall clock may drift from CLOCK_BOOTTIME over `elapsed_ms`
/// before it counts as a jump: NTP slews at most 500 ppm, so 1 % plus two
/// minutes is far above any slew and far below the jumps that matter.
fn tolerance_ms(elapsed_ms: u64) -> u64 {
    120_000 + elapsed_ms / 100
}

/// Whether the wall clock moved by `wall_ms` while CLOCK_BOOTTIME moved by
/// `boot_ms`, beyond the tolerance.
fn disagree(wall_ms: i128, boot_ms: u64) -> bool {
    (wall_ms - i128::from(boot_ms)).unsigned_abs() > u128::from(tolerance_ms(boot_ms))
}

/// Watches the wall clock against CLOCK_BOOTTIME between two looks.
#[derive(Debug, Default)]
pub struct JumpWatch {
    last: Option<ClockReading>,
}

impl JumpWatch {
    /// True when the wall clock jumped since the previous call.
    pub fn observe(&mut self, now: &ClockReading) -> bool {
        let jumped = match &self.last {
            Some(l) if l.boot_id == now.boot_id && l.boottime_ms <= now.boottime_ms => disagree(
                i128::from(now.unix_ms) - i128::from(l.unix_ms),
                now.boottime_ms - l.boottime_ms,
            ),
            _ => false,
        };
        self.last = Some(now.clone());
        jumped
    }
}

/// What one capture's basis says about the clocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Consistent; the age is trusted.
    Fine,
    /// Same boot, but the wall clock jumped since the basis was taken: the
    /// basis with its wall stamp corrected (the age is still exact).
    Corrected(AgeBasis),
    /// Another boot, and the wall clock reads before the basis or before
    /// 2020: the age is unknowable.
    Unknowable,
}

/// Checks `basis` against `now`.
pub fn check(basis: &AgeBasis, now: &ClockReading) -> Check {
    if basis.same_boot(now) {
        let boot_age = now.boottime_ms - basis.boottime_ms;
        let wall_age = i128::from(now.unix_ms) - i128::from(basis.unix_ms);
        if disagree(wall_age, boot_age) {
            return Check::Corrected(AgeBasis {
                unix_ms: now.unix_ms.saturating_sub(boot_age),
                ..basis.clone()
            });
        }
        return Check::Fine;
    }
    if now.unix_ms < PLAUSIBLE_UNIX_MS
        || basis.unix_ms < PLAUSIBLE_UNIX_MS
        || now.unix_ms < basis.unix_ms
    {
        return Check::Unknowable;
    }
    Check::Fine
}

/// Whether `basis` is from another boot (its age then rests on the wall
/// clock).
pub fn other_boot(basis: &AgeBasis, now: &ClockReading) -> bool {
    !basis.same_boot(now)
}

/// The age of a basis [`check`] found [`Check::Fine`].
pub fn age_ms(basis: &AgeBasis, now: &ClockReading) -> u64 {
    if basis.same_boot(now) {
        now.boottime_ms - basis.boottime_ms
    } else {
        now.unix_ms.saturating_sub(basis.unix_ms)
    }
}
