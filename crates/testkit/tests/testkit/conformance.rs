//! The conformance suite over every device this workspace has in `blockdev` and `testkit`,
//! alone and under a `Slice`.

use crate::common;

use std::sync::Arc;

use blockdev::{BlockDevice, Checked, FileOptions, MemDevice, RangeLocked, Slice};
use common::{direct, read_only, Images};
use testkit::conformance::{self, Conformance};
use testkit::{CrashDevice, FaultDevice, TraceDevice};

const MIB: u64 = 1 << 20;

/// Linux buffered I/O copies into and out of the page cache without locking the page for
/// reads (ext4 `filemap_read`), so a read racing an overlapping buffered write can see a
/// partly copied block. `FileDevice` takes no locks of its own; `RangeLocked` fixes it.
const BUFFERED_TORN_READS: &str =
    "buffered FileDevice: the page cache does not make reads atomic against writes";

fn mem(size: u64, block: u32) -> Arc<dyn BlockDevice> {
    Arc::new(MemDevice::new(size, block))
}

/// A slice leaving a margin on both sides, so translation errors land outside it.
fn sliced(dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
    let g = dev.geometry();
    let margin = u64::from(g.physical_block) * 3;
    Arc::new(Slice::new(dev, margin, g.size - 2 * margin).unwrap())
}

#[test]
fn mem_device_conforms_with_512_byte_blocks() {
    Conformance::new(|| mem(8 * MIB, 512)).label("mem-512").run();
}

#[test]
fn mem_device_conforms_with_4096_byte_blocks() {
    Conformance::new(|| mem(4 * MIB, 4096)).label("mem-4k").run();
}

#[test]
fn mem_device_conforms_when_tiny() {
    conformance::run_all(|| mem(16 * 512, 512));
}

#[test]
fn slice_over_mem_conforms() {
    Conformance::new(|| sliced(mem(8 * MIB, 512))).label("slice∘mem").run();
}

#[test]
fn file_device_conforms_when_buffered() {
    let images = Images::new();
    Conformance::new(|| images.create(8 * MIB, FileOptions::default()))
        .label("file")
        .skip("concurrent_reads_see_whole_blocks", BUFFERED_TORN_READS)
        .run();
}

#[test]
fn range_locked_file_device_conforms_when_buffered() {
    let images = Images::new();
    Conformance::new(|| {
        Arc::new(RangeLocked::new(images.create(8 * MIB, FileOptions::default()))) as Arc<dyn BlockDevice>
    })
    .label("range-locked∘file")
    .run();
}

#[test]
fn file_device_conforms_with_4096_byte_blocks() {
    let images = Images::new();
    let opts = FileOptions { block_size: Some(4096), ..Default::default() };
    Conformance::new(|| images.create(4 * MIB, opts))
        .label("file-4k")
        .skip("concurrent_reads_see_whole_blocks", BUFFERED_TORN_READS)
        .run();
}

#[test]
fn file_device_conforms_with_o_direct() {
    let images = Images::new();
    if !images.direct_supported() {
        return;
    }
    Conformance::new(|| images.create(8 * MIB, direct())).label("file-direct").run();
}

#[test]
fn file_device_conforms_when_read_only() {
    let images = Images::new();
    let report = Conformance::new(|| images.create(MIB, read_only())).label("file-ro").run();
    assert!(report.passed.contains(&"read_only_device_refuses_writes"), "{report:?}");
}

#[test]
fn slice_over_file_conforms_when_buffered() {
    let images = Images::new();
    Conformance::new(|| sliced(images.create(8 * MIB, FileOptions::default())))
        .label("slice∘file")
        .skip("concurrent_reads_see_whole_blocks", BUFFERED_TORN_READS)
        .run();
}

#[test]
fn slice_over_file_conforms_with_o_direct() {
    let images = Images::new();
    if !images.direct_supported() {
        return;
    }
    Conformance::new(|| sliced(images.create(8 * MIB, direct()))).label("slice∘file-direct").run();
}

#[test]
fn slice_over_file_conforms_when_read_only() {
    let images = Images::new();
    Conformance::new(|| sliced(images.create(MIB, read_only()))).label("slice∘file-ro").run();
}

#[test]
fn checked_mem_conforms_when_expecting_rejections() {
    Conformance::new(|| {
        Arc::new(Checked::expecting_rejections(MemDevice::new(4 * MIB, 512))) as Arc<dyn BlockDevice>
    })
    .label("checked∘mem")
    .run();
}

#[test]
fn test_devices_conform_when_not_faulting() {
    Conformance::new(|| Arc::new(CrashDevice::new(4 * MIB, 512)) as Arc<dyn BlockDevice>)
        .label("crash")
        .run();
    Conformance::new(|| Arc::new(FaultDevice::new(MemDevice::new(4 * MIB, 512))) as Arc<dyn BlockDevice>)
        .label("fault")
        .run();
    Conformance::new(|| {
        Arc::new(TraceDevice::standalone(MemDevice::new(4 * MIB, 4096))) as Arc<dyn BlockDevice>
    })
    .label("trace")
    .run();
}

/// A device that ignores the offset of its writes: the suite must notice.
#[derive(Debug)]
struct WritesAtZero(MemDevice);

impl BlockDevice for WritesAtZero {
    fn geometry(&self) -> blockdev::Geometry {
        self.0.geometry()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> blockdev::BlockResult<()> {
        self.0.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: blockdev::WriteFlags) -> blockdev::BlockResult<()> {
        self.0.geometry().check_range(off, buf.len() as u64)?;
        self.0.write_at(0, buf, flags)
    }
    fn flush(&self) -> blockdev::BlockResult<()> {
        Ok(())
    }
}

#[test]
fn suite_fails_when_device_misplaces_writes() {
    let result = std::panic::catch_unwind(|| {
        Conformance::new(|| Arc::new(WritesAtZero(MemDevice::new(MIB, 512))) as Arc<dyn BlockDevice>)
            .label("broken")
            .run()
    });
    let msg = result.unwrap_err();
    let msg = msg.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("conformance [broken]") && msg.contains("read_after_write_matches_at_start_middle_end"),
        "{msg}"
    );
    assert!(!msg.contains("geometry_is_sane"), "{msg}");
}

#[test]
#[should_panic(expected = "unknown conformance case")]
fn skip_panics_when_case_name_is_unknown() {
    let _ = Conformance::new(|| mem(MIB, 512)).skip("no_such_case", "typo");
}
