//! The format fuzz targets' committed inputs, replayed on stable in the ordinary test run:
//! every file of `fuzz/seeds/<target>/` (made by `fuzz/make-seeds.sh` from testdata/) and
//! `fuzz/corpus/<target>/` (the minimised corpora, with the inputs of past findings) goes
//! through the same function as the fuzz target (`formats::fuzzing`). The seeds are also
//! checked to reach what they were cut for, so that a broken seed does not fuzz nothing.

use std::path::{Path, PathBuf};

use formats::dm::CryptTable;
use formats::integrity::journal::{replay_entries, scan};
use formats::integrity::{CommitIds, JournalGeometry, JournalView, Superblock};
use formats::luks1::Luks1Header;
use formats::{fuzzing, luks2};
use sector_crypto::CipherSpec;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(kind: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join(kind).join(target);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    out.sort();
    out.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

/// Seeds and corpus of `target`; at least one seed.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let seeds = files("seeds", target);
    assert!(!seeds.is_empty(), "no seeds for {target}");
    seeds.into_iter().chain(files("corpus", target)).collect()
}

#[test]
fn luks1_header_corpus_replays() {
    for (_, b) in inputs("luks1_header") {
        fuzzing::luks1_header(&b);
    }
    for (p, b) in files("seeds", "luks1_header") {
        assert!(Luks1Header::decode(&b).is_ok(), "{} does not decode", p.display());
    }
}

#[test]
fn luks2_header_corpus_replays() {
    for (_, b) in inputs("luks2_header") {
        fuzzing::luks2_header(&b);
    }
    // The cryptsetup headers load whole, and their JSON areas alone.
    for name in ["luks2-cbc-essiv", "luks2-pbkdf2-xts512"] {
        let dir = fuzz_dir().join("seeds/luks2_header");
        let whole = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
        assert!(luks2::load(&whole).is_ok(), "{name} does not load");
        let mut area = std::fs::read(dir.join(format!("json-{name}.bin"))).unwrap();
        area.resize(16384 - 4096, 0);
        assert!(luks2::Luks2Metadata::decode_json_area(&area).is_ok(), "json-{name} does not load");
    }
}

#[test]
fn dm_table_corpus_replays() {
    for (_, b) in inputs("dm_table") {
        if let Some(t) = fuzzing::dm_table(&b) {
            let _ = t.cipher.parse::<CipherSpec>();
        }
    }
    for (p, b) in files("seeds", "dm_table") {
        let t = CryptTable::parse(std::str::from_utf8(&b).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(t.cipher.parse::<CipherSpec>().is_ok(), "{}", p.display());
    }
}

#[test]
fn integrity_superblock_corpus_replays() {
    for (_, b) in inputs("integrity_superblock") {
        fuzzing::integrity_superblock(&b);
    }
    for (p, b) in files("seeds", "integrity_superblock") {
        assert!(Superblock::decode(&b).is_ok(), "{} does not decode", p.display());
    }
}

#[test]
fn integrity_journal_corpus_replays() {
    for (_, b) in inputs("integrity_journal") {
        fuzzing::integrity_journal(&b);
    }
    // The seed is a kernel journal with committed entries: it replays some.
    let (_, seed) = &files("seeds", "integrity_journal")[0];
    let geom = JournalGeometry::new(u32::from(seed[0]), seed[1], seed[2] & 1 != 0);
    let view = JournalView::new(geom, u32::from(seed[3]), &seed[8..]).unwrap();
    let plan = scan(&view, &CommitIds::plain(), true).unwrap();
    let provided = u64::from(u32::from_le_bytes(seed[4..8].try_into().unwrap()));
    assert!(!replay_entries(&view, &plan, provided, None).unwrap().is_empty());
}

#[test]
fn tcrypt_header_corpus_replays() {
    for (_, b) in inputs("tcrypt_header") {
        fuzzing::tcrypt_header(&b);
    }
    for (p, b) in files("seeds", "tcrypt_header") {
        assert!(formats::tcrypt::TcryptHeader::decode(&b, true).is_ok(), "{} does not decode", p.display());
    }
}

#[test]
fn fvault2_metadata_corpus_replays() {
    for (_, b) in inputs("fvault2_metadata") {
        fuzzing::fvault2_metadata(&b);
    }
    // The seeds are cryptsetup's FileVault2 image (header, disk label, descriptor, the four
    // decrypted metadata blocks): together they give the parameters cryptsetup dumps.
    let whole = std::fs::read(fuzz_dir().join("seeds/fvault2_metadata/golden-all.bin")).unwrap();
    let h = formats::fvault2::VolumeHeader::decode(&whole).unwrap();
    let mut records = formats::fvault2::MetadataRecords::default();
    for b in whole[512 + 2 * 8192..].chunks(8192) {
        if let Some(r) = formats::fvault2::decode_metadata_block(b).unwrap() {
            records.add(r);
        }
    }
    let p = records.finish(&h).unwrap();
    assert_eq!((p.lv_offset, p.lv_size, p.keys.pbkdf2_iterations), (67108864, 167772160, 204222));
}

#[test]
fn bitlk_metadata_corpus_replays() {
    for (_, b) in inputs("bitlk_metadata") {
        fuzzing::bitlk_metadata(&b);
    }
    // The seeds are what they were cut for: volume headers, metadata blocks, a .BEK file.
    for (p, b) in files("seeds", "bitlk_metadata") {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let ok = if name.starts_with("vh-") {
            formats::bitlk::parse_volume_header(&b).is_ok()
        } else if name.starts_with("meta-") {
            formats::bitlk::parse_metadata(&b).is_ok()
        } else {
            formats::bitlk::parse_bek(&b).is_ok()
        };
        assert!(ok, "{} does not parse", p.display());
    }
}

/// Every single-byte change of the real metadata blocks and the .BEK file (three values
/// per position) goes through the decoders without a panic: each length and offset is
/// bounded before use.
#[test]
fn bitlk_metadata_single_byte_mutations_never_panic() {
    for (_, b) in files("seeds", "bitlk_metadata") {
        let len = b.len().min(1024);
        for i in 0..len {
            for v in [0x00, 0xff, b[i] ^ 0x80] {
                let mut m = b.clone();
                m[i] = v;
                fuzzing::bitlk_metadata(&m);
            }
        }
        for cut in (0..b.len()).step_by(37) {
            fuzzing::bitlk_metadata(&b[..cut]);
        }
    }
}
