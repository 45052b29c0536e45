//! BitLocker volumes, as cryptsetup's `--type bitlk` opens them: load the FVE metadata,
//! unlock a VMK with a password, recovery password or startup key (.BEK), decrypt the
//! FVEK, and map the volume as cryptsetup's multi-segment dm table does:
//!
//! ```text
//!   mapped device (512-byte sectors)            storage
//!   [0, vh)            crypt ───────────────►  [vh_offset, +vh)  IV sectors from vh_offset:
//!                                                                the boot sectors BitLocker moved
//!   [meta_i, +64 KiB)  zero (3 FVE metadata areas: read as zeroes, writes refused)
//!   [vh_offset, +vh)   zero (where the moved boot sectors are stored)
//!   everything else    crypt ───────────────►  same sectors, IV = sector
//! ```
//! The dm `zero` target drops writes; here they are refused (I/O error), so a write can
//! never land in the metadata. The cipher is `aes-xts-plain64`, `aes-cbc-eboiv` or
//! `aes-cbc-elephant` (sector-crypto), as the metadata's encryption method says.
use std::sync::Arc;

use blockdev::{BlockDevice, BlockError, BlockErrorKind, BlockResult, Caps, Geometry, WriteFlags};
use formats::bitlk::{self as fmt, BitlkError, Metadata, Protection, VolumeHeader, METADATA_AREA};
use formats::dm::{CryptOptions, CryptTable};
use sector_crypto::bitlk::{self as keys, BitlkKeyError};
use sector_crypto::kdf::Passphrase;
use sector_crypto::VolumeKey;
use zeroize::Zeroizing;

use crate::error::{block_kind, ErrorKind};
use crate::keys::Keys;
use crate::storage::Storage;
use crate::PassphraseSource;
use crate::{crypt_over, OpenOptions, VolumeError};

/// Why a BitLocker volume could not be loaded or unlocked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BitlkVolumeError {
    /// The metadata does not parse (or names a variant that is not supported).
    #[error("BITLK metadata")]
    Metadata(#[source] BitlkError),
    /// None of the three metadata blocks is valid.
    #[error("no valid BITLK metadata block (the last one failed)")]
    NoValidMetadata(#[source] BitlkError),
    /// Reading the storage failed.
    #[error("reading BITLK metadata")]
    Io(#[source] BlockError),
    /// The passphrase, recovery password or startup key opens no VMK.
    #[error("No key available with this passphrase.")]
    WrongKey {
        /// How cryptsetup 2.6 ends the same search (`BITLK_get_volume_key`): the last VMK
        /// tried sets its error, `-EPERM` (exit 2) where that VMK is a recovery password given
        /// text that is not one, or a startup key given input that is not its .BEK, and
        /// `-EINVAL` (exit 1) where a key was derived but did not unwrap the VMK (a password
        /// VMK, a well-formed recovery password). See [`BitlkVolumeError::exits_as_eperm`].
        eperm: bool,
    },
    /// The VMK opened but the FVEK does not decrypt with it: damaged metadata.
    #[error("the FVEK does not decrypt with the VMK (damaged metadata)")]
    Fvek(#[source] BitlkKeyError),
    /// The .BEK file does not parse.
    #[error("invalid startup key (.BEK) file")]
    Bek(#[source] BitlkError),
    /// Only protectors cryptsetup cannot use (TPM).
    #[error("no usable keyslot: {0}")]
    NoUsableKeyslot(String),
}

impl BitlkVolumeError {
    /// The cause.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Metadata(BitlkError::Unsupported(_)) | Self::NoUsableKeyslot(_) => ErrorKind::Unsupported,
            Self::Metadata(BitlkError::NotBitlk) => ErrorKind::Usage,
            Self::Metadata(_) | Self::NoValidMetadata(_) | Self::Fvek(_) => ErrorKind::Corrupt,
            Self::Io(e) => block_kind(e),
            Self::WrongKey { .. } => ErrorKind::WrongKey,
            Self::Bek(_) => ErrorKind::Usage,
        }
    }

    /// Whether cryptsetup 2.6 fails the same key with `-EPERM` (exit 2, "No key available
    /// with this passphrase.") rather than `-EINVAL` (exit 1, silently): only a
    /// [`BitlkVolumeError::WrongKey`] can differ from its [`ErrorKind`]'s code.
    pub fn exits_as_eperm(&self) -> Option<bool> {
        match self {
            Self::WrongKey { eperm } => Some(*eperm),
            _ => None,
        }
    }
}

/// A loaded (not yet unlocked) BitLocker volume: what `bitlkDump` shows.
#[derive(Debug, Clone)]
pub struct Bitlk {
    /// Sector 0.
    pub header: VolumeHeader,
    /// The first valid FVE metadata block.
    pub metadata: Metadata,
}

/// What unlocks a BitLocker volume.
pub enum BitlkKey {
    /// A password or a recovery password (cryptsetup takes both as the passphrase).
    Passphrase(Passphrase),
    /// A key file: a .BEK startup key, else its bytes as the passphrase.
    KeyFile(Zeroizing<Vec<u8>>),
    /// The FVEK itself (`--volume-key-file`), as the dm key.
    VolumeKey(VolumeKey),
}

impl std::fmt::Debug for BitlkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BitlkKey::Passphrase(_) => "BitlkKey::Passphrase(redacted)",
            BitlkKey::KeyFile(_) => "BitlkKey::KeyFile(redacted)",
            BitlkKey::VolumeKey(_) => "BitlkKey::VolumeKey(redacted)",
        })
    }
}

