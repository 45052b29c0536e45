//! LUKS interop with the real cryptsetup (and qemu's LUKS1 driver), both directions, through
//! the `sealdisk` binary. Every test skips loudly when a tool is missing (.ci/run installs
//! cryptsetup-bin, qemu-utils).
//!
//! * cryptsetup-made volumes (LUKS1/LUKS2; aes-xts-plain64 with 512/4096-byte sectors,
//!   aes-cbc-essiv:sha256; PBKDF2 and Argon2id) open in sealdisk: data written through
//!   sealdisk's NBD export decrypts with the volume key `cryptsetup luksDump
//!   --dump-volume-key` prints, and data encrypted with that key reads back through NBD.
//! * sealdisk-made volumes pass `cryptsetup luksDump` (identical text to ours),
//!   `open --test-passphrase`, `luksAddKey` + `luksKillSlot`, and then open in sealdisk
//!   with the new key only.
//! * LUKS1 written by qemu-io reads back in sealdisk, and the other way round.
//! * Malformed images are refused with nothing written; a damaged primary LUKS2 header is
//!   repaired on a writable open and left alone with --readonly.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::cryptsetup::{available as cryptsetup, cipher, cs, layout, ok, volume_key, Vol};

/// Formats `v` with sealdisk (`luksFormat -q`, fast PBKDF2, `extra`).
fn format_fast(v: &Vol, extra: &[&str]) {
    let mut args = vec!["luksFormat", "-q"];
    args.extend_from_slice(extra);
    args.extend_from_slice(FAST_PBKDF2);
    args.extend(["--key-file", v.pass(), v.img()]);
    ok(&sealdisk(&args), "format");
}
use common::{
    have, pattern, qemu_io, run as sealdisk, run_stdin, run_tool, serve, FAST_ARGON2ID, FAST_PBKDF2,
};

/// Format option: a LUKS2 header.
const LUKS2: &[&str] = &["--type", "luks2"];
/// Format options: LUKS1 with 1000 PBKDF2 iterations (LUKS1 knows no other PBKDF).
const LUKS1_FAST: &[&str] = &["--type", "luks1", "--pbkdf-force-iterations", "1000"];
/// The default LUKS cipher.
const XTS: &str = "aes-xts-plain64";
/// The legacy CBC cipher with ESSIV(sha256) IVs.
const CBC_ESSIV: &str = "aes-cbc-essiv:sha256";

/// Writes `0x5a` over [1 MiB, 2 MiB) of the export with qemu-io, and checks the ciphertext
/// in the file decrypts with `vk`; then plants our own ciphertext of a pattern at [0, 1 MiB)
/// and reads it back through NBD.
fn data_round_trip(v: &Vol, open_args: &[&str], vk: &[u8], offset: u64, spec: &str, sector: u32) {
    if !have("qemu-io") {
        return;
    }
    let c = cipher(spec, vk, sector);
    let data = pattern(1 << 20, 7);
    let mut ct = data.clone();
    c.encrypt(0, &mut ct).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&v.img).unwrap();
        f.write_all_at(&ct, offset).unwrap();
    }
    let expect = v.file("expect.bin", &data);
    let srv = serve(v.dir.path(), "vol", open_args, None);
    qemu_io(&srv.uri(), &["write -P 0x5a 1M 1M"]);
    let got = v.dir.path().join("got.bin");
    if have("nbdcopy") {
        run_tool(Command::new("nbdcopy").args([&srv.uri(), got.to_str().unwrap()]));
        assert_eq!(std::fs::read(&got).unwrap()[..1 << 20], data[..], "our ciphertext does not read back");
    } else {
        let _ = expect;
    }
    srv.stop_ok();
    let raw = std::fs::read(&v.img).unwrap();
    let mut ct = raw[(offset + (1 << 20)) as usize..(offset + (2 << 20)) as usize].to_vec();
    c.decrypt((1 << 20) / 512, &mut ct).unwrap();
    assert!(
        ct.iter().all(|&b| b == 0x5a),
        "data written through sealdisk does not decrypt with cryptsetup's key"
    );
}

