//! `--fuse DIR`: the volume as the file DIR/NAME, used by real tools. A LUKS2 volume takes
//! `mkfs.ext4`, a loop mount with files written and read back, and a clean `e2fsck`; the
//! bytes written through FUSE read back identically over NBD after the server has exited;
//! unaligned writes from many threads, `qemu-io`, and the fixed size; punch-hole reaches the
//! backing file as a discard (or writes zeroes when discards are not allowed); a tampered
//! integrity sector fails its reader only; bad mount directories are refused before the
//! key derivation and before anything is written.
//!
//! Needs /dev/fuse and fusermount3 (Debian package fuse3; no root); the loop-mount part needs
//! root and loop devices. Each skips loudly when missing. Mounts, loop devices and servers
//! are cleaned up on drop, also when an assertion fails.

use crate::common;

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{bin, have, pattern, run, run_tool, sha_hex, FAST_PBKDF2};

/// FUSE is usable here: /dev/fuse and fusermount3.
fn fuse_ready() -> bool {
    let ok = Path::new("/dev/fuse").exists()
        && Command::new("fusermount3").arg("-V").output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED: FUSE unusable here (needs /dev/fuse and fusermount3: apt-get install fuse3)");
    }
    ok
}

/// `tool -V` runs (e2fsprogs' tools have no --version).
fn have_v(tool: &str) -> bool {
    let ok = Command::new(tool).arg("-V").output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED PART: {tool} is not installed (apt-get install e2fsprogs)");
    }
    ok
}

fn is_mounted(dir: &Path) -> bool {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(dir.to_str().unwrap()))
}

/// A running `sealdisk ... --fuse DIR`. Dropping it stops the server (SIGTERM, then SIGKILL
/// after 20 s) and detaches whatever is still mounted on DIR.
struct FuseServed {
    child: Option<Child>,
    mnt: PathBuf,
    file: PathBuf,
}

impl FuseServed {
    /// Runs `sealdisk ARGS --fuse MNT` and waits (20 s at most) for MNT/NAME to appear.
    fn start(args: &[&str], mnt: &Path, name: &str) -> FuseServed {
        let mut child = Command::new(bin())
            .args(args)
            .arg("--fuse")
            .arg(mnt)
            .env("SEALDISK_RUNTIME_DIR", mnt.with_extension("run"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sealdisk");
        let file = mnt.join(name);
        let t0 = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
                panic!("sealdisk exited early ({status}): {err}");
            }
            // Listing needs a live server (a dead mount answers stat from its caches).
            if is_mounted(mnt)
                && std::fs::read_dir(mnt).is_ok()
                && std::fs::metadata(&file).is_ok_and(|m| m.is_file())
            {
                return FuseServed { child: Some(child), mnt: mnt.to_path_buf(), file };
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{} never appeared", file.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits; returns the output and checks that the mount is gone.
    fn stop(mut self) -> Output {
        let child = self.child.take().expect("running");
        let out = stop_child(child);
        assert!(!is_mounted(&self.mnt), "{} still mounted after the server exited", self.mnt.display());
        out
    }

    fn stop_ok(self) -> Output {
        let out = self.stop();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "server exit {}: {err}", out.status);
        assert!(err.contains("flushed and closed"), "{err}");
        out
    }
}

fn stop_child(child: Child) -> Output {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let pid = child.id().to_string();
    let t0 = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().expect("wait"));
    while !waiter.is_finished() {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = Command::new("kill").arg("-KILL").arg(&pid).status();
            let _ = waiter.join();
            panic!("the FUSE server did not exit within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiter.join().unwrap()
}

impl Drop for FuseServed {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            if std::thread::panicking() {
                // A failed test: do not wait for users that may never close the file.
                let _ = Command::new("kill").arg("-KILL").arg(child.id().to_string()).status();
                let _ = child.wait_with_output();
            } else {
                let _ = stop_child(child);
            }
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3").args(["-u", "-z", "-q"]).arg(&self.mnt).status();
        }
    }
}

/// A loop device over a file, and a mount of it; undone on drop (declare it after the
/// server, so it goes first).
struct LoopMount {
    dev: String,
    at: Option<PathBuf>,
}

impl LoopMount {
    /// `losetup -f --show FILE`, or `None` (loudly) when loop devices are unusable here.
    fn attach(file: &Path) -> Option<LoopMount> {
        let out = Command::new("losetup").args(["-f", "--show"]).arg(file).output();
        match out {
            Ok(o) if o.status.success() => {
                Some(LoopMount { dev: String::from_utf8_lossy(&o.stdout).trim().to_string(), at: None })
            }
            Ok(o) => {
                eprintln!("SKIPPED PART: loop devices unusable here: {}", String::from_utf8_lossy(&o.stderr));
                None
            }
            Err(e) => {
                eprintln!("SKIPPED PART: losetup unusable here: {e}");
                None
            }
        }
    }

