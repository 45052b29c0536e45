//! Model-based property tests: random operation sequences on a stack must match a `Vec<u8>`.
//!
//! ```text
//!   proptest ──► Vec<Op> ──┬──► device under test (any stack)   ─┐
//!                          └──► Model { bytes, discarded blocks } ─┴─► every read compared
//! ```
//!
//! The model starts as a full read of the fresh device (so a stack whose initial contents are
//! not zeroes, such as a crypt layer over a zeroed file, needs no special case), then applies
//! each operation. Rules:
//! * A valid read must succeed and match the model, block by block.
//! * A valid write / write-zeroes updates the model; on a `Caps::READ_ONLY` device it must
//!   fail with `ReadOnly` and change nothing.
//! * A discard marks its blocks *discarded*: until rewritten they must read as the
//!   [`DiscardModel`] says (by default zeroes or their old data, per block, as the trait's
//!   contract says). Without `Caps::DISCARD` a discard may also fail with `Unsupported`.
//! * A misaligned or out-of-range request must fail with `Misaligned` or `OutOfRange` and
//!   change nothing (a request that is both may fail with either).
//! * `flush` must succeed. The geometry must never change.
//!
//! Another crate runs the same property over its own stack in one line:
//!
//! ```
//! # use std::sync::Arc;
//! # use blockdev::{BlockDevice, MemDevice};
//! # use testkit::model::{self, ModelConfig};
//! // A #[test] in your crate's tests/:
//! fn mem_device_matches_model() {
//!     model::run(|| Arc::new(MemDevice::new(256 * 1024, 512)) as Arc<dyn BlockDevice>, ModelConfig::default());
//! }
//! # mem_device_matches_model();
//! ```
//!
//! or, inside its own `proptest!` block, with the strategy and the checker:
//!
//! ```
//! # use std::sync::Arc;
//! # use blockdev::{BlockDevice, Geometry, MemDevice};
//! # use proptest::prelude::*;
//! # use testkit::model::{self, ModelConfig};
//! proptest! {
//!     // A #[test] in your crate's tests/:
//!     fn mem_4k_matches_model(ops in model::ops(Geometry::new(64 * 4096, 4096), &ModelConfig::default())) {
//!         model::check_against_model(|| Arc::new(MemDevice::new(64 * 4096, 4096)) as Arc<dyn BlockDevice>, &ops)?;
//!     }
//! }
//! # mem_4k_matches_model();
//! ```
//!
//! Keep the devices small (64 KiB – 1 MiB): every case reads the whole device twice.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockErrorKind, BlockResult, Caps, Geometry, WriteFlags, ZeroFlags};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};

use crate::pattern::pattern;

/// What a discarded block may read as until it is written again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DiscardModel {
    /// Zeroes or its old content, decided per block (the `BlockDevice` contract).
    #[default]
    ZeroOrOld,
    /// Always zeroes (a device that promises it, like `MemDevice`).
    Zeroes,
    /// Anything, as long as the read succeeds (a crypt layer passing discards down reads
    /// the lower layer's zeroes back as garbage).
    Anything,
}

/// One operation of a sequence. Offsets and lengths are in bytes and may be invalid on
/// purpose (misaligned or out of range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `read_at(off, len bytes)`.
    Read {
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
    },
    /// `write_at(off, pattern(seed, off, len))`, with FUA when `fua`.
    Write {
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
        /// Seed of the data (see [`crate::pattern`]).
        seed: u64,
        /// Whether the write carries `WriteFlags::FUA`.
        fua: bool,
    },
    /// `flush()`.
    Flush,
    /// `discard(off, len)`.
    Discard {
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
    },
    /// `write_zeroes(off, len, flags)`.
    WriteZeroes {
        /// Byte offset.
        off: u64,
        /// Byte length.
        len: u64,
        /// Whether `ZeroFlags::MAY_UNMAP` is set.
        may_unmap: bool,
        /// Whether `ZeroFlags::FUA` is set.
        fua: bool,
    },
}

