//! BitLocker against the real kernel (Linux 6.1 dm-crypt and cryptsetup 2.6.1 under
//! /work/shared/oracle/kernel-run, one boot): Windows-made images from testdata/bitlk,
//! extended to the volume size their metadata states (cryptsetup's `open` spins on the
//! truncated originals), are opened by the guest's `cryptsetup open --type bitlk` —
//! aes-xts with the password (one 0x100000-round stretch, ~30 s under TCG), aes-cbc-elephant
//! with `--volume-key-file` — and must agree with sealdisk on:
//!
//! * `bitlkDump` (same text);
//! * the dm table: cryptsetup's segments (crypt / zero, offsets, IV offsets) are
//!   `volume::bitlk::Bitlk::segments`;
//! * the data: SHA-256 of the whole mapped device;
//! * writes: sealdisk writes 1 MiB at 2 MiB before the boot, the kernel reads it; the
//!   guest writes patterns through its mapping (into the moved boot sectors at
//!   0 and at 1 MiB); sealdisk opens the image afterwards and reads them back.
//!
//! `cargo test -p sealdisk --test cli bitlk_kernel:: -- --ignored` (~1 min guest time under TCG).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockdev::{BlockDevice, MemDevice};
use common::{bin, pattern, sha_hex};
use sector_crypto::kdf::Passphrase;
use volume::bitlk::{self, BitlkKey, SegmentKind};
use volume::{OpenOptions, Spec, Storage};

const PASSWORD: &str = "password12!@";

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/bitlk")
}

fn extended(dir: &Path, name: &str) -> (PathBuf, bitlk::Bitlk) {
    let out = Command::new("xz").arg("-dc").arg(testdata().join(format!("{name}.img.xz"))).output().unwrap();
    assert!(out.status.success(), "xz");
    let mut bytes = out.stdout;
    let b = bitlk::load(&MemDevice::from_vec(bytes.clone(), 512)).unwrap();
    bytes.resize(b.metadata.volume_size as usize, 0);
    let p = dir.join(format!("{name}.img"));
    std::fs::write(&p, &bytes).unwrap();
    (p, b)
}

fn open_file(img: &Path) -> volume::Volume {
    let bytes = std::fs::read(img).unwrap();
    let storage = Storage::new(Arc::new(MemDevice::from_vec(bytes, 512)), "img");
    let key = BitlkKey::Passphrase(Passphrase::new(PASSWORD.as_bytes().to_vec()));
    volume::open_storage(storage, Spec::Bitlk, key.into(), &OpenOptions::default()).unwrap()
}

fn read_all(v: &volume::Volume) -> Vec<u8> {
    let mut all = vec![0u8; v.device.geometry().size as usize];
    v.device.read_at(0, &mut all).unwrap();
    all
}

const SCRIPT: &str = r#"#!/bin/bash
set -u
run() { # name disk open-args...
  local n=$1 d=$2; shift 2
  echo "== DUMP $n"; cryptsetup bitlkDump "$d" | sed "s|$d|DEV|"; echo "== END"
  if ! cryptsetup open --type bitlk "$@" "$d" t; then echo "OPEN-FAILED $n"; return; fi
  echo "== TABLE $n"; dmsetup table t; echo "== END"
  echo "SHA $n $(sha256sum /dev/mapper/t | cut -d' ' -f1)"
  echo "SHAW $n $(dd if=/dev/mapper/t bs=1M skip=2 count=1 status=none | sha256sum | cut -d' ' -f1)"
  dd if=/kr/pattern0 of=/dev/mapper/t bs=4096 conv=fsync status=none
  dd if=/kr/pattern1 of=/dev/mapper/t bs=1M seek=1 conv=fsync status=none
  cryptsetup close t
}
run xts /dev/vda --key-file /kr/pw
run elephant /dev/vdb --volume-key-file /kr/vk-elephant
"#;