    fn mount(&mut self, at: &Path) {
        run_tool(Command::new("mount").arg(&self.dev).arg(at));
        self.at = Some(at.to_path_buf());
    }

    fn umount(&mut self) {
        if let Some(at) = self.at.take() {
            run_tool(Command::new("umount").arg(at));
        }
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if let Some(at) = self.at.take() {
            let _ = Command::new("umount").arg("-l").arg(at).status();
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

fn read_all(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn luks2_image(dir: &Path, mib: u64) -> (String, String) {
    let img = dir.join("luks.img");
    std::fs::File::create(&img).unwrap().set_len(mib << 20).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, b"fuse test passphrase").unwrap();
    let (img, key) = (img.to_str().unwrap().to_string(), key.to_str().unwrap().to_string());
    let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", &key];
    args.extend_from_slice(FAST_PBKDF2);
    args.push(&img);
    let out = run(&args);
    assert!(out.status.success(), "luksFormat: {}", String::from_utf8_lossy(&out.stderr));
    (img, key)
}

#[test]
fn luks2_file_takes_ext4_and_a_loop_mount_when_served_by_fuse() {
    if !fuse_ready() || !have_v("mkfs.ext4") || !have_v("e2fsck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, key) = luks2_image(dir.path(), 64);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let s = FuseServed::start(&["open", "--key-file", &key, &img, "vol"], &mnt, "vol");
    let meta = std::fs::metadata(&s.file).unwrap();
    assert_eq!(meta.len(), (64 << 20) - (16 << 20), "the file is the LUKS2 payload");
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.uid(), rustix_uid());

    run_tool(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&s.file));
    let files: Vec<(String, Vec<u8>)> =
        (0..3).map(|i| (format!("f{i}.bin"), pattern(700_000 + i * 4093, i as u32 + 1))).collect();
    {
        let mut lm = LoopMount::attach(&s.file);
        if let Some(lm) = lm.as_mut() {
            let at = dir.path().join("ext4");
            std::fs::create_dir(&at).unwrap();
            lm.mount(&at);
            for (name, data) in &files {
                std::fs::write(at.join(name), data).unwrap();
            }
            run_tool(Command::new("sync").arg("-f").arg(at.join("f0.bin")));
            for (name, data) in &files {
                assert!(read_all(&at.join(name)) == *data, "{name} read back differently");
            }
            lm.umount();
        }
    }
    run_tool(Command::new("e2fsck").arg("-fn").arg(&s.file));
    let through_fuse = sha_hex(&read_all(&s.file));
    s.stop_ok();

    // The same bytes through the other transport, after the FUSE server has gone.
    if !have("nbdcopy") {
        return;
    }
    let n = common::serve(dir.path(), "vol", &["--key-file", &key, &img, "vol"], None);
    let back = dir.path().join("back.img");
    run_tool(Command::new("nbdcopy").arg(n.uri()).arg(&back));
    n.stop_ok();
    assert_eq!(sha_hex(&read_all(&back)), through_fuse, "NBD sees other bytes than FUSE did");
    run_tool(Command::new("e2fsck").arg("-fn").arg(&back));
}

/// A LUKS2 volume on object storage (a real S3 server, moto) with a cache of 8 objects
/// takes ext4 through FUSE and a loop mount: 24 MiB of files (three times the cache, so
/// write-behind and eviction upload while ext4 writes), a clean `e2fsck`, and after the
/// server closed (its flush) a new server reads every file back from the store alone.
#[test]
fn luks2_on_s3_takes_ext4_and_reads_back_from_the_store_after_reopen() {
    if !fuse_ready() || !have_v("mkfs.ext4") || !have_v("e2fsck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("AWS_ACCESS_KEY_ID", testkit::s3server::ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", testkit::s3server::SECRET_KEY);
    std::env::remove_var("AWS_PROFILE");
    let Some(srv) = testkit::s3server::S3Server::start(dir.path()) else {
        eprintln!("SKIPPED: moto_server is not installed");
        return;
    };
    srv.create_bucket("vols");
    let uri = format!("s3://vols/fs?endpoint={}&object_size=1M&cache=8M", srv.endpoint());
    let key = dir.path().join("key");
    std::fs::write(&key, b"fuse on s3").unwrap();
    let key = key.to_str().unwrap();
    let made = format!("{uri}&size=64M");
    let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", key];
    args.extend_from_slice(FAST_PBKDF2);
    args.push(&made);
    let out = run(&args);
    assert!(out.status.success(), "luksFormat on s3: {}", String::from_utf8_lossy(&out.stderr));

    let mnt = dir.path().join("mnt");
    let at = dir.path().join("ext4");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&at).unwrap();
    let files: Vec<(String, Vec<u8>)> =
        (0..8).map(|i| (format!("f{i}.bin"), pattern(3 << 20, i as u32 + 11))).collect();
    let s = FuseServed::start(&["open", "--key-file", key, &uri, "vol"], &mnt, "vol");
    run_tool(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&s.file));
    {
        let Some(mut lm) = LoopMount::attach(&s.file) else { return };
        lm.mount(&at);
        for (name, data) in &files {
            std::fs::write(at.join(name), data).unwrap();
        }
        lm.umount();
    }
    run_tool(Command::new("e2fsck").arg("-fn").arg(&s.file));
    s.stop_ok();

