//! Reading a BTF file (Documentation/bpf/btf.rst) without its type graph:
//! the string section, each type's header, and only the kind-specific data
//! a lookup asks for, read in passes over the type section.

use std::{
    cell::RefCell,
    collections::{BTreeSet, HashMap},
    io::{BufReader, Read, Seek, SeekFrom},
};

use super::Lookup;

pub(super) const BTF_MAGIC: u16 = 0xeb9f;
pub(super) const KIND_INT: u32 = 1;
pub(super) const KIND_PTR: u32 = 2;
pub(super) const KIND_ARRAY: u32 = 3;
pub(super) const KIND_STRUCT: u32 = 4;
pub(super) const KIND_UNION: u32 = 5;
pub(super) const KIND_ENUM: u32 = 6;
pub(super) const KIND_TYPEDEF: u32 = 8;
pub(super) const KIND_VOLATILE: u32 = 9;
pub(super) const KIND_CONST: u32 = 10;
pub(super) const KIND_RESTRICT: u32 = 11;
pub(super) const KIND_FUNC: u32 = 12;
pub(super) const KIND_FUNC_PROTO: u32 = 13;
pub(super) const KIND_VAR: u32 = 14;
pub(super) const KIND_DATASEC: u32 = 15;
pub(super) const KIND_DECL_TAG: u32 = 17;
pub(super) const KIND_TYPE_TAG: u32 = 18;
pub(super) const KIND_ENUM64: u32 = 19;

fn u32_at(data: &[u8], off: usize) -> Option<u32> {
    data.get(off..off + 4)
        .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
}

/// What a lookup has read of a BTF file: the string section, every type's
/// 12-byte header (1.5 MiB for vmlinux's ~130k types), and the
/// kind-specific data (members, parameters) of the few types a lookup has
/// asked for. The whole type section (3+ MiB) is never held at once, nor
/// parsed into a type graph, which is what made aya's parse cost the
/// daemon ~20 MiB at start-up: a lookup that asks for a type's data it
/// does not have yet records the id and gets `None`, and `kernel_btf_in`
/// reads those and asks again (`Types::needed`).
pub(super) struct Types {
    sections: Sections,
    strings: Vec<u8>,
    /// Header of type id `i + 1`.
    headers: Vec<Header>,
    /// Kind-specific data, as 32-bit words, of the types asked for so far.
    bodies: HashMap<u32, Vec<u32>>,
    /// Ids whose data a lookup wanted and `bodies` lacked.
    pub(super) needed: RefCell<BTreeSet<u32>>,
}

#[derive(Clone, Copy)]
struct Header {
    name_off: u32,
    /// `size` or `type`, by kind.
    size_or_type: u32,
    vlen: u16,
    kind: u8,
    kind_flag: bool,
}

#[derive(Clone, Copy)]
pub(super) struct TypeRecord {
    pub(super) id: u32,
    name_off: u32,
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    /// `size` or `type`, by kind.
    size_or_type: u32,
}

/// The header's section bounds, as absolute file offsets.
struct Sections {
    types: (u64, u32),
    strings: (u64, u32),
}

/// Largest string section read: vmlinux's is ~2.3 MiB.
const MAX_STRINGS_BYTES: u32 = 64 << 20;

fn io_err(e: std::io::Error) -> Lookup {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Lookup::Malformed("truncated".into()),
        _ => Lookup::Io(e),
    }
}

impl Types {
    pub(super) fn read<R: Read + Seek>(file: &mut R) -> Result<Self, Lookup> {
        let sections = read_header(file)?;
        let (str_at, str_len) = sections.strings;
        if str_len > MAX_STRINGS_BYTES {
            return Err(Lookup::Malformed(format!("{str_len}-byte string section")));
        }
        let mut strings = vec![0; str_len as usize];
        file.seek(SeekFrom::Start(str_at)).map_err(io_err)?;
        file.read_exact(&mut strings).map_err(io_err)?;
        let mut types = Self {
            sections,
            strings,
            headers: Vec::new(),
            bodies: HashMap::new(),
            needed: RefCell::default(),
        };
        types.scan(file, true)?;
        Ok(types)
    }

    /// One pass over the type section: with `headers`, records every
    /// type's header; keeps the data of the types `needed` names.
    pub(super) fn scan<R: Read + Seek>(
        &mut self,
        file: &mut R,
        headers: bool,
    ) -> Result<(), Lookup> {
        let (at, len) = self.sections.types;
        file.seek(SeekFrom::Start(at)).map_err(io_err)?;
        let mut input = BufReader::with_capacity(64 << 10, file.take(u64::from(len)));
        let needed = std::mem::take(self.needed.get_mut());
        let (mut off, mut id, mut body) = (0u64, 1u32, Vec::new());
        while off < u64::from(len) {
            let mut head = [0u8; 12];
            input
                .read_exact(&mut head)
                .map_err(|_| Lookup::Malformed(format!("truncated type at {off}")))?;
            let rec = record(id, &head);
            let extra = extra_len(&rec).ok_or_else(|| {
                Lookup::Malformed(format!("unknown kind {} of type {id}", rec.kind))
            })?;
            body.resize(extra, 0);
            input
                .read_exact(&mut body)
                .map_err(|_| Lookup::Malformed(format!("truncated type at {off}")))?;
            if headers {
                self.headers.push(Header {
                    name_off: rec.name_off,
                    size_or_type: rec.size_or_type,
                    vlen: rec.vlen as u16,
                    kind: rec.kind as u8,
                    kind_flag: rec.kind_flag,
                });
            }
            if needed.contains(&id) {
                let words = body
                    .chunks_exact(4)
                    .map(|w| u32::from_ne_bytes(w.try_into().unwrap()));
                self.bodies.insert(id, words.collect());
            }
            off += 12 + extra as u64;
            id += 1;
        }
        Ok(())
    }

