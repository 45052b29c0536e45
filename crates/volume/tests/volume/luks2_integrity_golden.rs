//! LUKS2 authenticated encryption volumes made by the real kernel (Linux 6.1, cryptsetup
//! 2.6.1; `testdata/luks-integrity/make-golden.sh`, transcripts in `boot.log` and, for images
//! made later on their own, `boot-<name>.log`): sealdisk opens
//! each, reads the kernel's pattern, matches its sizes, key and table, refuses the sectors
//! the kernel never wrote, detects one flipped byte of data or tag on exactly that sector,
//! and its own writes read back after reopening.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use blockdev::{BlockDevice, BlockErrorKind, WriteFlags};
use formats::integrity::{DeviceParams, Layout, Superblock};
use sector_crypto::kdf::Passphrase;
use sha2::{Digest, Sha256};
use volume::luks::{self, OpenParams};

const CASES: [(&str, u32); 5] = [
    ("hmac-sha256-xts-s512", 512),
    ("hmac-sha256-xts-s4096", 4096),
    ("aead-gcm-s512", 512),
    ("aead-gcm-s4096-nojournal", 4096),
    ("chacha20-poly1305-s512", 512),
];
/// Bytes of pattern A the kernel wrote at the start of each volume.
const WRITTEN: usize = 256 * 1024;
/// The LUKS2 data offset of every image (cryptsetup --offset 1024).
const DATA_OFFSET_SECTORS: u64 = 1024;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/luks-integrity")
}

/// Pattern A: 512-byte sector s holds 32 records `A%011d:%02d\n`.
fn pattern_a(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut s = 0;
    while v.len() < len {
        for r in 0..32 {
            v.extend_from_slice(format!("A{s:011}:{r:02}\n").as_bytes());
        }
        s += 1;
    }
    v.truncate(len);
    v
}

/// The kernel transcripts: `boot.log` (the first images) and `boot-<name>.log` (images
/// made later with `ONLY=<name> make-golden.sh`), concatenated.
fn kernel_log() -> String {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("boot") && n.ends_with(".log")
        })
        .collect();
    logs.sort();
    logs.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect()
}

/// `KEY name value` lines of the kernel transcripts.
fn transcript(key: &str) -> HashMap<String, String> {
    kernel_log()
        .lines()
        .filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .filter_map(|r| r.split_once(' ').map(|(n, v)| (n.to_string(), v.to_string())))
        .collect()
}

/// The image decompressed into `tmp`, or `None` (skipped loudly) without xz.
fn image(tmp: &Path, name: &str) -> Option<PathBuf> {
    let out = match Command::new("xz").arg("-dc").arg(dir().join(format!("{name}.img.xz"))).output() {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => panic!("xz -dc {name}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: cannot run xz ({e})");
            return None;
        }
    };
    let p = tmp.join(format!("{name}.img"));
    std::fs::write(&p, out).unwrap();
    Some(p)
}

fn params(path: &Path) -> OpenParams {
    OpenParams::new(path.to_str().unwrap())
}

fn pass() -> Passphrase {
    Passphrase::new(std::fs::read(dir().join("pass.txt")).unwrap())
}

fn sha_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn kernel_made_aead_volumes_open_and_read_the_kernels_data() {
    let tmp = tempfile::tempdir().unwrap();
    let (sizes, shas, tables) = (transcript("SIZE"), transcript("SHA"), transcript("TABLE"));
    let expected = pattern_a(WRITTEN);
    for (name, ss) in CASES {
        let Some(img) = image(tmp.path(), name) else { return };
        let opened = luks::open(&params(&img), &pass()).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let dev = &opened.volume.device;
        assert_eq!(
            dev.geometry().size.to_string(),
            sizes[name],
            "{name}: provided size differs from the kernel's"
        );
        assert_eq!(dev.geometry().logical_block, ss);
        // The kernel's table: "0 <len> crypt <cipher> <key> 0 <dev> 0 <n> integrity:<t>:aead [sector_size:4096]".
        let kt: Vec<&str> = tables[name].split(' ').collect();
        let ours = opened.volume.crypt_table().unwrap().to_string();
        let ot: Vec<&str> = ours.split(' ').collect();
        assert_eq!((ot[1], ot[3]), (kt[1], kt[3]), "{name}: length and cipher");
        assert_eq!(&ot[7..], &kt[7..], "{name}: optional parameters");
        let mut back = vec![0u8; WRITTEN];
        dev.read_at(0, &mut back).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(back == expected, "{name}: pattern A differs");
        assert_eq!(sha_hex(&back), shas[name], "{name}: sha256 differs from the kernel's");
        // The kernel could not read its first unwritten block either (UNWRITTEN ... EIO).
        let mut one = vec![0u8; 4096];
        let e = dev.read_at(WRITTEN as u64, &mut one).unwrap_err();
        assert!(matches!(e.kind(), BlockErrorKind::IntegrityMismatch { .. }), "{name}: {e}");
        assert_eq!(transcript("UNWRITTEN")[name], "EIO");
        // The volume key is the one given to cryptsetup.
        let vk = std::fs::read(dir().join(if name.starts_with("hmac") { "vk96.bin" } else { "vk32.bin" }))
            .unwrap();
        assert_eq!(&opened.volume.crypt_table().unwrap().key[..], &vk[..], "{name}: volume key");
    }
}

