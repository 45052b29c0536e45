//! End to end: `sealdisk open --type plain` served over NBD to real clients (qemu-io,
//! nbdcopy, fio), the backing file decrypted independently of sealdisk's code path
//! (RustCrypto xts-mode), and bad input refused with clear errors and nothing written.

use crate::common;

use std::process::Command;

use common::*;

const KEY_BYTES: usize = 64;
/// The cipher of every plain volume here (bar one refused on purpose).
const XTS: &str = "aes-xts-plain64";

fn setup(size: u64) -> (tempfile::TempDir, String, String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let key = pattern(KEY_BYTES, 99);
    let keyf = dir.path().join("key");
    std::fs::write(&keyf, &key).unwrap();
    (dir, img.to_str().unwrap().into(), keyf.to_str().unwrap().into(), key)
}

/// `--type plain --cipher CIPHER --key-size BITS --key-file KEYF EXTRA... IMG NAME`: arguments
/// of a plain open.
fn plain_args<'a>(
    cipher: &'a str,
    bits: &'a str,
    keyf: &'a str,
    extra: &[&'a str],
    img: &'a str,
    name: &'a str,
) -> Vec<&'a str> {
    let mut v = vec!["--type", "plain", "--cipher", cipher, "--key-size", bits, "--key-file", keyf];
    v.extend_from_slice(extra);
    v.extend([img, name]);
    v
}

/// Decrypts one sector with RustCrypto: AES-256-XTS, tweak = le64(iv sector).
fn xts_decrypt(key: &[u8], sector_size: usize, first_iv: u64, iv_step: u64, data: &mut [u8]) {
    use aes::cipher::KeyInit;
    let half = key.len() / 2;
    let c1 = aes::Aes256::new_from_slice(&key[..half]).unwrap();
    let c2 = aes::Aes256::new_from_slice(&key[half..]).unwrap();
    let xts = xts_mode::Xts128::new(c1, c2);
    for (i, s) in data.chunks_mut(sector_size).enumerate() {
        let iv = first_iv + i as u64 * iv_step;
        let mut tweak = [0u8; 16];
        tweak[..8].copy_from_slice(&iv.to_le_bytes());
        xts.decrypt_sector(s, tweak);
    }
}

#[test]
fn plain_xts_4k_over_nbd_matches_independent_decryption() {
    let (dir, img, keyf, key) = setup(8 << 20);
    let extra = ["--sector-size", "4096", "--offset", "2048", "--skip", "8"];
    let srv = serve(dir.path(), "vol", &plain_args(XTS, "512", &keyf, &extra, &img, "vol"), None);
    let data = pattern(1 << 20, 1);
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    if have("qemu-io") {
        qemu_io(&srv.uri(), &["write -P 0x3c 1M 512k", "read -P 0x3c 1M 512k"]);
    }
    if have("nbdcopy") {
        // Write 1 MiB at the start with nbdcopy, read the whole export back.
        run_tool(Command::new("nbdcopy").arg(&src).arg(srv.uri()));
        let out = dir.path().join("out.bin");
        run_tool(Command::new("nbdcopy").arg(srv.uri()).arg(&out));
        let back = std::fs::read(&out).unwrap();
        assert_eq!(back.len() as u64, (8 << 20) - 2048 * 512);
        assert_eq!(&back[..1 << 20], &data[..], "nbdcopy read-back differs");
    }
    srv.stop_ok();

    // Independent check: the backing file holds AES-XTS ciphertext at offset 2048 sectors,
    // 4096-byte sectors, IV = 512-byte sector number + skip (8).
    let raw = std::fs::read(&img).unwrap();
    if have("nbdcopy") {
        let mut ct = raw[2048 * 512..2048 * 512 + (1 << 20)].to_vec();
        assert_ne!(ct, data);
        xts_decrypt(&key, 4096, 8, 8, &mut ct);
        assert_eq!(ct, data, "backing file does not decrypt independently to the data");
    }
    if have("qemu-io") {
        let mut ct = raw[2048 * 512 + (1 << 20)..2048 * 512 + (3 << 19)].to_vec();
        xts_decrypt(&key, 4096, 8 + 2048, 8, &mut ct);
        assert!(ct.iter().all(|&b| b == 0x3c), "qemu-io's pattern does not decrypt independently");
    }
    // Nothing before the offset was touched.
    assert!(raw[..2048 * 512].iter().all(|&b| b == 0));
}

#[test]
fn fio_verify_through_nbd_512_byte_sectors() {
    if !have("fio") {
        return;
    }
    let (dir, img, keyf, _) = setup(32 << 20);
    let srv = serve(dir.path(), "f", &plain_args(XTS, "256", &keyf, &[], &img, "f"), None);
    // fio writes its verify state file into the current directory: keep it in the temp dir.
    let out = run_tool(Command::new("fio").current_dir(dir.path()).args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={}", srv.uri()),
        "--rw=randwrite",
        "--bs=4k",
        "--size=16M",
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--output-format=terse",
    ]));
    let terse = String::from_utf8_lossy(&out.stdout);
    assert!(!terse.is_empty(), "fio printed nothing");
    srv.stop_ok();
}

