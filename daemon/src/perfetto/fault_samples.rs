//! Sampled page faults as Perfetto callstack samples.
//!
//! Frames arrive already resolved (capture/fault_stacks.rs symbolises them
//! while the process is alive); here they are interned the way
//! trace_processor's StackProfileSequenceState reads them: InternedData
//! `mappings` (with `build_ids` and `mapping_paths`), `function_names`,
//! `frames` and `callstacks` (outermost frame first), then PerfSample
//! packets with `callstack_iid`, all on one sequence that needs incremental
//! state. Pure (no I/O), so the interning is unit-tested here.

use std::collections::HashMap;

use vitals_proto::protos::{
    profiling, trace_packet, Callstack, Frame, InternedData, InternedString, Mapping, PerfSample,
    TracePacket,
};

/// The mapping an address fell in, as /proc/<pid>/maps gave it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SampleMapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
    /// The ELF build id of `path`, where it has one.
    pub build_id: Option<Vec<u8>>,
}

/// Where one address resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SampleFrame {
    pub mapping: SampleMapping,
    pub function: Option<String>,
    /// The address relative to the file (address - start + offset).
    pub rel_pc: u64,
}

/// Root frame of every off-CPU sample (a long block's stack at switch-out):
/// what the flamegraph's top node and the README's query name.
pub const OFFCPU_ROOT: &str = "[off-cpu]";
/// Root frame of every waker sample (the stack that ended a long block).
pub const WAKER_ROOT: &str = "[waker]";
/// Under the root of an off-CPU or waker sample whose user stack the
/// kernel did not give (bpf_get_stackid failed: a stack map bucket held
/// another stack, -EEXIST, or the map was full): the sample keeps its
/// kernel frames and says what is missing instead of looking complete.
pub const USER_STACK_NOT_TAKEN: &str = "[user stack not taken";
/// The same for the kernel stack, at the leaf end. Both frames' names go
/// on with the kernel's error: `[user stack not taken: File exists (os
/// error 17)]` ([`stack_not_taken`]).
pub const KERNEL_STACK_NOT_TAKEN: &str = "[kernel stack not taken";

/// A long block's user stack that waited for its thread's switch-in
/// (`capture::USER_STACK_AT_SWITCH_IN`), which had not come (or whose
/// record was lost) when the capture ended. User space's own value, never
/// the kernel's.
pub const USER_STACK_UNSEEN: i64 = i64::MIN + 3;

/// The frame for a stack id the kernel refused (`id` its -errno), named
/// `prefix` ([`USER_STACK_NOT_TAKEN`], [`KERNEL_STACK_NOT_TAKEN`]) and the
/// error, or why a deferred user stack is not known.
pub fn stack_not_taken(prefix: &str, id: i64) -> SampleFrame {
    let why = match id {
        USER_STACK_UNSEEN => "the thread had not run again by the capture's end".to_owned(),
        id => std::io::Error::from_raw_os_error(i32::try_from(-id).unwrap_or(0)).to_string(),
    };
    synthetic_frame(&format!("{prefix}: {why}]"))
}

/// A frame that stands for no address: the root of off-CPU and waker
/// callstacks, in a mapping of its own named after vitalsd.
pub fn synthetic_frame(name: &str) -> SampleFrame {
    SampleFrame {
        mapping: SampleMapping {
            start: 0,
            end: 0,
            offset: 0,
            path: "[vitalsd]".into(),
            build_id: None,
        },
        function: Some(name.into()),
        rel_pc: 0,
    }
}

/// Interning state of the sample sequence: what has been interned with
/// which iid, and the entries not yet written.
#[derive(Default)]
pub struct FaultSamples {
    function_names: HashMap<String, u64>,
    path_parts: HashMap<String, u64>,
    build_ids: HashMap<Vec<u8>, u64>,
    mappings: HashMap<SampleMapping, u64>,
    frames: HashMap<(u64, Option<u64>, u64), u64>,
    callstacks: HashMap<Vec<u64>, u64>,
    /// Interned entries not yet written.
    fresh: InternedData,
}

/// Samples of one callstack at even steps: a fault sample (one), or an
/// off-CPU block's, one a millisecond blocked. A flush keeps runs, not
/// packets: a second of long blocks system-wide is thousands of samples,
/// and a `TracePacket` is 896 bytes, so a flush's Vec of them was
/// megabytes of fresh pages each time (with their encoding, half of an
/// off-CPU capture's own CPU in the guest bench's profile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRun {
    pub ts_ns: u64,
    pub step_ns: u64,
    pub count: u64,
    pub cpu: u32,
    pub tgid: u32,
    pub tid: u32,
    pub callstack_iid: Option<u64>,
}

