//! Structural checks of the produced object against the AOSP layout,
//! without a loader: they parse the object the way Loader.cpp does and
//! check what it would find (android-check runs the real one).

use object::{
    read::elf::{ElfFile64, FileHeader as _},
    LittleEndian as LE, Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionIndex,
    SymbolKind,
};

use super::{defs::*, extract::*, *};

fn aya_obj() -> Option<Vec<u8>> {
    let p = aya_object(&crate::util::workspace_root());
    match std::fs::read(&p) {
        Ok(d) => Some(d),
        Err(_) => {
            eprintln!(
                "{} not built (cargo build -p vitalsd): skipped",
                p.display()
            );
            None
        }
    }
}

#[test]
fn layout_constants_match_aosp() {
    // bpf_map_def.h _Static_asserts.
    assert_eq!(MAP_DEF_SIZE, 120);
    assert_eq!(PROG_DEF_SIZE, 92);
    assert_eq!(kver(5, 19, 0), 0x0513_0000);
    // sched_process_free: no helper past the 5.10 floor any more.
    let d = prog_def(&PROGRAMS[3]);
    assert_eq!(PROGRAMS[3].func, "sched_process_free");
    assert_eq!(
        u32::from_le_bytes(d[8..12].try_into().unwrap()),
        kver(5, 8, 0)
    );
    assert_eq!(u32::from_le_bytes(d[24..28].try_into().unwrap()), 0x10000);
    assert_eq!(
        prog_pin_name(PROGRAMS[0].section),
        "prog_vitals_tracepoint_sched_sched_switch"
    );
}

#[test]
fn bpfloader_settings_fold_the_phones_choices_and_keep_the_rest() {
    let Some(input) = aya_obj() else { return };
    let aya = ElfFile64::<LE>::parse(&*input).unwrap();
    let rodata = aya.section_by_name(".rodata").unwrap().index();
    let setting = |name: &str| {
        let s = aya
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("{name} not in the aya object"));
        let (a, n) = (s.address() as usize, s.size() as usize);
        rodata_setting(&aya, rodata, a, n)
    };
    for name in ["FREE_PID_OFF", "TRACK_WAIT"] {
        assert_eq!(setting(name), None, "{name}");
    }
    // The phone's choices (BPFLOADER_SETTINGS), each a symbol of .rodata.
    for (name, v) in [
        ("PER_CAPTURE_MAPS", 0),
        ("EXIT_RING", 1),
        ("WAKE_ARRAY", 1),
        ("COUNT_PROCESS_FAULTS", 0),
    ] {
        assert_eq!(setting(name), Some(v), "{name}");
    }
}

#[test]
fn converted_object_has_bpfloader_structure() {
    let Some(input) = aya_obj() else { return };
    let aya = ElfFile64::<LE>::parse(&*input).unwrap();
    let out = convert(&input).unwrap();
    let obj = ElfFile64::<LE>::parse(&*out).unwrap();
    let hdr = obj.elf_header();
    let shstrndx = hdr.e_shstrndx(LE) as usize;

    // Symbol names go through the section-header string table (Loader.cpp
    // getSymName): the symtab's string table must be that same section.
    let symtab = obj.section_by_name(".symtab").unwrap();
    let sections = hdr.sections(LE, &*out).unwrap();
    let symtab_hdr = sections.section(symtab.index()).unwrap();
    assert_eq!(symtab_hdr.sh_link.get(LE) as usize, shstrndx);

    check_maps(&aya, &obj);
    // progs: one def per program, named <func>_def.
    let progs = obj.section_by_name("progs").unwrap();
    assert_eq!(progs.data().unwrap().len(), PROGRAMS.len() * PROG_DEF_SIZE);
    let prog_syms: Vec<String> = obj
        .symbols()
        .filter(|s| s.section_index() == Some(progs.index()))
        .map(|s| s.name().unwrap().to_owned())
        .collect();

    for spec in &PROGRAMS {
        check_program(&aya, &obj, spec, &prog_syms);
    }
    // Only our program sections are code sections bpfloader would see.
    let code_secs = obj
        .sections()
        .filter(|s| {
            let n = s.name().unwrap();
            n.starts_with("tracepoint/") || n.starts_with("perf_event/")
        })
        .count();
    assert_eq!(code_secs, PROGRAMS.len());

    assert_eq!(
        obj.section_by_name("license").unwrap().data().unwrap(),
        b"GPL\0"
    );
    for (name, v) in [
        ("bpfloader_min_ver", BPFLOADER_MIN_VER),
        ("bpfloader_max_ver", BPFLOADER_MAX_VER),
        ("size_of_bpf_map_def", 120),
        ("size_of_bpf_prog_def", 92),
    ] {
        let d = obj.section_by_name(name).unwrap().data().unwrap();
        assert_eq!(u32_at(d, 0).unwrap(), v, "{name}");
    }
    assert!(obj.section_by_name(".BTF").is_none());
}

