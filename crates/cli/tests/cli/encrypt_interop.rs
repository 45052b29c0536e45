//! `sealdisk reencrypt --encrypt` / `--decrypt` with a detached header against the real
//! cryptsetup (2.6 on the host, image files, `--force-offline-reencrypt`), both ways:
//!
//! * a plaintext image encrypted by one tool is decrypted by the other, the data intact
//!   (checked outside both tools with the volume key cryptsetup prints);
//! * `--init-only` in one tool, the run in the other; `luksDump` of the state the same in
//!   both tools;
//! * a run killed with SIGKILL mid-way in one tool resumes in the other without loss;
//! * bad input gets cryptsetup's messages and exit codes.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::cryptsetup::{available as cryptsetup, cs, cs_command, ok, plaintext};
use common::{bin, have, run as sealdisk, FAST_PBKDF2};
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

const MIB: u64 = 1 << 20;

/// A plaintext data image and the path of its (not yet existing) detached header.
struct Disk {
    _dir: tempfile::TempDir,
    data: PathBuf,
    hdr: PathBuf,
    pass: PathBuf,
}

impl Disk {
    fn new(size: u64) -> Disk {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data.img");
        std::fs::write(&data, plaintext(size as usize, 0)).unwrap();
        let pass = dir.path().join("pass");
        std::fs::write(&pass, "correct horse").unwrap();
        let hdr = dir.path().join("hdr.img");
        Disk { _dir: dir, data, hdr, pass }
    }
    fn data(&self) -> &str {
        self.data.to_str().unwrap()
    }
    fn hdr(&self) -> &str {
        self.hdr.to_str().unwrap()
    }
    fn pass(&self) -> &str {
        self.pass.to_str().unwrap()
    }
    fn len(&self) -> usize {
        std::fs::metadata(&self.data).unwrap().len() as usize
    }
    /// cryptsetup's luksDump of the header.
    fn dump(&self) -> String {
        ok(&cs(&["luksDump", self.hdr()]), "luksDump")
    }
    fn in_progress(&self) -> Option<bool> {
        let d = self.dump();
        d.contains("online-reencrypt").then(|| d.contains("in-reencryption"))
    }
    /// The data is plaintext again and the header has no keyslot left.
    fn assert_plain(&self) {
        let d = self.dump();
        assert!(!d.contains("online-reencrypt"), "still in reencryption:\n{d}");
        assert!(std::fs::read(&self.data).unwrap() == plaintext(self.len(), 0), "decryption lost data");
    }
    /// The data decrypts, with the key and layout cryptsetup reports, to the plaintext; the
    /// header is a plain LUKS2 one and the passphrase opens it.
    fn assert_encrypted(&self) {
        let d = self.dump();
        assert!(!d.contains("online-reencrypt"), "still in reencryption:\n{d}");
        ok(&cs(&["open", "--test-passphrase", "--key-file", self.pass(), self.hdr()]), "--test-passphrase");
        let out = ok(
            &cs(&["luksDump", "--dump-volume-key", "--batch-mode", "--key-file", self.pass(), self.hdr()]),
            "luksDump --dump-volume-key",
        );
        let hexs: String =
            out.split("MK dump:").nth(1).unwrap().chars().filter(|c| c.is_ascii_hexdigit()).collect();
        let key = hex::decode(hexs).unwrap();
        let seg = d.split("Data segments:").nth(1).unwrap();
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
        let ss: u32 = field("sector").split_whitespace().next().unwrap().parse().unwrap();
        let spec: CipherSpec = field("cipher").parse().unwrap();
        let c = SectorCipher::new(
            &spec,
            &VolumeKey::from_slice(&key),
            SectorParams { sector_size: ss, iv_offset: 0, iv_large_sectors: false },
        )
        .unwrap();
        // The data from the segment's offset (`--offset`); what is below it untouched.
        let off: usize = field("offset").split_whitespace().next().unwrap().parse().unwrap();
        let mut data = std::fs::read(&self.data).unwrap();
        let want = plaintext(data.len(), 0);
        assert!(data[..off] == want[..off], "the data below the offset changed");
        let data = &mut data[off..];
        assert!(data != &want[off..], "the data is not encrypted");
        c.decrypt(0, data).unwrap();
        assert!(data == &want[off..], "encryption lost data");
    }
}

fn sd(d: &Disk, extra: &[&str]) -> Output {
    let mut args = vec!["reencrypt", "--header", d.hdr(), "--key-file", d.pass()];
    args.extend(FAST_PBKDF2);
    args.extend(extra);
    args.push(d.data());
    sealdisk(&args)
}

fn cs_args<'a>(d: &'a Disk, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "reencrypt",
        "--batch-mode",
        "--force-offline-reencrypt",
        "--header",
        d.hdr(),
        "--key-file",
        d.pass(),
    ];
    args.extend(FAST_PBKDF2);
    args.extend(extra);
    args.push(d.data());
    args
}

fn csr(d: &Disk, extra: &[&str]) -> Output {
    cs(&cs_args(d, extra))
}

