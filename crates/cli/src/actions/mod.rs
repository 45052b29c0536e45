//! One module per action: parse → call a library → print.

pub mod bench;
pub mod benchmark;
pub mod demo;
pub mod docs;
pub mod integrity;
pub mod luks;
pub mod luks_format;
pub mod luks_header;
pub mod luks_keyslot;
pub mod luks_open;
pub mod open;
pub mod wipe;

use blockdev::BlockErrorKind;
use volume::VolumeError;

use crate::exit;

/// A usage error (exit code 1), e.g. conflicting options.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Maps an error chain to cryptsetup's exit codes.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.downcast_ref::<wipe::WipeInterrupted>().is_some() {
            return wipe::WIPE_INTERRUPTED;
        }
        if let Some(code) = luks::exit_code(cause) {
            return code;
        }
        if cause.downcast_ref::<UsageError>().is_some() {
            return exit::BAD_ARGS;
        }
        if let Some(v) = cause.downcast_ref::<VolumeError>() {
            return match v {
                VolumeError::Device { source, .. } => match source.kind() {
                    BlockErrorKind::ReadOnly => exit::PERMISSION,
                    _ => exit::DEVICE,
                },
                VolumeError::Layout { .. } => exit::DEVICE,
                _ => exit::BAD_ARGS,
            };
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::NotFound => exit::DEVICE,
                std::io::ErrorKind::PermissionDenied => exit::PERMISSION,
                _ => continue,
            };
        }
    }
    exit::FAILURE
}
