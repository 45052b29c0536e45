//! The object-storage device against a real S3 server (moto's server mode, started and
//! stopped here; every test skips loudly when `moto_server` is not installed).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, MutexGuard};

use crate::common;

use blockdev::{BlockDevice, BlockErrorKind, WriteFlags};
use common::settle;
use objstore::OpenOptions;
use testkit::pattern::pattern;
use testkit::s3server::{http, http_with, S3Server, ACCESS_KEY, SECRET_KEY};

const RW: OpenOptions = OpenOptions { read_only: false, create: false };
const RO: OpenOptions = OpenOptions { read_only: true, create: false };

/// The credential environment is per process: tests that change it hold its lock
/// (`common::AWS_ENV`, shared with s3_faults.rs).
fn env() -> MutexGuard<'static, ()> {
    let g = common::AWS_ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    std::env::remove_var("AWS_PROFILE");
    std::env::remove_var("AWS_ENDPOINT_URL");
    g
}

fn server(dir: &std::path::Path) -> Option<S3Server> {
    let s = S3Server::start(dir)?;
    s.create_bucket("vols");
    Some(s)
}

static N: AtomicU32 = AtomicU32::new(0);

fn fresh(s: &S3Server, params: &str) -> String {
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("s3://vols/t{n}?endpoint={}&{params}", s.endpoint())
}

/// The keys under `prefix` in bucket `vols` (moto answers unsigned ListObjects).
fn keys(s: &S3Server, prefix: &str) -> Vec<String> {
    let (code, body) = http(s.port, "GET", &format!("/vols?list-type=2&prefix={prefix}"), b"").unwrap();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let text = String::from_utf8_lossy(&body).into_owned();
    text.split("<Key>").skip(1).filter_map(|p| p.split("</Key>").next()).map(str::to_owned).collect()
}

/// moto refuses anonymous overwrites and deletes; with its signature checks off, any
/// credential scope names a user.
const AS_USER: &str = "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20250101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00\r\n";

fn put(s: &S3Server, key: &str, body: &[u8]) {
    let (code, b) = http_with(
        s.port,
        "PUT",
        &format!("/vols/{key}"),
        body,
        &format!("{AS_USER}Content-Type: application/octet-stream\r\n"),
    )
    .unwrap();
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&b));
}

fn prefix_of(uri: &str) -> String {
    uri["s3://vols/".len()..].split('?').next().unwrap().to_owned()
}

#[test]
fn conformance_suite_on_s3() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    let make = || -> Arc<dyn BlockDevice> {
        Arc::new(objstore::open(&fresh(&s, "size=8M&object_size=64k&cache=256k"), RW).unwrap())
    };
    testkit::conformance::Conformance::new(make).label("objstore s3").run();
}

#[test]
fn writes_survive_reopen_and_only_touched_objects_exist() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    // 16 objects of 64 KiB, a cache of 4 objects: writing 10 objects forces write-back.
    let uri = fresh(&s, "size=1M&object_size=64k&cache=256k");
    let p = prefix_of(&uri);
    {
        let d = objstore::open(&uri, RW).unwrap();
        assert_eq!(d.geometry().size, 1 << 20);
        for i in 0..10u64 {
            // Unaligned to objects: every write straddles two.
            let off = i * 65536 + 32768;
            d.write_at(off, &pattern(7, off, 65536), WriteFlags::empty()).unwrap();
        }
        assert!(d.cached_bytes() <= 5 * 65536, "cache limit kept: {}", d.cached_bytes());
        d.flush().unwrap();
    }
    let k = keys(&s, &p);
    assert!(k.iter().all(|k| !k.ends_with(objstore::LEASE)), "lease released at close: {k:?}");
    let data: Vec<_> = k.iter().filter(|k| k.contains("/data/")).collect();
    assert_eq!(data.len(), 11, "objects 0..=10 hold data, the rest are absent: {k:?}");
    let d = objstore::open(&uri, RO).unwrap();
    let mut all = vec![0u8; 1 << 20];
    d.read_at(0, &mut all).unwrap();
    assert!(all[..32768].iter().all(|b| *b == 0));
    for i in 0..10u64 {
        let off = (i * 65536 + 32768) as usize;
        assert_eq!(&all[off..off + 65536], &pattern(7, off as u64, 65536)[..], "write {i}");
    }
    assert!(all[10 * 65536 + 32768..].iter().all(|b| *b == 0));
    assert_eq!(d.write_at(0, &[0; 512], WriteFlags::empty()).unwrap_err().kind(), BlockErrorKind::ReadOnly);
}

