//! include/sealdisk.h is what cbindgen makes of src/lib.rs (with cbindgen.toml). Run with
//! SEALDISK_UPDATE_HEADER=1 to rewrite it after changing the ABI.
use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses src/lib.rs")
        .write(&mut made);
    let made = String::from_utf8(made).unwrap();
    let path = crate_dir.join("include/sealdisk.h");
    if std::env::var_os("SEALDISK_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &made).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == made,
        "bindings/c/include/sealdisk.h is not what cbindgen makes of src/lib.rs: \
         run SEALDISK_UPDATE_HEADER=1 cargo test -p sealdisk-capi --test capi header, and commit it"
    );
}
