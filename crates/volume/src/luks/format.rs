//! `luksFormat`: parameters with cryptsetup's defaults (key sizes, detached-header size)
//! and the header write.
use blockdev::BlockDevice;
use sector_crypto::kdf::{HashAlg, Kdf, Passphrase};
use sector_crypto::secure::SecretBuf;
use sector_crypto::VolumeKey;

use super::{
    aead, check_uuid, luks1, luks2, random_uuid, Luks, LuksError, LuksIntegrity, LuksVersion, PbkdfParams,
    LUKS1_KEYSLOTS, LUKS2_KEYSLOTS,
};

/// Parameters of `luksFormat`, with cryptsetup's names and defaults.
#[derive(Debug, Clone)]
pub struct FormatParams {
    /// `--type`: LUKS1 or LUKS2 (default).
    pub version: LuksVersion,
    /// `--cipher` (default `aes-xts-plain64`).
    pub cipher: String,
    /// `--key-size` in bytes (default 64 for XTS, else 32).
    pub key_bytes: usize,
    /// KDF options for keyslot 0 (`--hash` is also the AF and digest hash).
    pub pbkdf: PbkdfParams,
    /// `--sector-size` (LUKS2 only; default 512).
    pub sector_size: u32,
    /// `--label` (LUKS2).
    pub label: Option<String>,
    /// `--subsystem` (LUKS2).
    pub subsystem: Option<String>,
    /// `--uuid`.
    pub uuid: Option<String>,
    /// `--offset`: data offset in 512-byte sectors.
    pub offset: Option<u64>,
    /// `--luks2-metadata-size` in bytes.
    pub metadata_size: Option<u64>,
    /// `--luks2-keyslots-size` in bytes.
    pub keyslots_size: Option<u64>,
    /// `--volume-key-file` contents, else a random key.
    pub volume_key: Option<VolumeKey>,
    /// `--key-slot` for the first keyslot (default 0).
    pub key_slot: Option<u32>,
    /// The header is detached (`--header`): the data starts at `offset` (default 0).
    pub detached: bool,
    /// Size of the data device (for the LUKS2 sector-size alignment check).
    pub data_size: Option<u64>,
    /// `--integrity` (LUKS2 authenticated encryption): `key_bytes` then includes the MAC
    /// key. The dm-integrity area is formatted afterwards by [`format_integrity`].
    pub integrity: Option<LuksIntegrity>,
}

/// cryptsetup's default `--key-size` in bits for `cipher`: 512 for XTS, else 256.
pub fn default_key_bits(cipher: &str) -> usize {
    if cipher.contains("xts") {
        512
    } else {
        256
    }
}

impl FormatParams {
    /// The parameters of `luksFormat --type <version> --cipher <cipher> [--key-size
    /// <key_bits>] [--integrity]`: the volume key is the encryption key (`key_bits`, else
    /// [`default_key_bits`]) plus the MAC key of `integrity`, as cryptsetup counts it.
    /// Refuses a key size that is not whole bytes, and `--integrity` on LUKS1.
    pub fn for_cipher(
        version: LuksVersion,
        cipher: &str,
        key_bits: Option<usize>,
        integrity: Option<LuksIntegrity>,
    ) -> Result<Self, LuksError> {
        let bits = key_bits.unwrap_or_else(|| default_key_bits(cipher));
        let key_bytes = super::key_bytes(bits)?;
        if integrity.is_some() && version != LuksVersion::V2 {
            return Err(super::ParamError::IntegrityNeedsLuks2.into());
        }
        Ok(FormatParams {
            version,
            cipher: cipher.to_owned(),
            key_bytes: key_bytes + integrity.map_or(0, |i| i.spec.mac_key_size()),
            integrity,
            ..FormatParams::default()
        })
    }
}

impl Default for FormatParams {
    fn default() -> Self {
        FormatParams {
            version: LuksVersion::V2,
            cipher: "aes-xts-plain64".into(),
            key_bytes: 64,
            pbkdf: PbkdfParams::default(),
            sector_size: 512,
            label: None,
            subsystem: None,
            uuid: None,
            offset: None,
            metadata_size: None,
            keyslots_size: None,
            volume_key: None,
            key_slot: None,
            detached: false,
            data_size: None,
            integrity: None,
        }
    }
}