fn read(dev: &dyn BlockDevice, off: u64, len: usize) -> Result<Vec<u8>, BitlkVolumeError> {
    let mut buf = vec![0u8; len];
    dev.read_at(off, &mut buf).map_err(BitlkVolumeError::Io)?;
    Ok(buf)
}

/// Loads the volume header and the first valid of the three metadata blocks.
pub fn load(dev: &dyn BlockDevice) -> Result<Bitlk, BitlkVolumeError> {
    let size = dev.geometry().size;
    if size < 512 {
        return Err(BitlkVolumeError::Metadata(BitlkError::Truncated("volume header")));
    }
    let header = fmt::parse_volume_header(&read(dev, 0, 512)?).map_err(BitlkVolumeError::Metadata)?;
    let mut last = BitlkError::Truncated("metadata block");
    for off in header.metadata_offsets {
        let Some(end) = off.checked_add(METADATA_AREA).filter(|&e| e <= size) else {
            last = BitlkError::Invalid { field: "metadata offset beyond the device", value: off };
            continue;
        };
        let block = read(dev, off, (end - off) as usize)?;
        match fmt::parse_metadata(&block) {
            Ok(m) => {
                if let Err(e) = check_layout(&m, size) {
                    last = e;
                    continue;
                }
                return Ok(Bitlk { header, metadata: m });
            }
            Err(e @ BitlkError::Unsupported(_)) => return Err(BitlkVolumeError::Metadata(e)),
            Err(e) => {
                log::debug!("BITLK metadata block at {off}: {e}");
                last = e;
            }
        }
    }
    Err(BitlkVolumeError::NoValidMetadata(last))
}

fn check_layout(m: &Metadata, size: u64) -> Result<(), BitlkError> {
    let vh_end = m.volume_header_offset.checked_add(m.volume_header_size);
    if vh_end.is_none_or(|e| e > size) {
        return Err(BitlkError::Invalid {
            field: "volume header beyond the device",
            value: m.volume_header_offset,
        });
    }
    if m.volume_header_size >= size {
        return Err(BitlkError::Invalid { field: "volume header size", value: m.volume_header_size });
    }
    for o in m.metadata_offsets {
        if o % 512 != 0 || o.checked_add(METADATA_AREA).is_none_or(|e| e > size) {
            return Err(BitlkError::Invalid { field: "metadata offset", value: o });
        }
    }
    Ok(())
}