    let s = FuseServed::start(&["open", "--readonly", "--key-file", key, &uri, "vol"], &mnt, "vol");
    run_tool(Command::new("e2fsck").arg("-fn").arg(&s.file));
    {
        let Some(mut lm) = LoopMount::attach(&s.file) else { return };
        run_tool(Command::new("mount").args(["-o", "ro,noload"]).arg(&lm.dev).arg(&at));
        lm.at = Some(at.clone());
        for (name, data) in &files {
            assert!(read_all(&at.join(name)) == *data, "{name} read back differently from the store");
        }
        lm.umount();
    }
    s.stop_ok();
}

fn rustix_uid() -> u32 {
    // The test runs as the user that serves.
    std::fs::metadata("/proc/self").unwrap().uid()
}

#[test]
fn unaligned_and_concurrent_writes_read_back_over_nbd_when_written_through_fuse() {
    if !fuse_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("plain.img");
    std::fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, pattern(64, 9)).unwrap();
    let (img, key) = (img.to_str().unwrap(), key.to_str().unwrap());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // 4096-byte sectors: most writes below are read-modify-writes of a block.
    let open: Vec<&str> = vec![
        "open",
        "--type",
        "plain",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "--sector-size",
        "4096",
        "--key-file",
        key,
        img,
        "pv",
    ];
    let s = FuseServed::start(&open, &mnt, "pv");
    let size = 8u64 << 20;
    let mut model = pattern(size as usize, 5);
    let f = OpenOptions::new().read(true).write(true).open(&s.file).unwrap();
    f.write_all_at(&model, 0).unwrap();
    // Eight threads write 100-byte pieces into the same 4 KiB blocks, each its own bytes.
    std::thread::scope(|sc| {
        for t in 0..8u64 {
            let f = &f;
            sc.spawn(move || {
                for block in 0..64u64 {
                    f.write_all_at(&[t as u8 + 0x40; 100], block * 4096 + t * 300 + 7).unwrap();
                }
            });
        }
    });
    for t in 0..8u64 {
        for block in 0..64u64 {
            let at = (block * 4096 + t * 300 + 7) as usize;
            model[at..at + 100].fill(t as u8 + 0x40);
        }
    }
    for (off, len) in [(1u64, 1usize), (4095, 2), (12_345, 70_000), (size - 3, 3)] {
        let d = pattern(len, off as u32);
        f.write_all_at(&d, off).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&d);
    }
    let mut got = vec![0u8; size as usize];
    f.read_exact_at(&mut got, 0).unwrap();
    assert!(got == model, "bytes read through FUSE differ from those written");
    let mut piece = [0u8; 10];
    f.read_exact_at(&mut piece, 4090).unwrap();
    assert_eq!(piece[..], model[4090..4100]);

    // The size is fixed: a write at the end, truncation, new names are refused.
    let e = f.write_at(&[1], size).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(f.write_at(&[9u8; 10], size - 4).unwrap(), 4, "a write across the end is short");
    model[size as usize - 4..].fill(9);
    assert_eq!(f.set_len(4096).unwrap_err().raw_os_error(), Some(libc::EPERM));
    assert!(std::fs::write(mnt.join("other"), b"x").is_err());
    assert!(std::fs::remove_file(&s.file).is_err());
    assert!(std::fs::rename(&s.file, mnt.join("renamed")).is_err());
    f.sync_all().unwrap();

    if have("qemu-io") {
        let file = s.file.to_str().unwrap();
        run_tool(Command::new("qemu-io").args([
            "-f",
            "raw",
            "-t",
            "none",
            "-c",
            "write -P 0x5a 1001 5000",
            "-c",
            "read -P 0x5a 1001 5000",
            "-c",
            "flush",
            file,
        ]));
        model[1001..6001].fill(0x5a);
        let info = run_tool(Command::new("qemu-img").args(["info", "-f", "raw", "--output=json", file]));
        assert!(String::from_utf8_lossy(&info.stdout).contains(&format!("\"virtual-size\": {size}")));
    }
    drop(f);
    s.stop_ok();

    if !have("nbdcopy") {
        return;
    }
    let mut nbd_open: Vec<&str> = open[1..open.len() - 2].to_vec();
    nbd_open.extend([img, "pv"]);
    let n = common::serve(dir.path(), "pv", &nbd_open, None);
    let back = dir.path().join("back.bin");
    run_tool(Command::new("nbdcopy").arg(n.uri()).arg(&back));
    n.stop_ok();
    assert!(read_all(&back) == model, "NBD reads other bytes than were written through FUSE");
}

