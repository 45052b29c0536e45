//! The LUKS1 phdr decoder on arbitrary bytes. Oracle: no panic, and a decoded header
//! re-encodes to bytes that decode to the same header.
#![no_main]

use formats::luks1::Luks1Header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Luks1Header::decode(data) {
        let bytes = h.encode().expect("a decoded header re-encodes");
        assert_eq!(Luks1Header::decode(&bytes).expect("reloads"), h);
    }
});
