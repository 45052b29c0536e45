//! `sealdisk reencrypt --encrypt` / `--decrypt` with a detached header against the real
//! cryptsetup (2.6 on the host, image files, `--force-offline-reencrypt`), both ways:
//!
//! * a plaintext image encrypted by one tool is decrypted by the other, the data intact
//!   (checked outside both tools with the volume key cryptsetup prints);
//! * `--init-only` in one tool, the run in the other; `luksDump` of the state the same in
//!   both tools;
//! * a run killed with SIGKILL mid-way in one tool resumes in the other without loss;
//! * bad input gets cryptsetup's messages and exit codes.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::cryptsetup::{available as cryptsetup, cs, ok, plaintext};
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
        let mut data = std::fs::read(&self.data).unwrap();
        assert!(data != plaintext(data.len(), 0), "the data is not encrypted");
        c.decrypt(0, &mut data).unwrap();
        assert!(data == plaintext(data.len(), 0), "encryption lost data");
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
            let mut c = Command::new("cryptsetup");
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
    // shift decryption): not implemented, refused before anything is written or created.
    let before = std::fs::read(&d.data).unwrap();
    let out = sd(&d, &["--decrypt"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not implemented"), "{out:?}");
    assert!(!d.hdr.exists() && std::fs::read(&d.data).unwrap() == before, "a refused --decrypt wrote");
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
        let read_all = || {
            let back = dir.join("read.raw");
            common::run_tool(Command::new("nbdcopy").arg(&uri).arg(&back));
            std::fs::read(&back).unwrap()
        };
        let mut model = plaintext(d.len(), 0);
        assert!(read_all() == model, "{mode}: the served volume mid-run reads wrong");
        let cmds: Vec<String> = (0..12u64)
            .map(|i| format!("write -P {} {} 65536", i + 1, (i * 1_900_000) / 4096 * 4096))
            .collect();
        let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
        common::qemu_io(&uri, &refs);
        for i in 0..12u64 {
            let o = ((i * 1_900_000) / 4096 * 4096) as usize;
            model[o..o + 65536].fill((i + 1) as u8);
        }
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
        let mut c = Command::new("cryptsetup");
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
        let read_all = || {
            let back = dir.join("read.raw");
            common::run_tool(Command::new("nbdcopy").arg(&uri).arg(&back));
            std::fs::read(&back).unwrap()
        };
        let mut model = plaintext(size as usize, 0)[..n].to_vec();
        assert!(read_all() == model, "the served volume mid data shift reads wrong");
        let offs: Vec<usize> =
            (0..10).map(|i| i * (n / 10) + (i % 3) * 4096 * 400 - 4096 * (i > 0) as usize).collect();
        let cmds: Vec<String> =
            offs.iter().enumerate().map(|(i, o)| format!("write -P {} {o} 65536", i + 1)).collect();
        let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
        common::qemu_io(&uri, &refs);
        for (i, &o) in offs.iter().enumerate() {
            model[o..o + 65536].fill((i + 1) as u8);
        }
        assert!(read_all() == model, "writes through the volume mid data shift");
        // Running the data shift under the served device is refused; it keeps serving.
        let mut c = Command::new(bin());
        c.args(["reencrypt", "--resume-only", "--active-name", "vol", "--key-file", d.pass(), d.data()])
            .env("SEALDISK_RUNTIME_DIR", common::runtime_dir(dir))
            .stdin(Stdio::null());
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("runs offline only"), "online data shift: {err}");
        assert!(read_all() == model, "the served volume after the refused online run");
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
