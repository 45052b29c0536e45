//! Journal replay rule on synthetic journals built with the same helpers an engine would
//! use (init_section / write_entry / commit_section): fresh, committed, torn commit,
//! wraparound of the commit sequence, corrupt commit ids, and bitmap mode.
use formats::integrity::journal::{self, CommitIds, JournalGeometry, JournalResume, JournalView};
use formats::integrity::JournalError;

const SECTIONS: u32 = 4;

fn geom() -> JournalGeometry {
    JournalGeometry::new(4, 0, false)
}

fn fresh(seq: u8) -> Vec<u8> {
    let g = geom();
    let ids = CommitIds::plain();
    let mut j = vec![0u8; SECTIONS as usize * g.section_bytes()];
    for (i, s) in j.chunks_mut(g.section_bytes()).enumerate() {
        journal::init_section(&g, &ids, s, i as u32, seq);
    }
    j
}

fn section(j: &mut [u8], i: u32) -> &mut [u8] {
    let n = geom().section_bytes();
    &mut j[i as usize * n..(i as usize + 1) * n]
}

fn put(j: &mut [u8], i: u32, entry: u32, sector: u64, fill: u8) {
    let data = vec![fill; 512];
    journal::write_entry(&geom(), section(j, i), entry, sector, &data, &[fill; 4]);
}

fn plan(j: &[u8], journal_mode: bool) -> Result<journal::ReplayPlan, JournalError> {
    journal::scan(&JournalView::new(geom(), SECTIONS, j).unwrap(), &CommitIds::plain(), journal_mode)
}

fn replayed(j: &[u8], provided: u64) -> Vec<(u64, u8)> {
    let v = JournalView::new(geom(), SECTIONS, j).unwrap();
    let p = journal::scan(&v, &CommitIds::plain(), true).unwrap();
    journal::replay_entries(&v, &p, provided, None)
        .unwrap()
        .iter()
        .map(|e| (e.logical_sector, e.data[0]))
        .collect()
}

#[test]
fn geometry_matches_the_kernel_examples() {
    let g = geom();
    assert_eq!(
        (g.entry_size, g.entries_per_sector, g.section_entries, g.section_sectors),
        (24, 21, 168, 176)
    );
    let m = JournalGeometry::new(4, 0, true);
    assert_eq!((m.section_entries, m.section_sectors), (160, 168));
    let b = JournalGeometry::new(4, 3, false);
    assert_eq!((b.entry_size, b.section_entries, b.section_sectors), (80, 48, 392));
    assert_eq!(g.entry_offset(9), 512 + 24);
}

#[test]
fn fresh_journal_is_empty_and_continues_at_zero() {
    let p = plan(&fresh(0), true).unwrap();
    assert!(p.journal_empty);
    // The consistency walk wraps past the last section once, advancing the sequence: new
    // commits use seq 1 (as in the kernel, and in the golden image's second session).
    assert_eq!(p.resume, JournalResume::Continue { section: 0, commit_seq: 1 });
    assert!(replayed(&fresh(0), 1 << 20).is_empty());
}

#[test]
fn committed_sections_replay_in_order_and_later_entries_win() {
    let g = geom();
    let ids = CommitIds::plain();
    let mut j = fresh(0);
    put(&mut j, 0, 0, 8, 0xb0);
    put(&mut j, 0, 1, 9, 0xb1);
    put(&mut j, 1, 0, 8, 0xc0);
    // A second commit into sections 0,1 with seq 0 (still in the first lap).
    journal::commit_section(&g, &ids, section(&mut j, 0), 0, 0);
    journal::commit_section(&g, &ids, section(&mut j, 1), 1, 0);
    assert_eq!(replayed(&j, 1 << 20), vec![(8, 0xb0), (9, 0xb1), (8, 0xc0)]);
    // Entries at or beyond provided_data_sectors are dropped; in-progress markers too.
    assert_eq!(replayed(&j, 9), vec![(8, 0xb0), (8, 0xc0)]);
    let mut ip = j.clone();
    let off = g.entry_offset(1);
    section(&mut ip, 0)[off + 4..off + 8].copy_from_slice(&journal::SECTOR_HI_INPROGRESS.to_le_bytes());
    assert_eq!(replayed(&ip, 1 << 20), vec![(8, 0xb0), (8, 0xc0)]);
}

#[test]
fn a_torn_commit_stops_the_replay_and_clears_the_journal() {
    let g = geom();
    let ids = CommitIds::plain();
    // Lap 1 wrote all sections with seq 0; lap 2 committed sections 0,1 with seq 1, and the
    // commit of section 2 was torn (only its first sector carries seq 1).
    let mut j = fresh(0);
    put(&mut j, 0, 0, 16, 0x10);
    put(&mut j, 1, 0, 24, 0x11);
    for i in 0..2 {
        journal::commit_section(&g, &ids, section(&mut j, i), i, 1);
    }
    let mut full = section(&mut j, 2).to_vec();
    journal::write_entry(&g, &mut full, 0, 32, &[0x12; 512], &[0x12; 4]);
    journal::commit_section(&g, &ids, &mut full, 2, 1);
    section(&mut j, 2)[..512].copy_from_slice(&full[..512]); // only sector 0 reached the disk
    let p = plan(&j, true).unwrap();
    // used {0,1}: unused = 2, last_used = 1, want = 0; write_start = max_section[1] + 1 = 3
    // (section 2's sector 0 carries seq 1), sections 3 (seq 0) is consistent, then section 0
    // (after the wrap want = 1) ... until the torn section 2.
    assert_eq!((p.last_used, p.want_commit_seq, p.write_start), (1, 0, 3));
    assert_eq!(p.write_sections, 3);
    assert_eq!(p.resume, JournalResume::Clear { from: 3, erase_seq: 3, commit_seq: 0 });
    // Section 2's entry (the torn commit) is not replayed.
    assert_eq!(replayed(&j, 1 << 20), vec![(16, 0x10), (24, 0x11)]);
    assert_eq!(journal::clear_sections(&p.resume, SECTIONS), vec![(3, 3), (0, 3), (1, 3), (2, 3)]);
}

