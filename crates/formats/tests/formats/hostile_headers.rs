//! Hostile images (issue 10): a header that claims huge sizes or counts is refused by the
//! decoder with an error naming the field, before anything is sized by it. Each case
//! mangles one field of a valid header. The bounds are in `formats::limits`.
//!
//! LUKS2 JSON cases (key sizes, object ids) are in `luks2_malformed.rs`, beside the other
//! crafted LUKS2 headers; the KDF costs are checked at unlock (`volume/tests/hostile_images.rs`).

use formats::dm::{CryptTable, TableError};
use formats::integrity::{DeviceParams, FormatParams, Layout, LayoutError};
use formats::limits;
use formats::luks1::{self, Luks1Error, Luks1Header};

/// A valid LUKS1 phdr (64-byte key, detached header so the payload checks do not apply).
fn luks1_bytes() -> Vec<u8> {
    let (offsets, _) = luks1::standard_keyslot_layout(64);
    let h = Luks1Header {
        cipher_name: "aes".into(),
        cipher_mode: "xts-plain64".into(),
        hash_spec: "sha256".into(),
        payload_offset: 0,
        key_bytes: 64,
        mk_digest: [1; 20],
        mk_digest_salt: [2; 32],
        mk_digest_iterations: 1000,
        uuid: "0d1a6a5b-4f3c-4a8e-9f49-9a1b7d2d7e11".into(),
        keyslots: std::array::from_fn(|i| luks1::Keyslot {
            state: luks1::KeyslotState::Disabled,
            iterations: 0,
            salt: [0; 32],
            key_material_offset: offsets[i],
            stripes: luks1::STRIPES,
        }),
    };
    h.encode().unwrap()
}

#[test]
fn luks1_huge_key_bytes_is_refused_before_anything_is_sized_by_it() {
    for kb in [limits::MAX_KEY_BYTES + 1, 1 << 24, u32::MAX] {
        let mut b = luks1_bytes();
        // keyBytes at 108; key material offsets spread so no overlap check fires first.
        b[108..112].copy_from_slice(&kb.to_be_bytes());
        for i in 0..8u32 {
            let o = 208 + 48 * i as usize + 40;
            let off = 8 + u64::from(i) * luks1::af_split_sectors(kb, luks1::STRIPES);
            b[o..o + 4].copy_from_slice(&u32::try_from(off).unwrap_or(u32::MAX).to_be_bytes());
        }
        let e = Luks1Header::decode(&b).unwrap_err();
        assert_eq!(e, Luks1Error::KeyBytesTooLarge(kb));
        assert!(e.to_string().contains("keyBytes") && e.to_string().contains(&kb.to_string()), "{e}");
    }
    // The bound itself is accepted.
    let mut b = luks1_bytes();
    b[108..112].copy_from_slice(&limits::MAX_KEY_BYTES.to_be_bytes());
    for i in 0..8usize {
        let o = 208 + 48 * i + 40;
        let off = 8 + i as u32 * 8000;
        b[o..o + 4].copy_from_slice(&off.to_be_bytes());
    }
    assert_eq!(Luks1Header::decode(&b).unwrap().key_bytes, limits::MAX_KEY_BYTES);
}

#[test]
fn luks1_huge_stripes_are_refused() {
    let mut b = luks1_bytes();
    b[208 + 44..208 + 48].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(Luks1Header::decode(&b), Err(Luks1Error::BadStripes { slot: 0, stripes: u32::MAX }));
}

/// A superblock formatted for a small device, then `journal_sections` set to `sections`,
/// opened on a device large enough to hold that journal (a sparse image can be).
fn open_with_journal_sections(sections: u32) -> Result<Layout, LayoutError> {
    let (mut sb, _) = Layout::format(&FormatParams::new(4, 512), &DeviceParams::new(1 << 16)).unwrap();
    sb.journal_sections = sections;
    Layout::open(&sb, &DeviceParams::new(1 << 50))
}

