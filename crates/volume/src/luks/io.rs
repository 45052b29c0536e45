//! Byte-addressed reads and writes on a block device, and carrying out a LUKS2
//! [`WritePlan`]. The device may have any logical block size: unaligned edges are
//! read-modify-written (LUKS1's 1024-byte phdr on a 4096-byte-block device).

use blockdev::{BlockDevice, WriteFlags};
use formats::luks2::{WritePlan, WriteStep};
use sector_crypto::secure::SecretBuf;
use zeroize::Zeroizing;

use super::LuksError;

/// Reads `len` bytes at byte `off`. Fails with [`LuksError::DeviceTooSmall`] past the end.
pub(crate) fn read_bytes(
    dev: &dyn BlockDevice,
    off: u64,
    len: usize,
    what: &'static str,
) -> Result<Vec<u8>, LuksError> {
    let g = dev.geometry();
    let end =
        off.checked_add(len as u64).ok_or(LuksError::DeviceTooSmall { need: u64::MAX, have: g.size })?;
    if end > g.size {
        return Err(LuksError::DeviceTooSmall { need: end, have: g.size });
    }
    let block = u64::from(g.logical_block);
    let start = off - off % block;
    let stop = end.div_ceil(block) * block;
    let mut buf = vec![0u8; (stop - start) as usize];
    dev.read_at(start, &mut buf).map_err(|source| LuksError::Io { what, source })?;
    let skip = (off - start) as usize;
    buf.drain(..skip);
    buf.truncate(len);
    Ok(buf)
}

/// Like [`read_bytes`], into secret memory: for key material that is decrypted in place
/// (the ciphertext read from disk is not secret; the plaintext it becomes is).
pub(crate) fn read_secret(
    dev: &dyn BlockDevice,
    off: u64,
    len: usize,
    what: &'static str,
) -> Result<SecretBuf, LuksError> {
    read_bytes(dev, off, len, what).map(SecretBuf::from_vec)
}

/// Writes `data` at byte `off`, read-modify-writing partial blocks at the edges.
pub(crate) fn write_bytes(
    dev: &dyn BlockDevice,
    off: u64,
    data: &[u8],
    what: &'static str,
) -> Result<(), LuksError> {
    let g = dev.geometry();
    let end = off + data.len() as u64;
    if end > g.size {
        return Err(LuksError::DeviceTooSmall { need: end, have: g.size });
    }
    let block = u64::from(g.logical_block);
    let io = |source| LuksError::Io { what, source };
    if off.is_multiple_of(block) && end.is_multiple_of(block) {
        return dev.write_at(off, data, WriteFlags::empty()).map_err(io);
    }
    let start = off - off % block;
    let stop = end.div_ceil(block) * block;
    let mut buf = Zeroizing::new(vec![0u8; (stop - start) as usize]);
    dev.read_at(start, &mut buf).map_err(io)?;
    let skip = (off - start) as usize;
    buf[skip..skip + data.len()].copy_from_slice(data);
    dev.write_at(start, &buf, WriteFlags::empty()).map_err(io)
}

/// Flushes the device.
pub(crate) fn flush(dev: &dyn BlockDevice, what: &'static str) -> Result<(), LuksError> {
    dev.flush().map_err(|source| LuksError::Io { what, source })
}

/// Fills `len` bytes at `off` with zeroes or random bytes, 1 MiB at a time (cryptsetup
/// `crypt_wipe_device` with `CRYPT_WIPE_ZERO` / `CRYPT_WIPE_RANDOM`).
pub(crate) fn wipe(
    dev: &dyn BlockDevice,
    off: u64,
    len: u64,
    random: bool,
    what: &'static str,
) -> Result<(), LuksError> {
    const CHUNK: u64 = 1 << 20;
    let mut done = 0u64;
    let mut buf = vec![0u8; CHUNK.min(len) as usize];
    while done < len {
        let n = CHUNK.min(len - done) as usize;
        if random {
            sector_crypto::kdf::random_bytes(&mut buf[..n]).map_err(LuksError::Kdf)?;
        }
        write_bytes(dev, off + done, &buf[..n], what)?;
        done += n as u64;
    }
    Ok(())
}

/// Carries out a LUKS2 write plan in order; the first failure stops it.
pub(crate) fn apply_plan(dev: &dyn BlockDevice, plan: &WritePlan) -> Result<(), LuksError> {
    for step in &plan.steps {
        match step {
            WriteStep::Write { offset, bytes } => write_bytes(dev, *offset, bytes, "LUKS2 header")?,
            WriteStep::Flush => flush(dev, "LUKS2 header")?,
        }
    }
    Ok(())
}
