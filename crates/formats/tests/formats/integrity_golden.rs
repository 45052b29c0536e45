//! Golden images written by Linux 6.1 dm-integrity (testdata/integrity, made by
//! make-golden.sh through kernel-run): the superblock decodes as `integritysetup dump` reads
//! it; the layout (provided_data_sectors, journal, buffer_sectors, interleave, bitmap
//! granularity) equals what the kernel printed in `dmsetup table`; every written block is
//! found at `Layout::data_sector` with its tag at `Layout::tag_location`, and the tag equals
//! `sector_crypto::tag` over the block; the journal left unreplayed by the kernel replays,
//! with our rule, to the content the kernel served and later wrote.
//!
//! Images are `*.img.xz`; they are decompressed with the `xz` tool (skipped loudly if absent).
use std::collections::HashMap;

use formats::integrity::journal::{self, CommitIds, JournalResume, JournalView};
use formats::integrity::superblock::{dump_text, SB_AREA_BYTES};
use formats::integrity::{
    BitmapGeometry, DeviceParams, FormatParams, Layout, LayoutError, Mode, SbCheck, SbFlags, Superblock,
    SuperblockError,
};
use sector_crypto::tag::TagHash;
use sha2::{Digest, Sha256};

// Shared with targets' golden test; included by path because formats does not depend on testkit.
#[path = "../../../testkit/src/integrity_golden.rs"]
#[allow(clippy::module_inception)] // this module was the test binary integrity_golden
mod integrity_golden;
use integrity_golden::{image, integrity_key, log_lines, manifest, opt, pattern, read_text};

/// The internal hash integritysetup configured (`-I`, default crc32c) and its key.
fn tag_hash(opts: &[String]) -> TagHash {
    let alg = opt(opts, "-I").unwrap_or("crc32c");
    TagHash::new(alg, integrity_key(opts).as_deref()).unwrap()
}

/// FormatParams for integritysetup options (cryptsetup defaults: fix_padding, fix_hmac).
fn format_params(opts: &[String], salt: [u8; 16]) -> FormatParams {
    let h = tag_hash(opts);
    let tag_size = opt(opts, "-t").map(|t| t.parse().unwrap()).unwrap_or(h.digest_size() as u32);
    let block = opt(opts, "-s").map(|t| t.parse().unwrap()).unwrap_or(512);
    let mut p = FormatParams::new(tag_size, block);
    p.salt = salt;
    if let Some(il) = opt(opts, "--interleave-sectors") {
        p.interleave_sectors = il.parse().unwrap();
    }
    if let Some(j) = opt(opts, "-j") {
        p.journal_sectors = Some((j.parse::<u64>().unwrap() / 512) as u32);
    }
    p.fix_padding = !opts.iter().any(|o| o == "--integrity-legacy-padding");
    p
}

fn parse_dump(text: &str) -> Option<HashMap<String, String>> {
    if !text.starts_with("Info for integrity device") {
        return None;
    }
    Some(
        text.lines()
            .skip(1)
            .filter_map(|l| l.split_once(' ').map(|(k, v)| (k.to_string(), v.trim_end().to_string())))
            .collect(),
    )
}

/// Table options as printed by `dmsetup table` (`key:value` and bare words), plus length.
fn parse_table(t: &str) -> (u64, HashMap<String, String>) {
    let w: Vec<&str> = t.split_whitespace().collect();
    let len = w[1].parse().unwrap();
    let mut m = HashMap::new();
    for o in &w[8..] {
        match o.split_once(':') {
            Some((k, v)) => m.insert(k.to_string(), v.to_string()),
            None => m.insert(o.to_string(), String::new()),
        };
    }
    m.insert("mode".into(), w[6].to_string());
    m.insert("tag_size".into(), w[5].to_string());
    (len, m)
}

fn sb_of(img: &[u8]) -> Result<Superblock, SuperblockError> {
    Superblock::decode(&img[..SB_AREA_BYTES])
}

fn layout_of(img: &[u8], sb: &Superblock) -> Layout {
    Layout::open(sb, &DeviceParams::new(img.len() as u64 / 512)).unwrap()
}

