//! `sealdisk bitlkDump` and `open --type bitlk` on Windows-made BitLocker images
//! (testdata/bitlk), against independent readers on the host:
//!
//! * `cryptsetup bitlkDump` (2.6): the dump, and `--dump-volume-key`, must be the same text;
//! * `dislocker-file` (Debian `dislocker`): decrypts the volume to a file; sealdisk's NBD
//!   export (read with `nbdcopy`) must be byte-identical to it over the image's length —
//!   password, recovery password and .BEK protectors; XTS, CBC and CBC + Elephant.
//!
//! Each tool that is missing is skipped loudly. Wrong keys exit as cryptsetup 2.6.1's
//! (checked in the kernel oracle): 1 where its search ends on a key that did not unwrap
//! (every wrong key on these images), 2 where it ends on a protector the input cannot be.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{have, run, run_stdin, serve};

const PASSWORD: &str = "password12!@";
const RECOVERY: &str = "284867-596541-514998-422114-660297-261613-215424-199408";

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/bitlk")
}

/// Decompresses `name` into `dir`; `None` (loudly) without xz.
fn image(dir: &Path, name: &str) -> Option<PathBuf> {
    let out = match Command::new("xz").arg("-dc").arg(testdata().join(format!("{name}.img.xz"))).output() {
        Ok(o) if o.status.success() => o.stdout,
        _ => {
            eprintln!("SKIPPED: cannot run xz -dc");
            return None;
        }
    };
    let p = dir.join(format!("{name}.img"));
    std::fs::write(&p, out).unwrap();
    Some(p)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn bitlk_dump_matches_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    if !have("cryptsetup") {
        return;
    }
    for name in ["aes-xts_128", "aes_128", "aes_256_diffuser", "recovery_password", "startup_key"] {
        let Some(img) = image(dir.path(), name) else { return };
        let theirs =
            Command::new("cryptsetup").env("TZ", "UTC").args(["bitlkDump", s(&img)]).output().unwrap();
        assert!(theirs.status.success(), "cryptsetup bitlkDump {name}");
        let ours = run(&["bitlkDump", s(&img)]);
        assert!(ours.status.success(), "{}", String::from_utf8_lossy(&ours.stderr));
        assert_eq!(String::from_utf8_lossy(&ours.stdout), String::from_utf8_lossy(&theirs.stdout), "{name}");
    }
    // --dump-volume-key with the passphrase on stdin, and with a .BEK key file.
    let img = image(dir.path(), "aes_128_diffuser").unwrap();
    let mut cmd = Command::new("cryptsetup");
    cmd.args(["bitlkDump", "--dump-volume-key", "--batch-mode", s(&img)]);
    let theirs = common::run_tool(cmd.stdin(std::fs::File::open(write(dir.path(), "pw", PASSWORD)).unwrap()));
    let ours = run_stdin(&["bitlkDump", "--dump-volume-key", "-q", s(&img)], PASSWORD.as_bytes());
    assert!(ours.status.success(), "{}", String::from_utf8_lossy(&ours.stderr));
    assert_eq!(ours.stdout, theirs.stdout);
    let img = image(dir.path(), "startup_key").unwrap();
    let bek = testdata().join("startup_key.bek");
    let theirs = common::run_tool(Command::new("cryptsetup").args([
        "bitlkDump",
        "--dump-volume-key",
        "--batch-mode",
        "--key-file",
        s(&bek),
        s(&img),
    ]));
    let ours = run(&["bitlkDump", "--dump-volume-key", "-q", "--key-file", s(&bek), s(&img)]);
    assert_eq!(ours.stdout, theirs.stdout);
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn open_serves_what_dislocker_decrypts() {
    let dir = tempfile::tempdir().unwrap();
    if !have("nbdcopy") {
        return;
    }
    let dislocker = Command::new("dislocker-file").arg("-h").output().is_ok();
    if !dislocker {
        eprintln!("SKIPPED PART: dislocker-file is not installed (apt-get install dislocker)");
    }
    let pw = write(dir.path(), "pw", PASSWORD);
    let rp = write(dir.path(), "rp", RECOVERY);
    let bek = testdata().join("startup_key.bek");
    // (image, sealdisk key file, dislocker's option)
    let cases = [
        ("aes-xts_128", pw.clone(), format!("-u{PASSWORD}")),
        ("aes_128", pw.clone(), format!("-u{PASSWORD}")),
        ("aes_128_diffuser", pw.clone(), format!("-u{PASSWORD}")),
        ("recovery_password", rp, format!("-p{RECOVERY}")),
        ("startup_key", bek.clone(), format!("-f{}", bek.display())),
    ];
    for (name, key, dis_opt) in cases {
        let img = image(dir.path(), name).unwrap();
        let srv = serve(
            dir.path(),
            "b",
            &["--type", "bitlk", "--readonly", "--key-file", s(&key), s(&img), "b"],
            None,
        );
        // A BitLocker volume is served as what it is (its type and device in `status`).
        common::status_names(dir.path(), "b", "BITLK", &img);
        let ours = dir.path().join("ours.out");
        common::run_tool(Command::new("nbdcopy").arg(srv.uri()).arg(&ours));
        srv.stop_ok();
        let ours_b = std::fs::read(&ours).unwrap();
        assert_eq!(ours_b.len() as u64, std::fs::metadata(&img).unwrap().len());
        assert_eq!(&ours_b[3..11], b"NTFS    ", "{name}: boot sector");
        if dislocker {
            let theirs = dir.path().join("dis.out");
            common::run_tool(Command::new("dislocker-file").arg("-V").arg(&img).arg(&dis_opt).arg(&theirs));
            let t = std::fs::read(&theirs).unwrap();
            assert!(t.len() >= ours_b.len(), "{name}: dislocker's volume is shorter");
            assert!(t[..ours_b.len()] == ours_b[..], "{name}: differs from dislocker-file");
            std::fs::remove_file(&theirs).unwrap();
        }
        std::fs::remove_file(&ours).unwrap();
        std::fs::remove_file(&img).unwrap();
    }
}

#[test]
fn wrong_keys_and_unusable_input_exit_as_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    // cryptsetup 2.6.1 `open --type bitlk --test-passphrase` exits 1 (silently) for each of
    // these on each image (its last VMK tried fails to unwrap: -EINVAL).
    for name in ["recovery_password", "aes-xts_128", "startup_key", "recovery_key"] {
        let Some(img) = image(dir.path(), name) else { return };
        for wrong in ["wrongpass", "284867-596541-514998-422114-660297-261613-215424-199419"] {
            let o = run_stdin(&["open", "--type", "bitlk", "--test-passphrase", s(&img)], wrong.as_bytes());
            assert_eq!(o.status.code(), Some(1), "{name}: {}", String::from_utf8_lossy(&o.stderr));
            assert!(String::from_utf8_lossy(&o.stderr).contains("No key available with this passphrase."));
        }
        // Another volume's .BEK: 1 as well.
        if matches!(name, "recovery_password" | "recovery_key") {
            let bek = testdata().join("startup_key.bek");
            let o = run(&["open", "--type", "bitlk", "--test-passphrase", "--key-file", s(&bek), s(&img)]);
            assert_eq!(o.status.code(), Some(1), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        }
        std::fs::remove_file(&img).unwrap();
    }
    let Some(img) = image(dir.path(), "recovery_password") else { return };
    let o = run_stdin(&["bitlkOpen", "--test-passphrase", s(&img)], RECOVERY.as_bytes());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Not BitLocker: a usage error, as cryptsetup's exit 1.
    let plain = write(dir.path(), "zero", &"\0".repeat(1 << 20));
    let o = run(&["bitlkDump", s(&plain)]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a BitLocker device"));
}
