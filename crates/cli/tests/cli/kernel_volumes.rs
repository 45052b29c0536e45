//! The kernel-written volumes of testdata/dm-crypt (kind=volume rows of cases.tsv) opened with
//! `sealdisk open --table-file` exactly as the kernel's table line says (device path swapped
//! for the image), read over NBD by nbdcopy, and compared with the plaintext the kernel wrote.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use sha2::{Digest, Sha256};

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/dm-crypt")
}

/// The golden plaintext: SHA256("sealdisk dm-crypt golden plaintext block i") for i = 0, 1, …
fn golden_plaintext(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    for i in 0.. {
        if out.len() >= len {
            break;
        }
        out.extend_from_slice(&Sha256::digest(format!("sealdisk dm-crypt golden plaintext block {i}")));
    }
    out.truncate(len);
    out
}

#[test]
fn kernel_written_volumes_open_with_their_table_lines() {
    let manifest = std::fs::read_to_string(testdata().join("cases.tsv")).expect("cases.tsv");
    let rows: Vec<Vec<&str>> = manifest
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split('\t').collect())
        .filter(|f: &Vec<&str>| f.get(1) == Some(&"volume"))
        .collect();
    assert!(rows.len() >= 2, "expected the kind=volume cases in cases.tsv");
    if !have("nbdcopy") {
        return;
    }
    for f in rows {
        let (file, payload_len, table) = (f[0], f[9].parse::<usize>().unwrap(), f[10]);
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join(file);
        std::fs::copy(testdata().join(file), &img).unwrap();
        let line = table.replace("/dev/mapper/golden-src", img.to_str().unwrap());
        let srv = serve(dir.path(), "k", &["--table-file", "-", "--readonly", "k"], Some(line.as_bytes()));
        let out = dir.path().join("out.bin");
        run_tool(Command::new("nbdcopy").arg(srv.uri()).arg(&out));
        let back = std::fs::read(&out).unwrap();
        assert_eq!(back.len(), payload_len, "{file}: export size");
        assert!(back == golden_plaintext(payload_len), "{file}: data differs from what the kernel wrote");
        assert!(srv.stop().status.success());
        assert_eq!(
            std::fs::read(&img).unwrap(),
            std::fs::read(testdata().join(file)).unwrap(),
            "read-only open changed {file}"
        );
    }
}
