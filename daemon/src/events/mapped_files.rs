//! The files behind a process's mappings, for symbols: /proc/<pid>/maps
//! parsed, and the mapped file opened without trusting the target's paths.
//!
//! The paths in a target's maps are the target's to choose: it can unlink
//! its mapped file and put a FIFO named `<path> (deleted)` in its place, or
//! live in another mount namespace. So a mapped file is opened through
//! `/proc/<pid>/map_files/` (needs CAP_SYS_ADMIN) or else the target's own
//! root `/proc/<pid>/root/<path>`, non-blocking, and used only if it is a
//! regular file of bounded size whose device and inode are the mapping's.
//! blazesym then reads that open file through `/proc/self/fd/<n>`, never
//! the path again.

use std::{
    fs::File,
    os::{
        fd::AsRawFd,
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
};

/// Largest ELF file read for symbols; a larger one is left unsymbolised.
const MAX_ELF_BYTES: u64 = 1 << 30;

/// Why a frame has no name, and whether a later flush may do better.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unsymbolised {
    pub why: String,
    /// A passing cause (the flush's time budget, a read the kernel failed
    /// for want of memory or fds): the frame is tried again later. The
    /// rest (no such mapping, not the file mapped, no symbol) stay so for
    /// the process's image.
    pub transient: bool,
}

impl Unsymbolised {
    pub fn permanent(why: impl Into<String>) -> Self {
        Self {
            why: why.into(),
            transient: false,
        }
    }

    pub fn transient(why: impl Into<String>) -> Self {
        Self {
            why: why.into(),
            transient: true,
        }
    }
}

/// An error that says nothing about the file or the process, only about
/// the moment: out of fds or memory, interrupted, would block.
pub(super) fn transient_io(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR | libc::EAGAIN)
    )
}

/// A file's identity: (device (major, minor), inode).
pub(super) type FileId = ((u32, u32), u64);

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

/// A path to an open file that blazesym can open again: the same file,
/// whatever happens to the name it was mapped from.
pub(super) fn fd_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Opens the file behind mapping `m` of `pid`, or says why not. Never
/// blocks (O_NONBLOCK: a FIFO opens at once and is then refused), never
/// resolves the target's path in our mount namespace, and only accepts the
/// very file mapped (device and inode as in maps).
pub(super) fn open_mapped_file(
    proc_root: &Path,
    pid: u32,
    m: &MapEntry,
) -> Result<File, Unsymbolised> {
    if !m.path.starts_with('/') || m.inode == 0 {
        return Err(Unsymbolised::permanent("not a file mapping"));
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
    let (mut why, mut transient) = (Vec::new(), false);
    for candidate in [map_file, rooted, PathBuf::from(path)] {
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&candidate)
        {
            Ok(f) => f,
            Err(e) => {
                transient |= transient_io(&e);
                why.push(format!("opening {}: {e}", candidate.display()));
                continue;
            }
        };
        let meta = f.metadata().map_err(|e| Unsymbolised {
            transient: transient_io(&e),
            why: format!("fstat: {e}"),
        })?;
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        if !meta.file_type().is_file() {
            return Err(Unsymbolised::permanent("not a regular file"));
        }
        if dev != m.dev || meta.ino() != m.inode {
            why.push(format!(
                "{} is not the file mapped (replaced, or another namespace's)",
                candidate.display()
            ));
            continue;
        }
        if meta.len() > MAX_ELF_BYTES {
            return Err(Unsymbolised::permanent(format!(
                "file over {} MiB",
                MAX_ELF_BYTES >> 20
            )));
        }
        return Ok(f);
    }
    Err(Unsymbolised {
        why: why.join("; "),
        transient,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = open_mapped_file(dir.path(), 42, &ok).unwrap_err().why;
        assert!(e.contains("not the file mapped"), "{e}");

        // A FIFO opens at once (O_NONBLOCK) and is refused, not read.
        let fifo = fake_mapping(dir.path(), "fifo (deleted)", |p| {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
        });
        let fifo = MapEntry {
            path: "/fifo (deleted) (deleted)".into(),
            ..fifo
        };
        let e = open_mapped_file(dir.path(), 42, &fifo).unwrap_err().why;
        assert!(e.contains("not a regular file"), "{e}");

        let anon = MapEntry {
            path: "[heap]".into(),
            inode: 0,
            ..ok
        };
        assert!(open_mapped_file(dir.path(), 42, &anon).is_err());
    }
}
