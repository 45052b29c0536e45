//! TrueCrypt volumes made by tcplay (Debian's `tcplay` 1.1) whose data the kernel's dm-crypt
//! wrote through `cryptsetup open --type tcrypt` (testdata/tcrypt, made by make-golden.sh):
//! sealdisk finds each header's KDF and cipher chain, maps the data as cryptsetup does and
//! reads what the kernel wrote; wrong passphrases, keyfiles and PIMs, a corrupted header
//! byte, a truncated image and an unmappable chain give cryptsetup's errors.
//!
//! Images are `*.img.xz`, decompressed with the `xz` tool (skipped loudly if absent).
use std::path::{Path, PathBuf};
use std::process::Command;

use formats::tcrypt::{ChainMode, HeaderFlags, TcryptError};
use sector_crypto::kdf::Passphrase;
use volume::tcrypt::{TcryptSpec, TcryptUnlocked, TcryptVolumeError};
use volume::{ErrorKind, Keys, OnePassphrase, OpenOptions, Spec, Storage, StorageOptions, VolumeError};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tcrypt")
}

/// The pattern make-golden.sh writes: byte `i` of the volume's first and last 64 KiB.
pub fn pattern(i: u64) -> u8 {
    ((i % 251) ^ (i / 4096)) as u8
}

/// Decompresses `name.img.xz` into `dir`; `None` (loudly) without `xz`.
fn image(dir: &Path, name: &str) -> Option<PathBuf> {
    let out = dir.join(format!("{name}.img"));
    let r = Command::new("xz").arg("-dc").arg(testdata().join(format!("{name}.img.xz"))).output();
    match r {
        Ok(o) if o.status.success() => {
            std::fs::write(&out, o.stdout).unwrap();
            Some(out)
        }
        _ => {
            eprintln!("SKIPPED: xz is not available to decompress {name}.img.xz");
            None
        }
    }
}

fn keyfile(name: &str) -> Passphrase {
    Passphrase::new(std::fs::read(testdata().join(name)).unwrap())
}

#[derive(Clone, Copy)]
struct Case<'a> {
    name: &'a str,
    pass: &'a str,
    keyfiles: &'a [&'a str],
    flags: HeaderFlags,
    pim: Option<u32>,
    hash: &'a str,
    chain: &'a str,
}

const NORMAL: HeaderFlags = HeaderFlags { hidden: false, system: false, backup: false };
const HIDDEN: HeaderFlags = HeaderFlags { hidden: true, system: false, backup: false };
const BACKUP: HeaderFlags = HeaderFlags { hidden: false, system: false, backup: true };
const SYSTEM: HeaderFlags = HeaderFlags { hidden: false, system: true, backup: false };

/// Each case: an image, how cryptsetup opened it in make-golden.sh (its `.table` and
/// `.dump` files are named after `name`), and what the header search must find.
const CASES: &[Case] = &[
    Case {
        name: "tc-aes-sha512",
        pass: "sealdisk-tc1",
        keyfiles: &[],
        flags: NORMAL,
        pim: None,
        hash: "sha512",
        chain: "aes",
    },
    Case {
        name: "tc-serpent-twofish-aes",
        pass: "sealdisk-tc2",
        keyfiles: &[],
        flags: NORMAL,
        pim: None,
        hash: "sha512",
        chain: "serpent-twofish-aes",
    },
    Case {
        name: "tc-keyfile-twofish-aes-ripemd160",
        pass: "sealdisk-kf",
        keyfiles: &["keyfile1", "keyfile2"],
        flags: NORMAL,
        pim: None,
        hash: "ripemd160",
        chain: "twofish-aes",
    },
    Case {
        name: "tc-hidden",
        pass: "sealdisk-outer",
        keyfiles: &[],
        flags: NORMAL,
        pim: None,
        hash: "sha512",
        chain: "aes",
    },
    Case {
        name: "tc-hidden.hidden",
        pass: "sealdisk-hidden",
        keyfiles: &[],
        flags: HIDDEN,
        pim: None,
        hash: "ripemd160",
        chain: "serpent-twofish",
    },
    Case {
        name: "vc-aes-sha512-pim",
        pass: "sealdisk-vc1",
        keyfiles: &[],
        flags: NORMAL,
        pim: Some(3),
        hash: "sha512",
        chain: "aes",
    },
    Case {
        name: "vc-keyfile-hidden",
        pass: "sealdisk-vc2",
        keyfiles: &["keyfile1"],
        flags: NORMAL,
        pim: Some(1),
        hash: "sha512",
        chain: "aes",
    },
    Case {
        name: "vc-keyfile-hidden.hidden",
        pass: "sealdisk-vc2-hidden",
        keyfiles: &["keyfile1"],
        flags: HIDDEN,
        pim: Some(1),
        hash: "sha512",
        chain: "aes",
    },
    Case {
        name: "vc-system",
        pass: "sealdisk-vc3",
        keyfiles: &[],
        flags: SYSTEM,
        pim: Some(2),
        hash: "sha256",
        chain: "aes",
    },
];

