//! Kernel frames of off-CPU and waker stacks, symbolised with blazesym
//! from /proc/kallsyms (the running kernel's own table: no file the target
//! controls is opened, and no vmlinux is searched for).
//!
//! Where kallsyms hides its addresses (kptr_restrict 2, or 1 without
//! CAP_SYSLOG, which vitalsd does not keep: Android's default) every
//! address reads as 0; then each frame says so instead of resolving every
//! address to one wrong symbol.

use std::{collections::HashMap, path::Path};

use blazesym::{
    symbolize::{source, Input, Symbolized, Symbolizer},
    MaybeDefault,
};

use crate::perfetto::fault_samples::{SampleFrame, SampleMapping};

/// The mapping every kernel frame is given (perf's name for it).
const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// Resolved kernel frames, by address, for the whole capture (the kernel's
/// text does not move while it runs; modules loaded later resolve anew).
pub struct KernelFrames {
    symbolizer: Symbolizer,
    done: HashMap<u64, SampleFrame>,
    /// Whether kallsyms shows addresses, read on first use.
    visible: Option<bool>,
}

impl KernelFrames {
    pub fn new() -> Self {
        Self {
            symbolizer: Symbolizer::new(),
            done: HashMap::new(),
            visible: None,
        }
    }

    pub fn get(&self, addr: u64) -> Option<&SampleFrame> {
        self.done.get(&addr)
    }

    /// Resolves those of `addrs` not resolved yet; each ends up with a
    /// frame, named or saying why not. Returns how many were named.
    pub fn resolve(&mut self, addrs: &[u64]) -> (u64, u64) {
        let mut todo: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.done.contains_key(a))
            .collect();
        todo.sort_unstable();
        todo.dedup();
        if todo.is_empty() {
            return (0, 0);
        }
        let visible = *self
            .visible
            .get_or_insert_with(|| kallsyms_visible(Path::new("/proc/kallsyms")));
        let names: Result<Vec<Option<String>>, String> = if !visible {
            Err("kernel symbols hidden (kptr_restrict)".into())
        } else {
            let src = source::Kernel {
                kallsyms: MaybeDefault::Default,
                vmlinux: MaybeDefault::None,
                kaslr_offset: Some(0),
                debug_syms: false,
                ..Default::default()
            };
            self.symbolizer
                .symbolize(&source::Source::Kernel(src), Input::AbsAddr(&todo))
                .map(|syms| symbol_names(&syms))
                .map_err(|e| format!("reading /proc/kallsyms: {e}"))
        };
        let mut named = (0, 0);
        for (i, &addr) in todo.iter().enumerate() {
            let function = match &names {
                Ok(n) => match n.get(i).cloned().flatten() {
                    Some(name) => {
                        named.0 += 1;
                        name
                    }
                    None => {
                        named.1 += 1;
                        "[unsymbolised: no kernel symbol covers it]".into()
                    }
                },
                Err(why) => {
                    named.1 += 1;
                    format!("[unsymbolised: {why}]")
                }
            };
            self.done.insert(addr, kernel_frame(addr, function));
        }
        named
    }
}

fn kernel_frame(addr: u64, function: String) -> SampleFrame {
    SampleFrame {
        mapping: SampleMapping {
            start: 0,
            end: 0,
            offset: 0,
            path: KERNEL_MAPPING.into(),
            build_id: None,
        },
        function: Some(function),
        rel_pc: addr,
    }
}

/// Whether `kallsyms` shows real addresses: any line's is not 0. Hidden,
/// every line reads 0; shown, the first lines may still read 0: x86_64
/// lists its per-CPU symbols first, at their offsets from 0
/// (`0000000000000000 A fixed_percpu_data` until Linux 6.15), so the first
/// line alone hid the kernel frames of every 5.10 and 6.1 x86_64 guest.
fn kallsyms_visible(kallsyms: &Path) -> bool {
    use std::io::BufRead;
    let Ok(f) = std::fs::File::open(kallsyms) else {
        return false;
    };
    std::io::BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .any(|line| {
            line.split_whitespace()
                .next()
                .and_then(|a| u64::from_str_radix(a, 16).ok())
                .is_some_and(|a| a != 0)
        })
}

/// The names blazesym found, owned (its results borrow the symbolizer);
/// None where an address resolved to no symbol.
pub(super) fn symbol_names(syms: &[Symbolized]) -> Vec<Option<String>> {
    syms.iter()
        .map(|s| match s {
            Symbolized::Sym(s) => Some(s.name.to_string()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_addresses_are_told_from_real_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kallsyms");
        std::fs::write(&p, "0000000000000000 T _stext\n").unwrap();
        assert!(!kallsyms_visible(&p));
        std::fs::write(&p, "ffffffff81000000 T _stext\n").unwrap();
        assert!(kallsyms_visible(&p));
        // x86_64 before 6.15: per-CPU symbols first, the first at 0.
        std::fs::write(
            &p,
            "0000000000000000 A fixed_percpu_data\n\
             0000000000000000 A __per_cpu_start\n\
             ffffffff81000000 T _stext\n",
        )
        .unwrap();
        assert!(kallsyms_visible(&p));
        std::fs::write(
            &p,
            "0000000000000000 A fixed_percpu_data\n0000000000000000 T _stext\n",
        )
        .unwrap();
        assert!(!kallsyms_visible(&p));
        assert!(!kallsyms_visible(&dir.path().join("none")));
    }

    #[test]
    fn a_kernel_function_resolves_by_its_kallsyms_address() {
        // A symbol of the running kernel, by the address kallsyms gives.
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let Some(addr) = text.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == "schedule").then(|| u64::from_str_radix(f[0], 16).unwrap())
        }) else {
            return;
        };
        let mut k = KernelFrames::new();
        if addr == 0 {
            // Hidden here: every frame says so.
            k.resolve(&[1]);
            assert!(k
                .get(1)
                .unwrap()
                .function
                .as_ref()
                .unwrap()
                .contains("kptr_restrict"));
            return;
        }
        assert_eq!(k.resolve(&[addr + 4, addr + 4]), (1, 0));
        assert_eq!(
            k.get(addr + 4).unwrap().function.as_deref(),
            Some("schedule")
        );
    }
}