impl Bitlk {
    /// The dm cipher (`aes-xts-plain64`, `aes-cbc-eboiv`, `aes-cbc-elephant`).
    pub fn cipher(&self) -> String {
        format!("aes-{}", self.metadata.method.mode())
    }

    /// Unlocks the VMK with `key` and decrypts the FVEK: the dm key.
    pub fn unlock(&self, key: &BitlkKey) -> Result<VolumeKey, BitlkVolumeError> {
        let vmk = match key {
            BitlkKey::VolumeKey(k) => return Ok(VolumeKey::from_slice(k.as_bytes())),
            BitlkKey::Passphrase(p) => self.vmk_from_passphrase(p.as_bytes())?,
            BitlkKey::KeyFile(bytes) => match fmt::parse_bek(bytes) {
                Ok(bek) => self.vmk_from_bek(&bek)?,
                Err(_) => self.vmk_from_passphrase(bytes)?,
            },
        };
        let f = &self.metadata.fvek;
        let fvek = keys::unwrap_key(&vmk, &f.nonce, &f.mac, &f.data).map_err(BitlkVolumeError::Fvek)?;
        let dm = self.metadata.method.dm_key(&fvek).map_err(BitlkVolumeError::Metadata)?;
        Ok(VolumeKey::from_slice(&dm))
    }

    fn usable(&self) -> Result<(), BitlkVolumeError> {
        let usable = [Protection::Passphrase, Protection::RecoveryPassphrase, Protection::StartupKey];
        if self.metadata.vmks.iter().any(|v| usable.contains(&v.protection)) {
            return Ok(());
        }
        let kinds: Vec<String> = self.metadata.vmks.iter().map(|v| v.protection.describe()).collect();
        Err(BitlkVolumeError::NoUsableKeyslot(if kinds.is_empty() {
            "no VMK".into()
        } else {
            kinds.join(", ")
        }))
    }

    fn vmk_from_passphrase(&self, pass: &[u8]) -> Result<[u8; 32], BitlkVolumeError> {
        self.usable()?;
        // cryptsetup's error after each VMK tried, as `BITLK_get_volume_key` keeps it.
        let mut eperm = false;
        for v in &self.metadata.vmks {
            let Some(enc) = &v.key else { continue };
            let wrapping = match v.protection {
                Protection::Passphrase => keys::password_key(pass, &v.salt),
                Protection::RecoveryPassphrase => match keys::recovery_key(pass, &v.salt) {
                    Ok(k) => k,
                    Err(_) => {
                        eperm = true;
                        continue;
                    }
                },
                // Text is never a startup key whose GUID matches: -EPERM.
                Protection::StartupKey => {
                    eperm = true;
                    continue;
                }
                _ => continue,
            };
            if let Ok(vmk) = keys::unwrap_key(&wrapping, &enc.nonce, &enc.mac, &enc.data) {
                return vmk_bytes(&vmk);
            }
            eperm = false;
        }
        Err(BitlkVolumeError::WrongKey { eperm })
    }

    fn vmk_from_bek(&self, bek: &fmt::Bek) -> Result<[u8; 32], BitlkVolumeError> {
        // cryptsetup tries the .BEK's bytes on every VMK: as a password (-EINVAL), as a
        // recovery password (never one: -EPERM), as a startup key (another GUID: -EPERM).
        let mut eperm = false;
        for v in &self.metadata.vmks {
            let Some(enc) = &v.key else { continue };
            match v.protection {
                Protection::Passphrase => eperm = false,
                Protection::RecoveryPassphrase => eperm = true,
                Protection::StartupKey if v.guid != bek.guid => eperm = true,
                Protection::StartupKey => {
                    if let Ok(vmk) = keys::unwrap_key(&bek.key, &enc.nonce, &enc.mac, &enc.data) {
                        return vmk_bytes(&vmk);
                    }
                    eperm = false;
                }
                _ => {}
            }
        }
        Err(BitlkVolumeError::WrongKey { eperm })
    }

