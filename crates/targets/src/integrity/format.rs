//! Format: what the kernel writes when it opens an all-zero superblock area
//! (`initialize_superblock`, `init_journal(ic, 0, journal_sections, 0)`, `sync_rw_sb`).
//!
//! ```text
//!   Layout::format(params, device) ─► Superblock + Layout     (formats::integrity)
//!   journal area: every section init_section(seq 0) (+ section MAC)  ─► written
//!   superblock area: encode (+ superblock MAC with FIXED_HMAC + journal_mac) ─► written, FUA
//! ```
//!
//! The wipe (zeroes with valid tags, as cryptsetup does through a temporary no-journal
//! dm-integrity device) is [`super::IntegrityTarget::wipe`] on a target opened in mode D;
//! without it (`--no-wipe`) the tags are left invalid and unwritten blocks read as EIO.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use blockdev::{BlockDevice, BlockResult, WriteFlags, ZeroFlags};
use formats::integrity::journal::{
    init_section, section_mac_bytes, section_mac_input, store_section_mac, CommitIds,
};
use formats::integrity::superblock::write_sb_mac;
use formats::integrity::{DeviceParams, FormatParams, Layout, SbFlags, Superblock};
use sector_crypto::tag::TagHash;

use super::config::io;
use super::{IntegrityError, IntegrityTarget};

/// What to format.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Tag size, block size, journal size, interleave, padding, fix_hmac and its salt.
    /// `journal_mac` is set from [`FormatOptions::journal_mac`].
    pub params: FormatParams,
    /// Table `start`: sectors reserved before the superblock.
    pub start: u64,
    /// `buffer_sectors:` (only shapes the layout with a meta device; default 128).
    pub buffer_sectors: u32,
    /// `sectors_per_bit:` (stored as `log2_blocks_per_bitmap_bit`).
    pub sectors_per_bit: Option<u64>,
    /// `journal_mac:` (keyed): section MACs and, with fix_hmac, the superblock MAC.
    pub journal_mac: Option<TagHash>,
    /// `journal_crypt:` the journal is written encrypted (ctr(aes) or cbc(aes)).
    pub journal_crypt: Option<super::JournalCryptSpec>,
}

/// Writes a fresh superblock and an initialised journal to `next` (see the module docs).
pub fn format<D: BlockDevice>(
    next: &D,
    opts: &FormatOptions,
) -> Result<(Superblock, Layout), IntegrityError> {
    let g = next.geometry();
    let mut params = opts.params.clone();
    params.journal_mac = opts.journal_mac.is_some();
    let dp = DeviceParams {
        data_device_sectors: g.size / 512,
        meta_device_sectors: None,
        start: opts.start,
        buffer_sectors: opts.buffer_sectors,
        sectors_per_bit: opts.sectors_per_bit,
    };
    let (sb, layout) = Layout::format(&params, &dp).map_err(IntegrityError::Layout)?;
    let salt = sb.hmac_salt().copied();
    let crypt = match &opts.journal_crypt {
        Some(spec) => Some(
            super::JournalCrypt::new(spec, &layout)
                .ok_or(IntegrityError::JournalCryptKey { key_len: spec.key.len() })?,
        ),
        None => None,
    };
    let ids = crypt.as_ref().map_or_else(CommitIds::plain, |c| c.commit_ids());
    let mut journal = vec![0u8; layout.journal_bytes() as usize];
    let sbytes = layout.journal.section_bytes();
    for (i, section) in journal.chunks_exact_mut(sbytes).enumerate() {
        init_section(&layout.journal, &ids, section, i as u32, 0);
        if let Some(mac) = &opts.journal_mac {
            let input = section_mac_input(&layout.journal, section, i as u32, salt.as_ref());
            store_section_mac(section, &section_mac_bytes(&mac.mac(&input)));
        }
    }
    if let Some(c) = &crypt {
        c.encrypt(0, &mut journal);
    }
    next.write_at(layout.journal_byte_offset(), &journal, WriteFlags::empty())
        .map_err(io("writing the journal"))?;
    let mut area = sb.encode();
    if let (Some(mac), true) = (&opts.journal_mac, sb.flags.has(SbFlags::FIXED_HMAC)) {
        write_sb_mac(&mut area, mac.digest_size(), |i| mac.mac(i)).map_err(IntegrityError::Superblock)?;
    }
    next.write_at(opts.start * 512, &area, WriteFlags::FUA).map_err(io("writing the superblock"))?;
    next.flush().map_err(io("flushing"))?;
    Ok((sb, layout))
}

impl<D: BlockDevice + 'static> IntegrityTarget<D> {
    /// Writes zeroes with valid tags over the whole device in 64 MiB chunks (the format wipe),
    /// calling `progress(bytes_done, bytes_total)` on the calling thread as chunks finish.
    ///
    /// One chunk per core is in flight at once: a chunk is a zero-range request below, then
    /// hashing its tags (CPU), then writing them, so with one chunk at a time a core idles
    /// while the other waits on I/O. Chunks never share a tag buffer of another chunk's areas
    /// and each takes its range lock, as concurrent `write_zeroes` requests would.
    pub fn wipe(&self, mut progress: impl FnMut(u64, u64)) -> BlockResult<()> {
        self.wipe_until(|done, total| {
            progress(done, total);
            std::ops::ControlFlow::Continue(())
        })
        .map(|_| ())
    }

    /// [`wipe`](Self::wipe) that stops when `progress` returns `Break`: no new chunk starts,
    /// the chunks in flight finish, and the device is flushed. Chunks are handed out in
    /// order, so what was wiped is a prefix: returns `Some(bytes)` of it when stopped before
    /// the end, `None` when the whole device was wiped.
    pub fn wipe_until(
        &self,
        mut progress: impl FnMut(u64, u64) -> std::ops::ControlFlow<()>,
    ) -> BlockResult<Option<u64>> {
        let total = self.inner.geometry.size;
        let chunk = 64u64 << 20;
        let chunks = total.div_ceil(chunk);
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(chunks as usize).max(1);
        let next = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel::<BlockResult<u64>>();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let tx = tx.clone();
                let (next, failed, stop) = (&next, &failed, &stop);
                scope.spawn(move || {
                    while !failed.load(Ordering::Relaxed) && !stop.load(Ordering::SeqCst) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= chunks {
                            break;
                        }
                        let off = i * chunk;
                        let n = chunk.min(total - off);
                        let r = self.inner.write_zeroes_direct(off, n, ZeroFlags::empty(), true).map(|()| n);
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        if tx.send(r).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let mut done = 0;
            let mut first_err = None;
            for r in rx {
                match r {
                    Ok(n) => {
                        done += n;
                        if progress(done, total).is_break() {
                            stop.store(true, Ordering::SeqCst);
                        }
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(()),
            }
        })?;
        self.inner.flush()?;
        // Every chunk below `next` was handed out and written before its worker looked again.
        let wiped = (next.load(Ordering::SeqCst).min(chunks) * chunk).min(total);
        Ok((wiped < total).then_some(wiped))
    }
}