/// maps: N x 120 bytes, one symbol per def in st_value order, no section
/// symbol, and each def is our map.
fn check_maps(aya: &ElfFile64<LE>, obj: &ElfFile64<LE>) {
    let (_, aya_maps) = read_maps(aya).unwrap();
    let maps = obj.section_by_name("maps").unwrap();
    let data = maps.data().unwrap();
    assert_eq!(data.len(), aya_maps.len() * MAP_DEF_SIZE);
    let mut map_syms: Vec<_> = obj
        .symbols()
        .filter(|s| s.section_index() == Some(maps.index()))
        .map(|s| (s.address(), s.name().unwrap().to_owned()))
        .collect();
    map_syms.sort();
    assert_eq!(map_syms.len(), aya_maps.len());
    for (i, ((addr, name), (_, m))) in map_syms.iter().zip(&aya_maps).enumerate() {
        assert_eq!(*addr as usize, i * MAP_DEF_SIZE);
        assert_eq!(name, &m.name);
        let f = |k: usize| u32_at(data, i * MAP_DEF_SIZE + k).unwrap();
        assert_eq!(f(0), m.map_type, "{name} type");
        assert_eq!(f(4), m.key_size, "{name} key_size");
        assert_eq!(f(8), m.value_size, "{name} value_size");
        let mut fixed = CAPTURE_MAP_ENTRIES.iter().chain(&PHONE_MAP_ENTRIES);
        if let Some((_, n)) = fixed.find(|(c, _)| c == name) {
            assert_eq!(f(12), *n, "{name} max_entries");
        } else if m.map_type == BPF_MAP_TYPE_RINGBUF {
        } else if m.map_type == BPF_MAP_TYPE_PERF_EVENT_ARRAY && m.max_entries == 0 {
            // The kernel refuses 0 (AOSP's loader hit EINVAL there).
            assert_eq!(f(12), PERF_EVENT_ARRAY_ENTRIES, "{name} max_entries");
        } else {
            assert_eq!(f(12), m.max_entries, "{name} max_entries");
        }
        assert_eq!(f(20), 0, "{name}: `zero` must be 0 or bpfloader aborts");
        assert_eq!(f(36), BPFLOADER_MAX_VER);
        assert_eq!(f(44), KVER_INF);
    }
    // Every capture map sized above is one of the object's; the ring
    // buffer a page multiple on any Android page size.
    for (c, _) in CAPTURE_MAP_ENTRIES.iter().chain(&PHONE_MAP_ENTRIES) {
        assert!(aya_maps.iter().any(|(_, m)| m.name == *c), "{c} not a map");
    }
    assert_eq!(CAPTURE_MAP_ENTRIES[0].1 % RINGBUF_MIN_BYTES, 0);
    // Spot-check against the source: TASKS and PROCESS_FAULTS are plain
    // hashes of u32 keys (no per-CPU map needs summing at free).
    for name in ["TASKS", "PROCESS_FAULTS"] {
        let m = aya_maps.iter().find(|(_, m)| m.name == name).unwrap();
        assert_eq!(m.1.map_type, 1, "{name}"); // BPF_MAP_TYPE_HASH
        assert_eq!(m.1.key_size, 4, "{name}");
    }
}

