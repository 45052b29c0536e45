//! FileVault2 against cryptsetup's own test image (testdata/fvault2, see its README):
//! the metadata read as `cryptsetup fvault2Dump` prints it, the logical volume's content as
//! the kernel's dm-crypt decrypts it (cryptsetup's test records its sha256), a wrong
//! passphrase, corrupt metadata, a truncated image and a write, each refused clearly.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockdev::{BlockDevice, FileDevice, FileOptions, WriteFlags};
use sector_crypto::kdf::Passphrase;
use sha2::{Digest, Sha256};
use volume::{ErrorKind, Format, Fvault2Spec, Keys, OnePassphrase, OpenOptions, Spec, Storage, VolumeKind};

/// The values cryptsetup's tests/fvault2-compat-test checks for this image.
const DUMP: &str = "Header information for FVAULT2 device small.\n\
Physical volume UUID: \tfc52bfae-5a1f-4f9b-b3a6-f33303a0e401\n\
Family UUID:          \t33a76caa-1481-4bc5-8d04-1ac1707c19c0\n\
Logical volume offset:\t67108864 [bytes]\n\
Logical volume size:  \t167772160 [bytes]\n\
Cipher:               \taes\n\
Cipher mode:          \txts-plain64\n\
PBKDF2 iterations:    \t204222\n\
PBKDF2 salt:          \t2c 24 9e db 66 63 d6 fb cc 79 05 b7 a4 d7 27 52 \n";
const SHA256: &str = "2c662e36c0f7e2f5583e6a939bbcbdc660805692d0fccaa45ad4052beb3b8e18";
const PASS: &[u8] = b"heslo123";

/// Unpacks the image (sparse, 512 MiB apparent, 52 KiB on disk) into `dir`; `None`,
/// loudly, without tar or xz.
fn image(dir: &Path) -> Option<PathBuf> {
    let tarball = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fvault2/fvault2-images.tar.xz");
    match Command::new("tar").arg("-xJSf").arg(&tarball).arg("-C").arg(dir).output() {
        Ok(o) if o.status.success() => Some(dir.join("fvault2-images/small")),
        Ok(o) => {
            eprintln!(
                "SKIPPED: tar -xJf failed ({}); FileVault2 golden image not checked",
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("SKIPPED: cannot run tar ({e}); FileVault2 golden image not checked");
            None
        }
    }
}

fn storage(path: &Path) -> Storage {
    let f = FileDevice::open(path, FileOptions { read_only: true, ..FileOptions::default() }).unwrap();
    Storage::new(Arc::new(f), path.to_str().unwrap())
}

fn open(s: Storage, pass: &[u8]) -> Result<volume::Volume, volume::VolumeError> {
    let p = Passphrase::new(pass.to_vec());
    let mut one = OnePassphrase::new(&p);
    let spec = Fvault2Spec { kdf_limits: Default::default() };
    volume::open_storage(s, Spec::Fvault2(spec), Keys::passphrase(&mut one), &OpenOptions::default())
}

/// A sparse copy of the image, for mangling.
fn copy(src: &Path, dst: &Path) {
    let ok = Command::new("cp").arg("--sparse=always").arg(src).arg(dst).status().unwrap();
    assert!(ok.success());
}

fn patch(path: &Path, at: u64, f: impl FnOnce(u8) -> u8) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[f(b[0])], at).unwrap();
}

#[test]
fn cryptsetups_image_dumps_and_decrypts_as_the_kernel_does() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path()) else { return };
    let s = storage(&img);
    assert_eq!(volume::probe(&s).unwrap(), Format::Fvault2);
    let d = volume::describe(&s).unwrap();
    assert_eq!(d.uuid.as_deref(), Some("fc52bfae-5a1f-4f9b-b3a6-f33303a0e401"));
    assert_eq!(volume::fvault2::dump(&*s.device, "small").unwrap(), DUMP);

    let v = open(s, PASS).unwrap();
    assert_eq!(v.kind, VolumeKind::Fvault2);
    let t = v.crypt_table().unwrap();
    assert_eq!((t.cipher.as_str(), t.offset, t.len, t.iv_offset), ("aes-xts-plain64", 131072, 327680, 0));
    assert_eq!(t.key.len(), 32, "AES-128-XTS: volume key and derived tweak key");
    let size = v.device.geometry().size;
    assert_eq!(size, 167_772_160);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    let mut off = 0;
    while off < size {
        let n = buf.len().min((size - off) as usize);
        v.device.read_at(off, &mut buf[..n]).unwrap();
        h.update(&buf[..n]);
        off += n as u64;
    }
    assert_eq!(hex::encode(h.finalize()), SHA256, "the kernel's dm-crypt reads the same bytes");
    // The logical volume holds HFS+: its volume header ("H+", version 4) at byte 1024.
    let mut hdr = [0u8; 512];
    v.device.read_at(1024, &mut hdr).unwrap();
    assert_eq!(&hdr[..4], b"H+\x00\x04");
    // Read-only whatever was asked: a write is refused with a read-only error.
    let e = v.device.write_at(0, &[0u8; 512], WriteFlags::empty()).unwrap_err();
    assert_eq!(e.kind(), blockdev::BlockErrorKind::ReadOnly, "{e}");
}

