//! The BTF lookup against synthetic blobs and against this host's
//! vmlinux as bpftool reads it.

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
        ("flags", uint, 44 * 8),
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
    b.proto("btf_trace_sched_process_free", &[void_ptr, task_ptr]);
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
            flags: 44,
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
        "sched_process_free",
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
    assert_eq!(offsets.flags, bpftool_offset("flags"));
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
        "sched_process_free",
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