/// Knobs of the model check.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// What discarded blocks may read as.
    pub discard: DiscardModel,
    /// Longest operation sequence.
    pub max_ops: usize,
    /// Longest request, in logical blocks.
    pub max_blocks_per_op: u64,
    /// Whether to mix in misaligned and out-of-range requests (about one in ten).
    pub invalid_ops: bool,
    /// Number of sequences [`run`] tries (default: `PROPTEST_CASES`, else 64).
    pub cases: u32,
}

impl Default for ModelConfig {
    fn default() -> Self {
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
        ModelConfig {
            discard: DiscardModel::default(),
            max_ops: 48,
            max_blocks_per_op: 32,
            invalid_ops: true,
            cases,
        }
    }
}

/// A valid `(offset, length)` in blocks, biased towards both ends of the device.
fn block_range(n: u64, max_len: u64) -> BoxedStrategy<(u64, u64)> {
    let max_len = max_len.max(1);
    let off = prop_oneof![6 => 0..n, 2 => n.saturating_sub(4)..n, 2 => 0..n.min(4)];
    let len = prop_oneof![5 => 1..=max_len.min(4), 4 => 1..=max_len, 1 => Just(0u64)];
    (off, len).prop_map(move |(o, l)| (o, l.min(n - o))).boxed()
}

/// An invalid `(offset, length)` in bytes: misaligned, past the end, or overflowing.
fn bad_range(n: u64, bs: u64, max_len: u64) -> BoxedStrategy<(u64, u64)> {
    let sub_block = prop_oneof![Just(1u64), Just(bs / 2), Just(512u64.min(bs - 1)), 1..bs];
    let top = u64::MAX / bs * bs;
    prop_oneof![
        // Misaligned offset.
        (0..n, 1..=max_len, sub_block.clone()).prop_map(move |(o, l, d)| (o * bs + d, l * bs)),
        // Misaligned length.
        (0..n, 0..=max_len, sub_block).prop_map(move |(o, l, d)| (o * bs, l * bs + d)),
        // Past the end (possibly starting past it).
        (1..=max_len, 0..4u64).prop_map(move |(l, extra)| ((n + 1 + extra).saturating_sub(l) * bs, l * bs)),
        // Offset + length overflows u64.
        Just((top, bs)),
    ]
    .boxed()
}

/// A strategy of single operations sized to `geometry`.
pub fn op(geometry: Geometry, config: &ModelConfig) -> BoxedStrategy<Op> {
    let bs = u64::from(geometry.logical_block);
    let n = geometry.size / bs;
    assert!(n > 0, "model checks need a non-empty device");
    let max_len = config.max_blocks_per_op.min(n);
    let valid = block_range(n, max_len).prop_map(move |(o, l)| (o * bs, l * bs));
    let range = if config.invalid_ops {
        prop_oneof![9 => valid, 1 => bad_range(n, bs, max_len)].boxed()
    } else {
        valid.boxed()
    };
    prop_oneof![
        3 => range.clone().prop_map(|(off, len)| Op::Read { off, len }),
        3 => (range.clone(), any::<u64>(), proptest::bool::weighted(0.2))
            .prop_map(|((off, len), seed, fua)| Op::Write { off, len, seed, fua }),
        1 => Just(Op::Flush),
        1 => range.clone().prop_map(|(off, len)| Op::Discard { off, len }),
        1 => (range, any::<bool>(), proptest::bool::weighted(0.2))
            .prop_map(|((off, len), may_unmap, fua)| Op::WriteZeroes { off, len, may_unmap, fua }),
    ]
    .boxed()
}

/// A strategy of operation sequences (1..=`config.max_ops` long) sized to `geometry`.
pub fn ops(geometry: Geometry, config: &ModelConfig) -> BoxedStrategy<Vec<Op>> {
    proptest::collection::vec(op(geometry, config), 1..=config.max_ops.max(1)).boxed()
}

/// Runs `ops` on a fresh device from `make` and on the model, with the default discard rule.
pub fn check_against_model(make: impl Fn() -> Arc<dyn BlockDevice>, ops: &[Op]) -> Result<(), TestCaseError> {
    check_against_model_with(make, ops, &ModelConfig::default())
}

