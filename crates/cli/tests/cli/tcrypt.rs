//! `sealdisk tcryptDump` and `open --type tcrypt` from the command line, on the golden
//! images of testdata/tcrypt (tcplay / make-veracrypt.py headers, data and `.dump` files
//! from cryptsetup 2.6.1 in the kernel oracle): the dump equals cryptsetup's but for the
//! device path, `--dump-volume-key` prints the keys the kernel's tables hold, and bad input
//! exits as cryptsetup does (2: no header with this passphrase; 1: a corrupt header or
//! wrong options).
use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tcrypt")
}

fn image(dir: &Path, name: &str) -> Option<PathBuf> {
    let out = dir.join(format!("{name}.img"));
    match Command::new("xz").arg("-dc").arg(testdata().join(format!("{name}.img.xz"))).output() {
        Ok(o) if o.status.success() => {
            std::fs::write(&out, o.stdout).unwrap();
            Some(out)
        }
        _ => {
            eprintln!("SKIPPED: xz is not available to decompress {name}.img.xz");
            None
        }
    }
}

/// Runs sealdisk with `stdin` piped in (a passphrase: not a terminal, so one try).
fn sealdisk(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sealdisk"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Everything after the first line (which names the device).
fn body(s: &str) -> String {
    s.lines().skip(1).map(|l| format!("{l}\n")).collect()
}

#[test]
fn tcrypt_dump_equals_cryptsetups() {
    let dir = tempfile::tempdir().unwrap();
    let kf1 = testdata().join("keyfile1");
    let kf1 = kf1.to_str().unwrap();
    let cases: &[(&str, &str, &str, &[&str])] = &[
        ("tc-aes-sha512", "tc-aes-sha512", "sealdisk-tc1", &["--hash", "sha512"]),
        ("tc-hidden", "tc-hidden.hidden", "sealdisk-hidden", &["--hash", "ripemd160", "--tcrypt-hidden"]),
        ("vc-keyfile-hidden", "vc-keyfile-hidden", "sealdisk-vc2", &["--veracrypt-pim", "1", "-d", kf1]),
        (
            "vc-system",
            "vc-system",
            "sealdisk-vc3",
            &["--veracrypt-pim", "2", "--tcrypt-system", "--hash", "sha256"],
        ),
    ];
    for (img, case, pass, opts) in cases {
        let Some(path) = image(dir.path(), img) else { return };
        let mut args = vec!["tcryptDump", path.to_str().unwrap()];
        args.extend_from_slice(opts);
        let out = sealdisk(&args, pass);
        assert!(out.status.success(), "{case}: {}", text(&out.stderr));
        let want = std::fs::read_to_string(testdata().join(format!("{case}.dump"))).unwrap();
        let got = text(&out.stdout);
        assert_eq!(
            got.lines().next().unwrap().split(' ').next(),
            want.lines().next().unwrap().split(' ').next()
        );
        assert_eq!(body(&got), body(&want), "{case}");
    }
}

#[test]
fn dump_volume_key_prints_the_kernels_keys() {
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = image(dir.path(), "tc-serpent-twofish-aes") else { return };
    let out = sealdisk(
        &["tcryptDump", "--dump-volume-key", "-q", "--hash", "sha512", path.to_str().unwrap()],
        "sealdisk-tc2",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got = text(&out.stdout);
    assert!(got.contains("Cipher chain:  \tserpent-twofish-aes\n"), "{got}");
    assert!(got.contains("Payload offset:\t256\n"), "{got}");
    assert!(got.contains("MK bits:       \t1536\n"), "{got}");
    let dump = got.split("MK dump:\t").nth(1).unwrap();
    let key: String = dump.split_whitespace().collect();
    // The volume key is each layer's key, top (serpent) first, as the kernel's tables.
    let table = std::fs::read_to_string(testdata().join("tc-serpent-twofish-aes.table")).unwrap();
    let mut lines: Vec<&str> = table.lines().collect();
    lines.sort();
    let kernel: String = lines.iter().map(|l| l.split_whitespace().nth(5).unwrap()).collect();
    assert_eq!(key, kernel);
}

#[test]
fn bad_input_exits_as_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = image(dir.path(), "tc-aes-sha512") else { return };
    let p = path.to_str().unwrap();
    // Wrong passphrase: "No device header detected with this passphrase.", exit 2.
    let out = sealdisk(&["tcryptDump", "--disable-veracrypt", "--hash", "sha512", p], "wrong");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("No device header detected with this passphrase."));
    let out = sealdisk(&["open", "--type", "tcrypt", "--test-passphrase", "--hash", "sha512", p], "wrong");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out =
        sealdisk(&["open", "--type", "tcrypt", "--test-passphrase", "--hash", "sha512", p], "sealdisk-tc1");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Wrong PIM on a VeraCrypt volume.
    let Some(vc) = image(dir.path(), "vc-aes-sha512-pim") else { return };
    let out = sealdisk(
        &["tcryptDump", "--veracrypt-pim", "4", "--hash", "sha512", vc.to_str().unwrap()],
        "sealdisk-vc1",
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // A corrupt header field: the header CRC, exit 1.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[64 + 40] ^= 1;
    let bad = dir.path().join("bad.img");
    std::fs::write(&bad, &bytes).unwrap();
    let out = sealdisk(&["tcryptDump", "--hash", "sha512", bad.to_str().unwrap()], "sealdisk-tc1");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("CRC32"), "{}", text(&out.stderr));
    // ... the backup header still opens it.
    let out = sealdisk(
        &["tcryptDump", "--tcrypt-backup", "--hash", "sha512", bad.to_str().unwrap()],
        "sealdisk-tc1",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Conflicting options.
    let out = sealdisk(&["tcryptDump", "--disable-veracrypt", "--veracrypt-pim", "3", p], "x");
    assert_eq!(out.status.code(), Some(1));
    let out = sealdisk(&["open", "--type", "tcrypt", "--tcrypt-hidden", "--allow-discards", p, "x"], "x");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // A --cipher that names no chain: cryptsetup 2.6.1 tries nothing and exits 1.
    let out = sealdisk(&["tcryptDump", "--hash", "sha512", "-c", "xxx", p], "sealdisk-tc1");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // A legacy cascade the kernel cannot map (cryptsetup's TrueCrypt 4 image): the header
    // opens (dump, --test-passphrase: 0), the mapping is refused with cryptsetup's message, 1.
    std::fs::create_dir_all(dir.path().join("cryptsetup")).unwrap();
    let Some(cbci) = image(dir.path(), "cryptsetup/tc_2-ripemd160-cbc-aes-twofish-serpent") else { return };
    let c = cbci.to_str().unwrap();
    let out = sealdisk(&["tcryptDump", "--hash", "ripemd160", "-c", "aes", c], "aaaaaaaaaaaa");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = sealdisk(
        &["open", "--type", "tcrypt", "--test-passphrase", "--hash", "ripemd160", c],
        "aaaaaaaaaaaa",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let sock = dir.path().join("cbci.sock");
    let listen = format!("unix:{}", sock.display());
    let out = sealdisk(
        &["open", "--type", "tcrypt", "--hash", "ripemd160", c, "cbci", "--listen", &listen],
        "aaaaaaaaaaaa",
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("Kernel does not support activation for this TCRYPT legacy mode"),
        "{}",
        text(&out.stderr)
    );
    // Several key files are for tcrypt only.
    let out = sealdisk(&["open", "--type", "plain", "-d", "a", "-d", "b", p, "x"], "");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

/// The golden images' data pattern (testdata/tcrypt/README.md).
fn golden_pattern(i: usize) -> u8 {
    ((i % 251) ^ (i / 4096)) as u8
}

#[test]
fn tcrypt_open_serves_the_cascade_over_nbd() {
    if !common::have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = image(dir.path(), "tc-serpent-twofish-aes") else { return };
    // Read-only, every layer's table printed (keys masked).
    let mut args = vec!["--type", "tcrypt", "--hash", "sha512", "--readonly", "--print-table"];
    args.extend([path.to_str().unwrap(), "tc"]);
    let served = common::serve(dir.path(), "tc", &args, Some(b"sealdisk-tc2\n"));
    let status = common::status_names(dir.path(), "tc", "TCRYPT", &path);
    assert!(status.contains("  cipher:  serpent-xts-plain64"), "the top layer's cipher: {status}");
    let out = common::run_tool(Command::new("nbdcopy").arg(served.uri()).arg("-"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), 3584 * 512);
    assert!(out.stdout[..65536].iter().enumerate().all(|(i, b)| *b == golden_pattern(i)));
    let server = served.stop_ok();
    let tables = text(&server.stdout);
    let ciphers: Vec<&str> = tables.lines().filter_map(|l| l.split_whitespace().nth(3)).collect();
    assert_eq!(ciphers, ["aes-xts-plain64", "twofish-xts-plain64", "serpent-xts-plain64"], "{tables}");
}

#[test]
fn veracrypt_query_pim_reads_the_pim_after_the_passphrase() {
    let dir = tempfile::tempdir().unwrap();
    let Some(vc) = image(dir.path(), "vc-aes-sha512-pim") else { return };
    let v = vc.to_str().unwrap();
    let out = sealdisk(&["tcryptDump", "--veracrypt-query-pim", "--hash", "sha512", v], "sealdisk-vc1\n3\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("VERACRYPT header information"));
    let out = sealdisk(&["tcryptDump", "--veracrypt-query-pim", "--hash", "sha512", v], "sealdisk-vc1\nx\n");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let out = sealdisk(
        &["tcryptOpen", "--test-passphrase", "--veracrypt-pim", "3", "--hash", "sha512", v],
        "sealdisk-vc1",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}
