//! Start-up repair and hostile files: a crashed recording is salvaged,
//! foreign files survive, `heapprofd/` is emptied and counted, and nothing
//! renamed in from `heapprofd/` makes the store follow a link.

use std::{
    os::unix::fs::{symlink, MetadataExt},
    sync::mpsc,
    time::Duration,
};

use super::*;

#[test]
fn interrupted_captures_are_repaired_at_open() {
    let d = tempfile::tempdir().unwrap();
    let kept = {
        let mut s = Store::open(d.path(), LIMITS).unwrap();
        let kept = add(&mut s, "kept", &packets(2, 10));
        // Killed while recording, before a whole packet reached the file.
        let p = s.begin("recording");
        fs::write(&p.tmp_path, &packets(1, 10)[..5]).unwrap();
        // Killed between the trace rename and the metadata: an orphan trace.
        fs::write(d.path().join("123-9-orphan.pftrace"), packets(1, 10)).unwrap();
        // Killed while writing metadata: its temporary.
        fs::write(d.path().join("123-9-orphan.json.tmp"), b"{").unwrap();
        // Metadata whose trace is gone.
        fs::write(
            d.path().join("55-1-ghost.json"),
            serde_json::to_vec(&meta("ghost")).unwrap(),
        )
        .unwrap();
        kept
    };
    let s = Store::open(d.path(), LIMITS).unwrap();
    assert_eq!(s.list(), &[kept]);
    assert_eq!(s.counters.repaired_leftovers, 4);
    assert_eq!(s.counters.salvaged_after_crash, 0);
    assert_eq!(names(d.path()).len(), 3, "{:?}", names(d.path()));
}

#[test]
fn store_a_crash_mid_capture_is_salvaged_as_a_cut_capture() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), LIMITS, &clock);
    let kept = add(&mut s, "kept", &packets(2, 10));
    let p = s.begin("system-cpu-busy");
    // Three whole packets and the start of a fourth, then kill -9.
    let mut bytes = packets(3, 10);
    bytes.extend_from_slice(&packets(1, 10)[..5]);
    fs::write(&p.tmp_path, &bytes).unwrap();
    let (id, tmp) = (p.id.clone(), p.tmp_path.clone());
    drop(s);

    let mut s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(ids(&s), vec![kept.id.clone(), id.clone()]);
    let (m, path) = s.get(&id).unwrap();
    assert_eq!(m.status, EntryStatus::Crashed);
    assert_eq!(m.trace_bytes, 36);
    assert_eq!(m.trigger.rule, "system-cpu-busy");
    assert_eq!(m.created_unix_ms, T0_UNIX_MS);
    assert_eq!(fs::read(&path).unwrap(), packets(3, 10));
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert!(!tmp.exists());
    assert_eq!(s.counters.salvaged_after_crash, 1);
    // It is a capture like any other: listed again at the next start, and
    // ids go on after its sequence number.
    let next = s.begin("x");
    assert!(
        next.id.starts_with(&format!("{T0_UNIX_MS}-3-")),
        "{}",
        next.id
    );
    drop(s);
    let s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(ids(&s), vec![kept.id, id]);
    assert_eq!(s.counters.salvaged_after_crash, 0);
}

#[test]
fn store_repair_leaves_files_it_did_not_write() {
    let d = tempfile::tempdir().unwrap();
    let foreign = [
        "notes.json",
        "notes.pftrace",
        "report.tmp",
        ".hidden.pftrace.tmp",
        "abc-1-x.json",
        "12-3-a.b.json",
        ".lock",
    ];
    for n in foreign {
        fs::write(d.path().join(n), b"{\"id\":\"notes\"}").unwrap();
    }
    fs::create_dir_all(d.path().join("state")).unwrap();
    fs::write(d.path().join("state/heapprofd_ratelimit.json"), b"{}").unwrap();
    let s = Store::open(d.path(), LIMITS).unwrap();
    assert!(s.list().is_empty());
    assert_eq!(s.counters.repaired_leftovers, 0);
    for n in foreign {
        assert!(d.path().join(n).exists(), "{n} was removed");
    }
    assert!(d.path().join("state/heapprofd_ratelimit.json").exists());
}

/// A file outside the store that perfetto's domain must not get us to
/// truncate or chmod.
fn outside_victim(dir: &Path) -> PathBuf {
    let victim = dir.join("victim");
    fs::write(&victim, b"secret: not a trace\n").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
    victim
}

