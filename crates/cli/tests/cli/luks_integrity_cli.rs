//! `sealdisk luksFormat --integrity` and `sealdisk open` of LUKS2 authenticated encryption,
//! end to end through the binary: served over NBD (qemu-io writes and verifies), the table
//! printed, cryptsetup's own luksDump reads the header, a flipped byte on disk makes that
//! request fail with EIO while the rest reads, and bad requests are refused before anything
//! is written. (Kernel interop: luks_integrity_kernel.rs and the volume golden tests.)

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{have, qemu_io, run, serve, FAST_PBKDF2};
use formats::integrity::{DeviceParams, Layout, Superblock};

const SIZE: u64 = 8 << 20;
const OFFSET_SECTORS: u64 = 2048;

fn format(dir: &Path, name: &str, extra: &[&str]) -> (String, String) {
    let img = dir.join(format!("{name}.img"));
    std::fs::File::create(&img).unwrap().set_len(SIZE).unwrap();
    let pass = dir.join("pass");
    std::fs::write(&pass, b"aead cli").unwrap();
    let (img, pass) = (img.to_str().unwrap().to_owned(), pass.to_str().unwrap().to_owned());
    let mut args = vec!["luksFormat", "-q", "--key-file", &pass, "--offset", "2048"];
    args.extend_from_slice(FAST_PBKDF2);
    args.extend_from_slice(extra);
    args.push(&img);
    let out = run(&args);
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    (img, pass)
}

/// Flips a byte of the stored data of the 512-byte logical sector `logical`.
fn flip_data(img: &str, logical: u64) {
    let mut raw = std::fs::read(img).unwrap();
    let at = (OFFSET_SECTORS * 512) as usize;
    let sb = Superblock::decode(&raw[at..at + 4096]).unwrap();
    let dp = DeviceParams {
        data_device_sectors: raw.len() as u64 / 512,
        meta_device_sectors: None,
        start: OFFSET_SECTORS,
        buffer_sectors: 128,
        sectors_per_bit: None,
    };
    let l = Layout::open(&sb, &dp).unwrap();
    raw[(l.data_sector(logical) * 512 + 7) as usize] ^= 0x20;
    std::fs::write(img, raw).unwrap();
}

fn srv_sock(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}.sock"))
}

#[test]
fn an_aead_volume_is_served_over_nbd_and_a_flipped_byte_is_an_eio() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [
        ("gcm", &["--cipher", "aes-gcm-random", "--integrity", "aead", "--sector-size", "4096"][..]),
        ("hmac", &["--integrity", "hmac-sha256"][..]),
        ("chacha", &["--cipher", "chacha20-random", "--integrity", "poly1305"][..]),
    ] {
        let (img, pass) = format(dir.path(), name, extra);
        let dump = run(&["luksDump", &img]);
        let text = String::from_utf8_lossy(&dump.stdout).to_string();
        let want = match name {
            "gcm" => "integrity: aead",
            "chacha" => "integrity: poly1305",
            _ => "integrity: hmac(sha256)",
        };
        assert!(text.contains(want), "{name}: {text}");
        if have("cryptsetup") {
            let out = Command::new("cryptsetup").args(["luksDump", &img]).output().unwrap();
            assert!(
                out.status.success(),
                "{name}: cryptsetup luksDump: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains(want), "{name}");
            let out = Command::new("cryptsetup")
                .args(["open", "--test-passphrase", "--key-file", &pass, &img])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: cryptsetup unlocks: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if !have("qemu-io") {
            continue;
        }
        let args = ["--key-file", &pass, &img, name, "--print-table"];
        let srv = serve(dir.path(), name, &args, None);
        qemu_io(&srv.uri(), &["read -P 0 0 1M", "write -P 0x5a 1M 1M", "read -P 0x5a 1M 1M"]);
        let out = srv.stop_ok();
        let table = String::from_utf8_lossy(&out.stdout).to_string();
        let cipher = match name {
            "gcm" => "capi:gcm(aes)-random",
            "chacha" => "capi:rfc7539(chacha20,poly1305)-random",
            _ => "capi:authenc(hmac(sha256),xts(aes))-plain64",
        };
        assert!(table.contains(cipher) && table.contains(":aead"), "{name}: {table}");
        assert!(!table.contains("000102"), "the key is masked");
        // One flipped byte at 1 MiB + 8 KiB: that request fails with EIO, the rest reads.
        flip_data(&img, 2048 + 16);
        std::fs::remove_file(srv_sock(dir.path(), name)).ok();
        let srv = serve(dir.path(), name, &args, None);
        qemu_io(&srv.uri(), &["read -P 0 0 1M", "read -P 0x5a 1M 8k", "read -P 0x5a 1036k 1012k"]);
        let bad =
            Command::new("qemu-io").args(["-f", "raw", "-c", "read 1032k 4k", &srv.uri()]).output().unwrap();
        let said = String::from_utf8_lossy(&bad.stdout).to_string() + &String::from_utf8_lossy(&bad.stderr);
        assert!(said.contains("Input/output error"), "{name}: {said}");
        let out = srv.stop_ok();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(log.contains("integrity AEAD error, sector 2064"), "{name}: {log}");
    }
}

#[test]
fn bad_integrity_requests_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("x.img");
    std::fs::write(&img, vec![0x33u8; SIZE as usize]).unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"p").unwrap();
    let (img_s, pass_s) = (img.to_str().unwrap(), pass.to_str().unwrap());
    for (args, msg) in [
        (&["--integrity", "hmac-md5"][..], "hmac(md5) is not supported"),
        (&["--integrity", "aead"][..], "only aes-gcm-random"),
        (&["--integrity", "poly1305"][..], "only chacha20-random"),
        (&["--cipher", "chacha20-plain64", "--integrity", "poly1305"][..], "random IV generator"),
        (&["--cipher", "chacha20-random", "--integrity", "poly1305", "--key-size", "512"][..], "512 bits"),
        (&["--cipher", "aes-cbc-essiv:sha256", "--integrity", "hmac-sha256"][..], "only aes-xts-plain64"),
        (&["--integrity", "crc32c"][..], "not supported"),
        (&["--integrity-no-wipe"][..], "need --integrity"),
        (&["--type", "luks1", "--integrity", "hmac-sha256"][..], "needs LUKS2"),
    ] {
        let mut a = vec!["luksFormat", "-q", "--key-file", pass_s];
        a.extend_from_slice(args);
        a.push(img_s);
        let out = run(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(msg), "{args:?}: {err}");
        assert!(std::fs::read(&img).unwrap().iter().all(|&b| b == 0x33), "{args:?} wrote to the device");
    }
    // Discards are refused at open for an authenticated volume.
    let (img, pass) = format(
        dir.path(),
        "d",
        &["--cipher", "aes-gcm-random", "--integrity", "aead", "--integrity-no-wipe"],
    );
    let sock = dir.path().join("d.sock");
    let out = run(&[
        "open",
        "--key-file",
        &pass,
        &img,
        "d",
        "--allow-discards",
        "--listen",
        &format!("unix:{}", sock.display()),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("discards are not supported"), "{err}");
}
