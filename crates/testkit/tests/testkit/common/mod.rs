//! Device factories shared by the conformance and model tests.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use blockdev::{BlockDevice, BlockErrorKind, FileDevice, FileOptions, WriteFlags};

/// Fresh image files in a scratch directory on the target directory's filesystem (a disk
/// filesystem where O_DIRECT works; /tmp may be tmpfs).
pub struct Images {
    dir: tempfile::TempDir,
    next: AtomicU64,
}

impl Images {
    pub fn new() -> Self {
        Images { dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(), next: AtomicU64::new(0) }
    }

    fn path(&self) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.dir.path().join(format!("{n}.img"))
    }

    /// A new zero-filled image of `size` bytes opened with `options`.
    pub fn create(&self, size: u64, options: FileOptions) -> Arc<dyn BlockDevice> {
        let p = self.path();
        if options.read_only {
            // Give a read-only device something other than zeroes to protect.
            let rw = FileDevice::create(&p, size, FileOptions::default()).unwrap();
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            rw.write_at(0, &data, WriteFlags::empty()).unwrap();
            drop(rw);
            return Arc::new(FileDevice::open(&p, options).unwrap());
        }
        Arc::new(FileDevice::create(&p, size, options).unwrap())
    }

    /// Whether O_DIRECT works here; says loudly when it does not.
    pub fn direct_supported(&self) -> bool {
        let p = self.path();
        match FileDevice::create(&p, 1 << 20, FileOptions { direct: true, ..Default::default() }) {
            Ok(_) => true,
            Err(e) if e.kind() == BlockErrorKind::Unsupported => {
                eprintln!("SKIPPED: O_DIRECT is not supported under {}: {e}", self.dir());
                false
            }
            Err(e) => panic!("{e}"),
        }
    }

    fn dir(&self) -> String {
        Path::display(self.dir.path()).to_string()
    }
}

pub fn direct() -> FileOptions {
    FileOptions { direct: true, ..Default::default() }
}

pub fn read_only() -> FileOptions {
    FileOptions { read_only: true, ..Default::default() }
}
