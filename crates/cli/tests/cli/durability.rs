//! A failed write-back is latched through every stack and over NBD (issue 10, item 5).
//!
//! The bug: Linux reports a failed write-back to one `fdatasync` per open file and may drop
//! the pages that failed; the next `fdatasync` returns 0. sealdisk forwarded that: a client
//! whose FLUSH failed retried it, got success, and believed data durable that was lost. Now
//! the first failed `fdatasync` latches the FileDevice (and dm-integrity poisons itself), so
//! every later FLUSH and FUA write fails until the volume is reopened.
//!
//! Faults come from `blockdev::fault_hook` (feature `test-utils`): the real `fdatasync` runs,
//! then the hook reports EIO as the kernel would after a failed write-back.

use crate::durable;

use blockdev::{BlockDevice, WriteFlags};
use durable::{Client, Stack, NBD_EIO};
use nbd::{Export, ListenAddr, Server, ServerConfig};
use testkit::pattern::pattern;

const BS: usize = 4096;

/// Through the stack in-process: flush fails, the retried flush fails, a FUA write fails;
/// after reopening, what was flushed before the failure is there and flushes work again.
fn latched_in_process(stack: Stack) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let img = dir.path().join("vol.img");
    durable::format(stack, &img, false);
    let dev = durable::open(stack, &img).unwrap();
    let name = stack.name();
    dev.write_at(0, &pattern(1, 0, BS), WriteFlags::empty()).unwrap();
    dev.flush().unwrap();
    dev.write_at(BS as u64, &pattern(2, BS as u64, BS), WriteFlags::empty()).unwrap();
    durable::with_plan(&img, |p| p.fail_syncs = 1);
    assert!(dev.flush().is_err(), "{name}: the failing flush");
    let e = dev.flush().expect_err("the retried flush must fail too (it succeeded before the latch)");
    assert_eq!(e.kind().errno(), libc::EIO, "{name}: {e}");
    assert!(
        dev.write_at(2 * BS as u64, &pattern(3, 2 * BS as u64, BS), WriteFlags::FUA).is_err(),
        "{name}: FUA write after the latch"
    );
    assert!(dev.flush().is_err(), "{name}: still latched");
    drop(dev);
    let dev = durable::open(stack, &img).unwrap();
    let mut back = vec![0u8; BS];
    dev.read_at(0, &mut back).unwrap();
    assert_eq!(back, pattern(1, 0, BS), "{name}: flushed before the failure");
    dev.write_at(2 * BS as u64, &pattern(4, 2 * BS as u64, BS), WriteFlags::FUA).unwrap();
    dev.flush().unwrap();
}

#[test]
fn failed_flush_latched_plain() {
    latched_in_process(Stack::Plain);
}

#[test]
fn failed_flush_latched_luks2() {
    latched_in_process(Stack::Luks2);
}

#[test]
fn failed_flush_latched_integrity_journal() {
    latched_in_process(Stack::IntegrityJ);
}

#[test]
fn failed_flush_latched_integrity_bitmap() {
    latched_in_process(Stack::IntegrityB);
}

#[test]
fn failed_flush_latched_integrity_direct() {
    latched_in_process(Stack::IntegrityD);
}

#[test]
fn failed_flush_latched_luks2_aead() {
    latched_in_process(Stack::Luks2Aead);
}

/// A FUA write whose fdatasync fails latches the same way (no FLUSH involved).
#[test]
fn failed_fua_sync_latched_luks2() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let img = dir.path().join("vol.img");
    durable::format(Stack::Luks2, &img, false);
    let dev = durable::open(Stack::Luks2, &img).unwrap();
    durable::with_plan(&img, |p| p.fail_syncs = 1);
    assert!(dev.write_at(0, &pattern(1, 0, BS), WriteFlags::FUA).is_err());
    assert!(dev.flush().is_err(), "a flush after the failed FUA write must fail");
    assert!(dev.write_at(0, &pattern(1, 0, BS), WriteFlags::FUA).is_err());
}

/// Over NBD: the FLUSH reply after a failed write-back is EIO, and so is every later FLUSH
/// and FUA write on that export, on this connection and on a new one.
fn latched_over_nbd(stack: Stack) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let img = dir.path().join("vol.img");
    durable::format(stack, &img, false);
    let dev = durable::open(stack, &img).unwrap();
    let sock = dir.path().join("nbd.sock");
    let server = Server::new(vec![Export::new("vol", dev)], ServerConfig::default());
    let bound = server.bind(&ListenAddr::Unix(sock.clone())).unwrap();
    let handle = bound.shutdown_handle();
    let t = std::thread::spawn(move || bound.serve());
    let mut c = Client::connect(&sock, "vol").unwrap();
    c.write(0, &pattern(1, 0, BS), false).unwrap().unwrap();
    c.flush().unwrap().unwrap();
    c.write(BS as u64, &pattern(2, BS as u64, BS), false).unwrap().unwrap();
    durable::with_plan(&img, |p| p.fail_syncs = 1);
    assert_eq!(c.flush().unwrap(), Err(NBD_EIO), "{}: the failing FLUSH", stack.name());
    assert_eq!(c.flush().unwrap(), Err(NBD_EIO), "{}: the retried FLUSH", stack.name());
    assert_eq!(c.write(2 * BS as u64, &pattern(3, 0, BS), true).unwrap(), Err(NBD_EIO));
    let mut c2 = Client::connect(&sock, "vol").unwrap();
    assert_eq!(c2.flush().unwrap(), Err(NBD_EIO), "a new connection to the same volume");
    assert_eq!(c.read(0, BS as u32).unwrap().unwrap(), pattern(1, 0, BS), "reads go on");
    drop((c, c2));
    handle.shutdown();
    let _ = t.join().unwrap();
}

#[test]
fn failed_flush_latched_over_nbd_plain() {
    latched_over_nbd(Stack::Plain);
}

#[test]
fn failed_flush_latched_over_nbd_integrity_direct() {
    latched_over_nbd(Stack::IntegrityD);
}

#[test]
fn failed_flush_latched_over_nbd_luks2_aead() {
    latched_over_nbd(Stack::Luks2Aead);
}
