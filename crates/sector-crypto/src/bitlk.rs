//! BitLocker key derivation and key unwrapping (cryptsetup's `--type bitlk`): pure functions
//! over bytes, no I/O.
//!
//! ```text
//!   password ──UTF-16LE──SHA-256──SHA-256──┐
//!   recovery password ─decode─► 16 bytes ─SHA-256─┤
//!                                               ▼
//!                       stretch(initial, salt)  0x100000 × SHA-256 over
//!                       { last[32] | initial[32] | salt[16] | le64 count }
//!                                               │ 32-byte key
//!                                               ▼
//!   VMK  = AES-256-CCM⁻¹(key,  nonce[12], mac[16], data)   (startup key: the .BEK's key)
//!   FVEK = AES-256-CCM⁻¹(VMK,  nonce[12], mac[16], data)
//! ```
//!
//! The layout of the decrypted key blobs and the recovery-password rules follow libbde's
//! "BitLocker Drive Encryption (BDE) format" document and cryptsetup's `lib/bitlk`.

use aes::Aes256;
use ccm::aead::AeadInOut;
use ccm::consts::{U12, U16};
use ccm::{Ccm, KeyInit};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// SHA-256 rounds of the BitLocker stretch.
pub const STRETCH_ITERATIONS: u64 = 0x10_0000;

/// Digits in a recovery password (8 groups of 6, dashes between them optional in input).
const RECOVERY_GROUPS: usize = 8;

