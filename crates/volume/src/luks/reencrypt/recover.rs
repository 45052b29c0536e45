//! Recovery of a hotzone a crash left in reencryption (cryptsetup
//! `reencrypt_recover_segment`): at the start of a run, at a writable activation, and as
//! cryptsetup `repair` does it.

use blockdev::BlockDevice;
use formats::luks2::reencrypt::{self as re, Resilience};
use sector_crypto::kdf::HashAlg;
use sector_crypto::secure::SecretBuf;

use super::run::{run_unlocked, Plan, ReencryptKeys, RunOptions};
use super::shift::{is_shift_decrypting, is_shift_decryption, run_decrypt_shift};
use super::{io_err, meta_err, status};
use crate::luks::ReencryptError;
use crate::luks::{io, luks2, Luks, Luks2State, LuksError};

/// Recovers the last hotzone of a data-shift decryption (the moved ciphertext, decrypted
/// in place) if a crash left it in reencryption, as cryptsetup does at activation: a block
/// whose content still hashes to its stored checksum is old and is decrypted again. The
/// header then says every hotzone is done (the run still has to finish). Writes nothing
/// in any other state; `Ok` also when `luks` is not mid data-shift decryption.
pub fn recover_decrypt_shift(
    meta: &dyn BlockDevice,
    dev: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
) -> Result<(), LuksError> {
    match status(luks)? {
        Some(st) if is_shift_decryption(&st) && st.hot.is_some() => {}
        _ => return Ok(()),
    }
    run_decrypt_shift(meta, dev, luks, keys, None, &mut |_, _| false, true).map(|_| ())
}

