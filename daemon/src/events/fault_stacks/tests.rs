use super::*;
use vitals_proto::protos::{trace_packet, TracePacket};

impl FaultStacks {
    /// The packets of `take_samples`, all at once.
    fn take_packets(
        &mut self,
        last: bool,
        read_stack: impl FnMut(u32) -> Option<Vec<u64>>,
    ) -> Vec<TracePacket> {
        // Each run's copies as write_run_on_sequence writes them (a
        // writer test holds the two alike): the first's timestamp stepped.
        let mut packets = Vec::new();
        for (first, step_ns, count) in self.take_samples(last, read_stack).runs() {
            for i in 0..count {
                let mut p = first.clone();
                if i > 0 {
                    p.interned_data = None;
                    p.timestamp = first.timestamp.map(|ts| ts + i * step_ns);
                }
                packets.push(p);
            }
        }
        packets
    }
}

#[test]
fn own_stack_is_symbolised_and_interned_once() {
    // Symbolise an address of this very function in this process.
    let ip = own_stack_is_symbolised_and_interned_once as *const () as usize as u64;
    let mut fs = FaultStacks::new(Path::new("/proc"));
    for ts in [10, 20] {
        fs.push(own_fault(ts, 0, 7));
    }
    fs.push(own_fault(30, 1, -14));
    let packets = fs.take_packets(false, |id| (id == 7).then(|| vec![ip]));
    assert_eq!(packets.len(), 3);
    let interned = packets[0].interned_data.as_ref().expect("interned data");
    assert_eq!(interned.callstacks.len(), 1);
    assert_eq!(interned.frames.len(), 1);
    let name = String::from_utf8(interned.function_names[0].str.clone().unwrap()).unwrap();
    assert!(
        name.contains("own_stack_is_symbolised_and_interned_once"),
        "{name}"
    );
    assert!(packets[1].interned_data.is_none());
    let sample = |p: &TracePacket| match &p.data {
        Some(trace_packet::Data::PerfSample(s)) => s.clone(),
        _ => panic!("not a sample"),
    };
    assert_eq!(sample(&packets[0]).callstack_iid, Some(1));
    assert_eq!(sample(&packets[1]).callstack_iid, Some(1));
    assert_eq!(sample(&packets[2]).callstack_iid, None);
    assert_eq!(fs.stats.samples_without_stack, 1);
    // The mapping is this test binary, with its path split in parts.
    assert!(!interned.mappings.is_empty());
    assert!(!interned.mapping_paths.is_empty());
}

#[test]
fn a_long_block_weighs_its_blocked_ms_under_an_off_cpu_root() {
    let me = std::process::id();
    let ip = a_long_block_weighs_its_blocked_ms_under_an_off_cpu_root as *const () as u64;
    let mut fs = FaultStacks::new(Path::new("/proc"));
    let rec = |kind, ts| FaultRec {
        kind,
        ts,
        cpu: 0,
        tgid: me,
        tid: me,
        stack_id: 7,
    };
    let offcpu = |blocked_ns, kernel_stack| SampleKind::Offcpu {
        blocked_ns,
        kernel_stack,
    };
    // The first block's kernel stack: one address below any symbol.
    fs.push(rec(offcpu(3_500_000, 8), 100));
    fs.push(rec(SampleKind::Waker { kernel_stack: -14 }, 3_500_100));
    fs.push(rec(offcpu(20_000_000_000, -14), 0));
    let stacks = |id| match id {
        7 => Some(vec![ip]),
        8 => Some(vec![1]),
        _ => None,
    };
    let packets = fs.take_packets(false, stacks);
    assert_eq!(packets.len(), 3 + 1 + OFFCPU_MAX_SAMPLES as usize);
    assert_eq!((fs.stats.offcpu_blocks, fs.stats.offcpu_capped), (2, 1));
    let ts: Vec<u64> = packets[..4].iter().map(|p| p.timestamp.unwrap()).collect();
    assert_eq!(ts, [100, 1_000_100, 2_000_100, 3_500_100]);
    // The capped block's last sample, 10 s less a millisecond in.
    let last = packets.last().unwrap().timestamp;
    assert_eq!(last, Some((OFFCPU_MAX_SAMPLES - 1) * OFFCPU_SAMPLE_NS));
    // The interned entries once, ahead of every sample.
    assert!(packets[1..].iter().all(|p| p.interned_data.is_none()));
    // Two callstacks, [off-cpu] > f and [waker] > f, their roots
    // the synthetic frames.
    let i = packets[0].interned_data.as_ref().expect("interned data");
    let name = |iid: u64| {
        let f = i.frames.iter().find(|f| f.iid == Some(iid)).unwrap();
        let n = i
            .function_names
            .iter()
            .find(|n| n.iid == f.function_name_id);
        String::from_utf8(n.unwrap().str.clone().unwrap()).unwrap()
    };
    let roots: Vec<String> = i.callstacks.iter().map(|c| name(c.frame_ids[0])).collect();
    assert_eq!(roots, [OFFCPU_ROOT, WAKER_ROOT, OFFCPU_ROOT]);
    // Root, then the user frames, then the kernel's (innermost last).
    let first: Vec<String> = i.callstacks[0].frame_ids.iter().map(|&f| name(f)).collect();
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(first[1].contains("a_long_block_weighs"), "{first:?}");
    assert!(first[2].starts_with("[unsymbolised"), "{first:?}");
    // Its kernel stack was not taken (-EEXIST): said at the leaf end.
    let third: Vec<String> = i.callstacks[2].frame_ids.iter().map(|&f| name(f)).collect();
    assert_eq!(third.len(), 3, "{third:?}");
    assert!(third[2].starts_with(KERNEL_STACK_NOT_TAKEN), "{third:?}");
}

