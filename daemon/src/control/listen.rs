//! The control socket's listening end: inherited from Android init, or
//! bound here (never over a live daemon's socket), with the group that
//! lets allowlisted non-root peers reach it on a Linux host.

use std::{
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
};

use thiserror::Error;

/// Binding or inheriting the control socket failed.
#[derive(Debug, Error)]
pub enum ServerError {
    #[error("control socket {path}: {op}: {source}")]
    Socket {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The listening socket: the one Android init created from vitalsd.rc's
/// `socket vitalsd stream 0660 system system` line when there is one
/// (`ANDROID_SOCKET_<name>`; /dev/socket is not writable by uid system), else
/// a socket bound here, given `group` (`control.group`) when set.
pub fn bind_or_inherit(
    path: &Path,
    group: Option<&str>,
) -> Result<std::os::unix::net::UnixListener, ServerError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match inherited_socket(name) {
        Some(result) => {
            if group.is_some() {
                // init's `socket` line sets the group; ours would not apply.
                log::warn!("control.group ignored: the socket is the one init created");
            }
            result.map_err(|source| ServerError::Socket {
                op: "use the socket init created",
                path: path.to_owned(),
                source,
            })
        }
        None => bind(path, group),
    }
}

/// The environment variable Android init sets for a `socket <name>` line
/// (libcutils ANDROID_SOCKET_ENV_PREFIX).
pub fn android_socket_env(name: &str) -> String {
    format!("ANDROID_SOCKET_{name}")
}

/// `Some` when init handed us a socket for `name`: checks that the fd is a
/// Unix stream socket, marks it close-on-exec (the heapprofd client must not
/// inherit it), listens and makes it non-blocking.
fn inherited_socket(name: &str) -> Option<std::io::Result<std::os::unix::net::UnixListener>> {
    use std::os::fd::{FromRawFd, RawFd};
    let value = std::env::var(android_socket_env(name)).ok()?;
    Some((|| {
        let fd: RawFd = value.trim().parse().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}={value:?} is not a descriptor", android_socket_env(name)),
            )
        })?;
        // SAFETY: only inspected here; ownership is taken below once it is
        // known to be a socket.
        let st = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })?;
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("descriptor {fd} from init is not a socket"),
            ));
        }
        // SAFETY: init passed us this descriptor and nothing else owns it.
        let l = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
        nix::fcntl::fcntl(
            &l,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
        // init binds but does not listen; a second listen() only resets the backlog.
        if unsafe { libc::listen(fd, 128) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        l.set_nonblocking(true)?;
        Ok(l)
    })())
}

/// The gid of `control.group`: a group name, or a numeric gid.
pub fn resolve_group(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!("no group named {group:?}")),
        Err(e) => Err(format!("looking up group {group:?}: {e}")),
    }
}

/// Binds the socket with mode 0660 (owner root, group `group` when set:
/// the filesystem lets the group's members connect, and SO_PEERCRED
/// against `allowed_uids` stays the authority). An existing socket is
/// replaced only when stale: one another process still listens on (a
/// second daemon with the same `control.socket`) is an error, since
/// removing it would leave that daemon running but unreachable.
pub fn bind(
    path: &Path,
    group: Option<&str>,
) -> Result<std::os::unix::net::UnixListener, ServerError> {
    let err = |op| {
        move |source| ServerError::Socket {
            op,
            path: path.to_owned(),
            source,
        }
    };
    let gid = match group.map(resolve_group).transpose() {
        Ok(gid) => gid,
        Err(why) => {
            return Err(err("control.group")(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                why,
            )))
        }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err("create directory"))?;
    }
    // Only a stale socket is ours to remove: a misconfigured
    // `control.socket` must not delete a file or directory (lstat, so a
    // symlink is not followed either).
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // A socket nobody listens on refuses connect() (ECONNREFUSED);
            // one that accepts belongs to a live server.
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => return Err(err(
                    "another process is serving this socket (a second vitalsd?); refusing to start",
                )(std::io::Error::from(
                    std::io::ErrorKind::AddrInUse,
                ))),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(err("probe the existing socket")(e)),
            }
            match std::fs::remove_file(path) {
                Ok(()) => log::info!("removed stale control socket {}", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(err("remove stale")(e)),
            }
        }
        Ok(_) => {
            return Err(err("refusing to replace what is not a socket")(
                std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("lstat")(e)),
    }
    let l = std::os::unix::net::UnixListener::bind(path).map_err(err("bind"))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(err("chown to control.group"))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(err("chmod"))?;
    l.set_nonblocking(true).map_err(err("set_nonblocking"))?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_replaces_a_stale_socket_but_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        drop(bind(&sock, None).unwrap());
        // A stale socket from an earlier run is replaced.
        assert!(bind(&sock, None).is_ok());

        let file = dir.path().join("precious");
        std::fs::write(&file, b"keep").unwrap();
        let e = bind(&file, None).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");

        // A symlink to a socket is not followed into removing it.
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&sock, &link).unwrap();
        assert!(bind(&link, None).is_err());
        assert!(sock.exists());
    }

    #[test]
    fn bind_refuses_a_socket_someone_listens_on() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let live = bind(&sock, None).unwrap();
        let e = bind(&sock, None).unwrap_err().to_string();
        assert!(e.contains("another process is serving"), "{e}");
        // Still the live listener's socket: a client reaches it.
        let _c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        assert!(live.accept().is_ok());
    }

    #[test]
    fn bind_gives_the_socket_control_group() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        // chown to another group needs CAP_CHOWN: the daemon binds as root.
        let gid = if nix::unistd::geteuid().is_root() {
            4242
        } else {
            nix::unistd::getegid().as_raw()
        };
        let _l = bind(&sock, Some(&gid.to_string())).unwrap();
        let md = std::fs::metadata(&sock).unwrap();
        assert_eq!((md.gid(), md.mode() & 0o777), (gid, 0o660));
        let e = bind(&dir.path().join("t.sock"), Some("no-such-group-vitalsd"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no group named"), "{e}");
    }
}
