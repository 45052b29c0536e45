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
