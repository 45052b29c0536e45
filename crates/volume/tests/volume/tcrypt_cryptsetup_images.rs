//! TrueCrypt and VeraCrypt volumes from cryptsetup's test suite (testdata/tcrypt/cryptsetup),
//! made by TrueCrypt/VeraCrypt for that suite, each holding a FAT filesystem whose serial
//! cryptsetup's `tcrypt-compat-test` checks after `tcryptOpen` (`blkid` UUID `DEAD-BABE`).
//!
//! * The Kuznyechik chains, which Linux cannot map (it has no kuznyechik cipher): the
//!   evidence that sealdisk decrypts them right is VeraCrypt's own output. The camellia
//!   image is the control (a chain the kernel maps, same maker, same check).
//! * TrueCrypt < 5 volumes (`cbc-tcw`, `lrw-benbi`), whose headers leave the volume size 0:
//!   mapped over the rest of the device, as cryptsetup does.
//! * The legacy cascades the kernel cannot map (`cbci-tcrypt`, blowfish `cbc-tcrypt`): the
//!   header opens (tcryptDump works), the mapping is refused as cryptsetup refuses it.
use std::path::{Path, PathBuf};
use std::process::Command;

use formats::tcrypt::HeaderFlags;
use sector_crypto::kdf::Passphrase;
use volume::tcrypt::TcryptSpec;
use volume::tcrypt::TcryptVolumeError;
use volume::{Keys, OnePassphrase, OpenOptions, Spec, StorageOptions};

/// cryptsetup's tests/tcrypt-compat-test: `PASSWORD`.
const PASSWORD: &str = "aaaaaaaaaaaa";

fn image(dir: &Path, name: &str) -> Option<PathBuf> {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../testdata/tcrypt/cryptsetup/{name}.img.xz"));
    let out = dir.join(name);
    match Command::new("xz").arg("-dc").arg(&src).output() {
        Ok(o) if o.status.success() => {
            std::fs::write(&out, o.stdout).unwrap();
            Some(out)
        }
        _ => {
            eprintln!("SKIPPED: xz is not available to decompress {}", src.display());
            None
        }
    }
}

fn open(path: &Path, pass: &str, cipher: Option<&str>) -> Result<volume::Volume, volume::VolumeError> {
    open_with(path, pass, "sha512", cipher)
}

fn open_with(
    path: &Path,
    pass: &str,
    hash: &str,
    cipher: Option<&str>,
) -> Result<volume::Volume, volume::VolumeError> {
    let p = Passphrase::new(pass.as_bytes().to_vec());
    let mut src = OnePassphrase::new(&p);
    let spec = TcryptSpec {
        hash: Some(hash.into()),
        cipher: cipher.map(str::to_owned),
        flags: HeaderFlags { hidden: false, system: false, backup: false },
        ..TcryptSpec::default()
    };
    let storage = volume::storage::open(
        path.to_str().unwrap(),
        &StorageOptions { read_only: true, ..Default::default() },
    )
    .unwrap();
    let opts = OpenOptions { read_only: true, ..Default::default() };
    volume::open_storage(storage, Spec::Tcrypt(spec), Keys::passphrase(&mut src), &opts)
}

/// The FAT boot sector's volume serial (`blkid`'s UUID), FAT12/16 or FAT32 layout.
fn fat_serial(boot: &[u8]) -> Option<String> {
    if boot[510..512] != [0x55, 0xaa] {
        return None;
    }
    let at = if &boot[82..87] == b"FAT32" {
        67
    } else if &boot[54..57] == b"FAT" {
        39
    } else {
        return None;
    };
    let s = u32::from_le_bytes(boot[at..at + 4].try_into().unwrap());
    Some(format!("{:04X}-{:04X}", s >> 16, s & 0xffff))
}

