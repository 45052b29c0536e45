//! FileVault2 against the real kernel and cryptsetup (Linux 6.1, cryptsetup 2.6 under
//! /work/shared/oracle/kernel-run, one boot): on cryptsetup's test image (testdata/fvault2),
//! `cryptsetup fvault2Dump` prints what `sealdisk fvault2Dump` prints, `cryptsetup open
//! --type fvault2` maps the table sealdisk builds (same cipher, key, offset and length,
//! from `dmsetup table --showkeys`), and the kernel's dm-crypt reads the bytes sealdisk
//! reads (sha256 of the whole logical volume).
//!
//! Boots a kernel (well under a minute under TCG):
//! `cargo test -p sealdisk --test cli fvault2_kernel:: -- --ignored`.
use crate::common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use blockdev::{BlockDevice, FileDevice, FileOptions};
use common::{bin, boot_kernel_within, sha_hex};
use sector_crypto::kdf::Passphrase;
use volume::{Fvault2Spec, OnePassphrase, OpenOptions, Spec, Storage};

const GUEST: &str = r#"#!/bin/bash
set -e
echo "DUMPSTART"
cryptsetup fvault2Dump /dev/vda
echo "DUMPEND"
echo -n heslo123 | cryptsetup open --type fvault2 --readonly --key-file - /dev/vda fv
echo "TABLE $(dmsetup table --showkeys fv)"
echo "SIZE $(blockdev --getsize64 /dev/mapper/fv)"
echo "SHA $(sha256sum /dev/mapper/fv | cut -c1-64)"
cryptsetup close fv
if echo -n wrong | cryptsetup open --type fvault2 --readonly --key-file - /dev/vda fv2; then
  echo "WRONG opened"
else
  echo "WRONG refused $?"
fi
"#;

#[test]
#[ignore = "boots a kernel through kernel-run (CI runs it)"]
fn the_kernel_and_cryptsetup_agree_with_sealdisk_on_filevault2() {
    let Some(kr) = common::kernel_run() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tarball = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fvault2/fvault2-images.tar.xz");
    let ok = Command::new("tar").arg("-xJSf").arg(&tarball).arg("-C").arg(dir.path()).status().unwrap();
    assert!(ok.success(), "tar -xJSf {}", tarball.display());
    let img = dir.path().join("fvault2-images/small");

    // sealdisk's side, through the library and the CLI.
    let f = FileDevice::open(&img, FileOptions { read_only: true, ..FileOptions::default() }).unwrap();
    let storage = Storage::new(Arc::new(f), "/dev/vda");
    let pass = Passphrase::new(b"heslo123".to_vec());
    let mut one = OnePassphrase::new(&pass);
    let spec = Fvault2Spec { kdf_limits: Default::default() };
    let v = volume::open_storage(
        storage,
        Spec::Fvault2(spec),
        volume::Keys::passphrase(&mut one),
        &OpenOptions::default(),
    )
    .unwrap();
    let table = v.crypt_table().unwrap().to_string();
    let size = v.device.geometry().size;
    let mut data = vec![0u8; size as usize];
    v.device.read_at(0, &mut data).unwrap();
    let ours_sha = sha_hex(&data);
    drop(data);
    let dump = Command::new(bin()).arg("fvault2Dump").arg(&img).output().unwrap();
    assert!(dump.status.success());
    let ours_dump = String::from_utf8_lossy(&dump.stdout).replace(img.to_str().unwrap(), "/dev/vda");

    // The kernel's side.
    let script = dir.path().join("fvault2.sh");
    std::fs::write(&script, GUEST).unwrap();
    let log = boot_kernel_within(&kr, 300, &[], std::slice::from_ref(&img), &script);
    let theirs_dump = log.split("DUMPSTART\n").nth(1).and_then(|r| r.split("DUMPEND").next()).unwrap();
    assert_eq!(ours_dump, theirs_dump, "fvault2Dump differs from cryptsetup's");
    let tagged = |key: &str| {
        let prefix = format!("{key} ");
        log.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {key} line"))
            .to_owned()
    };
    // dmsetup names the device by major:minor; everything else must match.
    let strip_dev = |t: &str| {
        let mut f: Vec<String> = t.split_whitespace().map(str::to_owned).collect();
        f[6] = "DEV".into();
        f.join(" ")
    };
    assert_eq!(strip_dev(&table), strip_dev(&tagged("TABLE")), "dm-crypt tables differ");
    assert_eq!(tagged("SIZE"), size.to_string());
    assert_eq!(tagged("SHA"), ours_sha, "the kernel reads other bytes");
    assert!(log.contains("WRONG refused 2"), "cryptsetup refuses a wrong passphrase with exit 2");
}
