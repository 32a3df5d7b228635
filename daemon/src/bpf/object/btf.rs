//! What the `*_btf` scheduler programs need from the kernel's BTF
//! (/sys/kernel/btf/vmlinux): a few `struct task_struct` field offsets and
//! the argument lists of the raw tracepoints they attach to.
//!
//! One pass over the type section, no type table built: the daemon stays
//! small at start-up (vmlinux BTF holds over 100k types), and the format
//! (Documentation/bpf/btf.rst) is stable and tiny to walk.

use std::path::{Path, PathBuf};

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
    /// A raw tracepoint's argument list is not what the programs read
    /// (sched_switch's before 5.18), or its typedef is absent.
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
}

/// The raw tracepoints' prototypes this crate's programs read their
/// arguments by position from, as `btf_trace_<event>` typedefs declare them
/// (a pointer to a function prototype whose first parameter is the BPF
/// context `void *`), typedefs resolved (`bool` is `_Bool`).
const EXPECTED_PROTOS: [(&str, &[&str]); 3] = [
    // Since Linux 5.18: prev_state moved to the end.
    (
        "btf_trace_sched_switch",
        &[
            "void",
            "_Bool",
            "task_struct",
            "task_struct",
            "unsigned int",
        ],
    ),
    ("btf_trace_sched_wakeup", &["void", "task_struct"]),
    ("btf_trace_sched_wakeup_new", &["void", "task_struct"]),
];

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// A parsed view of a BTF blob: where each type record starts.
struct Types<'a> {
    data: &'a [u8],
    strings: &'a [u8],
    /// Byte offset of type id `i + 1`'s record in `data`.
    starts: Vec<u32>,
}

#[derive(Clone, Copy)]
struct TypeRecord {
    name_off: u32,
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    /// `size` or `type`, by kind.
    size_or_type: u32,
    /// Offset of the kind-specific data after the 12-byte header.
    extra: usize,
}

fn u32_at(data: &[u8], off: usize) -> Option<u32> {
    data.get(off..off + 4)
        .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
}

impl<'a> Types<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, String> {
        let magic = data
            .get(0..2)
            .map(|b| u16::from_ne_bytes(b.try_into().unwrap()))
            .ok_or("shorter than a BTF header")?;
        if magic != BTF_MAGIC {
            return Err(format!("bad magic {magic:#x} (other endianness?)"));
        }
        let field = |i: usize| u32_at(data, 4 + 4 * i).ok_or("truncated BTF header");
        let (hdr_len, type_off, type_len, str_off, str_len) =
            (field(0)?, field(1)?, field(2)?, field(3)?, field(4)?);
        let range = |off: u32, len: u32| {
            let start = hdr_len as usize + off as usize;
            data.get(start..start + len as usize)
                .ok_or_else(|| format!("section at {start}+{len} past the end"))
        };
        let types = range(type_off, type_len)?;
        let strings = range(str_off, str_len)?;
        let mut starts = Vec::new();
        let mut off = 0usize;
        while off < types.len() {
            starts.push(off as u32);
            let rec = record(types, off).ok_or_else(|| format!("truncated type at {off}"))?;
            off =
                rec.extra + extra_len(&rec).ok_or_else(|| format!("unknown kind {}", rec.kind))?;
        }
        Ok(Self {
            data: types,
            strings,
            starts,
        })
    }

    fn get(&self, id: u32) -> Option<TypeRecord> {
        let start = *self.starts.get(id.checked_sub(1)? as usize)?;
        record(self.data, start as usize)
    }

    fn name(&self, name_off: u32) -> &'a str {
        let rest = self.strings.get(name_off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    fn find(&self, kind: u32, name: &str) -> Option<TypeRecord> {
        (1..=self.starts.len() as u32)
            .filter_map(|id| self.get(id))
            .find(|r| r.kind == kind && self.name(r.name_off) == name)
    }

    /// Member `name`'s byte offset in a struct or union, looking through
    /// anonymous struct/union members.
    fn member_offset(&self, rec: &TypeRecord, name: &str) -> Option<u32> {
        if rec.kind != KIND_STRUCT && rec.kind != KIND_UNION {
            return None;
        }
        for i in 0..rec.vlen as usize {
            let m = rec.extra + 12 * i;
            let (m_name, m_type, m_off) = (
                u32_at(self.data, m)?,
                u32_at(self.data, m + 4)?,
                u32_at(self.data, m + 8)?,
            );
            // With kind_flag the top 8 bits are a bitfield size.
            let bits = if rec.kind_flag {
                m_off & 0xff_ffff
            } else {
                m_off
            };
            if m_name == 0 {
                let inner = self.get(self.skip_modifiers(m_type))?;
                if let Some(off) = self.member_offset(&inner, name) {
                    return Some(bits / 8 + off);
                }
            } else if self.name(m_name) == name {
                return (bits % 8 == 0).then_some(bits / 8);
            }
        }
        None
    }

    fn skip_modifiers(&self, mut id: u32) -> u32 {
        while let Some(r) = self.get(id) {
            match r.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = r.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    /// A short name for a parameter type: `void` for void and `void *`, the
    /// pointee's name for other pointers, the type's own name otherwise.
    fn param_name(&self, id: u32) -> &'a str {
        let id = self.skip_modifiers(id);
        let Some(r) = self.get(id) else {
            return "void";
        };
        if r.kind == KIND_PTR {
            let pointee = self.skip_modifiers(r.size_or_type);
            return match self.get(pointee) {
                Some(p) => self.name(p.name_off),
                None => "void",
            };
        }
        self.name(r.name_off)
    }

    /// Parameter type names of typedef `name` = pointer to function proto.
    fn proto_params(&self, name: &str) -> Option<Vec<&'a str>> {
        let td = self.find(KIND_TYPEDEF, name)?;
        let ptr = self.get(self.skip_modifiers(td.size_or_type))?;
        if ptr.kind != KIND_PTR {
            return None;
        }
        let proto = self.get(self.skip_modifiers(ptr.size_or_type))?;
        if proto.kind != KIND_FUNC_PROTO {
            return None;
        }
        (0..proto.vlen as usize)
            .map(|i| u32_at(self.data, proto.extra + 8 * i + 4).map(|t| self.param_name(t)))
            .collect()
    }
}