    /// The segments of the mapped device over a storage of `size` bytes (see the module
    /// docs), sorted, covering `[0, size)` rounded down to 512 bytes.
    pub fn segments(&self, size: u64) -> Vec<Segment> {
        let m = &self.metadata;
        let end = size - size % 512;
        let vh = m.volume_header_size;
        let mut holes: Vec<(u64, u64)> = m.metadata_offsets.iter().map(|&o| (o, o + METADATA_AREA)).collect();
        holes.push((m.volume_header_offset, m.volume_header_offset + vh));
        holes.sort_unstable();
        let mut out = vec![Segment {
            start: 0,
            len: vh,
            kind: SegmentKind::Crypt { device_offset: m.volume_header_offset },
        }];
        let mut pos = vh;
        for (a, b) in holes {
            let (a, b) = (a.max(pos).min(end), b.min(end));
            if a > pos {
                out.push(Segment {
                    start: pos,
                    len: a - pos,
                    kind: SegmentKind::Crypt { device_offset: pos },
                });
            }
            if b > a.max(pos) {
                out.push(Segment { start: a.max(pos), len: b - a.max(pos), kind: SegmentKind::Zero });
            }
            pos = pos.max(b);
        }
        if end > pos {
            out.push(Segment { start: pos, len: end - pos, kind: SegmentKind::Crypt { device_offset: pos } });
        }
        out
    }
}

fn vmk_bytes(vmk: &[u8]) -> Result<[u8; 32], BitlkVolumeError> {
    vmk.get(..32)
        .and_then(|s| <[u8; 32]>::try_from(s).ok())
        .ok_or(BitlkVolumeError::Metadata(BitlkError::Invalid { field: "VMK size", value: vmk.len() as u64 }))
}

/// One piece of the mapped device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Start on the mapped device.
    pub start: u64,
    /// Length.
    pub len: u64,
    /// What backs it.
    pub kind: SegmentKind,
}

/// What backs a [`Segment`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    /// dm-crypt over the storage at `device_offset`, IV sectors counted from there.
    Crypt {
        /// Byte offset on the storage.
        device_offset: u64,
    },
    /// Reads zeroes; writes refused.
    Zero,
}

/// The mapped BitLocker device: the segments of [`Bitlk::segments`] over one crypt target
/// for the volume (identity mapping) and one for the moved boot sectors.
#[derive(Debug)]
pub struct BitlkDevice {
    segments: Vec<Segment>,
    /// Crypt over the whole storage, IV = storage sector.
    body: Arc<dyn BlockDevice>,
    geometry: Geometry,
    read_only: bool,
}

impl BitlkDevice {
    fn pieces(&self, off: u64, len: u64) -> BlockResult<Vec<(Segment, u64, u64)>> {
        if off.checked_add(len).is_none_or(|e| e > self.geometry.size) {
            return Err(BlockError::out_of_range(off, len, self.geometry.size));
        }
        let mut out = Vec::new();
        for s in &self.segments {
            let (a, b) = (off.max(s.start), (off + len).min(s.start + s.len));
            if a < b {
                out.push((*s, a, b - a));
            }
        }
        Ok(out)
    }
}

impl BlockDevice for BitlkDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn caps(&self) -> Caps {
        Caps::FLUSH
    }

    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        let mut at = 0usize;
        for (s, a, n) in self.pieces(off, buf.len() as u64)? {
            let part = &mut buf[at..at + n as usize];
            match s.kind {
                SegmentKind::Zero => part.fill(0),
                SegmentKind::Crypt { device_offset } => {
                    self.body.read_at(device_offset + (a - s.start), part)?
                }
            }
            at += n as usize;
        }
        Ok(())
    }

    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::read_only());
        }
        let pieces = self.pieces(off, buf.len() as u64)?;
        if pieces.iter().any(|(s, _, _)| s.kind == SegmentKind::Zero) {
            return Err(BlockError::new(
                BlockErrorKind::Io,
                format!("write at {off} length {} touches BitLocker metadata", buf.len()),
            ));
        }
        let mut at = 0usize;
        for (s, a, n) in pieces {
            if let SegmentKind::Crypt { device_offset } = s.kind {
                self.body.write_at(device_offset + (a - s.start), &buf[at..at + n as usize], flags)?;
            }
            at += n as usize;
        }
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        self.body.flush()
    }
}

