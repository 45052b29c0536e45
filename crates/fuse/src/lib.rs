//! The volume as a single file in a FUSE mount: `DIR/NAME`, what nbdfuse gives an NBD
//! export, served in-process over an `Arc<dyn BlockDevice>`. Knows nothing of crypto.
//!
//! ```text
//!   mkfs.ext4 / losetup / qemu-img / dd ──► DIR/NAME (a regular file, size = the volume)
//!                                              │ kernel FUSE, direct I/O
//!                                    /dev/fuse, one cloned fd per request thread
//!                                              │
//!   fuser Session ── N threads ──► VolumeFs (lookup, getattr, open, read, write, fsync,
//!                                              │  flush, fallocate, statfs)
//!                                  VolumeIo: bytes → covering blocks, read-modify-write
//!                                              │  under a RangeLock
//!                                    Arc<dyn BlockDevice> (crypt, integrity, ...)
//! ```
//!
//! * **Mounting** goes through `fusermount3` (Debian package `fuse3`) with `auto_unmount`:
//!   no libfuse and no root. When the server dies, fusermount3 unmounts. `fusermount3`
//!   refuses `auto_unmount` to an unprivileged user unless `/etc/fuse.conf` has
//!   `user_allow_other` (it verifies the mount as root, which needs `allow_other`); the
//!   mount then goes ahead without it, with a warning.
//! * **Direct I/O** (`FOPEN_DIRECT_IO`): no page cache for the file. Its users (a loop
//!   device's filesystem, a VM, mkfs) cache what they need; a second copy in the FUSE file's
//!   cache would double the memory and delay errors. Every read and write reaches the device
//!   with the caller's offsets; `O_DIRECT` users (`losetup --direct-io`, `qemu cache=none`)
//!   work as well. `FOPEN_PARALLEL_DIRECT_WRITES` lets writes run in parallel (otherwise the
//!   kernel holds the inode lock across each one), and shared `mmap` is allowed where the
//!   kernel offers `FUSE_DIRECT_IO_ALLOW_MMAP` (6.6+).
//! * **Size is fixed**: no create, unlink, rename or truncate (`EPERM`); a write at the end
//!   gets `ENOSPC`, one crossing it a short write, as with a block device.
//! * **fallocate**: `PUNCH_HOLE|KEEP_SIZE` writes zeroes that may deallocate (a raw file
//!   gets a hole; a crypt volume stores encrypted zeroes): `fallocate(2)` promises zeroes
//!   there, and the loop driver sends a filesystem's write-zeroes as punch-hole, so a
//!   dm-crypt discard (garbage on read) would lose them; `ZERO_RANGE` writes zeroes; a plain
//!   allocation inside the file succeeds (every byte already exists); anything else is
//!   `EOPNOTSUPP`.
//! * **Errors** map to an errno per request ([`io::errno_of`]): an integrity mismatch is
//!   `EIO` for the request that met it, nothing else.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod fs;
pub mod io;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blockdev::BlockDevice;
use fuser::{Config, MountOption, Session, SessionACL};

pub use fs::VolumeFs;
pub use io::VolumeIo;

