//! Sampled page-fault stacks, symbolised.
//!
//! The kernel side gives (pid, tid, ts, stack id); the stack-trace map gives
//! the user instruction pointers. Here they are symbolised with blazesym
//! (ELF symbol tables of the files in /proc/<pid>/maps, while the process is
//! alive: `resolve` runs every sample interval) into `SampleFrame`s, which
//! perfetto/fault_samples.rs interns and writes as PerfSample packets.
//!
//! The paths in a target's maps are the target's to choose: it can unlink
//! its mapped file and put a FIFO named `<path> (deleted)` in its place, or
//! live in another mount namespace. So a mapped file is opened through
//! `/proc/<pid>/map_files/` (needs CAP_SYS_ADMIN) or else the target's own
//! root `/proc/<pid>/root/<path>`, non-blocking, and used only if it is a
//! regular file of bounded size whose device and inode are the mapping's.
//! blazesym then reads that open file through `/proc/self/fd/<n>`, never
//! the path again. Frames that could not be symbolised say why, in the
//! frame's function name.

use std::{
    collections::HashMap,
    fs::File,
    os::{
        fd::AsRawFd,
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use blazesym::symbolize::{source, Input, Symbolized, Symbolizer};
use vitals_proto::protos::TracePacket;

use crate::perfetto::fault_samples::{FaultSamples, SampleFrame, SampleMapping};

use super::decode::FaultRec;

/// Largest ELF file read for symbols; a larger one is left unsymbolised.
const MAX_ELF_BYTES: u64 = 1 << 30;

/// Time one flush may spend symbolising; what is left says so.
const RESOLVE_BUDGET: Duration = Duration::from_secs(2);

/// A file's identity: (device (major, minor), inode).
type FileId = ((u32, u32), u64);

/// One line of /proc/<pid>/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// Device of the mapped file, (major, minor).
    pub dev: (u32, u32),
    pub inode: u64,
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
            let (major, minor) = it.next()?.split_once(':')?;
            let inode = it.next()?.parse().ok()?;
            let path = it.collect::<Vec<_>>().join(" ");
            let (s, e) = range.split_once('-')?;
            Some(MapEntry {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                offset,
                dev: (
                    u32::from_str_radix(major, 16).ok()?,
                    u32::from_str_radix(minor, 16).ok()?,
                ),
                inode,
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
    /// A mapped file's build id, by its identity.
    build_ids: HashMap<FileId, Option<Vec<u8>>>,
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
            build_ids: HashMap::new(),
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
        let deadline = Instant::now() + RESOLVE_BUDGET;
        for (pid, mut addrs) in todo {
            addrs.sort_unstable();
            addrs.dedup();
            self.resolve(pid, &addrs, deadline);
        }
    }

    /// Resolves `addrs` of process `pid`, one mapped file at a time.
    fn resolve(&mut self, pid: u32, addrs: &[u64], deadline: Instant) {
        let maps = std::fs::read_to_string(self.proc_root.join(format!("{pid}/maps")))
            .map(|t| parse_maps(&t))
            .unwrap_or_default();
        // Group the addresses by the mapping that holds them.
        let mut by_mapping: HashMap<Option<usize>, Vec<u64>> = HashMap::new();
        for &addr in addrs {
            let m = maps.iter().position(|m| m.start <= addr && addr < m.end);
            by_mapping.entry(m).or_default().push(addr);
        }
        for (m, addrs) in by_mapping {
            let Some(m) = m.map(|i| &maps[i]) else {
                log::debug!(
                    "pid {pid}: {} addresses in none of its mappings",
                    addrs.len()
                );
                for addr in addrs {
                    let mapping = SampleMapping {
                        start: 0,
                        end: 0,
                        offset: 0,
                        path: "[unknown]".into(),
                        build_id: None,
                    };
                    self.insert(pid, addr, mapping, Err("in no mapping".into()));
                }
                continue;
            };
            let opened = if Instant::now() > deadline {
                Err("symbolisation time budget of this flush spent".to_string())
            } else {
                open_mapped_file(&self.proc_root, pid, m)
            };
            let build_id = match &opened {
                Ok(f) => self
                    .build_ids
                    .entry((m.dev, m.inode))
                    .or_insert_with(|| {
                        blazesym::helper::read_elf_build_id(&fd_path(f))
                            .ok()
                            .flatten()
                            .map(|b| b.into_owned())
                    })
                    .clone(),
                Err(_) => None,
            };
            let mapping = SampleMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                build_id,
                path: m.path.clone(),
            };
            let file_offsets: Vec<u64> = addrs
                .iter()
                .map(|a| a.wrapping_sub(m.start).wrapping_add(m.offset))
                .collect();
            // Owned names: the symbolizer's results borrow it.
            let names: Result<Vec<Option<String>>, String> = match &opened {
                Ok(f) => {
                    let mut src = source::Elf::new(fd_path(f));
                    src.debug_syms = false;
                    self.symbolizer
                        .symbolize(&source::Source::Elf(src), Input::FileOffset(&file_offsets))
                        .map(|syms| {
                            syms.iter()
                                .map(|s| match s {
                                    Symbolized::Sym(s) => Some(s.name.to_string()),
                                    _ => None,
                                })
                                .collect()
                        })
                        .map_err(|e| format!("reading its symbols: {e}"))
                }
                Err(why) => Err(why.clone()),
            };
            if let Err(why) = &names {
                log::debug!("pid {pid}: {}: {why}", m.path);
            }
            for (i, addr) in addrs.into_iter().enumerate() {
                let function = match &names {
                    Ok(names) => names
                        .get(i)
                        .cloned()
                        .flatten()
                        .ok_or_else(|| "no symbol covers it".to_string()),
                    Err(why) => Err(why.clone()),
                };
                self.insert(pid, addr, mapping.clone(), function);
            }
        }
    }

    /// Records one resolved frame; an unsymbolised one carries its reason
    /// as its function name, so the flamegraph says why.
    fn insert(
        &mut self,
        pid: u32,
        addr: u64,
        mapping: SampleMapping,
        function: Result<String, String>,
    ) {
        let function = match function {
            Ok(name) => {
                self.stats.frames_symbolised += 1;
                name
            }
            Err(why) => {
                self.stats.frames_unsymbolised += 1;
                format!("[unsymbolised: {why}]")
            }
        };
        let rel_pc = addr
            .wrapping_sub(mapping.start)
            .wrapping_add(mapping.offset);
        self.resolved.insert(
            (pid, addr),
            SampleFrame {
                mapping,
                function: Some(function),
                rel_pc,
            },
        );
    }
}

/// A path to an open file that blazesym can open again: the same file,
/// whatever happens to the name it was mapped from.
fn fd_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Opens the file behind mapping `m` of `pid`, or says why not. Never
/// blocks (O_NONBLOCK: a FIFO opens at once and is then refused), never
/// resolves the target's path in our mount namespace, and only accepts the
/// very file mapped (device and inode as in maps).
fn open_mapped_file(proc_root: &Path, pid: u32, m: &MapEntry) -> Result<File, String> {
    if !m.path.starts_with('/') || m.inode == 0 {
        return Err("not a file mapping".into());
    }
    let pid_dir = proc_root.join(pid.to_string());
    // map_files/ opens the mapped file itself, even unlinked; it needs
    // CAP_SYS_ADMIN. Else the target's root: its mount namespace, its path
    // (minus the " (deleted)" the kernel appends, which then cannot match);
    // that needs ptrace access, which the daemon, with its capabilities
    // dropped, lacks for processes with more. Last, the path in our own
    // namespace: right when the target shares it, and refused by the
    // device/inode check when it does not.
    let path = m.path.strip_suffix(" (deleted)").unwrap_or(&m.path);
    let map_file = pid_dir.join(format!("map_files/{:x}-{:x}", m.start, m.end));
    let rooted = pid_dir.join("root").join(path.trim_start_matches('/'));
    let mut why = Vec::new();
    for candidate in [map_file, rooted, PathBuf::from(path)] {
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&candidate)
        {
            Ok(f) => f,
            Err(e) => {
                why.push(format!("opening {}: {e}", candidate.display()));
                continue;
            }
        };
        let meta = f.metadata().map_err(|e| format!("fstat: {e}"))?;
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        if !meta.file_type().is_file() {
            return Err("not a regular file".into());
        }
        if dev != m.dev || meta.ino() != m.inode {
            why.push(format!(
                "{} is not the file mapped (replaced, or another namespace's)",
                candidate.display()
            ));
            continue;
        }
        if meta.len() > MAX_ELF_BYTES {
            return Err(format!("file over {} MiB", MAX_ELF_BYTES >> 20));
        }
        return Ok(f);
    }
    Err(why.join("; "))
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
        assert_eq!((m[0].dev, m[0].inode), ((8, 1), 1234));
        assert_eq!(m[1].path, "");
    }

    /// A fake /proc/<pid> whose root/ holds `name`; the mapping names it.
    fn fake_mapping(proc_root: &Path, name: &str, make: impl FnOnce(&Path)) -> MapEntry {
        let root = proc_root.join("42/root");
        std::fs::create_dir_all(&root).unwrap();
        let p = root.join(name);
        make(&p);
        let meta = std::fs::metadata(&p).unwrap();
        MapEntry {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            dev: (libc::major(meta.dev()), libc::minor(meta.dev())),
            inode: meta.ino(),
            path: format!("/{name}"),
        }
    }

    #[test]
    fn only_the_regular_file_mapped_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let ok = fake_mapping(dir.path(), "lib.so", |p| std::fs::write(p, b"x").unwrap());
        assert!(open_mapped_file(dir.path(), 42, &ok).is_ok());

        // The same name, another file: the mapping's inode no longer matches.
        let root = dir.path().join("42/root");
        // (Written before the old one goes, so it cannot reuse its inode.)
        std::fs::write(root.join("lib.so.new"), b"y").unwrap();
        std::fs::rename(root.join("lib.so.new"), root.join("lib.so")).unwrap();
        let e = open_mapped_file(dir.path(), 42, &ok).unwrap_err();
        assert!(e.contains("not the file mapped"), "{e}");

        // A FIFO opens at once (O_NONBLOCK) and is refused, not read.
        let fifo = fake_mapping(dir.path(), "fifo (deleted)", |p| {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
        });
        let fifo = MapEntry {
            path: "/fifo (deleted) (deleted)".into(),
            ..fifo
        };
        let e = open_mapped_file(dir.path(), 42, &fifo).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");

        let anon = MapEntry {
            path: "[heap]".into(),
            inode: 0,
            ..ok
        };
        assert!(open_mapped_file(dir.path(), 42, &anon).is_err());
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