/// Runs `ops` on a fresh device from `make` and on the model under `config`.
pub fn check_against_model_with(
    make: impl Fn() -> Arc<dyn BlockDevice>,
    ops: &[Op],
    config: &ModelConfig,
) -> Result<(), TestCaseError> {
    let dev = make();
    let mut model = Model::new(&*dev, config.discard)?;
    for (step, op) in ops.iter().enumerate() {
        model.apply(&*dev, op).map_err(|e| TestCaseError::fail(format!("step {step} {op:?}: {e}")))?;
    }
    model.verify_all(&*dev).map_err(|e| TestCaseError::fail(format!("after all {} steps: {e}", ops.len())))
}

/// Runs [`ModelConfig::cases`] random sequences over devices from `make`; panics with the
/// smallest failing sequence.
pub fn run(make: impl Fn() -> Arc<dyn BlockDevice>, config: ModelConfig) {
    let geometry = make().geometry();
    let strategy = ops(geometry, &config);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: config.cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    if let Err(e) = runner.run(&strategy, |ops| check_against_model_with(&make, &ops, &config)) {
        panic!("device does not match the model: {e}");
    }
}

/// The reference: the expected bytes, and which blocks were discarded since last written.
struct Model {
    geometry: Geometry,
    caps: Caps,
    bytes: Vec<u8>,
    discarded: Vec<bool>,
    discard: DiscardModel,
}

impl Model {
    fn new(dev: &dyn BlockDevice, discard: DiscardModel) -> Result<Self, TestCaseError> {
        let geometry = dev.geometry();
        let size = usize::try_from(geometry.size).expect("model devices fit in memory");
        let mut bytes = vec![0u8; size];
        dev.read_at(0, &mut bytes)
            .map_err(|e| TestCaseError::fail(format!("initial full read failed: {e}")))?;
        let blocks = size / geometry.logical_block as usize;
        Ok(Model { geometry, caps: dev.caps(), bytes, discarded: vec![false; blocks], discard })
    }

    fn bs(&self) -> usize {
        self.geometry.logical_block as usize
    }

    /// The kinds an invalid request may fail with, or `None` if it is valid.
    fn invalid_kinds(&self, off: u64, len: u64) -> Option<Vec<BlockErrorKind>> {
        let bs = u64::from(self.geometry.logical_block);
        let mut kinds = Vec::new();
        if off % bs != 0 || len % bs != 0 {
            kinds.push(BlockErrorKind::Misaligned);
        }
        if off.checked_add(len).is_none_or(|end| end > self.geometry.size) {
            kinds.push(BlockErrorKind::OutOfRange);
        }
        (!kinds.is_empty()).then_some(kinds)
    }

    fn apply(&mut self, dev: &dyn BlockDevice, op: &Op) -> Result<(), String> {
        if dev.geometry() != self.geometry {
            return Err(format!("geometry changed to {:?}", dev.geometry()));
        }
        let read_only = self.caps.contains(Caps::READ_ONLY);
        match *op {
            Op::Flush => dev.flush().map_err(|e| format!("flush failed: {e} ({:?})", e.kind())),
            Op::Read { off, len } => {
                let mut buf = vec![0u8; len as usize];
                let res = dev.read_at(off, &mut buf);
                if let Some(kinds) = self.invalid_kinds(off, len) {
                    return expect_failure(res, &kinds);
                }
                res.map_err(|e| format!("read failed: {e} ({:?})", e.kind()))?;
                self.compare(off, &buf)
            }
            Op::Write { off, len, seed, fua } => {
                let data = pattern(seed, off, len as usize);
                let flags = if fua { WriteFlags::FUA } else { WriteFlags::empty() };
                let res = dev.write_at(off, &data, flags);
                self.after_write(off, len, res, read_only, false, |m, o| m.set(o, &data))
            }
            Op::WriteZeroes { off, len, may_unmap, fua } => {
                let mut flags = ZeroFlags::empty();
                flags.set(ZeroFlags::MAY_UNMAP, may_unmap);
                flags.set(ZeroFlags::FUA, fua);
                let res = dev.write_zeroes(off, len, flags);
                self.after_write(off, len, res, read_only, false, |m, o| m.set(o, &vec![0u8; len as usize]))
            }
            Op::Discard { off, len } => {
                let res = dev.discard(off, len);
                self.after_write(off, len, res, read_only, true, |m, o| m.mark_discarded(o, len))
            }
        }
    }

