//! Data shift: the geometry, activation and runs of an encryption whose header takes room
//! on the device (`--reduce-device-size`, resilience `datashift`) and of a decryption that
//! moves its header to a new file (resilience `datashift-checksum`).

use blockdev::BlockDevice;
use formats::luks2::reencrypt::{self as re, Direction, ReencryptMode, ReencryptState, Resilience};
use sector_crypto::secure::SecretBuf;

use super::run::{finish, ReencryptKeys};
use super::{block_sums, cipher, crypto_err, io_err, meta_err, status, v2, EncryptLayout, RunEnd};
use crate::luks::{io, luks2, parse_hash, Luks, LuksError, LuksHeader};
use crate::luks::{ParamError, ReencryptError};

/// The metadata and keyslots area sizes of an encryption with data shift whose header
/// takes `shift` bytes on the device (cryptsetup's luksFormat with `--offset shift`):
/// `--luks2-metadata-size` (16 KiB by default) and `--luks2-keyslots-size` (by default,
/// and at most, the rest of the shift: a larger one is cut down to it, as cryptsetup does
/// with its warning).
pub fn shift_header_layout(l: &EncryptLayout, shift: u64) -> Result<(u64, u64), LuksError> {
    let unsupported = || LuksError::Param(ParamError::MetadataSizeOptions);
    let md = l.metadata_size.unwrap_or(16 << 10);
    if !formats::luks2::METADATA_SIZES.contains(&md)
        || l.keyslots_size
            .is_some_and(|k| k == 0 || !k.is_multiple_of(4096) || k > formats::luks2::MAX_KEYSLOTS_SIZE)
    {
        return Err(unsupported());
    }
    let room = shift.checked_sub(2 * md).filter(|r| *r > 0).ok_or_else(unsupported)?;
    Ok((md, l.keyslots_size.map_or(room, |k| k.min(room))))
}

/// Copies `len` bytes from `from` on `src` to `to` on `dst` (ranges that do not overlap
/// when both are one device), 8 MiB at a time, through a buffer wiped after use.
pub(super) fn copy_range(
    src: &dyn BlockDevice,
    from: u64,
    dst: &dyn BlockDevice,
    to: u64,
    len: u64,
    what: &'static str,
) -> Result<(), LuksError> {
    let mut buf = SecretBuf::zeroed(len.min(8 << 20) as usize);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        src.read_at(from + done, &mut buf[..n]).map_err(io_err(what))?;
        dst.write_at(to + done, &buf[..n], blockdev::WriteFlags::empty()).map_err(io_err(what))?;
        done += n as u64;
    }
    Ok(())
}

/// The state, geometry and final crypt parameters of a data-shift encryption in progress
/// on a device of `size` bytes, its segments checked to lie on it, sector-aligned.
fn shift_geometry(
    luks: &Luks,
    size: u64,
) -> Result<(ReencryptState, re::ShiftGeometry, formats::luks2::CryptParams), LuksError> {
    let st = status(luks)?.ok_or_else(|| LuksError::Reencrypt(ReencryptError::NotInProgress))?;
    let LuksHeader::V2(s) = &luks.header else {
        return Err(LuksError::Reencrypt(ReencryptError::NotInProgress));
    };
    let g = re::ShiftGeometry::of(&st, &s.header.metadata).map_err(meta_err)?;
    let fin = &s.header.metadata.segments[&st.final_];
    let c = fin.crypt.clone().ok_or(meta_err(re::ReencryptMetaError::Layout("backup-final")))?;
    let align = u64::from(c.sector_size.max(512));
    if g.new_offset.checked_add(g.data_size).is_none_or(|e| e > size)
        || g.moved_offset.checked_add(g.moved_size).is_none_or(|e| e > size)
        || g.old_offset.checked_add(g.data_size).is_none_or(|e| e > size)
        || !g.data_size.is_multiple_of(align)
        || !g.moved_size.is_multiple_of(align)
        || !g.shift.is_multiple_of(align)
        || !g.old_offset.is_multiple_of(align)
        || !g.moved_offset.is_multiple_of(align)
    {
        return Err(meta_err(re::ReencryptMetaError::Layout("data shift segments outside the device")));
    }
    // The moved copy is read until the last hotzone: no hotzone may write over it (the new
    // segment), and it holds no plaintext still read in place (cryptsetup puts it past the
    // new segment, at the end of the device).
    let apart = |a: u64, al: u64, b: u64, bl: u64| a + al <= b || b + bl <= a;
    if !apart(g.moved_offset, g.moved_size, g.new_offset, g.data_size)
        || !apart(g.moved_offset, g.moved_size, g.old_offset + g.moved_size, g.data_size - g.moved_size)
    {
        return Err(meta_err(re::ReencryptMetaError::Layout("the moved data segment overlaps the data")));
    }
    Ok((st, g, c))
}

