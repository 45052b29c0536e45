//! The dm-integrity golden images Linux 6.1 made (testdata/integrity, see its README): the
//! rows of `manifest.tsv`, the boot logs' `KEY name rest` lines, the `*.img.xz` images and the
//! pattern the kernel wrote.
//!
//! Plain std only: `targets` uses it as `testkit::integrity_golden`, and `formats` (which does
//! not depend on testkit) includes this file with `#[path]`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

/// testdata/integrity in the checkout.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/integrity")
}

/// The text of testdata/integrity/`name`; panics naming the file when it cannot be read.
pub fn read_text(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Decompresses `<name>.img.xz`; `None` (with a loud message) when `xz` is unavailable.
pub fn image(name: &str) -> Option<Vec<u8>> {
    let path = dir().join(format!("{name}.img.xz"));
    match Command::new("xz").arg("-dc").arg(&path).output() {
        Ok(o) if o.status.success() => Some(o.stdout),
        Ok(o) => panic!("xz -dc {}: {}", path.display(), String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: cannot run xz ({e}); golden integrity images not checked");
            None
        }
    }
}

/// One row of `manifest.tsv`.
#[derive(Debug, Clone)]
pub struct Case {
    /// Image name (`<name>.img.xz`, `<name>.dump`).
    pub name: String,
    /// Device size in bytes.
    pub size: u64,
    /// The `integritysetup format` options, split on white space.
    pub opts: Vec<String>,
    /// `full` for images written with pattern A, else what the image is for.
    pub kind: String,
}

/// The rows of `manifest.tsv` (the header skipped).
pub fn manifest() -> Vec<Case> {
    read_text("manifest.tsv")
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            Case {
                name: f[0].to_string(),
                size: f[1].parse().unwrap(),
                opts: f[2].split_whitespace().map(String::from).collect(),
                kind: f[3].to_string(),
            }
        })
        .collect()
}

/// `KEY name rest` lines of the boot log `log`, as name → rest.
pub fn log_lines(log: &str, key: &str) -> HashMap<String, String> {
    read_text(log)
        .lines()
        .filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .filter_map(|r| r.split_once(' ').map(|(n, rest)| (n.to_string(), rest.to_string())))
        .collect()
}

/// The value that follows option `name` in `opts`.
pub fn opt<'a>(opts: &'a [String], name: &str) -> Option<&'a str> {
    opts.iter().position(|o| o == name).map(|i| opts[i + 1].as_str())
}

/// The key `--integrity-key-file` names (the guest's path, read here by its file name).
pub fn integrity_key(opts: &[String]) -> Option<Vec<u8>> {
    opt(opts, "--integrity-key-file").map(|p| {
        let file = p.rsplit('/').next().unwrap();
        std::fs::read(dir().join(file)).unwrap()
    })
}

/// Pattern X: logical sector s holds 32 records "X%011d:%02d\n".
pub fn pattern(letter: char, sector: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(512);
    for r in 0..32 {
        v.extend_from_slice(format!("{letter}{sector:011}:{r:02}\n").as_bytes());
    }
    v
}
