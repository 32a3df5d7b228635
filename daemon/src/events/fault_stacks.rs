//! Sampled page-fault stacks, symbolised.
//!
//! The kernel side gives (pid, tid, ts, stack id); the stack-trace map gives
//! the user instruction pointers. Here they are symbolised with blazesym
//! (ELF symbol tables of the files in /proc/<pid>/maps, while the process is
//! alive: `resolve` runs every sample interval) into `SampleFrame`s, which
//! perfetto/fault_samples.rs interns and writes as PerfSample packets. The
//! mapped files are opened as `mapped_files.rs` says. Frames that could not
//! be symbolised say why, in the frame's function name.
//!
//! Resolved frames are cached per process image: an address means
//! something only in the image that faulted, so the cache of a pid is
//! dropped when its starttime (the pid was reused) or its exec'd layout
//! (start_code, end_code, start_stack of /proc/<pid>/stat, which exec
//! sets) changes; a child that faults between fork and exec does not lend
//! the parent's names to its new image. A failure is cached only when it
//! is for good; a passing one (the flush's time budget spent, maps
//! unreadable for a moment) is tried again at the next flushes, its
//! samples held back meanwhile, `RESOLVE_ATTEMPTS` times at most.

use std::{
    collections::{hash_map::Entry, HashMap},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use blazesym::symbolize::{source, Input, Symbolizer};

use crate::perfetto::fault_samples::{
    stack_not_taken, synthetic_frame, FaultSamples, SampleBatch, SampleFrame, SampleMapping,
    SampleRun, KERNEL_STACK_NOT_TAKEN, OFFCPU_ROOT, USER_STACK_NOT_TAKEN, WAKER_ROOT,
};

use super::{
    decode::{FaultRec, SampleKind},
    kernel_stacks::KernelFrames,
    mapped_files::{fd_path, open_mapped_file, parse_maps, FileId, MapEntry, Unsymbolised},
};

/// Time one flush may spend symbolising; what is left waits for the next.
const RESOLVE_BUDGET: Duration = Duration::from_secs(2);

/// Flushes that try a frame whose symbolisation failed for a passing
/// reason; after that (or at the capture's last flush) it is written with
/// that reason.
const RESOLVE_ATTEMPTS: u32 = 3;

/// An off-CPU sample stands for this much blocked time: a block is written
/// as one sample per millisecond (at least one), spread over the block, as a
/// 1 kHz sampler of the blocked thread would see it, so the perf-sample
/// flamegraph (which counts samples) is weighted by blocked time.
pub const OFFCPU_SAMPLE_NS: u64 = 1_000_000;

/// Samples one block is written as at most (10 s of blocked time); a
/// longer block weighs this much, counted in `FaultStats::offcpu_capped`.
pub const OFFCPU_MAX_SAMPLES: u64 = 10_000;

/// Which image of a process its addresses belong to: fields 22
/// (starttime), 26 (startcode), 27 (endcode) and 28 (startstack) of
/// /proc/<pid>/stat. exec sets the last three (a new mm), so they tell a
/// forked child's parent image from the one it exec'd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Image([u64; 4]);

/// The image of `pid` now; None when it is gone or unreadable.
fn read_image(proc_root: &Path, pid: u32) -> Option<Image> {
    let text = std::fs::read_to_string(proc_root.join(format!("{pid}/stat"))).ok()?;
    // comm (field 2) may hold spaces and ')': the fields follow the last one.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Image([field(22)?, field(26)?, field(27)?, field(28)?]))
}

/// Counts for the capture summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Fault samples (not off-CPU or waker ones) written.
    pub samples_written: u64,
    pub samples_without_stack: u64,
    pub frames_symbolised: u64,
    pub frames_unsymbolised: u64,
    /// Frame symbolisations that failed for a passing reason and were
    /// tried again at a later flush.
    pub frames_retried: u64,
    /// Long blocks written (each as off-CPU samples and one waker sample).
    pub offcpu_blocks: u64,
    /// Long blocks over `OFFCPU_MAX_SAMPLES` ms, weighed as that many.
    pub offcpu_capped: u64,
}

/// One process's resolved frames, for the image they were resolved in.
#[derive(Default)]
struct ProcessFrames {
    image: Option<Image>,
    /// Symbolised, or failed for good (or out of attempts).
    done: HashMap<u64, SampleFrame>,
    /// Failed for a passing reason: the attempts so far and the frame
    /// written if no attempt is left.
    retrying: HashMap<u64, (u32, SampleFrame)>,
}

