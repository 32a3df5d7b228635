//! What the load sets in the object before loading it, chosen from the
//! config and this kernel: the tracefs field offsets the classic programs
//! get as globals and the layout they imply (`FieldOffsets`), and the
//! frozen globals, map sizes, wakeup-time store, capture transport and
//! BTF offsets (`LoadSettings`).

use std::path::Path;

use aya::{Ebpf, EbpfLoader};
use vitals_common::{drop_reason, fixed_layout, mapped, names};

use super::super::{
    features::{self, possible_cpu_count, read_pid_max, VMLINUX_BTF},
    object::{
        btf, capture_map_sizes,
        feature_table::{log_missing, Feature},
        patch::{object_without_ringbuf, AlignedObject},
        EventTransport, TracepointLayout, EBPF_OBJECT,
    },
    tracefs::Tracefs,
    AccountingConfig, BpfError, Features, OffcpuSettings,
};
use crate::bpf::config::{
    exited_map_entries, process_faults_entries, tasks_entries, MachineBounds,
};

/// Above this pid_max the wakeup array would cost more than 2 MiB; use the
/// bounded hash instead (systemd hosts set pid_max to 4194304).
pub const WAKE_ARRAY_MAX_PIDS: u32 = 1 << 18;

/// Sizes of (TASKS_BY_TID and FAULTS_BY_TGID, TASKS, PROCESS_FAULTS): the
/// arrays cover every id below pid_max where it is at most
/// `mapped::MAX_TIDS`, and the hashes, which only ids past the arrays use,
/// shrink to a token 16 entries then; otherwise the arrays take the ids
/// below `MAX_TIDS` and the hashes keep the configured bounds.
/// pid_max u32::MAX is unknown (Android's policy does not grant reading
/// it): the arrays get a phone's usual pid_max, the hashes the rest.
fn mapped_tids(pid_max: u32, max_tasks: u32, max_processes: u32) -> (u32, u32, u32) {
    if pid_max <= mapped::MAX_TIDS {
        (pid_max.max(1), 16, 16)
    } else if pid_max == u32::MAX {
        (mapped::DEFAULT_TIDS, max_tasks, max_processes)
    } else {
        (mapped::MAX_TIDS, max_tasks, max_processes)
    }
}

/// Whether the fault programs must also count per process: only where a
/// tid can be past TASKS_BY_TID (pid_max above it, unknown, or the hash
/// forced). Where the array covers every tid, each thread's faults land
/// in its own slot and reach user space live or in its free record, so
/// the process's are their sum and FAULTS_BY_TGID can keep one entry.
fn counts_process_faults(tid_array_len: u32, pid_max: u32) -> bool {
    pid_max == u32::MAX || tid_array_len < pid_max
}

/// Slots of one CPU's WAKERS region: the pair bound shared out over the
/// CPUs (a pair woken from several CPUs takes a slot in each region it is
/// counted in, and the daemon sums them), but at least
/// `MIN_WAKER_REGION_SLOTS` so that a CPU doing most of the waking still
/// has room, and never more than the bound itself. Memory is then
/// 2 x 24 bytes x about max(`max_waker_pairs`, CPUs x 256) instead of
/// 2 x 24 x CPUs x `max_waker_pairs` (1.5 MiB for 8 CPUs at 4096).
pub(super) fn waker_region_slots(max_waker_pairs: u32, nr_cpus: u32) -> u32 {
    max_waker_pairs
        .div_ceil(nr_cpus.max(1))
        .max(MIN_WAKER_REGION_SLOTS.min(max_waker_pairs))
        .min(max_waker_pairs)
        .max(1)
}

/// See `waker_region_slots`.
const MIN_WAKER_REGION_SLOTS: u32 = 256;

/// EXITED_RING's size for `max_exited` records: a power-of-two number of
/// pages (the kernel's requirement), each record with the ring's 8-byte
/// header. The records are short (`ExitRecordShort`) where no process
/// faults are counted (`counts_process_faults`).
fn exited_ring_bytes(max_exited: u32, process_faults: bool, page: u32) -> u32 {
    let record = if process_faults {
        std::mem::size_of::<vitals_common::ExitRecord>()
    } else {
        std::mem::size_of::<vitals_common::ExitRecordShort>()
    };
    let record = (record as u32 + 8).next_multiple_of(8);
    max_exited
        .saturating_mul(record)
        .max(page)
        .checked_next_power_of_two()
        .unwrap_or(1 << 31)
}

