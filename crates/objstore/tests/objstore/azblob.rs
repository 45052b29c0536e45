//! The object-storage device on azblob:// against Azurite (npm `azurite`, its `azurite-blob`
//! service in memory), started and stopped here; the container is created with a
//! SharedKey-signed request (testkit::emulators), the device signs with Azurite's published
//! development account through `AZURE_STORAGE_ACCOUNT`/`AZURE_STORAGE_KEY`. Opt-in
//! (`#[ignore]`: installing Azurite takes minutes, docs/TESTING.md):
//! `cargo test -p objstore --test objstore azblob:: -- --ignored`. Skips loudly when Azurite is not
//! installed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use blockdev::{BlockDevice, BlockErrorKind, WriteFlags};
use objstore::OpenOptions;
use testkit::emulators::{Azurite, AZURITE_ACCOUNT, AZURITE_KEY};
use testkit::pattern::pattern;

const RW: OpenOptions = OpenOptions { read_only: false, create: false };
const RO: OpenOptions = OpenOptions { read_only: true, create: false };

static N: AtomicU32 = AtomicU32::new(0);

fn fresh(a: &Azurite, params: &str) -> String {
    format!("azblob://vols/t{}?endpoint={}&{params}", N.fetch_add(1, Ordering::Relaxed), a.endpoint())
}

fn prefix_of(uri: &str) -> String {
    uri["azblob://vols/".len()..].split('?').next().unwrap().to_owned()
}