#[test]
fn sealdisk_encrypts_cryptsetup_decrypts_and_back() {
    if !cryptsetup() {
        return;
    }
    for resilience in ["checksum", "journal", "none"] {
        let d = Disk::new(24 * MIB);
        ok(&sd(&d, &["--encrypt", "--resilience", resilience]), "sealdisk --encrypt");
        d.assert_encrypted();
        ok(&csr(&d, &["--decrypt"]), "cryptsetup --decrypt");
        d.assert_plain();
    }
    for resilience in ["checksum", "journal", "none"] {
        let d = Disk::new(24 * MIB);
        ok(&csr(&d, &["--encrypt"]), "cryptsetup --encrypt");
        d.assert_encrypted();
        ok(&sd(&d, &["--decrypt", "--resilience", resilience]), "sealdisk --decrypt");
        d.assert_plain();
        // The header left behind is cryptsetup's: no keyslots, one linear segment.
        let theirs: String = ok(&cs(&["luksDump", "--dump-json-metadata", d.hdr()]), "dump json")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        assert!(theirs.contains(r#""keyslots":{}"#) && theirs.contains(r#""type":"linear""#), "{theirs}");
    }
}

#[test]
fn init_only_in_one_tool_runs_in_the_other() {
    if !cryptsetup() {
        return;
    }
    // Encryption: sealdisk's start state, cryptsetup's run; and the other way.
    let d = Disk::new(24 * MIB);
    ok(&sd(&d, &["--encrypt", "--init-only"]), "sealdisk --encrypt --init-only");
    assert_eq!(d.in_progress(), Some(false));
    let ours = ok(&sealdisk(&["luksDump", d.hdr()]), "sealdisk luksDump");
    assert_eq!(ours, d.dump(), "luksDump of an encryption start state");
    ok(&csr(&d, &["--resume-only"]), "cryptsetup --resume-only");
    d.assert_encrypted();
    // Decryption of that volume: cryptsetup's start state, sealdisk's run.
    ok(&csr(&d, &["--decrypt", "--init-only"]), "cryptsetup --decrypt --init-only");
    let ours = ok(&sealdisk(&["luksDump", d.hdr()]), "sealdisk luksDump");
    assert_eq!(ours, d.dump(), "luksDump of a decryption start state");
    ok(&sd(&d, &["--resume-only"]), "sealdisk --resume-only");
    d.assert_plain();

    let d = Disk::new(24 * MIB);
    ok(&csr(&d, &["--encrypt", "--init-only"]), "cryptsetup --encrypt --init-only");
    ok(&sd(&d, &["--resume-only"]), "sealdisk --resume-only");
    d.assert_encrypted();
    ok(&sd(&d, &["--decrypt", "--init-only"]), "sealdisk --decrypt --init-only");
    assert_eq!(d.in_progress(), Some(false));
    ok(&csr(&d, &["--resume-only"]), "cryptsetup --resume-only");
    d.assert_plain();
}

/// Whether the header's JSON areas (its first 32 KiB) name a reencryption: the moment a tool
/// has written its start state. Reads bytes only, so a header being written never fails it.
fn marked(d: &Disk) -> bool {
    use std::io::Read;
    let mut b = Vec::new();
    let Ok(f) = std::fs::File::open(&d.hdr) else { return false };
    let _ = f.take(32 << 10).read_to_end(&mut b);
    b.windows(16).any(|w| w == b"online-reencrypt")
}

/// Starts `cmd`, waits until it has written its reencryption start state into the header
/// (polled, so however fast or slow this machine is: cryptsetup's `--decrypt` spends ~1.7 s
/// on the verification digest's PBKDF2 first), SIGKILLs it a delay later; tries other
/// delays until the kill lands mid-run. `prepare` makes the disk (plaintext, or encrypted
/// for a decryption).
fn killed_mid_run(prepare: impl Fn() -> Disk, mut cmd: impl FnMut(&Disk) -> Command) -> Option<(Disk, bool)> {
    for ms in [30u64, 0, 10, 60, 150, 300] {
        let d = prepare();
        // A header that already names a reencryption (stale bytes) cannot signal the start:
        // then the delay counts from the spawn, after cryptsetup's PBKDF2.
        let stale = marked(&d);
        let mut child =
            cmd(&d).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let start = std::time::Instant::now();
        let wait = if stale { Duration::from_millis(1500) } else { Duration::from_secs(30) };
        while (stale || !marked(&d)) && start.elapsed() < wait {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(ms));
        let _ = child.kill();
        let _ = child.wait();
        if d.hdr.exists() && cs(&["isLuks", d.hdr()]).status.success() {
            if let Some(hot) = d.in_progress() {
                eprintln!("killed {ms} ms after the start state, hotzone mid-write: {hot}");
                return Some((d, hot));
            }
        }
    }
    None
}

/// The whole served export at `uri`, read with nbdcopy (into a file in `dir`).
fn nbd_read_all(uri: &str, dir: &std::path::Path) -> Vec<u8> {
    let back = dir.join("read.raw");
    common::run_tool(Command::new("nbdcopy").arg(uri).arg(&back));
    std::fs::read(&back).unwrap()
}

/// Writes 64 KiB of byte `i + 1` at each offset `offs[i]` through the export at `uri`
/// (qemu-io), and the same into `model`.
fn write_patterns(uri: &str, offs: &[usize], model: &mut [u8]) {
    let cmds: Vec<String> =
        offs.iter().enumerate().map(|(i, o)| format!("write -P {} {o} 65536", i + 1)).collect();
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    common::qemu_io(uri, &refs);
    for (i, &o) in offs.iter().enumerate() {
        model[o..o + 65536].fill((i + 1) as u8);
    }
}

fn encrypted_disk(size: u64) -> Disk {
    let d = Disk::new(size);
    ok(&csr(&d, &["--encrypt"]), "cryptsetup --encrypt");
    d
}

#[test]
fn killed_mid_run_resumes_in_the_other_tool() {
    if !cryptsetup() {
        return;
    }
    let size = 128 * MIB;
    for mode in ["--encrypt", "--decrypt"] {
        let prepare = || if mode == "--encrypt" { Disk::new(size) } else { encrypted_disk(size) };
        // cryptsetup killed, sealdisk resumes.
        let (d, _) = killed_mid_run(prepare, |d| {
            let mut c = cs_command();
            c.args(cs_args(d, &[mode, "--hotzone-size", "1M"]));
            c
        })
        .unwrap_or_else(|| panic!("cryptsetup {mode} was never caught mid-run"));
        ok(&sd(&d, &["--resume-only"]), "sealdisk resume");
        if mode == "--encrypt" {
            d.assert_encrypted();
        } else {
            d.assert_plain();
        }
        // sealdisk killed, cryptsetup resumes.
        let (d, hot) = killed_mid_run(prepare, |d| {
            let mut c = Command::new(bin());
            c.args(["reencrypt", mode, "--hotzone-size", "1M", "--header", d.hdr(), "--key-file", d.pass()])
                .args(FAST_PBKDF2)
                .arg(d.data());
            c
        })
        .unwrap_or_else(|| panic!("sealdisk {mode} was never caught mid-run"));
        if hot {
            ok(
                &cs(&["repair", "--batch-mode", "--header", d.hdr(), "--key-file", d.pass(), d.data()]),
                "cryptsetup repair",
            );
        }
        ok(&csr(&d, &["--resume-only"]), "cryptsetup resume");
        if mode == "--encrypt" {
            d.assert_encrypted();
        } else {
            d.assert_plain();
        }
    }
}

#[test]
fn bad_input_gets_cryptsetup_errors() {
    if !cryptsetup() {
        return;
    }
    let both = |d: &Disk, sd_args: &[&str], cs_extra: &[&str], msg: &str| {
        let before = std::fs::read(&d.data).unwrap();
        let mut args = vec!["reencrypt", "--key-file", d.pass()];
        args.extend(sd_args);
        args.push(d.data());
        let ours = sealdisk(&args);
        let mut cargs = vec!["reencrypt", "--batch-mode", "--key-file", d.pass()];
        cargs.extend(cs_extra);
        cargs.push(d.data());
        let theirs = cs(&cargs);
        assert_eq!(ours.status.code(), theirs.status.code(), "{sd_args:?}: exit code");
        let (o, t) = (String::from_utf8_lossy(&ours.stderr), String::from_utf8_lossy(&theirs.stderr));
        assert!(o.contains(msg), "{sd_args:?}: sealdisk said {o}");
        assert!(t.contains(msg), "{sd_args:?}: cryptsetup said {t}");
        assert!(std::fs::read(&d.data).unwrap() == before, "{sd_args:?} wrote data");
    };
    let d = Disk::new(8 * MIB);
    let msg = "Encryption without detached header (--header) is not possible without data device size \
               reduction (--reduce-device-size).";
    both(&d, &["--encrypt"], &["--encrypt"], msg);
    // cryptsetup looks at the device first: plaintext is not LUKS.
    both(&d, &["--decrypt"], &["--decrypt"], "is not a valid LUKS device.");
    both(
        &d,
        &["--encrypt", "--reduce-device-size", "1000"],
        &["--encrypt", "--reduce-device-size", "1000"],
        "Reduce size must be multiple of 512 bytes sector.",
    );
    // Encrypting a device that is already LUKS: refused, no header file made.
    let d = Disk::new(24 * MIB);
    let mut args = vec!["luksFormat", "--type", "luks2", "--batch-mode", "--key-file", d.pass()];
    args.extend(FAST_PBKDF2);
    args.push(d.data());
    ok(&cs(&args), "luksFormat");
    let o = d.hdr();
    both(
        &d,
        &["--encrypt", "--header", o],
        &["--encrypt", "--header", o],
        "is already LUKS device. Aborting operation.",
    );
    assert!(!d.hdr.exists(), "a header file was made for a refused encryption");
    // The same with a data shift: cryptsetup says the device is LUKS first.
    both(
        &d,
        &["--encrypt", "--reduce-device-size", "32M"],
        &["--encrypt", "--force-offline-reencrypt", "--reduce-device-size", "32M"],
        "is already LUKS device. Aborting operation.",
    );
    // Decryption of a header on the device into a new header file (cryptsetup 2.6's data
    // shift decryption) with less data (8 MiB) than the header: the moved segment is all
    // of it; the same bytes as cryptsetup's.
    let theirs = clone_disk(&d);
    ok(&sd(&d, &["--decrypt"]), "sealdisk --decrypt of a short volume");
    ok(&csr(&theirs, &["--decrypt"]), "cryptsetup --decrypt of a short volume");
    let n = (8 * MIB) as usize;
    assert!(
        std::fs::read(&d.data).unwrap()[..n] == std::fs::read(&theirs.data).unwrap()[..n],
        "the two tools' decryptions of a short volume differ"
    );
    let no_epoch = |s: String| s.lines().filter(|l| !l.starts_with("Epoch")).collect::<Vec<_>>().join("\n");
    assert_eq!(no_epoch(d.dump()), no_epoch(theirs.dump()), "the finished headers differ");
    // Decrypting a volume in reencryption: refused.
    let d = Disk::new(8 * MIB);
    ok(&csr(&d, &["--encrypt", "--init-only"]), "cryptsetup --encrypt --init-only");
    let mid = std::fs::read(&d.hdr).unwrap();
    let out = sd(&d, &["--decrypt", "--init-only"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&d.hdr).unwrap() == mid, "a refused --decrypt changed the header");
}

/// A decryption and an encryption initialized offline, then served (the server activates
/// the two segments, one linear) and resumed online with `--resume-only --active-name`:
/// the data reads right through NBD before, during and after, client writes land, and the
/// finished image is what the clients see.
#[test]
fn served_mid_run_resumes_online() {
    if !cryptsetup() || !have("qemu-io") || !have("nbdcopy") {
        return;
    }
    for mode in ["--decrypt", "--encrypt"] {
        let d = Disk::new(24 * MIB);
        if mode == "--decrypt" {
            ok(&csr(&d, &["--encrypt"]), "cryptsetup --encrypt");
        }
        ok(&sd(&d, &[mode, "--init-only"]), "sealdisk --init-only");
        let dir = d._dir.path();
        let srv =
            common::serve(dir, "vol", &["--header", d.hdr(), "--key-file", d.pass(), d.data(), "vol"], None);
        let uri = srv.uri();
        let read_all = || nbd_read_all(&uri, dir);
        let mut model = plaintext(d.len(), 0);
        assert!(read_all() == model, "{mode}: the served volume mid-run reads wrong");
        let offs: Vec<usize> = (0..12).map(|i| i * 1_900_000 / 4096 * 4096).collect();
        write_patterns(&uri, &offs, &mut model);
        let mut c = Command::new(bin());
        c.args([
            "reencrypt",
            "--resume-only",
            "--active-name",
            "vol",
            "--hotzone-size",
            "256k",
            "--key-file",
        ])
        .arg(d.pass())
        .arg(d.data())
        .env("SEALDISK_RUNTIME_DIR", common::runtime_dir(dir))
        .stdin(Stdio::null());
        ok(&c.output().unwrap(), "sealdisk reencrypt --resume-only --active-name");
        assert!(read_all() == model, "{mode}: the served volume after the online run");
        srv.stop_ok();
        if mode == "--decrypt" {
            assert!(!d.dump().contains("online-reencrypt"));
            assert!(std::fs::read(&d.data).unwrap() == model, "{mode}: the image is not the plaintext");
        } else {
            // Encrypted now: cryptsetup's key decrypts it to what the clients wrote.
            let out = ok(
                &cs(&["luksDump", "--dump-volume-key", "--batch-mode", "--key-file", d.pass(), d.hdr()]),
                "dump key",
            );
            let key = hex::decode(
                out.split("MK dump:")
                    .nth(1)
                    .unwrap()
                    .chars()
                    .filter(|c| c.is_ascii_hexdigit())
                    .collect::<String>(),
            )
            .unwrap();
            let spec: CipherSpec = "aes-xts-plain64".parse().unwrap();
            let c = SectorCipher::new(
                &spec,
                &VolumeKey::from_slice(&key),
                SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false },
            )
            .unwrap();
            let mut data = std::fs::read(&d.data).unwrap();
            c.decrypt(0, &mut data).unwrap();
            assert!(data == model, "{mode}: the image does not decrypt to what the clients wrote");
        }
    }
}

// Encryption in place with data shift (`--encrypt --reduce-device-size`, header on the
// device).

/// A plaintext image whose "header" is the image itself (the data shift puts it there).
fn shift_disk(size: u64) -> Disk {
    let mut d = Disk::new(size);
    d.hdr = d.data.clone();
    d
}

fn sd_shift(d: &Disk, extra: &[&str]) -> Output {
    let mut args = vec!["reencrypt", "--key-file", d.pass()];
    args.extend(FAST_PBKDF2);
    args.extend(extra);
    args.push(d.data());
    sealdisk(&args)
}

fn cs_shift_args<'a>(d: &'a Disk, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["reencrypt", "--batch-mode", "--force-offline-reencrypt", "--key-file", d.pass()];
    args.extend(FAST_PBKDF2);
    args.extend(extra);
    args.push(d.data());
    args
}

