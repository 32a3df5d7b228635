//! What the `*_btf` scheduler programs need from the kernel's BTF
//! (/sys/kernel/btf/vmlinux): a few `struct task_struct` field offsets and
//! the argument lists of the raw tracepoints they attach to.
//!
//! Read in passes over the file (`types`), never whole nor as a type
//! graph: the daemon's start-up peak is what a phone's low-memory killer
//! sees, and vmlinux BTF is 5+ MiB of over 100k types; the format is stable
//! and tiny to walk. The tp_btf programs' attach targets are handed to aya
//! as a sparse blob of their own (`KernelBtf::attach_targets_btf`).

use std::{
    collections::HashMap,
    io::{Read, Seek},
    path::{Path, PathBuf},
};

mod types;

use types::{Types, BTF_MAGIC, KIND_PTR, KIND_STRUCT, KIND_TYPEDEF};

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Malformed { path: PathBuf, what: String },
    #[error("{path}: no {what}")]
    Missing { path: PathBuf, what: String },
    /// A raw tracepoint's argument list is none the programs read, or its
    /// typedef is absent.
    #[error("{path}: no {what}")]
    Prototype { path: PathBuf, what: String },
}

/// Byte offsets in `struct task_struct`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStructOffsets {
    pub pid: u32,
    pub tgid: u32,
    pub prio: u32,
    pub comm: u32,
    pub exit_state: u32,
    /// `se.sum_exec_runtime`: the CPU time the scheduler charged the task.
    pub sum_exec_runtime: u32,
    /// `sched_info.run_delay`: the task's runqueue wait as schedstat
    /// reports it; None without CONFIG_SCHED_INFO (no `sched_info` member).
    pub run_delay: Option<u32>,
    /// `__state` (5.14+), or `state` (a `long`) before: what the pre-5.18
    /// sched_switch program reads prev's state from.
    pub state: Option<u32>,
}

/// The argument lists of `btf_trace_sched_switch` the programs can read,
/// named by where prev's state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchPrototype {
    /// Since Linux 5.18: `(void *, bool preempt, prev, next, unsigned int
    /// prev_state)`, the state __schedule loaded and decided by.
    StateArgument,
    /// Before: `(void *, bool preempt, prev, next)`; the program reads
    /// `prev->__state` (`state` before 5.14) at the tracepoint, as the
    /// classic tracepoint's `__trace_sched_switch_state` does.
    StateInTask,
}

/// `btf_trace_sched_switch`'s parameter lists, typedefs resolved.
const SWITCH_PROTOS: [(SwitchPrototype, &[&str]); 2] = [
    (
        SwitchPrototype::StateArgument,
        &[
            "void",
            "_Bool",
            "task_struct",
            "task_struct",
            "unsigned int",
        ],
    ),
    (
        SwitchPrototype::StateInTask,
        &["void", "_Bool", "task_struct", "task_struct"],
    ),
];

/// The raw tracepoints' prototypes this crate's programs read their
/// arguments by position from, as `btf_trace_<event>` typedefs declare them
/// (a pointer to a function prototype whose first parameter is the BPF
/// context `void *`), typedefs resolved (`bool` is `_Bool`).
/// sched_switch's has two forms (`SWITCH_PROTOS`); its list here is unused.
const EXPECTED_PROTOS: [(&str, &[&str]); 4] = [
    ("btf_trace_sched_switch", &[]),
    ("btf_trace_sched_wakeup", &["void", "task_struct"]),
    ("btf_trace_sched_wakeup_new", &["void", "task_struct"]),
    // The off-CPU accounting's waker side (`offcpu_waking_btf`).
    ("btf_trace_sched_waking", &["void", "task_struct"]),
];

/// What the `*_btf` programs need from the kernel's BTF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelBtf {
    pub task: TaskStructOffsets,
    /// Which `btf_trace_sched_switch` the kernel has, so which program
    /// attaches to it.
    pub switch: SwitchPrototype,
    /// The type id of each `btf_trace_<event>` typedef of
    /// [`EXPECTED_PROTOS`], in that order: a tp_btf program's attach
    /// target (BPF_PROG_LOAD's attach_btf_id).
    attach_targets: [u32; EXPECTED_PROTOS.len()],
}

