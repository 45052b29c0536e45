//! LUKS2 reencryption against the real kernel (Linux 6.1 dm-crypt and its cryptsetup 2.6,
//! under /work/shared/oracle/kernel-run, one boot), both directions:
//!
//! * disk A: sealdisk's run is SIGKILLed on the host mid-way; in the guest cryptsetup
//!   (`repair` if a hotzone was mid-write, then `reencrypt --resume-only`) finishes it on a
//!   block device, and dm-crypt (`cryptsetup open`) reads the original plaintext back.
//! * disk B: in the guest cryptsetup's run on a block device is SIGKILLed mid-way; on the
//!   host sealdisk resumes and finishes it; the data decrypts to the original plaintext with
//!   the key cryptsetup prints.
//!
//! The second test does the same for `--encrypt`/`--decrypt` with a detached header, and
//! activates sealdisk's `--encrypt --reduce-device-size` start state in the guest (its
//! table: the two linear layers sealdisk maps; it reads the plaintext), then finishes it.
//!
//! Boots a kernel per test (~1 min each under TCG):
//! `cargo test -p sealdisk --test cli reencrypt_kernel:: -- --ignored`.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{bin, boot_kernel, kernel_run, run as sealdisk, sha_hex, tagged_lines, FAST_PBKDF2};
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

const SIZE: u64 = 64 << 20;
const PASS: &str = "kernel horse";

fn cs(args: &[&str]) -> std::process::Output {
    Command::new("cryptsetup").args(args).stdin(Stdio::null()).output().expect("run cryptsetup")
}

