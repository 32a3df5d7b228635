//! How often a process's BPF programs ran, from the kernel alone: the
//! program fds it holds (/proc/<pid>/fd), each one's run count from its
//! fdinfo (kept while run statistics are on), names by program id
//! (BPF_PROG_GET_NEXT_ID + BPF_OBJ_GET_INFO_BY_FD, through aya).

use std::{
    collections::HashMap,
    os::fd::{FromRawFd, OwnedFd},
};

/// BPF run statistics switched on (BPF_ENABLE_STATS) while this is held:
/// the kernel refcounts the fd, so other users' setting is left alone and
/// nothing stays on after a panic.
pub struct StatsEnabled(#[allow(dead_code)] OwnedFd);

impl StatsEnabled {
    pub fn enable() -> Self {
        const BPF_ENABLE_STATS: libc::c_long = 32;
        // union bpf_attr { struct { __u32 type; } enable_stats; }, with
        // type BPF_STATS_RUN_TIME (0) and the tail zeroed.
        let attr = [0u32; 2];
        // SAFETY: bpf(2) reads `size_of_val(&attr)` bytes of `attr`.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                attr.as_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        assert!(
            fd >= 0,
            "BPF_ENABLE_STATS: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a new fd the kernel just returned to us.
        Self(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }
}

/// One loaded program a process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgRuns {
    pub id: u32,
    /// The kernel's copy of the name (at most 15 bytes).
    pub name: String,
    /// Runs counted while statistics were on.
    pub run_cnt: u64,
    /// enum bpf_prog_type (5 tracepoint, 26 tracing: tp_btf).
    pub prog_type: u32,
    /// Runs the kernel skipped (a classic tracepoint program while
    /// bpf_prog_active was raised on its CPU); 0 before Linux 5.12.
    pub recursion_misses: u64,
}

pub const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;
pub const BPF_PROG_TYPE_TRACING: u32 = 26;

/// Every BPF program `pid` holds an fd of, once per program.
pub fn programs_of(pid: i32) -> Vec<ProgRuns> {
    let names: HashMap<u32, String> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| (p.id(), p.name_as_str().unwrap_or("").to_owned()))
        .collect();
    let mut out: Vec<ProgRuns> = Vec::new();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("listing the fds");
    for fd in fds.filter_map(Result::ok) {
        let is_prog = std::fs::read_link(fd.path())
            .is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf-prog");
        let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
        let Some(fields) = is_prog
            .then(|| std::fs::read_to_string(info).ok())
            .flatten()
            .map(|s| fdinfo_fields(&s))
        else {
            continue;
        };
        let id = fields["prog_id"] as u32;
        if out.iter().all(|p| p.id != id) {
            out.push(ProgRuns {
                id,
                name: names.get(&id).cloned().unwrap_or_default(),
                run_cnt: fields.get("run_cnt").copied().unwrap_or(0),
                prog_type: fields.get("prog_type").copied().unwrap_or(0) as u32,
                recursion_misses: fields.get("recursion_misses").copied().unwrap_or(0),
            });
        }
    }
    out
}

/// One BPF map a process holds an fd of, as its fdinfo says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapInfo {
    pub id: u32,
    /// The kernel's copy of the name (at most 15 bytes).
    pub name: String,
    /// enum bpf_map_type (27 ring buffer, 7 stack trace, ...).
    pub map_type: u32,
    pub max_entries: u64,
    /// The kernel memory it charges, in bytes.
    pub memlock: u64,
}

pub const BPF_MAP_TYPE_STACK_TRACE: u32 = 7;
pub const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
pub const BPF_MAP_TYPE_RINGBUF: u32 = 27;

/// Every BPF map `pid` holds an fd of, once per map.
pub fn maps_of(pid: i32) -> Vec<MapInfo> {
    let names: HashMap<u32, String> = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .map(|m| (m.id(), m.name_as_str().unwrap_or("").to_owned()))
        .collect();
    let mut out: Vec<MapInfo> = Vec::new();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("listing the fds");
    for fd in fds.filter_map(Result::ok) {
        let is_map = std::fs::read_link(fd.path())
            .is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf-map");
        let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
        let Some(f) = is_map
            .then(|| std::fs::read_to_string(info).ok())
            .flatten()
            .map(|s| fdinfo_fields(&s))
        else {
            continue;
        };
        let id = f["map_id"] as u32;
        if out.iter().all(|m| m.id != id) {
            out.push(MapInfo {
                id,
                name: names.get(&id).cloned().unwrap_or_default(),
                map_type: f["map_type"] as u32,
                max_entries: f["max_entries"],
                memlock: f.get("memlock").copied().unwrap_or(0),
            });
        }
    }
    out
}

/// The numeric `key:\tvalue` lines of an fdinfo file.
fn fdinfo_fields(s: &str) -> HashMap<String, u64> {
    s.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The programs that ran between the two listings, with their runs in
/// between; one loaded in between counts all its runs.
pub fn ran_between(before: &[ProgRuns], after: &[ProgRuns]) -> Vec<ProgRuns> {
    after
        .iter()
        .filter_map(|a| {
            let earlier = before
                .iter()
                .find(|b| b.id == a.id)
                .map_or(0, |b| b.run_cnt);
            (a.run_cnt > earlier).then(|| ProgRuns {
                run_cnt: a.run_cnt - earlier,
                ..a.clone()
            })
        })
        .collect()
}

/// The id of the BTF object a loaded map or program (`kind` "map" or
/// "prog") was created with, as `bpftool {kind} show id <id>` reports it;
/// 0 for none.
pub fn btf_id_of(kind: &str, id: u32) -> u32 {
    let out = std::process::Command::new("bpftool")
        .args([kind, "show", "id", &id.to_string(), "--json"])
        .output()
        .expect("running bpftool (cargo xtask setup installs it)");
    assert!(out.status.success(), "bpftool {kind} show id {id}: {out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool's json");
    v["btf_id"].as_u64().unwrap_or(0) as u32
}