/// Formats `meta` (the whole device, or a detached header file) as LUKS with one keyslot
/// protected by `passphrase`. Returns the header and the volume key.
pub fn format(
    meta: &dyn BlockDevice,
    params: &FormatParams,
    passphrase: &Passphrase,
) -> Result<(Luks, VolumeKey), LuksError> {
    check_keyslot_cipher(params)?;
    let vk = match &params.volume_key {
        Some(k) => {
            if k.len() != params.key_bytes {
                return Err(super::ParamError::KeyLength { have: k.len(), want: params.key_bytes }.into());
            }
            k.clone()
        }
        None => {
            let mut k = SecretBuf::zeroed(params.key_bytes);
            sector_crypto::kdf::random_bytes(&mut k).map_err(LuksError::Kdf)?;
            VolumeKey::from_secret(k)
        }
    };
    let max_slots = if params.version == LuksVersion::V1 { LUKS1_KEYSLOTS } else { LUKS2_KEYSLOTS };
    let first_slot = params.key_slot.unwrap_or(0);
    if first_slot >= max_slots {
        return Err(LuksError::BadKeyslot {
            slot: first_slot,
            version: params.version.number(),
            max: max_slots - 1,
        });
    }
    // The data cipher must be usable with this key.
    let sp = sector_crypto::SectorParams {
        sector_size: if params.version == LuksVersion::V2 { params.sector_size } else { 512 },
        iv_offset: 0,
        iv_large_sectors: false,
    };
    if let Some(i) = &params.integrity {
        aead::check_format(params, i, &vk, sp)?;
    } else {
        let spec: sector_crypto::CipherSpec = params
            .cipher
            .parse()
            .map_err(|source| LuksError::Cipher { spec: params.cipher.clone(), source })?;
        sector_crypto::SectorCipher::new(&spec, &vk, sp)
            .map_err(|source| LuksError::Cipher { spec: params.cipher.clone(), source })?;
    }
    if let Some(u) = &params.uuid {
        check_uuid(u)?;
    }
    let uuid = match &params.uuid {
        Some(u) => u.to_ascii_lowercase(),
        None => random_uuid()?,
    };
    // Each format derives keyslot 0's key before its first write.
    let pass = passphrase.as_bytes();
    let (mut luks, key) = match params.version {
        LuksVersion::V1 => luks1::format(meta, params, &vk, &uuid, pass)?,
        LuksVersion::V2 => luks2::format(meta, params, &vk, &uuid, pass)?,
    };
    luks.store_keyslot(meta, first_slot, &vk, &key, params.pbkdf.hash)?;
    Ok((luks, vk))
}

/// Refuses a data cipher and key size that cryptsetup cannot use for keyslot encryption.
///
/// A new keyslot is encrypted with the data cipher and the volume key's size (LUKS1 always,
/// LUKS2 by default), and cryptsetup does that through its userspace crypto backend
/// (OpenSSL or libgcrypt), which has AES-XTS only with 128- and 256-bit AES keys. An
/// aes-xts volume key of 384 bits (AES-192-XTS) would make keyslots that cryptsetup cannot
/// open where it has no dm-crypt fallback, so it is refused with cryptsetup's words. Plain
/// dm-crypt keeps AES-192-XTS: the kernel accepts it and no keyslot is involved.
fn check_keyslot_cipher(params: &FormatParams) -> Result<(), LuksError> {
    // Authenticated encryption keeps its keyslots on aes-xts-plain64 with a 512-bit key.
    if params.integrity.is_some() {
        return Ok(());
    }
    let xts = params.cipher.to_ascii_lowercase().starts_with("aes-xts-");
    if xts && params.key_bytes != 32 && params.key_bytes != 64 {
        return Err(super::ParamError::KeyslotCipher { cipher: params.cipher.clone() }.into());
    }
    Ok(())
}

/// A new keyslot's passphrase already through its KDF. Every operation that adds a keyslot
/// derives this before its first write, so a derivation that is interrupted (a signal ends
/// the process, see `sector_crypto::interrupt`) or fails leaves the device untouched.
pub(crate) struct SlotKey {
    /// The KDF with its costs.
    pub kdf: Kdf,
    /// The keyslot's salt.
    pub salt: [u8; 32],
    /// KDF(passphrase, salt): the keyslot area's key.
    pub area_key: SecretBuf,
}

impl SlotKey {
    /// A fresh salt and the derivation of `key_len` bytes from `pass`.
    pub(crate) fn derive(kdf: Kdf, pass: &[u8], key_len: usize) -> Result<Self, LuksError> {
        let mut salt = [0u8; 32];
        sector_crypto::kdf::random_bytes(&mut salt).map_err(LuksError::Kdf)?;
        let area_key = kdf.derive(pass, &salt, key_len).map_err(LuksError::Kdf)?;
        Ok(SlotKey { kdf, salt, area_key })
    }
}

pub(crate) fn parse_hash(name: &str) -> Result<HashAlg, LuksError> {
    // cryptsetup: "Requested hash X is not supported."
    name.parse().map_err(|_| LuksError::Unsupported(format!("Requested hash {name:?} is not supported.")))
}

/// The LUKS2 layout luksFormat makes for `p`: metadata copy size, keyslots area size and
/// data offset, in bytes; cryptsetup's refusals of the size options come from here.
pub fn luks2_layout(p: &FormatParams) -> Result<(u64, u64, u64), LuksError> {
    super::luks2::storage(p)
}

/// Bytes a detached header file needs for `p` (cryptsetup grows file-backed header devices
/// to this): LUKS1 up to the end of the last keyslot, rounded up to 4096 bytes; LUKS2 both
/// metadata copies and the keyslots area.
pub fn header_size(p: &FormatParams) -> u64 {
    match p.version {
        LuksVersion::V1 => {
            let (_, end) = formats::luks1::standard_keyslot_layout(p.key_bytes as u32);
            (end * 512).div_ceil(4096) * 4096
        }
        // The layout luksFormat will use (a data offset caps the keyslots area, as in
        // cryptsetup); parameters it refuses are refused there.
        LuksVersion::V2 => match super::luks2::storage(p) {
            Ok((md, ks, _)) => 2 * md + ks,
            Err(_) => {
                let md = p.metadata_size.unwrap_or(16 << 10);
                2 * md + p.keyslots_size.unwrap_or((16 << 20) - 2 * md)
            }
        },
    }
}

/// Opens (creating or growing it to [`header_size`]) the detached header `locator` that
/// `luksFormat --header` writes.
pub fn open_header_for_format(
    locator: &str,
    p: &FormatParams,
    so: &crate::storage::StorageOptions,
) -> Result<crate::Storage, crate::VolumeError> {
    crate::storage::ensure_size(locator, header_size(p))?;
    crate::storage::open(locator, so)
}
