//! `luksDump` output is cryptsetup's, byte for byte: the golden headers of testdata/luks
//! (made by cryptsetup 2.6, see make.sh) are loaded and dumped, and compared with the
//! `cryptsetup luksDump` text saved beside them.

use std::path::{Path, PathBuf};

use blockdev::MemDevice;
use volume::luks::{self, Luks};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/luks").join(name)
}

/// The header file padded with zeroes to a device large enough for its keyslot areas.
fn image(name: &str) -> MemDevice {
    let mut img = std::fs::read(testdata(&format!("{name}.hdr"))).unwrap();
    img.resize(20 << 20, 0);
    MemDevice::from_vec(img, 512)
}

#[test]
fn dump_matches_cryptsetup_for_every_golden_header() {
    for name in [
        "luks1-xts512",
        "luks1-cbc-essiv-sha1",
        "luks2-pbkdf2-xts512",
        "luks2-argon2id-4k-64k",
        "luks2-cbc-essiv",
    ] {
        let dev = image(name);
        let l = Luks::load(&dev, false).unwrap();
        let got = luks::dump(&l, &format!("{name}.img"));
        let want = std::fs::read_to_string(testdata(&format!("{name}.dump"))).unwrap();
        assert_eq!(got, want, "{name}");
    }
}

/// Tokens (with their opaque fields), priorities and unknown JSON survive header rewrites:
/// a UUID change and a keyslot kill on cryptsetup's header with a `sealdisk-test` token.
#[test]
fn tokens_and_unknown_fields_survive_header_rewrites() {
    use volume::luks::LuksHeader;
    let dev = image("luks2-argon2id-4k-64k");
    let mut l = Luks::load(&dev, true).unwrap();
    let token_before = match &l.header {
        LuksHeader::V2(s) => s.header.metadata.tokens.clone(),
        LuksHeader::V1(_) => unreachable!(),
    };
    assert!(token_before[&5].extra.contains_key("opaque"));
    l.set_uuid(&dev, Some("6b2f4a52-0c5e-4d36-9a36-1f3d5f3e0aff")).unwrap();
    l.kill_keyslot(&dev, 0).unwrap();
    let again = Luks::load(&dev, false).unwrap();
    let LuksHeader::V2(s) = &again.header else { unreachable!() };
    assert_eq!(s.header.metadata.tokens, token_before);
    assert_eq!(s.header.metadata.keyslots[&3].priority, Some(2));
    assert_eq!(s.header.seqid, 8, "two updates after epoch 6");
    let dump = luks::dump(&again, "x");
    assert!(dump.contains("  5: sealdisk-test\n\tKeyslot:    3\n"), "{dump}");
}