/// A block whose user stack the kernel did not give (bpf_get_stackid
/// failed) says so under its root instead of looking like a stack with
/// kernel frames only; a fault sample without one stays as it was.
#[test]
fn a_block_without_its_user_stack_says_so() {
    let me = std::process::id();
    let mut fs = FaultStacks::new(Path::new("/proc"));
    fs.push(FaultRec {
        kind: SampleKind::Waker { kernel_stack: 8 },
        ts: 100,
        cpu: 0,
        tgid: me,
        tid: me,
        stack_id: -17,
    });
    let packets = fs.take_packets(false, |id| (id == 8).then(|| vec![1]));
    assert_eq!(packets.len(), 1);
    let all = names(&packets);
    assert_eq!(all[0], WAKER_ROOT, "{all:?}");
    // -17: another stack held the bucket.
    assert_eq!(
        all[1], "[user stack not taken: File exists (os error 17)]",
        "{all:?}"
    );
    assert!(all[2].starts_with("[unsymbolised"), "{all:?}");
}

/// A kernel stack the record carried (taken at the waking) gets an id
/// above any stack map's and is never asked of the map; its frames stand
/// at the leaf end like a map's, two such stacks apart.
#[test]
fn a_carried_kernel_stack_is_the_blocks_own() {
    let me = std::process::id();
    let mut fs = FaultStacks::new(Path::new("/proc"));
    let first = fs.carried_stack(&[1, 2]);
    let second = fs.carried_stack(&[3]);
    assert!(first >= i64::from(CARRIED_STACK_IDS) && second == first + 1);
    for (kernel_stack, ts) in [(first, 100), (second, 200)] {
        fs.push(FaultRec {
            kind: SampleKind::Offcpu {
                blocked_ns: 1,
                kernel_stack,
            },
            ts,
            cpu: 0,
            tgid: me,
            tid: me,
            stack_id: -14,
        });
    }
    let mut asked = Vec::new();
    let packets = fs.take_packets(false, |id| {
        asked.push(id);
        None
    });
    assert!(asked.is_empty(), "the map was asked for {asked:?}");
    assert_eq!(packets.len(), 2);
    let i = packets[0].interned_data.as_ref().expect("interned data");
    let lens: Vec<usize> = i.callstacks.iter().map(|c| c.frame_ids.len()).collect();
    // Root, the user stack's refusal, then 2 and 1 kernel frames.
    assert_eq!(lens, [4, 3], "{:?}", names(&packets));
}

/// A fake /proc holding this process's stat, a maps (a directory until
/// `maps` is given: reading it fails, as a passing failure would) and
/// a root/ that is the real /, so its mapped files open.
fn fake_proc(maps: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let me = dir.path().join(std::process::id().to_string());
    std::fs::create_dir(&me).unwrap();
    std::fs::write(me.join("stat"), std::fs::read("/proc/self/stat").unwrap()).unwrap();
    std::os::unix::fs::symlink("/", me.join("root")).unwrap();
    match maps {
        Some(text) => std::fs::write(me.join("maps"), text).unwrap(),
        None => std::fs::create_dir(me.join("maps")).unwrap(),
    }
    dir
}

fn set_maps(proc: &Path, text: &str) {
    let maps = proc.join(format!("{}/maps", std::process::id()));
    let _ = std::fs::remove_dir(&maps);
    std::fs::write(maps, text).unwrap();
}