/// What one flush writes on the sample sequence: its runs in order, the
/// first packet carrying the interned entries they refer to.
#[derive(Debug, Default)]
pub struct SampleBatch {
    interned: Option<InternedData>,
    runs: Vec<SampleRun>,
}

impl SampleBatch {
    pub fn new(interned: Option<InternedData>, runs: Vec<SampleRun>) -> Self {
        Self { interned, runs }
    }

    /// Each run as its first packet (the batch's first carrying the
    /// interned entries), its step and its count: what
    /// `TraceWriter::write_run_on_sequence` writes.
    pub fn runs(self) -> impl Iterator<Item = (TracePacket, u64, u64)> {
        let mut interned = self.interned;
        self.runs.into_iter().map(move |r| {
            let mut first = FaultSamples::sample_of(r.ts_ns, r.cpu, r.tgid, r.tid, r.callstack_iid);
            first.interned_data = interned.take();
            (first, r.step_ns, r.count)
        })
    }
}

impl FaultSamples {
    pub fn new() -> Self {
        Self::default()
    }

    /// The callstack of `frames` (outermost first), interned: None for no
    /// frames. Its new entries wait for `take_interned`.
    pub fn intern_stack<'a>(
        &mut self,
        frames: impl IntoIterator<Item = &'a SampleFrame>,
    ) -> Option<u64> {
        let frame_ids: Vec<u64> = frames.into_iter().map(|f| self.intern_frame(f)).collect();
        (!frame_ids.is_empty()).then(|| self.intern_callstack(frame_ids))
    }

    /// The PerfSample packet of a callstack interned by `intern_stack`:
    /// an off-CPU block writes one a millisecond blocked, all of one
    /// stack, which is interned once.
    pub fn sample_of(
        ts_ns: u64,
        cpu: u32,
        tgid: u32,
        tid: u32,
        callstack_iid: Option<u64>,
    ) -> TracePacket {
        TracePacket {
            timestamp: Some(ts_ns),
            sequence_flags: Some(trace_packet::SequenceFlags::SeqNeedsIncrementalState as u32),
            data: Some(trace_packet::Data::PerfSample(PerfSample {
                cpu: Some(cpu),
                pid: Some(tgid),
                tid: Some(tid),
                cpu_mode: Some(profiling::CpuMode::ModeUser as i32),
                timebase_count: Some(1),
                callstack_iid,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    /// The interned entries not yet written, for the first packet of what
    /// refers to them; None when there are none.
    pub fn take_interned(&mut self) -> Option<InternedData> {
        let fresh = std::mem::take(&mut self.fresh);
        (fresh != InternedData::default()).then_some(fresh)
    }

    fn intern_string(
        map: &mut HashMap<String, u64>,
        out: &mut Vec<InternedString>,
        s: &str,
    ) -> u64 {
        if let Some(&iid) = map.get(s) {
            return iid;
        }
        let iid = map.len() as u64 + 1;
        map.insert(s.to_owned(), iid);
        out.push(InternedString {
            iid: Some(iid),
            str: Some(s.as_bytes().to_vec()),
        });
        iid
    }

    fn intern_build_id(&mut self, b: &[u8]) -> u64 {
        if let Some(&iid) = self.build_ids.get(b) {
            return iid;
        }
        let iid = self.build_ids.len() as u64 + 1;
        self.build_ids.insert(b.to_vec(), iid);
        self.fresh.build_ids.push(InternedString {
            iid: Some(iid),
            str: Some(b.to_vec()),
        });
        iid
    }

    fn intern_mapping(&mut self, m: &SampleMapping) -> u64 {
        if let Some(&iid) = self.mappings.get(m) {
            return iid;
        }
        let path_string_ids: Vec<u64> = m
            .path
            .split('/')
            .filter(|p| !p.is_empty())
            .map(|p| Self::intern_string(&mut self.path_parts, &mut self.fresh.mapping_paths, p))
            .collect();
        let build_id = m.build_id.as_deref().map(|b| self.intern_build_id(b));
        let iid = self.mappings.len() as u64 + 1;
        self.mappings.insert(m.clone(), iid);
        self.fresh.mappings.push(Mapping {
            iid: Some(iid),
            build_id,
            start_offset: Some(m.offset),
            start: Some(m.start),
            end: Some(m.end),
            path_string_ids,
            ..Default::default()
        });
        iid
    }

    fn intern_frame(&mut self, k: &SampleFrame) -> u64 {
        let mapping = self.intern_mapping(&k.mapping);
        let function = k.function.as_deref().map(|f| {
            Self::intern_string(&mut self.function_names, &mut self.fresh.function_names, f)
        });
        let key = (mapping, function, k.rel_pc);
        if let Some(&iid) = self.frames.get(&key) {
            return iid;
        }
        let iid = self.frames.len() as u64 + 1;
        self.frames.insert(key, iid);
        self.fresh.frames.push(Frame {
            iid: Some(iid),
            function_name_id: function,
            mapping_id: Some(mapping),
            rel_pc: Some(k.rel_pc),
            ..Default::default()
        });
        iid
    }

    fn intern_callstack(&mut self, frames: Vec<u64>) -> u64 {
        if let Some(&iid) = self.callstacks.get(&frames) {
            return iid;
        }
        let iid = self.callstacks.len() as u64 + 1;
        self.callstacks.insert(frames.clone(), iid);
        self.fresh.callstacks.push(Callstack {
            iid: Some(iid),
            frame_ids: frames,
        });
        iid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(
        path: &str,
        build_id: Option<&[u8]>,
        function: Option<&str>,
        rel_pc: u64,
    ) -> SampleFrame {
        SampleFrame {
            mapping: SampleMapping {
                start: 0x1000,
                end: 0x2000,
                offset: 0,
                path: path.into(),
                build_id: build_id.map(<[u8]>::to_vec),
            },
            function: function.map(str::to_owned),
            rel_pc,
        }
    }

    /// The PerfSample packet of one user-mode fault; its new interned
    /// entries wait for `attach_interned`.
    fn sample_packet<'a>(
        s: &mut FaultSamples,
        ts_ns: u64,
        cpu: u32,
        tgid: u32,
        tid: u32,
        frames: impl IntoIterator<Item = &'a SampleFrame>,
    ) -> TracePacket {
        let callstack_iid = s.intern_stack(frames);
        FaultSamples::sample_of(ts_ns, cpu, tgid, tid, callstack_iid)
    }

    /// The interned entries not yet written, on the first of `packets`.
    fn attach_interned(s: &mut FaultSamples, packets: &mut [TracePacket]) {
        if let Some(first) = packets.first_mut() {
            first.interned_data = s.take_interned();
        }
    }

    fn callstack_iid(p: &TracePacket) -> Option<u64> {
        match &p.data {
            Some(trace_packet::Data::PerfSample(s)) => s.callstack_iid,
            _ => panic!("not a sample"),
        }
    }

    #[test]
    fn entries_are_interned_once_and_written_on_the_first_packet_only() {
        let main = frame("/usr/bin/app", Some(b"\x01\x02"), Some("main"), 0x10);
        let leaf = frame("/usr/lib/libc.so", None, None, 0x20);
        let mut s = FaultSamples::new();
        let mut packets = vec![
            sample_packet(&mut s, 10, 0, 7, 8, [&main, &leaf]),
            sample_packet(&mut s, 20, 1, 7, 8, [&main, &leaf]),
            sample_packet(&mut s, 30, 1, 7, 8, []),
        ];
        attach_interned(&mut s, &mut packets);
        assert_eq!(callstack_iid(&packets[0]), Some(1));
        assert_eq!(callstack_iid(&packets[1]), Some(1));
        assert_eq!(callstack_iid(&packets[2]), None);
        assert!(packets[1].interned_data.is_none());
        let i = packets[0].interned_data.as_ref().expect("interned data");
        assert_eq!(i.callstacks.len(), 1);
        assert_eq!(i.callstacks[0].frame_ids, vec![1, 2]);
        assert_eq!(i.frames.len(), 2);
        assert_eq!(i.frames[1].function_name_id, None);
        assert_eq!(i.mappings.len(), 2);
        assert_eq!(i.mappings[0].build_id, Some(1));
        assert_eq!(i.mappings[1].build_id, None);
        assert_eq!(i.build_ids.len(), 1);
        // "usr" is shared by both paths.
        let parts: Vec<_> = i
            .mapping_paths
            .iter()
            .map(|p| p.str.clone().unwrap())
            .collect();
        assert_eq!(parts, [&b"usr"[..], b"bin", b"app", b"lib", b"libc.so"]);
        assert_eq!(i.mappings[1].path_string_ids, vec![1, 4, 5]);

        // A later flush writes only what is new.
        let other = frame("/usr/bin/app", Some(b"\x01\x02"), Some("other"), 0x30);
        let mut later = vec![sample_packet(&mut s, 40, 0, 7, 8, [&main, &other])];
        attach_interned(&mut s, &mut later);
        assert_eq!(callstack_iid(&later[0]), Some(2));
        let i = later[0].interned_data.as_ref().expect("interned data");
        assert!(i.mappings.is_empty() && i.build_ids.is_empty());
        assert_eq!(i.frames.len(), 1);
        assert_eq!(i.function_names.len(), 1);
        assert_eq!(i.callstacks[0].frame_ids, vec![1, 3]);
    }
}
