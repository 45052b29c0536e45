//! The LUKS2 header loader on arbitrary bytes (cryptsetup's `crypt2_load_fuzz` counterpart).
//! Oracle: no panic; and whatever loads re-encodes to a header that loads to the same
//! content (the checksum makes byte-level mutations rarely load, so the input is also
//! tried as a bare JSON area).
#![no_main]

use formats::luks2::{self, Luks2Metadata, MetadataError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(sel) = luks2::load(data) {
        // cryptsetup accepts JSON that exactly fills the area but writes it only with room
        // for the NUL; the same asymmetry is kept here, so that case may not re-encode.
        let (mut img, secondary) = match sel.header.encode(sel.header.seqid, &sel.salts) {
            Ok(copies) => copies,
            Err(luks2::Luks2Error::Metadata { source: MetadataError::JsonTooLarge { .. }, .. }) => return,
            Err(e) => panic!("a loaded header does not re-encode: {e:?}"),
        };
        img.extend(secondary);
        let again = luks2::load(&img).expect("a re-encoded header loads");
        assert_eq!(again.header, sel.header);
    }
    // The JSON area on its own, at the smallest metadata size.
    let mut area = data.to_vec();
    area.resize(16384 - 4096, 0);
    if let Ok((meta, _)) = Luks2Metadata::decode_json_area(&area) {
        let bytes = match meta.encode_json_area(16384 - 4096) {
            Ok(b) => b,
            Err(MetadataError::JsonTooLarge { .. }) => return,
            Err(e) => panic!("decoded metadata does not re-encode: {e:?}"),
        };
        let (again, _) = Luks2Metadata::decode_json_area(&bytes).expect("reloads");
        assert_eq!(again, meta);
    }
});