/// A fault sample of this process (its main thread) at `ts` on `cpu`.
fn own_fault(ts: u64, cpu: u32, stack_id: i64) -> FaultRec {
    let me = std::process::id();
    FaultRec {
        kind: SampleKind::Fault,
        ts,
        cpu,
        tgid: me,
        tid: me,
        stack_id,
    }
}

/// One sample of this process with a one-frame stack at `ip`.
fn sample_at(fs: &mut FaultStacks, ts: u64) {
    fs.push(own_fault(ts, 0, 3));
}

fn own_ip() -> u64 {
    a_passing_failure_is_tried_again_not_cached as *const () as usize as u64
}

/// The function names interned by `packets`.
fn names(packets: &[TracePacket]) -> Vec<String> {
    packets
        .iter()
        .filter_map(|p| p.interned_data.as_ref())
        .flat_map(|i| i.function_names.iter())
        .map(|n| String::from_utf8(n.str.clone().unwrap()).unwrap())
        .collect()
}

#[test]
fn a_passing_failure_is_tried_again_not_cached() {
    let proc = fake_proc(None);
    let mut fs = FaultStacks::new(proc.path());
    sample_at(&mut fs, 10);
    let stack = |id| (id == 3).then(|| vec![own_ip()]);
    // maps unreadable for now: the sample waits, nothing is cached.
    assert!(fs.take_packets(false, stack).is_empty());
    assert_eq!(fs.stats.frames_unsymbolised, 0);
    set_maps(
        proc.path(),
        &std::fs::read_to_string("/proc/self/maps").unwrap(),
    );
    sample_at(&mut fs, 20);
    let packets = fs.take_packets(false, stack);
    assert_eq!(packets.len(), 2, "the held sample and the new one");
    let names = names(&packets);
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        names[0].contains("a_passing_failure_is_tried_again_not_cached"),
        "{names:?}"
    );
    assert_eq!(fs.stats.frames_retried, 1);
    assert_eq!(fs.stats.frames_unsymbolised, 0);
}

#[test]
fn a_passing_failure_is_written_after_bounded_attempts_or_at_the_end() {
    let proc = fake_proc(None);
    let stack = |id| (id == 3).then(|| vec![own_ip()]);
    let mut fs = FaultStacks::new(proc.path());
    sample_at(&mut fs, 10);
    for _ in 1..RESOLVE_ATTEMPTS {
        assert!(fs.take_packets(false, stack).is_empty());
    }
    let packets = fs.take_packets(false, stack);
    assert_eq!(packets.len(), 1);
    let names = names(&packets);
    assert!(
        names[0].starts_with("[unsymbolised: reading /proc/") && names[0].contains("/maps"),
        "{names:?}"
    );
    assert_eq!(fs.stats.frames_unsymbolised, 1);

    // The capture's last flush holds nothing back.
    let mut fs = FaultStacks::new(proc.path());
    sample_at(&mut fs, 10);
    assert_eq!(fs.take_packets(true, stack).len(), 1);
}

/// A fork's child faults in its parent's image, then execs: the names
/// cached for the old image must not be served for the new one.
#[test]
fn a_new_image_of_the_pid_is_resolved_anew() {
    let proc = fake_proc(Some(&std::fs::read_to_string("/proc/self/maps").unwrap()));
    let stack = |id| (id == 3).then(|| vec![own_ip()]);
    let mut fs = FaultStacks::new(proc.path());
    sample_at(&mut fs, 10);
    let names_before = names(&fs.take_packets(false, stack));
    assert!(
        names_before[0].contains("a_passing_failure"),
        "{names_before:?}"
    );
    // exec: a new start_code (field 26) and an empty layout here.
    let stat_path = proc.path().join(format!("{}/stat", std::process::id()));
    let stat = std::fs::read_to_string(&stat_path).unwrap();
    let close = stat.rfind(')').unwrap();
    let mut fields: Vec<String> = stat[close + 1..]
        .split_ascii_whitespace()
        .map(str::to_owned)
        .collect();
    fields[26 - 3] = "4096".into();
    std::fs::write(
        &stat_path,
        format!("{} {}\n", &stat[..=close], fields.join(" ")),
    )
    .unwrap();
    set_maps(proc.path(), "");
    sample_at(&mut fs, 20);
    let names_after = names(&fs.take_packets(false, stack));
    assert_eq!(
        names_after,
        vec!["[unsymbolised: in no mapping]".to_owned()]
    );
}