#[test]
fn punch_hole_and_zero_range_read_back_as_zeroes() {
    if !fuse_ready() || !have("fallocate") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("plain.img");
    // Fully allocated backing file.
    std::fs::write(&img, pattern(16 << 20, 3)).unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, pattern(64, 4)).unwrap();
    let (imgs, keys) = (img.to_str().unwrap(), key.to_str().unwrap());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let base =
        ["open", "--type", "plain", "--cipher", "aes-xts-plain64", "--key-size", "512", "--key-file", keys];
    let blocks = |p: &Path| std::fs::metadata(p).unwrap().blocks();

    // --allow-discards: PUNCH_HOLE|KEEP_SIZE still reads back as zeroes, as fallocate(2)
    // promises (a dm-crypt discard would leave garbage there: the loop driver turns
    // write-zeroes into punch-hole, so a filesystem's zeroing would otherwise be lost).
    let mut args = base.to_vec();
    args.extend(["--allow-discards", imgs, "pd"]);
    let s = FuseServed::start(&args, &mnt, "pd");
    run_tool(Command::new("fallocate").args(["-p", "-o", "1MiB", "-l", "8MiB"]).arg(&s.file));
    let mut punched = vec![1u8; 8 << 20];
    std::fs::File::open(&s.file).unwrap().read_exact_at(&mut punched, 1 << 20).unwrap();
    assert!(
        punched.iter().all(|&b| b == 0),
        "a punched range of a crypt volume does not read back as zeroes"
    );
    assert_eq!(std::fs::metadata(&s.file).unwrap().len(), 16 << 20, "KEEP_SIZE");
    s.stop_ok();

    // Without --allow-discards, the punched range reads back as zeroes and the backing
    // file keeps its blocks (the crypt layer stores encrypted zeroes); ZERO_RANGE too.
    let mut args = base.to_vec();
    args.extend([imgs, "pz"]);
    let s = FuseServed::start(&args, &mnt, "pz");
    let f = OpenOptions::new().read(true).write(true).open(&s.file).unwrap();
    f.write_all_at(&pattern(12 << 20, 8), 0).unwrap();
    f.sync_all().unwrap();
    let before = blocks(&img);
    run_tool(Command::new("fallocate").args(["-p", "-o", "1000", "-l", "3000000"]).arg(&s.file));
    run_tool(Command::new("fallocate").args(["-z", "-o", "5000001", "-l", "77777"]).arg(&s.file));
    let mut got = vec![0u8; 12 << 20];
    f.read_exact_at(&mut got, 0).unwrap();
    let mut want = pattern(12 << 20, 8);
    want[1000..3_001_000].fill(0);
    want[5_000_001..5_077_778].fill(0);
    assert!(got == want, "punch-hole/zero-range did not read back as zeroes over exactly their range");
    assert!(blocks(&img) + 8 >= before, "a discard reached the backing file without --allow-discards");
    drop(f);
    s.stop_ok();
}

