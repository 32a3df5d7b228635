use super::*;

#[test]
fn same_reused_new_and_swept() {
    let mut t = InstanceTable::default();
    assert!(matches!(t.observe(7, 100, 1, "a").0, Prior::New));
    assert!(matches!(
        t.observe(7, 100, 2, "b").0,
        Prior::Same(Instance { value: "a", .. })
    ));
    // Same pid, another starttime: the old instance is handed back.
    let (prior, now) = t.observe(7, 300, 3, "c");
    assert!(matches!(
        prior,
        Prior::Reused(Instance {
            starttime_ticks: 100,
            value: "b",
            ..
        })
    ));
    assert_eq!(now.starttime_ticks, 300);
    t.observe(8, 5, 3, "d");
    // Gen 4 sees 7 only; 8 unreadable is kept, without a baseline.
    t.observe(7, 300, 4, "e");
    t.mark_unreadable(8, 4);
    let mut gone = Vec::new();
    t.sweep(4, |pid, e| gone.push((pid, e.value)));
    assert!(gone.is_empty());
    let (prior, _) = t.observe(8, 5, 5, "f");
    assert!(matches!(
        prior,
        Prior::Same(Instance {
            baseline_valid: false,
            ..
        })
    ));
    // Gen 6 sees 8 only: 7 exited.
    t.observe(8, 5, 6, "g");
    t.sweep(6, |pid, e| gone.push((pid, e.value)));
    assert_eq!(gone, vec![(7, "e")]);
}