fn ok(out: &std::process::Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn plaintext(len: usize) -> Vec<u8> {
    let mut x = 0x0123_4567_89ab_cdefu64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn volume_key(img: &str, pass: &str) -> Vec<u8> {
    let out =
        ok(&cs(&["luksDump", "--dump-volume-key", "--batch-mode", "--key-file", pass, img]), "dump key");
    hex::decode(
        out.split("MK dump:").nth(1).unwrap().chars().filter(|c| c.is_ascii_hexdigit()).collect::<String>(),
    )
    .unwrap()
}

fn layout(img: &str) -> (u64, String, u32) {
    let out = ok(&cs(&["luksDump", img]), "luksDump");
    let seg = out.split("Data segments:").nth(1).unwrap();
    let field = |k: &str| {
        seg.lines()
            .find(|l| l.trim_start().starts_with(k))
            .unwrap()
            .split(':')
            .nth(1)
            .unwrap()
            .trim()
            .to_owned()
    };
    (
        field("offset").split_whitespace().next().unwrap().parse().unwrap(),
        field("cipher"),
        field("sector").split_whitespace().next().unwrap().parse().unwrap(),
    )
}

fn cipher(spec: &str, key: &[u8], ss: u32) -> SectorCipher {
    let s: CipherSpec = spec.parse().unwrap();
    SectorCipher::new(
        &s,
        &VolumeKey::from_slice(key),
        SectorParams { sector_size: ss, iv_offset: 0, iv_large_sectors: false },
    )
    .unwrap()
}

/// A LUKS2 image (cryptsetup on the host) whose data area holds `plaintext`.
fn make(img: &Path, pass: &str) -> u64 {
    std::fs::File::create(img).unwrap().set_len(SIZE).unwrap();
    let i = img.to_str().unwrap();
    let mut args = vec!["luksFormat", "--type", "luks2", "--batch-mode", "--key-file", pass];
    args.extend(FAST_PBKDF2);
    args.push(i);
    ok(&cs(&args), "luksFormat");
    let (off, spec, ss) = layout(i);
    let mut data = plaintext((SIZE - off) as usize);
    cipher(&spec, &volume_key(i, pass), ss).encrypt(0, &mut data).unwrap();
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new().write(true).open(img).unwrap().write_all_at(&data, off).unwrap();
    off
}

fn in_progress(img: &str) -> bool {
    ok(&cs(&["luksDump", img]), "luksDump").contains("online-reencrypt")
}

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~1 min"]
fn reencryption_interrupted_in_one_resumes_in_the_other_with_the_kernel() {
    let Some(kr) = kernel_run() else { return };
    if !common::have("cryptsetup") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, PASS).unwrap();
    let p = pass.to_str().unwrap();
    let a = dir.path().join("a.img");
    let b = dir.path().join("b.img");

    // Disk A: sealdisk killed mid-run on the host.
    let mut caught = false;
    for ms in [600u64, 300, 150, 80, 40] {
        let off = make(&a, p);
        assert_eq!(off, 16 << 20);
        let mut child = Command::new(bin())
            .args(["reencrypt", "--hotzone-size", "1M", "--key-file", p])
            .args(FAST_PBKDF2)
            .arg(&a)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(ms));
        let _ = child.kill();
        let _ = child.wait();
        if in_progress(a.to_str().unwrap()) {
            caught = true;
            break;
        }
    }
    assert!(caught, "sealdisk was never caught mid-run");
    make(&b, p);
    let want = sha_hex(&plaintext((SIZE - (16 << 20)) as usize));

    let script = dir.path().join("guest.sh");
    std::fs::write(
        &script,
        r#"set -e
P=/kr/pass
# A: finish sealdisk's run with cryptsetup on a block device, then read it through dm-crypt.
if cryptsetup luksDump /dev/vda | grep -q in-reencryption; then
  echo "A hotzone-mid-write"
  cryptsetup repair --batch-mode --key-file $P /dev/vda
fi
cryptsetup reencrypt --batch-mode --resume-only --key-file $P /dev/vda
cryptsetup luksDump /dev/vda | grep -q online-reencrypt && { echo "A still-in-progress"; exit 1; }
cryptsetup open --key-file $P /dev/vda a
echo "SHA a $(sha256sum /dev/mapper/a | cut -d' ' -f1)"
cryptsetup close a
# B: start cryptsetup's run (init first: the KDFs are slow under TCG) and kill it mid-way.
cryptsetup reencrypt --batch-mode --init-only --key-file $P --pbkdf pbkdf2 --pbkdf-force-iterations 1000 /dev/vdb
cryptsetup reencrypt --batch-mode --resume-only --hotzone-size 1M --key-file $P /dev/vdb &
pid=$!
for i in $(seq 1 100); do
  sleep 0.05
  n=$(cryptsetup luksDump /dev/vdb | grep -c "^  [0-9]: crypt" || true)
  [ "$n" -ge 4 ] && break
done
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
if cryptsetup luksDump /dev/vdb | grep -q online-reencrypt; then
  echo "B killed-mid-run segments=$(cryptsetup luksDump /dev/vdb | grep -c '^  [0-9]: crypt') hot=$(cryptsetup luksDump /dev/vdb | grep -c in-reencryption)"
else
  echo "B finished-before-kill"
fi
sync
"#,
    )
    .unwrap();
    let log = boot_kernel(&kr, std::slice::from_ref(&pass), &[a.clone(), b.clone()], &script);
    let sums = tagged_lines(&log, "SHA");
    assert_eq!(
        sums.get("a"),
        Some(&want),
        "dm-crypt does not read the original data after sealdisk→cryptsetup"
    );

    // B: sealdisk resumes what the guest's cryptsetup left.
    let bi = b.to_str().unwrap();
    assert!(log.contains("B killed-mid-run"), "cryptsetup in the guest was not caught mid-run: {log}");
    assert!(in_progress(bi));
    let out = sealdisk(&["reencrypt", "--key-file", p, bi]);
    assert!(out.status.success(), "sealdisk resume: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!in_progress(bi));
    let (off, spec, ss) = layout(bi);
    let mut data = std::fs::read(&b).unwrap().split_off(off as usize);
    cipher(&spec, &volume_key(bi, p), ss).decrypt(0, &mut data).unwrap();
    assert_eq!(sha_hex(&data), want, "data lost in cryptsetup(kernel)→sealdisk");
}

/// Kills `cmd` after a delay, trying delays until `header` shows a run in progress.
fn kill_mid_run(header: &Path, mut cmd: impl FnMut() -> Command, reset: impl Fn()) -> bool {
    for ms in [600u64, 300, 1200, 150, 80] {
        reset();
        let mut child = cmd().stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(ms));
        let _ = child.kill();
        let _ = child.wait();
        let h = header.to_str().unwrap();
        if header.exists() && cs(&["isLuks", h]).status.success() && in_progress(h) {
            return true;
        }
    }
    false
}

