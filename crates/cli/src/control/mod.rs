//! The control plane of running volumes: one Unix socket per served volume, named after the
//! volume (`open DEVICE NAME`), in a per-user runtime directory; `status`, `close`,
//! `refresh`, `luksSuspend` and `luksResume` talk to it (`client`), the serving process
//! answers (`server`) over a small line-delimited JSON protocol (`proto`). The served
//! device sits behind a swappable [`gate::Gate`].
//!
//! The directory is `$SEALDISK_RUNTIME_DIR` if set, else `$XDG_RUNTIME_DIR/sealdisk`, else
//! `/run/sealdisk` for root, else `/tmp/sealdisk-$UID`; it is created 0700 and refused when
//! it is a symlink, not a directory, owned by someone else, or open to group or others.

pub mod client;
pub mod gate;
pub mod proto;
pub mod server;

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::actions::UsageError;

/// The longest volume name (device-mapper's `DM_NAME_LEN` is 128 with its NUL).
const NAME_MAX: usize = 127;

/// A Unix socket path is at most this long (`sun_path` is 108 bytes with its NUL).
const SUN_PATH_MAX: usize = 107;

/// The runtime directory, without creating or checking it.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SEALDISK_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("sealdisk");
    }
    let uid = rustix::process::geteuid();
    if uid.is_root() {
        PathBuf::from("/run/sealdisk")
    } else {
        PathBuf::from(format!("/tmp/sealdisk-{}", uid.as_raw()))
    }
}

/// Checks a volume name: what cryptsetup accepts as a mapping name, and usable as a file name.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.len() > NAME_MAX {
        bail!(UsageError(format!("invalid volume name {name:?} (1 to {NAME_MAX} bytes, not . or ..)")));
    }
    if name.chars().any(|c| c == '/' || c.is_control()) {
        bail!(UsageError(format!("invalid volume name {name:?}: no '/' or control characters")));
    }
    Ok(())
}

/// Checks that `dir` is a private directory of this user: a real directory (not a
/// symlink), owned by the effective user, with no group or other permission bits.
pub fn check_dir(dir: &Path) -> Result<()> {
    let m = std::fs::symlink_metadata(dir).with_context(|| format!("runtime directory {}", dir.display()))?;
    if !m.file_type().is_dir() {
        bail!("runtime directory {} is not a directory", dir.display());
    }
    let uid = rustix::process::geteuid().as_raw();
    if m.uid() != uid {
        bail!(
            "runtime directory {} is owned by uid {}, not by this user (uid {uid}): refusing it",
            dir.display(),
            m.uid()
        );
    }
    if m.mode() & 0o077 != 0 {
        bail!(
            "runtime directory {} has mode {:04o}: it must not be open to group or others (0700)",
            dir.display(),
            m.mode() & 0o7777
        );
    }
    Ok(())
}

/// The runtime directory, created 0700 when missing, and checked ([`check_dir`]).
pub fn ensure_runtime_dir() -> Result<PathBuf> {
    let dir = runtime_dir();
    match DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating runtime directory {}", dir.display())),
    }
    check_dir(&dir)?;
    Ok(dir)
}

/// The control socket of volume `name` in `dir`.
pub fn socket_path(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(format!("{name}.ctl"));
    if p.as_os_str().len() > SUN_PATH_MAX {
        bail!(UsageError(format!(
            "control socket path {} is longer than {SUN_PATH_MAX} bytes: use a shorter name or SEALDISK_RUNTIME_DIR",
            p.display()
        )));
    }
    Ok(p)
}

/// cryptsetup's refusal of a name in use.
#[derive(Debug, thiserror::Error)]
#[error("Device {0} already exists.")]
pub struct NameInUse(pub String);

/// The right to serve as `name`: the lock file `NAME.lock` held (`flock`, exclusive) for
/// the life of the server, and the path its control socket binds. A socket file left by a
/// dead server is removed; a live one means the name is taken ([`NameInUse`]).
#[derive(Debug)]
pub struct Claim {
    pub name: String,
    pub socket: PathBuf,
    _lock: File,
}

/// Claims `name` (see [`Claim`]). Cheap: done before a volume is unlocked.
pub fn claim(name: &str) -> Result<Claim> {
    check_name(name)?;
    let dir = ensure_runtime_dir()?;
    let socket = socket_path(&dir, name)?;
    let lock_path = dir.join(format!("{name}.lock"));
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => bail!(NameInUse(name.to_owned())),
        Err(e) => return Err(e).with_context(|| format!("locking {}", lock_path.display())),
    }
    // We hold the lock: a socket file here belongs to a server that died without removing
    // it (a live one would hold the lock). Say so if something still answers on it.
    if std::fs::symlink_metadata(&socket).is_ok() {
        if UnixStream::connect(&socket).is_ok() {
            bail!(NameInUse(name.to_owned()));
        }
        log::info!("removing the stale control socket {}", socket.display());
        std::fs::remove_file(&socket).with_context(|| format!("removing stale {}", socket.display()))?;
    }
    Ok(Claim { name: name.to_owned(), socket, _lock: lock })
}

/// A cheap early refusal of a name in use, before a volume is unlocked: a server answers on
/// its control socket. Nothing is created or locked; [`claim`] decides for good afterwards.
pub fn ensure_free(name: &str) -> Result<()> {
    let path = find(name)?;
    if UnixStream::connect(&path).is_ok() {
        bail!(NameInUse(name.to_owned()));
    }
    Ok(())
}

/// The control socket of a running volume `name`, for the client commands. The runtime
/// directory must pass [`check_dir`] when it exists: a client never talks to (or sends a
/// passphrase to) a socket someone else could have put there.
pub fn find(name: &str) -> Result<PathBuf> {
    check_name(name)?;
    let dir = runtime_dir();
    if std::fs::symlink_metadata(&dir).is_ok() {
        check_dir(&dir)?;
    }
    socket_path(&dir, name)
}