#[test]
fn integrity_huge_journal_is_refused_before_it_is_allocated() {
    for sections in [1 << 20, u32::MAX] {
        match open_with_journal_sections(sections) {
            Err(LayoutError::JournalTooLarge { sections: s, bytes }) => {
                assert_eq!(s, sections);
                assert!(bytes > limits::INTEGRITY_MAX_JOURNAL_BYTES);
            }
            other => panic!("journal_sections {sections}: expected JournalTooLarge, got {other:?}"),
        }
    }
    let e = open_with_journal_sections(u32::MAX).unwrap_err().to_string();
    assert!(e.contains("journal_sections") && e.contains(&u32::MAX.to_string()), "{e}");
    // A journal at the bound opens.
    let l = open_with_journal_sections(1).unwrap();
    let per_section = l.journal_bytes();
    let max = u32::try_from(limits::INTEGRITY_MAX_JOURNAL_BYTES / per_section).unwrap();
    assert_eq!(open_with_journal_sections(max).unwrap().journal_bytes(), u64::from(max) * per_section);
    assert!(matches!(open_with_journal_sections(max + 1), Err(LayoutError::JournalTooLarge { .. })));
}

#[test]
fn dm_table_huge_values_are_refused() {
    let huge_key = "00".repeat(limits::MAX_KEY_BYTES as usize + 1);
    let max = limits::DM_MAX_SECTORS;
    let cases: Vec<(String, &str)> = vec![
        (format!("0 8 crypt aes-xts-plain64 {huge_key} 0 /dev/x 0"), "key"),
        (format!("0 {} crypt aes-xts-plain64 00 0 /dev/x 0", u64::MAX), "length"),
        (format!("0 {} crypt aes-xts-plain64 00 0 /dev/x 0", max + 1), "length"),
        (format!("0 8 crypt aes-xts-plain64 00 0 /dev/x {}", max + 1), "offset"),
        (format!("0 8 crypt aes-xts-plain64 00 {} /dev/x 0", max + 1), "iv_offset"),
        (format!("0 {max} crypt aes-xts-plain64 00 0 /dev/x {max}"), "offset + length"),
        ("0 8 crypt aes-xts-plain64 00 0 /dev/x 0 18446744073709551615".to_string(), "count"),
        ("0 8 crypt aes-xts-plain64 00 0 /dev/x 0 99999999999999999999999 a".to_string(), "count"),
    ];
    for (line, what) in cases {
        let e = CryptTable::parse(&line).unwrap_err();
        match (what, &e) {
            ("key", TableError::KeyTooLong(n)) => assert_eq!(*n, huge_key.len()),
            ("count", TableError::BadOptCount { .. }) => {}
            (f, TableError::TooLarge { field, .. }) => assert_eq!(*field, f),
            _ => panic!("{what}: unexpected {e:?}"),
        }
        // The key never shows in the message.
        assert!(!e.to_string().contains("0000"), "{e}");
    }
    // The bounds themselves parse.
    let key = "11".repeat(limits::MAX_KEY_BYTES as usize);
    let t = CryptTable::parse(&format!("0 8 crypt aes-xts-plain64 {key} {max} /dev/x 8")).unwrap();
    assert_eq!(t.key.len(), limits::MAX_KEY_BYTES as usize);
}

#[test]
fn luks1_keyslots_beyond_the_header_bound_are_refused() {
    // Keyslot 7's material placed at 2^31 sectors (1 TiB): a header backup would read it all.
    let mut b = luks1_bytes();
    let o = 208 + 48 * 7 + 40;
    b[o..o + 4].copy_from_slice(&(1u32 << 31).to_be_bytes());
    match Luks1Header::decode(&b) {
        Err(Luks1Error::KeyslotsTooLarge { slot: 7, end }) => assert!(end > limits::LUKS1_MAX_HEADER_BYTES),
        other => panic!("{other:?}"),
    }
}
