//! `journal_crypt`: encryption of the journal area, as the kernel's `create_journal`,
//! `xor_journal` and `crypt_journal` do it (6.1). The engine keeps the journal in plaintext in
//! memory; sections are encrypted on their way to the device and the whole area is decrypted
//! after it is read at open. Section MACs (`journal_mac`) are computed over the plaintext.
//!
//! ```text
//!  stream cipher (block size 1; here ctr(aes), IV 0, 128-bit big-endian counter):
//!    K = E(0^(journal_pages*4096) ‖ commit_ids)       journal_pages = ceil(journal bytes / 4096)
//!    disk[b] = plain[b] ^ K[b]  for every journal byte b (commit ids included)
//!    commit_ids[i] = plain_id[i] ^ K[journal_pages*4096 + 8i ..]  (then made distinct)
//!  block cipher (here cbc(aes)):
//!    IV_s = E_K(le32(s) ‖ 0^12)                        (CBC of one block, IV 0)
//!    disk section s = CBC-encrypt(section s, IV_s)     (one message per section)
//!    commit ids stay plain
//! ```
use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::{Aes128, Aes192, Aes256};
use formats::integrity::journal::CommitIds;
use formats::integrity::Layout;

/// The journal ciphers sealdisk implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalCipher {
    /// `ctr(aes)` (integritysetup `ctr-aes`): a stream cipher, keystream XOR.
    CtrAes,
    /// `cbc(aes)` (integritysetup `cbc-aes`): per-section CBC.
    CbcAes,
}

impl JournalCipher {
    /// From the kernel name (`ctr(aes)`) or cryptsetup's (`ctr-aes`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "ctr(aes)" | "ctr-aes" => Some(JournalCipher::CtrAes),
            "cbc(aes)" | "cbc-aes" => Some(JournalCipher::CbcAes),
            _ => None,
        }
    }
    /// The kernel's name, as in the table (`journal_crypt:ctr(aes):…`).
    pub fn kernel_name(self) -> &'static str {
        match self {
            JournalCipher::CtrAes => "ctr(aes)",
            JournalCipher::CbcAes => "cbc(aes)",
        }
    }
}

/// `journal_crypt:` cipher and key (16, 24 or 32 bytes).
#[derive(Clone)]
pub struct JournalCryptSpec {
    /// The cipher.
    pub cipher: JournalCipher,
    /// The key (secret memory, wiped on drop).
    pub key: sector_crypto::secure::SecretBuf,
}

impl std::fmt::Debug for JournalCryptSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalCryptSpec")
            .field("cipher", &self.cipher)
            .field("key_bytes", &self.key.len())
            .finish()
    }
}

enum AnyAes {
    A128(Box<Aes128>),
    A192(Box<Aes192>),
    A256(Box<Aes256>),
}

impl AnyAes {
    fn new(key: &[u8]) -> Option<Self> {
        Some(match key.len() {
            16 => AnyAes::A128(Box::new(Aes128::new_from_slice(key).ok()?)),
            24 => AnyAes::A192(Box::new(Aes192::new_from_slice(key).ok()?)),
            32 => AnyAes::A256(Box::new(Aes256::new_from_slice(key).ok()?)),
            _ => return None,
        })
    }
    fn enc(&self, b: &mut [u8; 16]) {
        let mut blk = aes::Block::from(*b);
        match self {
            AnyAes::A128(c) => c.encrypt_block(&mut blk),
            AnyAes::A192(c) => c.encrypt_block(&mut blk),
            AnyAes::A256(c) => c.encrypt_block(&mut blk),
        }
        b.copy_from_slice(&blk);
    }
    fn dec(&self, b: &mut [u8; 16]) {
        let mut blk = aes::Block::from(*b);
        match self {
            AnyAes::A128(c) => c.decrypt_block(&mut blk),
            AnyAes::A192(c) => c.decrypt_block(&mut blk),
            AnyAes::A256(c) => c.decrypt_block(&mut blk),
        }
        b.copy_from_slice(&blk);
    }
}