#[test]
fn tampered_integrity_sector_fails_only_its_reader() {
    if !fuse_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("i.img");
    std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
    let imgs = img.to_str().unwrap();
    let out = run(&["integrity", "format", "-q", "--no-progress", imgs]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let data = pattern(1 << 20, 11);
    let s = FuseServed::start(&["integrity", "open", imgs, "iv"], &mnt, "iv");
    let f = OpenOptions::new().read(true).write(true).open(&s.file).unwrap();
    f.write_all_at(&data, 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    s.stop_ok();

    // Flip one byte of logical sector 8 (bytes 4096..4608) on disk.
    let mut raw = read_all(&img);
    let sb = formats::integrity::Superblock::decode(&raw[..4096]).unwrap();
    let l =
        formats::integrity::Layout::open(&sb, &formats::integrity::DeviceParams::new(raw.len() as u64 / 512))
            .unwrap();
    raw[l.data_sector(8) as usize * 512 + 17] ^= 0x20;
    std::fs::write(&img, &raw).unwrap();

    let s = FuseServed::start(&["integrity", "open", imgs, "iv"], &mnt, "iv");
    let f = std::fs::File::open(&s.file).unwrap();
    let mut buf = vec![0u8; 512];
    for _ in 0..2 {
        let e = f.read_exact_at(&mut buf, 4096 + 100).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    }
    let mut head = vec![0u8; 4096];
    f.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(head[..], data[..4096]);
    let mut rest = vec![0u8; (1 << 20) - 4608];
    f.read_exact_at(&mut rest, 4608).unwrap();
    assert!(rest[..] == data[4608..], "the sectors after the bad one read wrongly");
    drop(f);
    s.stop_ok();
}

#[test]
fn bad_mount_directories_are_refused_before_the_key_derivation() {
    if !fuse_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, _key) = luks2_image(dir.path(), 20);
    // A wrong passphrase: had the key derivation run first, the error would be about it.
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, b"not the passphrase").unwrap();
    let wrong = wrong.to_str().unwrap();
    let before = sha_hex(&read_all(Path::new(&img)));
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), b"x").unwrap();
    let missing = dir.path().join("missing");
    for (at, says) in [(&missing, "does not exist"), (&file, "is not a directory"), (&full, "is not empty")] {
        let out = run(&["open", "--key-file", wrong, &img, "vol", "--fuse", at.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(says) && !err.to_lowercase().contains("passphrase"), "{says}: {err}");
    }
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = empty.to_str().unwrap();
    let out = Command::new(bin())
        .args(["open", "--key-file", wrong, &img, "vol", "--fuse", e])
        .env("FUSERMOUNT_PATH", "/nonexistent/fusermount3")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("fusermount3 was not found"), "{err}");
    let out = run(&["open", "--key-file", wrong, &img, "vol", "--fuse", e, "--listen", "unix:/tmp/x.sock"]);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["integrity", "open", &img, "iv", "--fuse", full.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
    // With a good directory and the wrong passphrase, the key derivation is what fails,
    // and nothing was mounted.
    let out = run(&["open", "--key-file", wrong, &img, "vol", "--fuse", e]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!is_mounted(&empty));
    assert_eq!(sha_hex(&read_all(Path::new(&img))), before, "a refused open changed the image");
}

