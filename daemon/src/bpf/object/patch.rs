//! The object rewritten for kernels before 5.8: a copy of the embedded
//! object in which CAPTURE_EVENTS and EXITED_RING are no
//! BPF_MAP_TYPE_RINGBUF, so every kernel can create its maps. Pure byte
//! work on the ELF image.

use vitals_common::names;

use super::super::BpfError;

/// A copy of the eBPF object in which the CAPTURE_EVENTS and EXITED_RING
/// map definitions (aya-ebpf's legacy `bpf_map_def` in the `maps`
/// section: type, key size, value size, max entries, ...) say
/// BPF_MAP_TYPE_ARRAY with 4-byte keys and values, which every kernel can
/// create.
pub(crate) fn object_without_ringbuf(obj: &[u8]) -> Result<AlignedObject, BpfError> {
    let mut out = AlignedObject::new(obj);
    for name in [names::CAPTURE_EVENTS, names::EXITED_RING] {
        as_array(obj, &mut out, name)?;
    }
    Ok(out)
}

/// Rewrites map `name`'s definition in `out` (a copy of `obj`).
fn as_array(obj: &[u8], out: &mut AlignedObject, name: &'static str) -> Result<(), BpfError> {
    use object::{Object, ObjectSection, ObjectSymbol};
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let file = object::File::parse(obj).map_err(|_| BpfError::Missing(name))?;
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .ok_or(BpfError::Missing(name))?;
    let section = sym
        .section_index()
        .and_then(|i| file.section_by_index(i).ok())
        .ok_or(BpfError::Missing(name))?;
    let (file_off, _) = section.file_range().ok_or(BpfError::Missing(name))?;
    let at = (file_off + sym.address() - section.address()) as usize;
    for (i, v) in [BPF_MAP_TYPE_ARRAY, 4, 4, 1].into_iter().enumerate() {
        out.bytes_mut()[at + 4 * i..at + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

/// An ELF image in 8-byte-aligned memory, as aya's parser wants it (what
/// `include_bytes_aligned!` gives the embedded object).
pub(crate) struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    fn new(bytes: &[u8]) -> Self {
        let mut o = Self {
            words: vec![0; bytes.len().div_ceil(8)],
            len: bytes.len(),
        };
        o.bytes_mut().copy_from_slice(bytes);
        o
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; u8 has no alignment or validity requirements.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::{super::EBPF_OBJECT, *};

    #[test]
    fn the_no_ringbuf_object_has_capture_events_as_a_one_entry_array() {
        use object::{Object, ObjectSection, ObjectSymbol};
        let patched = object_without_ringbuf(EBPF_OBJECT).unwrap();
        assert_eq!(patched.bytes().as_ptr() as usize % 8, 0);
        let def = |obj: &[u8]| -> Vec<u32> {
            let f = object::File::parse(obj).unwrap();
            let sym = f
                .symbols()
                .find(|s| s.name() == Ok(names::CAPTURE_EVENTS))
                .unwrap();
            let sec = f.section_by_index(sym.section_index().unwrap()).unwrap();
            let data = sec.data().unwrap();
            let at = (sym.address() - sec.address()) as usize;
            (0..4)
                .map(|i| u32::from_le_bytes(data[at + 4 * i..at + 4 * i + 4].try_into().unwrap()))
                .collect()
        };
        // BPF_MAP_TYPE_RINGBUF (27) with the placeholder size before.
        assert_eq!(def(EBPF_OBJECT)[0], 27);
        assert_eq!(def(patched.bytes()), vec![2, 4, 4, 1]);
        assert_eq!(patched.bytes().len(), EBPF_OBJECT.len());
    }
}
