//! What the load sets in the object before loading it, chosen from the
//! config and this kernel: the tracefs field offsets the classic programs
//! get as globals and the layout they imply (`FieldOffsets`), and the
//! frozen globals, map sizes, wakeup-time store, capture transport and
//! BTF offsets (`LoadSettings`).

use std::path::Path;

use aya::{Ebpf, EbpfLoader};
use vitals_common::{fixed_layout, names};

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

/// Above this pid_max the wakeup array would cost more than 2 MiB; use the
/// bounded hash instead (systemd hosts set pid_max to 4194304).
pub const WAKE_ARRAY_MAX_PIDS: u32 = 1 << 18;

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

/// What the load sets in the object besides the field offsets, chosen
/// from the config and the kernel before anything is loaded.
pub(super) struct LoadSettings {
    /// Possible CPUs (for the log line; per-CPU maps are sized by aya).
    pub(super) nr_cpus: u32,
    /// Wakeup times in the array indexed by tid, not the bounded hash.
    pub(super) wake_array: bool,
    wake_array_len: u32,
    wake_hash_len: u32,
    ringbuf_ok: bool,
    pub(super) transport: EventTransport,
    /// The object rewritten without BPF_MAP_TYPE_RINGBUF, where the kernel
    /// has none; None: the embedded object as it is.
    patched: Option<AlignedObject>,
    /// `struct task_struct` offsets for the tp_btf programs; None: attach
    /// the classic tracepoints.
    pub(super) btf_offsets: Option<btf::TaskStructOffsets>,
    pub(super) page: u32,
    /// Off-CPU accounting; off when pinning (bpfloader attaches no
    /// program of it).
    pub(super) offcpu: Option<OffcpuSettings>,
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
        let wake_array = pid_max <= WAKE_ARRAY_MAX_PIDS && !cfg.force_wake_hash;
        let (wake_array_len, wake_hash_len) = if wake_array {
            (pid_max, 1)
        } else {
            (1, cfg.limits.max_tasks)
        };
        // Only the capture tier uses CAPTURE_EVENTS, but the map exists in
        // the object whatever runs, so probe even without a capture.
        let ringbuf_ok = features::ringbuf_map_supported(cfg.assume_no_ringbuf);
        let transport = EventTransport::choose(cfg.capture.map(|c| c.transport), ringbuf_ok)?;
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
        Ok(Self {
            nr_cpus,
            wake_array,
            wake_array_len,
            wake_hash_len,
            ringbuf_ok,
            transport,
            patched,
            btf_offsets: choose_btf_offsets(cfg, features, pinning),
            page: crate::system::page_size_bytes()? as u32,
            offcpu: cfg.offcpu.filter(|_| !pinning),
        })
    }

    /// The globals the load freezes in .rodata, as (name, value).
    fn globals(&self, cfg: &AccountingConfig, offsets: &FieldOffsets) -> Vec<(&'static str, u32)> {
        let mut globals = Vec::new();
        if let Some(o) = self.btf_offsets {
            globals.extend([
                (names::G_TASK_PID, o.pid),
                (names::G_TASK_TGID, o.tgid),
                (names::G_TASK_PRIO, o.prio),
                (names::G_TASK_COMM, o.comm),
                (names::G_TASK_EXIT_STATE, o.exit_state),
                (names::G_TASK_SUM_EXEC, o.sum_exec_runtime),
            ]);
        }
        globals.extend([
            (names::G_CAPTURE_TRANSPORT, self.transport.rodata()),
            (names::G_WAKE_ARRAY, u32::from(self.wake_array)),
            (names::G_TRACK_WAIT, u32::from(cfg.runq_wait)),
            (names::G_TRACK_OFFCPU, u32::from(self.offcpu.is_some())),
        ]);
        if let Some(o) = self.offcpu {
            globals.push((names::G_LONG_BLOCK_US, o.long_block_us));
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
    fn map_sizes(&self, cfg: &AccountingConfig) -> [(&'static str, u32); 9] {
        let [events, stacks, fault_ctr] =
            capture_map_sizes(cfg.capture, self.transport, self.ringbuf_ok, self.page);
        [
            (names::TASKS, cfg.limits.max_tasks),
            (names::WAKE_TS, self.wake_hash_len),
            (names::WAKE_TS_ARRAY, self.wake_array_len),
            (names::PROCESS_FAULTS, cfg.limits.max_processes),
            (names::EXITED, cfg.limits.max_exited),
            events,
            stacks,
            fault_ctr,
            (
                names::WAKERS,
                self.offcpu.map_or(1, |o| o.max_waker_pairs.max(1)),
            ),
        ]
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
        let ebpf = loader.load(object).map_err(BpfError::Load)?;
        // EbpfLoader::new() parsed vmlinux BTF (aya 0.14 always does, and
        // hides it); free that before attach_sched parses it again for the
        // tp_btf loads, so start-up holds one parse at a time, not two.
        drop(loader);
        crate::system::release_free_heap();
        Ok(ebpf)
    }
}

/// Raw tracepoints where the kernel's BTF describes them as the programs
/// expect; classic ones otherwise (and always for pins: bpfloader attaches
/// only classic tracepoints).
fn choose_btf_offsets(
    cfg: &AccountingConfig,
    features: &Features,
    pinning: bool,
) -> Option<btf::TaskStructOffsets> {
    if cfg.force_classic_tracepoints || pinning {
        return None;
    }
    if !features.btf_vmlinux {
        log_missing(Feature::KernelBtf, format!("no {VMLINUX_BTF}"));
        return None;
    }
    match btf::task_struct_offsets(Path::new(VMLINUX_BTF)) {
        Ok(o) => Some(o),
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
