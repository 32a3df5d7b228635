//! Store tests: commit, listing and the on-disk layout here; eviction
//! (`evict.rs`), clock jumps (`clock.rs`), repair and hostile files
//! (`repair.rs`) beside.

mod clock;
mod evict;
mod repair;

use std::{
    io::{Read, Seek, SeekFrom},
    os::unix::fs::PermissionsExt,
    path::Path,
    sync::{Arc, Mutex},
};

use super::*;

const LIMITS: Limits = Limits {
    quota_bytes: 1 << 20,
    max_captures: 10,
    max_age_ms: 3_600_000,
};

/// 2023-11-14T22:13:20Z.
const T0_UNIX_MS: u64 = 1_700_000_000_000;
const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;

/// A clock the test moves by hand.
#[derive(Debug, Clone)]
struct FakeClock(Arc<Mutex<ClockReading>>);

impl FakeClock {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(ClockReading {
            unix_ms: T0_UNIX_MS,
            boottime_ms: MINUTE_MS,
            boot_id: "boot-1".into(),
        })))
    }

    fn now(&self) -> ClockReading {
        self.0.lock().unwrap().clone()
    }

    /// Time passes: both clocks move.
    fn tick(&self, ms: u64) {
        let mut r = self.0.lock().unwrap();
        r.unix_ms += ms;
        r.boottime_ms += ms;
    }

    /// The wall clock alone is set (forward or back).
    fn jump_wall(&self, delta_ms: i64) {
        let mut r = self.0.lock().unwrap();
        r.unix_ms = r.unix_ms.checked_add_signed(delta_ms).unwrap();
    }

    /// A reboot `off_ms` long, the wall clock then reading `unix_ms`.
    fn reboot(&self, boot_id: &str, unix_ms: u64) {
        let mut r = self.0.lock().unwrap();
        r.boot_id = boot_id.into();
        r.boottime_ms = 10_000;
        r.unix_ms = unix_ms;
    }
}

impl StoreClock for FakeClock {
    fn now(&self) -> ClockReading {
        FakeClock::now(self)
    }
}

fn open_at(dir: &Path, limits: Limits, clock: &FakeClock) -> Store {
    Store::open_with_clock(dir, limits, Box::new(clock.clone())).unwrap()
}

fn meta_at(rule: &str, created_unix_ms: u64) -> EntryMeta {
    EntryMeta {
        id: String::new(),
        created_unix_ms,
        trigger: TriggerInfo {
            rule: rule.into(),
            value: Some(95.0),
            threshold: Some(90.0),
            offender_pid: None,
            offender_name: None,
        },
        duration_ms: 1000,
        trace_bytes: 0,
        status: EntryStatus::Complete,
        heapprofd: None,
        backend: None,
    }
}

fn meta(rule: &str) -> EntryMeta {
    meta_at(rule, now_unix_ms())
}

/// A trace of `n` packets of `size` bytes each.
fn packets(n: usize, size: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(0x0a);
        let mut len = size;
        loop {
            let b = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                v.push(b);
                break;
            }
            v.push(b | 0x80);
        }
        v.extend(std::iter::repeat_n(0x08, size));
    }
    v
}

/// Records `bytes` as a capture for `rule`, created at the store's now.
fn add(store: &mut Store, rule: &str, bytes: &[u8]) -> EntryMeta {
    let p = store.begin(rule);
    fs::write(&p.tmp_path, bytes).unwrap();
    let created = store.clock.now().unix_ms;
    store.commit(p, meta_at(rule, created)).unwrap()
}

fn ids(s: &Store) -> Vec<String> {
    s.list().iter().map(|m| m.id.clone()).collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn commit_lists_with_mode_0640_and_index() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(d.path(), LIMITS).unwrap();
    let m = add(&mut s, "cpu", &packets(3, 10));
    assert_eq!(m.trace_bytes, 36);
    let (_, path) = s.get(&m.id).unwrap();
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let index: Vec<EntryMeta> =
        serde_json::from_slice(&fs::read(d.path().join(INDEX)).unwrap()).unwrap();
    assert_eq!(index, vec![m]);
}