/// Recovers the hotzone flagged `in-reencryption` (a run that stopped mid-hotzone) and
/// writes the header that moves past it; `p.pos` is then the boundary past it.
pub(super) fn recover(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    s: &mut Luks2State,
    p: &mut Plan,
) -> Result<(), LuksError> {
    let Some(h) = p.st.hot else { return Ok(()) };
    let rk = p.st.keyslot.clone();
    let data_offset = p.data_offset;
    let hs = s.header.metadata.segments[&h].clone();
    let len = hs.fixed_size().ok_or(meta_err(re::ReencryptMetaError::Layout("dynamic hotzone")))?;
    if !len.is_multiple_of(p.alignment) {
        return Err(meta_err(re::ReencryptMetaError::Layout("hotzone not aligned")));
    }
    let offset = hs
        .offset
        .checked_sub(data_offset)
        .filter(|o| o.checked_add(len).is_some_and(|e| e <= p.device_size))
        .ok_or(meta_err(re::ReencryptMetaError::Layout("hotzone outside the data")))?;
    log::warn!("reencrypt: recovering the hotzone at {offset} ({len} bytes) after an interrupted run");
    let mut buf = SecretBuf::zeroed(len as usize);
    data.read_at(data_offset + offset, &mut buf).map_err(io_err("hotzone"))?;
    match (&rk.resilience, p.hash) {
        (Resilience::Checksum { block_size, .. }, Some(hash)) => {
            let bs = *block_size as usize;
            let hl = hash.output_len();
            let count = buf.len() / bs;
            if (count * hl) as u64 > rk.area_size {
                return Err(meta_err(re::ReencryptMetaError::Layout(
                    "hotzone larger than the checksum area",
                )));
            }
            let sums = io::read_bytes(meta, rk.area_offset, count * hl, "reencryption checksums")?;
            let mut sum = vec![0u8; hl];
            for b in 0..count {
                let blk = &mut buf[b * bs..(b + 1) * bs];
                hash.digest_into(&[&*blk], &mut sum);
                if sum == sums[b * hl..(b + 1) * hl] {
                    let sector = (offset + (b * bs) as u64) / 512;
                    p.rewrite(sector, blk)?;
                    data.write_at(data_offset + offset + (b * bs) as u64, blk, blockdev::WriteFlags::empty())
                        .map_err(io_err("hotzone"))?;
                }
            }
        }
        (Resilience::Datashift { .. }, _) if p.sums.is_some() => {
            // cryptsetup's own recovery of this hotzone copies the data below it over it;
            // sealdisk's checksums (when they are this hotzone's) say which blocks are old.
            let a = p
                .sums
                .clone()
                .ok_or(LuksError::Internal("a detached data shift run without its checksum area"))?;
            let want = a.record(offset, len);
            let rec = io::read_bytes(meta, a.offset, re::HOTZONE_RECORD_SIZE as usize, "hotzone checksums")?;
            let sums = io::read_bytes(
                meta,
                a.offset + re::HOTZONE_RECORD_SIZE,
                want.sums_len() as usize,
                "hotzone checksums",
            )?;
            if !want.matches(&rec, &sums) {
                return Err(LuksError::Reencrypt(ReencryptError::HotzoneNoChecksums { offset, len }));
            }
            let hash = HashAlg::Sha256;
            let hl = hash.output_len();
            let mut sum = vec![0u8; hl];
            let bs = a.block as usize;
            for (b, blk) in buf.chunks_mut(bs).enumerate() {
                hash.digest_into(&[&*blk], &mut sum);
                if sum == sums[b * hl..(b + 1) * hl] {
                    let at = offset + (b * bs) as u64;
                    p.rewrite(at / 512, blk)?;
                    data.write_at(data_offset + at, blk, blockdev::WriteFlags::empty())
                        .map_err(io_err("hotzone"))?;
                }
            }
        }
        (Resilience::Journal, _) => {
            if len > rk.area_size {
                return Err(meta_err(re::ReencryptMetaError::Layout("hotzone larger than the journal")));
            }
            let j = io::read_secret(meta, rk.area_offset, len as usize, "reencryption journal")?;
            buf.copy_from_slice(&j);
            p.rewrite(offset / 512, &mut buf)?;
            data.write_at(data_offset + offset, &buf, blockdev::WriteFlags::empty())
                .map_err(io_err("hotzone"))?;
        }
        _ => return Err(LuksError::Reencrypt(ReencryptError::HotzoneNoCopy)),
    }
    data.flush().map_err(io_err("data device"))?;
    p.pos = if p.backward { offset } else { offset + len };
    let mut next = s.clone();
    let layout = p.layout(&p.st, &next.header.metadata, p.pos, None)?;
    re::assign_segments(&mut p.st, &mut next.header.metadata, layout).map_err(meta_err)?;
    luks2::write_header(&mut next, meta)?;
    *s = next;
    Ok(())
}

/// cryptsetup `repair`'s reencryption recovery: when a crash left a hotzone flagged in
/// reencryption (cryptsetup's `CRYPT_REENCRYPT_CRASH`, which its `reencrypt` refuses to
/// resume: "Device requires reencryption recovery. Run repair first."), recovers that
/// hotzone the way the next run or writable open would, writes the header that moves past
/// it, and stops: the rest is left to `reencrypt --resume-only`, in either tool. The one
/// exception is a data shift whose interrupted hotzone was its last: what remains after it
/// is the end of the run (a wipe and the final header), which is then done too. Returns
/// `false`, with nothing written, when no hotzone needs recovery.
pub fn recover_interrupted(
    meta: &dyn BlockDevice,
    data: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
) -> Result<bool, LuksError> {
    let hot =
        |luks: &Luks| -> Result<bool, LuksError> { Ok(status(luks)?.is_some_and(|st| st.hot.is_some())) };
    if !hot(luks)? {
        return Ok(false);
    }
    if is_shift_decrypting(luks) {
        // Its last hotzone (the moved ciphertext, decrypted in place) has its own recovery.
        recover_decrypt_shift(meta, data, luks, keys)?;
        if !hot(luks)? {
            return Ok(true);
        }
    }
    // A run that stops before its first new hotzone: what it does first is the recovery.
    run_unlocked(meta, data, luks, keys, &RunOptions::default(), None, &mut |_, _| false)?;
    if hot(luks)? {
        return Err(LuksError::Internal("the interrupted hotzone is still flagged after its recovery"));
    }
    Ok(true)
}