/// Four threads write, overwrite and read back their own halves of shared objects at once,
/// with flushes now and then, on a cache of 8 objects: write-behind, eviction and flushes
/// run against each other and against writes to the objects they upload. Every read sees
/// the thread's last write, and after a flush and reopen the store holds exactly that.
#[test]
fn concurrent_writers_with_write_behind_and_eviction_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    const SIZE: usize = 4 << 20;
    const STRIPE: usize = 32 << 10;
    let uri = fresh(&s, &format!("size={SIZE}&object_size=64k&cache=512k"));
    let d = objstore::open(&uri, RW).unwrap();
    let stripes = SIZE / STRIPE;
    let peak = AtomicU32::new(0);
    let models: Vec<Vec<(usize, Vec<u8>)>> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..4usize)
            .map(|t| {
                let (d, peak) = (&d, &peak);
                sc.spawn(move || {
                    // Stripes t, t+4, …: objects 2k hold threads 0 and 1, objects 2k+1 threads 2 and 3.
                    let mut model: Vec<(usize, Vec<u8>)> =
                        (t..stripes).step_by(4).map(|i| (i, vec![0u8; STRIPE])).collect();
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    for op in 0..400 {
                        let k = (next() % model.len() as u64) as usize;
                        let base = model[k].0 * STRIPE;
                        let m = &mut model[k].1;
                        match next() % 10 {
                            // The whole stripe, or a run of sectors inside it.
                            0..=7 => {
                                let (a, n) = if next() % 10 < 5 {
                                    (0, STRIPE)
                                } else {
                                    let a = (next() % 64) as usize * 512;
                                    (a, ((next() % 64) as usize * 512).clamp(512, STRIPE - a))
                                };
                                let data = pattern(next(), (base + a) as u64, n);
                                d.write_at((base + a) as u64, &data, WriteFlags::empty()).unwrap();
                                m[a..a + n].copy_from_slice(&data);
                            }
                            8 => {
                                let mut b = vec![0u8; STRIPE];
                                d.read_at(base as u64, &mut b).unwrap();
                                assert!(b == *m, "thread {t} op {op}: stripe {} reads back", model[k].0);
                            }
                            _ => d.flush().unwrap(),
                        }
                        peak.fetch_max(d.uploading() as u32, Ordering::Relaxed);
                    }
                    model
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    d.flush().unwrap();
    drop(d);
    eprintln!("most write-behind uploads queued or running at once: {}", peak.load(Ordering::Relaxed));
    assert!(peak.load(Ordering::Relaxed) > 0, "write-behind ran");
    let r = objstore::open(&uri, RO).unwrap();
    let mut all = vec![0u8; SIZE];
    r.read_at(0, &mut all).unwrap();
    for (i, m) in models.iter().flatten() {
        assert!(all[i * STRIPE..(i + 1) * STRIPE] == m[..], "stripe {i} after reopen");
    }
}

#[test]
fn a_sequential_reader_gets_streamed_objects_byte_exact_and_caches_them_whole() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    // 12 objects of 1 MiB (read ahead and streamed to the reader as they download).
    let uri = fresh(&s, "size=12M&object_size=1M&cache=16M");
    {
        let d = objstore::open(&uri, RW).unwrap();
        d.write_at(0, &pattern(9, 0, 12 << 20), WriteFlags::empty()).unwrap();
        d.flush().unwrap();
    }
    let d = objstore::open(&uri, RO).unwrap();
    // Reads of 48 KiB: most start inside an object still downloading, some straddle two.
    let step = 48 << 10;
    let mut off = 0u64;
    while off < 12 << 20 {
        let n = step.min((12 << 20) - off);
        let mut b = vec![0u8; n as usize];
        d.read_at(off, &mut b).unwrap();
        assert!(b == pattern(9, off, n as usize), "bytes at {off}");
        off += n;
    }
    // The read of each object's last bytes took it whole into the cache.
    assert_eq!(d.cached_bytes(), 12 << 20);
    let mut all = vec![0u8; 12 << 20];
    d.read_at(0, &mut all).unwrap();
    assert!(all == pattern(9, 0, 12 << 20), "the cached objects read back");
}

#[test]
fn devices_share_the_runtime_and_one_dropped_mid_read_ahead_leaves_the_other_working() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    let (a, b) = (fresh(&s, "size=8M&object_size=1M&cache=8M"), fresh(&s, "size=8M&object_size=1M&cache=8M"));
    for (uri, seed) in [(&a, 3), (&b, 4)] {
        let d = objstore::open(uri, RW).unwrap();
        d.write_at(0, &pattern(seed, 0, 8 << 20), WriteFlags::empty()).unwrap();
        d.flush().unwrap();
    }
    let db = objstore::open(&b, RO).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    db.read_at(0, &mut buf).unwrap();
    // A reads one block (its read-ahead of the next objects starts) and is dropped with those
    // downloads in flight: they are aborted, B's are not.
    {
        let da = objstore::open(&a, RO).unwrap();
        da.read_at(0, &mut buf).unwrap();
        assert!(buf == pattern(3, 0, 64 << 10));
    }
    let mut all = vec![0u8; 8 << 20];
    db.read_at(0, &mut all).unwrap();
    assert!(all == pattern(4, 0, 8 << 20), "B reads on after A was dropped");
    drop(db);
    // A device opened after both were dropped runs on the same runtime.
    let da = objstore::open(&a, RO).unwrap();
    da.read_at(0, &mut all).unwrap();
    assert!(all == pattern(3, 0, 8 << 20), "A reopened");
}

#[test]
fn zeroed_objects_are_deleted_and_read_back_zero() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    let uri = fresh(&s, "size=512k&object_size=64k");
    let p = prefix_of(&uri);
    let d = objstore::open(&uri, RW).unwrap();
    d.write_at(0, &pattern(1, 0, 3 * 65536), WriteFlags::empty()).unwrap();
    d.flush().unwrap();
    assert_eq!(keys(&s, &format!("{p}/data/")).len(), 3);
    d.discard(65536, 65536).unwrap();
    d.flush().unwrap();
    assert_eq!(keys(&s, &format!("{p}/data/")).len(), 2, "the discarded object is gone");
    let a = d.allocation(0, 512 << 10, 16).unwrap();
    assert_eq!(a[0].len, 65536);
    assert!(a.iter().any(|e| e.flags.contains(blockdev::ExtentFlags::HOLE | blockdev::ExtentFlags::ZERO)));
    drop(d);
    let d = objstore::open(&uri, RO).unwrap();
    let mut b = vec![1u8; 65536];
    d.read_at(65536, &mut b).unwrap();
    assert!(b.iter().all(|x| *x == 0));
}

