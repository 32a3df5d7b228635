//! Watching the SDK's connection to traced, to count reconnects.
//!
//! The Perfetto SDK reconnects by itself when traced goes away and comes
//! back (TracingMuxerImpl::OnProducerDisconnected, then inotify on the
//! socket's directory plus a backoff timer) and registers the data source
//! again, but tells its user nothing. So we look at our own descriptors:
//! the SDK's connection is the unix socket whose peer address is the
//! producer socket. A connected socket with another inode than the last
//! one is a reconnect. Connected, this costs one readlink per poll; only
//! while disconnected is /proc/self/fd scanned.

use std::{ffi::OsString, os::unix::ffi::OsStringExt, path::Path};

/// The socket the SDK connects to: PERFETTO_PRODUCER_SOCK_NAME, else the
/// platform's default, as perfetto's GetProducerSocket() picks it.
pub(super) fn producer_socket_name() -> OsString {
    if let Some(name) = std::env::var_os("PERFETTO_PRODUCER_SOCK_NAME") {
        return name;
    }
    if cfg!(target_os = "android") {
        return "/dev/socket/traced_producer".into();
    }
    if Path::new("/run/perfetto").is_dir() {
        "/run/perfetto/traced-producer.sock".into()
    } else {
        "/tmp/perfetto-producer".into()
    }
}

/// What a poll saw change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    None,
    Connected { reconnect: bool },
    Lost,
}

pub(super) struct ConnectionWatch {
    /// The peer address to look for: the path's bytes, or for an abstract
    /// socket (`@name`) a NUL followed by the name, as in sun_path.
    peer: Vec<u8>,
    /// (fd, socket inode) of the connection we last saw.
    current: Option<(i32, u64)>,
    ever_connected: bool,
}

impl ConnectionWatch {
    pub(super) fn new(socket_name: OsString) -> Self {
        let mut peer = socket_name.into_vec();
        if peer.first() == Some(&b'@') {
            peer[0] = 0;
        }
        Self {
            peer,
            current: None,
            ever_connected: false,
        }
    }

    pub(super) fn poll(&mut self) -> Change {
        if let Some((fd, ino)) = self.current {
            if socket_inode(fd) == Some(ino) {
                return Change::None;
            }
            self.current = None;
            return Change::Lost;
        }
        let Some(found) = self.find() else {
            return Change::None;
        };
        self.current = Some(found);
        let reconnect = self.ever_connected;
        self.ever_connected = true;
        Change::Connected { reconnect }
    }

    /// The first socket of ours whose peer is the producer socket.
    fn find(&self) -> Option<(i32, u64)> {
        let dir = std::fs::read_dir("/proc/self/fd").ok()?;
        for entry in dir.flatten() {
            let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let Some(ino) = socket_inode(fd) else {
                continue;
            };
            if peer_address(fd).as_deref() == Some(self.peer.as_slice()) {
                return Some((fd, ino));
            }
        }
        None
    }
}

/// The inode of `fd` if it is a socket ("socket:[ino]").
fn socket_inode(fd: i32) -> Option<u64> {
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let s = target.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The address of a connected unix socket's peer: for a client, the path
/// the server's listening socket is bound to. None if not connected.
fn peer_address(fd: i32) -> Option<Vec<u8>> {
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: addr and len describe a writable sockaddr_un; a stale or
    // non-socket fd only makes the call fail.
    let rc = unsafe {
        libc::getpeername(
            fd,
            &mut addr as *mut libc::sockaddr_un as *mut libc::sockaddr,
            &mut len,
        )
    };
    if rc != 0 || addr.sun_family != libc::AF_UNIX as libc::sa_family_t {
        return None;
    }
    let path_len = (len as usize).checked_sub(std::mem::size_of::<libc::sa_family_t>())?;
    let bytes: Vec<u8> = addr.sun_path[..path_len.min(addr.sun_path.len())]
        .iter()
        .map(|&c| c as u8)
        .collect();
    // Pathname sockets may count their trailing NUL in the length.
    let end = if bytes.first() == Some(&0) {
        bytes.len()
    } else {
        bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())
    };
    Some(bytes[..end].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn a_new_connection_after_a_lost_one_is_a_reconnect() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("producer.sock");
        let mut watch = ConnectionWatch::new(path.clone().into_os_string());
        assert_eq!(watch.poll(), Change::None);

        let listener = UnixListener::bind(&path).unwrap();
        let client = UnixStream::connect(&path).unwrap();
        let _server = listener.accept().unwrap();
        assert_eq!(watch.poll(), Change::Connected { reconnect: false });
        assert_eq!(watch.poll(), Change::None);

        drop(client);
        assert_eq!(watch.poll(), Change::Lost);
        assert_eq!(watch.poll(), Change::None);

        let _client = UnixStream::connect(&path).unwrap();
        assert_eq!(watch.poll(), Change::Connected { reconnect: true });
    }

    #[test]
    fn sockets_to_other_peers_are_not_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other.sock");
        let listener = UnixListener::bind(&other).unwrap();
        let _client = UnixStream::connect(&other).unwrap();
        let _server = listener.accept().unwrap();
        let mut watch = ConnectionWatch::new(dir.path().join("producer.sock").into_os_string());
        assert_eq!(watch.poll(), Change::None);
    }
}