/// The logical device as the kernel would read it, from the data area (no journal).
fn logical(img: &[u8], l: &Layout) -> Vec<u8> {
    let mut out = Vec::with_capacity(l.provided_data_sectors as usize * 512);
    for s in 0..l.provided_data_sectors {
        let d = l.data_sector(s) as usize * 512;
        out.extend_from_slice(&img[d..d + 512]);
    }
    out
}

fn sha_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

/// Blocks whose data is where the layout says and whose stored tag equals the computed one.
fn check_blocks(
    img: &[u8],
    sb: &Superblock,
    l: &Layout,
    h: &TagHash,
    expect: impl Fn(u64) -> Vec<u8>,
) -> (u64, u64) {
    let spb = l.sectors_per_block();
    let bs = l.block_size();
    let ts = l.tag_size as usize;
    let (mut good, mut bad) = (0, 0);
    let mut tag = vec![0u8; ts];
    for s in (0..l.provided_data_sectors).step_by(spb as usize) {
        let d = l.data_sector(s) as usize * 512;
        let data = &img[d..d + bs];
        let want: Vec<u8> = (0..spb).flat_map(|i| expect(s + i)).collect();
        h.compute(sb.hmac_salt(), s, data, &mut tag);
        let loc = l.tag_location(s).byte_address as usize;
        if data == want.as_slice() && img[loc..loc + ts] == tag[..] {
            good += 1;
        } else {
            bad += 1;
        }
    }
    (good, bad)
}

#[test]
fn superblock_decode_matches_integritysetup_dump_for_every_golden_image() {
    for c in manifest() {
        let Some(img) = image(&c.name) else { return };
        assert_eq!(img.len() as u64, c.size, "{}", c.name);
        let dump = read_text(&format!("{}.dump", c.name));
        match parse_dump(&dump) {
            None => {
                assert_eq!(
                    sb_of(&img),
                    Err(SuperblockError::Unformatted),
                    "{}: kernel refused to format",
                    c.name
                );
            }
            Some(d) => {
                let sb = sb_of(&img).unwrap_or_else(|e| panic!("{}: {e}", c.name));
                assert_eq!(d["superblock_version"], sb.version.to_string(), "{}", c.name);
                assert_eq!(d["log2_interleave_sectors"], sb.log2_interleave_sectors.to_string());
                assert_eq!(d["integrity_tag_size"], sb.integrity_tag_size.to_string());
                assert_eq!(d["journal_sections"], sb.journal_sections.to_string());
                assert_eq!(d["provided_data_sectors"], sb.provided_data_sectors.to_string());
                assert_eq!(d["sector_size"], sb.block_size().to_string());
                assert_eq!(d["log2_blocks_per_bitmap"], sb.log2_blocks_per_bitmap_bit.to_string());
                assert_eq!(d["flags"], sb.flags.names().join(" "), "{}", c.name);
                assert_eq!(dump_text(&sb, &format!("{}.img", c.name)), dump, "{}", c.name);
                // The superblock re-encodes byte for byte (struct + zero rest of the 4 KiB).
                assert_eq!(sb.encode()[..], img[..SB_AREA_BYTES], "{}: re-encode", c.name);
                let h = tag_hash(&c.opts);
                let tag_size =
                    opt(&c.opts, "-t").map(|t| t.parse().unwrap()).unwrap_or(h.digest_size() as u32);
                sb.check(&SbCheck {
                    tag_size,
                    block_size: sb.block_size(),
                    meta_device: false,
                    journal_mac: false,
                })
                .unwrap();
            }
        }
    }
}