impl KernelBtf {
    /// A BTF blob for aya's `BtfTracePoint::load`, which looks the attach
    /// target up by name in a parsed `aya::Btf` (and needs nothing else of
    /// it): the `btf_trace_<event>` typedefs at their ids in the kernel's
    /// BTF, every type before them a 12-byte placeholder (a `void *`).
    /// About 12 bytes a type up to the last typedef (10306 here, ~120 KiB;
    /// aya's parse of it ~0.4 MiB), where parsing all of vmlinux cost
    /// ~20 MiB of peak RSS.
    pub fn attach_targets_btf(&self) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut names = HashMap::new();
        for ((typedef, _), id) in EXPECTED_PROTOS.iter().zip(self.attach_targets) {
            names.insert(id, strings.len() as u32);
            strings.extend_from_slice(typedef.as_bytes());
            strings.push(0);
        }
        let last = self.attach_targets.iter().copied().max().unwrap_or(0);
        let mut types = Vec::with_capacity(12 * last as usize);
        for id in 1..=last {
            let words = match names.get(&id) {
                Some(&name_off) => [name_off, KIND_TYPEDEF << 24, 0],
                None => [0, KIND_PTR << 24, 0],
            };
            for w in words {
                types.extend_from_slice(&w.to_ne_bytes());
            }
        }
        let mut out = Vec::with_capacity(24 + types.len() + strings.len());
        out.extend_from_slice(&BTF_MAGIC.to_ne_bytes());
        out.extend([1u8, 0]);
        let (types_len, strings_len) = (types.len() as u32, strings.len() as u32);
        for w in [24u32, 0, types_len, types_len, strings_len] {
            out.extend_from_slice(&w.to_ne_bytes());
        }
        out.extend(types);
        out.extend(strings);
        out
    }

    /// The attach target id of raw tracepoint `event` (`sched_switch`).
    #[cfg(test)]
    fn attach_target(&self, event: &str) -> Option<u32> {
        EXPECTED_PROTOS
            .iter()
            .position(|(typedef, _)| typedef.strip_prefix("btf_trace_") == Some(event))
            .map(|i| self.attach_targets[i])
    }
}