/// Why a key could not be derived or unwrapped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BitlkKeyError {
    /// A recovery password is 48 digits in 8 groups, each a multiple of 11 below 720896.
    #[error("not a BitLocker recovery password: {0}")]
    BadRecoveryPassword(&'static str),
    /// The AES-CCM tag did not verify: wrong key (or damaged metadata).
    #[error("AES-CCM authentication failed")]
    Authentication,
    /// The encrypted blob is too short, or the decrypted blob's header is inconsistent.
    #[error("malformed encrypted key: {0}")]
    Malformed(&'static str),
}

/// The stretch key: [`STRETCH_ITERATIONS`] rounds of SHA-256 over
/// `{ last | initial | salt | le64 round }`, starting from `last = 0`.
pub fn stretch_key(initial: &[u8; 32], salt: &[u8; 16]) -> Zeroizing<[u8; 32]> {
    stretch_rounds(initial, salt, STRETCH_ITERATIONS)
}

fn stretch_rounds(initial: &[u8; 32], salt: &[u8; 16], rounds: u64) -> Zeroizing<[u8; 32]> {
    let mut block = Zeroizing::new([0u8; 88]);
    block[32..64].copy_from_slice(initial);
    block[64..80].copy_from_slice(salt);
    for round in 0..rounds {
        block[80..88].copy_from_slice(&round.to_le_bytes());
        let h = Sha256::digest(&block[..]);
        block[..32].copy_from_slice(&h);
    }
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(&block[..32]);
    out
}

/// The key a password protector's VMK is encrypted with: `stretch(SHA-256(SHA-256(UTF-16LE
/// (password))), salt)`. The password is taken as UTF-8 (invalid sequences are replaced, as
/// cryptsetup's conversion would fail on them anyway).
pub fn password_key(password: &[u8], salt: &[u8; 16]) -> Zeroizing<[u8; 32]> {
    let text = Zeroizing::new(String::from_utf8_lossy(password).into_owned());
    let mut utf16 = Zeroizing::new(Vec::with_capacity(text.len() * 2));
    for unit in text.encode_utf16() {
        utf16.extend_from_slice(&unit.to_le_bytes());
    }
    let inner = Zeroizing::new(<[u8; 32]>::from(Sha256::digest(&utf16[..])));
    let initial = Zeroizing::new(<[u8; 32]>::from(Sha256::digest(&inner[..])));
    stretch_key(&initial, salt)
}

/// Decodes a recovery password (`123456-123456-…`, 8 groups of 6 digits; dashes optional):
/// each group divided by 11 is one little-endian 16-bit word of the 16-byte recovery key.
pub fn decode_recovery_password(text: &[u8]) -> Result<Zeroizing<[u8; 16]>, BitlkKeyError> {
    let digits: Zeroizing<Vec<u8>> = Zeroizing::new(text.iter().copied().filter(|&c| c != b'-').collect());
    let dashes = text.iter().filter(|&&c| c == b'-').count();
    if digits.len() != RECOVERY_GROUPS * 6 || !(dashes == 0 || dashes == RECOVERY_GROUPS - 1) {
        return Err(BitlkKeyError::BadRecoveryPassword("expected 8 groups of 6 digits"));
    }
    if dashes != 0 && text.chunks(7).any(|g| g.len() == 7 && g[6] != b'-') {
        return Err(BitlkKeyError::BadRecoveryPassword("expected 8 groups of 6 digits"));
    }
    let mut key = Zeroizing::new([0u8; 16]);
    for (i, group) in digits.chunks_exact(6).enumerate() {
        let mut v: u32 = 0;
        for &c in group {
            if !c.is_ascii_digit() {
                return Err(BitlkKeyError::BadRecoveryPassword("not a digit"));
            }
            v = v * 10 + u32::from(c - b'0');
        }
        if v % 11 != 0 || v / 11 > u32::from(u16::MAX) {
            return Err(BitlkKeyError::BadRecoveryPassword("a group is not a multiple of 11 below 720896"));
        }
        key[2 * i..2 * i + 2].copy_from_slice(&((v / 11) as u16).to_le_bytes());
    }
    Ok(key)
}

/// The key a recovery-password protector's VMK is encrypted with: `stretch(SHA-256(decoded),
/// salt)`.
pub fn recovery_key(text: &[u8], salt: &[u8; 16]) -> Result<Zeroizing<[u8; 32]>, BitlkKeyError> {
    let decoded = decode_recovery_password(text)?;
    let initial = Zeroizing::new(<[u8; 32]>::from(Sha256::digest(&decoded[..])));
    Ok(stretch_key(&initial, salt))
}

/// Bytes before the key in a decrypted key blob: `le32 size | le16 version | le16 unknown |
/// le16 method? | le16 unknown`.
const KEY_BLOB_HEADER: usize = 12;

/// Decrypts an AES-256-CCM encrypted key entry (nonce 12 bytes, tag 16 bytes, then the
/// encrypted blob) with `key` and returns the key the blob holds (its bytes after the
/// 12-byte header, as many as the blob's size field says).
pub fn unwrap_key(
    key: &[u8; 32],
    nonce: &[u8; 12],
    mac: &[u8; 16],
    encrypted: &[u8],
) -> Result<Zeroizing<Vec<u8>>, BitlkKeyError> {
    let mut data = Zeroizing::new(encrypted.to_vec());
    let cipher = Ccm::<Aes256, U16, U12>::new(key.into());
    cipher
        .decrypt_inout_detached(nonce.into(), &[], data.as_mut_slice().into(), mac.into())
        .map_err(|_| BitlkKeyError::Authentication)?;
    if data.len() < KEY_BLOB_HEADER {
        return Err(BitlkKeyError::Malformed("decrypted key shorter than its header"));
    }
    let size = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
    if size < KEY_BLOB_HEADER || size > data.len() {
        return Err(BitlkKeyError::Malformed("decrypted key size field out of range"));
    }
    Ok(Zeroizing::new(data[KEY_BLOB_HEADER..size].to_vec()))
}

/// Encrypts `key_bytes` as BitLocker stores a key (the inverse of [`unwrap_key`]; tests and
/// crafted images). Returns `(mac, encrypted)`.
pub fn wrap_key(key: &[u8; 32], nonce: &[u8; 12], key_bytes: &[u8], method: u16) -> ([u8; 16], Vec<u8>) {
    let mut data = Vec::with_capacity(KEY_BLOB_HEADER + key_bytes.len());
    let size = (KEY_BLOB_HEADER + key_bytes.len()) as u32;
    data.extend_from_slice(&size.to_le_bytes());
    data.extend_from_slice(&1u16.to_le_bytes());
    data.extend_from_slice(&1u16.to_le_bytes());
    data.extend_from_slice(&method.to_le_bytes());
    data.extend_from_slice(&0u16.to_le_bytes());
    data.extend_from_slice(key_bytes);
    let cipher = Ccm::<Aes256, U16, U12>::new(key.into());
    let tag =
        cipher.encrypt_inout_detached(nonce.into(), &[], data.as_mut_slice().into()).unwrap_or_default();
    let mut mac = [0u8; 16];
    mac.copy_from_slice(&tag);
    (mac, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_is_a_sha256_chain() {
        // Two rounds by hand: the round counter is the last 8 bytes, little-endian.
        let initial = [7u8; 32];
        let salt = [9u8; 16];
        let mut block = [0u8; 88];
        block[32..64].copy_from_slice(&initial);
        block[64..80].copy_from_slice(&salt);
        let h0 = Sha256::digest(block);
        block[..32].copy_from_slice(&h0);
        block[80] = 1;
        let h1 = Sha256::digest(block);
        assert_eq!(&stretch_rounds(&initial, &salt, 2)[..], &h1[..]);
    }

    #[test]
    fn recovery_password_decodes_groups_over_11() {
        let k = decode_recovery_password(b"284867-596541-514998-422114-660297-261613-215424-199408").unwrap();
        assert_eq!(u16::from_le_bytes([k[0], k[1]]), (284867 / 11) as u16);
        assert_eq!(u16::from_le_bytes([k[14], k[15]]), (199408 / 11) as u16);
        let plain = decode_recovery_password(b"284867596541514998422114660297261613215424199408").unwrap();
        assert_eq!(*k, *plain);
    }

    #[test]
    fn recovery_password_rejects_malformed() {
        for bad in [
            &b"284867-596541-514998-422114-660297-261613-215424-199409"[..], // not /11
            b"284867-596541-514998-422114-660297-261613-215424",             // 7 groups
            b"284867-596541-514998-422114-660297-261613-215424-19940a",
            b"2848675-96541-514998-422114-660297-261613-215424-199408", // dash misplaced
            b"999999-596541-514998-422114-660297-261613-215424-199408", // 90909 > u16
            b"",
        ] {
            assert!(decode_recovery_password(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn ccm_round_trip_and_wrong_key() {
        let key = [3u8; 32];
        let nonce = [5u8; 12];
        let (mac, enc) = wrap_key(&key, &nonce, &[0xaa; 32], 0x8004);
        assert_eq!(&unwrap_key(&key, &nonce, &mac, &enc).unwrap()[..], &[0xaa; 32]);
        assert_eq!(unwrap_key(&[4u8; 32], &nonce, &mac, &enc), Err(BitlkKeyError::Authentication));
        let mut bad = enc.clone();
        bad[20] ^= 1;
        assert_eq!(unwrap_key(&key, &nonce, &mac, &bad), Err(BitlkKeyError::Authentication));
    }
}