/// The image is a finished LUKS2 volume whose data (at `reduce / 2`, cryptsetup's key and
/// cipher) decrypts to the first `size - reduce` bytes of the plaintext.
fn assert_shift_encrypted(d: &Disk, reduce: u64) {
    let n = d.len() - reduce as usize;
    assert_shift_holds(d, reduce, &plaintext(d.len(), 0)[..n]);
}

/// [`assert_shift_encrypted`] with the data `want` (`size - reduce` bytes).
fn assert_shift_holds(d: &Disk, reduce: u64, want: &[u8]) {
    let dump = d.dump();
    assert!(!dump.contains("online-reencrypt"), "still in reencryption:\n{dump}");
    let key = common::cryptsetup::volume_key(d.data(), d.pass());
    let (offset, spec, ss) = common::cryptsetup::layout(d.data());
    assert_eq!(offset, reduce / 2, "data offset");
    let all = std::fs::read(&d.data).unwrap();
    let n = all.len() - reduce as usize;
    let mut data = all[offset as usize..offset as usize + n].to_vec();
    common::cryptsetup::cipher(&spec, &key, ss).decrypt(0, &mut data).unwrap();
    assert!(data == want, "encryption with data shift lost data");
}

#[test]
fn data_shift_encryption_in_one_tool_runs_in_the_other() {
    if !cryptsetup() {
        return;
    }
    let size = 32 * MIB;
    // Whole runs, two reduce sizes (data a multiple of the shift, and not).
    for (reduce, r) in [(8 * MIB, "8M"), (12 * MIB, "12M")] {
        let d = shift_disk(size);
        ok(
            &sd_shift(&d, &["--encrypt", "--reduce-device-size", r]),
            "sealdisk --encrypt --reduce-device-size",
        );
        assert_shift_encrypted(&d, reduce);
    }
    // sealdisk's start state: luksDump the same in both tools, cryptsetup runs it.
    let d = shift_disk(size);
    ok(
        &sd_shift(&d, &["--encrypt", "--reduce-device-size", "12M", "--init-only"]),
        "sealdisk --encrypt --reduce-device-size --init-only",
    );
    assert_eq!(d.in_progress(), Some(false));
    let ours = ok(&sealdisk(&["luksDump", d.data()]), "sealdisk luksDump");
    assert_eq!(ours, d.dump(), "luksDump of a data shift start state");
    for (k, v) in [("Resilience:", "datashift"), ("Shift size:", "6291456"), ("Direction:", "backward")] {
        assert!(d.dump().lines().any(|l| l.contains(k) && l.contains(v)), "{k} {v}:\n{}", d.dump());
    }
    ok(&cs(&cs_shift_args(&d, &["--resume-only"])), "cryptsetup --resume-only");
    assert_shift_encrypted(&d, 12 * MIB);
    // cryptsetup's start state, sealdisk runs it (plain `reencrypt DEVICE` resumes).
    let d = shift_disk(size);
    ok(
        &cs(&cs_shift_args(&d, &["--encrypt", "--reduce-device-size", "12M", "--init-only"])),
        "cryptsetup --encrypt --reduce-device-size --init-only",
    );
    ok(&sd_shift(&d, &[]), "sealdisk reencrypt (resume)");
    assert_shift_encrypted(&d, 12 * MIB);
    // The same command that started it resumes it, in both tools.
    let d = shift_disk(size);
    let args = ["--encrypt", "--reduce-device-size", "12M"];
    ok(&cs(&cs_shift_args(&d, &[&args[..], &["--init-only"]].concat())), "cryptsetup --init-only");
    ok(&sd_shift(&d, &args), "sealdisk reencrypt --encrypt --reduce-device-size (resume)");
    assert_shift_encrypted(&d, 12 * MIB);
    let d = shift_disk(size);
    ok(&sd_shift(&d, &[&args[..], &["--init-only"]].concat()), "sealdisk --init-only");
    ok(&cs(&cs_shift_args(&d, &args)), "cryptsetup reencrypt --encrypt --reduce-device-size (resume)");
    assert_shift_encrypted(&d, 12 * MIB);
}

#[test]
fn data_shift_encryption_killed_mid_run_resumes_in_the_other_tool() {
    if !cryptsetup() {
        return;
    }
    let (size, reduce) = (128 * MIB, 8 * MIB);
    let prepare = || shift_disk(size);
    // cryptsetup killed, sealdisk resumes.
    let (d, cs_hot) = killed_mid_run(prepare, |d| {
        let mut c = cs_command();
        c.args(cs_shift_args(d, &["--encrypt", "--reduce-device-size", "8M"]));
        c
    })
    .expect("cryptsetup --encrypt --reduce-device-size was never caught mid-run");
    let copy = shift_disk(size);
    std::fs::copy(&d.data, &copy.data).unwrap();
    ok(&sd_shift(&d, &["--resume-only"]), "sealdisk resume");
    assert_shift_encrypted(&d, reduce);
    // The same state served by sealdisk (as cryptsetup maps it): the plaintext reads back,
    // client writes land, and cryptsetup finishes the run with them.
    if have("qemu-io") && have("nbdcopy") {
        let d = copy;
        let n = (size - reduce) as usize;
        ok(&sealdisk(&["open", "--test-passphrase", "--key-file", d.pass(), d.data()]), "--test-passphrase");
        let dir = d._dir.path();
        let srv = common::serve(dir, "vol", &["--key-file", d.pass(), d.data(), "vol"], None);
        let mut st = Command::new(bin());
        st.args(["status", "vol"]).env("SEALDISK_RUNTIME_DIR", common::runtime_dir(dir));
        let text = ok(&st.output().unwrap(), "sealdisk status");
        let line = |k: &str| text.lines().find(|l| l.trim_start().starts_with(k)).unwrap_or("").to_owned();
        assert!(line("offset:").contains(&(reduce / 2 / 512).to_string()), "{text}");
        assert!(line("size:").contains(&(n / 512).to_string()), "{text}");
        let uri = srv.uri();
        let read_all = || nbd_read_all(&uri, dir);
        let mut model = plaintext(size as usize, 0)[..n].to_vec();
        assert!(read_all() == model, "the served volume mid data shift reads wrong");
        let offs: Vec<usize> =
            (0..10).map(|i| i * (n / 10) + (i % 3) * 4096 * 400 - 4096 * (i > 0) as usize).collect();
        write_patterns(&uri, &offs, &mut model);
        assert!(read_all() == model, "writes through the volume mid data shift");
        srv.stop_ok();
        if cs_hot {
            ok(&cs(&["repair", "--batch-mode", "--key-file", d.pass(), d.data()]), "cryptsetup repair");
        }
        ok(&cs(&cs_shift_args(&d, &["--resume-only"])), "cryptsetup resume after sealdisk's writes");
        assert_shift_holds(&d, reduce, &model);
    }
    // sealdisk killed, cryptsetup resumes.
    let (d, hot) = killed_mid_run(prepare, |d| {
        let mut c = Command::new(bin());
        c.args(["reencrypt", "--encrypt", "--reduce-device-size", "8M", "--key-file", d.pass()])
            .args(FAST_PBKDF2)
            .arg(d.data());
        c
    })
    .expect("sealdisk --encrypt --reduce-device-size was never caught mid-run");
    if hot {
        ok(&cs(&["repair", "--batch-mode", "--key-file", d.pass(), d.data()]), "cryptsetup repair");
    }
    ok(&cs(&cs_shift_args(&d, &["--resume-only"])), "cryptsetup resume");
    assert_shift_encrypted(&d, reduce);
}

