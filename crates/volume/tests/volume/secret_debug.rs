//! No `Debug` rendering of any key-holding type carries key bytes (issue 10, "Secrets in
//! memory"). Every type that holds a volume key, passphrase, derived key, MAC or journal
//! key is built with one distinctive key and rendered with `{:?}` and `{:#?}`; none of the
//! renderings may contain the key in lowercase or uppercase hex, base64, a decimal byte
//! list, escaped bytes, or (for the passphrase) as text. `IntegrityParams` printed its keys
//! as byte lists before this test existed.

use std::fmt::Debug;

use base64::Engine;
use blockdev::{FileDevice, FileOptions, MemDevice};
use formats::dm::{CryptOptions, CryptTable};
use sector_crypto::kdf::{HashAlg, Kdf, Passphrase};
use sector_crypto::secure::SecretBuf;
use sector_crypto::tag::TagHash;
use sector_crypto::{AeadSectorCipher, AeadSpec, CipherSpec, SectorCipher, SectorParams, VolumeKey};
use targets::integrity::{JournalCipher, JournalCryptSpec};
use volume::integrity::IntegrityParams;
use volume::luks::{self, FormatParams, LuksIntegrity, LuksVersion, OpenParams, PbkdfParams, PbkdfType};
use volume::plain::PlainParams;

/// 64 distinctive bytes (0xa5, 0x5b, ...: no two XTS halves alike).
fn key() -> Vec<u8> {
    (0..64u8).map(|i| 0xa5 ^ i.wrapping_mul(0x3b)).collect()
}

const PASSPHRASE: &str = "Passphrase-DebugLeak-7Q2x";

/// The forms in which `secret` could show up in text: every 4-byte window in hex (both
/// cases), as decimal lists (with and without spaces), as escaped bytes, and base64 of the
/// whole and of its prefix.
fn needles(secret: &[u8]) -> Vec<String> {
    let mut n = Vec::new();
    for w in secret.windows(4) {
        let hex: String = w.iter().map(|b| format!("{b:02x}")).collect();
        n.push(hex.to_uppercase());
        n.push(hex);
        n.push(w.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", "));
        n.push(w.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(","));
        n.push(w.iter().map(|b| format!("\\x{b:02x}")).collect());
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    n.push(b64.encode(secret));
    n.push(b64.encode(&secret[..secret.len() / 3 * 3]).chars().take(16).collect());
    n
}

fn assert_no_secret(what: &str, value: &dyn Debug, secrets: &[Vec<u8>]) {
    for text in [format!("{value:?}"), format!("{value:#?}")] {
        for s in secrets {
            for needle in needles(s) {
                assert!(!text.contains(&needle), "{what}'s Debug shows key material ({needle}):\n{text}");
            }
        }
        if let Ok(p) = std::str::from_utf8(secrets.last().unwrap()) {
            assert!(!text.contains(p), "{what}'s Debug shows the passphrase:\n{text}");
        }
    }
}

fn cheap_pbkdf() -> PbkdfParams {
    PbkdfParams {
        kind: Some(PbkdfType::Pbkdf2),
        hash: HashAlg::Sha256,
        iter_time: std::time::Duration::from_millis(10),
        force_iterations: Some(1000),
        memory_kib: None,
        parallel: None,
    }
}

