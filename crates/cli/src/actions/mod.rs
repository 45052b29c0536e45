//! One module per action: parse → call a library → print.

pub mod bench;
pub mod benchmark;
pub mod bitlk;
pub mod demo;
pub mod docs;
pub mod fvault2;
pub mod integrity;
pub mod luks;
pub mod luks_format;
pub mod luks_header;
pub mod luks_keyslot;
pub mod luks_open;
pub mod luks_token;
pub mod objcopy;
pub mod open;
pub mod probe;
pub mod reencrypt;
pub mod repair;
pub mod resize_offline;
pub mod tcrypt;
pub mod wipe;

use blockdev::{BlockError, BlockErrorKind};

use crate::exit;

/// A usage error (exit code 1), e.g. conflicting options.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// cryptsetup's "Device X does not exist or access denied." (exit code 4).
#[derive(Debug, thiserror::Error)]
#[error("Device {0} does not exist or access denied.")]
pub struct NoDevice(pub String);

/// A failure already reported (or silent by design, as `isLuks`): nothing more is printed,
/// the process exits with this code.
#[derive(Debug, thiserror::Error)]
#[error("exit code {0}")]
pub struct Quiet(pub u8);

/// Checks that `path` can be opened at all, as cryptsetup does before anything else: a
/// missing or forbidden path is [`NoDevice`]. Other failures are left to the real open,
/// which reports them with more context.
/// An object-storage locator (`s3://…`) is left to the real open, which names what is wrong.
pub fn ensure_device(path: &str) -> anyhow::Result<()> {
    if volume::storage::scheme(path).is_some_and(|s| !s.eq_ignore_ascii_case("file")) {
        return Ok(());
    }
    match std::fs::File::open(path) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied) => {
            log::debug!("opening {path}: {e}");
            Err(NoDevice(path.to_owned()).into())
        }
        Err(_) => Ok(()),
    }
}

/// Maps an error chain to cryptsetup's exit codes (src/utils_tools.c `translate_errno`):
/// 1 wrong parameters or other failure, 2 permission or passphrase, 4 wrong device,
/// 5 busy (the storage or the listening socket is in use).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    // A passphrase source's own failure (a key file, a prompt) decides by its own chain.
    if let Some(inner) = luks::source_error(e) {
        return exit_code(inner);
    }
    // Some causes decide wherever they are in the chain.
    for cause in e.chain() {
        if let Some(Quiet(code)) = cause.downcast_ref::<Quiet>() {
            return *code;
        }
        if cause.downcast_ref::<NoDevice>().is_some() || cause.is::<crate::control::client::Inactive>() {
            return exit::DEVICE;
        }
        if let Some(r) = cause.downcast_ref::<crate::control::client::Refused>() {
            return r.code;
        }
        if cause.is::<crate::control::NameInUse>() {
            return exit::BUSY;
        }
        if cause.downcast_ref::<BlockError>().is_some_and(|b| b.kind() == BlockErrorKind::Busy) {
            return exit::BUSY;
        }
        if cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
        {
            return exit::BUSY;
        }
    }
    for cause in e.chain() {
        if cause.downcast_ref::<wipe::WipeInterrupted>().is_some() {
            return wipe::WIPE_INTERRUPTED;
        }
        // Typed volume errors decide by their kind (`volume::ErrorKind`).
        if let Some(code) = luks::exit_code(cause) {
            return code;
        }
        if cause.downcast_ref::<UsageError>().is_some() {
            return exit::BAD_ARGS;
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