#[test]
fn data_shift_bad_input_gets_cryptsetup_errors() {
    if !cryptsetup() {
        return;
    }
    let both = |size: u64, r: &str, msg: &str| {
        let d = shift_disk(size);
        let before = std::fs::read(&d.data).unwrap();
        let ours = sd_shift(&d, &["--encrypt", "--reduce-device-size", r]);
        let theirs = cs(&cs_shift_args(&d, &["--encrypt", "--reduce-device-size", r]));
        let (o, t) = (String::from_utf8_lossy(&ours.stderr), String::from_utf8_lossy(&theirs.stderr));
        assert_eq!(ours.status.code(), theirs.status.code(), "{r}: exit code; sealdisk said {o}");
        assert!(o.contains(msg), "{r}: sealdisk said {o}");
        assert!(t.contains(msg), "{r}: cryptsetup said {t}");
        assert!(std::fs::read(&d.data).unwrap() == before, "{r}: wrote data");
    };
    both(8 * MIB, "4097", "Reduce size must be multiple of 512 bytes sector.");
    both(8 * MIB, "16M", "is too small.");
    both(8 * MIB, "8M", "Failed to initialize LUKS2 reencryption in metadata.");
    both(8 * MIB, "512K", "No space for new keyslot.");
    // A device in another reencryption.
    let d = shift_disk(24 * MIB);
    let mut f = vec!["luksFormat", "--batch-mode", "--key-file", d.pass()];
    f.extend(FAST_PBKDF2);
    f.push(d.data());
    ok(&cs(&f), "luksFormat");
    ok(&cs(&cs_shift_args(&d, &["--init-only"])), "cryptsetup reencrypt --init-only");
    let before = std::fs::read(&d.data).unwrap();
    let ours = sd_shift(&d, &["--encrypt", "--reduce-device-size", "8M"]);
    let theirs = cs(&cs_shift_args(&d, &["--encrypt", "--reduce-device-size", "8M"]));
    let msg = "Device is not in LUKS2 encryption. Conflicting option --encrypt.";
    assert_eq!(ours.status.code(), theirs.status.code(), "exit code");
    assert!(String::from_utf8_lossy(&ours.stderr).contains(msg), "{ours:?}");
    assert!(String::from_utf8_lossy(&theirs.stderr).contains(msg), "{theirs:?}");
    assert!(std::fs::read(&d.data).unwrap() == before, "wrote");
}

// Decryption with data shift (`--decrypt --header NEW` of a volume whose header is on the
// device: cryptsetup 2.6 moves the header to NEW and the data down to 0).

/// A LUKS2 image of `size` bytes with its header on it (cryptsetup's data-shift encryption
/// with `--reduce-device-size reduce`: header and shift `reduce / 2`), whose data holds the
/// first `size - reduce` bytes of the plaintext; `hdr` is where the new header file goes.
fn luks_on_device(size: u64, reduce: &str) -> Disk {
    let mut d = shift_disk(size);
    ok(&cs(&cs_shift_args(&d, &["--encrypt", "--reduce-device-size", reduce])), "cryptsetup --encrypt");
    d.hdr = d._dir.path().join("new.hdr");
    d
}

/// A copy of `d`'s images in a new directory.
fn clone_disk(d: &Disk) -> Disk {
    let c = Disk::new(0);
    std::fs::copy(&d.data, &c.data).unwrap();
    if d.hdr.exists() {
        std::fs::copy(&d.hdr, &c.hdr).unwrap();
    }
    c
}

/// The data shift decryption finished: NEW is a LUKS2 header with one `linear @0` segment
/// and no keyslot, the device starts with the plaintext (its first `size - reduce` bytes).
fn assert_shift_decrypted(d: &Disk, reduce: u64) {
    let dump = d.dump();
    assert!(!dump.contains("online-reencrypt"), "still in reencryption:\n{dump}");
    let seg = dump.split("Data segments:").nth(1).unwrap().split("Keyslots:").next().unwrap();
    assert!(seg.contains("linear") && seg.contains("offset: 0 [bytes]"), "{dump}");
    assert!(
        dump.split("Keyslots:").nth(1).unwrap().split("Tokens:").next().unwrap().trim().is_empty(),
        "{dump}"
    );
    let n = d.len() - reduce as usize;
    assert_shift_decrypted_to(d, &plaintext(d.len(), 0)[..n]);
}

/// [`assert_shift_decrypted`] with the data `want` (the plaintext and what clients wrote).
fn assert_shift_decrypted_to(d: &Disk, want: &[u8]) {
    assert!(!d.dump().contains("online-reencrypt"), "still in reencryption");
    let data = std::fs::read(&d.data).unwrap();
    assert!(data[..want.len()] == *want, "decryption with data shift lost data");
}

/// Serves `d` mid data-shift decryption, checks that it starts with `want` and that client
/// writes land (in the moved ciphertext, across its end, and further up); returns the data
/// with the writes.
fn serve_mid_shift_decryption(d: &Disk, want: &[u8], reduce: u64) -> Vec<u8> {
    let dir = d._dir.path();
    let before = std::fs::read(&d.data).unwrap();
    let hdr_before = std::fs::read(&d.hdr).unwrap();
    let args = ["--header", d.hdr(), "--key-file", d.pass(), d.data(), "vol"];
    let probe = Command::new("timeout")
        .arg("60")
        .arg(bin())
        .args(["open", "--test-passphrase"])
        .args(&args[..5])
        .output()
        .unwrap();
    ok(&probe, "open --test-passphrase mid data shift decryption");
    let srv = common::serve(dir, "vol", &args, None);
    // The open writes only to recover a last hotzone a crash left in reencryption (it then
    // moves the header on).
    let recovered = std::fs::read(&d.hdr).unwrap() != hdr_before;
    let mut st = Command::new(bin());
    st.args(["status", "vol"]).env("SEALDISK_RUNTIME_DIR", common::runtime_dir(dir));
    let text = ok(&st.output().unwrap(), "sealdisk status");
    assert!(text.contains("is active") && text.contains("LUKS2"), "{text}");
    let uri = srv.uri();
    let read_all = || nbd_read_all(&uri, dir);
    // The data is the device less the shift (the old header, `reduce / 2`); its first
    // `want.len()` bytes are known, the rest is whatever the tail held before encryption.
    let got = read_all();
    let shift = reduce as usize / 2;
    assert_eq!(got.len(), before.len() - shift, "the served size");
    assert!(
        got[..want.len()] == *want,
        "the served volume mid data shift decryption reads wrong: first difference at {:?}",
        got.iter().zip(want).position(|(a, b)| a != b)
    );
    assert!(
        recovered || std::fs::read(&d.data).unwrap() == before,
        "serving it wrote before any client write"
    );
    let mut model = got;
    let n = model.len();
    // Into the moved ciphertext, across its end, across the first hotzone's end, further up.
    let offs = [4096, shift - 8192, shift + 4096 * 7, 2 * shift - 4096, n / 2 + 4096, n - 65536];
    write_patterns(&uri, &offs, &mut model);
    assert!(read_all() == model, "writes through the volume mid data shift decryption");
    srv.stop_ok();
    model
}