/// The passphrase of `src` and the keyfiles named.
fn keys<'a>(src: &'a mut OnePassphrase<'_>, keyfiles: &[&str]) -> Keys<'a> {
    Keys::passphrase(src).with_keyfiles(keyfiles.iter().map(|k| keyfile(k)).collect())
}

fn spec(flags: HeaderFlags, pim: Option<u32>, hash: Option<&str>) -> TcryptSpec {
    TcryptSpec { flags, pim, hash: hash.map(str::to_owned), ..TcryptSpec::default() }
}

fn storage(path: &Path, read_only: bool) -> Storage {
    volume::storage::open(path.to_str().unwrap(), &StorageOptions { read_only, ..Default::default() })
        .unwrap()
}

fn unlock(
    path: &Path,
    pass: &str,
    keyfiles: &[&str],
    flags: HeaderFlags,
    pim: Option<u32>,
    hash: Option<&str>,
) -> Result<TcryptUnlocked, VolumeError> {
    let p = Passphrase::new(pass.as_bytes().to_vec());
    let mut src = OnePassphrase::new(&p);
    let spec = spec(flags, pim, hash);
    volume::tcrypt::unlock(&spec, &mut keys(&mut src, keyfiles), &storage(path, true))
}

fn unlock_truecrypt(
    path: &Path,
    pass: &str,
    keyfiles: &[&str],
    hash: &str,
) -> Result<TcryptUnlocked, VolumeError> {
    let p = Passphrase::new(pass.as_bytes().to_vec());
    let mut src = OnePassphrase::new(&p);
    let mut spec = spec(NORMAL, None, Some(hash));
    spec.veracrypt = false;
    volume::tcrypt::unlock(&spec, &mut keys(&mut src, keyfiles), &storage(path, true))
}

fn open(path: &Path, c: &Case, read_only: bool) -> volume::Volume {
    let p = Passphrase::new(c.pass.as_bytes().to_vec());
    let mut src = OnePassphrase::new(&p);
    let spec = spec(c.flags, c.pim, Some(c.hash));
    volume::open_storage(
        storage(path, read_only),
        Spec::Tcrypt(spec),
        keys(&mut src, c.keyfiles),
        &OpenOptions { read_only, ..Default::default() },
    )
    .unwrap()
}

fn image_of(dir: &Path, case: &str) -> Option<PathBuf> {
    image(dir, case.split('.').next().unwrap())
}

fn check_pattern(vol: &volume::Volume, what: &str) {
    check_start(vol, what);
    let size = vol.device.geometry().size;
    let mut buf = vec![0u8; 65536];
    vol.device.read_at(size - 65536, &mut buf).unwrap();
    assert!(
        buf.iter().enumerate().all(|(i, b)| *b == pattern(size - 65536 + i as u64)),
        "{what}: last 64 KiB"
    );
}

fn check_start(vol: &volume::Volume, what: &str) {
    let mut buf = vec![0u8; 65536];
    vol.device.read_at(0, &mut buf).unwrap();
    assert!(buf.iter().enumerate().all(|(i, b)| *b == pattern(i as u64)), "{what}: first 64 KiB");
}