/// `index.json` is a convenience: when only its rewrite fails (a full disk),
/// the capture is still committed and listed, the failure is counted, and
/// upkeep brings the index up to date once it can be written.
#[test]
fn an_index_that_cannot_be_written_costs_no_capture() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(d.path(), LIMITS).unwrap();
    // A directory where the index's temporary file goes: only that write
    // fails, as it would on a disk that filled up after the trace's rename.
    let blocker = d.path().join("index.json.tmp");
    fs::create_dir(&blocker).unwrap();
    let m = add(&mut s, "cpu", &packets(3, 10));
    assert_eq!(ids(&s), vec![m.id.clone()]);
    assert!(d.path().join(format!("{}.json", m.id)).exists());
    assert_eq!(s.counters.index_write_failures, 1);
    assert_eq!(s.counters.write_failures, 0);
    let index: Vec<EntryMeta> =
        serde_json::from_slice(&fs::read(d.path().join(INDEX)).unwrap()).unwrap();
    assert!(
        index.is_empty(),
        "the index written at open, before the capture"
    );

    fs::remove_dir(&blocker).unwrap();
    s.maintain().unwrap();
    let index: Vec<EntryMeta> =
        serde_json::from_slice(&fs::read(d.path().join(INDEX)).unwrap()).unwrap();
    assert_eq!(index, vec![m.clone()]);
    // And a reopened store lists it from `<id>.json` either way.
    drop(s);
    let s = Store::open(d.path(), LIMITS).unwrap();
    assert_eq!(ids(&s), vec![m.id]);
}

#[test]
fn partial_last_packet_is_cut() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(d.path(), LIMITS).unwrap();
    let mut bytes = packets(2, 100);
    bytes.extend_from_slice(&packets(1, 100)[..50]);
    let m = add(&mut s, "cut", &bytes);
    assert_eq!(m.trace_bytes, 204);
    assert_eq!(fs::metadata(s.get(&m.id).unwrap().1).unwrap().len(), 204);
}

#[test]
fn sealed_outside_the_store_then_committed() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(d.path(), LIMITS).unwrap();
    let mut p = s.begin("cpu");
    let mut bytes = packets(2, 100);
    bytes.push(0x0a);
    fs::write(&p.tmp_path, &bytes).unwrap();
    p.seal().unwrap();
    assert_eq!(fs::metadata(&p.tmp_path).unwrap().len(), 204);
    let m = s.commit(p, meta("cpu")).unwrap();
    assert_eq!((m.trace_bytes, m.status), (204, EntryStatus::Complete));
}

#[test]
fn ids_are_checked_and_delete_works() {
    let d = tempfile::tempdir().unwrap();
    let mut s = Store::open(d.path(), LIMITS).unwrap();
    assert!(matches!(s.get("../etc/passwd"), Err(StoreError::BadId(_))));
    assert!(matches!(s.get("nope"), Err(StoreError::NotFound(_))));
    let m = add(&mut s, "x", &packets(1, 10));
    s.delete(&m.id).unwrap();
    assert!(s.list().is_empty());
    assert!(!s.trace_path(&m.id).exists());
}

/// Counts the bytes read through it.
struct Counting<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(pos)
    }
}

#[test]
fn store_scan_reads_packet_headers_not_the_whole_trace() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("t");
    let mut bytes = packets(16, 1 << 20);
    bytes.extend_from_slice(&[0x0a, 0x80]);
    fs::write(&path, &bytes).unwrap();
    let mut r = Counting {
        inner: File::open(&path).unwrap(),
        read: 0,
    };
    let s = packets::scan(&mut r, bytes.len() as u64, u64::MAX).unwrap();
    assert_eq!(s.packets, 16);
    assert_eq!(s.whole_bytes, bytes.len() as u64 - 2);
    assert_eq!(s.stop, packets::Stop::Partial);
    // 16 MiB of trace, a 64 KiB buffer refilled once per packet.
    assert!(r.read <= 2 << 20, "read {} bytes", r.read);
    // And at a limit, the packets that fit.
    let s = packets::scan(&mut r, bytes.len() as u64, 5 << 20).unwrap();
    assert_eq!((s.packets, s.stop), (4, packets::Stop::Limit));
}

