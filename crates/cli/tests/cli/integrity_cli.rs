//! `sealdisk integrity`: format (progress line, integritysetup dump identical), open served
//! over NBD (a real client writes and reads; the status file), a flipped byte answered as an
//! error to the client and counted, and refused options.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin, have, pattern, run, run_tool};

struct Served {
    child: Child,
    uri: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

fn serve(dir: &Path, img: &str, extra: &[&str]) -> Served {
    let sock = dir.join("i.sock");
    let _ = std::fs::remove_file(&sock);
    let status = dir.join("status");
    let child = Command::new(bin())
        .args(["integrity", "open"])
        .args(extra)
        .args(["--status-file", status.to_str().unwrap(), img, "vol", "--listen"])
        .env("SEALDISK_RUNTIME_DIR", common::runtime_dir(dir))
        .arg(format!("unix:{}", sock.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child = common::wait_for_socket(child, &sock);
    Served { child, uri: format!("nbd+unix:///vol?socket={}", sock.display()) }
}

fn status_field(dir: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix(&format!("{key}: ")).map(String::from)).unwrap_or_default()
}

#[test]
fn format_dump_serve_detect_and_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("i.img");
    std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
    let img = img.to_str().unwrap().to_string();
    let out = run(&["integrity", "format", "-q", "--no-progress", "-s", "4096", &img]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Formatted with tag size 4, internal integrity crc32c."), "{text}");
    assert!(text.contains("Finished, time 00m0") && text.contains("MiB written, speed"), "{text}");
    let ours = run(&["integrity", "dump", &img]);
    assert!(ours.status.success());
    if let Ok(o) = Command::new("integritysetup").arg("dump").arg(&img).output() {
        if o.status.success() {
            assert_eq!(String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&ours.stdout));
        }
    }
    // Refused: conflicting modes; an hmac without its key; a device without a superblock.
    let out = run(&["integrity", "open", "-B", "-D", &img, "vol", "--listen", "unix:/nonexistent"]);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["integrity", "open", "-I", "hmac-sha256", &img, "vol", "--listen", "unix:/nonexistent"]);
    assert_eq!(out.status.code(), Some(1));
    let empty = dir.path().join("empty.img");
    std::fs::File::create(&empty).unwrap().set_len(1 << 20).unwrap();
    let out = run(&["integrity", "dump", empty.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("superblock"));

    if !have("nbdcopy") {
        return;
    }
    let data = pattern(1 << 20, 7);
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    {
        let s = serve(dir.path(), &img, &[]);
        run_tool(Command::new("nbdcopy").arg(&src).arg(&s.uri));
        let back = dir.path().join("back.bin");
        run_tool(Command::new("nbdcopy").arg(&s.uri).arg(&back));
        let all = std::fs::read(&back).unwrap();
        assert!(all[..data.len()] == data[..] && all[data.len()..].iter().all(|&b| b == 0));
        let t0 = Instant::now();
        while status_field(dir.path(), "mismatches") != "0" {
            assert!(t0.elapsed() < Duration::from_secs(5), "no status file");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(status_field(dir.path(), "mode"), "J");
    }
    // Flip one byte of the first block's data on disk: the client gets an error, never data.
    let raw = std::fs::read(&img).unwrap();
    let sb = formats::integrity::Superblock::decode(&raw[..4096]).unwrap();
    let l =
        formats::integrity::Layout::open(&sb, &formats::integrity::DeviceParams::new(raw.len() as u64 / 512))
            .unwrap();
    let mut raw = raw;
    raw[l.data_sector(8) as usize * 512 + 17] ^= 0x20;
    std::fs::write(&img, &raw).unwrap();
    let s = serve(dir.path(), &img, &[]);
    // Its type and device, as every kind's status.
    let status = common::status_names(dir.path(), "vol", "INTEGRITY", Path::new(&img));
    assert!(status.contains("  integrity: crc32c"), "{status}");
    let out = Command::new("nbdcopy").arg(&s.uri).arg(dir.path().join("bad.bin")).output().unwrap();
    assert!(!out.status.success(), "a corrupted block was read without error");
    let t0 = Instant::now();
    while status_field(dir.path(), "mismatches") == "0" || status_field(dir.path(), "mismatches").is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(5), "mismatch not counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Other blocks still read.
    if have("qemu-io") {
        run_tool(Command::new("qemu-io").args(["-f", "raw", "-c", "read 64k 64k", &s.uri]));
    }
}

/// `--journal-integrity` (journal_mac) and `--journal-crypt` on format and open: the flag in the
/// superblock, the superblock MAC and the key checked at open, refused ciphers and missing keys.
#[test]
fn journal_integrity_and_journal_crypt_options() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("j.img");
    std::fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
    let img = img.to_str().unwrap();
    let mkey = dir.path().join("mkey");
    std::fs::write(&mkey, [0x42u8; 32]).unwrap();
    let ckey = dir.path().join("ckey");
    std::fs::write(&ckey, [0x17u8; 40]).unwrap();
    let (mkey, ckey) = (mkey.to_str().unwrap(), ckey.to_str().unwrap());
    let jopts = [
        "--journal-integrity",
        "hmac-sha256",
        "--journal-integrity-key-file",
        mkey,
        "--journal-crypt",
        "ctr-aes",
        "--journal-crypt-key-file",
        ckey,
        "--journal-crypt-key-size",
        "32",
    ];
    let mut args = vec!["integrity", "format", "-q", "--no-progress"];
    args.extend_from_slice(&jopts);
    args.push(img);
    let out = run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dump = String::from_utf8_lossy(&run(&["integrity", "dump", img]).stdout).to_string();
    assert!(dump.contains("journal_mac"), "{dump}");
    if have("integritysetup") {
        let o = run_tool(Command::new("integritysetup").args(["dump", img]));
        assert_eq!(String::from_utf8_lossy(&o.stdout), dump);
    }

    // The volume API with the same options opens it, writes, and reopens (journal replayed).
    let mut p = volume::integrity::IntegrityParams {
        journal_integrity: Some("hmac-sha256".into()),
        journal_integrity_key: Some(sector_crypto::secure::SecretBuf::from_slice(&[0x42; 32])),
        journal_crypt: Some("ctr-aes".into()),
        journal_crypt_key: Some(sector_crypto::secure::SecretBuf::from_slice(&[0x17; 32])),
        journal_commit_time: 0,
        ..Default::default()
    };
    let data = pattern(64 * 1024, 7);
    {
        use blockdev::{BlockDevice, WriteFlags};
        let t = volume::integrity::open(img, &p).unwrap();
        t.write_at(4096, &data, WriteFlags::FUA).unwrap();
        std::sync::Arc::into_inner(t).unwrap().abandon();
        let t = volume::integrity::open(img, &p).unwrap();
        let mut back = vec![0u8; data.len()];
        t.read_at(4096, &mut back).unwrap();
        assert!(back == data);
    }
    // Without the journal MAC, or with another MAC key, it does not open.
    let mut q = p.clone();
    q.journal_integrity = None;
    q.journal_integrity_key = None;
    assert!(volume::integrity::open(img, &q).is_err());
    p.journal_integrity_key = Some(sector_crypto::secure::SecretBuf::from_slice(&[0x43; 32]));
    assert!(volume::integrity::open(img, &p).is_err());

    // Refused: an unsupported cipher, a cipher without its key, a key without its algorithm.
    for bad in [
        vec!["--journal-crypt", "chacha20", "--journal-crypt-key-file", ckey],
        vec!["--journal-crypt", "ctr-aes"],
        vec!["--journal-integrity", "hmac-sha256"],
        vec!["--journal-crypt-key-file", ckey],
    ] {
        let mut args = vec!["integrity", "format", "-q", "--no-progress"];
        args.extend_from_slice(&bad);
        args.push(img);
        let out = run(&args);
        assert!(!out.status.success(), "{bad:?} accepted");
    }
}

/// `sealdisk` with the runtime dir of `dir` (where `serve` registers the volume).
fn run_in(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin()).args(args).env("SEALDISK_RUNTIME_DIR", common::runtime_dir(dir)).output().unwrap()
}

