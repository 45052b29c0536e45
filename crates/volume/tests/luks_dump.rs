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