#[test]
fn a_wrong_passphrase_corrupt_metadata_and_a_truncated_image_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path()) else { return };
    let e = open(storage(&img), b"heslo124").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongKey, "{e:?}");
    assert!(format!("{:#}", anyhow_chain(&e)).contains("No key available with this passphrase."));

    // A flipped byte in the first encrypted metadata block: its checksum fails after decryption.
    let bad = dir.path().join("bad-metadata");
    copy(&img, &bad);
    patch(&bad, 2049 * 4096 + 100, |b| b ^ 0x40);
    let e = open(storage(&bad), PASS).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e:?}");
    assert!(anyhow_chain(&e).contains("encrypted metadata block: checksum mismatch"), "{}", anyhow_chain(&e));

    // A flipped byte in the volume header: no longer FileVault2 at all.
    let bad_hdr = dir.path().join("bad-header");
    copy(&img, &bad_hdr);
    patch(&bad_hdr, 200, |b| b ^ 1);
    assert_eq!(volume::probe(&storage(&bad_hdr)).unwrap(), Format::Unknown);
    let e = open(storage(&bad_hdr), PASS).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage, "{e:?}");
    assert!(anyhow_chain(&e).contains("not a valid FVAULT2 device"));

    // Cut inside the logical volume, then inside the metadata.
    for (len, what) in [(100u64 << 20, "logical volume"), (6000, "disk label")] {
        let short = dir.path().join(format!("short-{len}"));
        copy(&img, &short);
        std::fs::OpenOptions::new().write(true).open(&short).unwrap().set_len(len).unwrap();
        let e = open(storage(&short), PASS).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TooSmall, "{e:?}");
        assert!(anyhow_chain(&e).contains(&format!("the {what} ends at byte")), "{}", anyhow_chain(&e));
    }
}

#[test]
fn hostile_pbkdf2_iterations_are_refused_before_any_derivation() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path()) else { return };
    let mut params = volume::fvault2::read_params(&*storage(&img).device).unwrap();
    params.keys.pbkdf2_iterations = u32::MAX;
    let start = std::time::Instant::now();
    let e =
        volume::fvault2::unlock(&params, &Passphrase::new(PASS.to_vec()), &Default::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e:?}");
    assert!(
        anyhow_chain(&e).contains("PBKDF2 iterations 4294967295 exceed the bound"),
        "{}",
        anyhow_chain(&e)
    );
    assert!(start.elapsed().as_secs() < 5, "refused before deriving");
}

/// The error and its sources, one per line.
fn anyhow_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str("\n  ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// With `SEALDISK_WRITE_SEEDS=1`, rewrites fuzz/seeds/fvault2_metadata/ from the image: the
/// volume header, the disk label, the block holding the volume groups descriptor and the
/// decrypted metadata blocks (`golden-all.bin`), and the header with each decrypted block
/// alone. Always checks that the decrypted blocks carry valid checksums.
#[test]
fn fuzz_seeds_are_the_decrypted_golden_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path()) else { return };
    let s = storage(&img);
    let read = |off: u64, len: usize| {
        let mut b = vec![0u8; len];
        s.device.read_at(off, &mut b).unwrap();
        b
    };
    let header = read(0, 512);
    let h = formats::fvault2::VolumeHeader::decode(&header).unwrap();
    let mut all = header.clone();
    all.extend(read(4096, 2 * 8192));
    let mut singles = Vec::new();
    for i in 0..4u64 {
        let mut b = read(2049 * 4096 + i * 8192, 8192);
        sector_crypto::aes_xts_decrypt_units(h.metadata_key(), 8192, i, &mut b).unwrap();
        let crc = u32::from_le_bytes(b[..4].try_into().unwrap());
        assert_eq!(formats::fvault2::crc32c(u32::MAX, &b[8..]), crc, "block {i} decrypts to a valid block");
        let block_type = u16::from_le_bytes([b[10], b[11]]);
        all.extend(&b);
        let mut single = header.clone();
        single.extend(&b);
        singles.push((format!("block{i}-type{block_type:04x}.bin"), single));
    }
    if std::env::var_os("SEALDISK_WRITE_SEEDS").is_some() {
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/fvault2_metadata");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("golden-all.bin"), &all).unwrap();
        for (name, bytes) in singles {
            std::fs::write(out.join(name), bytes).unwrap();
        }
    }
}