/// Where a volume mid data-shift encryption stands, for its activation (cryptsetup maps
/// it from the regular segments): below the boundary the old plaintext, its first
/// `moved_size` bytes from the moved copy and the rest in place; from the boundary up the
/// new crypt segment, `shift` bytes up the device. A hotzone left in reencryption counts
/// as old: its source is intact and any run redoes it from there.
#[derive(Debug, Clone)]
pub struct ShiftActivation {
    /// The geometry (offsets and sizes in bytes).
    pub geometry: re::ShiftGeometry,
    /// Bytes of data below which it is still plaintext.
    pub boundary: u64,
    /// The new segment's cipher spec and sector size.
    pub new: (String, u32),
}

/// `Some` for a volume mid data-shift encryption (`--reduce-device-size`) on a device of
/// `size` bytes, which activates as [`ShiftActivation`] says; nothing is written.
pub fn shift_activation(luks: &Luks, size: u64) -> Result<Option<ShiftActivation>, LuksError> {
    match status(luks)? {
        Some(st) if is_shift_encryption(&st) => {}
        _ => return Ok(None),
    }
    let (st, g, c) = shift_geometry(luks, size)?;
    let LuksHeader::V2(s) = &luks.header else {
        return Ok(None);
    };
    let boundary = g.boundary(&s.header.metadata, &st).map_err(meta_err)?;
    Ok(Some(ShiftActivation { geometry: g, boundary, new: (c.encryption, c.sector_size) }))
}

/// Where a volume mid data-shift decryption stands, for its activation, in the data's
/// coordinates `[0, data_size)` (cryptsetup maps it from the regular segments): the first
/// `moved_size` bytes are the moved ciphertext at the start of the device, then the
/// plaintext already written in its final place up to the boundary, then the ciphertext
/// not reached yet, `shift` bytes up the device. All ciphertext keeps its IVs (sector `L`
/// of the data has IV `L`). A forward hotzone left in reencryption counts as ciphertext
/// not reached: its source is intact and any run redoes it from there, so nothing is
/// written.
#[derive(Debug, Clone)]
pub struct DecryptShiftActivation {
    /// The geometry (offsets and sizes in bytes).
    pub geometry: re::DecryptShiftGeometry,
    /// Bytes of data below which it is plaintext or the moved ciphertext.
    pub boundary: u64,
    /// Every hotzone is written, the moved part too (the run stopped before its end): the
    /// whole data is plaintext in place.
    pub moved_plain: bool,
    /// The old (crypt) segment's cipher spec and sector size.
    pub old: (String, u32),
}

