//! A port of cryptsetup's malformed-LUKS2 validation suite (`tests/luks2-validation-test`
//! with `tests/generators/generate-luks2-*.img.sh`, cryptsetup 2.8). Each case starts from
//! a valid header, mangles exactly one thing the way its generator does (recomputing the
//! checksum unless the checksum is the point), and checks either the specific error or
//! the recovery from the good copy ("R" cases in cryptsetup's list).
//!
//! Most generators also destroy the secondary copy ("kill hdr1") so that the mangled
//! primary is the only candidate: those cases assert the primary's error inside
//! `NoValidCopy`. Nothing here writes anything unless the case is about repair.

use formats::luks2::{self, CopyKind, Kdf, Luks2Error, MetadataError, SegmentSize};
use serde_json::{json, Value};
use sha2::Digest as _;

const KIB: u64 = 1024;
const HDR_16K: u64 = 16 * KIB;
const DATA_OFFSET: u64 = 16 << 20;
const AREA_SIZE: u64 = 258_048;

// ---------------------------------------------------------------------------------------
// Image construction (independent of the codec under test).

/// The base metadata: 8 keyslots (0 pbkdf2, 1 argon2id, 2 argon2i, 3..7 mixed), one digest
/// for all of them, one crypt segment at 16 MiB, for a metadata size of `hdr_size`.
fn base_json(hdr_size: u64) -> Value {
    let shift = 2 * (hdr_size - HDR_16K);
    let salt = "S9rOaBzFuLH9P64Yday4uj9TbZUHvTGBeHPwOxZ1UEA=";
    let mut keyslots = serde_json::Map::new();
    for i in 0..8u64 {
        let kdf = match i {
            1 | 4 => json!({"type":"argon2id","time":4,"memory":32,"cpus":1,"salt":salt}),
            2 | 6 => json!({"type":"argon2i","time":4,"memory":32,"cpus":1,"salt":salt}),
            _ => json!({"type":"pbkdf2","hash":"sha256","iterations":1000,"salt":salt}),
        };
        keyslots.insert(
            i.to_string(),
            json!({
                "type":"luks2","key_size":64,
                "af":{"type":"luks1","stripes":4000,"hash":"sha256"},
                "area":{"type":"raw","offset":(32768 + shift + i * AREA_SIZE).to_string(),
                        "size":AREA_SIZE.to_string(),"encryption":"aes-xts-plain64","key_size":64},
                "kdf":kdf
            }),
        );
    }
    json!({
        "keyslots": keyslots,
        "tokens": {},
        "segments": {"0": {"type":"crypt","offset":DATA_OFFSET.to_string(),"size":"dynamic",
                           "iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512}},
        "digests": {"0": {"type":"pbkdf2","keyslots":["0","1","2","3","4","5","6","7"],
                          "segments":["0"],"hash":"sha256","iterations":1000,
                          "salt":salt,"digest":"MZIk0VS99lSdxX2SpNPJC2/LXOqnaMQKrfgWdsKKpz0="}},
        "config": {"json_size":(hdr_size - 4096).to_string(),"keyslots_size":"4194304"}
    })
}

/// A JSON area of `len` bytes holding `text`, zero-padded (no room check: some cases
/// deliberately fill it).
fn area(text: &[u8], len: u64) -> Vec<u8> {
    let mut a = text.to_vec();
    a.resize(len as usize, 0);
    a
}

fn text(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// One metadata copy: binary header (with a correct sha256 checksum) followed by `json_area`.
fn copy(secondary: bool, hdr_size: u64, offset: u64, seqid: u64, json_area: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[..6].copy_from_slice(if secondary { b"SKUL\xba\xbe" } else { b"LUKS\xba\xbe" });
    b[6..8].copy_from_slice(&2u16.to_be_bytes());
    b[8..16].copy_from_slice(&hdr_size.to_be_bytes());
    b[16..24].copy_from_slice(&seqid.to_be_bytes());
    b[24..30].copy_from_slice(b"golden");
    b[72..78].copy_from_slice(b"sha256");
    b[104..168].fill(if secondary { 0x22 } else { 0x11 });
    b[168..204].copy_from_slice(b"6b2f4a52-0c5e-4d36-9a36-1f3d5f3e0a99");
    b[256..264].copy_from_slice(&offset.to_be_bytes());
    let mut h = sha2::Sha256::new();
    h.update(&b);
    h.update(json_area);
    b[448..480].copy_from_slice(&h.finalize());
    b.extend_from_slice(json_area);
    b
}

/// Overwrite the stored checksum of the copy at `offset` (keeps everything else).
fn set_checksum(img: &mut [u8], offset: u64, seed: &str) {
    let d = sha2::Sha256::digest(seed.as_bytes());
    let o = offset as usize + 448;
    img[o..o + 32].copy_from_slice(&d);
}

/// Image with a primary at 0 and a secondary at `hdr_size`, each given as a JSON area
/// (`None` = that copy destroyed: zero-filled).
fn image(hdr_size: u64, a0: Option<&[u8]>, a1: Option<&[u8]>) -> Vec<u8> {
    let mut img = vec![0u8; 2 * hdr_size as usize];
    if let Some(a) = a0 {
        let c = copy(false, hdr_size, 0, 7, a);
        img[..c.len()].copy_from_slice(&c);
    }
    if let Some(a) = a1 {
        let c = copy(true, hdr_size, hdr_size, 7, a);
        img[hdr_size as usize..hdr_size as usize + c.len()].copy_from_slice(&c);
    }
    img
}

fn good_area(hdr_size: u64) -> Vec<u8> {
    area(&text(&base_json(hdr_size)), hdr_size - 4096)
}

/// `lib_mangle_json_hdr0_kill_hdr1`: mangled primary, no secondary.
fn primary_only(v: &Value) -> Vec<u8> {
    image(HDR_16K, Some(&area(&text(v), HDR_16K - 4096)), None)
}

/// Both copies carry the same mangled JSON.
fn both(v: &Value) -> Vec<u8> {
    let a = area(&text(v), HDR_16K - 4096);
    image(HDR_16K, Some(&a), Some(&a))
}

fn mangle(f: impl FnOnce(&mut Value)) -> Value {
    let mut v = base_json(HDR_16K);
    f(&mut v);
    v
}

/// The primary's metadata error, for an image where no copy is valid.
fn primary_error(img: &[u8]) -> Luks2Error {
    match luks2::load(img) {
        Err(Luks2Error::NoValidCopy { primary, .. }) => *primary,
        other => panic!("expected no valid copy, got {other:?}"),
    }
}

fn metadata_error(img: &[u8]) -> MetadataError {
    match primary_error(img) {
        Luks2Error::Metadata { source, .. } => source,
        other => panic!("expected a metadata error, got {other:?}"),
    }
}

fn recovers(img: &[u8]) -> luks2::Selected {
    luks2::load(img).unwrap_or_else(|e| panic!("expected the header to load, got {e:?}"))
}

// ---------------------------------------------------------------------------------------
// [1] Basic auto-recovery (checksums).

#[test]
fn sanity_base_image_loads_without_repair() {
    let img = image(HDR_16K, Some(&good_area(HDR_16K)), Some(&good_area(HDR_16K)));
    let sel = recovers(&img);
    assert_eq!(sel.source, CopyKind::Primary);
    assert_eq!(sel.repair, None);
    assert_eq!(sel.header.metadata.keyslots.len(), 8);
}

#[test]
fn invalid_checksum_hdr0_recovers_from_secondary_and_repairs() {
    let mut img = image(HDR_16K, Some(&good_area(HDR_16K)), Some(&good_area(HDR_16K)));
    set_checksum(&mut img, 0, "Arbitrary chosen string: D'oh!");
    let mut sel = recovers(&img);
    assert_eq!(sel.source, CopyKind::Secondary);
    assert_eq!(sel.repair, Some(CopyKind::Primary));
    let plan = sel.repair_plan([0x33; 64]).unwrap().unwrap();
    plan.apply_to(&mut img);
    let again = recovers(&img);
    assert_eq!(again.repair, None);
    assert_eq!(again.source, CopyKind::Primary);
    assert_eq!(again.header.seqid, sel.header.seqid, "repair keeps the seqid");
    assert_eq!(again.salts.primary, [0x33; 64], "repair uses a fresh salt");
    assert_eq!(again.header.metadata, sel.header.metadata);
}

#[test]
fn invalid_checksum_hdr1_recovers_from_primary_and_repairs() {
    let mut img = image(HDR_16K, Some(&good_area(HDR_16K)), Some(&good_area(HDR_16K)));
    set_checksum(&mut img, HDR_16K, "Arbitrary chosen string: D'oh!");
    let mut sel = recovers(&img);
    assert_eq!(sel.source, CopyKind::Primary);
    assert_eq!(sel.repair, Some(CopyKind::Secondary));
    sel.repair_plan([0x44; 64]).unwrap().unwrap().apply_to(&mut img);
    assert_eq!(recovers(&img).repair, None);
}

#[test]
fn invalid_checksum_both_hdrs_is_rejected() {
    let mut img = image(HDR_16K, Some(&good_area(HDR_16K)), Some(&good_area(HDR_16K)));
    set_checksum(&mut img, 0, "Arbitrary chosen string: D'oh!");
    set_checksum(&mut img, HDR_16K, "D'oh!: arbitrary chosen string");
    match luks2::load(&img) {
        Err(Luks2Error::NoValidCopy { primary, secondary }) => {
            assert_eq!(*primary, Luks2Error::ChecksumMismatch(0));
            assert_eq!(*secondary, Luks2Error::ChecksumMismatch(HDR_16K));
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// [2] Auto-correction of malformed JSON areas.

/// JSON without its closing brace, then `,"` and filler past the end of the area.
fn overflowing_area() -> Vec<u8> {
    let t = text(&base_json(HDR_16K));
    let mut s = t[..t.len() - 1].to_vec();
    s.extend_from_slice(b",\"");
    while s.len() as u64 <= HDR_16K - 4096 {
        s.extend_from_slice(b"all_work_and_no_play_makes_Jack_a_dull_boy_");
    }
    s.truncate((HDR_16K - 4096) as usize);
    s
}

#[test]
fn corrupted_hdr0_with_correct_checksum_recovers() {
    let img = image(HDR_16K, Some(&overflowing_area()), Some(&good_area(HDR_16K)));
    let sel = recovers(&img);
    assert_eq!(sel.source, CopyKind::Secondary);
    assert_eq!(sel.repair, Some(CopyKind::Primary));
}

#[test]
fn corrupted_hdr1_with_correct_checksum_recovers() {
    let img = image(HDR_16K, Some(&good_area(HDR_16K)), Some(&overflowing_area()));
    let sel = recovers(&img);
    assert_eq!(sel.source, CopyKind::Primary);
    assert_eq!(sel.repair, Some(CopyKind::Secondary));
}

/// JSON padded with a long string so that it fills the area up to the last byte (`fill`
/// extra bytes: 0 leaves exactly one NUL, 1 leaves none).
fn full_json(overfill: u64) -> Vec<u8> {
    let t = text(&base_json(HDR_16K));
    let room = HDR_16K - 4096 - t.len() as u64;
    let key = b",\"X\":\"";
    let fill = room - key.len() as u64 - 1 /* '"' */ - 1 /* NUL */ + overfill;
    let mut s = t[..t.len() - 1].to_vec();
    s.extend_from_slice(key);
    s.extend(std::iter::repeat_n(b'X', fill as usize));
    s.extend_from_slice(b"\"}");
    s
}

#[test]
fn correct_full_json0_is_accepted() {
    let a = area(&full_json(0), HDR_16K - 4096);
    assert_eq!(*a.last().unwrap(), 0);
    let sel = recovers(&image(HDR_16K, Some(&a), None));
    assert!(sel.header.metadata.extra["X"].as_str().unwrap().len() > 1000);
}

#[test]
fn leftover_kdf_params_are_repaired_in_memory() {
    // argon2-leftover-params: an argon2 keyslot turned pbkdf2 keeps time/memory/cpus.
    let v = mangle(|v| {
        let k = &mut v["keyslots"]["1"]["kdf"];
        k["type"] = "pbkdf2".into();
        k["iterations"] = 1001.into();
        k["hash"] = "sha256".into();
    });
    let sel = recovers(&primary_only(&v));
    let ks = &sel.header.metadata.keyslots[&1];
    assert!(matches!(ks.kdf, Some(Kdf::Pbkdf2 { iterations: 1001, .. })));
    let out = sel.header.metadata.to_value();
    assert_eq!(out["keyslots"]["1"]["kdf"].as_object().unwrap().len(), 4);
    // pbkdf2-leftover-params-0/1: an argon2 keyslot with pbkdf2 leftovers.
    for t in ["argon2i", "argon2id"] {
        let v = mangle(|v| {
            let k = &mut v["keyslots"]["2"]["kdf"];
            k["type"] = t.into();
            k["iterations"] = 1001.into();
            k["hash"] = "sha256".into();
        });
        let sel = recovers(&primary_only(&v));
        let out = sel.header.metadata.to_value();
        assert_eq!(out["keyslots"]["2"]["kdf"].as_object().unwrap().len(), 5, "{t}");
        assert_eq!(out["keyslots"]["2"]["kdf"]["type"], t);
    }
}

// ---------------------------------------------------------------------------------------
// [3] JSON area restrictions.

#[test]
fn non_null_byte_beyond_json0_is_rejected() {
    let mut t = text(&base_json(HDR_16K));
    let len = t.len();
    t.push(b'X');
    let img = image(HDR_16K, Some(&area(&t, HDR_16K - 4096)), None);
    assert_eq!(metadata_error(&img), MetadataError::DataAfterJson(len));
}

#[test]
fn non_null_bytes_beyond_json0_are_rejected() {
    let t = text(&base_json(HDR_16K));
    let mut a = area(&t, HDR_16K - 4096);
    let at = t.len() + 200;
    a[at] = b'"';
    let img = image(HDR_16K, Some(&a), None);
    assert_eq!(metadata_error(&img), MetadataError::DataAfterJson(at));
}

#[test]
fn missing_trailing_null_byte_json0_is_rejected() {
    let t = full_json(1);
    assert_eq!(t.len() as u64, HDR_16K - 4096);
    let img = image(HDR_16K, Some(&t), None);
    assert_eq!(metadata_error(&img), MetadataError::MissingTrailingNul);
}

#[test]
fn invalid_opening_char_json0_is_rejected() {
    let mut t = b" ".to_vec();
    t.extend(text(&base_json(HDR_16K)));
    let img = image(HDR_16K, Some(&area(&t, HDR_16K - 4096)), None);
    assert_eq!(metadata_error(&img), MetadataError::InvalidOpeningChar(b' '));
}

#[test]
fn invalid_object_type_json0_is_rejected() {
    let mut t = b"[".to_vec();
    t.extend(text(&base_json(HDR_16K)));
    t.push(b']');
    let img = image(HDR_16K, Some(&area(&t, HDR_16K - 4096)), None);
    assert_eq!(metadata_error(&img), MetadataError::InvalidOpeningChar(b'['));
}

#[test]
fn overlapping_areas_are_rejected() {
    let c0 = mangle(|v| {
        let a6 = v["keyslots"]["6"]["area"].clone();
        v["keyslots"]["7"]["area"]["offset"] = a6["offset"].clone();
        v["keyslots"]["7"]["area"]["size"] = a6["size"].clone();
    });
    assert_eq!(metadata_error(&primary_only(&c0)), MetadataError::OverlappingAreas { first: 6, second: 7 });
    let off6 = 32768 + 6 * AREA_SIZE;
    let c1 = mangle(|v| {
        v["keyslots"]["7"]["area"]["offset"] = (off6 + 1).to_string().into();
        v["keyslots"]["7"]["area"]["size"] = (AREA_SIZE - 1).to_string().into();
    });
    assert_eq!(metadata_error(&primary_only(&c1)), MetadataError::OverlappingAreas { first: 7, second: 6 });
    let c2 = mangle(|v| {
        v["keyslots"]["7"]["area"]["offset"] = (off6 + AREA_SIZE - 1).to_string().into();
    });
    assert_eq!(metadata_error(&primary_only(&c2)), MetadataError::OverlappingAreas { first: 7, second: 6 });
}

#[test]
fn area_in_json_hdr_space_is_rejected() {
    let v = mangle(|v| {
        v["keyslots"]["0"]["area"]["offset"] = (2 * HDR_16K - 1).to_string().into();
        v["keyslots"]["0"]["area"]["size"] = "1".into();
    });
    assert_eq!(
        metadata_error(&primary_only(&v)),
        MetadataError::AreaInMetadata { keyslot: 0, offset: 2 * HDR_16K - 1, metadata_end: 2 * HDR_16K }
    );
}

#[test]
fn missing_references_are_rejected() {
    let v = mangle(|v| v["digests"]["0"]["keyslots"].as_array_mut().unwrap().push("8".into()));
    assert_eq!(
        metadata_error(&primary_only(&v)),
        MetadataError::MissingKeyslot { referrer: "digest 0".into(), keyslot: "8".into() }
    );
    let v = mangle(|v| v["digests"]["0"]["segments"].as_array_mut().unwrap().push("1".into()));
    assert_eq!(
        metadata_error(&primary_only(&v)),
        MetadataError::MissingSegment { referrer: "digest 0".into(), segment: "1".into() }
    );
    let v = mangle(|v| v["tokens"]["0"] = json!({"type":"dummy","keyslots":["0","8"]}));
    assert_eq!(
        metadata_error(&primary_only(&v)),
        MetadataError::MissingKeyslot { referrer: "token 0".into(), keyslot: "8".into() }
    );
}

#[test]
fn keyslot_digest_assignment_is_checked() {
    let v = mangle(|v| {
        v["digests"]["0"]["keyslots"].as_array_mut().unwrap().remove(0);
    });
    assert_eq!(metadata_error(&primary_only(&v)), MetadataError::KeyslotDigestCount { keyslot: 0, count: 0 });
    let v = mangle(|v| {
        let mut d1 = v["digests"]["0"].clone();
        d1["keyslots"] = json!(["1"]);
        v["digests"]["1"] = d1;
    });
    assert_eq!(metadata_error(&primary_only(&v)), MetadataError::KeyslotDigestCount { keyslot: 1, count: 2 });
}

// ---------------------------------------------------------------------------------------
// [4] Integer limits.

#[test]
fn uint64_limits_of_segment_size() {
    let v = mangle(|v| v["segments"]["0"]["size"] = "18446744073709551104".into());
    let sel = recovers(&primary_only(&v));
    assert_eq!(sel.header.metadata.segments[&0].size, SegmentSize::Bytes(18446744073709551104));
    let v = mangle(|v| v["segments"]["0"]["size"] = "18446744073709551616".into());
    assert!(matches!(metadata_error(&primary_only(&v)), MetadataError::Uint64Overflow { field: "size", .. }));
    let v = mangle(|v| v["segments"]["0"]["size"] = "-512".into());
    assert!(matches!(metadata_error(&primary_only(&v)), MetadataError::NotDecimal { field: "size", .. }));
}

// ---------------------------------------------------------------------------------------
// [5] Segments.

fn seg_err(f: impl FnOnce(&mut Value)) -> MetadataError {
    metadata_error(&primary_only(&mangle(|v| f(&mut v["segments"]["0"]))))
}

fn missing(field: &'static str) -> MetadataError {
    MetadataError::MissingField { what: "segment 0".into(), field }
}

fn wrong(field: &'static str, expected: &'static str, found: &'static str) -> MetadataError {
    MetadataError::WrongType { what: "segment 0".into(), field, expected, found }
}

fn del(v: &mut Value, k: &str) {
    v.as_object_mut().unwrap().shift_remove(k);
}

#[test]
fn segment_field_errors_name_the_field() {
    assert_eq!(seg_err(|s| del(s, "type")), missing("type"));
    assert_eq!(seg_err(|s| s["type"] = 42.into()), wrong("type", "string", "int"));
    assert_eq!(seg_err(|s| del(s, "offset")), missing("offset"));
    assert!(matches!(
        seg_err(|s| s["offset"] = "-42".into()),
        MetadataError::NotDecimal { field: "offset", .. }
    ));
    assert_eq!(seg_err(|s| del(s, "size")), missing("size"));
    assert_eq!(seg_err(|s| s["size"] = 4096.into()), wrong("size", "string", "int"));
    assert!(matches!(
        seg_err(|s| s["size"] = "automatic".into()),
        MetadataError::NotDecimal { field: "size", .. }
    ));
    assert_eq!(
        seg_err(|s| s["size"] = "511".into()),
        MetadataError::MisalignedSegment { segment: 0, field: "size", value: 511 }
    );
    assert_eq!(seg_err(|s| del(s, "encryption")), missing("encryption"));
    assert_eq!(seg_err(|s| s["encryption"] = json!({})), wrong("encryption", "string", "object"));
    assert_eq!(
        seg_err(|s| s["encryption"] = "".into()),
        MetadataError::EmptyString { what: "segment 0".into(), field: "encryption" }
    );
    assert_eq!(seg_err(|s| del(s, "iv_tweak")), missing("iv_tweak"));
    assert!(matches!(
        seg_err(|s| s["iv_tweak"] = "dynamic".into()),
        MetadataError::NotDecimal { field: "iv_tweak", .. }
    ));
    assert_eq!(seg_err(|s| del(s, "sector_size")), missing("sector_size"));
    assert_eq!(
        seg_err(|s| s["sector_size"] = 1023.into()),
        MetadataError::BadSectorSize { segment: 0, sector_size: 1023 }
    );
    assert_eq!(seg_err(|s| s["sector_size"] = "4096".into()), wrong("sector_size", "int", "string"));
    assert!(matches!(
        seg_err(|s| s["sector_size"] = (-1024).into()),
        MetadataError::OutOfRange { field: "sector_size", .. }
    ));
    assert_eq!(seg_err(|s| s["flags"] = "hello".into()), wrong("flags", "array", "string"));
    assert_eq!(
        seg_err(|s| s["flags"] = json!(["hello", 1])),
        MetadataError::WrongElementType { what: "segment 0".into(), field: "flags", index: 1, found: "int" }
    );
}

#[test]
fn segment_unknown_type_and_two_segments_are_accepted() {
    let v = mangle(|v| {
        let off = v["segments"]["0"]["offset"].clone();
        let size = v["segments"]["0"]["size"].clone();
        v["segments"]["0"] = json!({"type":"some_type","offset":off,"size":size,"a_field":0});
    });
    let sel = recovers(&primary_only(&v));
    let s = &sel.header.metadata.segments[&0];
    assert_eq!(s.type_name, "some_type");
    assert_eq!(s.extra["a_field"], 0);
    assert_eq!(sel.header.metadata.to_value()["segments"]["0"], v["segments"]["0"]);

    let v = mangle(|v| {
        v["segments"]["0"]["size"] = "512".into();
        v["segments"]["1"] = json!({"type":"some","offset":(DATA_OFFSET + 512).to_string(),"size":"dynamic"});
    });
    let sel = recovers(&primary_only(&v));
    assert_eq!(sel.header.metadata.segments.len(), 2);
}

#[test]
fn segment_wrong_backup_keys_are_rejected() {
    let v = mangle(|v| {
        v["segments"]["2"] = json!({"type":"linear","offset":"512","size":"512","flags":["backup-x"]})
    });
    assert!(matches!(metadata_error(&primary_only(&v)), MetadataError::SegmentGap(_)));
    let v = mangle(|v| {
        for i in 1..65 {
            v["segments"][i.to_string()] = json!({"type":"linear",
                "offset":(DATA_OFFSET + 512).to_string(),"size":"512"});
        }
        v["segments"]["268435472"] =
            json!({"type":"linear","offset":"512","size":"512","flags":["backup-x"]});
    });
    // cryptsetup fails this one on the gap; sealdisk refuses it earlier, on the segment ids
    // at or above LUKS2_OBJECTS_MAX (formats::limits).
    assert!(matches!(
        metadata_error(&primary_only(&v)),
        MetadataError::IdTooLarge { section: "segments", id: 32 }
    ));
}

// ---------------------------------------------------------------------------------------
// [6] Metadata size and keyslots size (config).

#[test]
fn config_size_errors_are_rejected() {
    let area_len = HDR_16K - 4096;
    let v = mangle(|v| v["config"]["json_size"] = (area_len + 4096).to_string().into());
    assert_eq!(metadata_error(&primary_only(&v)), MetadataError::BadJsonSize(area_len + 4096));
    let v = mangle(|v| v["config"]["json_size"] = (area_len - 4096).to_string().into());
    assert_eq!(metadata_error(&primary_only(&v)), MetadataError::BadJsonSize(area_len - 4096));
    let v = mangle(|v| v["config"]["keyslots_size"] = (DATA_OFFSET - 2 * HDR_16K + 4096).to_string().into());
    assert!(matches!(metadata_error(&primary_only(&v)), MetadataError::KeyslotsSizeOverlapsData { .. }));
    let v = mangle(|v| v["config"]["keyslots_size"] = "4194303".into());
    assert_eq!(metadata_error(&primary_only(&v)), MetadataError::KeyslotsSizeMisaligned(4194303));
    let v = mangle(|v| {
        v["config"]["keyslots_size"] = (8 * AREA_SIZE - 4096).to_string().into();
    });
    assert!(matches!(
        metadata_error(&primary_only(&v)),
        MetadataError::AreaBeyondKeyslots { keyslot: 7, .. }
    ));
}

#[test]
fn json_size_mismatching_binary_header_is_rejected() {
    // invalid-json-size-c2: 32 KiB binary hdr_size, config still says 12288.
    let hdr = 32 * KIB;
    let a = area(&text(&base_json(HDR_16K)), hdr - 4096);
    let img = image(hdr, Some(&a), Some(&a));
    assert_eq!(metadata_error(&img), MetadataError::JsonSizeMismatch { config: 12288, header: hdr - 4096 });
}

#[test]
fn every_metadata_size_loads_from_either_copy() {
    for hdr in luks2::METADATA_SIZES {
        let a = good_area(hdr);
        // Primary valid, secondary destroyed.
        let sel = recovers(&image(hdr, Some(&a), None));
        assert_eq!(sel.header.hdr_size, hdr);
        assert_eq!(sel.repair, Some(CopyKind::Secondary));
        // Primary destroyed: the secondary is found by scanning.
        let sel = recovers(&image(hdr, None, Some(&a)));
        assert_eq!(sel.source, CopyKind::Secondary, "{hdr:#x}");
        assert_eq!(sel.repair, Some(CopyKind::Primary));
        // Round trip through the encoder at this size.
        let (p, s) = sel.header.encode(sel.header.seqid, &sel.salts).unwrap();
        let mut img = p;
        img.extend(s);
        assert_eq!(recovers(&img).header, sel.header);
    }
}

#[test]
fn metadata_size_64k_area_and_keyslots_errors() {
    let hdr = 64 * KIB;
    // inv-area-c0: areas shifted one byte short, into the second JSON area.
    let mut v = base_json(hdr);
    for i in 0..8 {
        let o: u64 = v["keyslots"][i.to_string()]["area"]["offset"].as_str().unwrap().parse().unwrap();
        v["keyslots"][i.to_string()]["area"]["offset"] = (o - 1).to_string().into();
    }
    let img = image(hdr, Some(&area(&text(&v), hdr - 4096)), None);
    assert!(matches!(metadata_error(&img), MetadataError::AreaInMetadata { keyslot: 0, .. }));
    // inv-area-c1: keyslot 7 overflows the keyslots area by one byte.
    let mut v = base_json(hdr);
    v["keyslots"]["7"]["area"]["offset"] = (4194304 + 2 * hdr - AREA_SIZE + 1).to_string().into();
    let img = image(hdr, Some(&area(&text(&v), hdr - 4096)), None);
    assert!(matches!(metadata_error(&img), MetadataError::AreaBeyondKeyslots { keyslot: 7, .. }));
    // inv-keyslots-size-c0: keyslots area runs 4 KiB into the data.
    let mut v = base_json(hdr);
    v["config"]["keyslots_size"] = (DATA_OFFSET - 2 * hdr + 4096).to_string().into();
    let img = image(hdr, Some(&area(&text(&v), hdr - 4096)), None);
    assert!(matches!(metadata_error(&img), MetadataError::KeyslotsSizeOverlapsData { .. }));
}

#[test]
fn bogus_metadata_size_is_rejected_in_both_copies() {
    let hdr = 1 << 20;
    let bogus = hdr * 1024;
    let a = good_area(hdr);
    let mut img = image(hdr, Some(&a), Some(&a));
    img[8..16].copy_from_slice(&bogus.to_be_bytes());
    img[hdr as usize + 8..hdr as usize + 16].copy_from_slice(&bogus.to_be_bytes());
    match luks2::load(&img) {
        Err(Luks2Error::NoValidCopy { primary, secondary }) => {
            assert_eq!(*primary, Luks2Error::BadHdrSize(bogus));
            assert_eq!(*secondary, Luks2Error::BadHdrSize(bogus));
        }
        other => panic!("{other:?}"),
    }
    // metadata-size-invalid-secondary: primary destroyed as well.
    img[..4096].fill(0);
    assert!(matches!(luks2::load(&img), Err(Luks2Error::NoValidCopy { .. })));
}

// ---------------------------------------------------------------------------------------
// [7] Invalid object properties.

#[test]
fn invalid_top_level_and_keyslot_objects_are_rejected() {
    let v = mangle(|v| v["tokens"] = 42.into());
    assert_eq!(
        metadata_error(&both(&v)),
        MetadataError::WrongType {
            what: "JSON area".into(),
            field: "tokens",
            expected: "object",
            found: "int"
        }
    );
    let v = mangle(|v| {
        v["tokens"] = 42.into();
        v["digests"] = 42.into();
        v["keyslots"] = json!([]);
        v["segments"] = "hi".into();
    });
    assert!(matches!(metadata_error(&both(&v)), MetadataError::WrongType { field: "tokens", .. }));
    let v = mangle(|v| v["keyslots"]["0"]["area"] = 42.into());
    assert_eq!(
        metadata_error(&both(&v)),
        MetadataError::WrongType {
            what: "keyslot 0".into(),
            field: "area",
            expected: "object",
            found: "int"
        }
    );
    let v = mangle(|v| v["keyslots"]["0"]["area"]["size"] = "18446744073709551615".into());
    assert_eq!(metadata_error(&both(&v)), MetadataError::AreaOverflow(0));
    let v = mangle(|v| {
        v["keyslots"]["0"]["kdf"] = 42.into();
        v["keyslots"]["0"]["af"] = 42.into();
    });
    assert!(matches!(metadata_error(&both(&v)), MetadataError::WrongType { field: "kdf", .. }));
    let v = mangle(|v| v["keyslots"]["0"]["af"]["type"] = 42.into());
    assert_eq!(
        metadata_error(&both(&v)),
        MetadataError::WrongType {
            what: "keyslot 0 af".into(),
            field: "type",
            expected: "string",
            found: "int"
        }
    );
}

// ---------------------------------------------------------------------------------------
// [8] Non-compact JSON must not break rewrites.

#[test]
fn non_compact_json_is_accepted_and_rewritten_cleanly() {
    for fill in [1usize, 0] {
        let v = mangle(|v| v["tokens"]["0"] = json!({"type":"a","keyslots":[]}));
        let compact = String::from_utf8(text(&v)).unwrap();
        let pad = if fill == 1 { 1 } else { 4096 - compact.len() % 4096 };
        let spaced =
            compact.replacen("\"type\":\"luks2\"", &format!("\"type\":{}\"luks2\"", " ".repeat(pad)), 1);
        let a = area(spaced.as_bytes(), HDR_16K - 4096);
        let mut img = image(HDR_16K, Some(&a), Some(&a));
        let sel = recovers(&img);
        assert_eq!(sel.repair, None);
        let plan = sel.header.write_plan(sel.header.seqid + 1, &sel.salts).unwrap();
        plan.apply_to(&mut img);
        let again = recovers(&img);
        assert_eq!(again.header.metadata, sel.header.metadata);
        // No stale bytes of the longer old JSON are left behind.
        let json_end = 4096 + compact.len();
        assert!(img[json_end..HDR_16K as usize].iter().all(|&b| b == 0));
    }
}

// ---------------------------------------------------------------------------------------
// Beyond cryptsetup's generator list: features decoded so `volume` can refuse them clearly.

#[test]
fn unknown_mandatory_requirement_decodes_and_is_exposed() {
    let v = mangle(|v| v["config"]["requirements"] = json!({"mandatory": ["opal", "frobnicate-v9"], "x": 1}));
    let sel = recovers(&both(&v));
    assert_eq!(sel.header.metadata.unknown_requirements(), ["frobnicate-v9"]);
    assert_eq!(
        sel.header.metadata.config.mandatory_requirements()[0],
        luks2::Requirement::Opal { version: 1 }
    );
    assert_eq!(sel.header.metadata.to_value()["config"], v["config"]);
}

#[test]
fn integrity_segment_decodes_and_is_exposed() {
    let v = mangle(|v| {
        v["segments"]["0"]["integrity"] = json!({"type":"hmac(sha256)",
            "journal_encryption":"none","journal_integrity":"none"})
    });
    let sel = recovers(&both(&v));
    assert_eq!(sel.header.metadata.integrity_segments(), [0]);
    let i = sel.header.metadata.segments[&0].crypt.as_ref().unwrap().integrity.as_ref().unwrap();
    assert_eq!(i.type_name, "hmac(sha256)");
    let v = mangle(|v| v["segments"]["0"]["integrity"] = json!({"type":"aead"}));
    assert_eq!(
        metadata_error(&both(&v)),
        MetadataError::MissingField { what: "segment 0 integrity".into(), field: "journal_encryption" }
    );
}

#[test]
fn higher_seqid_wins_and_stale_copy_is_repaired() {
    let a = good_area(HDR_16K);
    let mut img = image(HDR_16K, Some(&a), Some(&a));
    let newer = copy(true, HDR_16K, HDR_16K, 8, &a);
    img[HDR_16K as usize..].copy_from_slice(&newer);
    let sel = recovers(&img);
    assert_eq!(sel.source, CopyKind::Secondary);
    assert_eq!(sel.header.seqid, 8);
    assert_eq!(sel.repair, Some(CopyKind::Primary));
}

#[test]
fn unknown_fields_survive_a_rewrite() {
    let v = mangle(|v| {
        v["keyslots"]["3"]["x-vendor"] = json!({"a":[1,2]});
        v["keyslots"]["3"]["area"]["x-area"] = "keep".into();
        v["segments"]["0"]["x-seg"] = true.into();
        v["digests"]["0"]["x-dig"] = Value::Null;
        v["config"]["x-cfg"] = "1".into();
        v["x-top"] = json!({"deep":{"er":[{}]}});
    });
    let sel = recovers(&both(&v));
    assert_eq!(sel.header.metadata.to_value(), v);
}

// ---------------------------------------------------------------------------------------
// Hostile images (issue 10): sizes and counts bounded at decode (formats::limits).

#[test]
fn keyslot_key_size_above_the_bound_is_rejected() {
    for (field, value) in [("key_size", 1025u64), ("key_size", u64::from(u32::MAX))] {
        let v = mangle(|v| v["keyslots"]["3"][field] = json!(value));
        assert!(
            matches!(metadata_error(&both(&v)), MetadataError::KeySizeTooLarge { field: "key_size", .. }),
            "{value}"
        );
        let v = mangle(|v| v["keyslots"]["3"]["area"]["key_size"] = json!(value.min(i32::MAX as u64)));
        match metadata_error(&both(&v)) {
            MetadataError::KeySizeTooLarge { what, .. } => assert_eq!(what, "keyslot 3 area"),
            e => panic!("{e:?}"),
        }
    }
    // At the bound it decodes (whether the key material fits its area is checked when the
    // keyslot is unlocked, in volume).
    let v = mangle(|v| v["keyslots"]["3"]["key_size"] = json!(1024));
    recovers(&both(&v));
}

#[test]
fn object_ids_at_or_above_luks2_objects_max_are_rejected() {
    let v = mangle(|v| {
        let ks = v["keyslots"]["7"].take();
        v["keyslots"].as_object_mut().unwrap().remove("7");
        v["keyslots"]["32"] = ks;
        v["digests"]["0"]["keyslots"] = json!(["0", "1", "2", "3", "4", "5", "6", "32"]);
    });
    assert_eq!(metadata_error(&both(&v)), MetadataError::IdTooLarge { section: "keyslots", id: 32 });
    let v = mangle(|v| v["tokens"]["4294967295"] = json!({"type":"x","keyslots":[]}));
    assert_eq!(metadata_error(&both(&v)), MetadataError::IdTooLarge { section: "tokens", id: u32::MAX });
    // Keyslot 31 is the last valid id.
    let v = mangle(|v| {
        let ks = v["keyslots"]["7"].take();
        v["keyslots"].as_object_mut().unwrap().remove("7");
        v["keyslots"]["31"] = ks;
        v["digests"]["0"]["keyslots"] = json!(["0", "1", "2", "3", "4", "5", "6", "31"]);
    });
    assert!(recovers(&both(&v)).header.metadata.keyslots.contains_key(&31));
}