/// Flips one byte of the image at the data (`tag = false`) or tag of crypt sector `idx`.
fn flip(img: &Path, ss: u32, idx: u64, tag: bool) -> u64 {
    let mut raw = std::fs::read(img).unwrap();
    let start = DATA_OFFSET_SECTORS;
    let sb = Superblock::decode(&raw[start as usize * 512..start as usize * 512 + 4096]).unwrap();
    let dp = DeviceParams {
        data_device_sectors: raw.len() as u64 / 512,
        meta_device_sectors: None,
        start,
        buffer_sectors: 128,
        sectors_per_bit: None,
    };
    let layout = Layout::open(&sb, &dp).unwrap();
    let logical = idx * u64::from(ss / 512);
    let at = if tag {
        layout.tag_location(logical).byte_address + 3
    } else {
        layout.data_sector(logical) * 512 + 100
    };
    raw[at as usize] ^= 0x04;
    std::fs::write(img, raw).unwrap();
    logical
}

#[test]
fn one_flipped_byte_in_a_kernel_image_fails_that_sector_only() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = pattern_a(WRITTEN);
    for (name, ss) in CASES {
        for tag in [false, true] {
            let Some(img) = image(tmp.path(), name) else { return };
            let bad = flip(&img, ss, 3, tag);
            let opened = luks::open(&params(&img), &pass()).unwrap();
            let dev = &opened.volume.device;
            let ssz = ss as usize;
            let mut buf = vec![0u8; 8 * ssz];
            let e = dev.read_at(0, &mut buf).unwrap_err();
            assert_eq!(e.kind(), BlockErrorKind::IntegrityMismatch { sector: bad }, "{name} tag={tag}");
            assert_eq!(e.kind().errno(), BlockErrorKind::IntegrityMismatch { sector: 0 }.errno());
            for i in (0..8).filter(|&i| i != 3) {
                let mut one = vec![0u8; ssz];
                dev.read_at((i * ssz) as u64, &mut one).unwrap_or_else(|e| panic!("{name} sector {i}: {e}"));
                assert_eq!(one, &expected[i * ssz..(i + 1) * ssz]);
            }
        }
    }
}

#[test]
fn sealdisk_writes_to_a_kernel_image_read_back_after_reopening() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, _) in CASES {
        let Some(img) = image(tmp.path(), name) else { return };
        let data: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        {
            let opened = luks::open(&params(&img), &pass()).unwrap();
            opened.volume.device.write_at(WRITTEN as u64, &data, WriteFlags::empty()).unwrap();
            opened.volume.device.flush().unwrap();
        }
        let opened = luks::open(&params(&img), &pass()).unwrap();
        let mut back = vec![0u8; WRITTEN + data.len()];
        opened.volume.device.read_at(0, &mut back).unwrap();
        assert!(back[..WRITTEN] == pattern_a(WRITTEN)[..] && back[WRITTEN..] == data[..], "{name}");
    }
}

