//! The capture store on a real file system that fills up (a tmpfs), and
//! start-up repair through the daemon.

use super::*;
use vitals_tests::tmpfs::Tmpfs;
use vitalsd::store::{EntryMeta, EntryStatus, Limits, Store, TriggerInfo};

/// The default quota: far more than the small file systems below hold.
const LIMITS: Limits = Limits {
    quota_bytes: 256 << 20,
    max_captures: 50,
    max_age_ms: 7 * 86_400_000,
};

/// A trace of `n` TracePackets of `size` bytes of payload each.
fn trace(n: usize, size: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(0x0a);
        let mut len = size;
        while len >= 0x80 {
            v.push((len & 0x7f) as u8 | 0x80);
            len >>= 7;
        }
        v.push(len as u8);
        v.extend(std::iter::repeat_n(0x08, size));
    }
    v
}

fn meta(rule: &str) -> EntryMeta {
    EntryMeta {
        id: String::new(),
        created_unix_ms: 0,
        trigger: TriggerInfo {
            rule: rule.into(),
            value: None,
            threshold: None,
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

/// A 2 MiB store under the default 256 MiB quota: each capture of 600 KiB
/// is written whole and kept whole, because the store makes room on the
/// file system for it (older captures are evicted), rather than the disk
/// refusing its writes.
#[test]
fn a_store_on_a_2_mib_file_system_evicts_for_its_free_space() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&dir.path().join("store"), "2m");
    let mut s = Store::open(fs.path(), LIMITS).unwrap();
    assert!(
        s.effective_quota_bytes() <= 2 << 20,
        "{}",
        s.effective_quota_bytes()
    );
    let bytes = trace(6, 100 << 10);
    let mut committed = Vec::new();
    for i in 0..8 {
        let p = s.begin("cpu");
        assert!(
            p.limit_bytes() >= bytes.len() as u64,
            "capture {i}: limit {} under {}",
            p.limit_bytes(),
            bytes.len()
        );
        std::fs::write(&p.tmp_path, &bytes)
            .unwrap_or_else(|e| panic!("capture {i}: the recorder's write failed: {e}"));
        let m = s.commit(p, meta("cpu")).unwrap();
        assert_eq!(m.trace_bytes, bytes.len() as u64, "capture {i} kept whole");
        assert_eq!(m.status, EntryStatus::Complete);
        committed.push(m.id);
    }
    let listed: Vec<String> = s.list().iter().map(|m| m.id.clone()).collect();
    assert!(listed.len() >= 2, "{listed:?}");
    assert_eq!(listed[listed.len() - 2..], committed[committed.len() - 2..]);
    assert!(s.counters.evicted_over_quota >= 5, "{:?}", s.counters);
    assert_eq!(s.counters.write_failures, 0);

    // Another writer fills the file system: upkeep gives back room down to
    // the reserve (5 %) by evicting, never the newest capture.
    let evicted = s.counters.evicted_over_quota;
    let filler = fs.fill("filler");
    s.maintain().unwrap();
    assert_eq!(
        s.counters.evicted_over_quota,
        evicted + 1,
        "{:?}",
        s.counters
    );
    assert_eq!(s.newest().unwrap().id, *committed.last().unwrap());
    let st = nix::sys::statvfs::statvfs(fs.path()).unwrap();
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    assert!(free >= (2 << 20) / 20, "{free} bytes free");
    std::fs::remove_file(filler).unwrap();
}

/// A full disk at start: the crash's recording cannot get its metadata
/// written. It is kept (and counted) for the next start, which salvages it
/// once there is room again.
#[test]
fn a_full_disk_at_start_keeps_the_crash_recording_for_a_later_start() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&dir.path().join("store"), "1m");
    let mut s = Store::open(fs.path(), LIMITS).unwrap();
    let p = s.begin("manual");
    std::fs::write(&p.tmp_path, trace(3, 100 << 10)).unwrap();
    let (id, tmp) = (p.id.clone(), p.tmp_path.clone());
    // kill -9: no commit.
    drop(s);
    let filler = fs.fill("filler");

    let s = Store::open(fs.path(), LIMITS).unwrap();
    assert!(s.list().is_empty());
    assert_eq!(s.counters.salvage_deferred, 1, "{:?}", s.counters);
    assert_eq!(s.counters.repaired_leftovers, 0, "{:?}", s.counters);
    assert_eq!(std::fs::read(&tmp).unwrap(), trace(3, 100 << 10));
    drop(s);

    std::fs::remove_file(filler).unwrap();
    let s = Store::open(fs.path(), LIMITS).unwrap();
    let (m, path) = s.get(&id).unwrap();
    assert_eq!(m.status, EntryStatus::Crashed);
    assert_eq!(std::fs::read(path).unwrap(), trace(3, 100 << 10));
    assert_eq!(s.counters.salvaged_after_crash, 1);
}

/// 20000 leftovers at start are all removed and counted, in a few log
/// lines, not one a file.
#[test]
fn start_up_repair_of_many_leftovers_logs_a_count_not_a_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    const LEFTOVERS: usize = 20_000;
    for i in 0..LEFTOVERS {
        std::fs::write(store.join(format!("1700000000000-{i}-x.json.tmp")), b"{").unwrap();
    }
    std::fs::write(dir.path().join("vitalsd.toml"), config(dir.path(), "")).unwrap();
    let mut d = Daemon {
        child: None,
        dir,
        envs: Vec::new(),
    };
    d.spawn();
    let st = d.call(&Request::Status {});
    assert_eq!(
        st["store"]["counters"]["repaired_leftovers"], LEFTOVERS,
        "{st}"
    );
    let log = d.log();
    let named = log.matches("removing leftover").count();
    assert!(named <= 10, "{named} lines name a leftover");
    assert!(
        log.contains(&format!("{LEFTOVERS} files in all")),
        "no summary line:\n{}",
        &log[..log.len().min(4000)]
    );
    let left = std::fs::read_dir(d.store())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".json.tmp")
        })
        .count();
    assert_eq!(left, 0);
    d.stop();
}

/// A 300 MB `<id>.json` at start is read no further than the metadata
/// bound: the daemon's peak RSS (the kernel's VmHWM) stays far below the
/// file's size, and the trace beside it is kept, its metadata rebuilt.
#[test]
fn a_huge_metadata_file_at_start_is_not_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let id = "1700000000000-1-manual";
    std::fs::write(store.join(format!("{id}.pftrace")), trace(3, 10)).unwrap();
    // Sparse: costs no disk.
    let f = std::fs::File::create(store.join(format!("{id}.json"))).unwrap();
    f.set_len(300 << 20).unwrap();
    drop(f);
    std::fs::write(dir.path().join("vitalsd.toml"), config(dir.path(), "")).unwrap();
    let mut d = Daemon {
        child: None,
        dir,
        envs: Vec::new(),
    };
    d.spawn();
    let list = d.list();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["id"], id);
    assert_eq!(list[0]["trace_bytes"], trace(3, 10).len());
    let m: EntryMeta = serde_json::from_value(list[0].clone()).unwrap();
    assert_eq!(m.status, EntryStatus::Recovered, "{list:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    let hwm_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(hwm_kb < 150 << 10, "peak RSS {hwm_kb} kB");
    d.stop();
}