#[test]
fn no_debug_output_shows_key_bytes() {
    let k = key();
    let secrets = vec![k.clone(), k[..32].to_vec(), k[32..].to_vec(), PASSPHRASE.as_bytes().to_vec()];
    let check = |what: &str, v: &dyn Debug| assert_no_secret(what, v, &secrets);
    // The checker itself catches plain renderings (so this test can fail).
    for leaky in [format!("{k:?}"), hex::encode(&k), hex::encode_upper(&k[40..]), PASSPHRASE.to_string()] {
        let caught = std::panic::catch_unwind(|| assert_no_secret("leaky", &leaky, &secrets));
        assert!(caught.is_err(), "the checker missed {leaky}");
    }

    // sector-crypto secret types.
    let vk = VolumeKey::new(k.clone());
    check("VolumeKey", &vk);
    let pass = Passphrase::new(PASSPHRASE.as_bytes().to_vec());
    check("Passphrase", &pass);
    check("SecretBuf", &SecretBuf::from_slice(&k));
    let derived = Kdf::Pbkdf2 { hash: HashAlg::Sha256, iterations: 1000 }
        .derive(PASSPHRASE.as_bytes(), b"salt", 64)
        .unwrap();
    let derived_bytes = derived.to_vec();
    check("KDF output", &derived);
    let split = sector_crypto::af::split(&k, 4, HashAlg::Sha256).unwrap();
    check("AF split material", &split);
    let params = SectorParams { sector_size: 512, iv_offset: 0, iv_large_sectors: false };
    for spec in ["aes-xts-plain64", "aes-cbc-essiv:sha256", "aes-ecb"] {
        let s: CipherSpec = spec.parse().unwrap();
        let key_len = if spec.contains("xts") { 64 } else { 32 };
        let c = SectorCipher::new(&s, &VolumeKey::from_slice(&k[..key_len]), params).unwrap();
        check(spec, &c);
    }
    let aead: AeadSpec = "capi:authenc(hmac(sha256),xts(aes))-plain64".parse().unwrap();
    let mut mac_key = k.clone();
    mac_key.extend_from_slice(&k[..32]);
    let a = AeadSectorCipher::new(&aead, &VolumeKey::new(mac_key), params, 32).unwrap();
    check("AeadSectorCipher authenc", &a);
    let gcm: AeadSpec = "capi:gcm(aes)-random".parse().unwrap();
    check(
        "AeadSectorCipher gcm",
        &AeadSectorCipher::new(&gcm, &VolumeKey::from_slice(&k[..32]), params, 28).unwrap(),
    );
    check("TagHash", &TagHash::new("hmac(sha256)", Some(&k)).unwrap());

    // formats and targets.
    let table = CryptTable {
        len: 2048,
        cipher: "aes-xts-plain64".into(),
        key: zeroize::Zeroizing::new(k.clone()),
        iv_offset: 0,
        device: "/dev/null".into(),
        offset: 0,
        options: CryptOptions::default(),
    };
    check("CryptTable", &table);
    let target =
        volume::crypt_over(MemDevice::new(1 << 20, 512), &table, &volume::OpenOptions::default()).unwrap();
    check("CryptTarget", &target);
    check(
        "JournalCryptSpec",
        &JournalCryptSpec { cipher: JournalCipher::CtrAes, key: SecretBuf::from_slice(&k[..32]) },
    );

    // volume parameter types.
    let ip = IntegrityParams {
        integrity: "hmac-sha256".into(),
        key: Some(SecretBuf::from_slice(&k)),
        journal_integrity: Some("hmac-sha256".into()),
        journal_integrity_key: Some(SecretBuf::from_slice(&k)),
        journal_crypt: Some("ctr-aes".into()),
        journal_crypt_key: Some(SecretBuf::from_slice(&k[..32])),
        ..IntegrityParams::default()
    };
    check("IntegrityParams", &ip);
    check("IntegrityConfig", &ip.config().unwrap());
    let plain = PlainParams {
        cipher: "aes-xts-plain64".into(),
        key: VolumeKey::from_slice(&k),
        offset: 0,
        skip: 0,
        size: None,
        options: CryptOptions::default(),
    };
    check("PlainParams", &plain);

    // LUKS: format with this volume key, unlock, assemble.
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("luks.img");
    let fp = FormatParams {
        version: LuksVersion::V2,
        pbkdf: cheap_pbkdf(),
        volume_key: Some(VolumeKey::from_slice(&k)),
        ..FormatParams::default()
    };
    check("FormatParams", &fp);
    {
        let dev = FileDevice::create(&img, 20 << 20, FileOptions::default()).unwrap();
        let (l, vk) = luks::format(&dev, &fp, &pass).unwrap();
        check("Luks", &l);
        check("format's VolumeKey", &vk);
        let unlocked = l.unlock(&dev, &pass, None).unwrap();
        check("unlock result", &unlocked);
    }
    let op = OpenParams::new(img.to_str().unwrap());
    check("OpenParams", &op);
    let opened = luks::open(&op, &pass).unwrap();
    assert_eq!(&opened.volume.crypt_table().unwrap().key[..], &k[..], "the volume really holds the key");
    check("luks::Opened", &opened);
    drop(opened);

    // LUKS2 authenticated encryption (aes-xts-plain64 + hmac-sha256 over dm-integrity):
    // the opened stack is an AeadCryptTarget over an IntegrityTarget.
    let img = dir.path().join("aead.img");
    let spec = AeadSpec::from_luks2("aes-xts-plain64", "hmac-sha256").unwrap();
    let i = LuksIntegrity { spec, no_wipe: true, no_journal: true, journal_size: None };
    let mut vk_aead = k.clone();
    vk_aead.extend_from_slice(&k[..32]);
    let fp = FormatParams {
        version: LuksVersion::V2,
        cipher: "aes-xts-plain64".into(),
        key_bytes: 96,
        pbkdf: cheap_pbkdf(),
        volume_key: Some(VolumeKey::from_slice(&vk_aead)),
        integrity: Some(i),
        ..FormatParams::default()
    };
    check("FormatParams (integrity)", &fp);
    {
        let dev = FileDevice::create(&img, 24 << 20, FileOptions::default()).unwrap();
        let (l, vk) = luks::format(&dev, &fp, &pass).unwrap();
        let data = FileDevice::open(&img, FileOptions::default()).unwrap();
        luks::format_integrity(data, &l, &vk, &i, |_, _| {}).unwrap();
    }
    let opened = luks::open(&OpenParams::new(img.to_str().unwrap()), &pass).unwrap();
    check("luks::Opened (authenticated)", &opened);

    // The derived key must not leak either (checked against itself).
    assert_no_secret("KDF output (own bytes)", &derived, &[derived_bytes]);
}