fn assert_untouched(victim: &Path) {
    assert_eq!(fs::read(victim).unwrap(), b"secret: not a trace\n");
    assert_eq!(
        fs::metadata(victim).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// What the service does when a heapprofd session ends: perfetto's output
/// moves from `heapprofd/` to the pending capture's temporary name.
fn plant_and_move(s: &mut Store, plant: impl FnOnce(&Path)) -> Pending {
    let p = s.begin("heap-x");
    fs::create_dir_all(s.heapprofd_dir()).unwrap();
    let out = s.heapprofd_dir().join(format!("{}.pftrace", p.id));
    plant(&out);
    fs::rename(&out, &p.tmp_path).unwrap();
    p
}

#[test]
fn store_commit_never_follows_a_link_planted_in_heapprofd() {
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside_victim(outside.path());
    let mut s = Store::open(d.path(), LIMITS).unwrap();

    let p = plant_and_move(&mut s, |out| symlink(&victim, out).unwrap());
    let tmp = p.tmp_path.clone();
    let e = s.commit(p, meta("manual-heap")).unwrap_err();
    eprintln!("symlink: {e}");
    assert_untouched(&victim);
    assert!(s.list().is_empty());
    assert!(fs::symlink_metadata(&tmp).is_err(), "the link is removed");

    // A hard link (same file system) would be a second name of the victim.
    let p = plant_and_move(&mut s, |out| fs::hard_link(&victim, out).unwrap());
    let e = s.commit(p, meta("manual-heap")).unwrap_err();
    assert!(matches!(e, StoreError::NotRegular(_)), "{e}");
    assert_untouched(&victim);
    assert_eq!(fs::metadata(&victim).unwrap().nlink(), 1);

    // A symlink left under a recording's name is removed at start, not
    // salvaged through.
    let p = s.begin("cpu");
    symlink(&victim, &p.tmp_path).unwrap();
    drop(s);
    let s = Store::open(d.path(), LIMITS).unwrap();
    assert!(s.list().is_empty());
    assert!(fs::symlink_metadata(&p.tmp_path).is_err());
    assert_untouched(&victim);
}

#[test]
fn store_commit_of_a_fifo_fails_instead_of_blocking() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(d.path(), LIMITS).unwrap();
    let p = plant_and_move(&mut s, |out| {
        nix::unistd::mkfifo(out, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = s.commit(p, meta("manual-heap")).map(|_| ());
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("commit blocked on a FIFO");
    assert!(r.unwrap_err().contains("not a regular file"));
}

#[test]
fn store_heapprofd_is_emptied_at_start_and_stale_files_go() {
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside_victim(outside.path());
    let heap = d.path().join(HEAPPROFD_DIR);
    fs::create_dir_all(heap.join("sub")).unwrap();
    fs::write(heap.join("1-1-heap-x.pftrace"), vec![1u8; 100]).unwrap();
    fs::write(heap.join("1-1-heap-x.pftrace.meta.json"), b"{}").unwrap();
    symlink(&victim, heap.join("link")).unwrap();

    let clock = FakeClock::new();
    let mut s = open_at(d.path(), LIMITS, &clock);
    // A crashed daemon's session is over: all of it goes, links unfollowed.
    assert_eq!(names(&heap), vec!["sub"]);
    assert_eq!(s.counters.heapprofd_files_removed, 3);
    assert_untouched(&victim);

    // A session's output is counted, and kept while a session can live,
    // whatever the wall clock does.
    fs::write(heap.join("2-2-heap-y.pftrace"), vec![1u8; 50]).unwrap();
    s.maintain().unwrap();
    assert_eq!(s.heapprofd_bytes(), 50);
    clock.jump_wall(DAY_MS as i64);
    clock.tick(DEFAULT_STALE_AFTER_MS);
    s.maintain().unwrap();
    assert_eq!(names(&heap), vec!["2-2-heap-y.pftrace", "sub"]);
    // Past that, it is stale.
    clock.tick(1);
    s.maintain().unwrap();
    assert_eq!(names(&heap), vec!["sub"]);
    assert_eq!(s.heapprofd_bytes(), 0);
    assert_eq!(s.counters.heapprofd_files_removed, 4);
}

/// Writes `bytes` over capture `id`'s `<id>.json`.
fn overwrite_meta(dir: &Path, id: &str, bytes: &[u8]) {
    fs::write(dir.join(format!("{id}.json")), bytes).unwrap();
}

#[test]
fn store_a_torn_metadata_file_keeps_its_trace_with_rebuilt_metadata() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), LIMITS, &clock);
    let torn = add(&mut s, "system-cpu-busy", &packets(3, 10));
    let big = add(&mut s, "manual", &packets(2, 10));
    let kept = add(&mut s, "kept", &packets(1, 10));
    drop(s);
    // Cut mid-write by a crash of the file system, not of the store.
    overwrite_meta(d.path(), &torn.id, b"{\"id\": \"");
    // Valid JSON, but over the bound: read as torn, never whole.
    let mut padded = vec![b' '; MAX_META_BYTES as usize];
    padded.extend(serde_json::to_vec(&big).unwrap());
    overwrite_meta(d.path(), &big.id, &padded);

    let s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(ids(&s), vec![torn.id.clone(), big.id.clone(), kept.id]);
    for (was, bytes) in [(&torn, packets(3, 10)), (&big, packets(2, 10))] {
        let (m, path) = s.get(&was.id).unwrap();
        assert_eq!(fs::read(&path).unwrap(), bytes, "the trace is untouched");
        assert_eq!(m.status, EntryStatus::Recovered);
        assert_eq!(m.trace_bytes, bytes.len() as u64);
        assert_eq!(m.trigger.rule, was.trigger.rule);
        assert_eq!(m.created_unix_ms, T0_UNIX_MS);
    }
    assert_eq!(s.counters.metadata_recovered, 2);
    assert_eq!(s.counters.repaired_leftovers, 0);
    // Its rebuilt metadata reads at the next start.
    drop(s);
    let s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(s.get(&torn.id).unwrap().0.status, EntryStatus::Recovered);
    assert_eq!(s.counters.metadata_recovered, 0);
}

#[test]
fn store_a_wrong_trace_size_in_metadata_is_checked_against_the_file() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), LIMITS, &clock);
    let all: Vec<EntryMeta> = (0..5)
        .map(|i| add(&mut s, &format!("r{i}"), &packets(2, 100)))
        .collect();
    drop(s);
    let rewrite = |m: &EntryMeta, trace_bytes: u64| {
        let mut v: serde_json::Value =
            serde_json::from_slice(&fs::read(d.path().join(format!("{}.json", m.id))).unwrap())
                .unwrap();
        v["trace_bytes"] = trace_bytes.into();
        overwrite_meta(d.path(), &m.id, &serde_json::to_vec(&v).unwrap());
    };
    rewrite(&all[1], 1 << 40);
    rewrite(&all[3], u64::MAX);

    let mut s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(s.counters.sizes_corrected, 2);
    assert_eq!(s.get(&all[1].id).unwrap().0.trace_bytes, 204);
    assert_eq!(s.total_trace_bytes(), 5 * 204);
    // The next commit evicts nothing: all five still fit the quota.
    let new = add(&mut s, "new", &packets(1, 10));
    let mut want: Vec<String> = all.iter().map(|m| m.id.clone()).collect();
    want.push(new.id);
    assert_eq!(ids(&s), want);
    assert_eq!(s.counters.evicted_over_quota, 0);
    // And the corrected size is what the next start reads.
    drop(s);
    let s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(s.counters.sizes_corrected, 0);
}

#[test]
fn store_a_recording_that_cannot_be_salvaged_now_is_kept_for_a_later_start() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    let mut s = open_at(d.path(), LIMITS, &clock);
    let p = s.begin("system-cpu-busy");
    fs::write(&p.tmp_path, packets(3, 10)).unwrap();
    let (id, tmp) = (p.id.clone(), p.tmp_path.clone());
    drop(s);
    // Its metadata cannot be written (as on a full disk): a directory
    // where its temporary goes.
    let blocker = d.path().join(format!("{id}.json.tmp"));
    fs::create_dir(&blocker).unwrap();

    let s = open_at(d.path(), LIMITS, &clock);
    assert!(s.list().is_empty());
    assert_eq!(s.counters.salvage_deferred, 1);
    assert_eq!(s.counters.repaired_leftovers, 0);
    assert_eq!(fs::read(&tmp).unwrap(), packets(3, 10), "kept as it was");
    drop(s);

    fs::remove_dir(&blocker).unwrap();
    let s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(ids(&s), vec![id.clone()]);
    assert_eq!(s.get(&id).unwrap().0.status, EntryStatus::Crashed);
    assert_eq!(s.counters.salvaged_after_crash, 1);
}