/// One emulator for every check (the credential environment is per process).
#[test]
#[ignore = "opt-in: needs Azurite (npm install -g azurite), docs/TESTING.md"]
fn conformance_reopen_lease_and_fencing_on_azurite() {
    let dir = tempfile::tempdir().unwrap();
    let Some(az) = Azurite::start(dir.path()) else { return };
    az.create_container("vols");
    std::env::set_var("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT);
    std::env::set_var("AZURE_STORAGE_KEY", AZURITE_KEY);

    let make = || -> Arc<dyn BlockDevice> {
        Arc::new(objstore::open(&fresh(&az, "size=8M&object_size=64k&cache=256k"), RW).unwrap())
    };
    testkit::conformance::Conformance::new(make).label("objstore azurite").run();

    // Write-back through a small cache, close, reopen read-only: every byte comes back, and
    // only the touched objects exist.
    let uri = fresh(&az, "size=1M&object_size=64k&cache=128k");
    let p = prefix_of(&uri);
    {
        let d = objstore::open(&uri, RW).unwrap();
        for i in 0..10u64 {
            let off = i * 65536 + 32768;
            d.write_at(off, &pattern(9, off, 65536), WriteFlags::empty()).unwrap();
        }
        d.flush().unwrap();
    }
    let names = az.blobs("vols", &format!("{p}/"));
    assert!(!names.iter().any(|k| k.ends_with(objstore::LEASE)), "lease released at close: {names:?}");
    assert_eq!(names.iter().filter(|k| k.contains("/data/")).count(), 11, "{names:?}");
    let d = objstore::open(&uri, RO).unwrap();
    let mut all = vec![1u8; 1 << 20];
    d.read_at(0, &mut all).unwrap();
    assert!(all[..32768].iter().all(|b| *b == 0));
    for i in 0..10u64 {
        let off = (i * 65536 + 32768) as usize;
        assert_eq!(&all[off..off + 65536], &pattern(9, off as u64, 65536)[..], "write {i}");
    }
    assert!(all[10 * 65536 + 32768..].iter().all(|b| *b == 0));
    drop(d);

    // One writer: Azurite honours `If-None-Match: *` on the lease's upload, so a second
    // writer (another spelling of the endpoint: not this process's shared cache) is refused.
    // (No write-behind: the objects stay in the cache until a full cache forces write-back.)
    let uri = fresh(&az, "size=1M&object_size=64k&cache=128k&write_behind=0");
    let p = prefix_of(&uri);
    let a = objstore::open(&uri, RW).unwrap();
    a.write_at(0, &[0xa1; 65536], WriteFlags::empty()).unwrap();
    a.flush().unwrap();
    a.write_at(65536, &[0xa2; 65536], WriteFlags::empty()).unwrap();
    let other = uri.replace("127.0.0.1", "localhost");
    let e = objstore::open(&other, RW).unwrap_err();
    assert_eq!(e.kind(), BlockErrorKind::Busy, "{e}");
    assert!(e.to_string().contains("in use by another writer"), "{e}");
    let r = objstore::open(&other, RO).unwrap();
    let mut b = vec![0u8; 65536];
    r.read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|x| *x == 0xa1));
    drop(r);

    // Taken over with break_lease=1 while `a` holds a dirty object 1: `a` uploads nothing
    // more (its cache is full at the next write, and its flush fails), `b`'s data stays.
    let b2 = objstore::open(&format!("{other}&break_lease=1"), RW).unwrap();
    b2.write_at(65536, &[0xb2; 65536], WriteFlags::empty()).unwrap();
    b2.flush().unwrap();
    // Both cached objects dirty: the write to a third must upload one first.
    a.write_at(0, &[0xa4; 65536], WriteFlags::empty()).unwrap();
    let e = a.write_at(2 * 65536, &[0xa3; 65536], WriteFlags::empty()).unwrap_err();
    assert!(e.to_string().contains("lost the lease"), "{e}");
    assert!(a.flush().unwrap_err().to_string().contains("lost the lease"));
    drop(a);
    let obj = |i: u64| az.get("vols", &format!("{p}/data/{i:016x}"));
    assert_eq!(obj(0), Some(vec![0xa1; 65536]), "a's last flushed object 0, not its later write");
    assert_eq!(obj(1), Some(vec![0xb2; 65536]), "b's object 1 was not overwritten");
    assert_eq!(obj(2), None, "a uploaded nothing after losing the lease");
    assert!(
        az.blobs("vols", &format!("{p}/")).iter().any(|k| k.ends_with(objstore::LEASE)),
        "b's lease kept"
    );
    drop(b2);
    assert!(!az.blobs("vols", &format!("{p}/")).iter().any(|k| k.ends_with(objstore::LEASE)));

    // Bad input on azblob: objects that are not a volume, a wrong-size object, a missing
    // container, wrong credentials; each refused with the container unchanged.
    az.put("vols", "foreign/photo.jpg", b"not a volume");
    let e = objstore::open(&format!("azblob://vols/foreign?endpoint={}&size=1M", az.endpoint()), RW)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a sealdisk volume"), "{e}");
    assert_eq!(az.blobs("vols", "foreign/"), ["foreign/photo.jpg"]);
    az.put("vols", &format!("{p}/data/0000000000000005"), &[1; 1000]);
    let e = objstore::open(&uri, RW).unwrap_err().to_string();
    assert!(e.contains("is 1000 bytes, expected 65536"), "{e}");
    assert!(!az.blobs("vols", &format!("{p}/")).iter().any(|k| k.ends_with(objstore::LEASE)));
    let e = objstore::open(&format!("azblob://nothere/x?endpoint={}&size=1M", az.endpoint()), RW)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"nothere\" not found"), "{e}");
    eprintln!("no container: {e}");
    std::env::set_var("AZURE_STORAGE_KEY", "d3JvbmcgYXp1cml0ZSBrZXk=");
    let e = objstore::open(&fresh(&az, "size=1M"), RW).unwrap_err().to_string();
    assert!(e.contains("access denied") && e.contains("AZURE_STORAGE_KEY"), "{e}");
    eprintln!("wrong key: {e}");
    assert!(!e.contains("d3JvbmcgYXp1cml0ZSBrZXk="), "{e}");
    std::env::set_var("AZURE_STORAGE_KEY", AZURITE_KEY);
}