fn section<'a>(log: &'a str, tag: &str) -> &'a str {
    let start = log.find(&format!("== {tag}\n")).unwrap_or_else(|| panic!("no {tag} in the guest log"));
    let rest = &log[start + tag.len() + 4..];
    &rest[..rest.find("== END").unwrap()]
}

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~1 min"]
fn kernel_cryptsetup_and_sealdisk_agree_on_bitlocker_volumes() {
    let Some(kr) = common::kernel_run() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (xts, xts_meta) = extended(dir.path(), "aes-xts_128");
    let (ele, ele_meta) = extended(dir.path(), "aes_256_diffuser");
    // sealdisk writes 1 MiB at 2 MiB into each (the kernel must read it: the encrypt path,
    // Elephant included), then its view before the guest writes.
    for p in [&xts, &ele] {
        let opts = OpenOptions::default();
        let storage = volume::storage::open(p.to_str().unwrap(), &opts.storage()).unwrap();
        let key = BitlkKey::Passphrase(Passphrase::new(PASSWORD.as_bytes().to_vec()));
        let v = volume::open_storage(storage, Spec::Bitlk, key.into(), &opts).unwrap();
        v.device.write_at(2 << 20, &pattern(1 << 20, 3), blockdev::WriteFlags::empty()).unwrap();
        v.device.flush().unwrap();
    }
    let want: Vec<(String, Vec<u8>, &bitlk::Bitlk, PathBuf)> =
        [("xts", &xts, &xts_meta), ("elephant", &ele, &ele_meta)]
            .into_iter()
            .map(|(n, p, m)| (n.to_string(), read_all(&open_file(p)), m, p.clone()))
            .collect();
    let vk = open_file(&ele).crypt_table().unwrap().key.to_vec();
    let files = [
        ("pw", PASSWORD.as_bytes().to_vec()),
        ("vk-elephant", vk),
        ("pattern0", pattern(8192, 1)),
        ("pattern1", pattern(1 << 20, 2)),
    ];
    let mut paths = Vec::new();
    for (n, data) in &files {
        let p = dir.path().join(n);
        std::fs::write(&p, data).unwrap();
        paths.push(p);
    }
    let script = dir.path().join("bitlk.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let log = common::boot_kernel_within(&kr, 400, &paths, &[xts.clone(), ele.clone()], &script);
    assert!(!log.contains("OPEN-FAILED"), "the guest's cryptsetup could not open a volume");
    let shas = common::tagged_lines(&log, "SHA");
    let written = common::tagged_lines(&log, "SHAW");
    for (name, data, meta, img) in &want {
        // bitlkDump: the same text (device name aside).
        let ours = Command::new(bin()).args(["bitlkDump", img.to_str().unwrap()]).output().unwrap();
        let ours = String::from_utf8(ours.stdout).unwrap().replace(img.to_str().unwrap(), "DEV");
        assert_eq!(ours, section(&log, &format!("DUMP {name}")), "{name}: bitlkDump");
        // The dm table's segments.
        let table = section(&log, &format!("TABLE {name}"));
        let size = meta.metadata.volume_size;
        let segs = meta.segments(size);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), segs.len(), "{name}: {table}");
        for (l, s) in lines.iter().zip(&segs) {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f[0].parse::<u64>().unwrap() * 512, s.start, "{name}: {l}");
            assert_eq!(f[1].parse::<u64>().unwrap() * 512, s.len, "{name}: {l}");
            match s.kind {
                SegmentKind::Zero => assert_eq!(f[2], "zero", "{name}: {l}"),
                SegmentKind::Crypt { device_offset } => {
                    assert_eq!(f[2], "crypt", "{name}: {l}");
                    assert_eq!(f[3], meta.cipher(), "{name}: {l}");
                    assert_eq!(f[5].parse::<u64>().unwrap() * 512, device_offset, "{name}: iv_offset {l}");
                    assert_eq!(f[7].parse::<u64>().unwrap() * 512, device_offset, "{name}: offset {l}");
                }
            }
        }
        // The data.
        assert_eq!(shas.get(name.as_str()), Some(&sha_hex(data)), "{name}: the kernel read other data");
        assert_eq!(
            written.get(name.as_str()),
            Some(&sha_hex(&pattern(1 << 20, 3))),
            "{name}: sealdisk's write"
        );
        // The kernel's writes, read by sealdisk.
        let v = open_file(img);
        let mut back = vec![0u8; 8192];
        v.device.read_at(0, &mut back).unwrap();
        assert!(back == pattern(8192, 1), "{name}: the kernel's write at 0");
        let mut back = vec![0u8; 1 << 20];
        v.device.read_at(1 << 20, &mut back).unwrap();
        assert!(back == pattern(1 << 20, 2), "{name}: the kernel's write at 1 MiB");
    }
}