#[test]
fn layout_matches_kernel_dmsetup_table_for_every_golden_image() {
    let mut tables = log_lines("boot1.log", "TABLE");
    tables.extend(log_lines("boot2.log", "TABLE"));
    let mut checked = 0;
    for c in manifest() {
        let Some(t) = tables.get(&c.name) else { continue };
        let Some(img) = image(&c.name) else { return };
        let sb = sb_of(&img).unwrap();
        let mut dev = DeviceParams::new(c.size / 512);
        dev.buffer_sectors = 128;
        let l = Layout::open(&sb, &dev).unwrap();
        let (len, m) = parse_table(t);
        assert_eq!(l.provided_data_sectors, len, "{}", c.name);
        assert_eq!(l.provided_data_sectors, sb.provided_data_sectors, "{}", c.name);
        assert_eq!(l.journal_sectors().to_string(), m["journal_sectors"], "{}", c.name);
        assert_eq!(l.interleave_sectors().to_string(), m["interleave_sectors"], "{}", c.name);
        assert_eq!(l.buffer_sectors().to_string(), m["buffer_sectors"], "{}: buffer_sectors cap", c.name);
        if m["mode"] == "B" {
            let g = BitmapGeometry::from_layout(&l);
            assert_eq!(g.sectors_per_bit().to_string(), m["sectors_per_bit"], "{}", c.name);
        }
        assert_eq!(l.log2_blocks_per_bitmap_bit, sb.log2_blocks_per_bitmap_bit, "{}", c.name);
        checked += 1;
    }
    assert!(checked >= 17, "only {checked} tables");
}

#[test]
fn format_reproduces_the_kernel_superblock_for_every_golden_image() {
    for c in manifest() {
        let Some(img) = image(&c.name) else { return };
        if c.name.starts_with("blake2b") {
            // Refused by the guest's integritysetup/kernel for a reason unrelated to layout
            // (see README); the geometry itself would fit.
            continue;
        }
        let salt = sb_of(&img).map(|s| s.salt).unwrap_or([0; 16]);
        let p = format_params(&c.opts, salt);
        let got = Layout::format(&p, &DeviceParams::new(c.size / 512));
        match sb_of(&img) {
            Err(_) => assert!(
                matches!(got, Err(LayoutError::TooSmall { .. })),
                "{}: kernel could not format, we got {got:?}",
                c.name
            ),
            Ok(sb) => {
                let (mut ours, _) = got.unwrap_or_else(|e| panic!("{}: {e}", c.name));
                // What use changes: bitmap mode sets DIRTY_BITMAP while open and rewrites the
                // version with mode B.
                ours.flags.set(SbFlags::DIRTY_BITMAP, sb.flags.has(SbFlags::DIRTY_BITMAP));
                let mode = if c.opts.iter().any(|o| o == "-B") { Mode::Bitmap } else { Mode::Journal };
                ours.set_version(mode, false);
                assert_eq!(ours, sb, "{}", c.name);
            }
        }
    }
}

#[test]
fn provided_data_sectors_sweep_matches_the_kernel() {
    let mut n = 0;
    for line in read_text("sweep.tsv").lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let sectors: u64 = f[0].parse().unwrap();
        let opts: Vec<String> = f[1].split_whitespace().map(String::from).collect();
        let p = format_params(&opts, [0; 16]);
        let mut dev = DeviceParams::new(sectors);
        dev.buffer_sectors = 128;
        let got = Layout::format(&p, &dev);
        let what = format!("{sectors} sectors, options {:?}", f[1]);
        if f[2] == "FORMAT-FAILED" {
            assert!(got.is_err(), "{what}: kernel refused, we formatted {got:?}");
            n += 1;
            continue;
        }
        let dump: HashMap<String, String> = {
            let d = f[2].trim().trim_start_matches("Info for integrity device /dev/loop0. ");
            let w: Vec<&str> = d.split_whitespace().collect();
            let mut m = HashMap::new();
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == "flags" {
                    m.insert("flags".to_string(), w[i + 1..].join(" "));
                    break;
                }
                m.insert(w[i].to_string(), w[i + 1].to_string());
                i += 2;
            }
            m
        };
        let (sb, l) = got.unwrap_or_else(|e| panic!("{what}: kernel formatted, we refused: {e}"));
        assert_eq!(dump["provided_data_sectors"], sb.provided_data_sectors.to_string(), "{what}");
        assert_eq!(dump["journal_sections"], sb.journal_sections.to_string(), "{what}");
        assert_eq!(dump["log2_interleave_sectors"], sb.log2_interleave_sectors.to_string(), "{what}");
        assert_eq!(dump["log2_blocks_per_bitmap"], sb.log2_blocks_per_bitmap_bit.to_string(), "{what}");
        assert_eq!(dump["integrity_tag_size"], sb.integrity_tag_size.to_string(), "{what}");
        let (len, m) = parse_table(f[3]);
        assert_eq!(len, l.provided_data_sectors, "{what}");
        assert_eq!(m["journal_sectors"], l.journal_sectors().to_string(), "{what}");
        assert_eq!(m["buffer_sectors"], l.buffer_sectors().to_string(), "{what}");
        n += 1;
    }
    assert!(n > 100, "{n} sweep rows");
}

