//! /proc/pressure/{cpu,memory,io} (PSI, Linux 4.20+).
//!
//! Own parser rather than `procfs::CpuPressure` & co: `parse_pressure_record`
//! slices `line[5..]` unchecked and panics on a bare "some" line, and the
//! system-level cpu file has no "full" line before 5.13, which it rejects.
//! PSI compiled out or disabled with psi=0 means the directory is missing
//! (psi_proc_init returns early) or reads fail with EOPNOTSUPP: both are
//! reported as `PsiState::Unavailable`, not as errors.

use std::path::Path;

use super::{fields, parse_u64, read_into, ParseError};

/// Reading or parsing the file failed; carries its path.
pub type PressureError = super::FileError;

/// One "some"/"full" line. Averages are percentages of wall time; total is
/// cumulative stall time in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiRecord {
    pub avg10_pct: f32,
    pub avg60_pct: f32,
    pub avg300_pct: f32,
    pub total_us: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    pub some: PsiRecord,
    /// Absent for system-wide cpu before Linux 5.13.
    pub full: Option<PsiRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsiResource {
    Cpu,
    Memory,
    Io,
}

impl PsiResource {
    pub const ALL: [PsiResource; 3] = [PsiResource::Cpu, PsiResource::Memory, PsiResource::Io];
    pub fn file_name(self) -> &'static str {
        match self {
            PsiResource::Cpu => "cpu",
            PsiResource::Memory => "memory",
            PsiResource::Io => "io",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PsiState {
    Available(Pressure),
    /// PSI not built in, or disabled at boot.
    Unavailable,
}

fn parse_record(rest: &[u8]) -> Result<PsiRecord, ParseError> {
    let (mut a10, mut a60, mut a300, mut total) = (None, None, None, None);
    for kv in fields(rest) {
        let Some(eq) = kv.iter().position(|&b| b == b'=') else {
            return Err(ParseError::Malformed("expected key=value"));
        };
        let (k, v) = (&kv[..eq], &kv[eq + 1..]);
        match k {
            b"avg10" => a10 = Some(parse_avg("avg10", v)?),
            b"avg60" => a60 = Some(parse_avg("avg60", v)?),
            b"avg300" => a300 = Some(parse_avg("avg300", v)?),
            b"total" => total = Some(parse_u64("total", v)?),
            _ => {}
        }
    }
    Ok(PsiRecord {
        avg10_pct: a10.ok_or(ParseError::MissingField("avg10"))?,
        avg60_pct: a60.ok_or(ParseError::MissingField("avg60"))?,
        avg300_pct: a300.ok_or(ParseError::MissingField("avg300"))?,
        total_us: total.ok_or(ParseError::MissingField("total"))?,
    })
}

fn parse_avg(field: &'static str, v: &[u8]) -> Result<f32, ParseError> {
    // The kernel prints "%lu.%02lu"; accept only digits and one dot so that
    // "inf"/"nan" from garbage input are rejected.
    if v.is_empty() || !v.iter().all(|&b| b.is_ascii_digit() || b == b'.') {
        return Err(super::bad_number(field, v));
    }
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse::<f32>().ok())
        .ok_or_else(|| super::bad_number(field, v))
}

/// Parses the text of one pressure file.
pub fn parse_pressure(text: &[u8]) -> Result<Pressure, ParseError> {
    let (mut some, mut full) = (None, None);
    for line in text.split(|&b| b == b'\n') {
        let mut it = line.splitn(2, |&b| b == b' ');
        let key = it.next().unwrap_or(b"");
        let rest = it.next().unwrap_or(b"");
        match key {
            b"some" => some = Some(parse_record(rest)?),
            b"full" => full = Some(parse_record(rest)?),
            _ => {}
        }
    }
    Ok(Pressure {
        some: some.ok_or(ParseError::MissingField("some"))?,
        full,
    })
}

pub fn read_pressure(
    proc_root: &Path,
    resource: PsiResource,
    buf: &mut Vec<u8>,
) -> Result<PsiState, PressureError> {
    let path = proc_root.join("pressure").join(resource.file_name());
    match read_into(&path, buf) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT) | Some(libc::EOPNOTSUPP)
            ) =>
        {
            return Ok(PsiState::Unavailable)
        }
        Err(source) => return Err(PressureError::Read { path, source }),
    }
    parse_pressure(buf)
        .map(PsiState::Available)
        .map_err(|source| PressureError::Parse { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_some_and_full() {
        let p = parse_pressure(
            b"some avg10=7.36 avg60=4.96 avg300=3.28 total=19609541\n\
full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )
        .unwrap();
        assert!((p.some.avg10_pct - 7.36).abs() < 1e-4);
        assert_eq!(p.some.total_us, 19_609_541);
        assert_eq!(p.full.unwrap().total_us, 0);
    }

    #[test]
    fn cpu_without_full_line_before_5_13() {
        let p = parse_pressure(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n").unwrap();
        assert_eq!(p.full, None);
    }

    #[test]
    fn bare_some_is_an_error_not_a_panic() {
        assert!(parse_pressure(b"some").is_err());
        assert!(parse_pressure(b"some avg10=inf avg60=0 avg300=0 total=1").is_err());
    }

    #[test]
    fn absent_psi_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let mut buf = Vec::new();
        for r in PsiResource::ALL {
            assert_eq!(
                read_pressure(dir.path(), r, &mut buf).unwrap(),
                PsiState::Unavailable
            );
        }
    }
}