#[test]
fn commit_sequence_wraps_with_the_journal() {
    // Every section committed in lap k carries seq k % 4; a full lap with seq 3 followed by
    // sections 0,1 with seq 0 (the sequence wrapped).
    let g = geom();
    let ids = CommitIds::plain();
    let mut j = fresh(3);
    put(&mut j, 0, 0, 40, 0x40);
    for i in 0..2 {
        journal::commit_section(&g, &ids, section(&mut j, i), i, 0);
    }
    let p = plan(&j, true).unwrap();
    assert_eq!(p.used_commit_ids, [true, false, false, true]);
    // seq 3 used: unused = lowest unused = 1; last_used = 0; want = 3; write_start = 2.
    assert_eq!((p.last_used, p.want_commit_seq, p.write_start, p.write_sections), (0, 3, 2, 4));
    assert_eq!(p.resume, JournalResume::Continue { section: 2, commit_seq: 0 });
    assert_eq!(replayed(&j, 1 << 20), vec![(40, 0x40)]);
}

#[test]
fn corrupt_commit_ids_fail_the_scan() {
    let mut j = fresh(0);
    section(&mut j, 1)[512 * 3 + 504] ^= 0x80;
    assert_eq!(plan(&j, true), Err(JournalError::BadCommitId { section: 1, sector: 3 }));
    let g = geom();
    let ids = CommitIds::plain();
    let mut all = fresh(0);
    for (i, seq) in [(1u32, 1u8), (2, 2), (3, 3)] {
        journal::commit_section(&g, &ids, section(&mut all, i), i, seq);
    }
    assert_eq!(plan(&all, true), Err(JournalError::AllCommitIdsUsed));
    assert_eq!(journal::FAILED_SCAN_RESUME, JournalResume::Clear { from: 0, erase_seq: 2, commit_seq: 3 });
}

#[test]
fn bitmap_mode_clears_a_consistent_nonempty_journal() {
    let g = geom();
    let mut j = fresh(0);
    put(&mut j, 0, 0, 8, 1);
    journal::commit_section(&g, &CommitIds::plain(), section(&mut j, 0), 0, 0);
    let p = plan(&j, false).unwrap();
    assert!(matches!(p.resume, JournalResume::Clear { .. }));
    assert!(matches!(plan(&j, true).unwrap().resume, JournalResume::Continue { .. }));
}

#[test]
fn commit_ids_are_made_distinct() {
    let same = CommitIds::from_bytes([[7; 8]; 4]);
    let v: Vec<u64> = same.0.iter().map(|b| u64::from_le_bytes(*b)).collect();
    let base = u64::from_le_bytes([7; 8]);
    assert_eq!(v, vec![base, base + 1, base + 2, base + 3]);
    let p = CommitIds::plain();
    assert_eq!(p.commit_id(1, 2, 0), (0x1111_1111_1111_1111u64 ^ (1 << 32) ^ 2).to_le_bytes());
}

#[test]
fn restore_entry_puts_the_written_block_back_in_place() {
    // 4096-byte blocks: the commit overwrites bytes 504..512 of each of the 8 data sectors.
    let g = JournalGeometry::new(4, 3, false);
    let ids = CommitIds::plain();
    let mut s = vec![0u8; g.section_bytes()];
    journal::init_section(&g, &ids, &mut s, 0, 0);
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 + i / 512) as u8).collect();
    journal::write_entry(&g, &mut s, 3, 64, &block, &[9, 8, 7, 6]);
    journal::commit_section(&g, &ids, &mut s, 0, 1);
    let at = g.data_sector(3) as usize * 512;
    assert_ne!(&s[at..at + 4096], &block[..], "the commit stamps the sector tails");
    assert_eq!(journal::entry_tag(&g, &s, 3), &[9, 8, 7, 6]);
    let e = JournalView::new(g, 1, &s).unwrap().entry(0, 3);
    assert_eq!((e.raw_sector, &e.tag[..]), (64, &[9u8, 8, 7, 6][..]));
    for (k, lb) in e.last_bytes.iter().enumerate() {
        assert_eq!(&lb[..], &block[k * 512 + 504..(k + 1) * 512], "last bytes of sector {k}");
    }
    assert!(journal::restore_entry(&g, &mut s, 3));
    assert_eq!(&s[at..at + 4096], &block[..]);
    // Idempotent, and what a reader restores from the entry stays the same.
    assert!(journal::restore_entry(&g, &mut s, 3));
    assert_eq!(JournalView::new(g, 1, &s).unwrap().entry_data(0, 3), block);
    // An unused entry is left alone.
    let before = s.clone();
    assert!(!journal::restore_entry(&g, &mut s, 4));
    assert_eq!(s, before);
}
