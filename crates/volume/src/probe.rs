//! What is on a device: the one place that tells formats apart.
//!
//! Adding a format (TrueCrypt, BitLocker, ...) is one variant of [`Format`] and one check in
//! [`probe`], then one arm in `assemble::open` that unlocks and stacks it.
use blockdev::BlockDevice;

use crate::luks::{self, LuksVersion};
use crate::VolumeError;

/// A format found on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// A LUKS1 header.
    Luks1,
    /// A LUKS2 header (`aead`: its segment has authenticated encryption over dm-integrity;
    /// `false` too when the header does not load).
    Luks2 {
        /// Authenticated encryption (`luksFormat --integrity`).
        aead: bool,
    },
    /// A standalone dm-integrity superblock.
    Integrity,
    /// Nothing sealdisk knows (plain dm-crypt looks like this: it has no header).
    Unknown,
}

impl Format {
    /// Words for the refusal of a LUKS open: what the device holds instead.
    pub(crate) fn luks_refusal_note(&self) -> &'static str {
        match self {
            Format::Integrity => ": it holds a dm-integrity superblock.",
            _ => ".",
        }
    }

    /// A short name (`LUKS2 (authenticated)`, `dm-integrity`, `unknown`).
    pub fn name(&self) -> &'static str {
        match self {
            Format::Luks1 => "LUKS1",
            Format::Luks2 { aead: false } => "LUKS2",
            Format::Luks2 { aead: true } => "LUKS2 (authenticated encryption)",
            Format::Integrity => "dm-integrity",
            Format::Unknown => "unknown",
        }
    }
}

/// Says what is on `dev` (`name` for messages). Reads the first blocks only; a LUKS2
/// header is loaded (read-only, never repaired) to tell authenticated encryption apart.
pub fn probe(dev: &dyn BlockDevice, name: &str) -> Result<Format, VolumeError> {
    let luks_err = |source| VolumeError::Luks { path: name.to_owned(), source };
    match luks::probe(dev).map_err(luks_err)? {
        Some(LuksVersion::V1) => return Ok(Format::Luks1),
        Some(LuksVersion::V2) => {
            let aead = luks::Luks::load(dev, false).ok().and_then(|l| l.aead().ok().flatten()).is_some();
            return Ok(Format::Luks2 { aead });
        }
        None => {}
    }
    let integrity = crate::integrity::probe(dev)
        .map_err(|source| VolumeError::Device { path: name.to_owned(), source })?;
    Ok(if integrity { Format::Integrity } else { Format::Unknown })
}
