//! Volumes formatted and written by Linux 6.1 (testdata/integrity, see its README) open in
//! IntegrityTarget with the data the kernel served and no mismatch; where the kernel itself
//! read EIO (the legacy-padding tag-address truncation), so do we; the journal the kernel left
//! unreplayed replays to the content the kernel served; the dirty bitmap left by an unclean
//! stop is recalculated.
//!
//! Images are `*.img.xz`, decompressed with the `xz` tool (skipped loudly if absent).
use std::sync::Arc;

use blockdev::{BlockDevice, BlockErrorKind, MemDevice};
use sector_crypto::tag::TagHash;
use sha2::{Digest, Sha256};
use targets::integrity::{IntegrityConfig, IntegrityTarget, Mode};
use testkit::integrity_golden::{image, integrity_key, log_lines, manifest, opt, pattern};

/// The table integritysetup builds from these format options (the hash and key given again).
fn config(opts: &[String]) -> IntegrityConfig {
    let alg = opt(opts, "-I").unwrap_or("crc32c");
    let key = integrity_key(opts);
    let mode = if opts.iter().any(|o| o == "-B") { Mode::Bitmap } else { Mode::Journal };
    let mut c = IntegrityConfig::new(mode, Some(TagHash::new(alg, key.as_deref()).unwrap()));
    c.tag_size = opt(opts, "-t").map(|t| t.parse().unwrap());
    c.block_size = opt(opts, "-s").map(|t| t.parse().unwrap()).unwrap_or(512);
    c.commit_time_ms = 0;
    c.bitmap_flush_interval_ms = 0;
    c
}

fn sha_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

fn open(img: Vec<u8>, cfg: IntegrityConfig) -> (Arc<MemDevice>, IntegrityTarget<Arc<MemDevice>>) {
    let dev = Arc::new(MemDevice::from_vec(img, 512));
    let t = IntegrityTarget::open(dev.clone(), cfg).unwrap();
    (dev, t)
}

/// Opens the left-open image `name`, asserts it reads whole as the kernel served it (`EXPECT`
/// in `log`) with no mismatch, and returns the device once closed; `None` without `xz`.
fn open_left_open(name: &str, log: &str) -> Option<Arc<MemDevice>> {
    let img = image(name)?;
    let expect = log_lines(log, "EXPECT")[name].clone();
    let c = manifest().into_iter().find(|c| c.name == name).unwrap();
    let (dev, t) = open(img, config(&c.opts));
    let mut buf = vec![0u8; t.geometry().size as usize];
    t.read_at(0, &mut buf).unwrap();
    assert_eq!(sha_hex(&buf), expect);
    assert_eq!(t.status().mismatches, 0);
    drop(t);
    Some(dev)
}

#[test]
fn kernel_formatted_volumes_read_back_as_the_kernel_served_them() {
    let readback = log_lines("boot1.log", "READBACK");
    let sha = log_lines("boot1.log", "SHA");
    let mut checked = 0;
    for c in manifest().into_iter().filter(|c| c.kind == "full") {
        let Some(img) = image(&c.name) else { return };
        let cfg = config(&c.opts);
        let Some(rb) = readback.get(&c.name) else {
            // The kernel refused to format it: the superblock area is still zero.
            let dev = MemDevice::from_vec(img, 512);
            let e = IntegrityTarget::open(dev, cfg).unwrap_err();
            assert!(e.to_string().contains("superblock"), "{}: {e}", c.name);
            continue;
        };
        let (_dev, t) = open(img, cfg);
        let size = t.geometry().size;
        let mut buf = vec![0u8; size as usize];
        if rb == "ok" {
            t.read_at(0, &mut buf).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let want: Vec<u8> = (0..size / 512).flat_map(|s| pattern('A', s)).collect();
            assert!(buf == want, "{}: content differs from pattern A", c.name);
            if let Some(s) = sha.get(&c.name) {
                assert_eq!(&sha_hex(&buf), s, "{}", c.name);
            }
            assert_eq!(t.status().mismatches, 0, "{}", c.name);
            // dmsetup status: "<mismatches> <provided> -".
            let status = log_lines("boot1.log", "STATUS3")[&c.name].clone();
            let provided = status.split_whitespace().nth(1).unwrap();
            assert_eq!(t.status().provided_data_sectors.to_string(), provided, "{}", c.name);
        } else {
            // The kernel read EIO (legacy padding + small interleave: tags of later areas are
            // addressed onto earlier areas' data). Reproduce the same failure, block by block.
            let e = t.read_at(0, &mut buf).unwrap_err();
            assert!(matches!(e.kind(), BlockErrorKind::IntegrityMismatch { .. }), "{}: {e}", c.name);
            assert!(t.status().mismatches > 0);
        }
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} images checked");
}

#[test]
fn kernel_journal_left_open_replays_to_what_the_kernel_served() {
    let Some(replayed) = image("crc32c-j-s512-open-replayed") else { return };
    let Some(dev) = open_left_open("crc32c-j-s512-open", "boot1.log") else { return };
    // Data and tag areas equal what the kernel wrote when it replayed the same journal.
    let l = formats_layout(&dev);
    let area0 = (l.0) as usize;
    let ours = dev.to_vec();
    assert!(ours[area0..] == replayed[area0..], "data/tag areas differ from the kernel's replay");
}

/// Byte offset of area 0 (after superblock and journal).
fn formats_layout(dev: &MemDevice) -> (u64,) {
    use formats::integrity::{DeviceParams, Layout, Superblock};
    let v = dev.to_vec();
    let sb = Superblock::decode(&v[..4096]).unwrap();
    let l = Layout::open(&sb, &DeviceParams::new(v.len() as u64 / 512)).unwrap();
    ((l.start + l.initial_sectors as u64) * 512,)
}

#[test]
fn kernel_dirty_bitmap_is_recalculated_and_reads_back() {
    let Some(dev) = open_left_open("crc32c-b-s512-open", "boot2.log") else { return };
    // A clean close leaves DIRTY_BITMAP clear.
    let sb = formats::integrity::Superblock::decode(&dev.to_vec()[..4096]).unwrap();
    assert!(!sb.flags.has(formats::integrity::SbFlags::DIRTY_BITMAP));
}
