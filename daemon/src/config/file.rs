//! Reading the config file without ever blocking the daemon's main loop or
//! its memory, and bounding what errors quote of it.

use std::path::Path;

use super::ConfigError;

/// The largest config file read: real ones are a few KiB, and the TOML
/// parser holds ~250x the text in memory (a 5.3 MB file of 300k tables took
/// 1.4 GB).
pub const MAX_CONFIG_BYTES: u64 = 256 << 10;

/// The longest message an error carries (toml quotes the offending line,
/// serde the offending value): bounded so a reload error stays small in
/// status, dump and the log.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `s`, cut to at most `max_bytes` at a char boundary, with a marker saying
/// how long it was.
pub fn bounded(s: &str, max_bytes: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max_bytes {
        return s.into();
    }
    let mut end = max_bytes;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [truncated: {} bytes in all]", &s[..end], s.len()).into()
}

/// The text of the config file at `path`, without ever blocking: opened
/// O_NONBLOCK (a FIFO's open(2) would wait for a writer), then fstat'ed on
/// that descriptor, read only if it is a regular file and only up to one
/// byte past [`MAX_CONFIG_BYTES`].
pub(super) fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    use std::{
        io::Read,
        os::unix::fs::{FileTypeExt, OpenOptionsExt},
    };
    let read_err = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(read_err)?;
    let ft = f.metadata().map_err(read_err)?.file_type();
    if !ft.is_file() {
        let kind = if ft.is_fifo() {
            "a FIFO or pipe"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a file"
        };
        return Err(ConfigError::NotRegular {
            path: path.to_owned(),
            kind,
        });
    }
    let mut bytes = Vec::new();
    f.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_owned(),
            limit_bytes: MAX_CONFIG_BYTES,
        });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ConfigError::Empty {
            path: path.to_owned(),
        });
    }
    String::from_utf8(bytes).map_err(|e| {
        read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
        ))
    })
}