/// Formats with cryptsetup (`format_args` concatenated), opens with sealdisk, checks data both ways.
fn cryptsetup_made(format_args: &[&[&str]]) {
    if !cryptsetup() {
        return;
    }
    let v = Vol::empty(24 << 20, b"correct horse");
    let mut args = vec!["luksFormat", "--batch-mode", "--key-file", v.pass()];
    args.extend(format_args.concat());
    args.push(v.img());
    ok(&cs(&args), "cryptsetup luksFormat");
    let vk = volume_key(v.img(), v.pass());
    let (offset, spec, sector) = layout(v.img());
    ok(
        &sealdisk(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]),
        "sealdisk open --test-passphrase",
    );
    let wrong = v.file("wrong", b"wrong horse");
    let out = sealdisk(&["open", "--test-passphrase", "--key-file", &wrong, v.img()]);
    assert_eq!(out.status.code(), Some(2), "wrong passphrase exit code");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No key available with this passphrase."), "{err}");
    assert!(!err.contains(&hex::encode(&vk)), "the error names key material");
    // Our dump and --dump-volume-key agree with cryptsetup's.
    let ours = ok(&sealdisk(&["luksDump", v.img()]), "sealdisk luksDump");
    let theirs = ok(&cs(&["luksDump", v.img()]), "cryptsetup luksDump");
    assert_eq!(ours, theirs, "luksDump text differs");
    let ours =
        ok(&sealdisk(&["luksDump", "--dump-volume-key", "-q", "--key-file", v.pass(), v.img()]), "dump vk");
    assert!(ours.replace([' ', '\n', '\t'], "").contains(&hex::encode(&vk)), "{ours}");
    data_round_trip(
        &v,
        &["--type", "luks", "--key-file", v.pass(), v.img(), "vol"],
        &vk,
        offset,
        &spec,
        sector,
    );
}

#[test]
fn cryptsetup_luks2_xts_512_pbkdf2_opens_in_sealdisk() {
    cryptsetup_made(&[LUKS2, FAST_PBKDF2, &["--cipher", XTS, "--key-size", "512", "--sector-size", "512"]]);
}

#[test]
fn cryptsetup_luks2_xts_4096_argon2id_opens_in_sealdisk() {
    cryptsetup_made(&[
        LUKS2,
        FAST_ARGON2ID,
        &["--cipher", XTS, "--key-size", "512", "--sector-size", "4096"],
    ]);
}

#[test]
fn cryptsetup_luks2_cbc_essiv_opens_in_sealdisk() {
    cryptsetup_made(&[
        LUKS2,
        FAST_PBKDF2,
        &["--cipher", CBC_ESSIV, "--key-size", "256", "--sector-size", "512"],
    ]);
}

#[test]
fn cryptsetup_luks1_xts_opens_in_sealdisk() {
    cryptsetup_made(&[LUKS1_FAST, &["--cipher", XTS, "--key-size", "512", "--hash", "sha512"]]);
}

#[test]
fn cryptsetup_luks1_cbc_essiv_sha1_opens_in_sealdisk() {
    cryptsetup_made(&[LUKS1_FAST, &["--cipher", CBC_ESSIV, "--key-size", "256", "--hash", "sha1"]]);
}

/// Formats with sealdisk, then cryptsetup dumps, tests, adds a key and kills slot 0; sealdisk
/// opens with the new key only.
fn sealdisk_made(format_args: &[&str], add_args: &[&str]) {
    if !cryptsetup() {
        return;
    }
    let v = Vol::empty(24 << 20, b"correct horse");
    let mut args = vec!["luksFormat", "-q", "--key-file", v.pass()];
    args.extend_from_slice(format_args);
    args.push(v.img());
    ok(&sealdisk(&args), "sealdisk luksFormat");
    let theirs = ok(&cs(&["luksDump", v.img()]), "cryptsetup luksDump");
    let ours = ok(&sealdisk(&["luksDump", v.img()]), "sealdisk luksDump");
    assert_eq!(ours, theirs, "luksDump text differs");
    ok(
        &cs(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]),
        "cryptsetup open --test-passphrase",
    );
    let vk = volume_key(v.img(), v.pass());
    let ours =
        ok(&sealdisk(&["luksDump", "--dump-volume-key", "-q", "--key-file", v.pass(), v.img()]), "dump vk");
    assert!(ours.replace([' ', '\n', '\t'], "").contains(&hex::encode(&vk)));
    let new = v.file("new", b"battery staple");
    let mut add = vec!["luksAddKey", "--batch-mode", "--key-file", v.pass(), "--new-keyfile", &new];
    add.extend_from_slice(add_args);
    add.push(v.img());
    ok(&cs(&add), "cryptsetup luksAddKey");
    ok(&cs(&["luksKillSlot", "--batch-mode", v.img(), "0"]), "cryptsetup luksKillSlot");
    ok(
        &sealdisk(&["open", "--test-passphrase", "--key-file", &new, v.img()]),
        "sealdisk opens with the new key",
    );
    let out = sealdisk(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]);
    assert_eq!(out.status.code(), Some(2), "the killed passphrase still opens");
    let (offset, spec, sector) = layout(v.img());
    data_round_trip(&v, &["--key-file", &new, v.img(), "vol"], &vk, offset, &spec, sector);
    // And cryptsetup reads what sealdisk's keyslot operations wrote.
    let third = v.file("third", b"third passphrase");
    let mut add = vec!["luksAddKey", "--key-file", &new];
    add.extend_from_slice(FAST_PBKDF2);
    add.extend([v.img(), &third]);
    ok(&sealdisk(&add), "sealdisk luksAddKey");
    ok(
        &cs(&["open", "--test-passphrase", "--key-file", &third, v.img()]),
        "cryptsetup opens sealdisk's new keyslot",
    );
}

