//! Property tests: `decode(encode(x)) == x` for LUKS1 and LUKS2 headers drawn from a
//! strategy; crash consistency of the LUKS2 write plan (a crash after any step leaves the
//! old or the new header, never neither); and the decoders never panic on random or
//! mutated bytes (the stand-in for fuzzing in CI; the cargo-fuzz targets are in /fuzz).

use std::collections::BTreeMap;

use formats::luks1::{self, KeyslotState, Luks1Header};
use formats::luks2::{
    self, Af, Area, Config, CryptParams, Digest, DigestPbkdf2, HeaderSalts, Kdf, Keyslot, Luks2Header,
    Luks2Metadata, Segment, SegmentSize, Token, WriteStep,
};
use proptest::prelude::*;
use serde_json::{json, Map};

fn arb_luks1() -> impl Strategy<Value = Luks1Header> {
    (
        prop::sample::select(vec![16u32, 32, 48, 64]),
        prop::sample::select(vec!["sha1", "sha256", "sha512", "ripemd160"]),
        "[a-z0-9]{1,31}",
        "[a-z0-9:-]{1,31}",
        any::<[u8; 20]>(),
        any::<[u8; 32]>(),
        any::<u32>(),
        prop::array::uniform8((any::<bool>(), any::<u32>(), any::<[u8; 32]>())),
        any::<bool>(),
    )
        .prop_map(|(kb, hash, name, mode, dig, salt, it, slots, detached)| {
            let (offsets, end) = luks1::standard_keyslot_layout(kb);
            Luks1Header {
                cipher_name: name,
                cipher_mode: mode,
                hash_spec: hash.into(),
                payload_offset: if detached { 0 } else { end as u32 + 8 },
                key_bytes: kb,
                mk_digest: dig,
                mk_digest_salt: salt,
                mk_digest_iterations: it,
                uuid: "0d1a6a5b-4f3c-4a8e-9f49-9a1b7d2d7e11".into(),
                keyslots: std::array::from_fn(|i| luks1::Keyslot {
                    state: if slots[i].0 { KeyslotState::Enabled } else { KeyslotState::Disabled },
                    iterations: slots[i].1,
                    salt: slots[i].2,
                    key_material_offset: offsets[i],
                    stripes: luks1::STRIPES,
                }),
            }
        })
}

fn arb_kdf() -> impl Strategy<Value = Kdf> {
    prop_oneof![
        (
            prop::sample::select(vec!["sha1", "sha256", "sha512"]),
            1u32..,
            prop::collection::vec(any::<u8>(), 1..64)
        )
            .prop_map(|(h, iterations, salt)| Kdf::Pbkdf2 { hash: h.into(), iterations, salt }),
        (any::<bool>(), any::<u32>(), any::<u32>(), any::<u32>(), prop::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(id, time, memory, cpus, salt)| Kdf::Argon2 { id, time, memory, cpus, salt }),
    ]
}

/// Headers with 1..8 keyslots laid out back to back, 1 digest, 1 or 2 segments, tokens
/// with opaque extras, optional flags/requirements/labels, at any metadata size.
fn arb_luks2() -> impl Strategy<Value = Luks2Header> {
    (
        0usize..9,
        prop::collection::vec((arb_kdf(), prop::option::of(0i32..3), 16u32..=64), 1..8),
        prop::sample::select(vec![512u32, 1024, 2048, 4096]),
        any::<u64>(),
        any::<bool>(),
        prop::option::of(prop::collection::vec("[a-z-]{1,12}", 0..3)),
        prop::option::of(prop::collection::vec("[a-z0-9-]{1,12}", 0..3)),
        "[ -~]{0,47}",
        "[a-z]{0,47}",
        any::<u64>(),
        prop::collection::btree_map(0u32..32, ("[a-z0-9-]{1,20}", any::<i64>()), 0..3),
    )
        .prop_map(|(size_i, slots, sector, iv_tweak, two_segs, flags, reqs, label, sub, seqid, toks)| {
            let hdr_size = luks2::METADATA_SIZES[size_i];
            let area_size = 258_048u64;
            let keyslots_size = 4u64 << 20;
            let data = 2 * hdr_size + keyslots_size + 4096 * 16;
            let mut keyslots = BTreeMap::new();
            for (i, (kdf, priority, ks)) in slots.into_iter().enumerate() {
                keyslots.insert(
                    i as u32 * 3,
                    Keyslot {
                        type_name: "luks2".into(),
                        key_size: ks,
                        priority,
                        af: Some(Af {
                            type_name: "luks1".into(),
                            stripes: 4000,
                            hash: "sha256".into(),
                            extra: Map::new(),
                        }),
                        area: Area {
                            type_name: "raw".into(),
                            offset: 2 * hdr_size + i as u64 * area_size,
                            size: area_size,
                            encryption: Some("aes-xts-plain64".into()),
                            key_size: Some(ks),
                            extra: Map::new(),
                        },
                        kdf: Some(kdf),
                        extra: Map::new(),
                    },
                );
            }
            let first_size = u64::from(sector) * 1024;
            let mut segments = BTreeMap::new();
            segments.insert(
                0,
                Segment {
                    type_name: "crypt".into(),
                    offset: data,
                    size: if two_segs { SegmentSize::Bytes(first_size) } else { SegmentSize::Dynamic },
                    crypt: Some(CryptParams {
                        iv_tweak: iv_tweak >> 1,
                        encryption: "aes-xts-plain64".into(),
                        sector_size: sector,
                        integrity: None,
                    }),
                    opal: None,
                    flags: None,
                    extra: Map::new(),
                },
            );
            if two_segs {
                segments.insert(
                    1,
                    Segment {
                        type_name: "linear".into(),
                        offset: data + first_size,
                        size: SegmentSize::Dynamic,
                        crypt: None,
                        opal: None,
                        flags: None,
                        extra: Map::new(),
                    },
                );
            }
            let slot_ids: Vec<u32> = keyslots.keys().copied().collect();
            let mut digests = BTreeMap::new();
            digests.insert(
                0,
                Digest {
                    type_name: "pbkdf2".into(),
                    keyslots: slot_ids.clone(),
                    segments: vec![0],
                    pbkdf2: Some(DigestPbkdf2 {
                        hash: "sha256".into(),
                        iterations: 1000,
                        salt: vec![1; 32],
                        digest: vec![2; 32],
                    }),
                    extra: Map::new(),
                },
            );
            let tokens = toks
                .into_iter()
                .map(|(id, (t, x))| {
                    let mut extra = Map::new();
                    extra.insert("x".into(), json!({"n": x, "l": [x, "s"]}));
                    (id, Token { type_name: t, keyslots: slot_ids[..1].to_vec(), extra })
                })
                .collect();
            let requirements = reqs.map(|m| luks2::Requirements {
                mandatory: Some(m.into_iter().filter(|r| !r.starts_with("online-reencrypt")).collect()),
                extra: Map::new(),
            });
            Luks2Header {
                hdr_size,
                seqid,
                label: label.trim_end_matches('\0').into(),
                subsystem: sub,
                checksum_alg: "sha256".into(),
                uuid: "6b2f4a52-0c5e-4d36-9a36-1f3d5f3e0a01".into(),
                metadata: Luks2Metadata {
                    keyslots,
                    tokens,
                    segments,
                    digests,
                    config: Config {
                        json_size: hdr_size - 4096,
                        keyslots_size,
                        flags,
                        requirements,
                        extra: Map::new(),
                    },
                    extra: Map::new(),
                },
            }
        })
}

