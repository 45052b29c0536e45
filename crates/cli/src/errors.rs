//! How a failure leaves the CLI, in one place: cryptsetup's exit code for an error chain
//! ([`exit_code`], by the library's [`ErrorKind`]s) and the words printed for each error of
//! it ([`message`]: the library says what is wrong with a value; the CLI names the option
//! that set it, in cryptsetup's words).

use blockdev::{BlockError, BlockErrorKind};
use volume::luks::{LuksError, ParamError, ReencryptError};
use volume::{ErrorKind, VolumeError};

use crate::actions::luks::{Aborted, Mismatch};
use crate::actions::{luks, wipe, NoDevice, Quiet, UsageError};
use crate::exit;

/// Prints a failed action's error chain on stderr: `sealdisk: <error>`, then one
/// `  caused by: <cause>` line per cause, each in the CLI's words ([`message`]).
pub fn report(e: &anyhow::Error) {
    for (i, cause) in e.chain().enumerate() {
        if i == 0 {
            eprintln!("sealdisk: {}", message(cause));
        } else {
            eprintln!("  caused by: {}", message(cause));
        }
    }
}

/// The words shown for one error of a chain: for a library error whose value came from an
/// option, cryptsetup's message naming that option; otherwise its Display.
pub fn message(cause: &(dyn std::error::Error + 'static)) -> String {
    cause.downcast_ref::<LuksError>().and_then(luks_message).unwrap_or_else(|| cause.to_string())
}

/// cryptsetup's (or the CLI's) words for the LUKS errors whose library Display does not
/// name the option at fault.
fn luks_message(e: &LuksError) -> Option<String> {
    use ParamError as P;
    use ReencryptError as R;
    Some(match e {
        LuksError::Param(P::KeyBits { bits }) => format!("--key-size {bits} is not a multiple of 8 bits"),
        LuksError::Param(P::KeyLength { have, want }) => {
            format!("volume key file holds {have} bytes, --key-size asks for {want}")
        }
        LuksError::Param(P::IntegrityNeedsLuks2) => "--integrity needs LUKS2".into(),
        LuksError::Param(P::Priority(_)) => "Option --priority can be only ignore/normal/prefer.".into(),
        LuksError::Param(P::JournalTuningWithoutIntegrity) => {
            "--journal-watermark and --journal-commit-time apply to LUKS2 volumes with --integrity only"
                .into()
        }
        LuksError::Reencrypt(R::KeyslotNotNamed { .. }) => {
            format!("{e} Name the one to keep with --key-slot.")
        }
        LuksError::Reencrypt(R::ResilienceNotApplicable(_)) => {
            "Requested --resilience option cannot be applied to current reencryption operation.".into()
        }
        LuksError::Reencrypt(R::AlreadyLuks) => "Device is already LUKS device. Aborting operation.".into(),
        LuksError::Reencrypt(R::ShiftHeaderAlignment { shift }) => format!(
            "The header takes half of --reduce-device-size ({shift} bytes), which must be a multiple of 4096."
        ),
        LuksError::Reencrypt(R::NotFinished) => {
            "The reencryption wrote every hotzone but was not finished (its \
             old keyslots are gone): finish it with `sealdisk reencrypt --resume-only` first."
                .into()
        }
        LuksError::Reencrypt(R::NeedsRecovery) => "The reencryption was interrupted mid-hotzone and needs \
             recovery, which writes: open it read-write (or resume it with `sealdisk reencrypt`)."
            .into(),
        LuksError::Reencrypt(R::ShiftNeedsRecovery) => {
            "The decryption with data shift was interrupted while it \
             decrypted its last hotzone in place, which needs recovery, which writes: open it read-write (or \
             resume it with `sealdisk reencrypt --resume-only --header FILE DEVICE`)."
                .into()
        }
        _ => return None,
    })
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
        if let Some(code) = volume_code(cause) {
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

/// cryptsetup's exit code for a volume (LUKS, integrity...) error in the chain, if there
/// is one.
pub fn volume_code(cause: &(dyn std::error::Error + 'static)) -> Option<u8> {
    if cause.downcast_ref::<Aborted>().is_some() || cause.downcast_ref::<Mismatch>().is_some() {
        return Some(exit::PERMISSION);
    }
    if let Some(v) = cause.downcast_ref::<VolumeError>() {
        // A wrong BitLocker key exits as cryptsetup's search ends: 2 or 1 (volume::bitlk).
        if let VolumeError::Bitlk { source, .. } = v {
            if let Some(eperm) = source.exits_as_eperm() {
                return Some(if eperm { exit::PERMISSION } else { exit::BAD_ARGS });
            }
        }
        return Some(kind_code(v.kind()));
    }
    if let Some(i) = cause.downcast_ref::<volume::integrity::IntegrityVolumeError>() {
        return Some(kind_code(i.kind()));
    }
    Some(kind_code(cause.downcast_ref::<LuksError>()?.kind()))
}

/// cryptsetup's exit code for an error of `kind` (docs/book/src/exit-codes.md). An internal error
/// exits 1, as cryptsetup's do (`-EINVAL`).
pub fn kind_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::WrongKey | ErrorKind::Permission => exit::PERMISSION,
        ErrorKind::Io | ErrorKind::TooSmall => exit::DEVICE,
        ErrorKind::Busy => exit::BUSY,
        ErrorKind::Internal => exit::FAILURE,
        _ => exit::BAD_ARGS,
    }
}
