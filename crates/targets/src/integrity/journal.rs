//! Mode J: writes go to journal entries, commits stamp and write whole sections, and the
//! writer copies committed sections to the data and tag areas (kernel
//! `dm_integrity_map_continue` journal path, `integrity_commit`, `pad_uncommitted`,
//! `integrity_writer`, `do_journal_write`). Byte formats and the replay rule are in
//! `formats::integrity::journal`; this is the engine around them.
//!
//! ```text
//!  ring of sections:  │ committed, not yet copied │ filled, uncommitted │ current (partly) │ free │
//!                      committed_section            uncommitted_section   free_section
//!  write:   entries allocated in ring order; data + last_bytes + tag copied in (in memory)
//!  commit:  pad the current section (its unused entries stay unused), stamp every sector of
//!           the uncommitted sections with commit_ids[commit_seq] (seq advances on wrap),
//!           section MACs, write those sections, flush            (flush, FUA, timer, watermark)
//!  writer:  commit, then copy every committed entry that is still the newest copy of its
//!           block to data + tag areas, flush, mark the sections free          (watermark, full)
//!  reads:   blocks with an entry in the journal are served from it (`index`)
//! ```
//!
//! One mutex guards the journal: a request fills its entries under it (the kernel also
//! serialises entry allocation), and commit and copy-out run under it, so a reader that looks
//! a block up in `index` sees either the journal copy or a data area the writer has finished.
use std::collections::HashMap;
use std::sync::Arc;

use blockdev::{BlockDevice, BlockResult, WriteFlags};
use formats::integrity::journal::{
    self as fj, commit_section, init_section, next_commit_seq, section_mac_bytes, section_mac_input,
    store_section_mac, CommitIds, JournalGeometry, JournalView, SECTOR_HI_UNUSED,
};
use sector_crypto::tag::TagHash;

use super::jcrypt::JournalCrypt;

/// The in-memory journal and its positions.
#[derive(Debug)]
pub(crate) struct JournalState {
    pub(crate) bytes: Vec<u8>,
    pub(crate) geom: JournalGeometry,
    pub(crate) sections: u32,
    pub(crate) ids: CommitIds,
    pub(crate) commit_seq: u8,
    /// Byte offset of the journal area on the device.
    pub(crate) base: u64,
    free_section: u32,
    free_entry: u32,
    free_entries: u64,
    uncommitted_section: u32,
    n_uncommitted: u32,
    committed_section: u32,
    n_committed: u32,
    /// Newest journal copy of each block (block-aligned logical sector → (section, entry)).
    pub(crate) index: HashMap<u64, (u32, u32)>,
    /// Commit when free entries drop to this (`free_sectors_threshold`).
    pub(crate) threshold: u64,
    pub(crate) commits: u64,
    pub(crate) copyouts: u64,
    /// `journal_crypt`: sections are encrypted on their way to the device.
    crypt: Option<Arc<JournalCrypt>>,
}

/// What the journal needs from the engine to copy entries out and to MAC sections.
pub(crate) trait JournalSink {
    /// The device below.
    type Dev: BlockDevice;
    /// The device below.
    fn dev(&self) -> &Self::Dev;
    /// Writes `data` (whole blocks from logical sector `sector`, one area) and `tags`.
    fn write_blocks(&self, sector: u64, data: &[u8], tags: &[u8]) -> BlockResult<()>;
    /// Writes dirty tag buffers and flushes the device below.
    fn flush_all(&self) -> BlockResult<()>;
    /// The journal MAC and the FIXED_HMAC salt, if any.
    fn journal_mac(&self) -> Option<(&TagHash, Option<&[u8; 16]>)>;
}