/// Encryption and decryption with a detached header (`--encrypt`/`--decrypt --header`)
/// against the kernel's cryptsetup 2.6, one boot:
///
/// * disk C (+ header H): sealdisk's encryption is SIGKILLed on the host mid-way; in the
///   guest the kernel activates it mid-encryption (dm-linear + dm-crypt) and reads the
///   plaintext, cryptsetup finishes the run, and dm-crypt reads the plaintext again.
/// * disk D (+ header E): encrypted on the host by sealdisk; in the guest cryptsetup's
///   decryption is SIGKILLed mid-way; on the host sealdisk finishes it: plaintext again.
#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~1 min"]
fn encryption_and_decryption_interrupted_resume_in_the_other_with_the_kernel() {
    let Some(kr) = kernel_run() else { return };
    if !common::have("cryptsetup") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, PASS).unwrap();
    let p = pass.to_str().unwrap();
    let (c, h, d, e) = (
        dir.path().join("c.img"),
        dir.path().join("h.img"),
        dir.path().join("d.img"),
        dir.path().join("e.img"),
    );
    let want_bytes = plaintext(SIZE as usize);
    let want = sha_hex(&want_bytes);
    let encrypt = |data: &Path, hdr: &Path| {
        let mut cmd = Command::new(bin());
        cmd.args(["reencrypt", "--encrypt", "--hotzone-size", "1M", "--key-file", p, "--header"])
            .arg(hdr)
            .args(FAST_PBKDF2)
            .arg(data);
        cmd
    };
    let caught = kill_mid_run(
        &h,
        || encrypt(&c, &h),
        || {
            let _ = std::fs::remove_file(&h);
            std::fs::write(&c, &want_bytes).unwrap();
        },
    );
    assert!(caught, "sealdisk --encrypt was never caught mid-run");
    std::fs::write(&d, &want_bytes).unwrap();
    let out = encrypt(&d, &e).output().unwrap();
    assert!(out.status.success(), "sealdisk --encrypt: {}", String::from_utf8_lossy(&out.stderr));
    assert_ne!(sha_hex(&std::fs::read(&d).unwrap()), want, "D is not encrypted");

    // F: sealdisk's encryption with data shift (header on the device), start state.
    let f = dir.path().join("f.img");
    let f_bytes = plaintext(32 << 20);
    std::fs::write(&f, &f_bytes).unwrap();
    let out = sealdisk(&[
        "reencrypt",
        "--encrypt",
        "--reduce-device-size",
        "8M",
        "--init-only",
        "--key-file",
        p,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        f.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "sealdisk --reduce-device-size: {}", String::from_utf8_lossy(&out.stderr));
    let f_want = sha_hex(&f_bytes[..24 << 20]);

    let script = dir.path().join("guest.sh");
    std::fs::write(
        &script,
        r#"set -e
P=/kr/pass
# F (/dev/vde): sealdisk's data shift start state. Does cryptsetup activate it mid-run?
if cryptsetup open --key-file $P /dev/vde f 2>/tmp/f.err; then
  echo "FOPEN f activated"
  echo "TABLE f $(dmsetup table f | awk '{print $1, $2, $3, $5}' | tr '\n' ',')"
  echo "SHA fmid $(head -c 25165824 /dev/mapper/f | sha256sum | cut -d' ' -f1)"
  cryptsetup close f
else
  echo "FOPEN f refused $(tr '\n' ' ' </tmp/f.err)"
fi
cryptsetup reencrypt --batch-mode --resume-only --key-file $P /dev/vde
cryptsetup open --key-file $P /dev/vde f
echo "SHA fend $(head -c 25165824 /dev/mapper/f | sha256sum | cut -d' ' -f1)"
cryptsetup close f
# C (/dev/vda) + header H (/dev/vdb): sealdisk's encryption, stopped mid-run.
if cryptsetup luksDump /dev/vdb | grep -q in-reencryption; then
  echo "C hotzone-mid-write"
  cryptsetup repair --batch-mode --header /dev/vdb --key-file $P /dev/vda
fi
cryptsetup open --header /dev/vdb --key-file $P /dev/vda c
echo "TABLE c $(dmsetup table c | awk '{print $3}' | tr '\n' ',')"
echo "SHA cmid $(sha256sum /dev/mapper/c | cut -d' ' -f1)"
cryptsetup close c
cryptsetup reencrypt --batch-mode --resume-only --header /dev/vdb --key-file $P /dev/vda
cryptsetup luksDump /dev/vdb | grep -q online-reencrypt && { echo "C still-in-progress"; exit 1; }
cryptsetup open --header /dev/vdb --key-file $P /dev/vda c
echo "SHA cend $(sha256sum /dev/mapper/c | cut -d' ' -f1)"
cryptsetup close c
# D (/dev/vdc) + header E (/dev/vdd): cryptsetup's decryption, killed mid-run.
cryptsetup reencrypt --batch-mode --decrypt --init-only --header /dev/vdd --key-file $P --pbkdf pbkdf2 --pbkdf-force-iterations 1000 /dev/vdc
cryptsetup reencrypt --batch-mode --resume-only --hotzone-size 1M --header /dev/vdd --key-file $P /dev/vdc &
pid=$!
for i in $(seq 1 100); do
  sleep 0.05
  n=$(cryptsetup luksDump /dev/vdd | grep -c "^  [0-9]: linear" || true)
  [ "$n" -ge 3 ] && break
done
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
if cryptsetup luksDump /dev/vdd | grep -q online-reencrypt; then
  echo "D killed-mid-run hot=$(cryptsetup luksDump /dev/vdd | grep -c in-reencryption)"
else
  echo "D finished-before-kill"
fi
sync
"#,
    )
    .unwrap();
    let log = boot_kernel(
        &kr,
        std::slice::from_ref(&pass),
        &[c.clone(), h.clone(), d.clone(), e.clone(), f],
        &script,
    );
    // cryptsetup 2.6.1 activates a volume in the data shift start state (so does sealdisk:
    // luks_encrypt_decrypt.rs, encrypt_interop.rs).
    assert_eq!(tagged_lines(&log, "FOPEN").get("f").map(String::as_str), Some("activated"), "{log}");
    // Its table (32 MiB, shift 4 MiB, sectors): the moved copy at 28 MiB for the first
    // 4 MiB, then the data in place: the two linear layers sealdisk maps.
    assert_eq!(
        tagged_lines(&log, "TABLE").get("f").map(String::as_str),
        Some("0 8192 linear 57344,8192 40960 linear 8192,"),
        "kernel table of the data shift start state"
    );
    assert_eq!(
        tagged_lines(&log, "SHA").get("fmid"),
        Some(&f_want),
        "the kernel reads the start state: {log}"
    );
    assert_eq!(
        tagged_lines(&log, "SHA").get("fend"),
        Some(&f_want),
        "data lost in sealdisk→cryptsetup(kernel) data shift encryption: {log}"
    );
    let sums = tagged_lines(&log, "SHA");
    let table = tagged_lines(&log, "TABLE");
    // cryptsetup's two-segment table mid-encryption: dm-crypt below, dm-linear above (what
    // sealdisk's ReencryptingDevice maps).
    assert_eq!(table.get("c").map(String::as_str), Some("crypt,linear,"), "kernel table mid-encryption");
    assert_eq!(sums.get("cmid"), Some(&want), "the kernel does not read sealdisk's mid-encryption volume");
    assert_eq!(sums.get("cend"), Some(&want), "data lost in sealdisk→cryptsetup(kernel) encryption");

    // D: sealdisk finishes the decryption the guest's cryptsetup left.
    assert!(log.contains("D killed-mid-run"), "cryptsetup in the guest was not caught mid-run: {log}");
    let (di, ei) = (d.to_str().unwrap(), e.to_str().unwrap());
    assert!(in_progress(ei));
    let out = sealdisk(&["reencrypt", "--resume-only", "--header", ei, "--key-file", p, di]);
    assert!(out.status.success(), "sealdisk resume: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!in_progress(ei));
    assert_eq!(
        sha_hex(&std::fs::read(&d).unwrap()),
        want,
        "data lost in cryptsetup(kernel)→sealdisk decryption"
    );
}