fn format_like_the_kernel(path: &Path, name: &str, ss: u32, no_wipe: bool) -> sector_crypto::VolumeKey {
    use volume::luks::{FormatParams, LuksIntegrity, PbkdfParams, PbkdfType};
    let (cipher, integrity, vk) = if name.starts_with("hmac") {
        ("aes-xts-plain64", "hmac-sha256", "vk96.bin")
    } else if name.starts_with("chacha20") {
        ("chacha20-random", "poly1305", "vk32.bin")
    } else {
        ("aes-gcm-random", "aead", "vk32.bin")
    };
    let spec = sector_crypto::AeadSpec::from_luks2(cipher, integrity).unwrap();
    let vk = std::fs::read(dir().join(vk)).unwrap();
    std::fs::write(path, vec![0u8; 4 << 20]).unwrap();
    let li = LuksIntegrity { spec, no_wipe, no_journal: name.contains("nojournal"), journal_size: None };
    let p = FormatParams {
        cipher: cipher.into(),
        key_bytes: vk.len(),
        pbkdf: PbkdfParams {
            kind: Some(PbkdfType::Pbkdf2),
            force_iterations: Some(1000),
            ..PbkdfParams::default()
        },
        sector_size: ss,
        offset: Some(DATA_OFFSET_SECTORS),
        volume_key: Some(sector_crypto::VolumeKey::new(vk)),
        integrity: Some(li),
        ..FormatParams::default()
    };
    let dev = volume::open_backing(path.to_str().unwrap(), &volume::OpenOptions::default()).unwrap();
    let (l, vk) = luks::format(&dev, &p, &pass()).unwrap();
    drop(dev);
    let data = volume::open_backing(path.to_str().unwrap(), &volume::OpenOptions::default()).unwrap();
    luks::format_integrity(data, &l, &vk, &li, |_, _| {}).unwrap();
    vk
}

fn superblock(path: &Path) -> Superblock {
    let raw = std::fs::read(path).unwrap();
    let at = DATA_OFFSET_SECTORS as usize * 512;
    Superblock::decode(&raw[at..at + 4096]).unwrap()
}

#[test]
fn sealdisk_formats_the_integrity_area_as_cryptsetup_does() {
    let tmp = tempfile::tempdir().unwrap();
    let sizes = transcript("SIZE");
    for (name, ss) in CASES {
        let Some(kernel) = image(tmp.path(), name) else { return };
        let ours = tmp.path().join(format!("{name}-sealdisk.img"));
        format_like_the_kernel(&ours, name, ss, true);
        assert_eq!(superblock(&ours), superblock(&kernel), "{name}: dm-integrity superblock");
        let opened = luks::open(&params(&ours), &pass()).unwrap();
        assert_eq!(opened.volume.device.geometry().size.to_string(), sizes[name], "{name}");
        // --integrity-no-wipe: nothing written yet, nothing readable (as in the kernel).
        let mut one = vec![0u8; ss as usize];
        assert!(matches!(
            opened.volume.device.read_at(0, &mut one).unwrap_err().kind(),
            BlockErrorKind::IntegrityMismatch { sector: 0 }
        ));
    }
}

#[test]
fn luks_format_with_integrity_wipes_so_every_sector_reads_as_zeroes() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, ss) in [CASES[0], CASES[3], CASES[4]] {
        let path = tmp.path().join(format!("{name}-wiped.img"));
        format_like_the_kernel(&path, name, ss, false);
        let opened = luks::open(&params(&path), &pass()).unwrap();
        let dev = &opened.volume.device;
        let mut all = vec![0xffu8; dev.geometry().size as usize];
        dev.read_at(0, &mut all).unwrap();
        assert!(all.iter().all(|&b| b == 0), "{name}");
        assert!(!dev.caps().contains(blockdev::Caps::DISCARD));
        assert_eq!(dev.discard(0, u64::from(ss)).unwrap_err().kind(), BlockErrorKind::Unsupported);
    }
}

#[test]
fn bad_integrity_format_requests_are_refused_before_writing() {
    use volume::luks::{FormatParams, LuksIntegrity, LuksVersion};
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("refused.img");
    std::fs::write(&path, vec![0x5au8; 4 << 20]).unwrap();
    let gcm = sector_crypto::AeadSpec::from_luks2("aes-gcm-random", "aead").unwrap();
    let li = LuksIntegrity { spec: gcm, no_wipe: true, no_journal: false, journal_size: None };
    let cases = [
        (
            "luks1",
            FormatParams {
                version: LuksVersion::V1,
                cipher: "aes-gcm-random".into(),
                key_bytes: 32,
                integrity: Some(li),
                ..FormatParams::default()
            },
        ),
        (
            "cipher mismatch",
            FormatParams {
                cipher: "aes-xts-plain64".into(),
                key_bytes: 32,
                integrity: Some(li),
                ..FormatParams::default()
            },
        ),
        (
            "key size",
            FormatParams {
                cipher: "aes-gcm-random".into(),
                key_bytes: 64,
                integrity: Some(li),
                ..FormatParams::default()
            },
        ),
    ];
    for (what, p) in cases {
        let dev = volume::open_backing(path.to_str().unwrap(), &volume::OpenOptions::default()).unwrap();
        assert!(luks::format(&dev, &p, &pass()).is_err(), "{what}");
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0x5a), "{what}: nothing written");
    }
}

