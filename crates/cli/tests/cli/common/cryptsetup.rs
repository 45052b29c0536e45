//! The host's cryptsetup as a test oracle: run it, read its dumps (layout, volume key,
//! reencryption state), and decrypt what it made with the key it reports, so data is checked
//! outside both tools.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

use super::have;

/// Whether host cryptsetup is installed (says SKIPPED when not).
pub fn available() -> bool {
    if have("cryptsetup") {
        return true;
    }
    eprintln!("SKIPPED: cryptsetup is not installed (apt-get install cryptsetup-bin)");
    false
}

/// Asserts `out` (of `what`) succeeded; returns its stdout.
pub fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs host cryptsetup with `args` (stdin closed), in the temporary directory: a data shift
/// (`--reduce-device-size`) makes its temporary header `LUKS2-temp-UUID.new` in the current
/// directory, and a run killed mid-way leaves it there (the package directory under the suite).
pub fn cs(args: &[&str]) -> Output {
    cs_command().args(args).stdin(Stdio::null()).output().expect("run cryptsetup")
}

/// `cryptsetup` started in the temporary directory (see [`cs`]).
pub fn cs_command() -> Command {
    let mut c = Command::new("cryptsetup");
    c.current_dir(std::env::temp_dir());
    c
}

/// A volume image and its passphrase file in a temporary directory.
pub struct Vol {
    pub dir: tempfile::TempDir,
    pub img: PathBuf,
    pub pass: PathBuf,
}

impl Vol {
    /// An empty (all-zero) image of `size` bytes and a passphrase file holding `pass`.
    pub fn empty(size: u64, pass: &[u8]) -> Vol {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        let pass_file = dir.path().join("pass");
        std::fs::write(&pass_file, pass).unwrap();
        Vol { dir, img, pass: pass_file }
    }
    pub fn img(&self) -> &str {
        self.img.to_str().unwrap()
    }
    pub fn pass(&self) -> &str {
        self.pass.to_str().unwrap()
    }
    /// Writes a file `name` holding `content` beside the image; returns its path.
    pub fn file(&self, name: &str, content: &[u8]) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.to_str().unwrap().to_owned()
    }
}

/// The volume key cryptsetup reports (`luksDump --dump-volume-key`).
pub fn volume_key(img: &str, pass: &str) -> Vec<u8> {
    let out = ok(
        &cs(&["luksDump", "--dump-volume-key", "--batch-mode", "--key-file", pass, img]),
        "luksDump --dump-volume-key",
    );
    let hexs: String = out
        .split("MK dump:")
        .nth(1)
        .expect("MK dump line")
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .collect();
    hex::decode(hexs).unwrap()
}

/// `(data offset in bytes, cipher, sector size)` of segment 0 (LUKS2) or the payload
/// (LUKS1), from cryptsetup's own dump.
pub fn layout(img: &str) -> (u64, String, u32) {
    let out = ok(&cs(&["luksDump", img]), "luksDump");
    if out.contains("Version:       \t1") {
        let field = |k: &str| {
            out.lines().find(|l| l.starts_with(k)).unwrap().split('\t').nth(1).unwrap().trim().to_owned()
        };
        let off: u64 = field("Payload offset:").parse().unwrap();
        return (off * 512, format!("{}-{}", field("Cipher name:"), field("Cipher mode:")), 512);
    }
    let seg = out.split("Data segments:").nth(1).unwrap();
    let val = |k: &str| {
        seg.lines().find(|l| l.trim_start().starts_with(k)).unwrap().split(": ").nth(1).unwrap().to_owned()
    };
    let off: u64 = val("offset").split(' ').next().unwrap().parse().unwrap();
    let sector: u32 = val("sector").split(' ').next().unwrap().parse().unwrap();
    (off, val("cipher").trim().to_owned(), sector)
}

/// The sector cipher of `spec` under `key` (IVs from sector 0 of the data area).
pub fn cipher(spec: &str, key: &[u8], sector_size: u32) -> SectorCipher {
    let s: CipherSpec = spec.parse().unwrap();
    SectorCipher::new(
        &s,
        &VolumeKey::from_slice(key),
        SectorParams { sector_size, iv_offset: 0, iv_large_sectors: false },
    )
    .unwrap()
}

/// `None`: no reencryption in the header; `Some(true)`: one in progress (the
/// `in-reencryption` segment flag); `Some(false)`: initialized, not yet run.
pub fn in_progress(img: &str) -> Option<bool> {
    let dump = ok(&cs(&["luksDump", img]), "luksDump");
    dump.contains("online-reencrypt").then(|| dump.contains("in-reencryption"))
}

/// `len` bytes of a xorshift stream (`seed` 0 and others give different data).
pub fn plaintext(len: usize, seed: u64) -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `data` at byte `off` of the file `p`.
pub fn write_at(p: &Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new().write(true).open(p).unwrap().write_all_at(data, off).unwrap();
}
