//! Wide-block (tweakable, length-preserving) sector modes: Adiantum and HCTR2.
//!
//! A whole sector is one block: changing any plaintext bit changes the whole ciphertext
//! sector. The 32-byte tweak is the dm-crypt IV (`plain64`: `le64(sector)` and zeros). Both
//! are built from RustCrypto primitives (XChaCha12/20, AES, POLYVAL; NH and Poly1305 by hand):
//! no vetted `adiantum`/`hctr2` crate exists (the crates.io ones are single-author, not
//! checked against the kernel, and one carries its own unsafe AES).
//!
//! ```text
//!  Adiantum (Crowley & Biggers 2018; Linux crypto/adiantum.c)   data = P_L ‖ P_R (last 16 bytes)
//!    K_S = volume key (32)   XChaCha_r(K_S, nonce 1‖0…) keystream = K_E(32) ‖ K_T(16) ‖ K_M(16) ‖ K_N(1072)
//!    H(T, X) = Poly1305_{K_T}(le64(8·|X|) ‖ 0⁸ ‖ T) + Poly1305_{K_M}(NH_{K_N}(X, 1 KiB chunks))  mod 2¹²⁸
//!              (Poly1305 without its final key addition; NH: 4 passes, stride 2, 32-bit words)
//!    P_M = P_R + H(T, P_L)      C_M = AES-256_{K_E}(P_M)
//!    C_L = P_L ⊕ XChaCha_r(K_S, nonce = C_M ‖ le32(1) ‖ 0⁴)
//!    C_R = C_M − H(T, C_L)                                      out = C_L ‖ C_R
//!
//!  HCTR2 (Crowley, Huckleberry, Biggers 2021; Linux crypto/hctr2.c)  data = M (first 16) ‖ N
//!    h̄ = E_K(0), L = E_K(le128(1))
//!    H(T, X) = POLYVAL_h̄(le64(2·|T|bits + 2 + [|X| mod 16 ≠ 0]) ‖ 0⁸ ‖ T ‖ X ‖ pad)
//!    MM = M ⊕ H(T, N)   UU = E_K(MM)   S = MM ⊕ UU ⊕ L
//!    V  = N ⊕ XCTR_K(S) (block i ≥ 1: E_K(S ⊕ le128(i)))
//!    U  = UU ⊕ H(T, V)                                          out = U ‖ V
//! ```
//!
//! Decryption runs the same steps with the inverse block cipher. Every key-derived value is
//! wiped on drop: AES schedules (`aes` feature `zeroize`), the derived subkeys here
//! (`Zeroizing`), POLYVAL/XChaCha states (their `zeroize` features), our Poly1305 state.

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit, KeyIvInit, StreamCipher};
use aes::{Aes128, Aes192, Aes256};
use polyval::universal_hash::UniversalHash;
use polyval::Polyval;
use zeroize::{Zeroize, Zeroizing};

use crate::provider::{Block, SectorMode};
use crate::CryptoError;
use crate::Provider;

/// Tweak length of both modes (the kernel's `TWEAK_SIZE`, dm-crypt's IV size for them).
pub(crate) const TWEAK_LEN: usize = 32;

/// NH message chunk (`NH_MESSAGE_BYTES`) and key length in 32-bit words (`NH_KEY_WORDS`).
const NH_CHUNK: usize = 1024;
const NH_KEY_WORDS: usize = NH_CHUNK / 4 + 2 * 2 * 3;

/// The 32-byte tweak of a dm-crypt IV (16 bytes here: plain, plain64 and null fill only the
/// first 8; the rest of the kernel's 32-byte IV is zero).
fn tweak(iv: &Block) -> [u8; TWEAK_LEN] {
    let mut t = [0u8; TWEAK_LEN];
    t[..16].copy_from_slice(iv);
    t
}

