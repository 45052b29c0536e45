//! sealdisk on real block devices (loop devices): a block device's size is not its file
//! length, and cryptsetup must read what sealdisk wrote there.
//!
//! Needs root and a usable loop driver (`losetup -f --show`); skipped loudly otherwise.
//! Every loop device is detached by a guard, also when an assertion fails.
use crate::common;

use std::path::Path;
use std::process::Command;

use blockdev::{BlockDevice, FileDevice, FileOptions, WriteFlags, ZeroFlags};
use common::{have, run, run_tool, FAST_PBKDF2};
use sector_crypto::kdf::Passphrase;

/// A loop device over a sparse file, detached on drop.
struct Loop {
    dev: String,
}

impl Loop {
    /// `None` (with a SKIPPED line) when loop devices are not usable here.
    fn new(dir: &Path, name: &str, bytes: u64) -> Option<Loop> {
        let img = dir.join(name);
        std::fs::File::create(&img).unwrap().set_len(bytes).unwrap();
        let out = match Command::new("losetup").args(["-f", "--show"]).arg(&img).output() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("SKIPPED: losetup is not available ({e}); block devices are not tested");
                return None;
            }
        };
        if !out.status.success() {
            eprintln!(
                "SKIPPED: loop devices are not usable here (losetup: {}); block devices are not tested",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        Some(Loop { dev })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

fn pass_file(dir: &Path) -> String {
    let p = dir.join("pw");
    std::fs::write(&p, b"loop device passphrase").unwrap();
    p.to_str().unwrap().to_owned()
}

/// The user's report: `luksFormat` of a 64 MiB loop device said "the device has 0", and
/// `open` fell through to plain. Now format, dump, open, add a key and back up the header,
/// and cryptsetup reads all of it.
#[test]
fn luks_on_a_loop_device() {
    let dir = tempfile::tempdir().unwrap();
    let Some(l) = Loop::new(dir.path(), "l.img", 64 << 20) else { return };
    let pw = pass_file(dir.path());
    let mut args = vec!["luksFormat", "--batch-mode", "--key-file", &pw];
    args.extend_from_slice(FAST_PBKDF2);
    args.push(&l.dev);
    ok(&run(&args), "luksFormat on a loop device");
    let dump = run(&["luksDump", &l.dev]);
    ok(&dump, "luksDump");
    assert!(
        String::from_utf8_lossy(&dump.stdout).contains("Version:"),
        "{}",
        String::from_utf8_lossy(&dump.stdout)
    );
    ok(&run(&["open", "--test-passphrase", "--key-file", &pw, &l.dev]), "open --test-passphrase");
    let new = dir.path().join("pw2");
    std::fs::write(&new, b"second passphrase").unwrap();
    let mut add = vec!["luksAddKey", "--key-file", &pw];
    add.extend_from_slice(FAST_PBKDF2);
    add.extend([l.dev.as_str(), new.to_str().unwrap()]);
    ok(&run(&add), "luksAddKey");
    let backup = dir.path().join("hdr.bak");
    ok(
        &run(&["luksHeaderBackup", "--header-backup-file", backup.to_str().unwrap(), &l.dev]),
        "luksHeaderBackup",
    );
    assert_eq!(std::fs::metadata(&backup).unwrap().len(), 16 << 20, "LUKS2 header and keyslots");

    // The volume fills the device (less the 16 MiB header) and keeps data.
    let p = volume::luks::OpenParams::new(l.dev.clone());
    let opened = volume::luks::open(&p, &Passphrase::new(b"second passphrase".to_vec())).unwrap();
    assert_eq!(opened.volume.device.geometry().size, 48 << 20);
    assert_eq!(opened.volume.crypt_table().unwrap().device, l.dev);
    let data = common::pattern(1 << 20, 5);
    opened.volume.device.write_at(3 << 20, &data, WriteFlags::FUA).unwrap();
    let mut back = vec![0u8; data.len()];
    opened.volume.device.read_at(3 << 20, &mut back).unwrap();
    assert_eq!(back, data);
    drop(opened);

    if !have("cryptsetup") {
        eprintln!("SKIPPED: cryptsetup is not installed; it does not read the loop device");
        return;
    }
    let o = run_tool(Command::new("cryptsetup").args(["luksDump", &l.dev]));
    ok(&o, "cryptsetup luksDump");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("Version:       \t2") && text.contains("1: luks2"), "{text}");
    for key in [pw.as_str(), new.to_str().unwrap()] {
        let o = run_tool(Command::new("cryptsetup").args([
            "open",
            "--test-passphrase",
            "--key-file",
            key,
            &l.dev,
        ]));
        ok(&o, "cryptsetup open --test-passphrase");
    }
}

/// Standalone dm-integrity and an authenticated LUKS2 volume (whose format wipes the
/// whole data area through the AEAD layer) on loop devices.
#[test]
fn integrity_and_wipes_on_loop_devices() {
    let dir = tempfile::tempdir().unwrap();
    let Some(i) = Loop::new(dir.path(), "i.img", 16 << 20) else { return };
    ok(&run(&["integrity", "format", "--batch-mode", "--no-progress", &i.dev]), "integrity format");
    let ours = run(&["integrity", "dump", &i.dev]);
    ok(&ours, "integrity dump");
    if have("integritysetup") {
        let theirs = run_tool(Command::new("integritysetup").args(["dump", &i.dev]));
        ok(&theirs, "integritysetup dump");
        assert_eq!(
            String::from_utf8_lossy(&theirs.stdout).replace(&i.dev, "DEV"),
            String::from_utf8_lossy(&ours.stdout).replace(&i.dev, "DEV")
        );
    } else {
        eprintln!("SKIPPED: integritysetup is not installed; it does not read the loop device");
    }
    let t = volume::integrity::open(&i.dev, &volume::integrity::IntegrityParams::default()).unwrap();
    let mut r = vec![1u8; 4096];
    t.read_at(t.geometry().size - 4096, &mut r).unwrap();
    assert!(r.iter().all(|&b| b == 0), "the format's wipe wrote valid tags to the end");
    drop(t);

    let Some(a) = Loop::new(dir.path(), "a.img", 24 << 20) else { return };
    let pw = pass_file(dir.path());
    let mut args =
        vec!["luksFormat", "-q", "--integrity", "hmac-sha256", "--integrity-no-journal", "--key-file", &pw];
    args.extend_from_slice(FAST_PBKDF2);
    args.push(&a.dev);
    ok(&run(&args), "luksFormat --integrity on a loop device");
    let opened = volume::luks::open(
        &volume::luks::OpenParams::new(a.dev.clone()),
        &Passphrase::new(b"loop device passphrase".to_vec()),
    )
    .unwrap();
    let dev = &opened.volume.device;
    let mut r = vec![1u8; 64 << 10];
    dev.read_at(dev.geometry().size - (64 << 10), &mut r).unwrap();
    assert!(r.iter().all(|&b| b == 0));
}

/// `FileDevice` on a block device: size and logical block size from the device, O_DIRECT,
/// and discard / write-zeroes (which a regular file does with fallocate).
#[test]
fn file_device_on_a_loop_device() {
    let dir = tempfile::tempdir().unwrap();
    let Some(l) = Loop::new(dir.path(), "b.img", 8 << 20) else { return };
    for direct in [false, true] {
        let d = FileDevice::open(&l.dev, FileOptions { direct, ..FileOptions::default() }).unwrap();
        assert_eq!(d.geometry().size, 8 << 20);
        assert_eq!(d.backing(), blockdev::BackingKind::BlockDevice);
        let data = common::pattern(64 << 10, 3);
        d.write_at(1 << 20, &data, WriteFlags::empty()).unwrap();
        d.write_zeroes(1 << 20, 4096, ZeroFlags::empty()).unwrap();
        d.discard((1 << 20) + 8192, 4096).unwrap();
        d.flush().unwrap();
        let mut back = vec![0u8; 64 << 10];
        d.read_at(1 << 20, &mut back).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0), "write-zeroes on a block device");
        assert_eq!(&back[4096..8192], &data[4096..8192], "untouched");
        assert_eq!(&back[12288..], &data[12288..], "untouched after the discard");
    }
}