#[test]
fn legacy_metadata_without_seq_sorts_first_by_creation_time() {
    let d = tempfile::tempdir().unwrap();
    let clock = FakeClock::new();
    // Two captures of an older vitalsd: no seq, no age basis; their ids'
    // seq parts restarted with each run and say nothing of order.
    for (id, created) in [
        ("1000-1-old-b", T0_UNIX_MS - 2000),
        ("2000-1-old-a", T0_UNIX_MS - 5000),
    ] {
        let mut m = meta_at("old", created);
        m.id = id.into();
        fs::write(
            d.path().join(format!("{id}.json")),
            serde_json::to_vec(&m).unwrap(),
        )
        .unwrap();
        fs::write(d.path().join(format!("{id}.pftrace")), packets(1, 10)).unwrap();
    }
    let mut s = open_at(d.path(), LIMITS, &clock);
    let new = add(&mut s, "new", &packets(1, 10));
    assert_eq!(
        ids(&s),
        vec!["2000-1-old-a", "1000-1-old-b", new.id.as_str()]
    );
    // Ids never reuse a sequence number seen in the directory.
    assert!(
        new.id.starts_with(&format!("{T0_UNIX_MS}-2-")),
        "{}",
        new.id
    );
    let s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(
        ids(&s),
        vec!["2000-1-old-a", "1000-1-old-b", new.id.as_str()]
    );
}

/// `<id>.json` as the daemon wrote it before the status was typed (the
/// text below is that daemon's, field for field): every status text it
/// wrote loads as its variant, and reads back as the same text in the
/// listing `vitalsctl list --json` prints.
#[test]
fn metadata_written_before_typed_statuses_loads() {
    let cases = [
        ("complete", EntryStatus::Complete),
        ("stopped by daemon shutdown", EntryStatus::StoppedByShutdown),
        (
            "cut: reached store.max_capture_bytes (262198 bytes)",
            EntryStatus::CutAtLimit { at_bytes: 262198 },
        ),
        (
            "cut short: writing the trace: No space left on device (os error 28)",
            EntryStatus::CutShort {
                error: "writing the trace: No space left on device (os error 28)".into(),
            },
        ),
        ("cut: daemon crashed", EntryStatus::Crashed),
        (
            "recovered: metadata unreadable, rebuilt from the trace",
            EntryStatus::Recovered,
        ),
        (
            r#"heapprofd: {"kind":"timed_out","killed":false}"#,
            EntryStatus::HeapprofdIncomplete {
                session: r#"{"kind":"timed_out","killed":false}"#.into(),
            },
        ),
        (
            "cut: over the store's per-capture limit of 1250 bytes",
            EntryStatus::CutByStore {
                limit_bytes: 1250,
                before: None,
            },
        ),
        (
            "cut short: disk full; cut: over the store's per-capture limit of 1250 bytes",
            EntryStatus::CutByStore {
                limit_bytes: 1250,
                before: Some(Box::new(EntryStatus::CutShort {
                    error: "disk full".into(),
                })),
            },
        ),
        (
            "a reason a later vitalsd writes",
            EntryStatus::Other("a reason a later vitalsd writes".into()),
        ),
    ];
    let d = tempfile::tempdir().unwrap();
    let trace = packets(1, 10);
    for (i, (text, _)) in cases.iter().enumerate() {
        let id = format!("{T0_UNIX_MS}-{}-cpu", i + 1);
        let json = format!(
            r#"{{
  "id": "{id}",
  "created_unix_ms": {T0_UNIX_MS},
  "trigger": {{
    "rule": "cpu",
    "value": 95.0,
    "threshold": 90.0,
    "offender_pid": 42,
    "offender_name": "spinner"
  }},
  "duration_ms": 1000,
  "trace_bytes": {},
  "status": {},
  "backend": {{
    "name": "ebpf"
  }},
  "seq": {}
}}"#,
            trace.len(),
            serde_json::to_string(text).unwrap(),
            i + 1
        );
        fs::write(d.path().join(format!("{id}.json")), json).unwrap();
        fs::write(d.path().join(format!("{id}.pftrace")), &trace).unwrap();
    }
    let clock = FakeClock::new();
    let s = open_at(d.path(), LIMITS, &clock);
    assert_eq!(s.counters.metadata_recovered, 0, "every file read whole");
    let listed = serde_json::to_value(s.list()).unwrap();
    for (i, (text, status)) in cases.iter().enumerate() {
        let id = format!("{T0_UNIX_MS}-{}-cpu", i + 1);
        assert_eq!(&s.get(&id).unwrap().0.status, status, "{text}");
        assert_eq!(listed[i]["id"], id.as_str());
        assert_eq!(listed[i]["status"], *text, "written back as it was");
    }
}