fn check(data: &[u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
    if unit < 16 || data.len() % unit != 0 || data.len() / unit != ivs.len() {
        return Err(CryptoError::InvalidParams(format!(
            "wide-block mode: {} bytes in units of {unit} with {} IVs",
            data.len(),
            ivs.len()
        )));
    }
    Ok(())
}

/// Runs `f` on each `unit`-byte sector of `data` with its IV's tweak, after [`check`].
fn per_unit(
    data: &mut [u8],
    unit: usize,
    ivs: &[Block],
    mut f: impl FnMut(&mut [u8], &[u8; TWEAK_LEN]),
) -> Result<(), CryptoError> {
    check(data, unit, ivs)?;
    for (u, iv) in data.chunks_exact_mut(unit).zip(ivs) {
        f(u, &tweak(iv));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Adiantum

/// XChaCha round count of an Adiantum instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XChaCha {
    /// XChaCha12 (`adiantum(xchacha12,aes)`, the recommended one).
    R12,
    /// XChaCha20 (`adiantum(xchacha20,aes)`).
    R20,
}

/// A keyed Adiantum instance.
pub(crate) struct Adiantum {
    rounds: XChaCha,
    /// K_S, the stream cipher key (the volume key itself).
    stream_key: Zeroizing<[u8; 32]>,
    /// K_E.
    block: Aes256,
    /// K_T, the Poly1305 key `r` of the header (clamped, as two 64-bit limbs).
    header_key: Zeroizing<[u64; 2]>,
    /// K_M, likewise for the NH outputs.
    message_key: Zeroizing<[u64; 2]>,
    /// K_N as little-endian words.
    nh_key: Zeroizing<Vec<u32>>,
}

impl Adiantum {
    /// Keys Adiantum with a 32-byte key.
    pub(crate) fn new(rounds: XChaCha, key: &[u8]) -> Result<Self, CryptoError> {
        let stream_key: Zeroizing<[u8; 32]> = Zeroizing::new(key.try_into().map_err(|_| {
            CryptoError::InvalidParams(format!("Adiantum needs a 32-byte key, not {}", key.len()))
        })?);
        // Subkeys: the keystream under nonce 1 ‖ 0…: K_E ‖ K_T ‖ K_M (poly key of nhpoly1305) ‖ K_N.
        let mut derived = Zeroizing::new(vec![0u8; 32 + 16 + 16 + NH_KEY_WORDS * 4]);
        let mut nonce = [0u8; 24];
        nonce[0] = 1;
        xchacha(rounds, &stream_key, &nonce, &mut derived);
        let block = Aes256::new_from_slice(&derived[..32])
            .map_err(|_| CryptoError::Provider { op: "Adiantum AES key" })?;
        let header_key = Zeroizing::new(poly_key(&derived[32..48]));
        let message_key = Zeroizing::new(poly_key(&derived[48..64]));
        let nh_key = Zeroizing::new(
            derived[64..].chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect(),
        );
        Ok(Adiantum { rounds, stream_key, block, header_key, message_key, nh_key })
    }

    /// The header half of H(T, X): Poly1305_{K_T}(le64(8·|X|) ‖ 0⁸ ‖ T), for `x_len` = |X|.
    /// The same for both hashes of a unit (same tweak, same length), so computed once.
    fn hash_header(&self, tweak: &[u8; TWEAK_LEN], x_len: usize) -> u128 {
        let mut header = [0u8; 16 + TWEAK_LEN];
        header[..8].copy_from_slice(&((x_len as u64) * 8).to_le_bytes());
        header[16..].copy_from_slice(tweak);
        let mut p = Poly::new(&self.header_key);
        p.update(&header);
        p.finish()
    }

    /// The message half of H(T, X): Poly1305_{K_M} over the NH hashes of X's 1 KiB chunks.
    fn hash_message(&self, x: &[u8]) -> u128 {
        let mut p = Poly::new(&self.message_key);
        for chunk in x.chunks(NH_CHUNK) {
            let mut h = if chunk.len() % 16 == 0 {
                nh(&self.nh_key, chunk)
            } else {
                // A last chunk of partial 16-byte NH units is zero-padded (never the case
                // for dm-crypt sectors, whose bulk is a multiple of 16 bytes).
                let n = chunk.len().div_ceil(16) * 16;
                let mut padded = Zeroizing::new([0u8; NH_CHUNK]);
                padded[..chunk.len()].copy_from_slice(chunk);
                nh(&self.nh_key, &padded[..n])
            };
            p.update(&h);
            h.zeroize();
        }
        p.finish()
    }

    /// Encrypts or decrypts one whole unit (at least 16 bytes) with tweak `t`.
    pub(crate) fn crypt_unit(&self, unit: &mut [u8], t: &[u8; TWEAK_LEN], encrypt: bool) {
        let (bulk, right) = unit.split_at_mut(unit.len() - 16);
        let mut r = u128::from_le_bytes(right.try_into().unwrap_or([0; 16]));
        let h_t = self.hash_header(t, bulk.len());
        // P_M = P_R + H(T, P_L) (decrypting: C_M = C_R + H(T, C_L)).
        r = r.wrapping_add(h_t.wrapping_add(self.hash_message(bulk)));
        let mut m = aes::Block::from(r.to_le_bytes());
        if encrypt {
            self.block.encrypt_block(&mut m);
        }
        let mut nonce = [0u8; 24];
        nonce[..16].copy_from_slice(&m);
        nonce[16] = 1;
        xchacha(self.rounds, &self.stream_key, &nonce, bulk);
        if !encrypt {
            self.block.decrypt_block(&mut m);
        }
        let mut out = u128::from_le_bytes(m.into()).wrapping_sub(h_t.wrapping_add(self.hash_message(bulk)));
        right.copy_from_slice(&out.to_le_bytes());
        out.zeroize();
        r.zeroize();
        m.zeroize();
    }
}

/// Clamps a 16-byte Poly1305 `r` (RFC 8439 §2.5) into two little-endian 64-bit limbs.
fn poly_key(r: &[u8]) -> [u64; 2] {
    let mut b = [0u8; 16];
    b.copy_from_slice(&r[..16]);
    let r = u128::from_le_bytes(b) & 0x0fff_fffc_0fff_fffc_0fff_fffc_0fff_ffff;
    b.zeroize();
    [r as u64, (r >> 64) as u64]
}

/// Poly1305 without its final addition of `s`, as Adiantum uses it (RFC 8439 §2.5 with
/// `s = 0`): `h = (h + block + 2¹²⁸)·r mod 2¹³⁰ − 5` over whole 16-byte blocks, the result
/// `h mod 2¹²⁸`. Scalar, in 64-bit limbs with 128-bit products. The `poly1305` crate's AVX2
/// backend spent far longer keying and finishing than hashing Adiantum's few blocks per
/// sector (48 header bytes, 32 bytes per KiB): two thirds of Adiantum's time at 512 bytes.
struct Poly {
    /// r₀, r₁ (r₁ a multiple of 4 after clamping, both < 2⁶⁰).
    r: [u64; 2],
    /// h = h₀ + h₁·2⁶⁴ + h₂·2¹²⁸, kept below 5·2¹²⁸ between blocks.
    h: [u64; 3],
}

impl Poly {
    fn new(r: &[u64; 2]) -> Self {
        Poly { r: *r, h: [0; 3] }
    }

    /// Absorbs `data`, a whole number of 16-byte blocks.
    fn update(&mut self, data: &[u8]) {
        debug_assert_eq!(data.len() % 16, 0);
        let [r0, r1] = self.r.map(u128::from);
        // 2¹³⁰ ≡ 5, so h₁·r₁·2¹²⁸ ≡ h₁·(5·r₁/4) (r₁ is a multiple of 4).
        let s1 = r1 + (r1 >> 2);
        let [mut h0, mut h1, mut h2] = self.h;
        for block in data.chunks_exact(16) {
            let m = u128::from_le_bytes(block.try_into().unwrap_or([0; 16]));
            let t = u128::from(h0) + (m & u128::from(u64::MAX));
            h0 = t as u64;
            let t = u128::from(h1) + (m >> 64) + (t >> 64);
            h1 = t as u64;
            h2 += 1 + (t >> 64) as u64;
            // (h₀ + h₁·2⁶⁴ + h₂·2¹²⁸)·(r₀ + r₁·2⁶⁴), folded at 2¹³⁰; h₂ ≤ 7, r < 2⁶⁰.
            let (a0, a1, a2) = (u128::from(h0), u128::from(h1), u128::from(h2));
            let d0 = a0 * r0 + a1 * s1;
            let d1 = a0 * r1 + a1 * r0 + a2 * s1 + (d0 >> 64);
            let d2 = a2 * r0 + (d1 >> 64);
            let t = u128::from(d0 as u64) + (d2 >> 2) * 5;
            h0 = t as u64;
            let t = u128::from(d1 as u64) + (t >> 64);
            h1 = t as u64;
            h2 = (d2 as u64 & 3) + (t >> 64) as u64;
        }
        self.h = [h0, h1, h2];
    }

    /// `h mod (2¹³⁰ − 5)`, truncated to 128 bits.
    fn finish(self) -> u128 {
        let [h0, h1, h2] = self.h;
        // Fold once more (h < 2¹³⁰ + 2⁶⁴ after it, so below 2p), then subtract p if h ≥ p:
        // h ≥ p exactly when h + 5 reaches 2¹³⁰.
        let t = u128::from(h0) + u128::from(h2 >> 2) * 5;
        let h0 = t as u64;
        let t = u128::from(h1) + (t >> 64);
        let h1 = t as u64;
        let h2 = (h2 & 3) + (t >> 64) as u64;
        let t = u128::from(h0) + 5;
        let g0 = t as u64;
        let t = u128::from(h1) + (t >> 64);
        let g1 = t as u64;
        let g2 = h2 + (t >> 64) as u64;
        let take_g = 0u64.wrapping_sub(g2 >> 2);
        let lo = (g0 & take_g) | (h0 & !take_g);
        let hi = (g1 & take_g) | (h1 & !take_g);
        u128::from(lo) | (u128::from(hi) << 64)
    }
}

impl Drop for Poly {
    fn drop(&mut self) {
        self.h.zeroize();
        self.r.zeroize();
    }
}

/// XORs the XChaCha keystream (position 0) into `buf`.
fn xchacha(rounds: XChaCha, key: &[u8; 32], nonce: &[u8; 24], buf: &mut [u8]) {
    match rounds {
        XChaCha::R12 => chacha20::XChaCha12::new(key.into(), nonce.into()).apply_keystream(buf),
        XChaCha::R20 => chacha20::XChaCha20::new(key.into(), nonce.into()).apply_keystream(buf),
    }
}

/// NH over whole 16-byte units (at most [`NH_CHUNK`] bytes): four passes, each summing
/// `(m0 + k0)·(m2 + k2) + (m1 + k1)·(m3 + k3)` mod 2⁶⁴ with 32-bit additions; pass `j` uses
/// the key shifted by `4j` words, and the key advances 4 words per unit.
fn nh(key: &[u32], msg: &[u8]) -> [u8; 32] {
    let mut sums = [0u64; 4];
    for (i, unit) in msg.chunks_exact(16).enumerate() {
        let m = [0, 4, 8, 12].map(|o| u32::from_le_bytes([unit[o], unit[o + 1], unit[o + 2], unit[o + 3]]));
        let k = &key[4 * i..4 * i + 16];
        for (j, s) in sums.iter_mut().enumerate() {
            let k = &k[4 * j..4 * j + 4];
            let a = u64::from(m[0].wrapping_add(k[0])) * u64::from(m[2].wrapping_add(k[2]));
            let b = u64::from(m[1].wrapping_add(k[1])) * u64::from(m[3].wrapping_add(k[3]));
            *s = s.wrapping_add(a).wrapping_add(b);
        }
    }
    let mut out = [0u8; 32];
    for (o, s) in out.chunks_exact_mut(8).zip(sums) {
        o.copy_from_slice(&s.to_le_bytes());
    }
    out
}

impl SectorMode for Adiantum {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        per_unit(data, unit, ivs, |u, t| self.crypt_unit(u, t, true))
    }
    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        per_unit(data, unit, ivs, |u, t| self.crypt_unit(u, t, false))
    }
    fn name(&self) -> &'static str {
        match self.rounds {
            XChaCha::R12 => "rustcrypto adiantum(xchacha12,aes)",
            XChaCha::R20 => "rustcrypto adiantum(xchacha20,aes)",
        }
    }
}