/// A server that dies (SIGKILL) leaves no mount behind: fusermount3's auto_unmount. One
/// stopped by SIGTERM while a loop device holds the file keeps serving it until the loop
/// device lets go, then exits cleanly.
#[test]
fn mount_goes_away_when_server_dies_or_its_last_user_closes() {
    if !fuse_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("plain.img");
    std::fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, pattern(64, 1)).unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let args = [
        "open",
        "--type",
        "plain",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "--key-file",
        key.to_str().unwrap(),
        img.to_str().unwrap(),
        "k",
    ];
    // --readonly: a 0400 file on a read-only mount.
    let mut ro = args.to_vec();
    ro.insert(1, "--readonly");
    let s = FuseServed::start(&ro, &mnt, "k");
    assert_eq!(std::fs::metadata(&s.file).unwrap().mode() & 0o777, 0o400);
    let e = OpenOptions::new().write(true).open(&s.file).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let mut b = [0u8; 4096];
    std::fs::File::open(&s.file).unwrap().read_exact_at(&mut b, 4096).unwrap();
    s.stop_ok();

    let mut s = FuseServed::start(&args, &mnt, "k");
    let child = s.child.take().unwrap();
    let _ = Command::new("kill").arg("-KILL").arg(child.id().to_string()).status();
    let _ = child.wait_with_output();
    let t0 = Instant::now();
    while is_mounted(&mnt) {
        if t0.elapsed() > Duration::from_secs(10) {
            // fusermount3 3.14 unmounts only when opening the directory fails with ENOTCONN;
            // when its open races the kernel's teardown it gets ECONNABORTED and leaves the
            // mount behind, dead. The next server on the directory reclaims it (below).
            let e = std::fs::read_dir(&mnt).expect_err("a live mount after its server was killed");
            assert!(matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)), "{e}");
            eprintln!("fusermount3 left a dead mount behind (its auto-unmount race); reclaimed below");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(s);

    // A dead sealdisk mount (here made on purpose: fusermount3 stopped while its server is
    // killed) is reclaimed by the next server on the directory.
    let mut s = FuseServed::start(&args, &mnt, "k");
    let child = s.child.take().unwrap();
    let helpers: String = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let fusermount: Vec<String> = helpers
        .split_whitespace()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "fusermount3")
        })
        .map(str::to_owned)
        .collect();
    if fusermount.len() == 1 {
        let _ = Command::new("kill").arg("-STOP").arg(&fusermount[0]).status();
        let _ = Command::new("kill").arg("-KILL").arg(child.id().to_string()).status();
        let _ = child.wait_with_output();
        let _ = Command::new("kill").arg("-KILL").arg(&fusermount[0]).status();
        std::thread::sleep(Duration::from_millis(200));
        assert!(is_mounted(&mnt), "no dead mount was left to reclaim");
        let e = std::fs::read_dir(&mnt).expect_err("the mount is dead");
        assert!(matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)), "{e}");
        let again = FuseServed::start(&args, &mnt, "k");
        assert_eq!(std::fs::metadata(&again.file).unwrap().len(), 4 << 20);
        again.stop_ok();
        assert!(!is_mounted(&mnt), "the dead mount is still there");
    } else {
        eprintln!("SKIPPED the dead-mount case: no single fusermount3 child ({helpers:?})");
        let _ = Command::new("kill").arg("-KILL").arg(child.id().to_string()).status();
        let _ = child.wait_with_output();
    }
    drop(s);

    let mut s = FuseServed::start(&args, &mnt, "k");
    let Some(lm) = LoopMount::attach(&s.file) else { return };
    let child = s.child.take().unwrap();
    let pid = child.id().to_string();
    let _ = Command::new("kill").arg("-TERM").arg(&pid).status();
    let t0 = Instant::now();
    while is_mounted(&mnt) {
        assert!(t0.elapsed() < Duration::from_secs(10), "SIGTERM did not unmount");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The server stays for the loop device, which still reads through it.
    std::thread::sleep(Duration::from_millis(800));
    let mut child = child;
    assert!(child.try_wait().unwrap().is_none(), "the server left while a loop device used the file");
    let mut dev = std::fs::File::open(&lm.dev).unwrap();
    let mut buf = vec![0u8; 65536];
    dev.read_exact(&mut buf).unwrap();
    drop(dev);
    drop(lm);
    // The loop device let go (its detach completes asynchronously): the server leaves by
    // itself, without a second signal, after flushing.
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            s.child = Some(child);
            panic!("the server still runs 20 s after the loop device let go of the file");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "server exit {}: {err}", out.status);
    assert!(err.contains("still open") && err.contains("flushed and closed"), "{err}");
    assert!(!err.contains("signal 15 again"), "a second signal was needed: {err}");
}

