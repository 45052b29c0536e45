//! Model-based property tests over the devices of `blockdev` and `testkit`.

use crate::common;

use std::sync::Arc;

use blockdev::{BlockDevice, FileOptions, Geometry, MemDevice, Slice};
use common::{direct, read_only, Images};
use proptest::prelude::*;
use testkit::model::{self, DiscardModel, ModelConfig};
use testkit::CrashDevice;

const KIB: u64 = 1024;

#[test]
fn mem_device_matches_model_with_512_byte_blocks() {
    let config = ModelConfig { discard: DiscardModel::Zeroes, ..ModelConfig::default() };
    model::run(|| Arc::new(MemDevice::new(128 * KIB, 512)) as Arc<dyn BlockDevice>, config);
}

#[test]
fn slice_over_mem_matches_model() {
    model::run(
        || {
            Arc::new(Slice::new(MemDevice::new(160 * KIB, 4096), 8 * KIB, 128 * KIB).unwrap())
                as Arc<dyn BlockDevice>
        },
        ModelConfig::default(),
    );
}

#[test]
fn file_device_matches_model_when_buffered() {
    let images = Images::new();
    model::run(|| images.create(128 * KIB, FileOptions::default()), ModelConfig::default());
}

#[test]
fn file_device_matches_model_with_o_direct() {
    let images = Images::new();
    if !images.direct_supported() {
        return;
    }
    let config = ModelConfig { cases: 32, ..ModelConfig::default() };
    model::run(|| images.create(128 * KIB, direct()), config);
}

#[test]
fn slice_over_file_matches_model() {
    let images = Images::new();
    let make = || {
        let file = images.create(192 * KIB, FileOptions::default());
        Arc::new(Slice::new(file, 32 * KIB, 128 * KIB).unwrap()) as Arc<dyn BlockDevice>
    };
    model::run(make, ModelConfig { cases: 32, ..ModelConfig::default() });
}

#[test]
fn file_device_matches_model_when_read_only() {
    let images = Images::new();
    model::run(|| images.create(64 * KIB, read_only()), ModelConfig { cases: 16, ..ModelConfig::default() });
}

#[test]
fn crash_device_matches_model() {
    model::run(|| Arc::new(CrashDevice::new(64 * KIB, 512)) as Arc<dyn BlockDevice>, ModelConfig::default());
}

// The same property through the `proptest!` macro, as a crate with its own runner would write it.
proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn mem_device_matches_model_with_4096_byte_blocks(
        ops in model::ops(Geometry::new(64 * 4096, 4096), &ModelConfig::default())
    ) {
        model::check_against_model(|| Arc::new(MemDevice::new(64 * 4096, 4096)) as Arc<dyn BlockDevice>, &ops)?;
    }
}