// ---------------------------------------------------------------------------------------
// HCTR2

/// AES with any of its key sizes.
enum AnyAes {
    A128(Aes128),
    A192(Aes192),
    A256(Aes256),
}

impl AnyAes {
    fn new(key: &[u8]) -> Option<Self> {
        Some(match key.len() {
            16 => AnyAes::A128(Aes128::new_from_slice(key).ok()?),
            24 => AnyAes::A192(Aes192::new_from_slice(key).ok()?),
            32 => AnyAes::A256(Aes256::new_from_slice(key).ok()?),
            _ => return None,
        })
    }
    fn encrypt_blocks(&self, b: &mut [aes::Block]) {
        match self {
            AnyAes::A128(c) => c.encrypt_blocks(b),
            AnyAes::A192(c) => c.encrypt_blocks(b),
            AnyAes::A256(c) => c.encrypt_blocks(b),
        }
    }
    fn decrypt_block(&self, b: &mut aes::Block) {
        match self {
            AnyAes::A128(c) => c.decrypt_block(b),
            AnyAes::A192(c) => c.decrypt_block(b),
            AnyAes::A256(c) => c.decrypt_block(b),
        }
    }
}

/// A keyed HCTR2 instance over AES-128, -192 or -256.
pub(crate) struct Hctr2 {
    aes: AnyAes,
    /// h̄ = E_K(0), the POLYVAL key.
    hbar: Zeroizing<[u8; 16]>,
    /// L = E_K(le128(1)).
    l: Zeroizing<[u8; 16]>,
}