/// The image grows underneath a volume served by FUSE, then `resize NAME`: the file's size
/// (`stat`, which the kernel had cached) follows, the old data stays, and the new end reads
/// and takes writes through the file.
#[test]
fn the_fuse_file_grows_with_resize() {
    if !fuse_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, key) = luks2_image(dir.path(), 32);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let s = FuseServed::start(&["open", "--key-file", &key, &img, "vol"], &mnt, "vol");
    let before = (32u64 << 20) - (16 << 20);
    assert_eq!(std::fs::metadata(&s.file).unwrap().len(), before);
    let head = pattern(1 << 20, 7);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&s.file).unwrap();
        f.write_all_at(&head, 0).unwrap();
        f.sync_all().unwrap();
    }
    std::fs::File::options().write(true).open(&img).unwrap().set_len(48 << 20).unwrap();
    let out = Command::new(bin())
        .args(["resize", "vol"])
        .env("SEALDISK_RUNTIME_DIR", mnt.with_extension("run"))
        .output()
        .unwrap();
    assert!(out.status.success(), "resize: {}", String::from_utf8_lossy(&out.stderr));
    let after = (48u64 << 20) - (16 << 20);
    assert_eq!(std::fs::metadata(&s.file).unwrap().len(), after, "stat after resize");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&s.file).unwrap();
        let tail = pattern(1 << 20, 8);
        f.write_all_at(&tail, after - (1 << 20)).unwrap();
        f.sync_all().unwrap();
        let mut back = vec![0u8; 1 << 20];
        f.read_exact_at(&mut back, after - (1 << 20)).unwrap();
        assert!(back == tail, "the new end read back differently");
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == head, "the old data changed");
    }
    s.stop_ok();
}
