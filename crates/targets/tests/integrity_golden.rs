//! Volumes formatted and written by Linux 6.1 (testdata/integrity, see its README) open in
//! IntegrityTarget with the data the kernel served and no mismatch; where the kernel itself
//! read EIO (the legacy-padding tag-address truncation), so do we; the journal the kernel left
//! unreplayed replays to the content the kernel served; the dirty bitmap left by an unclean
//! stop is recalculated.
//!
//! Images are `*.img.xz`, decompressed with the `xz` tool (skipped loudly if absent).
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use blockdev::{BlockDevice, BlockErrorKind, MemDevice};
use sector_crypto::tag::TagHash;
use sha2::{Digest, Sha256};
use targets::integrity::{IntegrityConfig, IntegrityTarget, Mode};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/integrity")
}

fn read_text(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn image(name: &str) -> Option<Vec<u8>> {
    let path = dir().join(format!("{name}.img.xz"));
    match Command::new("xz").arg("-dc").arg(&path).output() {
        Ok(o) if o.status.success() => Some(o.stdout),
        Ok(o) => panic!("xz -dc {}: {}", path.display(), String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: cannot run xz ({e}); golden integrity images not checked");
            None
        }
    }
}

struct Case {
    name: String,
    opts: Vec<String>,
    kind: String,
}

fn manifest() -> Vec<Case> {
    read_text("manifest.tsv")
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            Case {
                name: f[0].to_string(),
                opts: f[2].split_whitespace().map(String::from).collect(),
                kind: f[3].to_string(),
            }
        })
        .collect()
}

fn log_lines(log: &str, key: &str) -> HashMap<String, String> {
    read_text(log)
        .lines()
        .filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .filter_map(|r| r.split_once(' ').map(|(n, rest)| (n.to_string(), rest.to_string())))
        .collect()
}

fn opt<'a>(opts: &'a [String], name: &str) -> Option<&'a str> {
    opts.iter().position(|o| o == name).map(|i| opts[i + 1].as_str())
}

/// The table integritysetup builds from these format options (the hash and key given again).
fn config(opts: &[String]) -> IntegrityConfig {
    let alg = opt(opts, "-I").unwrap_or("crc32c");
    let key = opt(opts, "--integrity-key-file")
        .map(|p| std::fs::read(dir().join(p.rsplit('/').next().unwrap())).unwrap());
    let mode = if opts.iter().any(|o| o == "-B") { Mode::Bitmap } else { Mode::Journal };
    let mut c = IntegrityConfig::new(mode, Some(TagHash::new(alg, key.as_deref()).unwrap()));
    c.tag_size = opt(opts, "-t").map(|t| t.parse().unwrap());
    c.block_size = opt(opts, "-s").map(|t| t.parse().unwrap()).unwrap_or(512);
    c.commit_time_ms = 0;
    c.bitmap_flush_interval_ms = 0;
    c
}

fn pattern(letter: char, sector: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(512);
    for r in 0..32 {
        v.extend_from_slice(format!("{letter}{sector:011}:{r:02}\n").as_bytes());
    }
    v
}

fn sha_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

fn open(img: Vec<u8>, cfg: IntegrityConfig) -> (Arc<MemDevice>, IntegrityTarget<Arc<MemDevice>>) {
    let dev = Arc::new(MemDevice::from_vec(img, 512));
    let t = IntegrityTarget::open(dev.clone(), cfg).unwrap();
    (dev, t)
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
    let name = "crc32c-j-s512-open";
    let Some(img) = image(name) else { return };
    let Some(replayed) = image("crc32c-j-s512-open-replayed") else { return };
    let expect = log_lines("boot1.log", "EXPECT")[name].clone();
    let c = manifest().into_iter().find(|c| c.name == name).unwrap();
    let (dev, t) = open(img, config(&c.opts));
    let mut buf = vec![0u8; t.geometry().size as usize];
    t.read_at(0, &mut buf).unwrap();
    assert_eq!(sha_hex(&buf), expect);
    assert_eq!(t.status().mismatches, 0);
    drop(t);
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
    let name = "crc32c-b-s512-open";
    let Some(img) = image(name) else { return };
    let expect = log_lines("boot2.log", "EXPECT")[name].clone();
    let c = manifest().into_iter().find(|c| c.name == name).unwrap();
    let (dev, t) = open(img, config(&c.opts));
    let mut buf = vec![0u8; t.geometry().size as usize];
    t.read_at(0, &mut buf).unwrap();
    assert_eq!(sha_hex(&buf), expect);
    assert_eq!(t.status().mismatches, 0);
    drop(t);
    // A clean close leaves DIRTY_BITMAP clear.
    let sb = formats::integrity::Superblock::decode(&dev.to_vec()[..4096]).unwrap();
    assert!(!sb.flags.has(formats::integrity::SbFlags::DIRTY_BITMAP));
}