/// Blocks of XCTR keystream computed per AES call.
const XCTR_BATCH: usize = 32;

impl Hctr2 {
    /// Keys HCTR2 with a 16, 24 or 32-byte AES key.
    pub(crate) fn new(key: &[u8]) -> Result<Self, CryptoError> {
        let aes = AnyAes::new(key).ok_or_else(|| {
            CryptoError::InvalidParams(format!("HCTR2 needs a 16, 24 or 32-byte key, not {}", key.len()))
        })?;
        let mut b = [aes::Block::default(), aes::Block::default()];
        b[1][0] = 1;
        aes.encrypt_blocks(&mut b);
        let hbar = Zeroizing::new(b[0].into());
        let l = Zeroizing::new(b[1].into());
        b.iter_mut().for_each(|x| x.as_mut_slice().zeroize());
        Ok(Hctr2 { aes, hbar, l })
    }

    /// H(T, X) (any tweak length: the kernel's is always [`TWEAK_LEN`]; the paper's test
    /// vectors also use others).
    fn hash(&self, tweak: &[u8], x: &[u8]) -> [u8; 16] {
        let mut p = Polyval::new((&*self.hbar).into());
        let mut first = [0u8; 16];
        let bits = (tweak.len() as u64) * 8 * 2 + 2 + u64::from(x.len() % 16 != 0);
        first[..8].copy_from_slice(&bits.to_le_bytes());
        p.update_padded(&first);
        p.update_padded(tweak);
        let whole = x.len() / 16 * 16;
        p.update_padded(&x[..whole]);
        if whole < x.len() {
            // A partial last block is padded with 1 and zeros.
            let mut last = [0u8; 16];
            last[..x.len() - whole].copy_from_slice(&x[whole..]);
            last[x.len() - whole] = 1;
            p.update_padded(&last);
            last.zeroize();
        }
        p.finalize().into()
    }