#[test]
fn sealdisk_luks2_argon2id_passes_cryptsetup() {
    sealdisk_made(&[FAST_ARGON2ID, &["--label", "sd", "--subsystem", "sub"]].concat(), FAST_ARGON2ID);
}

#[test]
fn sealdisk_luks2_4k_cbc_essiv_pbkdf2_passes_cryptsetup() {
    let layout = ["--sector-size", "4096", "--cipher", CBC_ESSIV, "--key-size", "256"];
    let metadata = ["--luks2-metadata-size", "64k", "--offset", "8192"];
    sealdisk_made(&[FAST_PBKDF2, &layout, &metadata].concat(), FAST_PBKDF2);
}

#[test]
fn sealdisk_luks1_passes_cryptsetup() {
    sealdisk_made(
        &["--type", "luks1", "--pbkdf-force-iterations", "1000", "--hash", "sha1"],
        &["--pbkdf-force-iterations", "1000"],
    );
}

fn qemu_secret(pass: &str) -> String {
    format!("secret,id=sec0,data={pass}")
}

/// Runs qemu-io's own LUKS driver on `img` with passphrase `pass`, one `-c` per command.
fn qemu_io_luks(pass: &str, img: &str, cmds: &[&str]) {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["--object", &qemu_secret(pass), "--image-opts"]);
    cmd.arg(format!("driver=luks,key-secret=sec0,file.filename={img}"));
    for c in cmds {
        cmd.arg("-c").arg(c);
    }
    run_tool(&mut cmd);
}

#[test]
fn qemu_luks1_reads_back_in_sealdisk_and_back() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let v = Vol::empty(0, b"correct horse");
    let img = v.img().to_owned();
    run_tool(Command::new("qemu-img").args([
        "create",
        "-q",
        "-f",
        "luks",
        "--object",
        &qemu_secret("qemu-pass"),
        "-o",
        "key-secret=sec0,cipher-alg=aes-256,cipher-mode=xts,ivgen-alg=plain64,hash-alg=sha256,iter-time=10",
        &img,
        "8M",
    ]));
    qemu_io_luks("qemu-pass", &img, &["write -P 0x42 0 1M"]);
    let pass = v.file("qp", b"qemu-pass");
    let srv = serve(v.dir.path(), "q", &["--type", "luks1", "--key-file", &pass, &img, "q"], None);
    qemu_io(&srv.uri(), &["read -P 0x42 0 1M", "write -P 0x24 1M 1M"]);
    srv.stop_ok();
    qemu_io_luks("qemu-pass", &img, &["read -P 0x24 1M 1M"]);
    // A sealdisk-made LUKS1 volume opens in qemu.
    let w = Vol::empty(12 << 20, b"correct horse");
    let sp = w.file("sp", b"sealdisk-pass");
    let mut f = vec!["luksFormat", "-q"];
    f.extend_from_slice(LUKS1_FAST);
    f.extend(["--key-file", &sp, w.img()]);
    ok(&sealdisk(&f), "format");
    let srv = serve(w.dir.path(), "s", &["--key-file", &sp, w.img(), "s"], None);
    qemu_io(&srv.uri(), &["write -P 0x77 0 2M"]);
    drop(srv.stop());
    qemu_io_luks("sealdisk-pass", w.img(), &["read -P 0x77 0 2M"]);
}

fn sha(path: &Path) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

