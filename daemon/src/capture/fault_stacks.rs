//! Sampled page-fault stacks as Perfetto callstack samples.
//!
//! The kernel side gives (pid, tid, ts, stack id); the stack-trace map gives
//! the user instruction pointers. Here they are symbolised with blazesym
//! (ELF symbol tables via /proc/<pid>/maps, while the process is alive:
//! `resolve` runs every sample interval) and interned the way
//! trace_processor's StackProfileSequenceState reads them: InternedData
//! `mappings` (with `build_ids` and `mapping_paths`), `function_names`,
//! `frames` and `callstacks` (outermost frame first), then PerfSample
//! packets with `callstack_iid`, all on one sequence that needs incremental
//! state.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use blazesym::symbolize::{source, Input, Symbolized, Symbolizer};
use vitals_proto::protos::{
    profiling, trace_packet, Callstack, Frame, InternedData, InternedString, Mapping, PerfSample,
    TracePacket,
};

use super::decode::FaultRec;

/// One line of /proc/<pid>/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

/// Parses /proc/<pid>/maps text; lines it cannot read are skipped.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_ascii_whitespace();
            let range = it.next()?;
            let _perms = it.next()?;
            let offset = u64::from_str_radix(it.next()?, 16).ok()?;
            let _dev = it.next()?;
            let _inode = it.next()?;
            let path = it.collect::<Vec<_>>().join(" ");
            let (s, e) = range.split_once('-')?;
            Some(MapEntry {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                offset,
                path,
            })
        })
        .collect()
}

/// Where one address resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FrameKey {
    mapping: MappingKey,
    function: Option<String>,
    rel_pc: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct MappingKey {
    start: u64,
    end: u64,
    offset: u64,
    path: String,
}

/// Counts for the capture summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub samples_written: u64,
    pub samples_without_stack: u64,
    pub frames_symbolised: u64,
    pub frames_unsymbolised: u64,
}

/// Interning state of the sample sequence plus the per-(pid, addr) cache.
pub struct FaultStacks {
    proc_root: PathBuf,
    symbolizer: Symbolizer,
    /// stack id -> ips (innermost first); valid for the whole capture since
    /// the kernel never replaces a used stack-map bucket without
    /// BPF_F_REUSE_STACKID.
    stacks: HashMap<u32, Vec<u64>>,
    resolved: HashMap<(u32, u64), FrameKey>,
    function_names: HashMap<String, u64>,
    path_parts: HashMap<String, u64>,
    build_ids: HashMap<Vec<u8>, u64>,
    build_id_of_path: HashMap<String, Option<Vec<u8>>>,
    mappings: HashMap<MappingKey, u64>,
    frames: HashMap<(u64, Option<u64>, u64), u64>,
    callstacks: HashMap<Vec<u64>, u64>,
    pending: Vec<FaultRec>,
    /// Interned entries not yet written.
    fresh: InternedData,
    pub stats: FaultStats,
}

impl FaultStacks {
    pub fn new(proc_root: &Path) -> Self {
        Self {
            proc_root: proc_root.to_owned(),
            symbolizer: Symbolizer::new(),
            stacks: HashMap::new(),
            resolved: HashMap::new(),
            function_names: HashMap::new(),
            path_parts: HashMap::new(),
            build_ids: HashMap::new(),
            build_id_of_path: HashMap::new(),
            mappings: HashMap::new(),
            frames: HashMap::new(),
            callstacks: HashMap::new(),
            pending: Vec::new(),
            fresh: InternedData::default(),
            stats: FaultStats::default(),
        }
    }

    pub fn push(&mut self, f: FaultRec) {
        self.pending.push(f);
    }