#[test]
fn every_written_block_and_tag_is_where_the_layout_says() {
    let readback = log_lines("boot1.log", "READBACK");
    let shas = log_lines("boot1.log", "SHA");
    let mut checked = 0;
    for c in manifest().into_iter().filter(|c| c.kind == "full") {
        let Some(img) = image(&c.name) else { return };
        let Ok(sb) = sb_of(&img) else { continue };
        let l = layout_of(&img, &sb);
        let h = tag_hash(&c.opts);
        let (good, bad) = check_blocks(&img, &sb, &l, &h, |s| pattern('A', s));
        if readback[&c.name] == "ok" {
            assert_eq!(bad, 0, "{}: {bad} blocks differ ({good} good)", c.name);
            assert!(!l.tag_addressing_truncates(), "{}", c.name);
            assert_eq!(sha_hex(&logical(&img, &l)), shas[&c.name], "{}: logical sha256", c.name);
        } else {
            // The kernel itself failed to read back (EIO): these are the layouts whose
            // shifted tag address truncates, so tags land on other areas' data.
            assert!(readback[&c.name].contains("Input/output error"), "{}", c.name);
            assert!(l.tag_addressing_truncates(), "{}: kernel EIO but layout does not truncate", c.name);
            assert!(bad > 0, "{}: kernel saw mismatches, we see none", c.name);
            assert!(good > 0, "{}", c.name);
        }
        checked += 1;
    }
    assert!(checked >= 15, "{checked}");
}

