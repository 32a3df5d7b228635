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

use types::{Types, BTF_MAGIC, KIND_FUNC, KIND_PTR, KIND_STRUCT, KIND_TYPEDEF};

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
    /// `flags` (PF_*): an off-CPU capture tells kernel threads by it.
    pub flags: u32,
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
const EXPECTED_PROTOS: [(&str, &[&str]); 5] = [
    ("btf_trace_sched_switch", &[]),
    ("btf_trace_sched_wakeup", &["void", "task_struct"]),
    ("btf_trace_sched_wakeup_new", &["void", "task_struct"]),
    // The off-CPU accounting's waker side (`offcpu_waking_btf`).
    ("btf_trace_sched_waking", &["void", "task_struct"]),
    // The freed task (`sched_process_free_btf`), which a raw tracepoint
    // sees even where bpf_prog_active would skip the classic program.
    ("btf_trace_sched_process_free", &["void", "task_struct"]),
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
    /// The id of FUNC [`SWITCH_IN_FUNC`], the off-CPU capture's fentry
    /// target (`offcpu_switch_in_fentry`), where the kernel's BTF has it.
    switch_in_target: Option<u32>,
}

/// Where the off-CPU capture's switch-in program attaches: the first
/// function a task runs in its own context after a switch
/// (kernel/sched/core.c). Optional: a kernel whose BTF lacks it (or whose
/// kallsyms has only a specialised copy, which fentry cannot find) gets
/// the kprobe instead (`programs::switch_in`).
pub const SWITCH_IN_FUNC: &str = "finish_task_switch";

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
        let targets = EXPECTED_PROTOS
            .iter()
            .map(|(typedef, _)| (*typedef, KIND_TYPEDEF))
            .zip(self.attach_targets)
            .chain(
                self.switch_in_target
                    .map(|id| ((SWITCH_IN_FUNC, KIND_FUNC), id)),
            );
        let mut last = 0;
        for ((name, kind), id) in targets {
            names.insert(id, (strings.len() as u32, kind));
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            last = last.max(id);
        }
        let mut types = Vec::with_capacity(12 * last as usize);
        for id in 1..=last {
            // A FUNC's prototype is never looked at (aya wants its id by
            // name and kind only): `void`.
            let words = match names.get(&id) {
                Some(&(name_off, kind)) => [name_off, kind << 24, 0],
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

    /// Whether `offcpu_switch_in_fentry` may load: the kernel's BTF has
    /// FUNC [`SWITCH_IN_FUNC`] (the kernel still has to find its address).
    pub fn has_switch_in_func(&self) -> bool {
        self.switch_in_target.is_some()
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
        switch_in_target: types.find(KIND_FUNC, SWITCH_IN_FUNC).map(|r| r.id),
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
        flags: field("flags")?,
        sum_exec_runtime: field("se")? + nested("sched_entity", "sum_exec_runtime")?,
        run_delay: field("sched_info")
            .and_then(|o| Ok(o + nested("sched_info", "run_delay")?))
            .ok(),
        state,
    };
    Ok((offsets, switch))
}

#[cfg(test)]
mod tests;