/// Why the volume could not be mounted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FuseError {
    /// `/dev/fuse` is missing or not a character device.
    #[error("/dev/fuse is not available: load the kernel's fuse module (modprobe fuse), or give the container the device")]
    NoDevice,
    /// No `fusermount3` on the `PATH`.
    #[error("fusermount3 was not found on PATH (Debian/Ubuntu package fuse3)")]
    NoFusermount,
    /// The mount directory does not exist.
    #[error("mount directory {0} does not exist")]
    DirMissing(PathBuf),
    /// The mount path is not a directory.
    #[error("{0} is not a directory")]
    NotDirectory(PathBuf),
    /// The mount directory has entries (they would be hidden while mounted).
    #[error("mount directory {0} is not empty")]
    DirNotEmpty(PathBuf),
    /// The mount directory cannot be written by this user, so fusermount3 would refuse it.
    #[error("no write permission on mount directory {0}")]
    DirNotWritable(PathBuf),
    /// The directory is a FUSE mount whose server is gone, and not one of sealdisk's.
    #[error("{0} is a dead FUSE mount (its server is gone); unmount it first: fusermount3 -u {0}")]
    DeadMount(PathBuf),
    /// The file name is not a single path component.
    #[error("{0:?} cannot be a file name (empty, '.', '..', or contains '/' or NUL)")]
    BadName(String),
    /// Reading the mount directory failed.
    #[error("reading mount directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The mount itself failed (fusermount3's message is in the source).
    #[error("mounting FUSE on {path}")]
    Mount {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The request loop failed.
    #[error("FUSE session on {path} failed")]
    Session {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// How to serve the file.
#[derive(Debug, Clone)]
pub struct FuseConfig {
    /// The file's name inside the mount directory.
    pub name: String,
    /// Request threads (requests in flight at once), at least 1.
    pub threads: usize,
    /// Mount read-only; the file is 0400 and writes fail with `EROFS`.
    pub read_only: bool,
}

/// Checks what mounting on `dir` needs: `/dev/fuse`, `fusermount3`, and `dir` an
/// existing, empty directory this user may write. Cheap, so a caller runs it before any
/// expensive step (a key derivation). It changes nothing, with one exception: a sealdisk
/// mount left behind dead on `dir` (its server was killed and fusermount3's auto-unmount
/// lost a race with the kernel, which fusermount3 3.14 can) is unmounted, lazily.
pub fn check_mountpoint(dir: &Path) -> Result<(), FuseError> {
    check_device(Path::new("/dev/fuse"))?;
    let Some(fusermount) = find_fusermount() else {
        return Err(FuseError::NoFusermount);
    };
    // A dead mount may still answer stat from the kernel's attribute cache; listing it
    // needs its server, so it is the listing that tells.
    let listed = match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(FuseError::NotDirectory(dir.into())),
        Ok(_) => std::fs::read_dir(dir),
        Err(e) => Err(e),
    };
    let mut entries = match listed {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(FuseError::DirMissing(dir.into())),
        Err(e) if is_dead_connection(&e) => {
            reclaim_dead_mount(dir, &fusermount)?;
            if !std::fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
                return Err(FuseError::NotDirectory(dir.into()));
            }
            std::fs::read_dir(dir).map_err(|source| FuseError::Dir { path: dir.into(), source })?
        }
        Err(source) => return Err(FuseError::Dir { path: dir.into(), source }),
    };
    if entries.next().is_some() {
        return Err(FuseError::DirNotEmpty(dir.into()));
    }
    if !rustix::process::geteuid().is_root() && rustix::fs::access(dir, rustix::fs::Access::WRITE_OK).is_err()
    {
        return Err(FuseError::DirNotWritable(dir.into()));
    }
    Ok(())
}

/// What the kernel answers for a FUSE mount whose server has gone.
fn is_dead_connection(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ECONNABORTED))
}

/// The file system type of the mount on `dir` (the last one, the visible one), from
/// /proc/self/mountinfo; `dir` itself is not touched (a dead mount cannot be stat'ed).
fn mount_type(dir: &Path) -> Option<String> {
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let full = std::fs::canonicalize(parent).ok()?.join(dir.file_name()?);
    let full = full.to_str()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            (unescape_mountinfo(point) == full).then(|| right.split(' ').next().unwrap_or("").to_owned())
        })
        .next_back()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and tab, newline, backslash).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = (b[i] == b'\\' && i + 3 < b.len())
            .then(|| &b[i + 1..i + 4])
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::try_from(d.iter().fold(0u32, |n, c| n * 8 + u32::from(c - b'0'))).ok());
        if let Some(code) = code {
            out.push(code);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts a dead `fuse.sealdisk` mount on `dir`; any other dead mount is refused.
fn reclaim_dead_mount(dir: &Path, fusermount: &Path) -> Result<(), FuseError> {
    if mount_type(dir).as_deref() != Some("fuse.sealdisk") {
        return Err(FuseError::DeadMount(dir.into()));
    }
    log::warn!("{} holds a dead sealdisk mount (its server was killed); unmounting it", dir.display());
    let out = std::process::Command::new(fusermount)
        .args(["-u", "-z", "--"])
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| FuseError::Dir { path: dir.into(), source })?;
    if !out.status.success() {
        log::warn!("{}: {}", fusermount.display(), String::from_utf8_lossy(&out.stderr).trim());
        return Err(FuseError::DeadMount(dir.into()));
    }
    Ok(())
}

/// `path` (`/dev/fuse`) is a character device.
fn check_device(path: &Path) -> Result<(), FuseError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_char_device() => Ok(()),
        _ => Err(FuseError::NoDevice),
    }
}

