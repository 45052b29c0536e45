//! Superblock codec: round trip (proptest), no panic on any bytes, and one error per
//! malformation, each made by mangling exactly one field of a valid superblock.
use formats::integrity::superblock::{sb_mac_ranges, verify_sb_mac, write_sb_mac, SB_AREA_BYTES};
use formats::integrity::{sb_set_version, Mode, SbCheck, SbFlags, Superblock, SuperblockError};
use proptest::prelude::*;

fn valid() -> Superblock {
    Superblock {
        version: 5,
        log2_interleave_sectors: 15,
        integrity_tag_size: 4,
        journal_sections: 5,
        provided_data_sectors: 129160,
        flags: SbFlags(SbFlags::FIXED_PADDING | SbFlags::FIXED_HMAC),
        log2_sectors_per_block: 0,
        log2_blocks_per_bitmap_bit: 15,
        recalc_sector: 0,
        salt: [0xa5; 16],
    }
}

fn mangled(off: usize, bytes: &[u8]) -> Vec<u8> {
    let mut b = valid().encode().to_vec();
    b[off..off + bytes.len()].copy_from_slice(bytes);
    b
}

const CHECK: SbCheck = SbCheck { tag_size: 4, block_size: 512, meta_device: false, journal_mac: false };

#[test]
fn malformed_superblocks_are_refused_each_with_its_own_error() {
    use SuperblockError::*;
    let cases: Vec<(&str, Vec<u8>, SuperblockError)> = vec![
        ("short", valid().encode()[..63].to_vec(), TooShort { len: 63 }),
        ("zero area", vec![0; SB_AREA_BYTES], Unformatted),
        ("bad magic", mangled(0, b"integrx\0"), BadMagic),
        ("magic without NUL", mangled(7, b"!"), BadMagic),
        ("version 0", mangled(8, &[0]), UnknownVersion { version: 0 }),
        ("version 7", mangled(8, &[7]), UnknownVersion { version: 7 }),
        ("tag size 0", mangled(10, &[0, 0]), ZeroTagSize),
        ("tag size 256", mangled(10, &256u16.to_le_bytes()), TagSizeTooLarge { tag_size: 256 }),
        ("log2 spb 4", mangled(28, &[4]), BadLog2SectorsPerBlock { value: 4 }),
        ("journal_sections 0", mangled(12, &[0, 0, 0, 0]), ZeroJournalSections),
        ("interleave 2", mangled(9, &[2]), BadLog2Interleave { value: 2 }),
        ("interleave 32", mangled(9, &[32]), BadLog2Interleave { value: 32 }),
        (
            "bitmap bit 61+3",
            {
                let mut b = mangled(28, &[3]);
                b[29] = 61;
                b
            },
            BadLog2BlocksPerBitmapBit { value: 61 },
        ),
    ];
    for (what, bytes, want) in cases {
        assert_eq!(Superblock::decode(&bytes), Err(want), "{what}");
    }
}

#[test]
fn table_mismatches_are_refused_each_with_its_own_error() {
    use SuperblockError::*;
    let sb = valid();
    sb.check(&CHECK).unwrap();
    assert_eq!(sb.check(&SbCheck { tag_size: 8, ..CHECK }), Err(TagSizeMismatch { table: 8, superblock: 4 }));
    assert_eq!(
        sb.check(&SbCheck { block_size: 4096, ..CHECK }),
        Err(BlockSizeMismatch { table: 4096, superblock: 512 })
    );
    assert_eq!(
        sb.check(&SbCheck { meta_device: true, ..CHECK }),
        Err(InterleaveMismatch { value: 15, meta_device: true })
    );
    let zero_il = Superblock { log2_interleave_sectors: 0, ..valid() };
    assert_eq!(zero_il.check(&CHECK), Err(InterleaveMismatch { value: 0, meta_device: false }));
    zero_il.check(&SbCheck { meta_device: true, ..CHECK }).unwrap();
    assert_eq!(
        sb.check(&SbCheck { journal_mac: true, ..CHECK }),
        Err(JournalMacMismatch { flag: false, table: true })
    );
    let mac_flag = Superblock { flags: SbFlags(SbFlags::HAVE_JOURNAL_MAC), ..valid() };
    assert_eq!(mac_flag.check(&CHECK), Err(JournalMacMismatch { flag: true, table: false }));
    // Version 6 (inline, Linux 6.11+) decodes but is refused.
    let v6 = Superblock::decode(&mangled(8, &[6])).unwrap();
    assert_eq!(v6.check(&CHECK), Err(InlineUnsupported { version: 6 }));
    let inline =
        Superblock::decode(&mangled(24, &(SbFlags::INLINE | SbFlags::FIXED_PADDING).to_le_bytes())).unwrap();
    assert!(matches!(inline.check(&CHECK), Err(InlineUnsupported { .. })));
}

