//! `BlockDevice::allocation` over real sparse files: FileDevice reports holes as
//! HOLE|ZERO, Slice translates, Checked verifies the answer, and the default says "data".

use std::sync::Arc;

use blockdev::{
    BlockDevice, BlockErrorKind, Checked, Extent, ExtentFlags, FileDevice, FileOptions, MemDevice, Slice,
    WriteFlags,
};

const HZ: ExtentFlags = ExtentFlags::HOLE.union(ExtentFlags::ZERO);
const DATA: ExtentFlags = ExtentFlags::empty();
const KIB: u64 = 1024;

/// A scratch directory on the target directory's filesystem (ext4 or xfs here, with
/// SEEK_DATA/SEEK_HOLE at 4 KiB granularity).
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn ext(list: &[(u64, ExtentFlags)]) -> Vec<Extent> {
    list.iter().map(|&(len, flags)| Extent { len, flags }).collect()
}

/// A 1 MiB sparse image with data at [64K, 128K) and [512K, 516K).
fn sparse(dir: &tempfile::TempDir) -> FileDevice {
    let d = FileDevice::create(dir.path().join("sparse.img"), 1 << 20, FileOptions::default()).unwrap();
    d.write_at(64 * KIB, &[0xa5; 64 * 1024], WriteFlags::empty()).unwrap();
    d.write_at(512 * KIB, &[0x5a; 4096], WriteFlags::empty()).unwrap();
    d
}

/// Whether this filesystem reports holes at all (SEEK_DATA on tmpfs/ext4/xfs does; some do
/// not and report everything as data, which the device then passes on, correctly).
fn reports_holes(d: &FileDevice) -> bool {
    let got = d.allocation(0, 64 * KIB, 16).unwrap();
    if got[0].flags == DATA {
        eprintln!("SKIPPED: the filesystem under {} does not report holes", env!("CARGO_TARGET_TMPDIR"));
        return false;
    }
    true
}

#[test]
fn holes_of_a_sparse_file_are_hole_and_zero() {
    let dir = scratch();
    let d = sparse(&dir);
    if !reports_holes(&d) {
        return;
    }
    let got = d.allocation(0, 1 << 20, 100).unwrap();
    assert_eq!(
        got,
        ext(&[(64 * KIB, HZ), (64 * KIB, DATA), (384 * KIB, HZ), (4 * KIB, DATA), (508 * KIB, HZ)])
    );
    // A window that starts inside data and ends inside a hole.
    let got = d.allocation(96 * KIB, 64 * KIB, 100).unwrap();
    assert_eq!(got, ext(&[(32 * KIB, DATA), (32 * KIB, HZ)]));
    // At most max_extents, covering a prefix.
    let got = d.allocation(0, 1 << 20, 2).unwrap();
    assert_eq!(got, ext(&[(64 * KIB, HZ), (64 * KIB, DATA)]));
    // A discard punches a new hole; the range checks are the trait's.
    d.discard(64 * KIB, 64 * KIB).unwrap();
    assert_eq!(d.allocation(0, 512 * KIB, 100).unwrap(), ext(&[(512 * KIB, HZ)]));
    assert_eq!(d.allocation(0, 0, 1).unwrap(), Vec::new());
    assert_eq!(d.allocation(1 << 20, 512, 1).unwrap_err().kind(), BlockErrorKind::OutOfRange);
    assert_eq!(d.allocation(100, 512, 1).unwrap_err().kind(), BlockErrorKind::Misaligned);
}

#[test]
fn slice_and_checked_translate_the_device_below() {
    let dir = scratch();
    let d = sparse(&dir);
    if !reports_holes(&d) {
        return;
    }
    // The window [60K, 576K): 4K hole, 64K data, 384K hole, 4K data, 60K hole.
    let s = Arc::new(Slice::new(d, 60 * KIB, 516 * KIB).unwrap());
    let checked = Checked::new(s.clone());
    let got = checked.allocation(0, 516 * KIB, 100).unwrap();
    assert_eq!(
        got,
        ext(&[(4 * KIB, HZ), (64 * KIB, DATA), (384 * KIB, HZ), (4 * KIB, DATA), (60 * KIB, HZ)])
    );
    let dynamic: Arc<dyn BlockDevice> = s;
    assert_eq!(dynamic.allocation(452 * KIB, 8 * KIB, 100).unwrap(), ext(&[(4 * KIB, DATA), (4 * KIB, HZ)]));
    // The window's end, not the file's, bounds a request.
    assert_eq!(dynamic.allocation(512 * KIB, 8 * KIB, 1).unwrap_err().kind(), BlockErrorKind::OutOfRange);
}

#[test]
fn the_default_reports_allocated_data() {
    let m = MemDevice::new(64 * KIB, 512);
    assert_eq!(m.allocation(4096, 8192, 10).unwrap(), ext(&[(8192, DATA)]));
    assert_eq!(m.allocation(0, 0, 10).unwrap(), Vec::new());
    assert_eq!(m.allocation(0, 128 * KIB, 10).unwrap_err().kind(), BlockErrorKind::OutOfRange);
}

#[test]
#[should_panic(expected = "allocation")]
fn checked_panics_when_a_device_answers_more_than_asked() {
    #[derive(Debug)]
    struct Overreach(MemDevice);
    impl BlockDevice for Overreach {
        fn geometry(&self) -> blockdev::Geometry {
            self.0.geometry()
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> blockdev::BlockResult<()> {
            self.0.read_at(off, buf)
        }
        fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> blockdev::BlockResult<()> {
            self.0.write_at(off, buf, flags)
        }
        fn flush(&self) -> blockdev::BlockResult<()> {
            self.0.flush()
        }
        fn allocation(&self, _: u64, len: u64, _: usize) -> blockdev::BlockResult<Vec<Extent>> {
            Ok(vec![Extent { len: len + 512, flags: DATA }])
        }
    }
    let _ = Checked::new(Overreach(MemDevice::new(8192, 512))).allocation(0, 4096, 4);
}