    /// Checks the outcome of a modifying request and applies `update` when it succeeded.
    fn after_write(
        &mut self,
        off: u64,
        len: u64,
        res: BlockResult<()>,
        read_only: bool,
        is_discard: bool,
        update: impl FnOnce(&mut Self, u64),
    ) -> Result<(), String> {
        let mut excused = Vec::new();
        if read_only {
            excused.push(BlockErrorKind::ReadOnly);
        }
        if is_discard && !self.caps.contains(Caps::DISCARD) {
            excused.push(BlockErrorKind::Unsupported);
        }
        if let Some(mut kinds) = self.invalid_kinds(off, len) {
            kinds.extend(excused);
            return expect_failure(res, &kinds);
        }
        match res {
            Ok(()) if read_only && len > 0 => Err("succeeded on a READ_ONLY device".into()),
            Ok(()) => {
                update(self, off);
                Ok(())
            }
            Err(e) if excused.contains(&e.kind()) => Ok(()),
            Err(e) => Err(format!("failed: {e} ({:?})", e.kind())),
        }
    }

    fn set(&mut self, off: u64, data: &[u8]) {
        let (o, bs) = (off as usize, self.bs());
        self.bytes[o..o + data.len()].copy_from_slice(data);
        self.discarded[o / bs..(o + data.len()) / bs].fill(false);
    }

    fn mark_discarded(&mut self, off: u64, len: u64) {
        let (o, bs) = (off as usize, self.bs());
        match self.discard {
            DiscardModel::Zeroes => {
                self.bytes[o..o + len as usize].fill(0);
                self.discarded[o / bs..(o + len as usize) / bs].fill(false);
            }
            DiscardModel::ZeroOrOld | DiscardModel::Anything => {
                self.discarded[o / bs..(o + len as usize) / bs].fill(true);
            }
        }
    }

    /// Compares `got`, read at `off`, with the model, block by block.
    fn compare(&self, off: u64, got: &[u8]) -> Result<(), String> {
        let bs = self.bs();
        for (i, block) in got.chunks(bs).enumerate() {
            let at = off as usize + i * bs;
            let want = &self.bytes[at..at + bs];
            let ok = if self.discarded[at / bs] {
                match self.discard {
                    DiscardModel::Anything => true,
                    DiscardModel::ZeroOrOld => block == want || block.iter().all(|&b| b == 0),
                    DiscardModel::Zeroes => block.iter().all(|&b| b == 0),
                }
            } else {
                block == want
            };
            if !ok {
                let j = block.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "block at {at}{} differs from the model at byte {j}: got {:#04x}, model {:#04x}",
                    if self.discarded[at / bs] { " (discarded)" } else { "" },
                    block[j],
                    want[j]
                ));
            }
        }
        Ok(())
    }

    fn verify_all(&self, dev: &dyn BlockDevice) -> Result<(), String> {
        let mut all = vec![0u8; self.bytes.len()];
        dev.read_at(0, &mut all).map_err(|e| format!("final full read failed: {e}"))?;
        self.compare(0, &all)
    }
}

fn expect_failure(res: BlockResult<()>, kinds: &[BlockErrorKind]) -> Result<(), String> {
    match res {
        Ok(()) => Err(format!("invalid request succeeded; expected one of {kinds:?}")),
        Err(e) if kinds.contains(&e.kind()) => Ok(()),
        Err(e) => Err(format!("invalid request failed with {:?} ({e}); expected one of {kinds:?}", e.kind())),
    }
}

#[cfg(test)]
mod tests {
    use blockdev::MemDevice;
    use proptest::strategy::ValueTree;

