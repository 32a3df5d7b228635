//! The control socket protocol, shared by the daemon and `vitalsctl`.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON.
//! Requests are `{"cmd": ...}` objects; every request gets one response
//! frame `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`
//! ([`protocol`] has every request and reply type).
//! `export` is followed, after its response, by exactly `result.bytes` raw
//! bytes of the trace. Requests longer than the daemon's limit are refused
//! and the connection closed (the stream cannot be resynchronised).

mod handle;
mod listen;
mod outcome;
pub mod protocol;
pub mod render;
pub mod server;
mod shared;
pub mod slots;
mod throttle;

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use serde::de::DeserializeOwned;
use thiserror::Error;

use crate::store::EntryMeta;
use protocol::{ConfigReply, Deleted, DumpReply, ExportHead, OffcpuAsk, Started, Status, TopReply};
pub use protocol::{Request, Response};

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("connecting to {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("daemon sent malformed JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("vitalsd: {0}")]
    Daemon(String),
}

/// `s` safe to print to a terminal, as `ps` prints command names: control
/// characters (C0, DEL, C1) and the bidirectional overrides that reorder
/// text are escaped (`\x1b`, `\n`, `\u{202e}`), so a process named
/// `\e]0;…\a\e[2J` cannot drive the reader's terminal, nor a newline break
/// a table. Borrowed when there is nothing to escape.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x100 && unsafe_char(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> std::io::Result<()> {
    w.write_all(&(body.len() as u32).to_be_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// Reads one frame of at most `max` bytes.
pub fn read_frame(r: &mut impl Read, max: u32) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len);
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {max}"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// Responses can carry a whole capture list or dump.
const MAX_RESPONSE: u32 = 64 << 20;

/// A blocking client, for vitalsctl and tests.
pub struct Client {
    stream: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Self { stream })
    }

    /// Sends a request; returns `result`, read as `R` (the reply type
    /// [`protocol`] names for `req`, or `serde_json::Value` to see the
    /// wire), or the daemon's error.
    pub fn call<R: DeserializeOwned>(&mut self, req: &Request) -> Result<R, ClientError> {
        let sent = write_frame(&mut self.stream, &serde_json::to_vec(req)?);
        // A daemon that refuses a peer answers before reading the request;
        // read its answer even when our write failed.
        let frame = match read_frame(&mut self.stream, MAX_RESPONSE) {
            Ok(f) => f,
            Err(e) => return Err(sent.err().unwrap_or(e).into()),
        };
        // The envelope first: an error reply has no `result` to read as R.
        let resp: Response<serde_json::Value> = serde_json::from_slice(&frame)?;
        if resp.ok {
            Ok(serde_json::from_value(
                resp.result.unwrap_or(serde_json::Value::Null),
            )?)
        } else {
            Err(ClientError::Daemon(resp.error.unwrap_or_default()))
        }
    }

    pub fn status(&mut self) -> Result<Status, ClientError> {
        self.call(&Request::Status {})
    }

    pub fn top(&mut self, n: usize) -> Result<TopReply, ClientError> {
        self.call(&Request::Top { n })
    }

    /// Starts a capture; returns the id it will be stored as.
    pub fn capture(
        &mut self,
        duration_s: f64,
        sched: bool,
        faults: bool,
        offcpu: Option<OffcpuAsk>,
    ) -> Result<Started, ClientError> {
        self.call(&Request::Capture {
            duration_s,
            sched,
            faults,
            offcpu,
        })
    }

    /// Starts a heapprofd profile; returns the id it will be stored as.
    pub fn heap(
        &mut self,
        name: Option<String>,
        pid: Option<u64>,
        duration_s: f64,
    ) -> Result<Started, ClientError> {
        self.call(&Request::Heap {
            name,
            pid,
            duration_s,
        })
    }

    pub fn list(&mut self) -> Result<Vec<EntryMeta>, ClientError> {
        self.call(&Request::List {})
    }

    pub fn delete(&mut self, id: String) -> Result<Deleted, ClientError> {
        self.call(&Request::Delete { id })
    }

    pub fn config(&mut self) -> Result<ConfigReply, ClientError> {
        self.call(&Request::Config {})
    }

    pub fn dump(&mut self) -> Result<DumpReply, ClientError> {
        self.call(&Request::Dump {})
    }

    /// Streams a capture's trace into `out`; returns the byte count.
    pub fn export(&mut self, id: &str, out: &mut impl Write) -> Result<u64, ClientError> {
        let head: ExportHead = self.call(&Request::Export { id: id.into() })?;
        let bytes = head.bytes;
        let copied = std::io::copy(&mut (&mut self.stream).take(bytes), out)?;
        if copied != bytes {
            return Err(ClientError::Daemon(format!(
                "export cut short: {copied} of {bytes} bytes"
            )));
        }
        Ok(copied)
    }

    pub fn stream(&mut self) -> &mut UnixStream {
        &mut self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_what_drives_a_terminal() {
        assert!(matches!(
            printable("sh -c 'x'"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            printable("\x1b]0;owned\x07\x1b[2J\nfake row"),
            "\\x1b]0;owned\\x07\\x1b[2J\\nfake row"
        );
        assert_eq!(printable("a\u{9b}b\u{7f}"), "a\\x9bb\\x7f");
        assert_eq!(printable("\u{202e}txt.exe"), "\\u{202e}txt.exe");
        assert_eq!(printable("zygote64 ünïcode"), "zygote64 ünïcode");
    }

    #[test]
    fn frames_are_length_checked() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"{}").unwrap();
        assert_eq!(read_frame(&mut buf.as_slice(), 10).unwrap(), b"{}");
        let mut big = Vec::new();
        write_frame(&mut big, &[b' '; 100]).unwrap();
        assert!(read_frame(&mut big.as_slice(), 10).is_err());
        assert!(read_frame(&mut &b"\x00\x00"[..], 10).is_err());
    }
}