/// Tracepoint field offsets from the tracefs format files, which the
/// classic programs get as globals.
pub(super) struct FieldOffsets {
    /// Fields the always-on programs read.
    sched: [(&'static str, u32); 5],
    /// Fields the capture records copy, with the offset `fixed_layout`
    /// expects each at.
    capture: [(&'static str, u32, u32); 7],
}

impl FieldOffsets {
    pub(super) fn read(tracefs: &Tracefs) -> Result<Self, BpfError> {
        let switch = tracefs.format("sched", "sched_switch")?;
        let wakeup = tracefs.format("sched", "sched_wakeup")?;
        let free = tracefs.format("sched", "sched_process_free")?;
        let waking = tracefs.format("sched", "sched_waking")?;
        let capture = [
            (
                names::G_SWITCH_PREV_PRIO,
                switch.offset_of("prev_prio", 4)?,
                fixed_layout::SWITCH_PREV_PRIO,
            ),
            (
                names::G_SWITCH_NEXT_COMM,
                switch.offset_of("next_comm", 16)?,
                fixed_layout::SWITCH_NEXT_COMM,
            ),
            (
                names::G_SWITCH_NEXT_PRIO,
                switch.offset_of("next_prio", 4)?,
                fixed_layout::SWITCH_NEXT_PRIO,
            ),
            (
                names::G_WAKING_COMM,
                waking.offset_of("comm", 16)?,
                fixed_layout::WAKING_COMM,
            ),
            (
                names::G_WAKING_PID,
                waking.offset_of("pid", 4)?,
                fixed_layout::WAKING_PID,
            ),
            (
                names::G_WAKING_PRIO,
                waking.offset_of("prio", 4)?,
                fixed_layout::WAKING_PRIO,
            ),
            (
                names::G_WAKING_TARGET_CPU,
                waking.offset_of("target_cpu", 4)?,
                fixed_layout::WAKING_TARGET_CPU,
            ),
        ];
        let sched = [
            (names::G_SWITCH_PREV_PID, switch.offset_of("prev_pid", 4)?),
            (
                names::G_SWITCH_PREV_STATE,
                switch.offset_of("prev_state", 8)?,
            ),
            (names::G_SWITCH_NEXT_PID, switch.offset_of("next_pid", 4)?),
            (names::G_WAKEUP_PID, wakeup.offset_of("pid", 4)?),
            (names::G_FREE_PID, free.offset_of("pid", 4)?),
        ];
        Ok(Self { sched, capture })
    }

    /// `Fixed` where every field the always-on programs read sits where
    /// `fixed_layout` says (sched_switch, including the fields it copies
    /// into capture records, and sched_wakeup(_new)'s pid), unless a test
    /// forces the portable programs. sched_waking is judged apart
    /// (`waking_layout`): it is capture-only, and before Linux 5.14 its
    /// template still had `success` at 32, pushing `target_cpu` to 36,
    /// which must not cost the always-on programs their fast layout.
    pub(super) fn layout(
        &self,
        tracefs: &Tracefs,
        force_portable: bool,
    ) -> Result<TracepointLayout, BpfError> {
        let wakeup_new = tracefs.format("sched", "sched_wakeup_new")?;
        let fixed_matches = self.sched[0].1 == fixed_layout::SWITCH_PREV_PID
            && self.sched[1].1 == fixed_layout::SWITCH_PREV_STATE
            && self.sched[2].1 == fixed_layout::SWITCH_NEXT_PID
            && self.sched[3].1 == fixed_layout::WAKEUP_PID
            && wakeup_new.offset_of("pid", 4)? == fixed_layout::WAKEUP_PID
            && self.capture[..SWITCH_CAPTURE_FIELDS]
                .iter()
                .all(|(_, off, fixed)| off == fixed);
        Ok(if fixed_matches && !force_portable {
            TracepointLayout::Fixed
        } else {
            TracepointLayout::Portable
        })
    }

    /// The layout of the capture-only sched_waking program.
    pub(super) fn waking_layout(&self, force_portable: bool) -> TracepointLayout {
        let fixed_matches = self.capture[SWITCH_CAPTURE_FIELDS..]
            .iter()
            .all(|(_, off, fixed)| off == fixed);
        if fixed_matches && !force_portable {
            TracepointLayout::Fixed
        } else {
            TracepointLayout::Portable
        }
    }
}

/// `FieldOffsets::capture` lists sched_switch's fields first, then
/// sched_waking's.
const SWITCH_CAPTURE_FIELDS: usize = 3;

/// What of the kernel the map sizes depend on (`LoadSettings::sized`).
#[derive(Debug, Clone, Copy)]
pub(super) struct SizingKernel {
    /// tp_btf programs that read `sched_info.run_delay`: no wakeup
    /// programs, so their maps get the minimum.
    pub(super) run_delay: bool,
    pub(super) ringbuf_ok: bool,
    pub(super) page: u32,
}

/// What the load sets in the object besides the field offsets, chosen
/// from the config and the kernel before anything is loaded.
pub(super) struct LoadSettings {
    /// Possible CPUs (for the log line; per-CPU maps are sized by aya).
    pub(super) nr_cpus: u32,
    /// What the per-task and per-process maps are bounded by.
    machine: MachineBounds,
    /// Wakeup times in the array indexed by tid, not the bounded hash.
    pub(super) wake_array: bool,
    wake_array_len: u32,
    wake_hash_len: u32,
    /// TASKS_BY_TID / FAULTS_BY_TGID entries (`mapped_tids`), and the
    /// fallback hashes' sizes beside them.
    tid_array_len: u32,
    tasks_hash_len: u32,
    processes_hash_len: u32,
    /// Count faults per process too (`G_COUNT_PROCESS_FAULTS`): only
    /// where some tid can miss TASKS_BY_TID (`counts_process_faults`).
    count_process_faults: bool,
    /// Freed tasks' records in EXITED_RING, not the EXITED hash.
    exit_ring: bool,
    ringbuf_ok: bool,
    pub(super) transport: EventTransport,
    /// The object rewritten without BPF_MAP_TYPE_RINGBUF, where the kernel
    /// has none; None: the embedded object as it is.
    patched: Option<AlignedObject>,
    /// `struct task_struct` offsets and attach targets for the tp_btf
    /// programs; None: attach the classic tracepoints.
    pub(super) btf_offsets: Option<btf::KernelBtf>,
    pub(super) page: u32,
    /// Off-CPU accounting; off when pinning (bpfloader attaches no
    /// program of it).
    pub(super) offcpu: Option<OffcpuSettings>,
    /// Each capture's large maps are made for it and held in the `SLOT_*`
    /// outers (`capture_slots`); the plain ones get their minimum. Not
    /// for pins (a reader of pins cannot make maps the pinned programs
    /// see: bpfloader's copy has the plain ones, sized at boot), nor
    /// without ring buffers (the rewritten object keeps the plain maps).
    pub(super) per_capture_maps: bool,
}

impl LoadSettings {
    pub(super) fn choose(
        cfg: &AccountingConfig,
        features: &Features,
        pinning: bool,
    ) -> Result<Self, BpfError> {
        let nr_cpus = possible_cpu_count()? as u32;
        // Wakeup times in an array indexed by tid when pid_max keeps it
        // small (8 bytes a pid): its lookups are inlined, a hash's are not.
        // Not fatal: Android's policy does not grant pid_max (see
        // android::NOT_GRANTED), and the bounded hash works everywhere.
        let pid_max = read_pid_max().unwrap_or_else(|e| {
            log::warn!("{e}; keeping wakeup times in the bounded hash");
            u32::MAX
        });
        let machine = MachineBounds {
            pid_max,
            possible_cpus: nr_cpus,
        };
        let btf_offsets = choose_btf_offsets(cfg, features, pinning);
        // No wakeup programs where runqueue wait is off or comes from the
        // kernel's run_delay (tp_btf): their maps get the minimum. (Should
        // the kernel then refuse the tp_btf programs, the classic wakeup
        // programs find no slot and count `wake_map_full`: the loader
        // logs that fallback as a warning.)
        let run_delay = btf_offsets.is_some_and(|k| k.task.run_delay.is_some());
        // Only the capture tier uses CAPTURE_EVENTS, but the map exists in
        // the object whatever runs, so probe even without a capture.
        let ringbuf_ok = features::ringbuf_map_supported(cfg.assume_no_ringbuf);
        let patched = if ringbuf_ok {
            None
        } else {
            // aya creates every map in the object and fails the load when
            // one cannot be created; EbpfLoader::allow_unsupported_maps does
            // not help (it only lets aya *wrap* map types it has no Rust
            // type for, after the kernel created them). So on a kernel
            // without ringbuf, CAPTURE_EVENTS is rewritten into a 1-entry
            // ARRAY in a copy of the object. The programs still reference
            // it, but only from the ringbuf branch of `emit`, which the
            // verifier never walks: CAPTURE_TRANSPORT is 1 in frozen .rodata.
            log_missing(Feature::RingBuf, "the kernel refused to create one");
            Some(object_without_ringbuf(EBPF_OBJECT)?)
        };
        let kernel = SizingKernel {
            run_delay,
            ringbuf_ok,
            page: crate::system::page_size_bytes()? as u32,
        };
        let mut s = Self::sized(cfg, machine, kernel, pinning)?;
        s.patched = patched;
        s.btf_offsets = btf_offsets;
        Ok(s)
    }

    /// The settings `choose` makes for `machine` and `kernel`, without
    /// reading either: what the map sizes (`map_sizes`) and so the kernel
    /// memory (`super::memory`) follow from.
    pub(super) fn sized(
        cfg: &AccountingConfig,
        machine: MachineBounds,
        kernel: SizingKernel,
        pinning: bool,
    ) -> Result<Self, BpfError> {
        let MachineBounds {
            pid_max,
            possible_cpus: nr_cpus,
        } = machine;
        let wake_array = pid_max <= WAKE_ARRAY_MAX_PIDS && !cfg.force_wake_hash;
        let wakeup_programs = cfg.runq_wait && !kernel.run_delay;
        let (wake_array_len, wake_hash_len) = match (wakeup_programs, wake_array) {
            (false, _) => (1, 1),
            (true, true) => (pid_max, 1),
            (true, false) => (1, cfg.limits.max_tasks),
        };
        // The hashes never need more entries than there can be ids.
        let max_tasks = tasks_entries(&cfg.limits, &machine);
        let max_processes = process_faults_entries(&cfg.limits, &machine);
        let (tid_array_len, tasks_hash_len, processes_hash_len) = if cfg.force_task_hash {
            (1, max_tasks, max_processes)
        } else {
            mapped_tids(pid_max, max_tasks, max_processes)
        };
        let count_process_faults = counts_process_faults(tid_array_len, pid_max);
        let transport =
            EventTransport::choose(cfg.capture.map(|c| c.transport), kernel.ringbuf_ok)?;
        Ok(Self {
            count_process_faults,
            nr_cpus,
            machine,
            wake_array,
            wake_array_len,
            wake_hash_len,
            tid_array_len,
            tasks_hash_len,
            processes_hash_len,
            exit_ring: kernel.ringbuf_ok && !cfg.force_exited_hash,
            ringbuf_ok: kernel.ringbuf_ok,
            transport,
            patched: None,
            btf_offsets: None,
            page: kernel.page,
            offcpu: cfg.offcpu.filter(|_| !pinning),
            per_capture_maps: cfg.capture.is_some() && !pinning && kernel.ringbuf_ok,
        })
    }

    /// The globals the load freezes in .rodata, as (name, value).
    fn globals(&self, cfg: &AccountingConfig, offsets: &FieldOffsets) -> Vec<(&'static str, u32)> {
        let mut globals = Vec::new();
        if let Some(o) = self.btf_offsets.map(|b| b.task) {
            globals.extend([
                (names::G_TASK_PID, o.pid),
                (names::G_TASK_TGID, o.tgid),
                (names::G_TASK_PRIO, o.prio),
                (names::G_TASK_COMM, o.comm),
                (names::G_TASK_EXIT_STATE, o.exit_state),
                (names::G_TASK_FLAGS, o.flags),
                (names::G_TASK_SUM_EXEC, o.sum_exec_runtime),
                // 0: no run_delay, the wakeup programs measure the wait.
                (names::G_TASK_RUN_DELAY, o.run_delay.unwrap_or(0)),
                // Read by the pre-5.18 sched_switch program only, which
                // the loader attaches only where the offset was found.
                (names::G_TASK_STATE, o.state.unwrap_or(0)),
            ]);
        }
        globals.extend([
            (names::G_CAPTURE_TRANSPORT, self.transport.rodata()),
            (names::G_WAKE_ARRAY, u32::from(self.wake_array)),
            (names::G_EXIT_RING, u32::from(self.exit_ring)),
            (names::G_PER_CAPTURE_MAPS, u32::from(self.per_capture_maps)),
            (names::G_TRACK_WAIT, u32::from(cfg.runq_wait)),
            (names::G_TRACK_OFFCPU, u32::from(self.offcpu.is_some())),
            (
                names::G_COUNT_PROCESS_FAULTS,
                u32::from(self.count_process_faults),
            ),
        ]);
        if let Some(o) = self.offcpu {
            globals.extend([
                (names::G_LONG_BLOCK_US, o.long_block_us),
                (
                    names::G_WAKER_SLOTS,
                    waker_region_slots(o.max_waker_pairs, self.nr_cpus),
                ),
                (names::G_WAKER_CPUS, self.nr_cpus),
            ]);
        }
        let free_pid_unset = |name: &str| name == names::G_FREE_PID && cfg.free_pid_from_record;
        globals.extend(
            offsets
                .sched
                .iter()
                .filter(|(name, _)| !free_pid_unset(name)),
        );
        globals.extend(offsets.capture.iter().map(|&(name, off, _)| (name, off)));
        globals
    }

    /// Every map's max_entries.
    pub(super) fn map_sizes(&self, cfg: &AccountingConfig) -> [(&'static str, u32); 17] {
        // Made per capture (`capture_sizes`): the plain maps' minimum.
        let plain = if self.per_capture_maps {
            None
        } else {
            cfg.capture
        };
        let [events, stacks, fault_ctr, offcpu_start, offcpu_await_user] =
            capture_map_sizes(plain, self.transport, self.ringbuf_ok, self.page);
        [
            (names::TASKS, self.tasks_hash_len),
            (names::WAKE_TS, self.wake_hash_len),
            (names::WAKE_TS_ARRAY, self.wake_array_len),
            (names::PROCESS_FAULTS, self.processes_hash_len),
            (names::TASKS_BY_TID, self.tid_array_len),
            (
                names::FAULTS_BY_TGID,
                if self.count_process_faults {
                    self.tid_array_len
                } else {
                    1
                },
            ),
            // One row per possible CPU (bpf_get_smp_processor_id() is
            // below it).
            (names::CPU_STATE, self.nr_cpus),
            (names::DROPS, self.nr_cpus * drop_reason::COUNT),
            // Freed tasks go to the ring where there is one, else the hash;
            // the other gets its minimum (a ring buffer: one page; the
            // rewritten array: one entry).
            (
                names::EXITED,
                if self.exit_ring {
                    1
                } else {
                    exited_map_entries(&cfg.limits, &self.machine)
                },
            ),
            (
                names::EXITED_RING,
                match (self.exit_ring, self.ringbuf_ok) {
                    (true, _) => exited_ring_bytes(
                        cfg.limits.max_exited,
                        self.count_process_faults,
                        self.page,
                    ),
                    (false, true) => self.page,
                    (false, false) => 1,
                },
            ),
            events,
            stacks,
            fault_ctr,
            offcpu_start,
            offcpu_await_user,
            (names::WAKERS, self.waker_slots()),
            (names::WAKER_HALF, 1),
        ]
    }

    /// max_entries of each capture's own CAPTURE_EVENTS, CAPTURE_STACKS,
    /// CAPTURE_FAULT_CTR, OFFCPU_START and OFFCPU_AWAIT_USER, with
    /// `per_capture_maps`.
    pub(super) fn capture_sizes(&self, cfg: &AccountingConfig) -> Option<[(&'static str, u32); 5]> {
        self.per_capture_maps
            .then(|| capture_map_sizes(cfg.capture, self.transport, self.ringbuf_ok, self.page))
    }

    /// WAKERS' slots: two halves of one region (`waker_region_slots`) per
    /// possible CPU (bpf_get_smp_processor_id() is below their count);
    /// 1 while off-CPU accounting is off. Saturating: a size past u32
    /// fails the map's creation, as memlock would long before.
    pub(super) fn waker_slots(&self) -> u32 {
        self.offcpu.map_or(1, |o| {
            2u32.saturating_mul(self.nr_cpus)
                .saturating_mul(waker_region_slots(o.max_waker_pairs, self.nr_cpus))
                .max(1)
        })
    }

    /// Loads the object with these settings and `offsets`: creates the
    /// maps and leaves the programs unloaded.
    pub(super) fn load(
        &self,
        cfg: &AccountingConfig,
        offsets: &FieldOffsets,
    ) -> Result<Ebpf, BpfError> {
        let globals = self.globals(cfg, offsets);
        let mut loader = EbpfLoader::new();
        for (name, value) in &globals {
            loader.override_global(name, value, true);
        }
        for (name, entries) in self.map_sizes(cfg) {
            loader.map_max_entries(name, entries);
        }
        let object = self
            .patched
            .as_ref()
            .map_or(EBPF_OBJECT, AlignedObject::bytes);
        // No vmlinux BTF parse here: our object has no CO-RE relocations,
        // and the patched aya (third_party/aya) parses it only for those.
        loader.load(object).map_err(BpfError::Load)
    }
}

/// Raw tracepoints where the kernel's BTF describes them as the programs
/// expect; classic ones otherwise (and always for pins: bpfloader attaches
/// only classic tracepoints).
fn choose_btf_offsets(
    cfg: &AccountingConfig,
    features: &Features,
    pinning: bool,
) -> Option<btf::KernelBtf> {
    if cfg.force_classic_tracepoints || pinning {
        return None;
    }
    if !features.btf_vmlinux {
        log_missing(Feature::KernelBtf, format!("no {VMLINUX_BTF}"));
        return None;
    }
    match btf::kernel_btf(Path::new(VMLINUX_BTF)) {
        Ok(mut o) => {
            if cfg.force_switch_task_state && o.task.state.is_some() {
                o.switch = btf::SwitchPrototype::StateInTask;
            }
            Some(o)
        }
        Err(e @ btf::BtfError::Prototype { .. }) => {
            log_missing(Feature::BtfSchedSwitch, e);
            None
        }
        Err(e) => {
            log_missing(Feature::KernelBtf, e);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waker_regions_share_the_pair_bound_over_the_cpus() {
        // The default bound on a phone's 8 CPUs: 512 slots each.
        assert_eq!(waker_region_slots(4096, 8), 512);
        assert_eq!(waker_region_slots(4096, 2), 2048);
        // Many CPUs: each keeps a useful region, all together above the bound.
        assert_eq!(waker_region_slots(4096, 64), 256);
        // A tiny bound is never exceeded by one region.
        assert_eq!(waker_region_slots(16, 2), 16);
        assert_eq!(waker_region_slots(16, 1), 16);
        assert_eq!(waker_region_slots(1000, 3), 334);
    }

    #[test]
    fn tid_arrays_cover_pid_max_where_it_is_small_and_the_hashes_the_rest() {
        assert_eq!(mapped_tids(32768, 16384, 8192), (32768, 16, 16));
        assert_eq!(
            mapped_tids(4_194_304, 16384, 8192),
            (mapped::MAX_TIDS, 16384, 8192)
        );
        // Unknown pid_max (Android's policy): a phone's usual one.
        assert_eq!(
            mapped_tids(u32::MAX, 16384, 8192),
            (mapped::DEFAULT_TIDS, 16384, 8192)
        );
    }

    #[test]
    fn process_faults_are_counted_only_where_a_tid_can_miss_the_array() {
        assert!(!counts_process_faults(32768, 32768));
        assert!(counts_process_faults(mapped::MAX_TIDS, 4_194_304));
        assert!(counts_process_faults(mapped::DEFAULT_TIDS, u32::MAX));
        // `force_task_hash`: one array slot.
        assert!(counts_process_faults(1, 32768));
    }

    #[test]
    fn exited_ring_holds_max_exited_records_in_a_power_of_two_of_pages() {
        for (process_faults, record) in [
            (true, std::mem::size_of::<vitals_common::ExitRecord>()),
            (false, std::mem::size_of::<vitals_common::ExitRecordShort>()),
        ] {
            let record = record as u32 + 8;
            for (max_exited, page) in [(1, 4096), (4096, 4096), (100, 16384)] {
                let bytes = exited_ring_bytes(max_exited, process_faults, page);
                assert!(bytes.is_power_of_two() && bytes >= page, "{bytes}");
                assert!(bytes / record >= max_exited, "{bytes} for {max_exited}");
            }
        }
        // The default two intervals of 2048 exits: 128-byte short records
        // fill 512 KiB exactly.
        assert_eq!(exited_ring_bytes(4096, false, 4096), 512 << 10);
    }
}