#[test]
fn a_second_writer_is_refused_and_a_broken_lease_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    let uri = fresh(&s, "size=1M&object_size=64k");
    let a = objstore::open(&uri, RW).unwrap();
    a.write_at(0, &[1; 4096], WriteFlags::empty()).unwrap();
    a.flush().unwrap();
    // Another server: the same volume through another spelling of the endpoint, so this
    // process does not share the first opener's cache.
    let other = uri.replace("127.0.0.1", "localhost");
    let e = objstore::open(&other, RW).unwrap_err();
    assert_eq!(e.kind(), BlockErrorKind::Busy, "{e}");
    assert!(e.to_string().contains("in use by another writer"), "{e}");
    // A reader is fine.
    let r = objstore::open(&other, RO).unwrap();
    let mut b = [0u8; 4096];
    r.read_at(0, &mut b).unwrap();
    assert_eq!(b, [1; 4096]);
    drop(r);
    // Taking over with break_lease=1: the first writer's next flush fails, and keeps failing.
    let b2 = objstore::open(&format!("{other}&break_lease=1"), RW).unwrap();
    a.write_at(4096, &[2; 4096], WriteFlags::empty()).unwrap();
    let e = a.flush().unwrap_err();
    assert!(e.to_string().contains("lost the lease"), "{e}");
    assert!(a.flush().is_err(), "latched");
    drop(a);
    drop(b2);
}

