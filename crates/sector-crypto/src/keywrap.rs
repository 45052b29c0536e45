//! AES key unwrap (RFC 3394 / NIST SP 800-38F "KW"), on RustCrypto's `aes-kw`: FileVault2
//! keeps its key-encrypting key and volume key wrapped this way (the passphrase-derived key
//! unwraps the KEK, the KEK unwraps the volume key). Only unwrapping is needed: sealdisk
//! never writes FileVault2 metadata.

use aes_kw::{KeyInit, KwAes128, KwAes192, KwAes256};

use crate::secure::SecretBuf;

/// Why a key did not unwrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyWrapError {
    /// The integrity check value did not come out as RFC 3394's `A6A6A6A6A6A6A6A6`: the
    /// key-encrypting key is wrong (a wrong passphrase), or the wrapped key was changed.
    #[error("the wrapped key's integrity check failed")]
    Integrity,
    /// A KEK that is not 16, 24 or 32 bytes, or wrapped data that is not a whole number of
    /// 8-byte blocks of at least 24 bytes.
    #[error("key wrap sizes: KEK {kek} bytes, wrapped key {wrapped} bytes")]
    Size {
        /// KEK length.
        kek: usize,
        /// Wrapped key length.
        wrapped: usize,
    },
}

/// Unwraps `wrapped` (8 bytes longer than the key) with the AES key `kek`; the key comes
/// back in secret memory.
pub fn aes_unwrap(kek: &[u8], wrapped: &[u8]) -> Result<SecretBuf, KeyWrapError> {
    let size = KeyWrapError::Size { kek: kek.len(), wrapped: wrapped.len() };
    if wrapped.len() < 24 || wrapped.len() % 8 != 0 {
        return Err(size);
    }
    let mut out = SecretBuf::from_vec(vec![0u8; wrapped.len()]);
    let result = match kek.len() {
        16 => KwAes128::new_from_slice(kek).map_err(|_| size)?.unwrap_key(wrapped, &mut out).map(|k| k.len()),
        24 => KwAes192::new_from_slice(kek).map_err(|_| size)?.unwrap_key(wrapped, &mut out).map(|k| k.len()),
        32 => KwAes256::new_from_slice(kek).map_err(|_| size)?.unwrap_key(wrapped, &mut out).map(|k| k.len()),
        _ => return Err(size),
    };
    match result {
        Ok(len) => Ok(SecretBuf::from_slice(&out[..len])),
        Err(aes_kw::Error::IntegrityCheckFailed) => Err(KeyWrapError::Integrity),
        Err(_) => Err(size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// RFC 3394 section 4.1 (128-bit KEK, 128-bit key) and 4.6 (256-bit KEK, 256-bit key).
    #[test]
    fn rfc3394_vectors_unwrap_and_a_wrong_kek_is_refused() {
        let kek = h("000102030405060708090A0B0C0D0E0F");
        let wrapped = h("1FA68B0A8112B447AEF34BD8FB5A7B829D3E862371D2CFE5");
        assert_eq!(&*aes_unwrap(&kek, &wrapped).unwrap(), &h("00112233445566778899AABBCCDDEEFF")[..]);
        let kek256 = h("000102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1E1F");
        let wrapped256 =
            h("28C9F404C4B810F4CBCCB35CFB87F8263F5786E2D80ED326CBC7F0E71A99F43BFB988B9B7A02DD21");
        assert_eq!(
            &*aes_unwrap(&kek256, &wrapped256).unwrap(),
            &h("00112233445566778899AABBCCDDEEFF000102030405060708090A0B0C0D0E0F")[..]
        );
        let mut bad = kek.clone();
        bad[0] ^= 1;
        assert_eq!(aes_unwrap(&bad, &wrapped).unwrap_err(), KeyWrapError::Integrity);
        assert!(matches!(aes_unwrap(&kek[..15], &wrapped), Err(KeyWrapError::Size { .. })));
        assert!(matches!(aes_unwrap(&kek, &wrapped[..20]), Err(KeyWrapError::Size { .. })));
    }
}
