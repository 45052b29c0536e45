//! Allocation maps from `SEEK_DATA` / `SEEK_HOLE`, rounded to the device's blocks.
//!
//! ```text
//!   file       |data  data|     hole     |d|  hole  |data ...
//!   blocks     |    |    |    |    |    |    |    |    |
//!   extents    | DATA    |  HOLE|ZERO    | DATA   |... (a block with any data is data)
//! ```
//!
//! The filesystem reports holes at its own granularity, which can be finer than the
//! device's logical block (1 KiB ext4 blocks under a 4 KiB device). A block is reported as a
//! hole only if all of it is one: data wins, so a hole boundary inside a block moves
//! outwards from the data.

use std::io;

use crate::{Extent, ExtentFlags};

/// Each walk step advances by at least one block; this many steps per extent asked for is
/// the most work one call does before it answers with what it has.
const STEPS_PER_EXTENT: usize = 4;

/// Appends extents, merging one into the last when their flags match.
struct Extents {
    list: Vec<Extent>,
}

impl Extents {
    fn push(&mut self, len: u64, flags: ExtentFlags) {
        match self.list.last_mut() {
            Some(last) if last.flags == flags => last.len += len,
            _ => self.list.push(Extent { len, flags }),
        }
    }
}

/// The allocation of `[off, off+len)` of a file with blocks of `block` bytes (`off` and
/// `len` multiples of it), at most `max` extents. `seek_data(pos)` is `lseek(SEEK_DATA)`:
/// the first data offset at or after `pos`, `None` when there is none before the end of the
/// file (`ENXIO`). `seek_hole(pos)` is `lseek(SEEK_HOLE)`: the first hole offset at or after
/// `pos` (the end of the file counts as one).
pub(crate) fn walk(
    off: u64,
    len: u64,
    block: u64,
    max: usize,
    mut seek_data: impl FnMut(u64) -> io::Result<Option<u64>>,
    mut seek_hole: impl FnMut(u64) -> io::Result<u64>,
) -> io::Result<Vec<Extent>> {
    let max = max.max(1);
    let end = off + len;
    let mut out = Extents { list: Vec::new() };
    let mut pos = off;
    let mut steps = 0;
    let round_up = |x: u64| x.div_ceil(block) * block;
    // The last extent may still grow by merging, so stop only once a further one exists.
    while pos < end && out.list.len() <= max && steps < STEPS_PER_EXTENT * max {
        steps += 1;
        let data = seek_data(pos)?.unwrap_or(end);
        // The whole blocks of the hole before the data.
        let hole_end = data.clamp(pos, end) / block * block;
        if hole_end > pos {
            out.push(hole_end - pos, ExtentFlags::HOLE | ExtentFlags::ZERO);
            pos = hole_end;
            continue;
        }
        // Data starts inside the block at `pos`: it runs to the next hole, rounded up to a
        // whole block (and at least this block).
        let hole = seek_hole(data.max(pos))?;
        let data_end = round_up(hole.max(pos + 1)).min(end);
        out.push(data_end - pos, ExtentFlags::empty());
        pos = data_end;
    }
    out.list.truncate(max);
    Ok(out.list)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: ExtentFlags = ExtentFlags::empty();
    const H: ExtentFlags = ExtentFlags::HOLE.union(ExtentFlags::ZERO);

    /// A file of `size` bytes whose data lies in `data` (sorted, disjoint `[start, end)`).
    fn file(
        size: u64,
        data: &'static [(u64, u64)],
    ) -> (impl FnMut(u64) -> io::Result<Option<u64>>, impl FnMut(u64) -> io::Result<u64>) {
        let seek_data = move |pos: u64| {
            Ok(data.iter().find(|&&(_, e)| e > pos).map(|&(s, _)| s.max(pos)).filter(|&d| d < size))
        };
        let seek_hole = move |pos: u64| {
            let mut p = pos;
            for &(s, e) in data {
                if s <= p && p < e {
                    p = e;
                }
            }
            Ok(p.min(size))
        };
        (seek_data, seek_hole)
    }

    fn ext(list: &[(u64, ExtentFlags)]) -> Vec<Extent> {
        list.iter().map(|&(len, flags)| Extent { len, flags }).collect()
    }

    #[test]
    fn holes_and_data_alternate_when_aligned() {
        let (sd, sh) = file(64 << 10, &[(0, 8192), (32768, 40960)]);
        let got = walk(0, 64 << 10, 512, 100, sd, sh).unwrap();
        assert_eq!(got, ext(&[(8192, D), (24576, H), (8192, D), (24576, H)]));
    }

    #[test]
    fn a_block_with_any_data_is_data() {
        // 4 KiB blocks; data 1 KiB into the second block and 1 KiB past the fourth's start.
        let (sd, sh) = file(32768, &[(5120, 13312)]);
        let got = walk(0, 32768, 4096, 100, sd, sh).unwrap();
        assert_eq!(got, ext(&[(4096, H), (12288, D), (16384, H)]));
    }

    #[test]
    fn sub_block_holes_between_data_merge_into_data() {
        let (sd, sh) = file(16384, &[(0, 1024), (2048, 3072), (5120, 6144)]);
        let got = walk(0, 16384, 4096, 100, sd, sh).unwrap();
        assert_eq!(got, ext(&[(8192, D), (8192, H)]));
    }

    #[test]
    fn a_window_inside_the_file_is_reported_from_its_start() {
        let (sd, sh) = file(65536, &[(0, 8192), (32768, 40960)]);
        let got = walk(4096, 32768, 512, 100, sd, sh).unwrap();
        assert_eq!(got, ext(&[(4096, D), (24576, H), (4096, D)]));
    }

    #[test]
    fn the_answer_stops_at_max_extents() {
        let (sd, sh) = file(65536, &[(0, 4096), (8192, 12288), (16384, 20480), (24576, 28672)]);
        let got = walk(0, 65536, 512, 3, sd, sh).unwrap();
        assert_eq!(got, ext(&[(4096, D), (4096, H), (4096, D)]));
        let (sd, sh) = file(65536, &[(0, 4096)]);
        assert_eq!(walk(0, 65536, 512, 0, sd, sh).unwrap(), ext(&[(4096, D)]));
    }

    #[test]
    fn an_empty_file_region_is_one_hole() {
        let (sd, sh) = file(65536, &[]);
        assert_eq!(walk(0, 65536, 512, 1, sd, sh).unwrap(), ext(&[(65536, H)]));
    }

    #[test]
    fn a_hole_answer_before_the_position_cannot_stall_the_walk() {
        // A racing writer can make SEEK_HOLE answer the position itself; the walk still
        // advances by a block.
        let got = walk(0, 8192, 4096, 10, |p| Ok(Some(p)), Ok).unwrap();
        assert_eq!(got, ext(&[(8192, D)]));
    }
}