/// `dmsetup table --showkeys` lines of the kernel's mapping, `tc` (top) first.
fn kernel_tables(name: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(testdata().join(format!("{name}.table"))).unwrap();
    let mut lines: Vec<Vec<String>> =
        text.lines().map(|l| l.split_whitespace().map(str::to_owned).collect()).collect();
    lines.sort_by(|a, b| a[0].cmp(&b[0]));
    lines
}

#[test]
fn tcplay_and_veracrypt_volumes_map_as_the_kernel_did_and_read_its_data() {
    let dir = tempfile::tempdir().unwrap();
    for c in CASES {
        let Some(img) = image_of(dir.path(), c.name) else { return };
        let u = unlock(&img, c.pass, c.keyfiles, c.flags, c.pim, None).unwrap();
        assert_eq!((u.chain.name, u.kdf.hash), (c.chain, c.hash), "{}", c.name);
        let vol = open(&img, c, true);
        // Every layer as the kernel's table: length, cipher, key, IV offset, data offset.
        let kernel = kernel_tables(c.name);
        let ours: Vec<_> = vol
            .layers
            .iter()
            .rev()
            .map(|l| match l {
                volume::LayerTable::Crypt(t) => t.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(kernel.len(), ours.len(), "{}: layer count", c.name);
        for (k, t) in kernel.iter().zip(&ours) {
            assert_eq!(k[2], t.len.to_string(), "{}: length", c.name);
            assert_eq!(k[4], t.cipher, "{}: cipher", c.name);
            assert_eq!(k[5], hex::encode(&t.key[..]), "{}: key of {}", c.name, t.cipher);
            assert_eq!(k[6], t.iv_offset.to_string(), "{}: iv offset", c.name);
            assert_eq!(k[8], t.offset.to_string(), "{}: offset", c.name);
        }
        // The end of an outer volume is the hidden volume, written after it.
        let outer = CASES.iter().any(|h| h.name == format!("{}.hidden", c.name));
        if outer {
            check_start(&vol, c.name);
        } else {
            check_pattern(&vol, c.name);
        }
    }
}

#[test]
fn whirlpool_header_made_by_tcplay_unlocks() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path(), "tc-whirlpool-aes-serpent") else { return };
    let u = unlock(&img, "sealdisk-tc4", &[], NORMAL, None, Some("whirlpool")).unwrap();
    assert_eq!((u.chain.name, u.kdf.hash, u.kdf.iterations), ("aes-serpent", "whirlpool", 1000));
}

#[test]
fn writes_read_back_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let c = &CASES[1];
    let Some(img) = image_of(dir.path(), c.name) else { return };
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 256) as u8).collect();
    {
        let vol = open(&img, c, false);
        vol.device.write_at(65536, &data, Default::default()).unwrap();
        vol.device.flush().unwrap();
    }
    let vol = open(&img, c, true);
    let mut back = vec![0u8; data.len()];
    vol.device.read_at(65536, &mut back).unwrap();
    assert_eq!(back, data);
    check_pattern(&vol, "after a write elsewhere");
}

fn kind(e: VolumeError) -> (ErrorKind, String) {
    let text = format!("{e:?}");
    (e.kind(), text)
}