/// `Some` for a volume mid data-shift decryption whose data device is `size` bytes long,
/// which activates as [`DecryptShiftActivation`] says; nothing is written. Refused while
/// the last hotzone (the moved ciphertext, decrypted in place) is flagged in reencryption:
/// its blocks are part old, part new until [`recover_decrypt_shift`] recovers them.
pub fn decrypt_shift_activation(luks: &Luks, size: u64) -> Result<Option<DecryptShiftActivation>, LuksError> {
    let st = match status(luks)? {
        Some(st) if is_shift_decryption(&st) => st,
        _ => return Ok(None),
    };
    let LuksHeader::V2(s) = &luks.header else {
        return Ok(None);
    };
    let m = &s.header.metadata;
    let g = re::DecryptShiftGeometry::of(&st, m, size).map_err(meta_err)?;
    let c = st.backup_previous(m).map_err(meta_err)?.crypt.clone();
    let c = c.ok_or(meta_err(re::ReencryptMetaError::Layout("backup-previous is not crypt")))?;
    let align = u64::from(c.sector_size.max(512));
    if !g.shift.is_multiple_of(align)
        || !g.data_size.is_multiple_of(align)
        || !g.moved_size.is_multiple_of(align)
    {
        return Err(meta_err(re::ReencryptMetaError::Layout("data shift not aligned to its blocks")));
    }
    let p = g.progress(m, &st).map_err(meta_err)?;
    let fwd = g.data_size - g.moved_size;
    if p >= fwd && st.hot.is_some() {
        return Err(LuksError::Reencrypt(ReencryptError::ShiftNeedsRecovery));
    }
    let boundary = if p >= fwd { g.data_size } else { g.moved_size + p };
    let moved_plain = p == g.total();
    Ok(Some(DecryptShiftActivation {
        geometry: g,
        boundary,
        moved_plain,
        old: (c.encryption, c.sector_size),
    }))
}

/// `true` for a LUKS2 header mid data-shift encryption (`--reduce-device-size`).
pub fn is_data_shift(luks: &Luks) -> bool {
    matches!(status(luks), Ok(Some(st)) if is_shift_encryption(&st))
}

/// Runs an encryption with data shift ([`init_encrypt_shift`], or cryptsetup's
/// `--reduce-device-size`) on `dev` (header and data on one device): per hotzone
/// (backward, at most the shift long, so it never overlaps its own source), the hotzone
/// segment flagged in-reencryption is written, its plaintext is read from its old place
/// (or the moved copy), encrypted and written `shift` bytes up, flushed, and the header
/// moves past it. A hotzone left in reencryption is simply done again: its source is
/// intact. At the end the moved copy (plaintext) is wiped with random bytes before the
/// header is finished.
///
/// With `online` (see [`run_unlocked`]), each hotzone is held from before its header write
/// until the header past it is written and the device's boundary moved to its start. The
/// hotzone `H = [start, start + len)` (data coordinates, `len <= shift`) reads `H`'s old
/// copy (in place at `old_offset + start`, or the moved copy) and writes `H`'s new copy at
/// `new_offset + start`, which is the old place of `[start + shift, ...)`: data at or above
/// the boundary, served from the new segment already. So no physical byte the hotzone
/// touches is live for any position outside `H`, and holding `H` alone keeps every client
/// request whole (the moved copy lies past the new segment, and is wiped only once the
/// boundary is 0). The writes and their order are the offline run's (the crash harness
/// covers them): clients write only where the durable header maps their position.
pub(super) fn run_datashift(
    dev: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    online: Option<&crate::luks::reencrypting::ReencryptingDevice>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<RunEnd, LuksError> {
    let (mut st, g, c) = shift_geometry(luks, dev.geometry().size)?;
    let s = v2(luks)?;
    let vk = keys.new.as_ref().ok_or(LuksError::WrongPassphrase)?;
    let new = cipher(&c.encryption, vk, c.sector_size)?;
    let mut b = g.boundary(&s.header.metadata, &st).map_err(meta_err)?;
    let mut recovering = st.hot.is_some();
    let mut buf = SecretBuf::zeroed(g.shift.min(8 << 20) as usize);
    if !progress(g.data_size - b, g.data_size) && !recovering {
        return Ok(RunEnd::Interrupted);
    }
    while let Some((start, len)) = g.next_hotzone(b) {
        let guard = online.map(|d| d.hold(start, len));
        if recovering {
            // The header already says this hotzone is in reencryption.
            log::warn!(
                "reencrypt: redoing the data shift hotzone at {start} ({len} bytes) after an interrupted run"
            );
            recovering = false;
        } else {
            let mut next = s.clone();
            let layout = g.layout(&next.header.metadata, &st, b, Some(len)).map_err(meta_err)?;
            re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
            luks2::write_header(&mut next, dev)?;
            *s = next;
        }
        let src = g.source(start);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            let chunk = &mut buf[..n];
            dev.read_at(src + done, chunk).map_err(io_err("data shift hotzone"))?;
            new.encrypt((start + done) / 512, chunk).map_err(crypto_err(&c.encryption))?;
            dev.write_at(g.new_offset + start + done, chunk, blockdev::WriteFlags::empty())
                .map_err(io_err("data shift hotzone"))?;
            done += n as u64;
        }
        dev.flush().map_err(io_err("data device"))?;
        b = start;
        let mut next = s.clone();
        let layout = g.layout(&next.header.metadata, &st, b, None).map_err(meta_err)?;
        re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
        luks2::write_header(&mut next, dev)?;
        *s = next;
        if let Some(d) = online {
            d.set_boundary(b);
        }
        drop(guard);
        if b > 0 && !progress(g.data_size - b, g.data_size) {
            return Ok(RunEnd::Interrupted);
        }
    }
    progress(g.data_size, g.data_size);
    // The moved copy holds plaintext: wiped (random, as cryptsetup) before the header
    // forgets it. A crash here resumes to the same point.
    io::wipe(dev, g.moved_offset, g.moved_size, true, "moved data segment")?;
    io::flush(dev, "moved data segment")?;
    let d_new = st.digest_new;
    finish(s, dev, &st, None, d_new)?;
    Ok(RunEnd::Finished)
}