/// One program: its section holds it alone, its def exists, its
/// relocation section follows, and its map loads and constants are the
/// aya object's.
fn check_program(aya: &ElfFile64<LE>, obj: &ElfFile64<LE>, spec: &ProgSpec, prog_syms: &[String]) {
    let maps = obj.section_by_name("maps").unwrap();
    let sec = obj.section_by_name(spec.section).unwrap();
    // First STT_FUNC of the section is the program; its def exists.
    let funcs: Vec<_> = obj
        .symbols()
        .filter(|s| s.section_index() == Some(sec.index()) && s.kind() == SymbolKind::Text)
        .collect();
    assert_eq!(funcs.len(), 1, "{}", spec.section);
    assert_eq!(funcs[0].name().unwrap(), spec.func);
    assert!(prog_syms.contains(&format!("{}_def", spec.func)));
    // The relocation section is the next one, named .rel<section>.
    let next = obj
        .section_by_index(SectionIndex(sec.index().0 + 1))
        .unwrap();
    assert_eq!(next.name().unwrap(), format!(".rel{}", spec.section));
    let code = sec.data().unwrap();
    // Every relocation: an ld_imm64 naming a map symbol at the
    // same place the aya object's relocation named the same map.
    let aya_sym = aya
        .symbols()
        .find(|s| s.name() == Ok(spec.func) && s.kind() == SymbolKind::Text)
        .unwrap();
    let aya_sec = aya
        .section_by_index(aya_sym.section_index().unwrap())
        .unwrap();
    let expected: Vec<(u64, String)> = aya_sec
        .relocations()
        .filter(|(o, _)| *o >= aya_sym.address() && *o < aya_sym.address() + aya_sym.size())
        .filter_map(|(o, r)| {
            let RelocationTarget::Symbol(i) = r.target() else {
                return None;
            };
            let t = aya.symbol_by_index(i).unwrap();
            let in_maps = aya.section_by_index(t.section_index()?).ok()?.name().ok()? == "maps";
            in_maps.then(|| (o - aya_sym.address(), t.name().unwrap().to_owned()))
        })
        .collect();
    let mut got = Vec::new();
    for (off, r) in sec.relocations() {
        let RelocationTarget::Symbol(i) = r.target() else {
            panic!()
        };
        let t = obj.symbol_by_index(i).unwrap();
        assert_eq!(t.section_index(), Some(maps.index()), "{}", spec.section);
        assert_eq!(code[off as usize], BPF_LD_IMM64);
        got.push((off, t.name().unwrap().to_owned()));
    }
    assert!(!got.is_empty(), "{}: no map relocations", spec.section);
    assert_eq!(got, expected, "{}", spec.section);
    // Nothing left pointing at .rodata (bpfloader would load address
    // 0): the ld_imm64s without a relocation must be exactly the
    // aya object's plain 64-bit constants (e.g. BPF_F_CURRENT_CPU),
    // same immediates; a .rodata pointer there had a relocation.
    let relocated: Vec<u64> = got.iter().map(|(o, _)| *o).collect();
    let aya_code = &aya_sec.data().unwrap()
        [aya_sym.address() as usize..(aya_sym.address() + aya_sym.size()) as usize];
    let aya_relocated: Vec<u64> = aya_sec
        .relocations()
        .map(|(o, _)| o.wrapping_sub(aya_sym.address()))
        .collect();
    // The per-capture outers' loads (`.maps`) stay as plain zeros: dead
    // code with PER_CAPTURE_MAPS folded to 0.
    let outer_loads = aya_sec
        .relocations()
        .filter(|(o, _)| *o >= aya_sym.address() && *o < aya_sym.address() + aya_sym.size())
        .filter(|(_, r)| {
            let RelocationTarget::Symbol(i) = r.target() else {
                return false;
            };
            aya.symbol_by_index(i)
                .ok()
                .and_then(|t| t.section_index())
                .and_then(|si| aya.section_by_index(si).ok())
                .is_some_and(|sec| sec.name() == Ok(".maps"))
        })
        .count();
    let mut expected_plain = plain_ld_imm64s(aya_code, &aya_relocated);
    expected_plain.extend(std::iter::repeat_n(0, outer_loads));
    expected_plain.sort_unstable();
    assert_eq!(
        plain_ld_imm64s(code, &relocated),
        expected_plain,
        "{}: unrelocated ld_imm64s differ from the aya object's constants",
        spec.section
    );
}

/// The immediates of the ld_imm64s not at a relocated offset, sorted.
fn plain_ld_imm64s(code: &[u8], relocated: &[u64]) -> Vec<u64> {
    let mut imms = Vec::new();
    let mut k = 0;
    while k + 2 * INSN <= code.len() {
        if code[k] == BPF_LD_IMM64 {
            if !relocated.contains(&(k as u64)) {
                let lo = u32::from_le_bytes(code[k + 4..k + 8].try_into().unwrap());
                let hi = u32::from_le_bytes(code[k + 12..k + 16].try_into().unwrap());
                imms.push(u64::from(hi) << 32 | u64::from(lo));
            }
            k += 2 * INSN;
        } else {
            k += INSN;
        }
    }
    imms.sort_unstable();
    imms
}