#[test]
fn unreplayed_journal_replays_to_what_the_kernel_served_and_wrote() {
    let name = "crc32c-j-s512-open";
    let Some(img) = image(name) else { return };
    let Some(kernel_replayed) = image("crc32c-j-s512-open-replayed") else { return };
    let expect = &log_lines("boot1.log", "EXPECT")[name];
    assert_eq!(&log_lines("boot2.log", "REPLAYED")[name], expect, "kernel replay != kernel view before");
    let c = manifest().into_iter().find(|c| c.name == name).unwrap();
    let sb = sb_of(&img).unwrap();
    let l = layout_of(&img, &sb);
    let h = tag_hash(&c.opts);
    // Before replay the data area holds pattern A (the first, clean session).
    assert_eq!(check_blocks(&img, &sb, &l, &h, |s| pattern('A', s)), (l.provided_data_sectors, 0));

    let jo = l.journal_byte_offset() as usize;
    let jbytes = &img[jo..jo + l.journal_bytes() as usize];
    let view = JournalView::new(l.journal, l.journal_sections, jbytes).unwrap();
    let ids = CommitIds::plain();
    let plan = journal::scan(&view, &ids, true).unwrap();
    eprintln!("replay plan: {plan:?}");
    assert!(!plan.journal_empty);
    let entries = journal::replay_entries(&view, &plan, l.provided_data_sectors, None).unwrap();
    // Three fsync'ed dd runs: [0,64) B, [32,96) C, [4000,4100) B. dd wrote through the page
    // cache, so the kernel saw whole 4 KiB pages: the last run is [4000,4104) (4100..4104 A).
    assert_eq!(
        entries.len(),
        64 + 64 + 104,
        "{:?}",
        entries.iter().map(|e| e.logical_sector).collect::<Vec<_>>()
    );
    let mut out = img.clone();
    let mut tag = vec![0u8; l.tag_size as usize];
    for e in &entries {
        h.compute(sb.hmac_salt(), e.logical_sector, &e.data, &mut tag);
        assert_eq!(tag, e.tag, "journal tag of sector {}", e.logical_sector);
        let d = l.data_sector(e.logical_sector) as usize * 512;
        out[d..d + e.data.len()].copy_from_slice(&e.data);
        let t = l.tag_location(e.logical_sector).byte_address as usize;
        out[t..t + tag.len()].copy_from_slice(&e.tag);
    }
    let expected_content = |s: u64| match s {
        32..=95 => pattern('C', s),
        0..=31 | 4000..=4099 => pattern('B', s),
        _ => pattern('A', s),
    };
    assert_eq!(check_blocks(&out, &sb, &l, &h, expected_content), (l.provided_data_sectors, 0));
    assert_eq!(&sha_hex(&logical(&out, &l)), expect);
    // Data and tag areas equal what the kernel wrote when it replayed the same journal.
    let area0 = (l.start + l.initial_sectors as u64) as usize * 512;
    assert!(out[area0..] == kernel_replayed[area0..], "data/tag areas differ from the kernel's replay");
    // The journal afterwards: unchanged if the kernel continued, re-initialised if it cleared.
    let kj = &kernel_replayed[jo..jo + l.journal_bytes() as usize];
    match plan.resume {
        JournalResume::Continue { .. } => {
            assert!(kj == jbytes, "kernel rewrote a journal it should continue")
        }
        JournalResume::Clear { .. } => {
            let mut fresh = jbytes.to_vec();
            let sec = l.journal.section_bytes();
            for (i, seq) in journal::clear_sections(&plan.resume, l.journal_sections) {
                let s = &mut fresh[i as usize * sec..(i as usize + 1) * sec];
                journal::init_section(&l.journal, &ids, s, i, seq);
            }
            assert!(kj == fresh.as_slice(), "kernel's cleared journal differs");
        }
    }
    // Opening the kernel-replayed image again finds an empty journal.
    let view2 = JournalView::new(l.journal, l.journal_sections, kj).unwrap();
    let plan2 = journal::scan(&view2, &ids, true).unwrap();
    let again = journal::replay_entries(&view2, &plan2, l.provided_data_sectors, None).unwrap();
    // With Continue the kernel leaves the replayed entries on disk, so every later open
    // replays them again: that must be idempotent.
    assert_eq!(again.len(), entries.len());
    let mut twice = out.clone();
    for e in &again {
        let d = l.data_sector(e.logical_sector) as usize * 512;
        twice[d..d + e.data.len()].copy_from_slice(&e.data);
        let t = l.tag_location(e.logical_sector).byte_address as usize;
        twice[t..t + e.tag.len()].copy_from_slice(&e.tag);
    }
    assert!(twice == out, "replaying twice changed the device");
}

#[test]
fn bitmap_left_open_is_dirty_and_its_bitmap_decodes() {
    let name = "crc32c-b-s512-open";
    let Some(img) = image(name) else { return };
    let sb = sb_of(&img).unwrap();
    assert!(sb.flags.has(SbFlags::DIRTY_BITMAP));
    let l = layout_of(&img, &sb);
    assert_eq!(sb.log2_blocks_per_bitmap_bit, l.log2_blocks_per_bitmap_bit);
    let g = BitmapGeometry::from_layout(&l);
    let jo = l.journal_byte_offset() as usize;
    let bitmap = &img[jo..jo + g.bytes()];
    let dirty = g.dirty_ranges(bitmap);
    eprintln!("bitmap: {} blocks, {} sectors/bit, dirty {dirty:?}", g.n_bitmap_blocks, g.sectors_per_bit());
    let written = l.provided_data_sectors / 16 * 8; // dd count = bytes / 8192 blocks of 4096
    for r in &dirty {
        assert!(r.start < written, "dirty range {r:?} outside the written part");
    }
    // The kernel flushed before power-off (reboot notifier → synchronous mode), so every
    // block already has data and tag in place: pattern A in the first half, zeros after.
    let h = tag_hash(&[]);
    let expect = |s: u64| if s < written { pattern('A', s) } else { vec![0; 512] };
    assert_eq!(check_blocks(&img, &sb, &l, &h, expect), (l.provided_data_sectors, 0));
    assert_eq!(&sha_hex(&logical(&img, &l)), &log_lines("boot2.log", "EXPECT")[name]);
}
