//! What the fuzz targets in `fuzz/` run, one function per target, so that the committed
//! corpora replay through exactly the same code on stable (`tests/fuzz_corpus.rs`). Not part
//! of the supported API.
//!
//! Each function takes arbitrary bytes, feeds them to a decoder of untrusted input and checks
//! an oracle: no panic, and what decodes re-encodes to something that decodes the same.
//! A broken oracle panics, which is how a fuzz target reports it.

use sha2::{Digest, Sha256};

use crate::dm::CryptTable;
use crate::fvault2::{self, EncryptedMetadataExtent, MetadataRecords, VolumeHeader};
use crate::integrity::journal::{self, clear_sections, replay_entries_lenient, scan, FAILED_SCAN_RESUME};
use crate::integrity::superblock::{dump_text, sb_mac_ranges, verify_sb_mac, SB_AREA_BYTES};
use crate::integrity::{
    BitmapGeometry, CommitIds, DeviceParams, JournalGeometry, JournalView, Layout, SbCheck, Superblock,
};
use crate::luks1::Luks1Header;
use crate::luks2::{self, Luks2Metadata, MetadataError};
use crate::tcrypt::{self, TcryptHeader};

/// `luks1_header`: the LUKS1 phdr decoder. A decoded header re-encodes to bytes that decode
/// to the same header.
pub fn luks1_header(data: &[u8]) {
    if let Ok(h) = Luks1Header::decode(data) {
        let bytes = h.encode().expect("a decoded header re-encodes");
        assert_eq!(Luks1Header::decode(&bytes).expect("reloads"), h);
    }
}

/// `luks2_header`: the LUKS2 loader (binary headers, checksums, both copies, the JSON
/// metadata and its validation: segments, keyslots, digests, config, areas), cryptsetup's
/// `crypt2_load_fuzz` counterpart. Whatever loads re-encodes to a header that loads to the
/// same content. Because the checksum makes byte-level mutations rarely load, the input is
/// also tried as a bare JSON area.
pub fn luks2_header(data: &[u8]) {
    if let Ok(sel) = luks2::load(data) {
        // cryptsetup accepts JSON that exactly fills the area but writes it only with room
        // for the NUL; the same asymmetry is kept here, so that case may not re-encode.
        let encoded = match sel.header.encode(sel.header.seqid, &sel.salts) {
            Ok(copies) => Some(copies),
            Err(luks2::Luks2Error::Metadata { source: MetadataError::JsonTooLarge { .. }, .. }) => None,
            Err(e) => panic!("a loaded header does not re-encode: {e:?}"),
        };
        if let Some((mut img, secondary)) = encoded {
            img.extend(secondary);
            let again = luks2::load(&img).expect("a re-encoded header loads");
            assert_eq!(again.header, sel.header);
        }
    }
    // The JSON area on its own, at the smallest metadata size.
    let mut area = data.to_vec();
    area.resize(16384 - 4096, 0);
    if let Ok((meta, _)) = Luks2Metadata::decode_json_area(&area) {
        let bytes = match meta.encode_json_area(16384 - 4096) {
            Ok(b) => b,
            Err(MetadataError::JsonTooLarge { .. }) => return,
            Err(e) => panic!("decoded metadata does not re-encode: {e:?}"),
        };
        let (again, _) = Luks2Metadata::decode_json_area(&bytes).expect("reloads");
        assert_eq!(again, meta);
    }
}

