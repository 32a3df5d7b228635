//! The Android object's ELF, laid out by hand with `object`'s ELF types:
//! section and symbol names share one string table, and each code
//! section's relocations follow it, as Loader.cpp requires (module docs).

use anyhow::{ensure, Context, Result};
use object::{
    elf,
    read::elf::{ElfFile64, FileHeader as _},
    LittleEndian as LE, Object, ObjectSection, U16, U32, U64,
};

use super::{
    defs::{map_def, prog_def},
    extract::{extract_prog, read_maps, MapInfo, Prog, R_BPF_64_64},
    BPFLOADER_MAX_VER, BPFLOADER_MIN_VER, MAP_DEF_SIZE, PROGRAMS, PROG_DEF_SIZE,
};

/// A string table shared by section and symbol names (see module docs).
#[derive(Default)]
struct StrTab(Vec<u8>);

impl StrTab {
    fn add(&mut self, s: &str) -> u32 {
        if self.0.is_empty() {
            self.0.push(0);
        }
        let off = self.0.len() as u32;
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        off
    }
}

struct OutSection {
    name: u32,
    sh_type: u32,
    flags: u64,
    data: Vec<u8>,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
}

/// Builds the Android object from the aya object's bytes.
pub fn convert(input: &[u8]) -> Result<Vec<u8>> {
    let obj = ElfFile64::<LE>::parse(input).context("parsing the aya object")?;
    ensure!(
        obj.elf_header().e_machine(LE) == elf::EM_BPF,
        "not a BPF object"
    );
    let (maps_idx, maps) = read_maps(&obj)?;
    let progs = PROGRAMS
        .iter()
        .map(|spec| extract_prog(&obj, spec, maps_idx, &maps))
        .collect::<Result<Vec<_>>>()?;
    let license = obj
        .section_by_name("license")
        .context("no license section")?
        .data()?
        .to_vec();

    let mut b = Builder::default();
    let strtab_name = b.strtab.add(".strtab");
    let symtab_name = b.strtab.add(".symtab");
    b.code_sections(&progs);
    let map_sym = b.maps_section(&maps);
    b.progs_section(&progs);
    b.progbits("license", elf::SHF_ALLOC, license, 1);
    for (name, v) in [
        ("bpfloader_min_ver", BPFLOADER_MIN_VER),
        ("bpfloader_max_ver", BPFLOADER_MAX_VER),
        ("size_of_bpf_map_def", MAP_DEF_SIZE as u32),
        ("size_of_bpf_prog_def", PROG_DEF_SIZE as u32),
    ] {
        b.progbits(name, elf::SHF_ALLOC, v.to_le_bytes().to_vec(), 4);
    }
    b.fill_relocations(&progs, &map_sym);

    // [0] null, [1] .strtab (also the section-header string table),
    // [2] .symtab, then the rest (FIRST_SECTION).
    let mut all = vec![
        OutSection {
            name: strtab_name,
            sh_type: elf::SHT_STRTAB,
            flags: 0,
            data: b.strtab.0.clone(),
            link: 0,
            info: 0,
            align: 1,
            entsize: 0,
        },
        OutSection {
            name: symtab_name,
            sh_type: elf::SHT_SYMTAB,
            flags: 0,
            data: b.symtab(),
            link: 1,
            info: 1,
            align: 8,
            entsize: 24,
        },
    ];
    all.extend(b.secs);
    Ok(write_elf(&all))
}

/// Index of the first section after null, .strtab and .symtab.
const FIRST_SECTION: usize = 3;

/// One global symbol: name, section index, value, size, type.
struct Sym(u32, u16, u64, u64, u8);

/// The sections after .strtab and .symtab, the symbols, and the names.
#[derive(Default)]
struct Builder {
    strtab: StrTab,
    secs: Vec<OutSection>,
    syms: Vec<Sym>,
}

impl Builder {
    fn next_index(&self) -> u16 {
        (FIRST_SECTION + self.secs.len()) as u16
    }

    fn progbits(&mut self, name: &str, flags: u32, data: Vec<u8>, align: u64) {
        let name = self.strtab.add(name);
        self.secs.push(OutSection {
            name,
            sh_type: elf::SHT_PROGBITS,
            flags: u64::from(flags),
            data,
            link: 0,
            info: 0,
            align,
            entsize: 0,
        });
    }

    /// Each program's code section, its function symbol, and right after
    /// it an empty `.rel<section>` (Loader.cpp reads the next section).
    fn code_sections(&mut self, progs: &[Prog]) {
        for p in progs {
            let code_idx = self.next_index();
            self.progbits(
                p.spec.section,
                elf::SHF_ALLOC | elf::SHF_EXECINSTR,
                p.code.clone(),
                8,
            );
            let name = self.strtab.add(p.spec.func);
            let size = p.code.len() as u64;
            self.syms.push(Sym(name, code_idx, 0, size, elf::STT_FUNC));
            let name = self.strtab.add(&format!(".rel{}", p.spec.section));
            self.secs.push(OutSection {
                name,
                sh_type: elf::SHT_REL,
                flags: 0,
                data: Vec::new(), // fill_relocations, once map symbols are known
                link: 2,
                info: u32::from(code_idx),
                align: 8,
                entsize: 16,
            });
        }
    }

