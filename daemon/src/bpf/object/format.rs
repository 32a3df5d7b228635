//! Tracepoint `format` files as the kernel writes them (field names,
//! offsets and sizes), parsed without reading any: `bpf::tracefs` reads
//! them. Field offsets change between kernels, so the classic programs get
//! them as globals.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TracefsError {
    #[error(
        "tracefs is not mounted and mounting it on {path} failed: {source} \
         (needs CAP_SYS_ADMIN, or mount it: mount -t tracefs nodev {path})"
    )]
    Mount {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no field `{field}` in the tracepoint format")]
    NoField { path: PathBuf, field: String },
}

/// One field line of a tracepoint format: `field:pid_t pid; offset:24; size:4; signed:1;`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldFormat {
    pub name: String,
    pub offset: u32,
    pub size: u32,
}

#[derive(Debug, Clone)]
pub struct EventFormat {
    path: PathBuf,
    pub fields: Vec<FieldFormat>,
}

impl EventFormat {
    pub fn parse(path: PathBuf, text: &str) -> Self {
        let mut fields = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            let Some(decl) = line.strip_prefix("field:") else {
                continue;
            };
            let mut parts = decl.split(';').map(str::trim);
            let Some(decl) = parts.next() else { continue };
            // "char prev_comm[16]" or "__data_loc char[] comm": the name is the
            // last word, minus any array suffix.
            let Some(last) = decl.split_whitespace().last() else {
                continue;
            };
            let name = last.split('[').next().unwrap_or(last).to_owned();
            let mut offset = None;
            let mut size = None;
            for p in parts {
                if let Some(v) = p.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = p.strip_prefix("size:") {
                    size = v.parse().ok();
                }
            }
            if let (Some(offset), Some(size)) = (offset, size) {
                fields.push(FieldFormat { name, offset, size });
            }
        }
        Self { path, fields }
    }

    /// Offset of `field`, checking its size so a type change is an error
    /// rather than a silently wrong read.
    pub fn offset_of(&self, field: &str, size: u32) -> Result<u32, TracefsError> {
        self.fields
            .iter()
            .find(|f| f.name == field && f.size == size)
            .map(|f| f.offset)
            .ok_or_else(|| TracefsError::NoField {
                path: self.path.clone(),
                field: format!("{field} (size {size})"),
            })
    }
}

#[cfg(test)]
pub(in crate::bpf) mod tests {
    use super::*;

    pub(in crate::bpf) const FREE_6_18: &str = "name: sched_process_free
ID: 300
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:16;\tsize:4;\tsigned:1;

print fmt: \"comm=%s pid=%d prio=%d\", __get_str(comm), REC->pid, REC->prio
";

    #[test]
    fn data_loc_fields_move_pid() {
        let f = EventFormat::parse("free".into(), FREE_6_18);
        assert_eq!(f.offset_of("pid", 4).unwrap(), 12);
        assert_eq!(f.offset_of("comm", 4).unwrap(), 8);
        assert!(
            f.offset_of("pid", 8).is_err(),
            "size mismatch must be an error"
        );
        assert!(f.offset_of("missing", 4).is_err());
    }

    #[test]
    fn array_field_names() {
        let f = EventFormat::parse(
            "switch".into(),
            "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
             \tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n",
        );
        assert_eq!(f.offset_of("prev_comm", 16).unwrap(), 8);
        assert_eq!(f.offset_of("prev_state", 8).unwrap(), 32);
    }
}