/// The keys a [`BitlkKey`] stands for: its passphrase, key file or volume key.
impl From<BitlkKey> for Keys<'_> {
    fn from(k: BitlkKey) -> Self {
        match k {
            BitlkKey::Passphrase(p) => Keys::none().with_passphrase(p),
            BitlkKey::KeyFile(bytes) => Keys::none().with_key_file(bytes),
            BitlkKey::VolumeKey(vk) => Keys::none().with_volume_key(vk),
        }
    }
}

/// Unlocks `b` with `keys`: the volume key if given, else the key file (a .BEK startup
/// key, else a passphrase file), else each passphrase in turn until one opens a VMK. The
/// metadata was loaded first, so a device that is not BitLocker is refused before a
/// passphrase is asked for.
/// `path` names the device in errors.
pub fn unlock_with(b: &Bitlk, keys: &mut Keys<'_>, path: &str) -> Result<VolumeKey, VolumeError> {
    let wrap = |source| VolumeError::Bitlk { path: path.to_owned(), source };
    if let Some(k) = keys.volume_key() {
        return b.unlock(&BitlkKey::VolumeKey(k.clone())).map_err(wrap);
    }
    if let Some(bytes) = keys.key_file() {
        return b.unlock(&BitlkKey::KeyFile(bytes.clone())).map_err(wrap);
    }
    let mut last = BitlkVolumeError::WrongKey { eperm: true };
    while let Some(pass) = keys.next_passphrase()? {
        match b.unlock(&BitlkKey::Passphrase(pass)) {
            Err(e @ BitlkVolumeError::WrongKey { .. }) => {
                keys.rejected();
                last = e;
            }
            r => return r.map_err(wrap),
        }
    }
    Err(wrap(last))
}

/// Opens `storage` as BitLocker: load, unlock, map. Returns the device and the crypt table
/// of the body (for status).
pub(crate) fn open_on(
    keys: &mut Keys<'_>,
    storage: Storage,
    opts: &OpenOptions,
) -> Result<(Arc<dyn BlockDevice>, CryptTable, Bitlk), VolumeError> {
    let wrap = |source| VolumeError::Bitlk { path: storage.name.clone(), source };
    let b = load(&*storage.device).map_err(wrap)?;
    let key = unlock_with(&b, keys, &storage.name)?;
    let size = storage.size();
    let sector_size = u32::from(b.header.sector_size);
    let mut options = CryptOptions::default();
    if sector_size != 512 {
        options.sector_size = Some(sector_size);
        options.iv_large_sectors = true;
    }
    let table = CryptTable {
        len: size / 512,
        cipher: b.cipher(),
        key: Zeroizing::new(key.as_bytes().to_vec()),
        iv_offset: 0,
        device: storage.name.clone(),
        offset: 0,
        options,
    };
    let segments = b.segments(size);
    let body: Arc<dyn BlockDevice> = Arc::new(crypt_over(storage.device.clone(), &table, opts)?);
    let geometry = Geometry { size: size - size % 512, ..body.geometry() };
    let dev = BitlkDevice { segments, body, geometry, read_only: opts.read_only };
    Ok((Arc::new(dev), table, b))
}