const SALTS: HeaderSalts = HeaderSalts { primary: [0xa5; 64], secondary: [0x5a; 64] };

fn image_of(h: &Luks2Header) -> Vec<u8> {
    let (mut p, s) = h.encode(h.seqid, &SALTS).unwrap();
    p.extend(s);
    p
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn luks1_round_trip(h in arb_luks1()) {
        let bytes = h.encode().unwrap();
        prop_assert_eq!(Luks1Header::decode(&bytes).unwrap(), h);
    }

    #[test]
    fn luks2_round_trip(h in arb_luks2()) {
        let img = image_of(&h);
        let sel = luks2::load(&img).unwrap();
        prop_assert_eq!(&sel.header, &h);
        prop_assert_eq!(sel.salts, SALTS);
        prop_assert_eq!(sel.repair, None);
        // Re-encoding the decoded header gives back the same bytes.
        prop_assert_eq!(image_of(&sel.header), img);
    }

    /// Crash after any number of steps of an update: the header read back is the old one
    /// or the new one, and once the first flush is done it is the new one.
    #[test]
    fn luks2_update_is_crash_safe(h in arb_luks2(), label in "[a-z]{1,20}") {
        let old = h.clone();
        let base = image_of(&old);
        let mut new = old.clone();
        new.label = label;
        let plan = new.write_plan(old.seqid.wrapping_add(1), &SALTS).unwrap();
        assert_eq!(plan.steps.len(), 8);
        let mut flushed = false;
        for k in 0..=plan.steps.len() {
            let mut img = base.clone();
            let partial = luks2::WritePlan { steps: plan.steps[..k].to_vec() };
            partial.apply_to(&mut img);
            if k > 0 && plan.steps[k - 1] == WriteStep::Flush {
                flushed = true;
            }
            let sel = luks2::load(&img).unwrap();
            let mut got = sel.header.clone();
            if flushed {
                prop_assert_eq!(&got.label, &new.label);
            }
            got.seqid = 0;
            let (mut o, mut n) = (old.clone(), new.clone());
            o.seqid = 0;
            n.seqid = 0;
            prop_assert!(got == o || got == n, "step {}: neither old nor new", k);
        }
    }

    #[test]
    fn luks1_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..1100)) {
        let _ = Luks1Header::decode(&bytes);
    }

    #[test]
    fn luks2_decode_never_panics_on_mutations(
        h in arb_luks2(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
    ) {
        let mut img = image_of(&h);
        let n = h.hdr_size as usize;
        for (i, b) in flips {
            // Mostly the metadata we care about: binary headers and the JSON text.
            let at = i.index(4096 + 2048);
            let at = if at >= 4096 { n + at - 4096 } else { at };
            img[at] ^= b | 1;
        }
        let _ = luks2::load(&img);
        let _ = luks2::decode_copy(&img, 0);
    }

    /// JSON-level mutations with valid checksums: change any JSON byte, then re-checksum.
    #[test]
    fn luks2_json_mutations_never_panic(
        h in arb_luks2(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let json = h.metadata.to_json_string().into_bytes();
        let mut area = json.clone();
        for (i, b) in flips {
            let at = i.index(area.len());
            area[at] = b;
        }
        let mut padded = area.clone();
        padded.resize((h.hdr_size - 4096) as usize, 0);
        let _ = Luks2Metadata::decode_json_area(&padded);
        if let Ok(text) = std::str::from_utf8(&area) {
            if let Ok(v) = serde_json::from_str(text) {
                let _ = Luks2Metadata::from_value(v, h.hdr_size - 4096);
            }
        }
    }

    #[test]
    fn luks2_decode_never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..20000)) {
        let _ = luks2::load(&bytes);
        let _ = luks2::decode_copy(&bytes, 0);
        let _ = luks2::BinaryHeader::decode(&bytes, 16384);
        let _ = Luks2Metadata::decode_json_area(&bytes);
    }
}