#[test]
fn data_shift_decryption_in_one_tool_runs_in_the_other() {
    if !cryptsetup() {
        return;
    }
    let (size, reduce) = (64 * MIB, 32 * MIB);
    let src = luks_on_device(size, "32M");
    // Whole runs in both tools from the same image: the same bytes up to the wiped tail.
    let (a, b) = (clone_disk(&src), clone_disk(&src));
    ok(&sd(&a, &["--decrypt"]), "sealdisk --decrypt --header NEW");
    ok(&csr(&b, &["--decrypt"]), "cryptsetup --decrypt --header NEW");
    assert_shift_decrypted(&a, reduce);
    assert_shift_decrypted(&b, reduce);
    let keep = (size - reduce / 2) as usize;
    assert!(
        std::fs::read(&a.data).unwrap()[..keep] == std::fs::read(&b.data).unwrap()[..keep],
        "the two tools' decryptions differ"
    );
    // sealdisk's start state: luksDump the same in both tools, cryptsetup runs it.
    let d = clone_disk(&src);
    ok(&sd(&d, &["--decrypt", "--init-only"]), "sealdisk --decrypt --init-only");
    assert_eq!(d.in_progress(), Some(false));
    let ours = ok(&sealdisk(&["luksDump", d.hdr()]), "sealdisk luksDump");
    assert_eq!(ours, d.dump(), "luksDump of a data shift decryption start state");
    for (k, v) in [
        ("Resilience:", "datashift-checksum"),
        ("Area length:", "16486400"),
        ("Direction:", "forward"),
        ("Requirements:", "online-reencrypt-v3"),
    ] {
        assert!(d.dump().lines().any(|l| l.contains(k) && l.contains(v)), "{k} {v}:\n{}", d.dump());
    }
    let theirs = clone_disk(&src);
    ok(&csr(&theirs, &["--decrypt", "--init-only"]), "cryptsetup --decrypt --init-only");
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !["Epoch", "Salt", "Digest", "Iterations", "Time cost"].iter().any(|k| l.contains(k)))
            .filter(|l| !l.trim_start().starts_with(|c: char| c.is_ascii_hexdigit()) || l.contains(':'))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(strip(&ours), strip(&theirs.dump()), "start states differ");
    assert!(
        std::fs::read(&d.data).unwrap() == std::fs::read(&theirs.data).unwrap(),
        "init moved data differently"
    );
    // Mid-run the passphrase tests as in cryptsetup, and the volume is served as cryptsetup
    // maps it: the plaintext reads back, client writes land, and cryptsetup finishes the
    // run with them.
    let tp = ["open", "--test-passphrase", "--header", d.hdr(), "--key-file", d.pass(), d.data()];
    ok(&sealdisk(&tp), "sealdisk open --test-passphrase");
    ok(&cs(&tp), "cryptsetup open --test-passphrase");
    let n = (size - reduce) as usize;
    let mut want = plaintext(d.len(), 0)[..n].to_vec();
    if have("qemu-io") && have("nbdcopy") {
        want = serve_mid_shift_decryption(&d, &want, reduce);
    }
    ok(&csr(&d, &["--resume-only"]), "cryptsetup --resume-only");
    assert_shift_decrypted_to(&d, &want);
    // cryptsetup's start state, sealdisk runs it.
    ok(&sd(&theirs, &["--resume-only"]), "sealdisk --resume-only");
    assert_shift_decrypted(&theirs, reduce);
}

#[test]
fn data_shift_decryption_killed_mid_run_resumes_in_the_other_tool() {
    if !cryptsetup() {
        return;
    }
    // 104 MiB of data: the forward part (88 MiB) ends with a shorter hotzone (8 MiB), as
    // cryptsetup 2.6.1 makes it.
    let (size, reduce) = (120 * MIB, 32 * MIB);
    let src = luks_on_device(size, "32M");
    let prepare = || clone_disk(&src);
    // cryptsetup killed, sealdisk resumes.
    let (d, cs_hot) = killed_mid_run(prepare, |d| {
        let mut c = Command::new("cryptsetup");
        // Killed while it copies the header, it leaves its temporary file in its directory.
        c.args(cs_args(d, &["--decrypt"])).current_dir(d._dir.path());
        c
    })
    .expect("cryptsetup --decrypt --header NEW was never caught mid-run");
    // The state cryptsetup left, served by sealdisk (a copy), then finished by cryptsetup
    // with the clients' writes.
    if have("qemu-io") && have("nbdcopy") {
        let copy = clone_disk(&d);
        let n = (size - reduce) as usize;
        let model = serve_mid_shift_decryption(&copy, &plaintext(size as usize, 0)[..n], reduce);
        // Serving recovers only a last hotzone (the moved ciphertext decrypted in place); a
        // forward hotzone left in reencryption is served from its intact source and stays
        // flagged, so cryptsetup still asks for its repair, as it does before any open.
        if cs_hot && copy.in_progress() == Some(true) {
            eprintln!("a forward hotzone is still flagged after serving: cryptsetup repair");
            ok(
                &cs(&[
                    "repair",
                    "--batch-mode",
                    "--header",
                    copy.hdr(),
                    "--key-file",
                    copy.pass(),
                    copy.data(),
                ]),
                "cryptsetup repair after sealdisk's writes",
            );
        }
        ok(&csr(&copy, &["--resume-only"]), "cryptsetup resume after sealdisk's writes");
        assert_shift_decrypted_to(&copy, &model);
    }
    ok(&sd(&d, &["--resume-only"]), "sealdisk resume");
    assert_shift_decrypted(&d, reduce);
    // sealdisk killed, cryptsetup resumes.
    let (d, hot) = killed_mid_run(prepare, |d| {
        let mut c = Command::new(bin());
        c.args(["reencrypt", "--decrypt", "--header", d.hdr(), "--key-file", d.pass()])
            .args(FAST_PBKDF2)
            .arg(d.data());
        c
    })
    .expect("sealdisk --decrypt --header NEW was never caught mid-run");
    if hot {
        ok(
            &cs(&["repair", "--batch-mode", "--header", d.hdr(), "--key-file", d.pass(), d.data()]),
            "cryptsetup repair",
        );
    }
    ok(&csr(&d, &["--resume-only"]), "cryptsetup resume");
    assert_shift_decrypted(&d, reduce);
}

#[test]
fn data_shift_decryption_bad_input_gets_cryptsetup_errors() {
    if !cryptsetup() {
        return;
    }
    let src = luks_on_device(64 * MIB, "32M");
    let both = |extra: &[&str], header: bool, pass: Option<&str>, msg: &str| {
        let (a, b) = (clone_disk(&src), clone_disk(&src));
        for d in [&a, &b] {
            if let Some(p) = pass {
                std::fs::write(&d.pass, p).unwrap();
            }
        }
        let before = std::fs::read(&a.data).unwrap();
        let run = |d: &Disk, ours: bool| {
            let mut args: Vec<&str> = vec!["reencrypt", "--decrypt"];
            if !ours {
                args.extend(["--batch-mode", "--force-offline-reencrypt"]);
            }
            if header {
                args.extend(["--header", d.hdr()]);
            }
            args.extend(["--key-file", d.pass()]);
            args.extend(FAST_PBKDF2);
            args.extend(extra);
            args.push(d.data());
            if ours {
                sealdisk(&args)
            } else {
                cs(&args)
            }
        };
        let (ours, theirs) = (run(&a, true), run(&b, false));
        let (o, t) = (String::from_utf8_lossy(&ours.stderr), String::from_utf8_lossy(&theirs.stderr));
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "{msg}: exit code; sealdisk said {o}, cryptsetup {t}"
        );
        assert!(o.contains(msg), "sealdisk said {o}");
        assert!(t.contains(msg), "cryptsetup said {t}");
        assert!(std::fs::read(&a.data).unwrap() == before, "{msg}: wrote data");
        assert!(!a.hdr.exists() && !b.hdr.exists(), "{msg}: left a header file");
    };
    both(&[], false, None, "LUKS2 decryption requires --header option.");
    both(&[], true, Some("wrong"), "No key available with this passphrase.");
    both(&["--resilience", "none"], true, None, "Requested --resilience option cannot be applied");
    both(&["--resilience", "journal"], true, None, "Moved segment too large. Requested size 16777216");
    both(&["--resume-only"], true, None, "Device reencryption not in progress.");
}

// Encryption with data shift and a detached header (cryptsetup 2.6.1 `reencrypt --encrypt
// --header FILE --reduce-device-size R`): the data is encrypted in place at offset 0 in
// R-long hotzones; the header file is R long (keyslots area R less 32 KiB).