#[test]
fn bad_input_gets_cryptsetups_errors() {
    let dir = tempfile::tempdir().unwrap();
    let Some(img) = image(dir.path(), "tc-aes-sha512") else { return };
    let Some(vc) = image(dir.path(), "vc-aes-sha512-pim") else { return };
    // Wrong passphrase; wrong PIM; a missing keyfile: no header (exit code 2).
    // (TrueCrypt KDFs only where the volume is TrueCrypt's: the VeraCrypt counts would
    // only add seconds.)
    let (k, _) = kind(unlock_truecrypt(&img, "wrong", &[], "sha512").unwrap_err());
    assert_eq!(k, ErrorKind::WrongKey);
    let (k, _) = kind(unlock(&vc, "sealdisk-vc1", &[], NORMAL, Some(4), Some("sha512")).unwrap_err());
    assert_eq!(k, ErrorKind::WrongKey);
    let Some(kf) = image(dir.path(), "tc-keyfile-twofish-aes-ripemd160") else { return };
    let (k, _) = kind(unlock_truecrypt(&kf, "sealdisk-kf", &["keyfile1"], "ripemd160").unwrap_err());
    assert_eq!(k, ErrorKind::WrongKey);
    // --disable-veracrypt: a VeraCrypt header is not found.
    {
        let p = Passphrase::new(b"sealdisk-vc1".to_vec());
        let mut src = OnePassphrase::new(&p);
        let mut s = spec(NORMAL, None, Some("sha512"));
        s.veracrypt = false;
        let e = volume::tcrypt::unlock(&s, &mut keys(&mut src, &[]), &storage(&vc, true)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongKey);
    }
    // A damaged key area: the magic decrypts, the key CRC does not match (exit code 1).
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[64 + 300] ^= 0x40;
    let bad = dir.path().join("bad-keys.img");
    std::fs::write(&bad, &bytes).unwrap();
    let e = unlock(&bad, "sealdisk-tc1", &[], NORMAL, None, Some("sha512")).unwrap_err();
    assert!(
        matches!(
            &e,
            VolumeError::Tcrypt { source: TcryptVolumeError::Header(TcryptError::KeysCrc { .. }), .. }
        ),
        "{e:?}"
    );
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    // ... and the backup header at the end still opens it, with the same data.
    let c = Case { flags: BACKUP, ..CASES[0] };
    let vol = open(&bad, &c, true);
    check_pattern(&vol, "through the backup header");
    // A damaged header field: header CRC.
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[64 + 40] ^= 1;
    std::fs::write(&bad, &bytes).unwrap();
    let e = unlock(&bad, "sealdisk-tc1", &[], NORMAL, None, Some("sha512")).unwrap_err();
    assert!(
        matches!(
            &e,
            VolumeError::Tcrypt { source: TcryptVolumeError::Header(TcryptError::HeaderCrc { .. }), .. }
        ),
        "{e:?}"
    );
    // A truncated image: the header opens, the data area is outside the device.
    let bytes = std::fs::read(&img).unwrap();
    std::fs::write(&bad, &bytes[..600 * 1024]).unwrap();
    let u = unlock(&bad, "sealdisk-tc1", &[], NORMAL, None, Some("sha512")).unwrap();
    let e = volume::tcrypt::layout(&u, 600 * 1024).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e:?}");
    let p = Passphrase::new(b"sealdisk-tc1".to_vec());
    let mut src = OnePassphrase::new(&p);
    let s = spec(NORMAL, None, Some("sha512"));
    let e = volume::open_storage(
        storage(&bad, true),
        Spec::Tcrypt(s),
        keys(&mut src, &[]),
        &OpenOptions { read_only: true, ..Default::default() },
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    // Too small for a backup header.
    std::fs::write(&bad, &bytes[..4096]).unwrap();
    let e = unlock(&bad, "sealdisk-tc1", &[], BACKUP, None, Some("sha512")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooSmall);
    // An unmappable legacy chain (cascaded CBC): the header would open, the data cannot.
    let mut u = unlock(&img, "sealdisk-tc1", &[], NORMAL, None, Some("sha512")).unwrap();
    u.chain = formats::tcrypt::find_chain("aes-twofish-serpent", ChainMode::CbciTcrypt).unwrap();
    let e = volume::tcrypt::assemble(
        &u,
        storage(&img, true),
        Default::default(),
        &OpenOptions { read_only: true, ..Default::default() },
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e:?}");
    // --tcrypt-hidden with --allow-discards is refused before anything is read.
    let p = Passphrase::new(b"x".to_vec());
    let mut src = OnePassphrase::new(&p);
    let mut s = spec(HIDDEN, None, None);
    s.options.allow_discards = true;
    let e = volume::open_storage(
        storage(&img, true),
        Spec::Tcrypt(s),
        keys(&mut src, &[]),
        &OpenOptions { read_only: true, ..Default::default() },
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Usage);
}
