//! Clock jumps: nothing is expired or evicted wrongly when the wall clock
//! jumps a day forward or back, on the same boot or across reboots.

use super::*;

fn limits() -> Limits {
    Limits {
        quota_bytes: 3100,
        max_captures: 10,
        max_age_ms: HOUR_MS,
    }
}

fn one() -> Vec<u8> {
    packets(1, 1000)
}

#[test]
fn store_wall_clock_jumps_on_the_same_boot_expire_and_misorder_nothing() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), limits(), &clock);
    let a = add(&mut s, "a", &one());
    clock.tick(MINUTE_MS);
    let b = add(&mut s, "b", &one());
    clock.tick(MINUTE_MS);

    // NTP sets the clock a day forward: nothing is a day old.
    clock.jump_wall(DAY_MS as i64);
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone()]);
    assert_eq!(s.counters.expired, 0);
    assert!(s.counters.clock_jumps >= 1);

    // Then two days back: a day before a was made.
    clock.tick(MINUTE_MS);
    clock.jump_wall(-2 * DAY_MS as i64);
    s.maintain().unwrap();
    let c = add(&mut s, "c", &one());
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone(), c.id.clone()]);

    // A restart on the same boot: c, made last, is still the newest
    // although its wall time is the oldest; the quota takes a.
    drop(s);
    let mut s = open_at(d.path(), limits(), &clock);
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone(), c.id.clone()]);
    let dd = add(&mut s, "d", &one());
    assert_eq!(ids(&s), vec![b.id.clone(), c.id.clone(), dd.id.clone()]);
    assert_eq!(s.counters.expired, 0);

    // Ages still count, on CLOCK_BOOTTIME: b turns one hour old first.
    clock.tick(HOUR_MS - 2 * MINUTE_MS);
    s.maintain().unwrap();
    assert_eq!(ids(&s).len(), 3);
    clock.tick(MINUTE_MS + 1);
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![c.id.clone(), dd.id.clone()]);
    assert_eq!(s.counters.expired, 1);
}

#[test]
fn store_a_jump_after_a_reboot_restarts_ages_instead_of_expiring() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), limits(), &clock);
    let a = add(&mut s, "a", &one());
    clock.tick(MINUTE_MS);
    let b = add(&mut s, "b", &one());
    drop(s);

    // Ten minutes off; CLOCK_BOOTTIME restarts, only the wall clock spans it.
    clock.reboot("boot-2", clock.now().unix_ms + 10 * MINUTE_MS);
    let mut s = open_at(d.path(), limits(), &clock);
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone()]);

    // A day forward while running: wall-clock ages of the other boot's
    // captures are now unknowable; they restart instead of expiring.
    clock.jump_wall(DAY_MS as i64);
    clock.tick(MINUTE_MS);
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone()]);
    assert_eq!((s.counters.expired, s.counters.age_restarts), (0, 2));

    // Persisted: a restart of the daemon on this boot keeps the new ages.
    drop(s);
    let mut s = open_at(d.path(), limits(), &clock);
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone()]);
    clock.tick(HOUR_MS - 2 * MINUTE_MS);
    s.maintain().unwrap();
    assert_eq!(ids(&s).len(), 2);
    clock.tick(3 * MINUTE_MS);
    s.maintain().unwrap();
    assert!(s.list().is_empty());
    assert_eq!(s.counters.expired, 2);
}

#[test]
fn store_an_rtc_reset_then_a_time_sync_expires_nothing() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), limits(), &clock);
    let a = add(&mut s, "a", &one());
    drop(s);

    // The RTC was reset: the wall clock reads 1970-01-02, before a.
    clock.reboot("boot-2", DAY_MS);
    let mut s = open_at(d.path(), limits(), &clock);
    s.maintain().unwrap();
    // b is made while the clock is wrong.
    let b = add(&mut s, "b", &one());
    // Time sync: the wall clock jumps 54 years forward, to T0 + 1 day.
    clock.jump_wall(T0_UNIX_MS as i64);
    clock.tick(MINUTE_MS);
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone()]);
    assert_eq!(s.counters.expired, 0);
    drop(s);

    // Next boot, twenty minutes later, with a right clock: the wall stamps
    // were corrected at the sync, so both are twenty-odd minutes old.
    clock.reboot("boot-3", clock.now().unix_ms + 20 * MINUTE_MS);
    let mut s = open_at(d.path(), limits(), &clock);
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone()]);
    assert_eq!(s.counters.age_restarts, 0, "trusted, not restarted");
    clock.tick(HOUR_MS - 20 * MINUTE_MS);
    s.maintain().unwrap();
    assert!(s.list().is_empty(), "an hour after the sync both are due");
    assert_eq!(s.counters.expired, 2);
}

#[test]
fn store_a_jump_seen_by_a_capture_of_this_boot_restarts_other_boots_ages() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), limits(), &clock);
    let a = add(&mut s, "a", &one());
    drop(s);
    clock.reboot("boot-2", T0_UNIX_MS + 10 * MINUTE_MS);
    let mut s = open_at(d.path(), limits(), &clock);
    let b = add(&mut s, "b", &one());
    drop(s);
    // The clock jumps a day forward while the daemon is down: only b,
    // stamped on both clocks this boot, can tell.
    clock.jump_wall(DAY_MS as i64);
    clock.tick(MINUTE_MS);
    let mut s = open_at(d.path(), limits(), &clock);
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![a.id.clone(), b.id.clone()]);
    assert_eq!(s.counters.age_restarts, 1);
}

#[test]
fn store_without_a_jump_ages_still_expire() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), limits(), &clock);
    add(&mut s, "a", &one());
    drop(s);
    // Across a reboot, on the wall clock.
    clock.reboot("boot-2", T0_UNIX_MS + 2 * HOUR_MS);
    let mut s = open_at(d.path(), limits(), &clock);
    let b = add(&mut s, "b", &one());
    assert_eq!(ids(&s), vec![b.id.clone()]);
    assert_eq!(s.counters.expired, 1);
    // On the same boot, on CLOCK_BOOTTIME.
    clock.tick(HOUR_MS + 1);
    s.maintain().unwrap();
    assert!(s.list().is_empty());
}