/// The object `data/<idx>` under `prefix`, or None when absent.
fn object(s: &S3Server, prefix: &str, idx: u64) -> Option<Vec<u8>> {
    let (code, body) =
        http_with(s.port, "GET", &format!("/vols/{prefix}/data/{idx:016x}"), b"", AS_USER).unwrap();
    match code {
        200 => Some(body),
        404 => None,
        c => panic!("GET object {idx}: {c} {}", String::from_utf8_lossy(&body)),
    }
}

#[test]
fn a_writer_whose_lease_was_broken_uploads_nothing_more_even_when_its_cache_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    // A cache of two 64 KiB objects: a write to a third object forces write-back (and no
    // write-behind: the objects stay in the cache until then).
    let uri = fresh(&s, "size=1M&object_size=64k&cache=128k&write_behind=0");
    let p = prefix_of(&uri);
    let a = objstore::open(&uri, RW).unwrap();
    a.write_at(0, &[0xa1; 65536], WriteFlags::empty()).unwrap();
    a.write_at(65536, &[0xa2; 65536], WriteFlags::empty()).unwrap();
    assert_eq!((object(&s, &p, 0), object(&s, &p, 1)), (None, None), "still only in a's cache");

    // A second server takes the volume over while a holds those dirty objects, and writes
    // object 1 itself.
    let other = uri.replace("127.0.0.1", "localhost");
    let b = objstore::open(&format!("{other}&break_lease=1"), RW).unwrap();
    b.write_at(65536, &[0xb2; 65536], WriteFlags::empty()).unwrap();
    b.flush().unwrap();

    // a's next write needs room: its write-back must notice the lost lease and upload nothing.
    let e = a.write_at(2 * 65536, &[0xa3; 65536], WriteFlags::empty()).unwrap_err();
    assert!(e.to_string().contains("lost the lease"), "{e}");
    assert_eq!(object(&s, &p, 0), None, "a's object 0 was not uploaded");
    assert_eq!(object(&s, &p, 1), Some(vec![0xb2; 65536]), "b's object 1 was not overwritten");
    assert_eq!(object(&s, &p, 2), None);
    // And it stays fenced: flushes fail, close writes nothing and leaves b's lease alone.
    assert!(a.flush().unwrap_err().to_string().contains("lost the lease"));
    let e = a.write_at(3 * 65536, &[0xa4; 65536], WriteFlags::empty()).unwrap_err();
    assert!(e.to_string().contains("lost the lease") || e.to_string().contains("earlier"), "{e}");
    drop(a);
    assert_eq!(object(&s, &p, 0), None, "nothing uploaded at close");
    assert_eq!(object(&s, &p, 1), Some(vec![0xb2; 65536]));
    assert!(keys(&s, &p).iter().any(|k| k.ends_with(objstore::LEASE)), "b's lease kept");
    b.write_at(0, &[0xb1; 512], WriteFlags::empty()).unwrap();
    b.flush().unwrap();
    drop(b);
    assert!(!keys(&s, &p).iter().any(|k| k.ends_with(objstore::LEASE)), "b released its lease");
}