#[test]
fn sb_set_version_follows_the_kernel_rule() {
    let f = |b| SbFlags(b);
    assert_eq!(sb_set_version(f(0), Mode::Journal, false), 1);
    assert_eq!(sb_set_version(f(0), Mode::Journal, true), 2);
    assert_eq!(sb_set_version(f(SbFlags::RECALCULATING), Mode::Direct, false), 2);
    assert_eq!(sb_set_version(f(0), Mode::Bitmap, false), 3);
    assert_eq!(sb_set_version(f(SbFlags::DIRTY_BITMAP), Mode::Journal, false), 3);
    assert_eq!(sb_set_version(f(SbFlags::FIXED_PADDING), Mode::Bitmap, true), 4);
    assert_eq!(sb_set_version(f(SbFlags::FIXED_HMAC), Mode::Journal, false), 5);
    assert_eq!(sb_set_version(f(SbFlags::INLINE | SbFlags::FIXED_HMAC), Mode::Journal, false), 6);
}

#[test]
fn superblock_mac_covers_sector_zero_before_the_mac() {
    let mut area = valid().encode();
    let mac = |b: &[u8]| -> Vec<u8> {
        b.iter().fold(vec![0u8; 32], |mut acc, x| {
            acc[*x as usize % 32] ^= x.wrapping_add(1);
            acc
        })
    };
    assert_eq!(sb_mac_ranges(32).unwrap(), (0..480, 480..512));
    assert_eq!(sb_mac_ranges(449), Err(SuperblockError::MacTooLong { size: 449 }));
    write_sb_mac(&mut area, 32, mac).unwrap();
    verify_sb_mac(&area, 32, mac).unwrap();
    area[47] ^= 1;
    assert_eq!(verify_sb_mac(&area, 32, mac), Err(SuperblockError::MacMismatch));
}

fn arb_sb() -> impl Strategy<Value = Superblock> {
    (
        (1u8..=6, prop_oneof![Just(0u8), 3u8..=31], 1u16..=255, 1u32.., any::<u64>()),
        (any::<u32>(), 0u8..=3, 0u8..=60, any::<u64>(), any::<[u8; 16]>()),
    )
        .prop_map(|((version, il, tag, js, provided), (flags, spb, bpb, recalc, salt))| Superblock {
            version,
            log2_interleave_sectors: il,
            integrity_tag_size: tag,
            journal_sections: js,
            provided_data_sectors: provided,
            flags: SbFlags(flags),
            log2_sectors_per_block: spb,
            log2_blocks_per_bitmap_bit: bpb,
            recalc_sector: recalc,
            salt,
        })
}

proptest! {
    #[test]
    fn superblock_round_trips(sb in arb_sb()) {
        prop_assert_eq!(Superblock::decode(&sb.encode()), Ok(sb));
    }

    #[test]
    fn superblock_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), magic in any::<bool>()) {
        let mut b = bytes;
        if magic && b.len() >= 8 { b[..8].copy_from_slice(b"integrt\0"); }
        if let Ok(sb) = Superblock::decode(&b) {
            // Anything accepted re-encodes to the same 64 bytes.
            prop_assert_eq!(&sb.encode()[..64], &b[..64]);
        }
    }
}