/// The segment, metadata and keyslot lines of a luksDump (what both tools must agree on).
fn layout_lines(d: &Disk) -> Vec<String> {
    d.dump()
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            [
                "Metadata area",
                "Keyslots area",
                "offset:",
                "length:",
                "Area offset",
                "Area length",
                "cipher:",
                "sector:",
            ]
            .iter()
            .any(|k| t.starts_with(k))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn detached_data_shift_encryption_in_one_tool_runs_in_the_other() {
    if !cryptsetup() {
        return;
    }
    let args = ["--encrypt", "--reduce-device-size", "8M"];
    // Whole runs: data a multiple of the shift, not one, and between one and two shifts
    // (cryptsetup 2.6.1 itself stops with "Failed to update reencryption context." there).
    for size in [32 * MIB, 30 * MIB, 12 * MIB] {
        let d = Disk::new(size);
        ok(&sd(&d, &args), "sealdisk --encrypt --header --reduce-device-size");
        assert_eq!(std::fs::metadata(&d.hdr).unwrap().len(), 8 * MIB, "header file length");
        d.assert_encrypted();
        if size != 12 * MIB {
            let theirs = Disk::new(size);
            ok(&csr(&theirs, &args), "cryptsetup --encrypt --header --reduce-device-size");
            assert_eq!(layout_lines(&d), layout_lines(&theirs), "the finished headers differ");
        }
    }
    // An existing header file longer than R is kept as long (cryptsetup keeps it too).
    let d = Disk::new(30 * MIB);
    std::fs::write(&d.hdr, vec![0u8; 12 << 20]).unwrap();
    ok(&sd(&d, &args), "sealdisk --encrypt into an existing header file");
    assert_eq!(std::fs::metadata(&d.hdr).unwrap().len(), 12 * MIB, "header file length");
    d.assert_encrypted();
    // --init-only in one tool, the run in the other; the start states the same.
    let d = Disk::new(30 * MIB);
    ok(&sd(&d, &[&args[..], &["--init-only"]].concat()), "sealdisk --init-only");
    let theirs = Disk::new(30 * MIB);
    ok(&csr(&theirs, &[&args[..], &["--init-only"]].concat()), "cryptsetup --init-only");
    assert_eq!(layout_lines(&d), layout_lines(&theirs), "the start states differ");
    assert!(std::fs::read(&d.data).unwrap() == plaintext(d.len(), 0), "--init-only wrote data");
    ok(&csr(&d, &["--resume-only"]), "cryptsetup resumes sealdisk's");
    d.assert_encrypted();
    ok(&sd(&theirs, &["--resume-only"]), "sealdisk resumes cryptsetup's");
    theirs.assert_encrypted();
}

#[test]
fn detached_data_shift_encryption_killed_mid_run() {
    if !cryptsetup() {
        return;
    }
    let size = 128 * MIB;
    // cryptsetup killed: between hotzones sealdisk finishes the run; with a hotzone in
    // flight (cryptsetup's datashift keeps no copy of it, and its own repair would copy
    // the data below over it) sealdisk refuses without writing.
    let (d, hot) = killed_mid_run(
        || Disk::new(size),
        |d| {
            let mut c = cs_command();
            c.args(cs_args(d, &["--encrypt", "--reduce-device-size", "8M"]));
            c
        },
    )
    .expect("cryptsetup was never caught mid-run");
    if hot {
        let (h, data) = (std::fs::read(&d.hdr).unwrap(), std::fs::read(&d.data).unwrap());
        let out = sd(&d, &["--resume-only"]);
        assert!(!out.status.success(), "resumed a hotzone with no copy");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Cannot recover the interrupted hotzone"), "{err}");
        assert!(std::fs::read(&d.hdr).unwrap() == h && std::fs::read(&d.data).unwrap() == data, "wrote");
    } else {
        ok(&sd(&d, &["--resume-only"]), "sealdisk resumes cryptsetup's killed run");
        d.assert_encrypted();
    }
    // sealdisk killed: it resumes without loss, a hotzone in flight included (its own
    // checksums of the hotzone). cryptsetup 2.6.1 cannot resume such a run at all (its
    // own either: "Device ... is too small." once a hotzone is done): it refuses unwritten.
    for _ in 0..2 {
        let (d, hot) = killed_mid_run(
            || Disk::new(size),
            |d| {
                let mut c = Command::new(bin());
                c.args(["reencrypt", "--encrypt", "--reduce-device-size", "8M", "--header", d.hdr()])
                    .args(["--key-file", d.pass()])
                    .args(FAST_PBKDF2)
                    .arg(d.data());
                c
            },
        )
        .expect("sealdisk was never caught mid-run");
        eprintln!("sealdisk killed mid-run, hotzone in flight: {hot}");
        let (h, data) = (std::fs::read(&d.hdr).unwrap(), std::fs::read(&d.data).unwrap());
        let out = csr(&d, &["--resume-only"]);
        if !out.status.success() {
            assert!(std::fs::read(&d.hdr).unwrap() == h && std::fs::read(&d.data).unwrap() == data);
            ok(&sd(&d, &["--resume-only"]), "sealdisk resumes its killed run");
        }
        d.assert_encrypted();
    }
}

#[test]
fn detached_data_shift_and_layout_options_get_cryptsetups_results() {
    if !cryptsetup() {
        return;
    }
    // Refusals: the same words and exit code, no data written, no header file left by
    // sealdisk (cryptsetup leaves its half-made one for some).
    let refused = |extra: &[&str], msg: &str| {
        let (ours, theirs) = (Disk::new(30 * MIB), Disk::new(30 * MIB));
        let a = [&["--encrypt", "--init-only"][..], extra].concat();
        let (o, t) = (sd(&ours, &a), csr(&theirs, &a));
        assert_eq!(o.status.code(), t.status.code(), "{extra:?}: exit code");
        let (oe, te) = (String::from_utf8_lossy(&o.stderr), String::from_utf8_lossy(&t.stderr));
        assert!(oe.contains(msg), "{extra:?}: sealdisk said {oe}");
        assert!(te.contains(msg), "{extra:?}: cryptsetup said {te}");
        assert!(std::fs::read(&ours.data).unwrap() == plaintext(ours.len(), 0), "{extra:?}: wrote data");
        assert!(!ours.hdr.exists(), "{extra:?}: sealdisk left a header file");
    };
    refused(&["--reduce-device-size", "2G"], "Maximum device reduce size is 1 GiB.");
    refused(&["--reduce-device-size", "31M"], "Failed to initialize LUKS2 reencryption in metadata.");
    refused(&["--reduce-device-size", "4196864"], "Unsupported LUKS2 metadata size options.");
    refused(
        &["--reduce-device-size", "8M", "--luks2-keyslots-size", "8M"],
        "LUKS2 metadata size is larger than data shift value.",
    );
    refused(
        &["--reduce-device-size", "8M", "--luks2-metadata-size", "3k"],
        "Unsupported LUKS2 metadata size options.",
    );
    refused(&["--reduce-device-size", "64k"], "No space for new keyslot.");
    // A header file that is already LUKS.
    let d = Disk::new(30 * MIB);
    ok(&csr(&d, &["--encrypt", "--init-only"]), "cryptsetup --encrypt");
    ok(&csr(&d, &["--encrypt", "--resume-only"]), "cryptsetup --encrypt (run)");
    let other = Disk::new(8 * MIB);
    let hdr_before = std::fs::read(&d.hdr).unwrap();
    let tail = ["--encrypt", "--reduce-device-size", "8M", "--header", d.hdr(), "--key-file", other.pass()];
    let o = sealdisk(&[&["reencrypt"][..], &tail, &[other.data()]].concat());
    let t =
        cs(&[&["reencrypt", "--batch-mode", "--force-offline-reencrypt"][..], &tail, &[other.data()]]
            .concat());
    assert_eq!(o.status.code(), t.status.code());
    let want = format!("Device {} is already LUKS device. Aborting operation.", d.hdr());
    assert!(String::from_utf8_lossy(&o.stderr).contains(&want), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&t.stderr).contains(&want));
    assert!(std::fs::read(&d.hdr).unwrap() == hdr_before, "the LUKS header file was changed");
    assert!(std::fs::read(&other.data).unwrap() == plaintext(other.len(), 0));
    // The layout options, on the detached encryption with and without a data shift, and on
    // the header-on-device data shift: the same headers as cryptsetup's (luksDump lines
    // of the areas, segments and keyslots; the header file's length).
    let same = |extra: &[&str]| {
        let (ours, theirs) = (Disk::new(30 * MIB), Disk::new(30 * MIB));
        // An existing, shorter header file is grown; a longer one kept.
        std::fs::write(&ours.hdr, vec![0u8; 4096]).unwrap();
        std::fs::write(&theirs.hdr, vec![0u8; 4096]).unwrap();
        let a = [&["--encrypt", "--init-only"][..], extra].concat();
        let (o, t) = (sd(&ours, &a), csr(&theirs, &a));
        ok(&o, &format!("sealdisk {extra:?}"));
        ok(&t, &format!("cryptsetup {extra:?}"));
        // cryptsetup prints its warnings on stdout (log_std).
        let warn = |s: &[u8]| {
            String::from_utf8_lossy(s)
                .lines()
                .filter(|l| l.starts_with("WARNING"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(warn(&o.stdout), warn(&t.stdout), "{extra:?}: warnings");
        assert_eq!(layout_lines(&ours), layout_lines(&theirs), "{extra:?}");
        let len = |d: &Disk| std::fs::metadata(&d.hdr).unwrap().len();
        assert_eq!(len(&ours), len(&theirs), "{extra:?}: header file length");
        ok(&csr(&ours, &["--resume-only"]), "cryptsetup runs sealdisk's");
        ours.assert_encrypted();
    };
    same(&["--offset", "2048"]);
    same(&["--luks2-metadata-size", "64k"]);
    same(&["--luks2-keyslots-size", "1M"]);
    same(&["--luks2-metadata-size", "64k", "--luks2-keyslots-size", "1M", "--offset", "4096"]);
    same(&["--reduce-device-size", "8M", "--offset", "2048"]);
    same(&["--reduce-device-size", "8M", "--luks2-metadata-size", "64k"]);
    same(&["--reduce-device-size", "8M", "--luks2-keyslots-size", "1M"]);
}

/// `--hotzone-size` at the start of a data-shift decryption (`--decrypt --header NEW` of a
/// header on the device) sizes the moved first segment, as in cryptsetup 2.6.1: the same
/// start state, the same bytes at the end; larger than the shift refused.
#[test]
fn data_shift_decryption_hotzone_size_as_cryptsetup() {
    if !cryptsetup() {
        return;
    }
    let luks = |d: &Disk| {
        let mut args = vec!["luksFormat", "--type", "luks2", "--batch-mode", "--key-file", d.pass()];
        args.extend(FAST_PBKDF2);
        args.push(d.data());
        ok(&cs(&args), "luksFormat");
    };
    let (ours, theirs) = (Disk::new(40 * MIB), Disk::new(40 * MIB));
    luks(&ours);
    std::fs::copy(&ours.data, &theirs.data).unwrap();
    // (--reduce-device-size and the layout options are ignored by cryptsetup here.)
    let a = [
        "--decrypt",
        "--hotzone-size",
        "1M",
        "--init-only",
        "--reduce-device-size",
        "8M",
        "--offset",
        "8192",
    ];
    ok(&sd(&ours, &a), "sealdisk --decrypt --hotzone-size");
    ok(&csr(&theirs, &a), "cryptsetup --decrypt --hotzone-size");
    assert_eq!(layout_lines(&ours), layout_lines(&theirs), "the start states differ");
    assert!(std::fs::read(&ours.data).unwrap() == std::fs::read(&theirs.data).unwrap(), "the moves differ");
    ok(&csr(&ours, &["--resume-only"]), "cryptsetup runs sealdisk's");
    ok(&sd(&theirs, &["--resume-only"]), "sealdisk runs cryptsetup's");
    assert!(
        std::fs::read(&ours.data).unwrap()[..24 << 20] == std::fs::read(&theirs.data).unwrap()[..24 << 20],
        "the decryptions differ"
    );
    // Larger than the shift (the 16 MiB header): refused, nothing written, no header file.
    let (ours, theirs) = (Disk::new(40 * MIB), Disk::new(40 * MIB));
    luks(&ours);
    std::fs::copy(&ours.data, &theirs.data).unwrap();
    let before = std::fs::read(&ours.data).unwrap();
    let a = ["--decrypt", "--hotzone-size", "17M"];
    let (o, t) = (sd(&ours, &a), csr(&theirs, &a));
    assert_eq!(o.status.code(), t.status.code());
    let msg = "Moved segment size can not be greater than data shift value.";
    assert!(String::from_utf8_lossy(&o.stderr).contains(msg), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&t.stderr).contains(msg));
    assert!(std::fs::read(&ours.data).unwrap() == before && !ours.hdr.exists());
}

/// `open --test-passphrase --key-slot N` mid-reencryption: the exit codes of cryptsetup
/// 2.6.1 (a keyslot of one of the two keys: 1; a wrong passphrase: 2; the reencrypt or an
/// empty keyslot: 1; no --key-slot: 0).
#[test]
fn test_passphrase_with_key_slot_mid_reencryption_as_cryptsetup() {
    if !cryptsetup() {
        return;
    }
    let d = Disk::new(20 * MIB);
    let other = d._dir.path().join("other");
    std::fs::write(&other, "battery staple").unwrap();
    let other = other.to_str().unwrap();
    let mut args = vec!["luksFormat", "--type", "luks2", "--batch-mode", "--key-file", d.pass()];
    args.extend(FAST_PBKDF2);
    args.push(d.data());
    ok(&cs(&args), "luksFormat");
    let mut args = vec!["luksAddKey", "--batch-mode", "--key-file", d.pass()];
    args.extend(FAST_PBKDF2);
    args.extend([d.data(), other]);
    ok(&cs(&args), "luksAddKey");
    let mut args =
        vec!["reencrypt", "--init-only", "--batch-mode", "--key-slot", "0", "--key-file", d.pass()];
    args.extend(FAST_PBKDF2);
    args.push(d.data());
    ok(&cs(&args), "reencrypt --init-only");
    let both = |slot: Option<&str>, key: &str| {
        let mut a = vec!["open", "--test-passphrase", "--key-file", key];
        if let Some(s) = slot {
            a.extend(["--key-slot", s]);
        }
        a.push(d.data());
        let (o, t) = (sealdisk(&a), cs(&a));
        assert_eq!(
            o.status.code(),
            t.status.code(),
            "{slot:?} {key}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    both(None, d.pass());
    both(None, other);
    for s in ["0", "1", "2", "3", "4"] {
        both(Some(s), d.pass());
        both(Some(s), other);
    }
}

/// `--offset`, `--luks2-metadata-size` and `--luks2-keyslots-size` on the encryption with
/// data shift and the header on the device: cryptsetup 2.6.1's headers, messages (stdout)
/// and refusals; cryptsetup runs sealdisk's start state to the end.
#[test]
fn data_shift_layout_options_as_cryptsetup() {
    if !cryptsetup() {
        return;
    }
    let lines = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("WARNING") || l.starts_with("Adjusting"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    for (extra, reduce) in [
        (&["--offset", "4096"][..], 4 * MIB),
        (&["--offset", "8192"][..], 8 * MIB),
        (&["--luks2-metadata-size", "64k"][..], 8 * MIB),
        (&["--luks2-keyslots-size", "1M"][..], 8 * MIB),
        (&["--luks2-keyslots-size", "4M"][..], 8 * MIB),
        (&["--luks2-metadata-size", "64k", "--luks2-keyslots-size", "4M"][..], 8 * MIB),
    ] {
        let (ours, theirs) = (shift_disk(30 * MIB), shift_disk(30 * MIB));
        let a = [&["--encrypt", "--init-only", "--reduce-device-size", "8M"][..], extra].concat();
        let (o, t) = (sd_shift(&ours, &a), cs(&cs_shift_args(&theirs, &a)));
        ok(&o, &format!("sealdisk {extra:?}"));
        ok(&t, &format!("cryptsetup {extra:?}"));
        assert_eq!(lines(&o), lines(&t), "{extra:?}: messages");
        assert_eq!(layout_lines(&ours), layout_lines(&theirs), "{extra:?}");
        ok(&cs(&cs_shift_args(&ours, &["--resume-only"])), "cryptsetup runs sealdisk's");
        assert_shift_encrypted(&ours, reduce);
    }
    for (extra, msg) in [
        (
            &["--offset", "16384"][..],
            "Requested data offset must be less than or equal to half of --reduce-device-size parameter.",
        ),
        (&["--luks2-metadata-size", "3k"][..], "Unsupported LUKS2 metadata size options."),
    ] {
        let (ours, theirs) = (shift_disk(30 * MIB), shift_disk(30 * MIB));
        let a = [&["--encrypt", "--reduce-device-size", "8M"][..], extra].concat();
        let (o, t) = (sd_shift(&ours, &a), cs(&cs_shift_args(&theirs, &a)));
        assert_eq!(o.status.code(), t.status.code(), "{extra:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(msg), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&t.stderr).contains(msg));
        assert!(std::fs::read(&ours.data).unwrap() == plaintext(ours.len(), 0), "{extra:?}: wrote");
    }
}

/// cryptsetup's own detached data-shift encryption killed (SIGKILL, strace fault
/// injection) at each of its fsync/fdatasync calls, then handed to sealdisk: before its
/// start state the data is untouched; between hotzones sealdisk finishes the run; with a
/// hotzone in flight (no copy of it anywhere) sealdisk refuses and writes nothing.
#[test]
fn cryptsetup_detached_data_shift_killed_at_every_sync_then_sealdisk() {
    if !cryptsetup() || !have("strace") {
        eprintln!("SKIPPED: needs cryptsetup and strace");
        return;
    }
    let args = ["--encrypt", "--reduce-device-size", "8M"];
    let (mut resumed, mut refused) = (0, 0);
    for call in ["fsync", "fdatasync"] {
        for n in 1.. {
            let d = Disk::new(30 * MIB);
            let mut c = Command::new("strace");
            c.args(["-f", "-o", "/dev/null", "-e", &format!("trace={call}")])
                .arg("-e")
                .arg(format!("inject={call}:signal=KILL:when={n}"))
                .arg("cryptsetup")
                .args(cs_args(&d, &args))
                .current_dir(std::env::temp_dir())
                .stdin(Stdio::null());
            let out = c.output().unwrap();
            if out.status.success() {
                d.assert_encrypted();
                break;
            }
            let luks = d.hdr.exists() && cs(&["isLuks", d.hdr()]).status.success();
            match luks.then(|| d.in_progress()).flatten() {
                // Killed before its start state (a fresh header, perhaps claiming ciphertext:
                // cryptsetup's start is not atomic) the data is untouched; after its end
                // it is encrypted.
                None => {
                    if std::fs::read(&d.data).unwrap() != plaintext(d.len(), 0) {
                        d.assert_encrypted();
                    }
                }
                Some(true) => {
                    let (h, data) = (std::fs::read(&d.hdr).unwrap(), std::fs::read(&d.data).unwrap());
                    let o = sd(&d, &["--resume-only"]);
                    assert!(!o.status.success(), "{call} {n}: resumed a hotzone cryptsetup left in flight");
                    assert!(std::fs::read(&d.hdr).unwrap() == h && std::fs::read(&d.data).unwrap() == data);
                    refused += 1;
                }
                Some(false) => {
                    ok(&sd(&d, &["--resume-only"]), &format!("sealdisk resumes after {call} {n}"));
                    d.assert_encrypted();
                    resumed += 1;
                }
            }
        }
    }
    eprintln!("cryptsetup killed at every sync: {resumed} resumed, {refused} refused (hotzone in flight)");
    assert!(resumed >= 3 && refused >= 3, "{resumed} resumed, {refused} refused");
}

// The data-shift runs online: initialized offline (`--init-only`), served, and run by the
// server (`--resume-only --active-name`) while clients write.

/// `sealdisk ARGS` with the runtime directory of the servers `serve` starts for `d`.
fn sd_in(d: &Disk, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args).env("SEALDISK_RUNTIME_DIR", common::runtime_dir(d._dir.path())).stdin(Stdio::null());
    c
}

/// `sealdisk status vol`'s reencryption line (empty when it shows none).
fn reenc_line(d: &Disk) -> String {
    let out = sd_in(d, &["status", "vol"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find(|l| l.contains("reencryption:")).unwrap_or("").to_owned()
}

/// Serves `d` (`serve_args`), runs its data shift online (`reencrypt --active-name vol`
/// with `run_args`, e.g. `--resume-only`) while a client writes 64 KiB patterns through NBD (across the moved
/// segment's end `moved`, and all over the device) and reads the whole device back now and
/// then. With `stop`, the volume is closed once the run shows progress (the server stops it
/// after its hotzone) and the run must be left in progress; otherwise it must finish. The
/// device must read `model` before; `model` takes the writes, and the device reads it after.
fn online_shift_run(
    d: &Disk,
    serve_args: &[&str],
    run_args: &[&str],
    model: &mut Vec<u8>,
    moved: usize,
    stop: bool,
) {
    let dir = d._dir.path();
    let mut srv = common::serve(dir, "vol", serve_args, None);
    let uri = srv.uri();
    let read_all = || nbd_read_all(&uri, dir);
    assert!(read_all() == *model, "the served volume before the online run");
    let mut args = vec!["reencrypt", "--active-name", "vol", "--key-file", d.pass()];
    args.extend(run_args);
    args.push(d.data());
    let child = sd_in(d, &args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let n = model.len();
    let (mut rounds, mut during) = (0usize, 0usize);
    loop {
        let line = reenc_line(d);
        let running = line.contains("running");
        if stop && running && !line.contains("(0 of") {
            break;
        }
        if !running && !line.is_empty() && rounds >= 3 {
            break;
        }
        let r = rounds;
        let offs = [
            (moved - 4096 * (1 + r % 4)).min(n - 65536),
            (r * 7_340_033 % (n - 65536)) / 4096 * 4096,
            (n / 2 + r * 65536 * 3) % (n - 65536) / 4096 * 4096,
            n - 65536 - 4096 * (r % 3),
        ];
        write_patterns(&uri, &offs, model);
        rounds += 1;
        during += usize::from(running);
        if r % 3 == 2 {
            assert!(read_all() == *model, "the served volume mid-run differs from the model (round {r})");
        }
        assert!(rounds < 2000, "the online run never ended: {line}");
    }
    if stop {
        ok(&sd_in(d, &["close", "vol"]).output().unwrap(), "sealdisk close mid-run");
        let out = srv.child.take().unwrap().wait_with_output().unwrap();
        assert!(out.status.success(), "server: {}", String::from_utf8_lossy(&out.stderr));
        let _ = child.wait_with_output();
        assert_eq!(d.in_progress(), Some(false), "the run stopped by close is resumable");
        return;
    }
    let out = child.wait_with_output().unwrap();
    ok(&out, "sealdisk reencrypt --resume-only --active-name (data shift)");
    assert!(during >= 1, "no client write ran during the online run ({rounds} rounds)");
    eprintln!("{rounds} rounds of client writes, {during} while the run went on");
    assert!(reenc_line(d).contains("finished"), "{}", reenc_line(d));
    assert!(read_all() == *model, "the served volume after the online run");
    srv.stop_ok();
}

#[test]
fn data_shift_runs_online_stopped_and_resumed_while_clients_write() {
    if !cryptsetup() || !have("qemu-io") || !have("nbdcopy") {
        return;
    }
    let size = 96 * MIB;
    // 1. Encryption with data shift, header on the device (1 MiB hotzones: many of them).
    let (reduce, shift) = (2 * MIB, MIB as usize);
    let d = shift_disk(size);
    ok(&sd_shift(&d, &["--encrypt", "--reduce-device-size", "2M", "--init-only"]), "--init-only");
    let mut model = plaintext(size as usize, 0)[..(size - reduce) as usize].to_vec();
    let serve = ["--key-file", d.pass(), d.data(), "vol"];
    online_shift_run(&d, &serve, &["--resume-only"], &mut model, shift, true);
    online_shift_run(&d, &serve, &["--resume-only"], &mut model, shift, false);
    assert_shift_holds(&d, reduce, &model);
    ok(&cs(&["open", "--test-passphrase", "--key-file", d.pass(), d.data()]), "cryptsetup --test-passphrase");

    // 2. Encryption with data shift and a detached header (1 MiB hotzones, in place).
    let d = Disk::new(size);
    ok(&sd(&d, &["--encrypt", "--reduce-device-size", "1M", "--init-only"]), "--init-only");
    let mut model = plaintext(size as usize, 0);
    let serve = ["--header", d.hdr(), "--key-file", d.pass(), d.data(), "vol"];
    online_shift_run(&d, &serve, &["--resume-only", "--header", d.hdr()], &mut model, MIB as usize, true);
    online_shift_run(&d, &serve, &["--resume-only", "--header", d.hdr()], &mut model, MIB as usize, false);
    assert!(!d.dump().contains("online-reencrypt"), "still in reencryption");
    ok(&cs(&["open", "--test-passphrase", "--key-file", d.pass(), d.hdr()]), "cryptsetup --test-passphrase");
    let key = common::cryptsetup::volume_key(d.hdr(), d.pass());
    let (off, spec, ss) = common::cryptsetup::layout(d.hdr());
    assert_eq!(off, 0, "data offset");
    let mut data = std::fs::read(&d.data).unwrap();
    common::cryptsetup::cipher(&spec, &key, ss).decrypt(0, &mut data).unwrap();
    assert!(data == model, "the detached data shift encryption lost client writes");

    // 3. Decryption with data shift into a new header file (cryptsetup's data shift
    //    encryption first: header and shift 1 MiB; moved segment 1 MiB, 1 MiB hotzones).
    let d = luks_on_device(size, "2M");
    ok(&sd(&d, &["--decrypt", "--init-only"]), "sealdisk --decrypt --header NEW --init-only");
    let dir = d._dir.path();
    let serve = ["--header", d.hdr(), "--key-file", d.pass(), d.data(), "vol"];
    let mut model = {
        let srv = common::serve(dir, "vol", &serve, None);
        let got = nbd_read_all(&srv.uri(), dir);
        srv.stop_ok();
        got
    };
    let n = (size - reduce) as usize;
    assert!(model[..n] == plaintext(size as usize, 0)[..n], "the volume mid data shift decryption");
    online_shift_run(&d, &serve, &["--resume-only", "--header", d.hdr()], &mut model, MIB as usize, true);
    online_shift_run(&d, &serve, &["--resume-only", "--header", d.hdr()], &mut model, MIB as usize, false);
    assert_shift_decrypted_to(&d, &model);
    let dump = d.dump();
    let seg = dump.split("Data segments:").nth(1).unwrap().split("Keyslots:").next().unwrap();
    assert!(seg.contains("linear") && seg.contains("offset: 0 [bytes]"), "{dump}");
}

/// cryptsetup starts a data-shift decryption under an active device too: `reencrypt
/// --decrypt --header NEW --active-name NAME` of a served volume whose header is on the
/// device moves the header to NEW (made by the server) and runs the decryption in the
/// server while clients write; what they wrote is the plaintext left on the device.
#[test]
fn data_shift_decryption_starts_online_while_clients_write() {
    if !cryptsetup() || !have("qemu-io") || !have("nbdcopy") {
        return;
    }
    let size = 96 * MIB;
    let d = luks_on_device(size, "2M");
    let dir = d._dir.path();
    let serve = ["--key-file", d.pass(), d.data(), "vol"];
    let mut model = {
        let srv = common::serve(dir, "vol", &serve, None);
        let got = nbd_read_all(&srv.uri(), dir);
        srv.stop_ok();
        got
    };
    let n = (size - 2 * MIB) as usize;
    assert!(model[..n] == plaintext(size as usize, 0)[..n], "the volume before the decryption");
    // --init-only is refused on an active device; nothing is made or written.
    let before = std::fs::read(&d.data).unwrap();
    {
        let srv = common::serve(dir, "vol", &serve, None);
        let out = sd_in(&d, &["reencrypt", "--decrypt", "--init-only", "--active-name", "vol", "--key-file"])
            .arg(d.pass())
            .args(["--header", d.hdr(), d.data()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(!d.hdr.exists(), "a refused start made the header file");
        srv.stop_ok();
    }
    assert!(std::fs::read(&d.data).unwrap() == before, "a refused start wrote");
    online_shift_run(&d, &serve, &["--decrypt", "--header", d.hdr()], &mut model, MIB as usize, false);
    assert_shift_decrypted_to(&d, &model);
    let dump = d.dump();
    let seg = dump.split("Data segments:").nth(1).unwrap().split("Keyslots:").next().unwrap();
    assert!(seg.contains("linear") && seg.contains("offset: 0 [bytes]"), "{dump}");
    assert!(!cs(&["isLuks", d.data()]).status.success(), "the device still has a LUKS header");
}