    /// Symbolises the pending samples and returns the packets to write:
    /// the first carries the new interned data. `read_stack` reads a stack
    /// id from the kernel's stack-trace map.
    pub fn take_packets(
        &mut self,
        mut read_stack: impl FnMut(u32) -> Option<Vec<u64>>,
    ) -> Vec<TracePacket> {
        let pending = std::mem::take(&mut self.pending);
        // Addresses to resolve, per process.
        let mut todo: HashMap<u32, Vec<u64>> = HashMap::new();
        for f in &pending {
            if f.stack_id < 0 {
                continue;
            }
            let id = f.stack_id as u32;
            let ips = self
                .stacks
                .entry(id)
                .or_insert_with(|| read_stack(id).unwrap_or_default());
            for &ip in ips.iter() {
                if !self.resolved.contains_key(&(f.tgid, ip)) {
                    todo.entry(f.tgid).or_default().push(ip);
                }
            }
        }
        for (pid, mut addrs) in todo {
            addrs.sort_unstable();
            addrs.dedup();
            self.resolve(pid, &addrs);
        }

        let mut packets = Vec::with_capacity(pending.len());
        for f in &pending {
            let ips = if f.stack_id >= 0 {
                self.stacks
                    .get(&(f.stack_id as u32))
                    .cloned()
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            let callstack_iid = if ips.is_empty() {
                self.stats.samples_without_stack += 1;
                None
            } else {
                // Perfetto wants the outermost frame first.
                let frames: Vec<u64> = ips
                    .iter()
                    .rev()
                    .map(|ip| {
                        let key = self.resolved[&(f.tgid, *ip)].clone();
                        self.intern_frame(&key)
                    })
                    .collect();
                Some(self.intern_callstack(frames))
            };
            self.stats.samples_written += 1;
            packets.push(TracePacket {
                timestamp: Some(f.ts),
                sequence_flags: Some(trace_packet::SequenceFlags::SeqNeedsIncrementalState as u32),
                data: Some(trace_packet::Data::PerfSample(PerfSample {
                    cpu: Some(f.cpu),
                    pid: Some(f.tgid),
                    tid: Some(f.tid),
                    cpu_mode: Some(profiling::CpuMode::ModeUser as i32),
                    timebase_count: Some(1),
                    callstack_iid,
                    ..Default::default()
                })),
                ..Default::default()
            });
        }
        if let Some(first) = packets.first_mut() {
            let fresh = std::mem::take(&mut self.fresh);
            if fresh != InternedData::default() {
                first.interned_data = Some(fresh);
            }
        }
        packets
    }

    fn resolve(&mut self, pid: u32, addrs: &[u64]) {
        let maps = std::fs::read_to_string(self.proc_root.join(format!("{pid}/maps")))
            .map(|t| parse_maps(&t))
            .unwrap_or_default();
        // Paths from /proc/<pid>/maps rather than map_files/, which would
        // need CAP_SYS_ADMIN; no DWARF: the ELF symbol table names functions.
        let mut src = source::Process::new(pid.into());
        src.map_files = false;
        src.debug_syms = false;
        src.perf_map = false;
        let syms = self
            .symbolizer
            .symbolize(&source::Source::Process(src), Input::AbsAddr(addrs))
            .unwrap_or_default();
        for (i, &addr) in addrs.iter().enumerate() {
            let m = maps.iter().find(|m| m.start <= addr && addr < m.end);
            let mapping = match m {
                Some(m) => MappingKey {
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    path: m.path.clone(),
                },
                None => {
                    log::debug!(
                        "pid {pid}: {addr:#x} is in none of its {} mappings",
                        maps.len()
                    );
                    MappingKey {
                        start: 0,
                        end: 0,
                        offset: 0,
                        path: "[unknown]".into(),
                    }
                }
            };
            let function = match syms.get(i) {
                Some(Symbolized::Sym(s)) => Some(s.name.to_string()),
                _ => None,
            };
            if function.is_some() {
                self.stats.frames_symbolised += 1;
            } else {
                self.stats.frames_unsymbolised += 1;
            }
            let rel_pc = addr
                .wrapping_sub(mapping.start)
                .wrapping_add(mapping.offset);
            self.resolved.insert(
                (pid, addr),
                FrameKey {
                    mapping,
                    function,
                    rel_pc,
                },
            );
        }
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

    fn intern_mapping(&mut self, m: &MappingKey) -> u64 {
        if let Some(&iid) = self.mappings.get(m) {
            return iid;
        }
        let path_string_ids: Vec<u64> = m
            .path
            .split('/')
            .filter(|p| !p.is_empty())
            .map(|p| Self::intern_string(&mut self.path_parts, &mut self.fresh.mapping_paths, p))
            .collect();
        let build_id = if m.path.starts_with('/') {
            let bid = self
                .build_id_of_path
                .entry(m.path.clone())
                .or_insert_with(|| {
                    blazesym::helper::read_elf_build_id(Path::new(&m.path))
                        .ok()
                        .flatten()
                        .map(|b| b.into_owned())
                })
                .clone();
            bid.map(|b| {
                if let Some(&iid) = self.build_ids.get(&b) {
                    return iid;
                }
                let iid = self.build_ids.len() as u64 + 1;
                self.build_ids.insert(b.clone(), iid);
                self.fresh.build_ids.push(InternedString {
                    iid: Some(iid),
                    str: Some(b),
                });
                iid
            })
        } else {
            None
        };
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

    fn intern_frame(&mut self, k: &FrameKey) -> u64 {
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

    #[test]
    fn maps_lines_parse_with_and_without_paths() {
        let m = parse_maps(
            "5581a000-5581b000 r-xp 00001000 08:01 1234   /usr/bin/my prog\n\
             7ffd0000-7ffd1000 rw-p 00000000 00:00 0 \n\
             garbage\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].start, 0x5581a000);
        assert_eq!(m[0].offset, 0x1000);
        assert_eq!(m[0].path, "/usr/bin/my prog");
        assert_eq!(m[1].path, "");
    }

    #[test]
    fn own_stack_is_symbolised_and_interned_once() {
        // Symbolise an address of this very function in this process.
        let me = std::process::id();
        let ip = own_stack_is_symbolised_and_interned_once as *const () as usize as u64;
        let mut fs = FaultStacks::new(Path::new("/proc"));
        for ts in [10, 20] {
            fs.push(FaultRec {
                ts,
                cpu: 0,
                tgid: me,
                tid: me,
                stack_id: 7,
            });
        }
        fs.push(FaultRec {
            ts: 30,
            cpu: 1,
            tgid: me,
            tid: me,
            stack_id: -14,
        });
        let packets = fs.take_packets(|id| (id == 7).then(|| vec![ip]));
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
}