/// Ids of carried stacks start here: a stack map's ids are its bucket
/// indexes, below its max_entries (at most 2^31 for any map here).
const CARRIED_STACK_IDS: u32 = 1 << 31;

/// The symboliser's caches plus the sample sequence's interning state.
pub struct FaultStacks {
    proc_root: PathBuf,
    symbolizer: Symbolizer,
    /// stack id -> ips (innermost first); valid for the whole capture since
    /// the kernel never replaces a used stack-map bucket without
    /// BPF_F_REUSE_STACKID.
    stacks: HashMap<u32, Vec<u64>>,
    /// The next id for a stack a record carried itself (`carried_stack`),
    /// above any stack map's.
    next_carried_id: u32,
    processes: HashMap<u32, ProcessFrames>,
    /// Kernel frames of off-CPU and waker samples.
    kernel: KernelFrames,
    /// A mapped file's build id, by its identity.
    build_ids: HashMap<FileId, Option<Vec<u8>>>,
    /// Samples not written yet, oldest first: new ones, and those held
    /// back for a frame being tried again.
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
            next_carried_id: CARRIED_STACK_IDS,
            processes: HashMap::new(),
            kernel: KernelFrames::new(),
            build_ids: HashMap::new(),
            pending: Vec::new(),
            samples: FaultSamples::new(),
            stats: FaultStats::default(),
        }
    }

    pub fn push(&mut self, f: FaultRec) {
        self.pending.push(f);
    }

    /// A kernel stack a record carried (not in the stack map): kept under
    /// an id of its own, which the sample then names like a map's.
    pub fn carried_stack(&mut self, ips: &[u64]) -> i64 {
        let id = self.next_carried_id;
        // 2^31 ids a capture; past that the oldest are reused (their
        // samples written long before).
        self.next_carried_id = id.checked_add(1).unwrap_or(CARRIED_STACK_IDS);
        self.stacks.insert(id, ips.to_vec());
        i64::from(id)
    }

    /// Symbolises the pending samples and returns them to write, as runs
    /// (`SampleBatch`): the first packet carries the new interned data.
    /// `read_stack` reads a stack id from the kernel's stack-trace map. A
    /// sample with a frame to try again is held for the next call, unless
    /// `last` (the capture ends).
    pub fn take_samples(
        &mut self,
        last: bool,
        read_stack: impl FnMut(u32) -> Option<Vec<u64>>,
    ) -> SampleBatch {
        let pending = std::mem::take(&mut self.pending);
        self.resolve_pending(&pending, read_stack);
        if last {
            self.give_up_retries();
        }
        let mut runs = Vec::with_capacity(pending.len());
        for f in pending {
            let ips = stack_ips(&self.stacks, f.stack_id);
            let frames = self.processes.get(&f.tgid);
            let frame = |ip: &u64| frames.and_then(|p| p.done.get(ip));
            if !ips.iter().all(|ip| frame(ip).is_some()) {
                self.pending.push(f);
                continue;
            }
            if ips.is_empty() && f.kind == SampleKind::Fault {
                self.stats.samples_without_stack += 1;
            }
            // Perfetto wants the outermost frame first: user, then kernel.
            let kernel_ips = stack_ips(&self.stacks, f.kind.kernel_stack());
            let frames: Vec<&SampleFrame> = (ips.iter().rev().filter_map(frame))
                .chain(
                    kernel_ips
                        .iter()
                        .rev()
                        .filter_map(|ip| self.kernel.get(*ip)),
                )
                .collect();
            let (root, repeat) = match f.kind {
                SampleKind::Fault => (None, 1),
                SampleKind::Offcpu { blocked_ns, .. } => {
                    self.stats.offcpu_blocks += 1;
                    let n = (blocked_ns / OFFCPU_SAMPLE_NS).max(1);
                    if n > OFFCPU_MAX_SAMPLES {
                        self.stats.offcpu_capped += 1;
                    }
                    (Some(OFFCPU_ROOT), n.min(OFFCPU_MAX_SAMPLES))
                }
                SampleKind::Waker { .. } => (Some(WAKER_ROOT), 1),
            };
            let root = root.map(synthetic_frame);
            let user_missing = (f.kind != SampleKind::Fault && f.stack_id < 0)
                .then(|| stack_not_taken(USER_STACK_NOT_TAKEN, f.stack_id));
            let kernel_missing = (f.kind != SampleKind::Fault && f.kind.kernel_stack() < 0)
                .then(|| stack_not_taken(KERNEL_STACK_NOT_TAKEN, f.kind.kernel_stack()));
            let all = root
                .iter()
                .chain(user_missing.iter())
                .chain(frames.iter().copied())
                .chain(kernel_missing.iter());
            // Interned once: a block of a second is a thousand samples.
            let callstack = self.samples.intern_stack(all);
            runs.push(SampleRun {
                ts_ns: f.ts,
                step_ns: OFFCPU_SAMPLE_NS,
                count: repeat,
                cpu: f.cpu,
                tgid: f.tgid,
                tid: f.tid,
                callstack_iid: callstack,
            });
            if f.kind == SampleKind::Fault {
                self.stats.samples_written += 1;
            }
        }
        // Interned entries go with the first packet; with no packet there
        // are none (only a written sample interns).
        let interned = if runs.is_empty() {
            None
        } else {
            self.samples.take_interned()
        };
        SampleBatch::new(interned, runs)
    }

    /// The capture ends: frames still failing for a passing reason are
    /// written with it.
    fn give_up_retries(&mut self) {
        for p in self.processes.values_mut() {
            for (ip, (_, frame)) in p.retrying.drain() {
                self.stats.frames_unsymbolised += 1;
                p.done.insert(ip, frame);
            }
        }
    }

    /// Reads the stacks of `pending` not seen yet and resolves, per
    /// process, the addresses not resolved yet (or to try again).
    fn resolve_pending(
        &mut self,
        pending: &[FaultRec],
        mut read_stack: impl FnMut(u32) -> Option<Vec<u64>>,
    ) {
        let mut todo: HashMap<u32, Vec<u64>> = HashMap::new();
        let mut kernel = Vec::new();
        for f in pending {
            if let Ok(id) = u32::try_from(f.kind.kernel_stack()) {
                let ips = self
                    .stacks
                    .entry(id)
                    .or_insert_with(|| read_stack(id).unwrap_or_default());
                kernel.extend_from_slice(ips);
            }
            if f.stack_id < 0 {
                continue;
            }
            if let Entry::Vacant(e) = todo.entry(f.tgid) {
                e.insert(Vec::new());
                self.check_image(f.tgid);
            }
            let id = f.stack_id as u32;
            let ips = self
                .stacks
                .entry(id)
                .or_insert_with(|| read_stack(id).unwrap_or_default());
            let known = self.processes.get(&f.tgid);
            let addrs = todo.get_mut(&f.tgid).expect("inserted above");
            addrs.extend(
                ips.iter()
                    .filter(|ip| !known.is_some_and(|p| p.done.contains_key(ip))),
            );
        }
        // The processes whose frames waited longest first: a flush whose
        // budget runs out leaves the rest to the next, where they come
        // before new work, so none is starved by a busy neighbour.
        let mut todo: Vec<(u32, u32, Vec<u64>)> = todo
            .into_iter()
            .map(|(pid, mut addrs)| {
                addrs.sort_unstable();
                addrs.dedup();
                (self.attempts_so_far(pid, &addrs), pid, addrs)
            })
            .collect();
        todo.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let (named, not) = self.kernel.resolve(&kernel);
        self.stats.frames_symbolised += named;
        self.stats.frames_unsymbolised += not;
        let deadline = Instant::now() + RESOLVE_BUDGET;
        for (_, pid, addrs) in todo {
            if !addrs.is_empty() {
                self.resolve(pid, &addrs, deadline);
            }
        }
    }

    /// The most attempts any of `addrs` of `pid` had already.
    fn attempts_so_far(&self, pid: u32, addrs: &[u64]) -> u32 {
        let Some(p) = self.processes.get(&pid) else {
            return 0;
        };
        addrs
            .iter()
            .filter_map(|a| p.retrying.get(a).map(|(n, _)| *n))
            .max()
            .unwrap_or(0)
    }

    /// Drops what is cached for `pid` when it is another image now: the
    /// pid was reused, or the process exec'd. A process gone keeps its
    /// frames, for its samples still to write.
    fn check_image(&mut self, pid: u32) {
        let Some(now) = read_image(&self.proc_root, pid) else {
            return;
        };
        let p = self.processes.entry(pid).or_default();
        if p.image.is_some_and(|was| was != now) {
            log::debug!("pid {pid}: a new image (exec or pid reuse); its frames are resolved anew");
            *p = ProcessFrames::default();
        }
        p.image = Some(now);
    }

    /// Resolves `addrs` of process `pid`, one mapped file at a time.
    fn resolve(&mut self, pid: u32, addrs: &[u64], deadline: Instant) {
        let maps = match std::fs::read_to_string(self.proc_root.join(format!("{pid}/maps"))) {
            Ok(text) => parse_maps(&text),
            Err(e) => {
                let why = if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) {
                    Unsymbolised::permanent("the process exited before its stack was read")
                } else {
                    // Not ours to read is for good; anything else (out of
                    // memory or fds, interrupted) may pass.
                    Unsymbolised {
                        transient: !matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)),
                        why: format!("reading /proc/{pid}/maps: {e}"),
                    }
                };
                for &addr in addrs {
                    self.insert(pid, addr, unknown_mapping(), Err(why.clone()));
                }
                return;
            }
        };
        // Group the addresses by the mapping that holds them.
        let mut by_mapping: HashMap<Option<usize>, Vec<u64>> = HashMap::new();
        for &addr in addrs {
            let m = maps.iter().position(|m| m.start <= addr && addr < m.end);
            by_mapping.entry(m).or_default().push(addr);
        }
        for (m, addrs) in by_mapping {
            match m {
                Some(i) => self.resolve_in(pid, &maps[i], &addrs, deadline),
                None => {
                    log::debug!(
                        "pid {pid}: {} addresses in none of its mappings",
                        addrs.len()
                    );
                    for addr in addrs {
                        let why = Unsymbolised::permanent("in no mapping");
                        self.insert(pid, addr, unknown_mapping(), Err(why));
                    }
                }
            }
        }
    }

    /// Resolves `addrs` of `pid`, all in mapping `m`.
    fn resolve_in(&mut self, pid: u32, m: &MapEntry, addrs: &[u64], deadline: Instant) {
        let opened = if Instant::now() > deadline {
            Err(Unsymbolised::transient(
                "symbolisation time budget of its flushes spent",
            ))
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
        let names: Result<Vec<Option<String>>, Unsymbolised> = match &opened {
            Ok(f) => {
                let mut src = source::Elf::new(fd_path(f));
                src.debug_syms = false;
                self.symbolizer
                    .symbolize(&source::Source::Elf(src), Input::FileOffset(&file_offsets))
                    .map(|syms| super::kernel_stacks::symbol_names(&syms))
                    .map_err(|e| Unsymbolised::permanent(format!("reading its symbols: {e}")))
            }
            Err(why) => Err(why.clone()),
        };
        if let Err(why) = &names {
            log::debug!("pid {pid}: {}: {}", m.path, why.why);
        }
        for (i, &addr) in addrs.iter().enumerate() {
            let function = match &names {
                Ok(names) => names
                    .get(i)
                    .cloned()
                    .flatten()
                    .ok_or_else(|| Unsymbolised::permanent("no symbol covers it")),
                Err(why) => Err(why.clone()),
            };
            self.insert(pid, addr, mapping.clone(), function);
        }
    }

    /// Records one resolved frame; an unsymbolised one carries its reason
    /// as its function name, so the flamegraph says why. A passing failure
    /// with attempts left is kept aside, to try again.
    fn insert(
        &mut self,
        pid: u32,
        addr: u64,
        mapping: SampleMapping,
        function: Result<String, Unsymbolised>,
    ) {
        let p = self.processes.entry(pid).or_default();
        let rel_pc = addr
            .wrapping_sub(mapping.start)
            .wrapping_add(mapping.offset);
        let frame = |function: String| SampleFrame {
            mapping,
            function: Some(function),
            rel_pc,
        };
        let before = p.retrying.remove(&addr).map_or(0, |(n, _)| n);
        if before > 0 {
            self.stats.frames_retried += 1;
        }
        match function {
            Ok(name) => {
                self.stats.frames_symbolised += 1;
                p.done.insert(addr, frame(name));
            }
            Err(why) => {
                let named = frame(format!("[unsymbolised: {}]", why.why));
                let attempts = before + 1;
                if why.transient && attempts < RESOLVE_ATTEMPTS {
                    p.retrying.insert(addr, (attempts, named));
                } else {
                    self.stats.frames_unsymbolised += 1;
                    p.done.insert(addr, named);
                }
            }
        }
    }
}

/// The addresses of stack `id` read so far (none for a negative id).
fn stack_ips(stacks: &HashMap<u32, Vec<u64>>, id: i64) -> &[u64] {
    match id {
        id if id >= 0 => stacks.get(&(id as u32)).map_or(&[][..], Vec::as_slice),
        _ => &[],
    }
}

/// The mapping of a frame whose address no mapping holds (or whose maps
/// could not be read).
fn unknown_mapping() -> SampleMapping {
    SampleMapping {
        start: 0,
        end: 0,
        offset: 0,
        path: "[unknown]".into(),
        build_id: None,
    }
}

#[cfg(test)]
mod tests;
