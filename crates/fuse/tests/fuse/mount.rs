//! The library mounted for real (needs /dev/fuse and fusermount3; skips loudly otherwise):
//! several requests reach the device at once, reads and writes alike; the directory holds
//! the one file and nothing else can be made in it.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use blockdev::{BlockDevice, BlockResult, Geometry, MemDevice, WriteFlags};

fn fuse_ready() -> bool {
    let ok = Path::new("/dev/fuse").exists()
        && std::process::Command::new("fusermount3").arg("-V").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: FUSE unusable here (needs /dev/fuse and fusermount3: apt-get install fuse3)");
    }
    ok
}

/// Counts the requests inside the device at once; each waits (at most 2 s) until `want`
/// are inside together, so a transport that serialises requests shows as a maximum of 1
/// (after the waits time out) rather than as a slow test.
#[derive(Debug)]
struct Gate {
    inner: MemDevice,
    want: usize,
    inside: Mutex<usize>,
    met: Condvar,
    max: AtomicUsize,
}

impl Gate {
    fn pass(&self) {
        let mut n = self.inside.lock().unwrap();
        *n += 1;
        self.max.fetch_max(*n, Ordering::SeqCst);
        self.met.notify_all();
        // Once `want` have met, everyone goes on (also those not yet woken).
        let _ = self
            .met
            .wait_timeout_while(n, Duration::from_secs(2), |_| self.max.load(Ordering::SeqCst) < self.want)
            .unwrap();
        *self.inside.lock().unwrap() -= 1;
    }
}

impl BlockDevice for Gate {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.pass();
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.pass();
        self.inner.write_at(off, buf, flags)
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
}

struct Unmount(fuse::Unmounter, Option<std::thread::JoinHandle<Result<(), fuse::FuseError>>>);

impl Drop for Unmount {
    fn drop(&mut self) {
        self.0.unmount();
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

#[test]
fn requests_reach_the_device_in_parallel_when_several_are_in_flight() {
    if !fuse_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate {
        inner: MemDevice::new(1 << 20, 4096),
        want: 4,
        inside: Mutex::new(0),
        met: Condvar::new(),
        max: AtomicUsize::new(0),
    });
    let cfg = fuse::FuseConfig { name: "g".into(), threads: 8, read_only: false };
    let mounted = fuse::mount(dir.path(), gate.clone(), &cfg).unwrap();
    let un = mounted.unmounter();
    let _guard = Unmount(un, Some(std::thread::spawn(move || mounted.run())));
    let path = dir.path().join("g");
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();

    for write in [true, false] {
        gate.max.store(0, Ordering::SeqCst);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let f = &f;
                s.spawn(move || {
                    if write {
                        f.write_all_at(&[t as u8; 4096], t * 65536).unwrap();
                    } else {
                        let mut b = [0u8; 4096];
                        f.read_exact_at(&mut b, t * 65536).unwrap();
                        assert_eq!(b, [t as u8; 4096]);
                    }
                });
            }
        });
        let max = gate.max.load(Ordering::SeqCst);
        assert_eq!(max, 4, "{max} requests in flight at most (write: {write})");
    }

    // The directory is fixed.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["g"]);
    assert!(std::fs::create_dir(dir.path().join("d")).is_err());
    assert!(std::fs::hard_link(&path, dir.path().join("h")).is_err());
    assert!(std::os::unix::fs::symlink("g", dir.path().join("s")).is_err());
}