impl JournalState {
    /// A journal continuing at `section` with `commit_seq` (after replay), every entry unused
    /// in memory.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        bytes: Vec<u8>,
        geom: JournalGeometry,
        sections: u32,
        base: u64,
        section: u32,
        commit_seq: u8,
        threshold: u64,
        crypt: Option<Arc<JournalCrypt>>,
    ) -> Self {
        let mut j = JournalState {
            bytes,
            geom,
            sections,
            ids: crypt.as_ref().map_or_else(CommitIds::plain, |c| c.commit_ids()),
            commit_seq,
            base,
            free_section: section,
            free_entry: 0,
            free_entries: geom.section_entries as u64 * sections as u64,
            uncommitted_section: section,
            n_uncommitted: 0,
            committed_section: section,
            n_committed: 0,
            index: HashMap::new(),
            threshold,
            commits: 0,
            copyouts: 0,
            crypt,
        };
        for i in 0..sections {
            for e in 0..geom.section_entries {
                j.set_unused(i, e);
            }
        }
        j
    }

    fn section_range(&self, i: u32) -> std::ops::Range<usize> {
        let n = self.geom.section_bytes();
        i as usize * n..(i as usize + 1) * n
    }

    fn set_unused(&mut self, i: u32, e: u32) {
        let off = self.section_range(i).start + self.geom.entry_offset(e);
        self.bytes[off + 4..off + 8].copy_from_slice(&SECTOR_HI_UNUSED.to_le_bytes());
    }

    /// Whether anything is waiting to be committed.
    pub(crate) fn has_uncommitted(&self) -> bool {
        self.n_uncommitted > 0 || self.free_entry > 0
    }

    /// Entries not yet copied out (committed or not).
    pub(crate) fn pending_entries(&self) -> usize {
        self.index.len()
    }

    fn alloc(&mut self) -> Option<(u32, u32)> {
        if self.free_entries == 0 {
            return None;
        }
        let pos = (self.free_section, self.free_entry);
        self.free_entries -= 1;
        self.free_entry += 1;
        if self.free_entry == self.geom.section_entries {
            self.free_entry = 0;
            self.free_section = (self.free_section + 1) % self.sections;
            self.n_uncommitted += 1;
        }
        Some(pos)
    }

    /// Puts `data` (whole blocks from `sector`) with `tags` into journal entries, committing
    /// and copying out when the journal is full.
    pub(crate) fn add<S: JournalSink>(
        &mut self,
        sink: &S,
        sector: u64,
        data: &[u8],
        tags: &[u8],
    ) -> BlockResult<()> {
        let spb = self.geom.sectors_per_block() as u64;
        let bs = spb as usize * 512;
        let ts = self.geom.tag_size as usize;
        for (b, block) in data.chunks_exact(bs).enumerate() {
            let (i, e) = match self.alloc() {
                Some(p) => p,
                None => {
                    self.commit(sink)?;
                    self.write_out(sink)?;
                    match self.alloc() {
                        Some(p) => p,
                        None => {
                            return Err(blockdev::BlockError::new(
                                blockdev::BlockErrorKind::Io,
                                "journal has no free entry after copy-out",
                            ))
                        }
                    }
                }
            };
            let s = sector + b as u64 * spb;
            let r = self.section_range(i);
            fj::write_entry(&self.geom, &mut self.bytes[r], e, s, block, &tags[b * ts..(b + 1) * ts]);
            self.index.insert(s, (i, e));
        }
        Ok(())
    }

    /// Copies the newest journal copy of block `sector` into `out` (one block) and its tag
    /// into `tag`; false if the block is not in the journal.
    pub(crate) fn read_block(&self, sector: u64, out: &mut [u8], tag: Option<&mut [u8]>) -> bool {
        let Some(&(i, e)) = self.index.get(&sector) else { return false };
        let Ok(view) = JournalView::new(self.geom, self.sections, &self.bytes) else { return false };
        out.copy_from_slice(&view.entry_data(i, e));
        if let Some(t) = tag {
            t.copy_from_slice(&view.entry(i, e).tag);
        }
        true
    }

    /// Computes and stores section `i`'s MAC, when the journal has one.
    fn mac_section<S: JournalSink>(&mut self, sink: &S, i: u32) {
        if let Some((mac, salt)) = sink.journal_mac() {
            let r = self.section_range(i);
            let input = section_mac_input(&self.geom, &self.bytes[r.clone()], i, salt);
            let m = section_mac_bytes(&mac.mac(&input));
            store_section_mac(&mut self.bytes[r], &m);
        }
    }

    /// Writes `n` sections from `start` (wrapping) to the device.
    fn write_sections<D: BlockDevice>(&self, dev: &D, start: u32, n: u32) -> BlockResult<()> {
        let sb = self.geom.section_bytes();
        let first = n.min(self.sections - start);
        let write = |from: u32, count: u32| -> BlockResult<()> {
            if count == 0 {
                return Ok(());
            }
            let lo = from as usize * sb;
            let hi = (from + count) as usize * sb;
            match &self.crypt {
                Some(c) => {
                    let mut enc = self.bytes[lo..hi].to_vec();
                    c.encrypt(from, &mut enc);
                    dev.write_at(self.base + lo as u64, &enc, WriteFlags::empty())
                }
                None => dev.write_at(self.base + lo as u64, &self.bytes[lo..hi], WriteFlags::empty()),
            }
        };
        write(start, first)?;
        write(0, n - first)
    }

    /// `integrity_commit`: pads the current section, stamps and writes every uncommitted
    /// section, flushes.
    pub(crate) fn commit<S: JournalSink>(&mut self, sink: &S) -> BlockResult<()> {
        if self.free_entry != 0 {
            self.free_entries -= (self.geom.section_entries - self.free_entry) as u64;
            self.free_entry = 0;
            self.free_section = (self.free_section + 1) % self.sections;
            self.n_uncommitted += 1;
        }
        if self.n_uncommitted == 0 {
            return Ok(());
        }
        let start = self.uncommitted_section;
        let n = self.n_uncommitted;
        let mut i = start;
        for _ in 0..n {
            let r = self.section_range(i);
            commit_section(&self.geom, &self.ids, &mut self.bytes[r], i, self.commit_seq);
            self.mac_section(sink, i);
            i += 1;
            if i >= self.sections {
                self.commit_seq = next_commit_seq(self.commit_seq);
                i = 0;
            }
        }
        self.write_sections(sink.dev(), start, n)?;
        sink.dev().flush()?;
        self.uncommitted_section = (start + n) % self.sections;
        self.n_committed += n;
        self.n_uncommitted = 0;
        self.commits += 1;
        Ok(())
    }

    /// `integrity_writer` / `do_journal_write`: copies every committed section out, newest
    /// copy of each block only, merging consecutive entries into one write; then flushes and
    /// frees the sections.
    pub(crate) fn write_out<S: JournalSink>(&mut self, sink: &S) -> BlockResult<()> {
        if self.n_committed == 0 {
            return Ok(());
        }
        let spb = self.geom.sectors_per_block() as u64;
        let entries = self.geom.section_entries;
        let mut i = self.committed_section;
        for _ in 0..self.n_committed {
            let mut done: Vec<(u32, u64)> = Vec::new();
            {
                let view = JournalView::new(self.geom, self.sections, &self.bytes).map_err(|e| {
                    blockdev::BlockError::new(
                        blockdev::BlockErrorKind::Io,
                        "the journal does not fit its geometry",
                    )
                    .with_source(e)
                })?;
                let mut j = 0;
                while j < entries {
                    let e = view.entry(i, j);
                    let fj::EntryState::Sector(sec) = e.state() else {
                        done.push((j, u64::MAX));
                        j += 1;
                        continue;
                    };
                    if self.index.get(&sec) != Some(&(i, j)) {
                        // A newer copy is in the journal: it will be written instead.
                        done.push((j, u64::MAX));
                        j += 1;
                        continue;
                    }
                    let mut k = j + 1;
                    while k < entries {
                        let e2 = view.entry(i, k);
                        let want = sec + (k - j) as u64 * spb;
                        match e2.state() {
                            fj::EntryState::Sector(s2)
                                // The sink splits a merged write at interleave-area boundaries.
                                if s2 == want && self.index.get(&s2) == Some(&(i, k)) => {}
                            _ => break,
                        }
                        k += 1;
                    }
                    let mut data = Vec::with_capacity((k - j) as usize * spb as usize * 512);
                    let mut tags = Vec::with_capacity((k - j) as usize * self.geom.tag_size as usize);
                    for m in j..k {
                        data.extend_from_slice(&view.entry_data(i, m));
                        tags.extend_from_slice(&view.entry(i, m).tag);
                        done.push((m, sec + (m - j) as u64 * spb));
                    }
                    sink.write_blocks(sec, &data, &tags)?;
                    self.copyouts += 1;
                    j = k;
                }
            }
            for (m, sec) in done {
                self.set_unused(i, m);
                if sec != u64::MAX && self.index.get(&sec) == Some(&(i, m)) {
                    self.index.remove(&sec);
                }
            }
            i = (i + 1) % self.sections;
        }
        sink.flush_all()?;
        self.free_entries += self.n_committed as u64 * entries as u64;
        self.committed_section = (self.committed_section + self.n_committed) % self.sections;
        self.n_committed = 0;
        Ok(())
    }

    /// Commits and copies everything out.
    pub(crate) fn drain<S: JournalSink>(&mut self, sink: &S) -> BlockResult<()> {
        self.commit(sink)?;
        self.write_out(sink)
    }

    /// After a write: commit and copy out if free entries dropped to the watermark.
    pub(crate) fn after_write<S: JournalSink>(&mut self, sink: &S, fua: bool) -> BlockResult<()> {
        if fua {
            self.commit(sink)?;
        }
        if self.free_entries <= self.threshold {
            self.drain(sink)?;
        }
        Ok(())
    }

    /// `init_journal` of every section with `seq` (in memory; the caller writes it).
    pub(crate) fn init_all<S: JournalSink>(&mut self, sink: &S, seq: u8) {
        for i in 0..self.sections {
            let r = self.section_range(i);
            init_section(&self.geom, &self.ids, &mut self.bytes[r], i, seq);
            self.mac_section(sink, i);
        }
    }

    /// Writes the whole journal area.
    pub(crate) fn write_all<D: BlockDevice>(&self, dev: &D) -> BlockResult<()> {
        self.write_sections(dev, 0, self.sections)
    }

    /// Re-initialises the listed sections (a replay's `Clear`), in memory and on disk.
    pub(crate) fn clear<S: JournalSink>(&mut self, sink: &S, list: &[(u32, u8)]) -> BlockResult<()> {
        for &(i, seq) in list {
            let r = self.section_range(i);
            init_section(&self.geom, &self.ids, &mut self.bytes[r], i, seq);
            self.mac_section(sink, i);
            self.write_sections(sink.dev(), i, 1)?;
        }
        if !list.is_empty() {
            sink.dev().flush()?;
        }
        Ok(())
    }
}