    /// XORs XCTR_K(S) into `buf`.
    fn xctr(&self, s: &[u8; 16], buf: &mut [u8]) {
        let s = u128::from_le_bytes(*s);
        let mut ks = [aes::Block::default(); XCTR_BATCH];
        let mut i = 1u128;
        for chunk in buf.chunks_mut(16 * XCTR_BATCH) {
            let n = chunk.len().div_ceil(16);
            for b in &mut ks[..n] {
                *b = (s ^ i).to_le_bytes().into();
                i += 1;
            }
            self.aes.encrypt_blocks(&mut ks[..n]);
            for (d, k) in chunk.iter_mut().zip(ks[..n].iter().flat_map(|b| b.iter())) {
                *d ^= k;
            }
        }
        ks.iter_mut().for_each(|x| x.as_mut_slice().zeroize());
    }

    /// Encrypts or decrypts one whole unit (at least 16 bytes) with tweak `t`.
    pub(crate) fn crypt_unit(&self, unit: &mut [u8], t: &[u8], encrypt: bool) {
        let (first, bulk) = unit.split_at_mut(16);
        let h = self.hash(t, bulk);
        let mut mm = [0u8; 16];
        for ((o, a), b) in mm.iter_mut().zip(first.iter()).zip(h) {
            *o = a ^ b;
        }
        let mut uu = aes::Block::from(mm);
        if encrypt {
            self.aes.encrypt_blocks(std::slice::from_mut(&mut uu));
        } else {
            self.aes.decrypt_block(&mut uu);
        }
        let mut s = [0u8; 16];
        for (((o, a), b), c) in s.iter_mut().zip(mm).zip(uu.iter()).zip(self.l.iter()) {
            *o = a ^ b ^ c;
        }
        self.xctr(&s, bulk);
        let h = self.hash(t, bulk);
        for ((o, a), b) in first.iter_mut().zip(uu.iter()).zip(h) {
            *o = a ^ b;
        }
        mm.zeroize();
        uu.zeroize();
        s.zeroize();
    }
}

