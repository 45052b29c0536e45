//! Faults under the object-storage device, against a real S3 server (moto's server mode):
//! the server killed mid-upload and restarted, errors and dropped connections injected by a
//! proxy, a second writer refused. After each, every byte written before the last
//! successful flush reads back, and a failed flush stays failed until the volume is reopened.

use crate::common;

use std::time::Duration;

use blockdev::{BlockDevice, WriteFlags};
use objstore::OpenOptions;
use testkit::pattern::pattern;
use testkit::s3server::{Fault, FaultProxy, S3Server, ACCESS_KEY, SECRET_KEY};

const RW: OpenOptions = OpenOptions { read_only: false, create: false };
const RO: OpenOptions = OpenOptions { read_only: true, create: false };
const OBJ: u64 = 64 << 10;

fn env() -> std::sync::MutexGuard<'static, ()> {
    let g = common::AWS_ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    std::env::remove_var("AWS_PROFILE");
    g
}

/// Checks `[0, durable)` holds seed `a`, and `[durable, end)` per object holds `a` or `b`.
fn check(d: &dyn BlockDevice, durable: u64, end: u64, a: u64, b: u64) -> (u64, u64) {
    let (mut old, mut new) = (0, 0);
    let mut buf = vec![0u8; OBJ as usize];
    for off in (0..end).step_by(OBJ as usize) {
        d.read_at(off, &mut buf).unwrap();
        if off < durable {
            assert!(buf == pattern(a, off, OBJ as usize), "flushed object at {off} lost");
        } else if buf == pattern(a, off, OBJ as usize) {
            old += 1;
        } else {
            assert!(buf == pattern(b, off, OBJ as usize), "object at {off} is neither old nor new (torn)");
            new += 1;
        }
    }
    (old, new)
}

#[test]
fn server_killed_mid_upload_and_restarted_keeps_every_flushed_byte() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(mut s) = S3Server::start_recording(dir.path()) else { return };
    s.create_bucket("vols");
    // One upload at a time, so the kill lands in the middle of the flush.
    let uri =
        format!("s3://vols/kill?endpoint={}&size=8M&object_size=64k&cache=32M&concurrency=1", s.endpoint());
    let d = objstore::open(&uri, RW).unwrap();
    let total = 8u64 << 20;
    d.write_at(0, &pattern(1, 0, total as usize), WriteFlags::empty()).unwrap();
    d.flush().unwrap();
    // Overwrite the second half; kill the server while its flush uploads.
    let half = total / 2;
    d.write_at(half, &pattern(2, half, half as usize), WriteFlags::empty()).unwrap();
    let e = std::thread::scope(|sc| {
        let f = sc.spawn(|| d.flush());
        std::thread::sleep(Duration::from_millis(100));
        s.kill();
        f.join().unwrap()
    });
    let e = e.expect_err("the flush whose server died must fail");
    eprintln!("flush while the server died: {e}");
    s.restart();
    assert!(d.flush().is_err(), "a failed flush stays failed until the volume is reopened");
    drop(d);
    // Reopened (the lease may be stale after the failure: take it over), everything flushed
    // before is there; each object of the interrupted flush is whole, old or new.
    let d = objstore::open(&format!("{uri}&break_lease=1"), RW).unwrap();
    let (old, new) = check(&d, half, total, 1, 2);
    eprintln!("interrupted flush: {new} objects new, {old} old");
    assert!(old > 0, "the kill came before the flush finished");
}

#[test]
fn injected_errors_and_resets_fail_the_flush_and_lose_nothing_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = S3Server::start(dir.path()) else { return };
    s.create_bucket("vols");
    let proxy = FaultProxy::start(s.port);
    for (n, fault) in [Fault::Error500, Fault::Reset].into_iter().enumerate() {
        let uri =
            format!("s3://vols/inj{n}?endpoint={}&size=4M&object_size=64k&timeout=10", proxy.endpoint());
        let total = 4u64 << 20;
        let d = objstore::open(&uri, RW).unwrap();
        d.write_at(0, &pattern(10, 0, total as usize), WriteFlags::empty()).unwrap();
        d.flush().unwrap();
        proxy.set(fault);
        d.write_at(0, &pattern(11, 0, (total / 2) as usize), WriteFlags::empty()).unwrap();
        let e = d.flush().expect_err("flush through the fault");
        eprintln!("{fault:?}: {e}");
        // The fault is over; the flush stays failed (its data may be lost: a success now
        // would claim otherwise), reads go on.
        proxy.set(Fault::Pass);
        assert!(d.flush().is_err(), "{fault:?}: latched");
        let mut b = vec![0u8; 4096];
        d.read_at(total - 4096, &mut b).unwrap();
        drop(d);
        let d = objstore::open(&format!("{uri}&break_lease=1"), RO).unwrap();
        let (old, new) = check(&d, 0, total / 2, 10, 11);
        eprintln!("{fault:?}: {new} new, {old} old objects in the interrupted half");
        let mut rest = vec![0u8; (total / 2) as usize];
        d.read_at(total / 2, &mut rest).unwrap();
        assert!(rest == pattern(10, total / 2, rest.len()), "{fault:?}: flushed data lost");
    }
}

#[test]
fn a_transient_error_is_retried_and_the_flush_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = S3Server::start(dir.path()) else { return };
    s.create_bucket("vols");
    let proxy = FaultProxy::start(s.port);
    let uri = format!("s3://vols/retry?endpoint={}&size=1M&object_size=64k", proxy.endpoint());
    let d = objstore::open(&uri, RW).unwrap();
    d.write_at(0, &pattern(3, 0, 1 << 20), WriteFlags::empty()).unwrap();
    // 500s for a moment shorter than the retries' back-off (100 ms, then 400 ms).
    proxy.set(Fault::Error500);
    let healer = std::thread::spawn({
        let port = proxy.port;
        move || {
            std::thread::sleep(Duration::from_millis(150));
            port
        }
    });
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let _ = healer.join();
            proxy.set(Fault::Pass);
        });
        d.flush().expect("retried past the transient errors");
    });
    drop(d);
    let d = objstore::open(&uri, RO).unwrap();
    let mut b = vec![0u8; 1 << 20];
    d.read_at(0, &mut b).unwrap();
    assert!(b == pattern(3, 0, 1 << 20));
}

#[test]
fn a_failed_write_behind_upload_leaves_the_object_for_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let _e = env();
    let Some(s) = S3Server::start(dir.path()) else { return };
    s.create_bucket("vols");
    let proxy = FaultProxy::start(s.port);
    let uri = format!("s3://vols/wb?endpoint={}&size=1M&object_size=64k&timeout=10", proxy.endpoint());
    let d = objstore::open(&uri, RW).unwrap();
    // Every object filled while the server answers 500: each write-behind upload fails after
    // its retries, and the objects stay dirty in the cache (not dropped, so nothing latches).
    proxy.set(Fault::Error500);
    d.write_at(0, &pattern(7, 0, 1 << 20), WriteFlags::empty()).unwrap();
    // (Each failing upload takes its retries' 0.5 s of back-off: they are still under way.)
    assert!(d.uploading() > 0, "the filled objects went to write-behind");
    common::settle(&d);
    proxy.set(Fault::Pass);
    d.flush().expect("the flush uploads what write-behind could not");
    drop(d);
    let d = objstore::open(&uri, RO).unwrap();
    let mut b = vec![0u8; 1 << 20];
    d.read_at(0, &mut b).unwrap();
    assert!(b == pattern(7, 0, 1 << 20), "every byte flushed reads back");
}