    /// The `maps` section and one symbol per def, in def order; returns
    /// each map's symbol index.
    fn maps_section(&mut self, maps: &[(u64, MapInfo)]) -> Vec<usize> {
        let idx = self.next_index();
        let mut data = Vec::new();
        let mut map_sym = Vec::new();
        for (i, (_, m)) in maps.iter().enumerate() {
            data.extend_from_slice(&map_def(m));
            map_sym.push(self.syms.len() + 1); // +1: the null symbol
            let name = self.strtab.add(&m.name);
            let at = (i * MAP_DEF_SIZE) as u64;
            let size = MAP_DEF_SIZE as u64;
            self.syms.push(Sym(name, idx, at, size, elf::STT_OBJECT));
        }
        self.progbits("maps", elf::SHF_ALLOC | elf::SHF_WRITE, data, 4);
        map_sym
    }

    /// The `progs` section, with each def named `<function>_def`.
    fn progs_section(&mut self, progs: &[Prog]) {
        let idx = self.next_index();
        let mut data = Vec::new();
        for (i, p) in progs.iter().enumerate() {
            data.extend_from_slice(&prog_def(p.spec));
            let name = self.strtab.add(&format!("{}_def", p.spec.func));
            let at = (i * PROG_DEF_SIZE) as u64;
            let size = PROG_DEF_SIZE as u64;
            self.syms.push(Sym(name, idx, at, size, elf::STT_OBJECT));
        }
        self.progbits("progs", elf::SHF_ALLOC, data, 4);
    }

    /// Each `.rel<section>`: the program's map loads against the maps'
    /// symbols.
    fn fill_relocations(&mut self, progs: &[Prog], map_sym: &[usize]) {
        for (k, p) in progs.iter().enumerate() {
            let mut d = Vec::new();
            for &(off, m) in &p.relocs {
                let r = elf::Rel64::<LE> {
                    r_offset: U64::new(LE, off),
                    r_info: U64::new(LE, ((map_sym[m] as u64) << 32) | u64::from(R_BPF_64_64)),
                };
                d.extend_from_slice(object::bytes_of(&r));
            }
            self.secs[2 * k + 1].data = d;
        }
    }

    /// The symbol table: null + globals (no locals, so sh_info = 1).
    fn symtab(&self) -> Vec<u8> {
        let mut symtab = vec![0u8; 24];
        for &Sym(name, shndx, value, size, ty) in &self.syms {
            let s = elf::Sym64::<LE> {
                st_name: U32::new(LE, name),
                st_info: (elf::STB_GLOBAL << 4) | ty,
                st_other: elf::STV_DEFAULT,
                st_shndx: U16::new(LE, shndx),
                st_value: U64::new(LE, value),
                st_size: U64::new(LE, size),
            };
            symtab.extend_from_slice(object::bytes_of(&s));
        }
        symtab
    }
}

fn write_elf(secs: &[OutSection]) -> Vec<u8> {
    let align = |v: &mut Vec<u8>, a: usize| {
        while !v.len().is_multiple_of(a) {
            v.push(0)
        }
    };
    let mut out = vec![0u8; 64];
    let mut offsets = Vec::new();
    for s in secs {
        align(&mut out, s.align.max(1) as usize);
        offsets.push(out.len() as u64);
        out.extend_from_slice(&s.data);
    }
    align(&mut out, 8);
    let shoff = out.len() as u64;
    out.extend_from_slice(&[0u8; 64]); // null section header
    for (s, off) in secs.iter().zip(&offsets) {
        let h = elf::SectionHeader64::<LE> {
            sh_name: U32::new(LE, s.name),
            sh_type: U32::new(LE, s.sh_type),
            sh_flags: U64::new(LE, s.flags),
            sh_addr: U64::new(LE, 0),
            sh_offset: U64::new(LE, *off),
            sh_size: U64::new(LE, s.data.len() as u64),
            sh_link: U32::new(LE, s.link),
            sh_info: U32::new(LE, s.info),
            sh_addralign: U64::new(LE, s.align),
            sh_entsize: U64::new(LE, s.entsize),
        };
        out.extend_from_slice(object::bytes_of(&h));
    }
    let hdr = elf::FileHeader64::<LE> {
        e_ident: elf::Ident {
            magic: elf::ELFMAG,
            class: elf::ELFCLASS64,
            data: elf::ELFDATA2LSB,
            version: elf::EV_CURRENT,
            os_abi: elf::ELFOSABI_NONE,
            abi_version: 0,
            padding: [0; 7],
        },
        e_type: U16::new(LE, elf::ET_REL),
        e_machine: U16::new(LE, elf::EM_BPF),
        e_version: U32::new(LE, u32::from(elf::EV_CURRENT)),
        e_entry: U64::new(LE, 0),
        e_phoff: U64::new(LE, 0),
        e_shoff: U64::new(LE, shoff),
        e_flags: U32::new(LE, 0),
        e_ehsize: U16::new(LE, 64),
        e_phentsize: U16::new(LE, 0),
        e_phnum: U16::new(LE, 0),
        e_shentsize: U16::new(LE, 64),
        e_shnum: U16::new(LE, (secs.len() + 1) as u16),
        e_shstrndx: U16::new(LE, 1),
    };
    out[..64].copy_from_slice(object::bytes_of(&hdr));
    out
}
