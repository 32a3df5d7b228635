//! Finding the whole packets of a trace file, and opening one safely.
//!
//! A Perfetto trace is a sequence of `TracePacket`s, each field 1 of `Trace`,
//! length-delimited: tag byte `0x0a`, a varint length, the payload. The
//! writer pushes whole packets to the file, so a capture ended by a crash, a
//! write error or the store's per-capture limit decodes once it is cut after
//! its last whole packet. The scan reads packet headers through a bounded
//! buffer and seeks over payloads: memory stays constant whatever the size
//! of the trace, and a trace of large packets costs a few reads per packet.
//!
//! Files renamed into the store may come from `heapprofd/`, which the
//! perfetto domain can write: [`open_trace`] never follows a symlink and
//! accepts only a regular file with one link, and everything after works on
//! that descriptor (ftruncate, fchmod, fsync), never on the path again.

use std::{
    fs::{File, OpenOptions},
    io::{BufReader, Read, Seek},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::Path,
};

use super::{io, StoreError};

/// Read buffer of the scan.
const SCAN_BUFFER_BYTES: usize = 64 * 1024;
/// `Trace.packet` (field 1, wire type 2).
const PACKET_TAG: u8 = 0x0a;

/// Why a scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// At the end of the file, after a whole packet.
    End,
    /// At a partial packet, or bytes that are not a packet header.
    Partial,
    /// The next whole packet would have taken the trace past the limit.
    Limit,
}

/// The outcome of a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Bytes of whole packets from the start, at most the limit.
    pub whole_bytes: u64,
    pub packets: u64,
    pub stop: Stop,
}

/// Reads a varint; `None` at the end of the input or past 10 bytes.
fn read_varint(r: &mut impl Read) -> std::io::Result<Option<(u64, u64)>> {
    let mut value = 0u64;
    for i in 0..10u32 {
        let mut b = [0u8];
        if r.read(&mut b)? == 0 {
            return Ok(None);
        }
        value |= u64::from(b[0] & 0x7f) << (7 * i);
        if b[0] & 0x80 == 0 {
            return Ok(Some((value, u64::from(i) + 1)));
        }
    }
    Ok(None)
}

/// Scans the first `len` bytes of `r` for whole packets, keeping at most
/// `limit` bytes of them.
pub fn scan<R: Read + Seek>(mut r: R, len: u64, limit: u64) -> std::io::Result<Scan> {
    r.rewind()?;
    let mut r = BufReader::with_capacity(SCAN_BUFFER_BYTES, r);
    let mut pos = 0u64;
    let mut packets = 0u64;
    let stop = loop {
        if pos >= len {
            break Stop::End;
        }
        let mut tag = [0u8];
        if r.read(&mut tag)? == 0 || tag[0] != PACKET_TAG {
            break Stop::Partial;
        }
        let Some((payload, varint_bytes)) = read_varint(&mut r)? else {
            break Stop::Partial;
        };
        let end = pos
            .checked_add(1 + varint_bytes)
            .and_then(|p| p.checked_add(payload));
        match end {
            Some(end) if end <= len => {
                if end > limit {
                    break Stop::Limit;
                }
                // payload <= len, which a file size keeps below i64::MAX.
                r.seek_relative(payload as i64)?;
                pos = end;
                packets += 1;
            }
            _ => break Stop::Partial,
        }
    };
    Ok(Scan {
        whole_bytes: pos,
        packets,
        stop,
    })
}

/// Opens a trace for cutting without following a symlink, and checks that
/// it is a regular file with no other link (a hard link to a file outside
/// the store would otherwise be cut and chmod'ed).
pub fn open_trace(path: &Path) -> Result<File, StoreError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        // A FIFO planted under the name: O_RDWR opens one without waiting on
        // Linux, O_NONBLOCK makes sure; the type check below then refuses it.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io("open", path))?;
    let st = f.metadata().map_err(io("fstat", path))?;
    if !st.file_type().is_file() || st.nlink() != 1 {
        return Err(StoreError::NotRegular(path.to_owned()));
    }
    Ok(f)
}

/// Cuts the open trace `f` after its last whole packet within `limit`
/// bytes. `path` names it in errors only.
pub fn cut(f: &File, path: &Path, limit: u64) -> Result<Scan, StoreError> {
    let len = f.metadata().map_err(io("fstat", path))?.len();
    let s = scan(f, len, limit).map_err(io("read", path))?;
    if s.whole_bytes < len {
        f.set_len(s.whole_bytes).map_err(io("truncate", path))?;
    }
    Ok(s)
}

/// Cuts a trace file after its last whole packet, so a capture ended by a
/// write error still decodes. Returns the new length. Refuses symlinks and
/// anything but a singly linked regular file.
pub fn truncate_to_whole_packets(path: &Path) -> Result<u64, StoreError> {
    let f = open_trace(path)?;
    let s = cut(&f, path, u64::MAX)?;
    f.sync_all().map_err(io("fsync", path))?;
    Ok(s.whole_bytes)
}