/// `Sat Oct  8 18:09:21 2021` (C `ctime`, in UTC) of a FILETIME.
fn ctime(filetime: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let secs = (filetime / 10_000_000) as i64 - 11_644_473_600;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {y}",
        DAYS[days.rem_euclid(7) as usize],
        MONTHS[(m - 1) as usize],
        d,
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl Bitlk {
    /// `cryptsetup bitlkDump` (2.6) text for `device`.
    pub fn dump(&self, device: &str) -> String {
        use std::fmt::Write;
        let m = &self.metadata;
        let mut s = String::new();
        let _ = writeln!(s, "Info for BITLK device {device}.");
        let _ = writeln!(s, "Version:      \t{}", m.version);
        let _ = writeln!(s, "GUID:         \t{}", fmt::format_guid(&m.guid));
        let _ = writeln!(s, "Sector size:  \t{} [bytes]", self.header.sector_size);
        let _ = writeln!(s, "Volume size:  \t{} [bytes]", m.volume_size);
        let _ = writeln!(s, "Created:      \t{}", ctime(m.created));
        let _ = writeln!(s, "Description:  \t{}", m.description.as_deref().unwrap_or(""));
        let _ = writeln!(s, "Cipher name:  \taes");
        let _ = writeln!(s, "Cipher mode:  \t{}", m.method.mode());
        let _ = writeln!(s, "Cipher key:   \t{} bits", m.method.key_bits());
        let _ = writeln!(s, "\nKeyslots:");
        for (i, v) in m.vmks.iter().enumerate() {
            let _ = writeln!(s, " {i}: VMK");
            if let Some(n) = &v.name {
                let _ = writeln!(s, "\tName:       \t{n}");
            }
            let _ = writeln!(s, "\tGUID:       \t{}", fmt::format_guid(&v.guid));
            let _ = writeln!(s, "\tProtection: \t{}", v.protection.describe());
            let _ = writeln!(s, "\tSalt:       \t{}", hex::encode(v.salt));
            if let Some(k) = &v.key {
                let _ = writeln!(s, "\tKey data size:\t{} [bytes]", k.data.len());
            }
        }
        let _ = writeln!(s, " {}: FVEK", m.vmks.len());
        let _ = writeln!(s, "\tKey data size:\t{} [bytes]", m.fvek.data.len());
        let _ = writeln!(s, "\nMetadata segments:");
        for (i, o) in m.metadata_offsets.iter().enumerate() {
            let _ = writeln!(
                s,
                " {i}: FVE metadata area\n\tOffset: \t{o} [bytes]\n\tSize:   \t{METADATA_AREA} [bytes]"
            );
        }
        let _ = writeln!(
            s,
            " 3: Volume header\n\tOffset: \t{} [bytes]\n\tSize:   \t{} [bytes]\n\tCipher: \t{}",
            m.volume_header_offset,
            m.volume_header_size,
            self.cipher()
        );
        s
    }

    /// `bitlkDump --dump-volume-key` text (cryptsetup 2.6) for `device` with the dm key `vk`.
    pub fn dump_volume_key(&self, device: &str, vk: &VolumeKey) -> Zeroizing<String> {
        use std::fmt::Write;
        let m = &self.metadata;
        let mut s = Zeroizing::new(String::new());
        let _ = writeln!(s, "BITLK header information for {device}");
        let _ = writeln!(s, "Cipher name:   \taes");
        let _ = writeln!(s, "Cipher mode:   \t{}", m.method.mode());
        let _ = writeln!(s, "UUID:          \t{}", fmt::format_guid(&m.guid));
        let _ = writeln!(s, "MK bits:       \t{}", vk.len() * 8);
        s.push_str("MK dump:\t");
        for (i, line) in vk.as_bytes().chunks(16).enumerate() {
            if i > 0 {
                s.push_str("\t\t");
            }
            for b in line {
                let _ = write!(s, "{b:02x} ");
            }
            s.push('\n');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ctime_matches_c() {
        // 2021-10-08 18:09:21 UTC as a FILETIME.
        let ft = (1_633_716_561u64 + 11_644_473_600) * 10_000_000;
        assert_eq!(super::ctime(ft), "Fri Oct  8 18:09:21 2021");
    }
}
