//! A capture's own maps, on the daemon's own load (#22 item 4). The ring
//! buffer, the stack map and the three LRU hashes a capture writes are
//! megabytes of kernel memory that a preallocated map holds from its
//! creation to its end. Created with the object, they were held for the
//! daemon's life though captures are rare; here they are created when a
//! capture starts, put in slot 0 of their one-slot
//! BPF_MAP_TYPE_ARRAY_OF_MAPS outer (`names::SLOT_*`, which the programs
//! look them up in: `ebpf-programs/src/capture_maps.rs`), taken out of the
//! slots when it stops and dropped once its trace is written. Between
//! captures the programs find the slots empty and the kernel holds only
//! the outers (one pointer each).
//!
//! The kernel checks a map put in a slot against the outer's template
//! (`bpf_map_meta_equal`: type, key and value size, flags), not its
//! max_entries, so each capture's maps take the sizes it is configured
//! with. On Linux 5.15 to 6.1 it also compares `timer_off`, which is
//! -ENOENT for a map made with BTF key and value types and -EINVAL for one
//! made without: so each map is made from its template's own definition
//! (`aya_obj::Map::inner` of the outer) with the object's BTF, exactly as
//! aya's `load` made the template.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use aya::{
    maps::{ArrayOfMaps, Map, MapData, MapError, RingBuf},
    sys::SyscallError,
    Ebpf,
};
use vitals_common::names;

use crate::event_set::EventSet;

use super::super::{map_err, object::EBPF_OBJECT, BpfError};

/// (the capture's map, the outer whose slot holds it), in the order of
/// `object::capture_map_sizes`.
pub(crate) const SLOTS: [(&str, &str); 5] = [
    (names::CAPTURE_EVENTS, names::SLOT_EVENTS),
    (names::CAPTURE_STACKS, names::SLOT_STACKS),
    (names::CAPTURE_FAULT_CTR, names::SLOT_FAULT_CTR),
    (names::OFFCPU_START, names::SLOT_OFFCPU_START),
    (names::OFFCPU_AWAIT_USER, names::SLOT_AWAIT_USER),
];

/// One slot: its outer, and the map a capture puts there.
struct Slot {
    name: &'static str,
    outer_name: &'static str,
    outer: ArrayOfMaps<MapData>,
    /// A duplicate of the outer's fd, for deletes.
    outer_fd: OwnedFd,
    /// The outer's inner template as the object defines it (BTF types
    /// included), at the template's 1 entry.
    template: aya_obj::Map,
    /// max_entries of a capture's map; 0: none is made (the ring buffer
    /// while captures use the perf event array).
    entries: u32,
}

