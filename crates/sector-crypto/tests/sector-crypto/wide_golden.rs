//! Adiantum and ESSIV with the hashes beyond sha256, against images the real kernel
//! wrote (Linux dm-crypt through kernel-run; `testdata/wide/make-golden.sh`, transcript in
//! `testdata/wide/boot.log`): each is 64 KiB that the kernel's dm-crypt encrypted from
//! `pattern.bin` with the given table; sealdisk decrypts it to the pattern, and encrypting
//! the pattern gives the kernel's bytes back. Also: the cipher specifications parse, print
//! back as written, and refuse what the kernel refuses. (HCTR2 has no kernel image: Debian's
//! kernels are built without it; its known answers are in `src/wide/tests.rs`.)

use std::path::{Path, PathBuf};
use std::process::Command;

use sector_crypto::{ChainMode, Cipher, CipherSpec, CryptoError, SectorCipher, SectorParams, VolumeKey};
use sha2::{Digest, Sha256};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/wide")
}

/// (image, cipher, key file, sector size, iv_offset): the `CASES` of make-golden.sh.
const CASES: &[(&str, &str, &str, u32, u64)] = &[
    ("plain-adiantum12-s512", "xchacha12,aes-adiantum-plain64", "key32.bin", 512, 0),
    ("plain-adiantum20-s512-ivoff", "xchacha20,aes-adiantum-plain64", "key32.bin", 512, 1000),
    ("plain-adiantum12-capi-s4096", "capi:adiantum(xchacha12,aes)-plain64", "key32.bin", 4096, 0),
    ("plain-essiv-md5", "aes-cbc-essiv:md5", "key32.bin", 512, 0),
    ("plain-essiv-sha3-256", "aes-cbc-essiv:sha3-256", "key32.bin", 512, 0),
    ("plain-essiv-md4", "aes-cbc-essiv:md4", "key16.bin", 512, 0),
    ("plain-essiv-blake2b-256", "aes-cbc-essiv:blake2b-256", "key32.bin", 512, 0),
    ("plain-essiv-streebog256", "aes-cbc-essiv:streebog256", "key32.bin", 512, 0),
    ("plain-essiv-wp256", "aes-cbc-essiv:wp256", "key32.bin", 512, 0),
];

/// The image decompressed, or `None` (skipped loudly) without xz.
fn image(name: &str) -> Option<Vec<u8>> {
    match Command::new("xz").arg("-dc").arg(dir().join(format!("{name}.img.xz"))).output() {
        Ok(o) if o.status.success() => Some(o.stdout),
        Ok(o) => panic!("xz -dc {name}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: cannot run xz ({e})");
            None
        }
    }
}

fn cipher(spec: &str, key: &str, sector_size: u32, iv_offset: u64) -> SectorCipher {
    let spec: CipherSpec = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let key = VolumeKey::new(std::fs::read(dir().join(key)).unwrap());
    SectorCipher::new(&spec, &key, SectorParams { sector_size, iv_offset, iv_large_sectors: false })
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
}

#[test]
fn kernel_made_wide_block_and_essiv_images_decrypt_to_the_pattern() {
    let pattern = std::fs::read(dir().join("pattern.bin")).unwrap();
    let log = std::fs::read_to_string(dir().join("boot.log")).unwrap();
    for &(name, spec, key, ss, ivoff) in CASES {
        // The kernel read back exactly the pattern through its own mapping.
        let sha = log.lines().find_map(|l| l.strip_prefix(&format!("SHA {name} "))).expect(name);
        assert_eq!(sha, hex::encode(Sha256::digest(&pattern)), "{name}: the kernel read back something else");
        let Some(img) = image(name) else { return };
        assert_eq!(img.len(), pattern.len(), "{name}");
        let c = cipher(spec, key, ss, ivoff);
        let mut plain = img.clone();
        c.decrypt(0, &mut plain).unwrap();
        assert!(plain == pattern, "{name}: decrypts to something else than the kernel's pattern");
        let mut enc = pattern.clone();
        c.encrypt(0, &mut enc).unwrap();
        assert!(enc == img, "{name}: encrypting the pattern differs from the kernel's bytes");
        // The wrong iv_offset or key does not decrypt it.
        let mut other = img.clone();
        cipher(spec, key, ss, ivoff + u64::from(ss / 512)).decrypt(0, &mut other).unwrap();
        assert!(other[..ss as usize] != pattern[..ss as usize], "{name}: iv_offset ignored");
    }
}

#[test]
fn wide_block_specs_parse_and_print_back() {
    for (s, cipher, mode, bits) in [
        ("xchacha12,aes-adiantum-plain64", Cipher::XChaCha12Aes, ChainMode::Adiantum, 256),
        ("xchacha20,aes-adiantum-plain64", Cipher::XChaCha20Aes, ChainMode::Adiantum, 256),
        ("capi:adiantum(xchacha12,aes)-plain64", Cipher::XChaCha12Aes, ChainMode::Adiantum, 256),
        ("capi:adiantum(xchacha20,aes)-plain", Cipher::XChaCha20Aes, ChainMode::Adiantum, 256),
        ("aes-hctr2-plain64", Cipher::Aes, ChainMode::Hctr2, 256),
        ("capi:hctr2(aes)-plain64", Cipher::Aes, ChainMode::Hctr2, 256),
    ] {
        let spec: CipherSpec = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!((spec.cipher(), spec.mode()), (cipher, mode), "{s}");
        assert_eq!(spec.to_string(), s);
        assert_eq!(spec.iv_size(), 32, "{s}");
        assert_eq!(spec.default_key_bits(), bits, "{s}");
    }
    let hctr2: CipherSpec = "aes-hctr2-plain64".parse().unwrap();
    assert_eq!(hctr2.valid_key_sizes(), &[16, 24, 32]);
    assert_eq!(hctr2.crypto_api_name(), "hctr2(aes)");
    let adiantum: CipherSpec = "xchacha12,aes-adiantum-plain64".parse().unwrap();
    assert_eq!(adiantum.valid_key_sizes(), &[32]);
    assert_eq!(adiantum.crypto_api_name(), "adiantum(xchacha12,aes)");
    let p = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    assert!(matches!(
        SectorCipher::new(&adiantum, &VolumeKey::new(vec![0; 64]), p),
        Err(CryptoError::InvalidKeySize { bits: 512, .. })
    ));
}

#[test]
fn what_the_kernel_refuses_is_refused() {
    for (s, invalid) in [
        ("aes-adiantum-plain64", true),                // adiantum needs xchacha*,aes
        ("xchacha12,aes-xts-plain64", true),           // the pair is Adiantum's only
        ("serpent-hctr2-plain64", false),              // the kernel takes it; only aes here
        ("blowfish-hctr2-plain64", true),              // hctr2 needs 128-bit blocks
        ("xchacha12,aes-adiantum-essiv:sha256", true), // IV size != block size
        ("aes-hctr2-eboiv", true),
        ("xchacha12,aes-adiantum-benbi", false), // kernel accepts; not implemented
        ("aes-cbc-essiv:sha1", true),            // a 20-byte ESSIV key is no AES key
        ("aes-cbc-essiv:sha512", true),          // nor a 64-byte one
        ("aes-cbc-essiv:whirlpool", false),      // the kernel's name is wp512
    ] {
        match s.parse::<CipherSpec>() {
            Err(CryptoError::InvalidSpec { .. }) if invalid => {}
            Err(CryptoError::Unsupported { .. }) if !invalid => {}
            other => panic!("{s}: {other:?}"),
        }
    }
}