#[test]
fn malformed_images_are_refused_and_left_untouched() {
    let v = Vol::empty(24 << 20, b"correct horse");
    format_fast(&v, &[]);
    // Truncated: the keyslots area is cut off.
    let t = v.dir.path().join("trunc.img");
    std::fs::write(&t, &std::fs::read(&v.img).unwrap()[..1 << 20]).unwrap();
    let before = sha(&t);
    let out = sealdisk(&[
        "open",
        "--test-passphrase",
        "--type",
        "luks",
        "--key-file",
        v.pass(),
        t.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("too small"), "{err}");
    assert_eq!(sha(&t), before);
    // Both copies' JSON damaged: no valid header.
    let mut img = std::fs::read(&v.img).unwrap();
    img[0x1000 + 10] ^= 1;
    img[0x4000 + 0x1000 + 10] ^= 1;
    let b = v.dir.path().join("both.img");
    std::fs::write(&b, &img).unwrap();
    let before = sha(&b);
    let out = sealdisk(&[
        "open",
        "--test-passphrase",
        "--key-file",
        v.pass(),
        "--type",
        "luks2",
        b.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid LUKS2 header"));
    assert_eq!(sha(&b), before);
    let out = sealdisk(&["isLuks", v.dir.path().join("pass").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    ok(&sealdisk(&["isLuks", "--type", "luks2", v.img()]), "isLuks");
}

#[test]
fn damaged_primary_is_repaired_on_writable_open_only() {
    let v = Vol::empty(24 << 20, b"correct horse");
    format_fast(&v, &[]);
    let good = std::fs::read(&v.img).unwrap();
    let mut img = good.clone();
    img[0x1000 + 10] ^= 1; // primary JSON: checksum mismatch
    std::fs::write(&v.img, &img).unwrap();
    let before = sha(&v.img);
    ok(
        &sealdisk(&["open", "--test-passphrase", "--readonly", "--key-file", v.pass(), v.img()]),
        "read-only open",
    );
    assert_eq!(sha(&v.img), before, "--readonly wrote to the device");
    ok(&sealdisk(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]), "writable open");
    let repaired = std::fs::read(&v.img).unwrap();
    assert_ne!(sha(&v.img), before, "the primary was not repaired");
    // Same JSON area as before the damage (the salt of the rewritten copy is new).
    assert_eq!(repaired[0x1000..0x4000], good[0x1000..0x4000]);
    if cryptsetup() {
        let out = ok(&cs(&["luksDump", "--debug", v.img()]), "cryptsetup luksDump");
        assert!(!out.contains("Checksum error"), "cryptsetup still sees a damaged copy:\n{out}");
    }
}

#[test]
fn header_backup_restore_and_uuid_and_erase() {
    let v = Vol::empty(24 << 20, b"correct horse");
    format_fast(&v, &[]);
    let bk = v.dir.path().join("hdr.bak");
    ok(&sealdisk(&["luksHeaderBackup", v.img(), "--header-backup-file", bk.to_str().unwrap()]), "backup");
    assert_eq!(std::fs::metadata(&bk).unwrap().len(), 16 << 20);
    if cryptsetup() {
        // cryptsetup accepts our backup file as a detached header.
        ok(
            &cs(&[
                "open",
                "--test-passphrase",
                "--header",
                bk.to_str().unwrap(),
                "--key-file",
                v.pass(),
                v.img(),
            ]),
            "cryptsetup --header backup",
        );
    }
    ok(&sealdisk(&["luksUUID", "-q", "--uuid", "01234567-89ab-cdef-0123-456789abcdef", v.img()]), "set uuid");
    assert_eq!(ok(&sealdisk(&["luksUUID", v.img()]), "uuid").trim(), "01234567-89ab-cdef-0123-456789abcdef");
    ok(&sealdisk(&["erase", "-q", v.img()]), "erase");
    assert_eq!(
        sealdisk(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]).status.code(),
        Some(2)
    );
    ok(
        &sealdisk(&["luksHeaderRestore", "-q", v.img(), "--header-backup-file", bk.to_str().unwrap()]),
        "restore",
    );
    ok(&sealdisk(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]), "open after restore");
    let junk = v.file("junk", &[0u8; 65536]);
    let before = sha(&v.img);
    assert_ne!(
        sealdisk(&["luksHeaderRestore", "-q", v.img(), "--header-backup-file", &junk]).status.code(),
        Some(0)
    );
    assert_eq!(sha(&v.img), before);
}

#[test]
fn detached_header_format_and_open() {
    let v = Vol::empty(8 << 20, b"correct horse");
    let hdr = v.dir.path().join("hdr.img");
    let h = hdr.to_str().unwrap();
    format_fast(&v, &["--header", h]);
    assert!(std::fs::read(&v.img).unwrap().iter().all(|&b| b == 0), "the data device was written");
    ok(
        &sealdisk(&["open", "--test-passphrase", "--header", h, "--key-file", v.pass(), v.img()]),
        "open --header",
    );
    if cryptsetup() {
        ok(
            &cs(&["open", "--test-passphrase", "--header", h, "--key-file", v.pass(), v.img()]),
            "cryptsetup --header",
        );
    }
    if have("qemu-io") {
        let srv = serve(
            v.dir.path(),
            "d",
            &["--type", "luks2", "--header", h, "--key-file", v.pass(), v.img(), "d"],
            None,
        );
        qemu_io(&srv.uri(), &["write -P 0x11 0 8M", "read -P 0x11 0 8M"]);
        drop(srv.stop());
    }
}

#[test]
fn keyslot_actions_through_the_cli() {
    let v = Vol::empty(24 << 20, b"correct horse");
    format_fast(&v, &[]);
    let k2 = v.file("k2", b"second");
    let k3 = v.file("k3", b"third");
    let mut a = vec!["luksAddKey", "--key-file", v.pass(), "--key-slot", "4"];
    a.extend_from_slice(FAST_PBKDF2);
    a.extend([v.img(), &k2]);
    ok(&sealdisk(&a), "add");
    let mut c = vec!["luksChangeKey", "--key-file", &k2];
    c.extend_from_slice(FAST_PBKDF2);
    c.extend([v.img(), &k3]);
    ok(&sealdisk(&c), "change");
    assert_eq!(sealdisk(&["open", "--test-passphrase", "--key-file", &k2, v.img()]).status.code(), Some(2));
    ok(
        &sealdisk(&["open", "--test-passphrase", "--key-slot", "4", "--key-file", &k3, v.img()]),
        "changed key in slot 4",
    );
    ok(&sealdisk(&["luksRemoveKey", "-q", v.img(), &k3]), "remove");
    assert_eq!(sealdisk(&["open", "--test-passphrase", "--key-file", &k3, v.img()]).status.code(), Some(2));
    // luksKillSlot needs a remaining passphrase unless -q; a wrong one is refused (exit 2).
    let mut a = vec!["luksAddKey", "--key-file", v.pass()];
    a.extend_from_slice(FAST_PBKDF2);
    a.extend([v.img(), &k2]);
    ok(&sealdisk(&a), "add again");
    let out = sealdisk(&["luksKillSlot", "--key-file", &k3, v.img(), "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    ok(
        &sealdisk(&["luksKillSlot", "--key-file", v.pass(), v.img(), "1"]),
        "kill with a remaining passphrase",
    );
    assert_eq!(
        sealdisk(&["luksKillSlot", "-q", v.img(), "1"]).status.code(),
        Some(1),
        "slot 1 is already gone"
    );
    let out = String::from_utf8_lossy(&sealdisk(&["luksDump", v.img()]).stdout).into_owned();
    assert!(
        out.contains("  0: luks2") && !out.contains("  1: luks2") && !out.contains("  4: luks2"),
        "{out}"
    );
}

#[test]
fn passphrase_from_a_pipe_is_one_line_and_keyfile_stdin_is_binary() {
    let v = Vol::empty(24 << 20, b"correct horse");
    format_fast(&v, &[]);
    // No key file, stdin not a terminal: up to the first newline.
    ok(&run_stdin(&["open", "--test-passphrase", v.img()], b"correct horse\nignored"), "line from stdin");
    // --key-file -: every byte, so a trailing newline is part of the passphrase.
    assert_eq!(
        run_stdin(&["open", "--test-passphrase", "--key-file", "-", v.img()], b"correct horse\n")
            .status
            .code(),
        Some(2)
    );
    ok(
        &run_stdin(&["open", "--test-passphrase", "--key-file", "-", v.img()], b"correct horse"),
        "binary stdin",
    );
    // --keyfile-offset / --keyfile-size select the passphrase inside a larger file.
    let f = v.file("big", b"xxxxcorrect horseyyyy");
    ok(
        &sealdisk(&[
            "open",
            "--test-passphrase",
            "--key-file",
            &f,
            "--keyfile-offset",
            "4",
            "--keyfile-size",
            "13",
            v.img(),
        ]),
        "offset+size",
    );
}