/// The outers, and the running (or last, until released) capture's maps.
pub(crate) struct CaptureSlots {
    slots: Vec<Slot>,
    /// The object's BTF as aya loaded it (none where the kernel refused
    /// it, and then the templates were made without it too).
    btf: Option<OwnedFd>,
    /// The capture's maps by name, the ring buffer's once lent out.
    live: Vec<(&'static str, Map)>,
}

impl CaptureSlots {
    /// Takes the outers out of `ebpf`; `sizes` are a capture's
    /// (`capture_map_sizes` for the configured sizing), `ring` whether
    /// captures write to a ring buffer of their own.
    pub(super) fn take(
        ebpf: &mut Ebpf,
        sizes: [(&'static str, u32); 5],
        ring: bool,
    ) -> Result<Self, BpfError> {
        let btf = ebpf
            .btf_fd()
            .map(|fd| {
                fd.try_clone_to_owned()
                    .map_err(dup_failed("the object's BTF"))
            })
            .transpose()?;
        let mut templates = templates()?;
        let mut slots = Vec::with_capacity(SLOTS.len());
        for ((name, outer_name), (sized, entries)) in SLOTS.into_iter().zip(sizes) {
            debug_assert_eq!(name, sized);
            let data = match ebpf.take_map(outer_name) {
                Some(Map::ArrayOfMaps(data)) => data,
                Some(_) => {
                    return Err(BpfError::Unsupported(format!(
                        "{outer_name} is not an array of maps"
                    )))
                }
                None => return Err(BpfError::Missing(outer_name)),
            };
            // aya's ArrayOfMaps keeps its fd to itself and has no delete.
            let outer_fd = data
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(dup_failed(outer_name))?;
            let outer =
                ArrayOfMaps::try_from(Map::ArrayOfMaps(data)).map_err(map_err(outer_name))?;
            let template = templates
                .remove(outer_name)
                .and_then(|outer| outer.inner())
                .ok_or(BpfError::Missing(outer_name))?;
            let entries = if name == names::CAPTURE_EVENTS && !ring {
                0
            } else {
                entries
            };
            slots.push(Slot {
                name,
                outer_name,
                outer,
                outer_fd,
                template,
                entries,
            });
        }
        Ok(Self {
            slots,
            btf,
            live: Vec::new(),
        })
    }

    /// Creates the maps a capture that writes `events` (and off-CPU
    /// blocks, with `offcpu`) needs and puts them in the slots; an
    /// earlier capture's, if still held, are dropped first. The programs
    /// touch a map only under the capture flag that needs it, so the
    /// others stay empty (emptied here too, should an earlier capture have
    /// left one filled). Returns the ring buffer's reader when captures
    /// write to one. On an error every slot is empty again.
    pub(crate) fn fill(
        &mut self,
        events: EventSet,
        offcpu: bool,
    ) -> Result<Option<RingBuf<MapData>>, BpfError> {
        self.empty();
        self.release();
        let needed = |name: &str| match name {
            names::CAPTURE_STACKS => events.faults || offcpu,
            names::CAPTURE_FAULT_CTR => events.faults,
            names::OFFCPU_START | names::OFFCPU_AWAIT_USER => offcpu,
            _ => true,
        };
        let res = self.fill_slots(needed);
        if res.is_err() {
            self.empty();
            self.release();
        }
        res
    }

    fn fill_slots(
        &mut self,
        needed: impl Fn(&str) -> bool,
    ) -> Result<Option<RingBuf<MapData>>, BpfError> {
        for slot in &mut self.slots {
            if slot.entries == 0 || !needed(slot.name) {
                continue;
            }
            let mut obj = slot.template.clone();
            obj.set_max_entries(slot.entries);
            let btf = self.btf.as_ref().map(|fd| fd.as_fd());
            let map = MapData::create(obj, slot.name, btf).map_err(map_err(slot.name))?;
            slot.outer
                .set(0, &map, 0)
                .map_err(map_err(slot.outer_name))?;
            let map = Map::from_map_data(map).map_err(map_err(slot.name))?;
            self.live.push((slot.name, map));
        }
        let Some(at) = self
            .live
            .iter()
            .position(|(n, _)| *n == names::CAPTURE_EVENTS)
        else {
            return Ok(None);
        };
        let (_, ring) = self.live.swap_remove(at);
        RingBuf::try_from(ring)
            .map(Some)
            .map_err(map_err(names::CAPTURE_EVENTS))
    }

    /// Takes the capture's maps out of the slots: from here the programs
    /// write nothing more (a program already running keeps the map it
    /// looked up until it returns). The maps stay readable until
    /// `release`. Failures are logged: a map left in a slot is replaced by
    /// the next capture's.
    pub(crate) fn empty(&mut self) {
        for slot in &self.slots {
            if let Err(e) = delete_slot(&slot.outer_fd) {
                // ENOENT: nothing in it (no capture, or already emptied).
                if e.raw_os_error() != Some(libc::ENOENT) {
                    log::warn!("emptying {}: {e}", slot.outer_name);
                }
            }
        }
    }

    /// Drops the capture's maps (the kernel frees each once no slot and
    /// no running program holds it).
    pub(crate) fn release(&mut self) {
        self.live.clear();
    }

    /// The running (or last unreleased) capture's map `name`.
    pub(crate) fn live(&self, name: &str) -> Option<&Map> {
        self.live.iter().find(|(n, _)| *n == name).map(|(_, m)| m)
    }
}

/// The object's map definitions by name, the outers' (with their inner
/// templates) among them: what aya's `load` created the maps from.
fn templates() -> Result<std::collections::HashMap<String, aya_obj::Map>, BpfError> {
    aya_obj::Object::parse(EBPF_OBJECT)
        .map(|obj| obj.maps)
        .map_err(|e| BpfError::Unsupported(format!("parsing the eBPF object's maps: {e}")))
}

/// A failed dup of `name`'s fd.
fn dup_failed(name: &'static str) -> impl FnOnce(std::io::Error) -> BpfError {
    move |io_error| BpfError::Map {
        name,
        source: MapError::SyscallError(SyscallError {
            call: "dup",
            io_error,
        }),
    }
}

/// BPF_MAP_DELETE_ELEM of slot 0 (aya's ArrayOfMaps has no delete; the
/// kernel's map-in-map arrays have: `fd_array_map_delete_elem`).
fn delete_slot(outer: &OwnedFd) -> std::io::Result<()> {
    #[repr(C)]
    struct DeleteAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
    }
    const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
    let key = 0u32;
    let attr = DeleteAttr {
        map_fd: outer.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
    };
    // SAFETY: attr and the key it points to outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_DELETE_ELEM,
            &attr as *const DeleteAttr,
            std::mem::size_of::<DeleteAttr>() as u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{super::memory::map_defs, templates, EBPF_OBJECT, SLOTS};

    /// Each capture map has two definitions in the object: the plain map
    /// (bpfloader's copy, and what `memory::capture_memory` computes a
    /// capture's kernel memory from) and its slot's template (what a
    /// capture's map is made from). They must be the same map but for
    /// max_entries, or the memory figures describe another map than the
    /// one made.
    #[test]
    fn each_slot_template_is_its_plain_map_but_for_size() {
        let plain = map_defs(EBPF_OBJECT).unwrap();
        let mut templates = templates().unwrap();
        for (name, outer) in SLOTS {
            let p = plain.iter().find(|d| d.name == name).expect(name);
            let t = templates
                .remove(outer)
                .and_then(|o| o.inner())
                .expect(outer);
            assert_eq!(
                (t.map_type(), t.key_size(), t.value_size(), t.map_flags()),
                (p.map_type, p.key_size, p.value_size, p.flags),
                "{name} against {outer}'s template"
            );
        }
    }
}
