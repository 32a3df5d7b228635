//! Sampled page-fault stacks, symbolised.
//!
//! The kernel side gives (pid, tid, ts, stack id); the stack-trace map gives
//! the user instruction pointers. Here they are symbolised with blazesym
//! (ELF symbol tables via /proc/<pid>/maps, while the process is alive:
//! `resolve` runs every sample interval) into `SampleFrame`s, which
//! perfetto/fault_samples.rs interns and writes as PerfSample packets.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use blazesym::symbolize::{source, Input, Symbolized, Symbolizer};
use vitals_proto::protos::TracePacket;

use crate::perfetto::fault_samples::{FaultSamples, SampleFrame, SampleMapping};

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

/// Counts for the capture summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub samples_written: u64,
    pub samples_without_stack: u64,
    pub frames_symbolised: u64,
    pub frames_unsymbolised: u64,
}

/// The symboliser's caches plus the sample sequence's interning state.
pub struct FaultStacks {
    proc_root: PathBuf,
    symbolizer: Symbolizer,
    /// stack id -> ips (innermost first); valid for the whole capture since
    /// the kernel never replaces a used stack-map bucket without
    /// BPF_F_REUSE_STACKID.
    stacks: HashMap<u32, Vec<u64>>,
    resolved: HashMap<(u32, u64), SampleFrame>,
    build_id_of_path: HashMap<String, Option<Vec<u8>>>,
    pending: Vec<FaultRec>,
    samples: FaultSamples,
    pub stats: FaultStats,
}

impl FaultStacks {
    pub fn new(proc_root: &Path) -> Self {
        Self {
            proc_root: proc_root.to_owned(),
            symbolizer: Symbolizer::new(),
            stacks: HashMap::new(),
            resolved: HashMap::new(),
            build_id_of_path: HashMap::new(),
            pending: Vec::new(),
            samples: FaultSamples::new(),
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
        read_stack: impl FnMut(u32) -> Option<Vec<u64>>,
    ) -> Vec<TracePacket> {
        let pending = std::mem::take(&mut self.pending);
        self.resolve_pending(&pending, read_stack);
        let mut packets = Vec::with_capacity(pending.len());
        for f in &pending {
            let ips = match f.stack_id {
                id if id >= 0 => self.stacks.get(&(id as u32)).map_or(&[][..], Vec::as_slice),
                _ => &[],
            };
            if ips.is_empty() {
                self.stats.samples_without_stack += 1;
            }
            // Perfetto wants the outermost frame first.
            let frames = ips.iter().rev().map(|ip| &self.resolved[&(f.tgid, *ip)]);
            let p = self
                .samples
                .sample_packet(f.ts, f.cpu, f.tgid, f.tid, frames);
            packets.push(p);
            self.stats.samples_written += 1;
        }
        self.samples.attach_interned(&mut packets);
        packets
    }

    /// Reads the stacks of `pending` not seen yet and resolves, per
    /// process, the addresses not resolved yet.
    fn resolve_pending(
        &mut self,
        pending: &[FaultRec],
        mut read_stack: impl FnMut(u32) -> Option<Vec<u64>>,
    ) {
        let mut todo: HashMap<u32, Vec<u64>> = HashMap::new();
        for f in pending {
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
                Some(m) => SampleMapping {
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    build_id: build_id(&mut self.build_id_of_path, &m.path),
                    path: m.path.clone(),
                },
                None => {
                    log::debug!(
                        "pid {pid}: {addr:#x} is in none of its {} mappings",
                        maps.len()
                    );
                    SampleMapping {
                        start: 0,
                        end: 0,
                        offset: 0,
                        path: "[unknown]".into(),
                        build_id: None,
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
                SampleFrame {
                    mapping,
                    function,
                    rel_pc,
                },
            );
        }
    }
}

/// The ELF build id of a mapped file, read once per path into `cache`.
/// Only paths of files have one; anonymous and special mappings ("[vdso]")
/// not.
fn build_id(cache: &mut HashMap<String, Option<Vec<u8>>>, path: &str) -> Option<Vec<u8>> {
    if !path.starts_with('/') {
        return None;
    }
    cache
        .entry(path.to_owned())
        .or_insert_with(|| {
            blazesym::helper::read_elf_build_id(Path::new(path))
                .ok()
                .flatten()
                .map(|b| b.into_owned())
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_proto::protos::trace_packet;

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