#[test]
fn a_filled_object_is_uploaded_before_any_flush_and_a_broken_lease_stops_write_behind() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    let uri = fresh(&s, "size=1M&object_size=64k");
    let p = prefix_of(&uri);
    let a = objstore::open(&uri, RW).unwrap();
    // Object 0 written whole in two halves, object 1 all but its last sector: object 0 is
    // uploaded without a flush, object 1 stays in the cache.
    a.write_at(32768, &pattern(1, 32768, 32768), WriteFlags::empty()).unwrap();
    a.write_at(0, &pattern(1, 0, 32768), WriteFlags::empty()).unwrap();
    a.write_at(65536, &pattern(1, 65536, 65536 - 512), WriteFlags::empty()).unwrap();
    settle(&a);
    assert!(object(&s, &p, 0) == Some(pattern(1, 0, 65536)), "the filled object was uploaded");
    assert_eq!(object(&s, &p, 1), None, "a partly written object waits for the flush");
    a.flush().unwrap();
    assert!(object(&s, &p, 1).is_some());

    // Another writer takes over and writes objects 2 to 5; a fills the same four at once: the
    // write-behind uploads of all four wait for one lease check, which finds the lease lost,
    // so none is uploaded, and a's flush fails from then on.
    let other = uri.replace("127.0.0.1", "localhost");
    let b = objstore::open(&format!("{other}&break_lease=1"), RW).unwrap();
    b.write_at(2 * 65536, &[0xb2; 4 * 65536], WriteFlags::empty()).unwrap();
    b.flush().unwrap();
    a.write_at(2 * 65536, &[0xa2; 4 * 65536], WriteFlags::empty()).unwrap();
    settle(&a);
    for i in 2..6 {
        assert!(object(&s, &p, i) == Some(vec![0xb2; 65536]), "b's object {i} was overwritten");
    }
    let e = a.flush().unwrap_err();
    assert!(e.to_string().contains("lost the lease"), "{e}");
    a.write_at(6 * 65536, &[0xa3; 65536], WriteFlags::empty()).unwrap();
    settle(&a);
    drop(a);
    assert!(object(&s, &p, 6).is_none(), "nothing more uploaded");
    assert!(object(&s, &p, 2) == Some(vec![0xb2; 65536]));
    drop(b);
}

/// Every object in bucket `vols`: key and bytes.
fn bucket(s: &S3Server) -> std::collections::BTreeMap<String, Vec<u8>> {
    keys(s, "")
        .into_iter()
        .map(|k| {
            let (code, body) = http_with(s.port, "GET", &format!("/vols/{k}"), b"", AS_USER).unwrap();
            assert_eq!(code, 200, "GET {k}");
            (k, body)
        })
        .collect()
}