/// `true` for a decryption with data shift (cryptsetup 2.6's `--decrypt --header NEW` of a
/// header on the device): mode decrypt, forward, resilience `datashift-checksum`, a moved
/// first segment.
pub(super) fn is_shift_decryption(st: &ReencryptState) -> bool {
    st.keyslot.mode == ReencryptMode::Decrypt
        && st.keyslot.direction == Direction::Forward
        && matches!(st.keyslot.resilience, Resilience::DatashiftChecksum { .. })
        && st.moved.is_some()
}

/// `true` for a LUKS2 header mid data-shift decryption ([`init_decrypt_shift`]).
pub fn is_shift_decrypting(luks: &Luks) -> bool {
    matches!(status(luks), Ok(Some(st)) if is_shift_decryption(&st))
}

/// Runs a decryption with data shift ([`init_decrypt_shift`], or cryptsetup's) with the
/// header on `meta` and the data on `dev`: per hotzone of the forward part (at most the
/// shift long, read from `shift` bytes up, so never over its own source), the header
/// flagged in-reencryption, the ciphertext decrypted and written to its final place,
/// flushed, the header past it. A forward hotzone left in reencryption is done again from
/// its source. The last hotzone, `[0, S)` (the moved ciphertext), is decrypted in place:
/// the checksum of each 4096-byte block goes to the reencrypt keyslot's area (flushed)
/// before the header flags it, and a crash there is recovered as cryptsetup's `checksum`
/// resilience (a block that still hashes to its checksum is decrypted again). At the end
/// the last `S` bytes of the device (ciphertext given up) are wiped with random bytes, as
/// cryptsetup does, and the header finished: `linear @0 dynamic`, no keyslot left.
///
/// With `recover_only`, it stops after recovering the last hotzone if a crash left it in
/// reencryption, and otherwise writes nothing ([`recover_decrypt_shift`]).
///
/// With `online` (see [`run_unlocked`]), each hotzone is held from before it is read (for
/// the last one, before its checksums are taken) until the header past it is written and
/// the device follows: the boundary moves past it, and after the last one the part below
/// the boundary switches from the moved ciphertext to the plaintext in place
/// ([`ReencryptingDevice::set_moved_done`](crate::luks::reencrypting::ReencryptingDevice::set_moved_done)).
/// A forward hotzone `H = [start, start + len)` (`start >= moved_size`, `len <= shift`)
/// reads `H`'s ciphertext at `shift + start` and writes `H`'s plaintext at `start`, which
/// holds the ciphertext of `[start - shift, start + len - shift)`: positions below the
/// boundary, served from their plaintext (or the moved ciphertext at the device's start)
/// already. The last hotzone `[0, moved_size)` reads and writes its own place. So no
/// physical byte a hotzone touches is live for any position outside it, and holding the
/// hotzone alone keeps every client request whole; the tail wiped at the end is ciphertext
/// no position maps to any more. The writes and their order are the offline run's (the
/// crash harness covers them).
pub(super) fn run_decrypt_shift(
    meta: &dyn BlockDevice,
    dev: &dyn BlockDevice,
    luks: &mut Luks,
    keys: &ReencryptKeys,
    online: Option<&crate::luks::reencrypting::ReencryptingDevice>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
    recover_only: bool,
) -> Result<RunEnd, LuksError> {
    let size = dev.geometry().size;
    let mut st = status(luks)?.ok_or_else(|| LuksError::Reencrypt(ReencryptError::NotInProgress))?;
    let s = v2(luks)?;
    let g = re::DecryptShiftGeometry::of(&st, &s.header.metadata, size).map_err(meta_err)?;
    let prev = s.header.metadata.segments[&st.previous].clone();
    let c = prev.crypt.clone().ok_or(meta_err(re::ReencryptMetaError::Layout("backup-previous")))?;
    let (Resilience::DatashiftChecksum { hash, block_size, .. }, area_offset, area_size) =
        (&st.keyslot.resilience, st.keyslot.area_offset, st.keyslot.area_size)
    else {
        return Err(meta_err(re::ReencryptMetaError::Layout("not a data shift decryption")));
    };
    let hash = parse_hash(hash)?;
    let bs = u64::from(*block_size);
    let align = u64::from(c.sector_size.max(512));
    if !g.shift.is_multiple_of(bs.max(align)) || !g.data_size.is_multiple_of(align) {
        return Err(meta_err(re::ReencryptMetaError::Layout("data shift not aligned to its blocks")));
    }
    let sums_len = g.moved_size.div_ceil(bs) * hash.output_len() as u64;
    let meta_size = meta.geometry().size;
    if sums_len > area_size || area_offset.checked_add(area_size).is_none_or(|e| e > meta_size) {
        return Err(meta_err(re::ReencryptMetaError::Layout(
            "checksum area too small for the moved segment",
        )));
    }
    let vk = keys.old.as_ref().ok_or(LuksError::WrongPassphrase)?;
    let old = cipher(&c.encryption, vk, c.sector_size)?;
    let mut p = g.progress(&s.header.metadata, &st).map_err(meta_err)?;
    let fwd = g.data_size - g.moved_size;
    let mut buf = SecretBuf::zeroed(g.shift.min(8 << 20) as usize);
    if st.hot.is_some() && p == fwd {
        // The last hotzone, decrypted in place: a block whose checksum still matches is old.
        // (An online run never gets here: the device's activation recovered it first.)
        let _guard = online.map(|d| d.hold(0, g.moved_size));
        log::warn!("reencrypt: recovering the data shift's last hotzone after an interrupted run");
        let sums = io::read_bytes(meta, area_offset, sums_len as usize, "reencryption checksums")?;
        let hl = hash.output_len();
        let mut sum = vec![0u8; hl];
        let mut off = 0u64;
        while off < g.moved_size {
            let n = (g.moved_size - off).min(buf.len() as u64) as usize;
            let chunk = &mut buf[..n];
            dev.read_at(off, chunk).map_err(io_err("data shift hotzone"))?;
            for (i, blk) in chunk.chunks_mut(bs as usize).enumerate() {
                let b = (off / bs) as usize + i;
                hash.digest_into(&[&*blk], &mut sum);
                if sum == sums[b * hl..(b + 1) * hl] {
                    let at = off + i as u64 * bs;
                    old.decrypt(at / 512, blk).map_err(crypto_err(&c.encryption))?;
                    dev.write_at(at, blk, blockdev::WriteFlags::empty())
                        .map_err(io_err("data shift hotzone"))?;
                }
            }
            off += n as u64;
        }
        dev.flush().map_err(io_err("data device"))?;
        p = g.total();
        let mut next = s.clone();
        let layout = g.layout(&next.header.metadata, &st, p, false).map_err(meta_err)?;
        re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
        luks2::write_header(&mut next, meta)?;
        *s = next;
        if let Some(d) = online {
            d.set_boundary(g.data_size);
            d.set_moved_done();
        }
    }
    if recover_only {
        return Ok(RunEnd::Interrupted);
    }
    let mut recovering = st.hot.is_some();
    if p < g.total() && !progress(p, g.total()) && !recovering {
        return Ok(RunEnd::Interrupted);
    }
    while let Some((start, len)) = g.next_hotzone(p) {
        let last = start == 0;
        let guard = online.map(|d| d.hold(start, len));
        if last {
            // Checksums of the old blocks, durable before the header that points at them.
            let mut sums = vec![0u8; sums_len as usize];
            let hl = hash.output_len();
            let mut off = 0u64;
            while off < len {
                let n = (len - off).min(buf.len() as u64) as usize;
                dev.read_at(off, &mut buf[..n]).map_err(io_err("data shift hotzone"))?;
                let first = (off / bs) as usize * hl;
                let count = (n as u64).div_ceil(bs) as usize;
                block_sums(hash, &buf[..n], bs as usize, &mut sums[first..first + count * hl]);
                off += n as u64;
            }
            io::write_bytes(meta, area_offset, &sums, "reencryption checksums")?;
            io::flush(meta, "reencryption checksums")?;
        }
        if recovering {
            log::warn!(
                "reencrypt: redoing the data shift hotzone at {start} ({len} bytes) after an interrupted run"
            );
            recovering = false;
        } else {
            let mut next = s.clone();
            let layout = g.layout(&next.header.metadata, &st, p, true).map_err(meta_err)?;
            re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
            luks2::write_header(&mut next, meta)?;
            *s = next;
        }
        let src = g.source(start);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            let chunk = &mut buf[..n];
            dev.read_at(src + done, chunk).map_err(io_err("data shift hotzone"))?;
            old.decrypt((start + done) / 512, chunk).map_err(crypto_err(&c.encryption))?;
            dev.write_at(start + done, chunk, blockdev::WriteFlags::empty())
                .map_err(io_err("data shift hotzone"))?;
            done += n as u64;
        }
        dev.flush().map_err(io_err("data device"))?;
        p = if last { g.total() } else { p + len };
        let mut next = s.clone();
        let layout = g.layout(&next.header.metadata, &st, p, false).map_err(meta_err)?;
        re::assign_segments(&mut st, &mut next.header.metadata, layout).map_err(meta_err)?;
        luks2::write_header(&mut next, meta)?;
        *s = next;
        if let Some(d) = online {
            // As `decrypt_shift_activation` maps the header just written.
            d.set_boundary(if p >= fwd { g.data_size } else { g.moved_size + p });
            if last {
                d.set_moved_done();
            }
        }
        drop(guard);
        if p < g.total() && !progress(p, g.total()) {
            return Ok(RunEnd::Interrupted);
        }
    }
    progress(g.total(), g.total());
    // The ciphertext given up past the data (cryptsetup wipes it with random bytes); a
    // crash here resumes to the same point.
    io::wipe(dev, g.data_size, size - g.data_size, true, "data past the decrypted data")?;
    io::flush(dev, "data past the decrypted data")?;
    let d_old = st.digest_old;
    finish(s, meta, &st, d_old, None)?;
    Ok(RunEnd::Finished)
}

/// `true` for an encryption with data shift in place (`--reduce-device-size`): mode
/// encrypt, backward, resilience `datashift`, a moved first segment.
pub(super) fn is_shift_encryption(st: &ReencryptState) -> bool {
    st.keyslot.mode == ReencryptMode::Encrypt
        && st.keyslot.direction == Direction::Backward
        && matches!(st.keyslot.resilience, Resilience::Datashift { .. })
        && st.moved.is_some()
}