fn dump_field(img: &str, key: &str) -> String {
    let out = run(&["integrity", "dump", img]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")).map(|v| v.trim().to_string()))
        .unwrap_or(text)
}

/// Writes `data` at 0 of the integrity image `img` (through the library), closed cleanly.
fn write_through(img: &str, p: &volume::integrity::IntegrityParams, data: &[u8]) {
    use blockdev::BlockDevice;
    let t = volume::integrity::open(img, p).unwrap();
    t.write_at(0, data, blockdev::WriteFlags::empty()).unwrap();
    t.flush().unwrap();
}

/// Reads the whole volume `img` through the library: its size, and whether every read passed.
fn read_all(img: &str, p: &volume::integrity::IntegrityParams) -> (u64, Vec<u8>) {
    use blockdev::BlockDevice;
    let t = volume::integrity::open(img, p).unwrap();
    t.wait_recalculated();
    let size = t.geometry().size;
    let mut all = vec![0u8; size as usize];
    t.read_at(0, &mut all).unwrap();
    assert_eq!(t.status().mismatches, 0);
    (size / 512, all)
}

/// `sealdisk resize IMAGE` of an integrity image: the superblock's size and the file grow,
/// the old data verifies, the new area reads as zeroes (recalculated, or wiped with
/// `--wipe`); shrinking and a keyed hash without `--wipe` are refused with nothing changed;
/// and `resize NAME` of a served volume whose file grew underneath, as a client sees it.
#[test]
fn resize_offline_and_running() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("g.img");
    std::fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
    let img = img.to_str().unwrap().to_string();
    let out = run(&["integrity", "format", "-q", "--no-progress", &img]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let p = volume::integrity::IntegrityParams::default();
    let data = pattern(1 << 20, 3);
    write_through(&img, &p, &data);
    let old: u64 = dump_field(&img, "provided_data_sectors").parse().unwrap();
    let out = run(&["resize", &img, "--size", "32768"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(dump_field(&img, "provided_data_sectors"), "32768");
    let file_len = std::fs::metadata(&img).unwrap().len();
    assert!(file_len > 16 << 20 && file_len < 17 << 20, "{file_len}");
    let (size, all) = read_all(&img, &p);
    assert_eq!(size, 32768);
    assert!(all[..data.len()] == data[..] && all[data.len()..].iter().all(|&b| b == 0));
    if let Ok(o) = Command::new("integritysetup").arg("dump").arg(&img).output() {
        if o.status.success() {
            let theirs = String::from_utf8_lossy(&o.stdout);
            assert!(theirs.contains("provided_data_sectors 32768"), "{theirs}");
        }
    }
    // Refused, nothing changed: shrinking; --device-size not a multiple of 512.
    let before = std::fs::read(&img).unwrap();
    for (args, msg) in [
        (vec!["resize", &img, "--size", "16384"], "shrinking"),
        (vec!["resize", &img, "--device-size", "1000"], "multiple of 512"),
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(msg),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(std::fs::read(&img).unwrap() == before, "{args:?} changed the image");
    }
    assert!(old < 32768);

    // A keyed hash: the kernel would refuse the recalculation; --wipe writes the new area.
    let himg = dir.path().join("h.img");
    std::fs::File::create(&himg).unwrap().set_len(8 << 20).unwrap();
    let himg = himg.to_str().unwrap().to_string();
    let key = dir.path().join("key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let key = key.to_str().unwrap();
    let out = run(&[
        "integrity",
        "format",
        "-q",
        "--no-progress",
        "-I",
        "hmac-sha256",
        "--integrity-key-file",
        key,
        &himg,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let before = std::fs::read(&himg).unwrap();
    let out = run(&["resize", &himg, "-I", "hmac-sha256", "--integrity-key-file", key, "--size", "32768"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Setting recalculate flag is not supported, you may consider using --wipe instead."),
        "{err}"
    );
    assert!(std::fs::read(&himg).unwrap() == before, "a refused resize changed the image");
    let out = run(&[
        "resize",
        &himg,
        "-I",
        "hmac-sha256",
        "--integrity-key-file",
        key,
        "--size",
        "32768",
        "--wipe",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hp = volume::integrity::IntegrityParams {
        integrity: "hmac-sha256".into(),
        key: Some(sector_crypto::secure::SecretBuf::from_vec(vec![7u8; 32])),
        ..Default::default()
    };
    let (size, all) = read_all(&himg, &hp);
    assert_eq!(size, 32768);
    assert!(all.iter().all(|&b| b == 0));

    // Running: the file grows underneath, `resize vol` grows the served volume.
    if !have("nbdcopy") {
        return;
    }
    let s = serve(dir.path(), &img, &[]);
    let out = run_in(dir.path(), &["resize", "vol", "--size", "999999"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is too small."),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().set_len(file_len + (16 << 20)).unwrap();
    let out = run_in(dir.path(), &["resize", "vol"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let back = dir.path().join("back.bin");
    run_tool(Command::new("nbdcopy").arg(&s.uri).arg(&back));
    let all = std::fs::read(&back).unwrap();
    assert!(all.len() as u64 > 32768 * 512 + (15 << 20), "{}", all.len());
    assert!(all[..data.len()] == data[..] && all[data.len()..].iter().all(|&b| b == 0));
    let t0 = Instant::now();
    while status_field(dir.path(), "provided_data_sectors") != (all.len() / 512).to_string() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "status: {}",
            status_field(dir.path(), "provided_data_sectors")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status_field(dir.path(), "mismatches"), "0");
    drop(s);
    let (size, _) = read_all(&img, &p);
    assert_eq!(size, all.len() as u64 / 512);
}