    fn get(&self, id: u32) -> Option<TypeRecord> {
        let h = self.headers.get(id.checked_sub(1)? as usize)?;
        Some(TypeRecord {
            id,
            name_off: h.name_off,
            kind: u32::from(h.kind),
            vlen: u32::from(h.vlen),
            kind_flag: h.kind_flag,
            size_or_type: h.size_or_type,
        })
    }

    /// Word `i` of `rec`'s kind-specific data; None (and `rec` noted as
    /// needed) while that data has not been read.
    fn word(&self, rec: &TypeRecord, i: usize) -> Option<u32> {
        match self.bodies.get(&rec.id) {
            Some(words) => words.get(i).copied(),
            None => {
                self.needed.borrow_mut().insert(rec.id);
                None
            }
        }
    }

    fn name(&self, name_off: u32) -> &str {
        let rest = self.strings.get(name_off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    pub(super) fn find(&self, kind: u32, name: &str) -> Option<TypeRecord> {
        (1..=self.headers.len() as u32)
            .filter_map(|id| self.get(id))
            .find(|r| r.kind == kind && self.name(r.name_off) == name)
    }

    /// Member `name`'s byte offset in a struct or union, looking through
    /// anonymous struct/union members.
    pub(super) fn member_offset(&self, rec: &TypeRecord, name: &str) -> Option<u32> {
        if rec.kind != KIND_STRUCT && rec.kind != KIND_UNION {
            return None;
        }
        for i in 0..rec.vlen as usize {
            let (m_name, m_type, m_off) = (
                self.word(rec, 3 * i)?,
                self.word(rec, 3 * i + 1)?,
                self.word(rec, 3 * i + 2)?,
            );
            // With kind_flag the top 8 bits are a bitfield size.
            let bits = if rec.kind_flag {
                m_off & 0xff_ffff
            } else {
                m_off
            };
            if m_name == 0 {
                let inner = self.get(self.skip_modifiers(m_type))?;
                if let Some(off) = self.member_offset(&inner, name) {
                    return Some(bits / 8 + off);
                }
            } else if self.name(m_name) == name {
                return (bits % 8 == 0).then_some(bits / 8);
            }
        }
        None
    }

    fn skip_modifiers(&self, mut id: u32) -> u32 {
        while let Some(r) = self.get(id) {
            match r.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = r.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    /// A short name for a parameter type: `void` for void and `void *`, the
    /// pointee's name for other pointers, the type's own name otherwise.
    fn param_name(&self, id: u32) -> &str {
        let id = self.skip_modifiers(id);
        let Some(r) = self.get(id) else {
            return "void";
        };
        if r.kind == KIND_PTR {
            let pointee = self.skip_modifiers(r.size_or_type);
            return match self.get(pointee) {
                Some(p) => self.name(p.name_off),
                None => "void",
            };
        }
        self.name(r.name_off)
    }

    /// Parameter type names of typedef `name` = pointer to function proto.
    pub(super) fn proto_params(&self, name: &str) -> Option<Vec<&str>> {
        let td = self.find(KIND_TYPEDEF, name)?;
        let ptr = self.get(self.skip_modifiers(td.size_or_type))?;
        if ptr.kind != KIND_PTR {
            return None;
        }
        let proto = self.get(self.skip_modifiers(ptr.size_or_type))?;
        if proto.kind != KIND_FUNC_PROTO {
            return None;
        }
        (0..proto.vlen as usize)
            .map(|i| self.word(&proto, 2 * i + 1).map(|t| self.param_name(t)))
            .collect()
    }
}

fn read_header<R: Read>(file: &mut R) -> Result<Sections, Lookup> {
    let mut head = [0u8; 24];
    file.read_exact(&mut head)
        .map_err(|_| Lookup::Malformed("shorter than a BTF header".into()))?;
    let magic = u16::from_ne_bytes([head[0], head[1]]);
    if magic != BTF_MAGIC {
        return Err(Lookup::Malformed(format!(
            "bad magic {magic:#x} (other endianness?)"
        )));
    }
    let field = |i: usize| u32_at(&head, 4 + 4 * i).unwrap();
    let (hdr_len, type_off, type_len, str_off, str_len) =
        (field(0), field(1), field(2), field(3), field(4));
    let at = |off: u32| u64::from(hdr_len) + u64::from(off);
    Ok(Sections {
        types: (at(type_off), type_len),
        strings: (at(str_off), str_len),
    })
}

fn record(id: u32, head: &[u8; 12]) -> TypeRecord {
    let word = |i: usize| u32_at(head, 4 * i).unwrap();
    let info = word(1);
    TypeRecord {
        id,
        name_off: word(0),
        kind: (info >> 24) & 0x1f,
        vlen: info & 0xffff,
        kind_flag: info >> 31 != 0,
        size_or_type: word(2),
    }
}

/// Bytes of kind-specific data after the header; None for unknown kinds.
fn extra_len(r: &TypeRecord) -> Option<usize> {
    let vlen = r.vlen as usize;
    Some(match r.kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG
        2 | 7..=12 | 16 | KIND_TYPE_TAG => 0,
        _ => return None,
    })
}
