//! Eviction: oldest first by sequence number, only as much as needed, never
//! the whole store for one capture, manual captures make room from manual
//! ones first.

use super::*;

#[test]
fn quota_evicts_oldest_first_and_only_what_is_needed() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(
        d.path(),
        Limits {
            quota_bytes: 2500,
            ..LIMITS
        },
    )
    .unwrap();
    let a = add(&mut s, "a", &packets(1, 1000));
    let b = add(&mut s, "b", &packets(1, 1000));
    let c = add(&mut s, "c", &packets(1, 1000));
    assert_eq!(ids(&s), vec![b.id.clone(), c.id.clone()]);
    assert!(!s.trace_path(&a.id).exists() && !s.meta_path(&a.id).exists());
    assert_eq!(s.counters.evicted_over_quota, 1);
}

#[test]
fn store_one_capture_over_half_the_quota_is_cut_and_never_empties_the_store() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(
        d.path(),
        Limits {
            quota_bytes: 2500,
            ..LIMITS
        },
    )
    .unwrap();
    assert_eq!(s.max_capture_bytes(), 1250);
    let a = add(&mut s, "a", &packets(1, 1000));
    let b = add(&mut s, "b", &packets(1, 1000));
    // 20 packets of 102 bytes: 2040 bytes, more than half the quota.
    let big = add(&mut s, "big", &packets(20, 100));
    assert_eq!(
        big.trace_bytes,
        12 * 102,
        "cut at the last whole packet under 1250"
    );
    assert_eq!(
        big.status,
        EntryStatus::CutByStore {
            limit_bytes: 1250,
            before: None
        }
    );
    assert_eq!(s.counters.cut_at_limit, 1);
    assert_eq!(fs::metadata(s.get(&big.id).unwrap().1).unwrap().len(), 1224);
    // Only the oldest went; the newest other capture survives.
    assert_eq!(ids(&s), vec![b.id.clone(), big.id.clone()]);
    assert!(!s.trace_path(&a.id).exists());
    assert_eq!(s.counters.evicted_over_quota, 1);

    // A capture whose first packet is already over the limit is refused,
    // and costs nothing.
    let p = s.begin("huge");
    let tmp = p.tmp_path.clone();
    fs::write(&tmp, packets(1, 4000)).unwrap();
    let e = s.commit(p, meta("huge")).unwrap_err();
    assert!(matches!(e, StoreError::TooLarge { .. }), "{e}");
    assert_eq!(ids(&s), vec![b.id.clone(), big.id.clone()]);
    assert!(!tmp.exists());

    // A lower per-capture limit applies to what is recorded afterwards.
    s.set_max_capture_bytes(Some(500));
    let p = s.begin("small");
    assert_eq!(p.limit_bytes(), 500);
    fs::write(&p.tmp_path, packets(10, 100)).unwrap();
    let m = s.commit(p, meta("small")).unwrap();
    assert_eq!(m.trace_bytes, 4 * 102);
}

#[test]
fn store_a_manual_capture_evicts_manual_ones_before_rule_triggered_ones() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(
        d.path(),
        Limits {
            quota_bytes: 3100,
            ..LIMITS
        },
    )
    .unwrap();
    let one = packets(1, 1000);
    let r1 = add(&mut s, "cpu", &one);
    let m1 = add(&mut s, "manual", &one);
    let r2 = add(&mut s, "psi", &one);
    // Full. A manual capture takes the older manual one's room, not r1's.
    let m2 = add(&mut s, "manual", &one);
    assert_eq!(ids(&s), vec![r1.id.clone(), r2.id.clone(), m2.id.clone()]);
    // Again: the newest manual one goes too before any rule's evidence.
    let m3 = add(&mut s, "manual-heap", &one);
    assert_eq!(ids(&s), vec![r1.id.clone(), r2.id.clone(), m3.id.clone()]);
    assert_eq!(s.counters.evicted_over_quota, 2);
    // A rule-triggered capture evicts oldest first, whatever its kind.
    let r3 = add(&mut s, "cpu", &one);
    assert_eq!(ids(&s), vec![r2.id.clone(), m3.id.clone(), r3.id.clone()]);
    // No manual capture left to take: the oldest rule-triggered one goes,
    // never the newest (rule-triggered) one.
    let _ = m1;
    let d2 = tempfile::tempdir().unwrap();
    let mut s2 = Store::open(
        d2.path(),
        Limits {
            quota_bytes: 2100,
            ..LIMITS
        },
    )
    .unwrap();
    let a = add(&mut s2, "cpu", &one);
    let b = add(&mut s2, "cpu", &one);
    let m = add(&mut s2, "manual", &one);
    assert_eq!(ids(&s2), vec![b.id.clone(), m.id.clone()]);
    assert!(!s2.trace_path(&a.id).exists());
}

#[test]
fn store_count_limit_prefers_manual_captures_for_a_manual_one() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(
        d.path(),
        Limits {
            max_captures: 3,
            ..LIMITS
        },
    )
    .unwrap();
    let small = packets(1, 10);
    let r1 = add(&mut s, "cpu", &small);
    let _m1 = add(&mut s, "manual", &small);
    let r2 = add(&mut s, "cpu", &small);
    let m2 = add(&mut s, "manual", &small);
    assert_eq!(ids(&s), vec![r1.id, r2.id, m2.id]);
    assert_eq!(s.counters.evicted_over_count, 1);
    // max_captures = 1 is a hard limit: the other one goes.
    s.set_limits(Limits {
        max_captures: 1,
        ..LIMITS
    });
    let last = add(&mut s, "cpu", &small);
    assert_eq!(ids(&s), vec![last.id]);
}

#[test]
fn heapprofd_output_counts_in_the_quota() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(
        d.path(),
        Limits {
            quota_bytes: 3100,
            ..LIMITS
        },
        &clock,
    );
    let a = add(&mut s, "a", &packets(1, 1000));
    let b = add(&mut s, "b", &packets(1, 1000));
    // A session in flight writes 1200 bytes: a capture of 1003 no longer
    // fits beside a and b.
    fs::create_dir_all(s.heapprofd_dir()).unwrap();
    fs::write(s.heapprofd_dir().join("x.pftrace"), vec![0u8; 1200]).unwrap();
    let c = add(&mut s, "c", &packets(1, 1000));
    assert_eq!(s.heapprofd_bytes(), 1200);
    assert_eq!(ids(&s), vec![b.id.clone(), c.id.clone()]);
    assert!(!s.trace_path(&a.id).exists());
    // It never takes the protected newest capture: over quota it waits.
    fs::write(s.heapprofd_dir().join("y.pftrace"), vec![0u8; 3000]).unwrap();
    s.maintain().unwrap();
    assert_eq!(ids(&s), vec![c.id.clone()]);
}