/// The `fusermount3` fuser will run: `$FUSERMOUNT_PATH`, else the first on `PATH` (or the
/// usual system directories).
fn find_fusermount() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FUSERMOUNT_PATH") {
        let p = PathBuf::from(p);
        return rustix::fs::access(&p, rustix::fs::Access::EXEC_OK).is_ok().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/bin", "/sbin", "/usr/sbin"].map(PathBuf::from))
        .map(|d| d.join("fusermount3"))
        .find(|p| rustix::fs::access(p, rustix::fs::Access::EXEC_OK).is_ok())
}

fn check_name(name: &str) -> Result<(), FuseError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(FuseError::BadName(name.to_owned()));
    }
    Ok(())
}

/// A mounted volume file, not yet serving: [`Mounted::unmounter`] for the signal handler,
/// then [`Mounted::run`].
pub struct Mounted {
    session: Session<VolumeFs>,
    dir: PathBuf,
    threads: usize,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("dir", &self.dir)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

/// Unmounts a [`Mounted`] from another thread (a signal handler's).
#[derive(Debug)]
pub struct Unmounter {
    dir: PathBuf,
}

impl Unmounter {
    /// Unmounts, detached (`fusermount3 -u -z`): the name disappears at once, and a user
    /// that still has the file open (a loop device, say) keeps it until it closes it; the
    /// server serves it until then. (fuser's own unmounter cannot be used with
    /// `auto_unmount`: it only closes fusermount3's socket, and fusermount3 leaves a file
    /// system that still answers mounted.)
    pub fn unmount(&mut self) {
        let Some(fusermount) = find_fusermount() else {
            log::warn!("cannot unmount {}: fusermount3 is gone", self.dir.display());
            return;
        };
        match std::process::Command::new(&fusermount)
            .args(["-u", "-z", "--"])
            .arg(&self.dir)
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => log::warn!(
                "unmounting {}: {} {}",
                self.dir.display(),
                fusermount.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => log::warn!("unmounting {}: running {}: {e}", self.dir.display(), fusermount.display()),
        }
    }
}

/// Mounts `device` as the file `dir/name` (checking everything [`check_mountpoint`]
/// checks first). The kernel may send requests as soon as this returns; they wait until
/// [`Mounted::run`].
pub fn mount(dir: &Path, device: Arc<dyn BlockDevice>, cfg: &FuseConfig) -> Result<Mounted, FuseError> {
    check_name(&cfg.name)?;
    check_mountpoint(dir)?;
    let threads = cfg.threads.max(1);
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let mut options = vec![
        MountOption::FSName(format!("sealdisk:{}", cfg.name)),
        MountOption::Subtype("sealdisk".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        MountOption::NoAtime,
    ];
    options.push(if cfg.read_only { MountOption::RO } else { MountOption::RW });
    let fs = || VolumeFs::new(device.clone(), &cfg.name, uid, gid, cfg.read_only);
    // auto_unmount: fusermount3 stays behind and unmounts when this process dies. It must
    // be able to check the mount as root, hence allow_other at the kernel, with fuser
    // turning away everyone but this user and root (SessionACL::RootAndOwner); the file's
    // 0600 mode (default_permissions) keeps others out as well.
    let mut config = Config::default();
    config.mount_options = options.clone();
    config.mount_options.push(MountOption::AutoUnmount);
    config.acl = SessionACL::RootAndOwner;
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let session = match Session::new(fs(), dir, &config) {
        Ok(s) => s,
        Err(e)
            if e.kind() == std::io::ErrorKind::PermissionDenied && !rustix::process::geteuid().is_root() =>
        {
            log::warn!(
                "fusermount3 refused auto_unmount ({e}); mounting without it: if this process is killed, \
                 run `fusermount3 -u {}` (or set user_allow_other in /etc/fuse.conf)",
                dir.display()
            );
            config.mount_options = options;
            config.acl = SessionACL::Owner;
            Session::new(fs(), dir, &config)
                .map_err(|source| FuseError::Mount { path: dir.into(), source })?
        }
        Err(source) => return Err(FuseError::Mount { path: dir.into(), source }),
    };
    Ok(Mounted { session, dir: dir.into(), threads })
}

/// Tells the kernel that the file's size changed (a running volume's `resize`): its cached
/// attributes of the file are dropped, so the next `stat` asks the server again.
#[derive(Debug, Clone)]
pub struct SizeNotifier(fuser::Notifier);

impl SizeNotifier {
    /// Invalidates the file's cached attributes (not its data: the served device is the
    /// same, only its end moved).
    pub fn size_changed(&self) -> std::io::Result<()> {
        self.0.inval_inode(fs::FILE, -1, 0)
    }
}

impl Mounted {
    /// A handle that tells the kernel of a new size, from another thread.
    pub fn size_notifier(&self) -> SizeNotifier {
        SizeNotifier(self.session.notifier())
    }

    /// A handle that unmounts from another thread; [`Mounted::run`] then returns once the
    /// last user has closed the file.
    pub fn unmounter(&self) -> Unmounter {
        Unmounter { dir: self.dir.clone() }
    }

    /// The mount directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Serves requests on the configured number of threads until the file system is
    /// unmounted (by [`Unmounter::unmount`], `fusermount3 -u`, or `umount`).
    pub fn run(self) -> Result<(), FuseError> {
        let Mounted { session, dir, threads } = self;
        log::debug!("serving FUSE on {} with {threads} threads", dir.display());
        match session.run() {
            Ok(()) => Ok(()),
            // The kernel tore the connection down rather than ending it with ENODEV: seen
            // when the last user of a lazily unmounted file closes it, and after an abort
            // through fusectl. Either way nothing is left to serve; what was written is
            // flushed by the caller as on a normal end.
            Err(e) if session_ended(&e) => {
                log::info!("FUSE connection on {} ended: {e}", dir.display());
                Ok(())
            }
            Err(source) => Err(FuseError::Session { path: dir, source }),
        }
    }
}

/// Whether a session error only says that the kernel has disconnected the file system.
fn session_ended(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNABORTED) | Some(libc::ENODEV))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_down_connection_ends_the_session_other_errors_do_not() {
        for errno in [libc::ECONNABORTED, libc::ENODEV] {
            assert!(session_ended(&std::io::Error::from_raw_os_error(errno)), "{errno}");
        }
        for errno in [libc::EIO, libc::EINVAL, libc::ENOMEM] {
            assert!(!session_ended(&std::io::Error::from_raw_os_error(errno)), "{errno}");
        }
        assert!(!session_ended(&std::io::Error::other("Invalid request")));
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b\011c\134d"), "/tmp/a b\tc\\d");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/end\04"), r"/end\04");
        assert_eq!(unescape_mountinfo(r"/bad\089"), r"/bad\089");
        assert_eq!(unescape_mountinfo(r"/big\777"), r"/big\777");
    }

    #[test]
    fn dead_connections_are_recognised() {
        assert!(is_dead_connection(&std::io::Error::from_raw_os_error(libc::ENOTCONN)));
        assert!(is_dead_connection(&std::io::Error::from_raw_os_error(libc::ECONNABORTED)));
        assert!(!is_dead_connection(&std::io::Error::from_raw_os_error(libc::ENOENT)));
    }

    #[test]
    fn names_are_single_components() {
        for bad in ["", ".", "..", "a/b", "/x", "a\0b"] {
            assert!(matches!(check_name(bad), Err(FuseError::BadName(_))), "{bad:?}");
        }
        for good in ["vol", "my.volume", "..x", "x y"] {
            check_name(good).unwrap();
        }
    }

    #[test]
    fn fuse_device_is_refused_when_missing_or_not_a_character_device() {
        let t = tempfile::tempdir().unwrap();
        assert!(matches!(check_device(&t.path().join("fuse")), Err(FuseError::NoDevice)));
        std::fs::write(t.path().join("fuse"), b"").unwrap();
        assert!(matches!(check_device(&t.path().join("fuse")), Err(FuseError::NoDevice)));
        check_device(Path::new("/dev/null")).unwrap();
        assert!(FuseError::NoDevice.to_string().contains("/dev/fuse"));
    }

    #[test]
    fn mountpoint_is_refused_when_missing_a_file_or_not_empty() {
        if find_fusermount().is_none() || std::fs::metadata("/dev/fuse").is_err() {
            eprintln!("SKIPPED mountpoint checks: no fusermount3 or /dev/fuse (Debian package fuse3)");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let missing = t.path().join("missing");
        assert!(matches!(check_mountpoint(&missing), Err(FuseError::DirMissing(_))));
        let file = t.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(check_mountpoint(&file), Err(FuseError::NotDirectory(_))));
        assert!(matches!(check_mountpoint(t.path()), Err(FuseError::DirNotEmpty(_))));
        let empty = t.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        check_mountpoint(&empty).unwrap();
    }
}