    use super::*;

    fn mem() -> Arc<dyn BlockDevice> {
        Arc::new(MemDevice::new(64 * 1024, 512))
    }

    #[test]
    fn strategy_stays_inside_device_when_invalid_ops_are_off() {
        let g = Geometry::new(64 * 1024, 512);
        let config = ModelConfig { invalid_ops: false, ..ModelConfig::default() };
        let mut runner = TestRunner::deterministic();
        for _ in 0..200 {
            let ops = ops(g, &config).new_tree(&mut runner).unwrap().current();
            for op in ops {
                if let Op::Read { off, len }
                | Op::Write { off, len, .. }
                | Op::Discard { off, len }
                | Op::WriteZeroes { off, len, .. } = op
                {
                    g.check_range(off, len).unwrap();
                    assert!(len <= 32 * 512);
                }
            }
        }
    }

    #[test]
    fn check_passes_when_device_is_correct() {
        let ops = [
            Op::Write { off: 0, len: 1024, seed: 1, fua: false },
            Op::Discard { off: 512, len: 512 },
            Op::Read { off: 0, len: 4096 },
            Op::WriteZeroes { off: 63 * 1024, len: 1024, may_unmap: true, fua: true },
            Op::Read { off: 100, len: 512 },
            Op::Write { off: 64 * 1024, len: 512, seed: 2, fua: false },
            Op::Flush,
        ];
        check_against_model(mem, &ops).unwrap();
    }

    /// A device whose writes of more than one block drop the last block.
    #[derive(Debug)]
    struct DropsLastBlock(MemDevice);
    impl BlockDevice for DropsLastBlock {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
            self.0.read_at(off, buf)
        }
        fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
            let keep = if buf.len() > 512 { buf.len() - 512 } else { buf.len() };
            self.0.write_at(off, &buf[..keep], flags)
        }
        fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
    }

    #[test]
    fn check_fails_when_device_loses_data() {
        let make = || Arc::new(DropsLastBlock(MemDevice::new(64 * 1024, 512))) as Arc<dyn BlockDevice>;
        let ops = [Op::Write { off: 0, len: 1024, seed: 1, fua: false }];
        let err = check_against_model(make, &ops).unwrap_err();
        assert!(err.to_string().contains("block at 512 differs"), "{err}");
    }

    #[test]
    fn run_panics_with_minimal_sequence_when_device_loses_data() {
        let make = || Arc::new(DropsLastBlock(MemDevice::new(64 * 1024, 512))) as Arc<dyn BlockDevice>;
        let config = ModelConfig { cases: 64, ..ModelConfig::default() };
        let msg = std::panic::catch_unwind(|| run(make, config)).unwrap_err();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(msg.contains("does not match the model") && msg.contains("minimal failing input"), "{msg}");
    }

    #[test]
    fn discarded_blocks_must_be_zero_or_old_when_model_is_default() {
        #[derive(Debug)]
        struct DiscardGarbage(MemDevice);
        impl BlockDevice for DiscardGarbage {
            fn geometry(&self) -> Geometry {
                self.0.geometry()
            }
            fn caps(&self) -> Caps {
                Caps::DISCARD
            }
            fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
                self.0.read_at(off, buf)
            }
            fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
                self.0.write_at(off, buf, flags)
            }
            fn flush(&self) -> BlockResult<()> {
                Ok(())
            }
            fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
                self.0.write_at(off, &vec![0x5a; len as usize], WriteFlags::empty())
            }
        }
        let make = || Arc::new(DiscardGarbage(MemDevice::new(64 * 1024, 512))) as Arc<dyn BlockDevice>;
        let ops = [
            Op::Write { off: 0, len: 512, seed: 1, fua: false },
            Op::Discard { off: 0, len: 512 },
            Op::Read { off: 0, len: 512 },
        ];
        assert!(check_against_model(make, &ops).is_err());
        let anything = ModelConfig { discard: DiscardModel::Anything, ..ModelConfig::default() };
        check_against_model_with(make, &ops, &anything).unwrap();
    }
}