impl SectorMode for Hctr2 {
    fn encrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        per_unit(data, unit, ivs, |u, t| self.crypt_unit(u, t, true))
    }
    fn decrypt(&self, data: &mut [u8], unit: usize, ivs: &[Block]) -> Result<(), CryptoError> {
        per_unit(data, unit, ivs, |u, t| self.crypt_unit(u, t, false))
    }
    fn name(&self) -> &'static str {
        match self.aes {
            AnyAes::A128(_) => "rustcrypto hctr2(aes128)",
            AnyAes::A192(_) => "rustcrypto hctr2(aes192)",
            AnyAes::A256(_) => "rustcrypto hctr2(aes256)",
        }
    }
}

/// Adiantum as a sector mode (RustCrypto only: aws-lc has no XChaCha).
pub(crate) fn adiantum(
    provider: Provider,
    rounds: XChaCha,
    key: &[u8],
) -> Result<Box<dyn SectorMode>, CryptoError> {
    if provider == Provider::AwsLc {
        return Err(CryptoError::Unsupported {
            spec: "adiantum".into(),
            part: "provider aws-lc does not implement adiantum".into(),
        });
    }
    Ok(Box::new(Adiantum::new(rounds, key)?))
}

/// HCTR2 as a sector mode (RustCrypto only: aws-lc has no POLYVAL/XCTR).
pub(crate) fn hctr2(provider: Provider, key: &[u8]) -> Result<Box<dyn SectorMode>, CryptoError> {
    if provider == Provider::AwsLc {
        return Err(CryptoError::Unsupported {
            spec: "hctr2(aes)".into(),
            part: "provider aws-lc does not implement hctr2".into(),
        });
    }
    Ok(Box::new(Hctr2::new(key)?))
}

#[cfg(test)]
mod tests;