#[test]
fn table_file_from_stdin_and_print_table() {
    let (dir, img, _, key) = setup(4 << 20);
    let line = format!("0 4096 crypt aes-xts-plain64 {} 0 {img} 0 1 no_read_workqueue\n", hex::encode(&key));
    let srv = serve(dir.path(), "t", &["--table-file", "-", "--print-table", "t"], Some(line.as_bytes()));
    if have("qemu-io") {
        qemu_io(&srv.uri(), &["write -P 0x11 0 64k", "read -P 0x11 0 64k"]);
    }
    let out = srv.stop();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("crypt aes-xts-plain64 0000"), "table not printed masked: {stdout}");
    assert!(!stdout.contains(&hex::encode(&key)), "key leaked to stdout");
    assert!(!String::from_utf8_lossy(&out.stderr).contains(&hex::encode(&key)[..16]), "key leaked to stderr");
}

fn assert_refused(args: &[&str], code: i32, needle: &str, img: &str) {
    let before = std::fs::read(img).unwrap();
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: expected {needle:?} in: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(std::fs::read(img).unwrap(), before, "refused open changed the device");
}

#[test]
fn bad_input_is_refused_clearly_and_writes_nothing() {
    let (dir, img, keyf, _) = setup(1 << 20);
    std::fs::write(&img, pattern(1 << 20, 5)).unwrap();
    let sock = format!("unix:{}", dir.path().join("x.sock").display());
    let short_key = dir.path().join("short");
    std::fs::write(&short_key, [1u8; 16]).unwrap();
    let sk = short_key.to_str().unwrap();
    let base = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["open", "--listen", &sock].iter().map(|s| s.to_string()).collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (base(&plain_args(XTS, "512", sk, &[], &img, "v")), 1, "cannot read 64 bytes"),
        (base(&plain_args("anubis-xts-plain64", "512", &keyf, &[], &img, "v")), 1, "anubis"),
        (base(&plain_args(XTS, "320", &keyf, &[], &img, "v")), 1, "key size"),
        (
            base(&plain_args(XTS, "512", &keyf, &["--offset", "4096"], &img, "v")),
            1,
            "smaller than the offset",
        ),
        (
            base(&plain_args(XTS, "512", &keyf, &["--sector-size", "4096", "--skip", "3"], &img, "v")),
            1,
            "iv_offset",
        ),
        (base(&plain_args(XTS, "512", &keyf, &["--sector-size", "3000"], &img, "v")), 1, "sector_size"),
        (base(&plain_args(XTS, "512", &keyf, &[], "/nonexistent/disk", "v")), 4, "/nonexistent/disk"),
        (base(&["--type", "plain", "--cipher", XTS, "--key-size", "512", &img, "v"]), 1, "--key-file"),
    ];
    for (args, code, needle) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_refused(&a, code, needle, &img);
    }
    assert!(!dir.path().join("x.sock").exists());
}

fn allocated_bytes(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn allow_discards_punches_holes_in_the_backing_file() {
    if !have("qemu-io") {
        return;
    }
    let (dir, img, keyf, _) = setup(8 << 20);
    let srv = serve(dir.path(), "d", &plain_args(XTS, "512", &keyf, &["--allow-discards"], &img, "d"), None);
    qemu_io(&srv.uri(), &["write -P 0x77 0 4M", "flush"]);
    let before = allocated_bytes(&img);
    assert!(before >= 4 << 20, "write did not allocate: {before}");
    qemu_io(&srv.uri(), &["discard 0 2M", "flush"]);
    let after = allocated_bytes(&img);
    assert!(after + (2 << 20) <= before, "discard did not punch a hole: {before} -> {after}");
    qemu_io(&srv.uri(), &["read -P 0x77 2M 2M"]);
    srv.stop_ok();
}

/// The socket is 0600 unless `--socket-mode` says otherwise, a second server on the same
/// path is refused while the first runs, and both the socket and its lock file go away
/// when the server stops.
#[test]
fn socket_mode_flag_and_a_second_server_on_the_same_socket() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, img, keyf, _) = setup(1 << 20);
    let args = plain_args("aes-xts-plain64", "512", &keyf, &["--socket-mode", "0660"], &img, "m");
    let srv = serve(dir.path(), "m", &args, None);
    let mode = std::fs::metadata(&srv.sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let lock = dir.path().join("m.sock.lock");
    assert!(lock.exists());
    let listen = format!("unix:{}", srv.sock.display());
    let mut second = plain_args("aes-xts-plain64", "512", &keyf, &["--listen", &listen], &img, "m2");
    second.insert(0, "open");
    let out = run(&second);
    assert!(!out.status.success(), "a second server bound the same socket");
    assert!(String::from_utf8_lossy(&out.stderr).contains("locked by another server"));
    assert!(srv.sock.exists(), "the second server removed the first one's socket");
    let sock = srv.sock.clone();
    srv.stop_ok();
    assert!(!sock.exists() && !lock.exists());

    let srv = serve(dir.path(), "d", &plain_args("aes-xts-plain64", "512", &keyf, &[], &img, "d"), None);
    let mode = std::fs::metadata(&srv.sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    srv.stop_ok();
}