/// `dm_table`: a crypt table line (as text; other bytes are read as lossy UTF-8). A parsed
/// line prints to a line that parses to the same table. Returns the table so that a caller
/// can go on with its cipher specification (parsed by `sector-crypto`, not here).
pub fn dm_table(data: &[u8]) -> Option<CryptTable> {
    let text = String::from_utf8_lossy(data);
    let table = CryptTable::parse(&text).ok()?;
    let printed = table.to_string();
    let again = CryptTable::parse(&printed).expect("a printed table parses");
    assert!(again == table, "a printed table parses differently: {printed}");
    let _ = format!("{table:?}");
    Some(table)
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// `integrity_superblock`: the dm-integrity superblock decoder, the open-time checks, the
/// superblock MAC ranges and the layout computed from it (`Layout::open`, what decides
/// where the journal, tags and data are). Input: the 4 KiB superblock area; 28 more bytes,
/// if present, are the device side (`data_device_sectors` le64, `start` le64,
/// `buffer_sectors` le32, `sectors_per_bit` le64, 0 = default), else a 1 MiB device.
pub fn integrity_superblock(data: &[u8]) {
    let Ok(sb) = Superblock::decode(data) else { return };
    let area = sb.encode();
    assert_eq!(Superblock::decode(&area).expect("an encoded superblock decodes"), sb);
    let _ = dump_text(&sb, "fuzz");
    for meta_device in [false, true] {
        for journal_mac in [false, true] {
            let table = SbCheck {
                tag_size: u32::from(sb.integrity_tag_size),
                block_size: sb.block_size(),
                meta_device,
                journal_mac,
            };
            let _ = sb.check(&table);
        }
    }
    for mac_size in [20, 32, 64] {
        if sb_mac_ranges(mac_size).is_ok() {
            let _ = verify_sb_mac(data, mac_size, |i| Sha256::digest(i).to_vec());
        }
    }
    let dev = match data.get(SB_AREA_BYTES..) {
        Some(d) if d.len() >= 28 => DeviceParams {
            data_device_sectors: le_u64(d, 0).unwrap_or(0),
            meta_device_sectors: None,
            start: le_u64(d, 8).unwrap_or(0),
            buffer_sectors: u32::from_le_bytes([d[16], d[17], d[18], d[19]]),
            sectors_per_bit: le_u64(d, 20).filter(|&s| s != 0),
        },
        _ => DeviceParams::new(2048),
    };
    let Ok(layout) = Layout::open(&sb, &dev) else { return };
    // Every address the target derives from the layout, at both ends of the device.
    let last = layout.provided_data_sectors.saturating_sub(1);
    for s in [0, last / 2, last] {
        let _ = layout.data_sector(s);
        let _ = layout.tag_location(s);
    }
    let areas = layout.areas();
    let _ = layout.area_metadata_sector(areas.saturating_sub(1));
    let _ = (layout.journal_byte_offset(), layout.journal_bytes(), layout.tag_addressing_truncates());
    let bitmap = BitmapGeometry::from_layout(&layout);
    let _ = (bitmap.bytes(), bitmap.n_bits(), bitmap.bit_of_sector(last));
}

/// `integrity_journal`: the journal scan and replay (which entries the kernel would write
/// back, how the journal goes on) over journal bytes from the input. The first 8 bytes pick
/// the geometry: tag size (byte 0, 0 read as 1), log2 sectors per block (byte 1 & 3), journal
/// MAC (byte 2 & 1), mode J rather than B (byte 2 & 2), sections (byte 3, 0 read as 1),
/// `provided_data_sectors` (le32 at 4); the journal is the rest.
pub fn integrity_journal(data: &[u8]) {
    let Some((head, bytes)) = data.split_first_chunk::<8>() else { return };
    let tag_size = u32::from(head[0]).max(1);
    let geom = JournalGeometry::new(tag_size, head[1] & 3, head[2] & 1 != 0);
    let journal_mode = head[2] & 2 != 0;
    let sections = u32::from(head[3]).max(1);
    let provided = u64::from(u32::from_le_bytes([head[4], head[5], head[6], head[7]]));
    let Ok(view) = JournalView::new(geom, sections, bytes) else { return };
    let ids = CommitIds::plain();
    let resume = match scan(&view, &ids, journal_mode) {
        Ok(plan) => {
            assert!(plan.write_start < sections && plan.write_sections <= sections, "{plan:?}");
            let mac_fn = |i: &[u8]| Sha256::digest(i).to_vec();
            let salt = [0x5a; 16];
            let mac: Option<journal::SectionMac<'_>> =
                geom.have_journal_mac.then_some((&mac_fn, (head[2] & 4 != 0).then_some(&salt)));
            let (entries, _errors) = replay_entries_lenient(&view, &plan, provided, mac);
            let block = geom.sectors_per_block() as usize * 512;
            for e in &entries {
                assert!(e.logical_sector < provided, "{e:?}");
                assert_eq!(e.data.len(), block);
                assert_eq!(e.tag.len(), tag_size as usize);
            }
            plan.resume
        }
        Err(_) => FAILED_SCAN_RESUME,
    };
    let cleared = clear_sections(&resume, sections);
    assert!(cleared.iter().all(|&(s, _)| s < sections));
}

/// `tcrypt_header`: the decoder of a decrypted TrueCrypt/VeraCrypt header and everything
/// that reads its fields (data layout against a device size taken from the input, header
/// positions, key slices of every chain, the keyfile pool). A decoded header re-encodes to
/// bytes that decode to the same header.
pub fn tcrypt_header(data: &[u8]) {
    // The device size rides after the header bytes.
    let size = le_u64(data, tcrypt::HDR_LEN).unwrap_or(0);
    for vera in [false, true] {
        let Ok(h) = TcryptHeader::decode(data, vera) else { continue };
        let bytes = h.encode();
        let mut again = TcryptHeader::decode(&bytes[..], vera).expect("a re-encoded header decodes");
        // Versions up to 3 keep no header CRC: the stored value is not checked, encode computes it.
        again.header_crc32 = h.header_crc32;
        assert_eq!(again, h);
        for chain in tcrypt::CHAINS {
            let _ = chain.volume_key(&h.keys[..]).expect("every chain's key fits the key area");
            for flags in
                [(false, false, false), (true, false, false), (false, true, false), (false, false, true)]
            {
                let flags = tcrypt::HeaderFlags { hidden: flags.0, system: flags.1, backup: flags.2 };
                if let Ok(l) = tcrypt::data_layout(&h, chain.mode, flags, size) {
                    let end = (l.offset + l.size) * 512;
                    assert!(end <= size, "data layout outside the device");
                }
                if let Ok(offsets) = tcrypt::header_offsets(flags, size) {
                    assert!(offsets.iter().all(|o| o + tcrypt::BLOCK_LEN as u64 <= size));
                }
            }
        }
    }
    let (pass, rest) = data.split_at(data.len().min(140));
    let _ = tcrypt::kdf_password(pass, &[rest], true);
    let _ = tcrypt::kdf_password(pass, &[], false);
}

/// Recomputes a Core Storage block's CRC32C (and seed), so that mutated blocks get past the
/// checksum and reach the parsers behind it.
fn fvault2_seal(b: &mut [u8]) {
    b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let c = fvault2::crc32c(u32::MAX, &b[8..]);
    b[..4].copy_from_slice(&c.to_le_bytes());
}

/// `fvault2_metadata`: the FileVault2 decoders on what cryptsetup reads of a device. Input:
/// a 512-byte volume header, then 8192-byte blocks, each tried as the disk label, as a
/// volume groups descriptor and as a decrypted metadata block (the harness stands in for
/// the AES-XTS layer, which is not fuzzed here), as given and with its checksum resealed.
/// Oracle: no panic; a decoded header is a probed one; gathered records that finish give
/// a dump naming both UUIDs.
pub fn fvault2_metadata(data: &[u8]) {
    let mut header_bytes = data.get(..fvault2::VOLUME_HEADER_SIZE).unwrap_or(data).to_vec();
    header_bytes.resize(fvault2::VOLUME_HEADER_SIZE, 0);
    let mut header = None;
    for seal in [false, true] {
        if seal {
            fvault2_seal(&mut header_bytes);
        }
        if let Ok(h) = VolumeHeader::decode(&header_bytes) {
            assert!(fvault2::is_volume_header(&header_bytes), "a decoded header is recognised");
            let _ = h.disk_label_offset();
            let _ = format!("{h:?}");
            header = Some(h);
        }
    }
    let block_size = header.as_ref().map_or(4096, |h| h.block_size);
    let mut records = MetadataRecords::default();
    for chunk in data.get(fvault2::VOLUME_HEADER_SIZE..).unwrap_or(&[]).chunks(fvault2::METADATA_BLOCK_SIZE) {
        let mut block = chunk.to_vec();
        block.resize(fvault2::METADATA_BLOCK_SIZE, 0);
        if let Ok(e) = EncryptedMetadataExtent::decode(&block, block_size) {
            for i in [0, 1, e.blocks.saturating_sub(1), e.blocks] {
                let _ = e.block_offset(i);
            }
        }
        for seal in [false, true] {
            if seal {
                fvault2_seal(&mut block);
            }
            let _ = fvault2::volume_groups_descriptor_offset(&block, 4096);
            if let Ok(Some(r)) = fvault2::decode_metadata_block(&block) {
                records.add(r);
            }
        }
    }
    if let Some(h) = header {
        if let Ok(p) = records.finish(&h) {
            let dump = fvault2::dump_text(&p, "fuzz");
            assert!(dump.contains(&fvault2::uuid_text(&p.physical_volume_uuid)));
            assert!(dump.contains(&fvault2::uuid_text(&p.family_uuid)));
        }
    }
}

/// `bitlk_metadata`: the BitLocker volume header, FVE metadata block and .BEK decoders on
/// the same bytes. Oracle: no panic; a parsed block names a supported method and a bounded
/// volume header area.
pub fn bitlk_metadata(data: &[u8]) {
    let _ = crate::bitlk::parse_volume_header(data);
    let _ = crate::bitlk::parse_bek(data);
    if let Ok(m) = crate::bitlk::parse_metadata(data) {
        assert!(m.volume_header_size > 0 && m.volume_header_size <= 1 << 30);
        assert!(m.fvek.data.len() >= 12);
    }
}