/// Reads what the `*_btf` programs need from the BTF file at `path`, if
/// the kernel's raw sched tracepoints have the argument lists they were
/// written for.
pub fn kernel_btf(path: &Path) -> Result<KernelBtf, BtfError> {
    let read_err = |source| BtfError::Read {
        path: path.into(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    kernel_btf_in(&mut file).map_err(|e| match e {
        Lookup::Io(source) => read_err(source),
        Lookup::Malformed(what) => BtfError::Malformed {
            path: path.into(),
            what,
        },
        Lookup::Missing(what) => BtfError::Missing {
            path: path.into(),
            what,
        },
        Lookup::Prototype(what) => BtfError::Prototype {
            path: path.into(),
            what,
        },
    })
}

#[derive(Debug)]
enum Lookup {
    Io(std::io::Error),
    Malformed(String),
    Missing(String),
    Prototype(String),
}

/// Passes over the type section before a lookup gives up: each pass reads
/// the data of the types the last one found it needs (a struct, then its
/// anonymous members, then theirs).
const MAX_PASSES: usize = 16;

fn kernel_btf_in<R: Read + Seek>(file: &mut R) -> Result<KernelBtf, Lookup> {
    let mut types = Types::read(file)?;
    for _ in 0..MAX_PASSES {
        let found = lookup(&types);
        if types.needed.borrow().is_empty() {
            return found;
        }
        types.scan(file, false)?;
    }
    Err(Lookup::Malformed(format!(
        "types nested more than {MAX_PASSES} deep"
    )))
}

fn lookup(types: &Types) -> Result<KernelBtf, Lookup> {
    let (task, switch) = task_struct_offsets_from(types)?;
    let mut attach_targets = [0; EXPECTED_PROTOS.len()];
    for (id, (typedef, _)) in attach_targets.iter_mut().zip(EXPECTED_PROTOS) {
        *id = types
            .find(KIND_TYPEDEF, typedef)
            .ok_or_else(|| Lookup::Prototype(format!("typedef {typedef}")))?
            .id;
    }
    Ok(KernelBtf {
        task,
        switch,
        attach_targets,
    })
}

#[cfg(test)]
fn task_struct_offsets_in(data: &[u8]) -> Result<TaskStructOffsets, Lookup> {
    kernel_btf_in(&mut std::io::Cursor::new(data)).map(|k| k.task)
}

fn task_struct_offsets_from(types: &Types) -> Result<(TaskStructOffsets, SwitchPrototype), Lookup> {
    const SWITCH: &str = "btf_trace_sched_switch";
    let switch = match types.proto_params(SWITCH) {
        Some(params) => SWITCH_PROTOS
            .iter()
            .find(|(_, expected)| params == *expected)
            .map(|&(proto, _)| proto)
            .ok_or_else(|| {
                Lookup::Prototype(format!(
                    "{SWITCH} with parameters {:?} or {:?} (it has {params:?})",
                    SWITCH_PROTOS[0].1, SWITCH_PROTOS[1].1
                ))
            })?,
        None => return Err(Lookup::Prototype(format!("typedef {SWITCH}"))),
    };
    for (typedef, expected) in EXPECTED_PROTOS.into_iter().filter(|(t, _)| *t != SWITCH) {
        match types.proto_params(typedef) {
            Some(params) if params == expected => {}
            Some(params) => {
                return Err(Lookup::Prototype(format!(
                    "{typedef} with parameters {expected:?} (it has {params:?})"
                )))
            }
            None => return Err(Lookup::Prototype(format!("typedef {typedef}"))),
        }
    }
    let task = types
        .find(KIND_STRUCT, "task_struct")
        .ok_or_else(|| Lookup::Missing("struct task_struct".into()))?;
    let field = |name: &str| {
        types
            .member_offset(&task, name)
            .ok_or_else(|| Lookup::Missing(format!("task_struct.{name}")))
    };
    // A member of a struct that task_struct embeds by value.
    let nested = |strukt: &str, name: &str| {
        types
            .find(KIND_STRUCT, strukt)
            .and_then(|r| types.member_offset(&r, name))
            .ok_or_else(|| Lookup::Missing(format!("{strukt}.{name}")))
    };
    let state = field("__state").or_else(|_| field("state")).ok();
    if switch == SwitchPrototype::StateInTask && state.is_none() {
        return Err(Lookup::Missing(
            "task_struct.__state or task_struct.state (the pre-5.18 sched_switch reads it)".into(),
        ));
    }
    let offsets = TaskStructOffsets {
        pid: field("pid")?,
        tgid: field("tgid")?,
        prio: field("prio")?,
        comm: field("comm")?,
        exit_state: field("exit_state")?,
        sum_exec_runtime: field("se")? + nested("sched_entity", "sum_exec_runtime")?,
        run_delay: field("sched_info")
            .and_then(|o| Ok(o + nested("sched_info", "run_delay")?))
            .ok(),
        state,
    };
    Ok((offsets, switch))
}

#[cfg(test)]
mod tests {
    use aya_obj::btf::BtfKind;

    use super::{types::*, *};

    /// Builds a BTF blob type by type, the way pahole lays one out.
    #[derive(Default)]
    struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
        next_id: u32,
    }

    impl Builder {
        fn new() -> Self {
            Self {
                strings: vec![0],
                next_id: 1,
                ..Default::default()
            }
        }
        fn str(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }
        fn push(
            &mut self,
            name: &str,
            kind: u32,
            vlen: u32,
            flag: bool,
            st: u32,
            extra: &[u32],
        ) -> u32 {
            let name_off = self.str(name);
            let info = (kind << 24) | vlen | if flag { 1 << 31 } else { 0 };
            for w in [name_off, info, st].iter().chain(extra) {
                self.types.extend_from_slice(&w.to_ne_bytes());
            }
            self.next_id += 1;
            self.next_id - 1
        }
        fn int(&mut self, name: &str, size: u32) -> u32 {
            self.push(name, KIND_INT, 0, false, size, &[size * 8])
        }
        fn ptr(&mut self, to: u32) -> u32 {
            self.push("", KIND_PTR, 0, false, to, &[])
        }
        /// Members as (name, type, bit offset).
        fn strukt(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) -> u32 {
            let mut extra = Vec::new();
            for (n, t, bits) in members {
                extra.extend([self.str(n), *t, *bits]);
            }
            self.push(name, KIND_STRUCT, members.len() as u32, false, size, &extra)
        }
        fn proto(&mut self, name: &str, params: &[u32]) -> u32 {
            let mut extra = Vec::new();
            for p in params {
                extra.extend([0, *p]);
            }
            let proto = self.push("", KIND_FUNC_PROTO, params.len() as u32, false, 0, &extra);
            let ptr = self.ptr(proto);
            self.push(name, KIND_TYPEDEF, 0, false, ptr, &[])
        }
        fn build(self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&BTF_MAGIC.to_ne_bytes());
            out.extend([1u8, 0]);
            for w in [
                24u32,
                0,
                self.types.len() as u32,
                self.types.len() as u32,
                self.strings.len() as u32,
            ] {
                out.extend_from_slice(&w.to_ne_bytes());
            }
            out.extend(self.types);
            out.extend(self.strings);
            out
        }
    }

    fn kernel_like(switch_params_old_order: bool) -> Vec<u8> {
        kernel_with(switch_params_old_order, true)
    }

    /// `sched_info`: with CONFIG_SCHED_INFO's task_struct member. The old
    /// argument order comes with 5.10's `long state`, the new one with
    /// `unsigned int __state`.
    fn kernel_with(switch_params_old_order: bool, sched_info: bool) -> Vec<u8> {
        let state = if switch_params_old_order {
            "state"
        } else {
            "__state"
        };
        kernel_built(switch_params_old_order, sched_info, Some(state), false)
    }

    /// `state`: the name of task_struct's state member at offset 0 (none:
    /// no such member); `odd_switch`: a sched_switch prototype of neither
    /// form.
    fn kernel_built(
        switch_params_old_order: bool,
        sched_info: bool,
        state: Option<&str>,
        odd_switch: bool,
    ) -> Vec<u8> {
        let mut b = Builder::new();
        let int = b.int("int", 4);
        let long = b.int("long int", 8);
        let uint = b.int("unsigned int", 4);
        let c_bool = b.int("_Bool", 1);
        let boolean = b.push("bool", KIND_TYPEDEF, 0, false, c_bool, &[]);
        let ch = b.int("char", 1);
        let comm = b.push("", KIND_ARRAY, 0, false, 0, &[ch, int, 16]);
        // pid and tgid inside an anonymous struct, as randomized layouts
        // and some configs have them.
        let anon = b.strukt("", 8, &[("pid", int, 0), ("tgid", int, 32)]);
        let u64_t = b.int("long long unsigned int", 8);
        let se = b.strukt(
            "sched_entity",
            256,
            &[("load", u64_t, 0), ("sum_exec_runtime", u64_t, 72 * 8)],
        );
        // struct sched_info is in BTF whatever the config; the member is not.
        let info = b.strukt(
            "sched_info",
            32,
            &[("pcount", u64_t, 0), ("run_delay", u64_t, 8 * 8)],
        );
        let task_fwd_id = b.next_id;
        let mut members = vec![
            ("prio", int, 32 * 8),
            ("exit_state", int, 100 * 8),
            ("se", se, 128 * 8),
            ("", anon, 1264 * 8),
            ("comm", comm, 2000 * 8),
        ];
        if sched_info {
            members.push(("sched_info", info, 1500 * 8));
        }
        match state {
            Some("state") => members.push(("state", long, 0)),
            Some(name) => members.push((name, uint, 0)),
            None => {}
        }
        let task = b.strukt("task_struct", 4096, &members);
        assert_eq!(task, task_fwd_id);
        let task_ptr = b.ptr(task);
        let void_ptr = b.ptr(0);
        if odd_switch {
            b.proto("btf_trace_sched_switch", &[void_ptr, task_ptr, task_ptr]);
        } else if switch_params_old_order {
            // Before 5.18: (void *, bool preempt, prev, next).
            b.proto(
                "btf_trace_sched_switch",
                &[void_ptr, boolean, task_ptr, task_ptr],
            );
        } else {
            b.proto(
                "btf_trace_sched_switch",
                &[void_ptr, boolean, task_ptr, task_ptr, uint],
            );
        }
        b.proto("btf_trace_sched_wakeup", &[void_ptr, task_ptr]);
        b.proto("btf_trace_sched_wakeup_new", &[void_ptr, task_ptr]);
        b.proto("btf_trace_sched_waking", &[void_ptr, task_ptr]);
        b.build()
    }

    #[test]
    fn finds_task_struct_fields_through_anonymous_members() {
        let offsets = task_struct_offsets_in(&kernel_like(false)).ok().unwrap();
        assert_eq!(
            offsets,
            TaskStructOffsets {
                pid: 1264,
                tgid: 1268,
                prio: 32,
                comm: 2000,
                exit_state: 100,
                sum_exec_runtime: 128 + 72,
                run_delay: Some(1500 + 8),
                state: Some(0),
            }
        );
    }

    /// No CONFIG_SCHED_INFO: the programs still load, and runqueue wait
    /// falls back to the wakeup programs.
    #[test]
    fn run_delay_is_optional() {
        let offsets = task_struct_offsets_in(&kernel_with(false, false))
            .ok()
            .unwrap();
        assert_eq!(offsets.run_delay, None);
        assert_eq!(offsets.sum_exec_runtime, 128 + 72);
    }

    #[test]
    fn aya_finds_the_attach_targets_at_their_ids() {
        let blob = kernel_like(false);
        let kernel = kernel_btf_in(&mut std::io::Cursor::new(&blob)).unwrap();
        // The independent source: aya's own parse of the whole blob.
        let full = aya::Btf::parse(&blob, Default::default()).unwrap();
        let sparse = aya::Btf::parse(&kernel.attach_targets_btf(), Default::default()).unwrap();
        for event in [
            "sched_switch",
            "sched_wakeup",
            "sched_wakeup_new",
            "sched_waking",
        ] {
            let typedef = format!("btf_trace_{event}");
            let id = full
                .id_by_type_name_kind(&typedef, BtfKind::Typedef)
                .unwrap();
            assert_eq!(kernel.attach_target(event), Some(id));
            assert_eq!(
                sparse
                    .id_by_type_name_kind(&typedef, BtfKind::Typedef)
                    .unwrap(),
                id
            );
        }
    }

    #[test]
    fn takes_the_pre_5_18_sched_switch_prototype_with_the_tasks_state() {
        for (old_order, proto, state) in [
            (false, SwitchPrototype::StateArgument, "__state"),
            (true, SwitchPrototype::StateInTask, "state"),
        ] {
            let blob = kernel_like(old_order);
            let kernel = kernel_btf_in(&mut std::io::Cursor::new(&blob)).unwrap();
            assert_eq!(kernel.switch, proto, "{state}");
            assert_eq!(kernel.task.state, Some(0), "{state}");
            assert_eq!(kernel.task.pid, 1264);
        }
        // A 5.14-5.17 kernel: `__state`, still the old argument list.
        let blob = kernel_built(true, true, Some("__state"), false);
        let kernel = kernel_btf_in(&mut std::io::Cursor::new(&blob)).unwrap();
        assert_eq!(
            (kernel.switch, kernel.task.state),
            (SwitchPrototype::StateInTask, Some(0))
        );
    }

    #[test]
    fn refuses_the_old_prototype_without_a_state_member_and_any_other_one() {
        match task_struct_offsets_in(&kernel_built(true, true, None, false)) {
            Err(Lookup::Missing(what)) => assert!(what.contains("state"), "{what}"),
            other => panic!("no state to read prev's from: {other:?}"),
        }
        // 5.18+ passes the state: the member is not needed.
        let offsets = task_struct_offsets_in(&kernel_built(false, true, None, false)).unwrap();
        assert_eq!(offsets.state, None);
        match task_struct_offsets_in(&kernel_built(false, true, Some("__state"), true)) {
            Err(Lookup::Prototype(what)) => {
                assert!(what.contains("btf_trace_sched_switch"), "{what}")
            }
            other => panic!("an unknown argument list must not be accepted: {other:?}"),
        }
    }

    #[test]
    fn rejects_garbage_and_truncation() {
        assert!(matches!(
            task_struct_offsets_in(b"not btf"),
            Err(Lookup::Malformed(_))
        ));
        let mut blob = kernel_like(false);
        blob.truncate(blob.len() - 200);
        assert!(matches!(
            task_struct_offsets_in(&blob),
            Err(Lookup::Malformed(_))
        ));
    }

    #[test]
    fn reads_the_running_kernels_btf_like_bpftool_does() {
        // The independent source: bpftool's own dump of the same file.
        // `cargo xtask setup` installs bpftool; this machine's kernel has
        // BTF (CONFIG_DEBUG_INFO_BTF), as every machine the tests run on.
        let path = Path::new("/sys/kernel/btf/vmlinux");
        let kernel = kernel_btf(path).unwrap();
        let offsets = kernel.task;
        let dump = std::process::Command::new("bpftool")
            .args([
                "btf",
                "dump",
                "file",
                "/sys/kernel/btf/vmlinux",
                "format",
                "raw",
            ])
            .output()
            .expect("running bpftool (cargo xtask setup installs it)");
        assert!(dump.status.success(), "bpftool: {dump:?}");
        let text = String::from_utf8_lossy(&dump.stdout);
        // bpftool's byte offset of `strukt.member`.
        let member_offset = |strukt: &str, member: &str| -> u32 {
            let mut inside = false;
            for line in text.lines() {
                if line.starts_with('[') {
                    if inside {
                        break;
                    }
                    inside = line.contains(&format!("STRUCT '{strukt}' "));
                    continue;
                }
                if inside && line.trim_start().starts_with(&format!("'{member}' ")) {
                    let bits: u32 = line
                        .split("bits_offset=")
                        .nth(1)
                        .and_then(|s| s.split_whitespace().next())
                        .and_then(|s| s.parse().ok())
                        .unwrap();
                    return bits / 8;
                }
            }
            panic!("bpftool shows no {strukt}.{member}");
        };
        let bpftool_offset = |member: &str| member_offset("task_struct", member);
        assert_eq!(offsets.pid, bpftool_offset("pid"));
        assert_eq!(offsets.tgid, bpftool_offset("tgid"));
        assert_eq!(offsets.prio, bpftool_offset("prio"));
        assert_eq!(offsets.comm, bpftool_offset("comm"));
        assert_eq!(offsets.exit_state, bpftool_offset("exit_state"));
        // 5.14+ calls it `__state`.
        assert_eq!(offsets.state, Some(bpftool_offset("__state")));
        assert_eq!(
            offsets.sum_exec_runtime,
            bpftool_offset("se") + member_offset("sched_entity", "sum_exec_runtime")
        );
        // This host's kernel has CONFIG_SCHED_INFO (schedstat exists).
        assert!(Path::new("/proc/self/schedstat").exists());
        assert_eq!(
            offsets.run_delay,
            Some(bpftool_offset("sched_info") + member_offset("sched_info", "run_delay"))
        );
        // The attach targets: bpftool's `[id] TYPEDEF 'btf_trace_<event>'`,
        // and aya finds each at that id in the blob it is given.
        let aya_btf = aya::Btf::parse(&kernel.attach_targets_btf(), Default::default()).unwrap();
        for event in [
            "sched_switch",
            "sched_wakeup",
            "sched_wakeup_new",
            "sched_waking",
        ] {
            let bpftool_id: u32 = text
                .lines()
                .find(|l| l.contains(&format!("] TYPEDEF 'btf_trace_{event}' ")))
                .and_then(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
                .unwrap_or_else(|| panic!("bpftool shows no btf_trace_{event}"));
            assert_eq!(kernel.attach_target(event), Some(bpftool_id), "{event}");
            assert_eq!(
                aya_btf
                    .id_by_type_name_kind(&format!("btf_trace_{event}"), BtfKind::Typedef)
                    .unwrap(),
                bpftool_id,
                "{event}"
            );
        }
    }
}