#[test]
fn veracrypt_kuznyechik_chains_decrypt_to_veracrypts_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    // (image, the chain cryptsetup names it, its layers top first as dm-crypt specs)
    let cases: &[(&str, &str, &[&str])] = &[
        ("vc_1-sha512-xts-camellia", "camellia", &["camellia-xts-plain64"]),
        ("vc_1-sha512-xts-kuznyechik", "kuznyechik", &["kuznyechik-xts-plain64"]),
        (
            "vc_1-sha512-xts-kuznyechik-camellia",
            "kuznyechik-camellia",
            &["kuznyechik-xts-plain64", "camellia-xts-plain64"],
        ),
        (
            "vc_1-sha512-xts-camellia-serpent-kuznyechik",
            "camellia-serpent-kuznyechik",
            &["camellia-xts-plain64", "serpent-xts-plain64", "kuznyechik-xts-plain64"],
        ),
    ];
    for (name, chain, layers) in cases {
        let Some(img) = image(dir.path(), name) else { return };
        // The first cipher of the chain, as cryptsetup's test passes `-c` (cut -d- -f5).
        let first = chain.split('-').next().unwrap();
        let vol = open(&img, PASSWORD, Some(first)).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_chain_and_filesystem(&vol, layers, name);
    }
    // The whole search (no -c) finds the Kuznyechik chain too; a wrong passphrase finds none.
    let Some(img) = image(dir.path(), "vc_1-sha512-xts-kuznyechik-camellia") else { return };
    let vol = open(&img, PASSWORD, None).unwrap();
    assert_eq!(vol.layers.len(), 2);
    let e = open(&img, "aaaaaaaaaaab", None).unwrap_err();
    assert_eq!(e.kind(), volume::ErrorKind::WrongKey, "{e:?}");
}

#[test]
fn truecrypt_legacy_volumes_map_as_cryptsetup_maps_them() {
    let dir = tempfile::tempdir().unwrap();
    // The `tc_` images name a cascade in TrueCrypt's order, the reverse of cryptsetup's chain
    // names: `serpent-twofish-aes` here is the chain `aes-twofish-serpent` (aes on top).
    // (image, its layers top first; empty: the kernel cannot map the chain)
    let cases: &[(&str, &[&str])] = &[
        ("tc_1-sha1-cbc-aes", &["aes-cbc-tcw"]),
        ("tc_1-sha1-cbc-cast5", &["cast5-cbc-tcw"]),
        ("tc_2-ripemd160-lrw-aes", &["aes-lrw-benbi"]),
        (
            "tc_2-ripemd160-lrw-serpent-twofish-aes",
            &["aes-lrw-benbi", "twofish-lrw-benbi", "serpent-lrw-benbi"],
        ),
        (
            "tc_3-ripemd160-xts-serpent-twofish-aes",
            &["aes-xts-plain64", "twofish-xts-plain64", "serpent-xts-plain64"],
        ),
        ("tc_2-ripemd160-cbc-aes-twofish-serpent", &[]),
        ("tc_2-ripemd160-cbc-aes-blowfish", &[]),
    ];
    for (name, layers) in cases {
        let Some(img) = image(dir.path(), name) else { return };
        // cryptsetup's test passes `-h` and `-c` from the name (cut -d- -f3, -f5).
        let parts: Vec<&str> = name.split('-').collect();
        let r = open_with(&img, PASSWORD, parts[1], Some(parts[3]));
        if layers.is_empty() {
            let e = r.err().unwrap_or_else(|| panic!("{name}: mapped a legacy cascade"));
            assert!(
                matches!(
                    &e,
                    volume::VolumeError::Tcrypt { source: TcryptVolumeError::LegacyMode { .. }, .. }
                ),
                "{name}: {e:?}"
            );
            assert_eq!(e.kind(), volume::ErrorKind::Unsupported);
            continue;
        }
        let vol = r.unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_chain_and_filesystem(&vol, layers, name);
    }
    // A --cipher that names no chain: refused before any passphrase is tried (cryptsetup: exit 1).
    let Some(img) = image(dir.path(), "tc_1-sha1-cbc-aes") else { return };
    let e = open_with(&img, PASSWORD, "sha1", Some("xxx")).unwrap_err();
    assert_eq!(e.kind(), volume::ErrorKind::Usage, "{e:?}");
}

/// The volume maps `layers` (cipher specs, top layer first) and its first sector is the FAT
/// filesystem the image's maker wrote.
fn assert_chain_and_filesystem(vol: &volume::Volume, layers: &[&str], name: &str) {
    let ciphers: Vec<&str> = vol
        .layers
        .iter()
        .rev()
        .map(|l| match l {
            volume::LayerTable::Crypt(t) => t.cipher.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ciphers, layers, "{name}: layers");
    let mut boot = vec![0u8; 512];
    vol.device.read_at(0, &mut boot).unwrap();
    assert_eq!(fat_serial(&boot).as_deref(), Some("DEAD-BABE"), "{name}: the filesystem its maker wrote");
}