#[test]
fn bad_input_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = server(dir.path()) else { return };
    // Each refusal is checked for its message and for the bucket being exactly as before
    // (no manifest, lease or data object created, nothing overwritten or deleted).
    let refused_with = |uri: &str, want: &str, opts: &[OpenOptions]| {
        let before = bucket(&s);
        for &o in opts {
            let e = objstore::open(uri, o).unwrap_err().to_string();
            assert!(e.contains(want), "{uri} ({o:?}): {e:?} does not say {want:?}");
        }
        assert!(bucket(&s) == before, "{uri}: the refusal changed the bucket");
    };
    // Where no volume is, `import`'s create is refused the same way; where one is, opening it.
    let create = OpenOptions { read_only: false, create: true };
    let refused = |uri: &str, want: &str| refused_with(uri, want, &[RW, create]);
    let refused_open = |uri: &str, want: &str| refused_with(uri, want, &[RW, RO]);

    // Unreachable endpoint: a port nobody listens on; the message names it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    refused(
        &format!("s3://vols/x?endpoint=http://127.0.0.1:{dead}&size=1M&timeout=5"),
        &format!("127.0.0.1:{dead}"),
    );

    // No bucket.
    refused(&format!("s3://nobucket/x?endpoint={}&size=1M", s.endpoint()), "bucket \"nobucket\" not found");

    // No volume and no size.
    let e = objstore::open(&fresh(&s, ""), RW).unwrap_err().to_string();
    assert!(e.contains("no volume here"), "{e}");

    // Objects that do not form a volume: with size= (which would create one) and without.
    put(&s, "foreign/photo.jpg", b"not a volume");
    put(&s, "foreign/data/0000000000000000", &[7; 65536]);
    for q in ["&size=1M", "&size=1M&object_size=64k", ""] {
        refused(&format!("s3://vols/foreign?endpoint={}{q}", s.endpoint()), "not a sealdisk volume");
    }
    assert_eq!(keys(&s, "foreign/"), ["foreign/data/0000000000000000", "foreign/photo.jpg"]);

    // A manifest that does not parse.
    put(&s, "badman/sealdisk-volume.json", b"{\"format\":\"zip\"}");
    put(&s, "badman/data/0000000000000000", &[7; 65536]);
    refused_open(&format!("s3://vols/badman?endpoint={}", s.endpoint()), "not a sealdisk volume manifest");

    // An object of the wrong size (too short, too long), and one with a foreign name: the
    // volume's other objects stay as they were.
    let uri = fresh(&s, "size=1M&object_size=64k");
    let p = prefix_of(&uri);
    {
        let d = objstore::open(&uri, RW).unwrap();
        d.write_at(0, &pattern(5, 0, 131072), WriteFlags::empty()).unwrap();
    }
    let del = |k: &str| {
        let (code, _) = http_with(s.port, "DELETE", &format!("/vols/{p}/{k}"), b"", AS_USER).unwrap();
        assert_eq!(code, 204);
    };
    for (name, len, want) in [
        ("data/0000000000000003", 1000, "is 1000 bytes, expected 65536"),
        ("data/0000000000000003", 65537, "is 65537 bytes, expected 65536"),
        ("data/0000000000000099", 65536, "is not a data object of this volume"),
        ("data/photo.jpg", 65536, "is not a data object of this volume"),
    ] {
        put(&s, &format!("{p}/{name}"), &vec![1; len]);
        refused_open(&uri, want);
        del(name);
    }
    // Still whole and writable afterwards.
    let d = objstore::open(&uri, RW).unwrap();
    let mut b = vec![0u8; 131072];
    d.read_at(0, &mut b).unwrap();
    assert!(b == pattern(5, 0, 131072));
    drop(d);

    // A size or object size that disagrees with the manifest.
    refused_open(&uri.replace("size=1M", "size=2M"), "not size=");
    refused_open(&uri.replace("object_size=64k", "object_size=128k"), "not object_size=");
    refused_with(&uri, "already holds a volume", &[create]);

    // Credentials in the locator are refused without echoing them.
    let e = objstore::open(&format!("s3://vols/x?endpoint={}&secret_access_key=hunter2", s.endpoint()), RW)
        .unwrap_err()
        .to_string();
    assert!(e.contains("credentials are never taken from the locator") && !e.contains("hunter2"), "{e}");
}

#[test]
fn bad_credentials_are_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = S3Server::start_with_auth(dir.path()) else { return };
    s.create_bucket("vols");
    let (id, secret) = s.issued_key();
    let uri = format!("s3://vols/auth?endpoint={}&size=1M", s.endpoint());
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "not-the-secret-q7");
    std::env::set_var("AWS_ACCESS_KEY_ID", &id);
    let e = objstore::open(&uri, RW).unwrap_err().to_string();
    assert!(e.contains("access denied") && e.contains("credentials"), "{e}");
    assert!(!e.contains("not-the-secret-q7"), "the secret is not echoed: {e}");
    // Nothing was written: moto's own dump of its state (unsigned) holds no key under the
    // prefix; it does list the bucket, so the query itself works.
    let (code, state) = http(s.port, "GET", "/moto-api/data.json", b"").unwrap();
    let state = String::from_utf8_lossy(&state);
    assert_eq!(code, 200);
    assert!(state.contains("\"name\": \"vols\""), "moto's dump lists the bucket");
    assert!(!state.contains("\"name\": \"auth/"), "a refused opener wrote under the prefix");
    // (The positive case is not checked here: moto 5.2.1's signature check of ListObjectsV2
    // with a prefix refuses correct keys too, boto3's as well; every other test runs with
    // moto's checks off.)
    let _ = secret;
}