fn record(data: &[u8], off: usize) -> Option<TypeRecord> {
    let info = u32_at(data, off + 4)?;
    Some(TypeRecord {
        name_off: u32_at(data, off)?,
        kind: (info >> 24) & 0x1f,
        vlen: info & 0xffff,
        kind_flag: info >> 31 != 0,
        size_or_type: u32_at(data, off + 8)?,
        extra: off + 12,
    })
}

/// Bytes of kind-specific data after the header; None for unknown kinds.
fn extra_len(r: &TypeRecord) -> Option<usize> {
    let vlen = r.vlen as usize;
    Some(match r.kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
        2 | 7..=12 | 16 | KIND_TYPE_TAG => 0,
        _ => return None,
    })
}

/// The task_struct offsets, if the kernel's raw sched tracepoints have the
/// argument lists the `*_btf` programs were written for.
pub fn task_struct_offsets(path: &Path) -> Result<TaskStructOffsets, BtfError> {
    let data = std::fs::read(path).map_err(|source| BtfError::Read {
        path: path.into(),
        source,
    })?;
    task_struct_offsets_in(&data).map_err(|e| match e {
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

enum Lookup {
    Malformed(String),
    Missing(String),
    Prototype(String),
}

fn task_struct_offsets_in(data: &[u8]) -> Result<TaskStructOffsets, Lookup> {
    let types = Types::parse(data).map_err(Lookup::Malformed)?;
    for (typedef, expected) in EXPECTED_PROTOS {
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
    Ok(TaskStructOffsets {
        pid: field("pid")?,
        tgid: field("tgid")?,
        prio: field("prio")?,
        comm: field("comm")?,
        exit_state: field("exit_state")?,
        sum_exec_runtime: field("se")? + nested("sched_entity", "sum_exec_runtime")?,
        run_delay: field("sched_info")
            .and_then(|o| Ok(o + nested("sched_info", "run_delay")?))
            .ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// `sched_info`: with CONFIG_SCHED_INFO's task_struct member.
    fn kernel_with(switch_params_old_order: bool, sched_info: bool) -> Vec<u8> {
        let mut b = Builder::new();
        let int = b.int("int", 4);
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
            ("__state", uint, 0),
            ("prio", int, 32 * 8),
            ("exit_state", int, 100 * 8),
            ("se", se, 128 * 8),
            ("", anon, 1264 * 8),
            ("comm", comm, 2000 * 8),
        ];
        if sched_info {
            members.push(("sched_info", info, 1500 * 8));
        }
        let task = b.strukt("task_struct", 4096, &members);
        assert_eq!(task, task_fwd_id);
        let task_ptr = b.ptr(task);
        let void_ptr = b.ptr(0);
        if switch_params_old_order {
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
    fn refuses_an_older_sched_switch_prototype() {
        match task_struct_offsets_in(&kernel_like(true)) {
            Err(Lookup::Prototype(what)) => {
                assert!(what.contains("btf_trace_sched_switch"), "{what}")
            }
            _ => panic!("the pre-5.18 argument order must not be accepted"),
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
        let offsets = task_struct_offsets(path).unwrap();
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
    }
}