/// The `luksDump` block of `name` in the kernel transcript (the guest indented it by two).
fn kernel_dump(name: &str) -> String {
    let log = kernel_log();
    let mut out = String::new();
    let mut on = false;
    for l in log.lines() {
        if l == format!("DUMP {name}") {
            on = true;
            continue;
        }
        if on && (l.starts_with("### ") || l.starts_with("DUMP ")) {
            break;
        }
        if on {
            out.push_str(l.strip_prefix("  ").unwrap_or(l));
            out.push('\n');
        }
    }
    out
}

#[test]
fn luks_dump_of_kernel_aead_images_matches_cryptsetup_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, _) in CASES {
        let Some(img) = image(tmp.path(), name) else { return };
        let dev = volume::open_backing(
            img.to_str().unwrap(),
            &volume::OpenOptions { read_only: true, ..Default::default() },
        )
        .unwrap();
        let l = luks::Luks::load(&dev, false).unwrap();
        let want = kernel_dump(name);
        assert!(want.contains("integrity: "), "{name}: transcript");
        assert_eq!(luks::dump(&l, img.to_str().unwrap()), want, "{name}");
    }
}

/// The journal area of the dm-integrity layer (sectors after its superblock).
fn journal_bytes(img: &Path) -> Vec<u8> {
    let raw = std::fs::read(img).unwrap();
    let at = DATA_OFFSET_SECTORS as usize * 512;
    let sb = Superblock::decode(&raw[at..at + 4096]).unwrap();
    let dp = DeviceParams {
        data_device_sectors: raw.len() as u64 / 512,
        meta_device_sectors: None,
        start: DATA_OFFSET_SECTORS,
        buffer_sectors: 128,
        sectors_per_bit: None,
    };
    let l = Layout::open(&sb, &dp).unwrap();
    let (off, len) = (l.journal_byte_offset() as usize, l.journal_bytes() as usize);
    raw[off..off + len].to_vec()
}

#[test]
fn integrity_no_journal_writes_around_the_journal_and_the_default_through_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (name, _) = CASES[2];
    for no_journal in [true, false] {
        let Some(img) = image(tmp.path(), name) else { return };
        let before = journal_bytes(&img);
        {
            let p = OpenParams { integrity_no_journal: no_journal, ..params(&img) };
            let opened = luks::open(&p, &pass()).unwrap();
            opened.volume.device.write_at(WRITTEN as u64, &[0x77; 8192], WriteFlags::empty()).unwrap();
            opened.volume.device.flush().unwrap();
        }
        assert_eq!(journal_bytes(&img) == before, no_journal, "no_journal={no_journal}");
        let opened = luks::open(&params(&img), &pass()).unwrap();
        let mut back = vec![0u8; 8192];
        opened.volume.device.read_at(WRITTEN as u64, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x77));
    }
}

#[test]
fn a_damaged_or_mismatched_integrity_superblock_is_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let (name, _) = CASES[2];
    let at = DATA_OFFSET_SECTORS as usize * 512;
    // (what, byte offset in the superblock, new value): magic, tag size (28 → 32), version 0.
    for (what, off, val, msg) in
        [("magic", 0usize, b'X', "superblock"), ("tag size", 10, 32, "tag"), ("version", 8, 0, "superblock")]
    {
        let Some(img) = image(tmp.path(), name) else { return };
        let mut raw = std::fs::read(&img).unwrap();
        raw[at + off] = val;
        std::fs::write(&img, &raw).unwrap();
        let e = luks::open(&params(&img), &pass()).unwrap_err();
        let chain = {
            let mut s = e.to_string();
            let mut cur = std::error::Error::source(&e);
            while let Some(c) = cur {
                s += &format!(": {c}");
                cur = c.source();
            }
            s
        };
        assert!(chain.contains("dm-integrity") && chain.to_lowercase().contains(msg), "{what}: {chain}");
        assert_eq!(std::fs::read(&img).unwrap(), raw, "{what}: the image was written");
    }
}