enum Kind {
    /// The keystream over the journal area (`ic->journal_xor`): as secret as the key.
    Stream(sector_crypto::secure::SecretBuf),
    /// The cipher and each section's IV (`sk_requests[s]->iv`).
    Cbc(AnyAes, Vec<[u8; 16]>),
}

/// A keyed journal cipher for one layout (see the module docs).
pub struct JournalCrypt {
    kind: Kind,
    section_bytes: usize,
    ids: CommitIds,
}

impl std::fmt::Debug for JournalCrypt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalCrypt")
    }
}

impl JournalCrypt {
    /// `create_journal` for `layout`'s journal; `None` if the key size is not 16/24/32.
    pub fn new(spec: &JournalCryptSpec, layout: &Layout) -> Option<Self> {
        let aes = AnyAes::new(&spec.key)?;
        let section_bytes = layout.journal.section_bytes();
        let sections = layout.journal_sections as usize;
        let plain = CommitIds::plain();
        match spec.cipher {
            JournalCipher::CtrAes => {
                let jbytes = sections * section_bytes;
                let pages = jbytes.div_ceil(4096);
                let n = pages * 4096 + 32;
                let mut ks = sector_crypto::secure::SecretBuf::zeroed(n);
                for (k, chunk) in ks.chunks_mut(16).enumerate() {
                    let mut b = (k as u128).to_be_bytes();
                    aes.enc(&mut b);
                    chunk.copy_from_slice(&b[..chunk.len()]);
                }
                let mut raw = plain.0;
                for (i, id) in raw.iter_mut().enumerate() {
                    for (x, byte) in id.iter_mut().enumerate() {
                        *byte ^= ks[pages * 4096 + i * 8 + x];
                    }
                }
                ks.truncate(jbytes);
                Some(JournalCrypt { kind: Kind::Stream(ks), section_bytes, ids: CommitIds::from_bytes(raw) })
            }
            JournalCipher::CbcAes => {
                let ivs = (0..sections as u32)
                    .map(|s| {
                        let mut b = [0u8; 16];
                        b[..4].copy_from_slice(&s.to_le_bytes());
                        aes.enc(&mut b);
                        b
                    })
                    .collect();
                Some(JournalCrypt { kind: Kind::Cbc(aes, ivs), section_bytes, ids: plain })
            }
        }
    }

    /// The commit ids the journal uses with this cipher.
    pub fn commit_ids(&self) -> CommitIds {
        self.ids
    }

    /// Encrypts whole sections starting at `first` (no wrap) in place.
    pub fn encrypt(&self, first: u32, data: &mut [u8]) {
        self.apply(first, data, true)
    }

    /// Decrypts whole sections starting at `first` (no wrap) in place.
    pub fn decrypt(&self, first: u32, data: &mut [u8]) {
        self.apply(first, data, false)
    }

    fn apply(&self, first: u32, data: &mut [u8], enc: bool) {
        debug_assert!(data.len().is_multiple_of(self.section_bytes));
        match &self.kind {
            Kind::Stream(ks) => {
                let off = first as usize * self.section_bytes;
                let end = off + data.len();
                for (d, k) in data.iter_mut().zip(&ks[off..end]) {
                    *d ^= k;
                }
            }
            Kind::Cbc(aes, ivs) => {
                for (n, sec) in data.chunks_exact_mut(self.section_bytes).enumerate() {
                    let mut prev = ivs[first as usize + n];
                    for blk in sec.chunks_exact_mut(16) {
                        let mut b: [u8; 16] = blk.try_into().expect("16-byte block");
                        if enc {
                            for (x, p) in b.iter_mut().zip(&prev) {
                                *x ^= p;
                            }
                            aes.enc(&mut b);
                            prev = b;
                        } else {
                            let c = b;
                            aes.dec(&mut b);
                            for (x, p) in b.iter_mut().zip(&prev) {
                                *x ^= p;
                            }
                            prev = c;
                        }
                        blk.copy_from_slice(&b);
                    }
                }
            }
        }
    }
}
