//! The C ABI from C: bindings/c/test.sh compiles tests/read_volume.c with gcc against
//! include/sealdisk.h and the libsealdisk.so this build made, runs it on a LUKS2 image
//! cryptsetup made and on a BitLocker image of testdata/bitlk, then has cryptsetup open the
//! keyslot the C program added. Says SKIPPED when gcc, cryptsetup or xz is missing.
use std::path::PathBuf;
use std::process::Command;

/// The directory holding the libsealdisk.so cargo built with this test (deps/, beside the
/// test binary, or the profile directory above it).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    [deps.clone(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .find(|d| d.join("libsealdisk.so").is_file())
        .unwrap_or_else(|| panic!("no libsealdisk.so in {} or its parent", deps.display()))
}

#[test]
fn c_program_reads_cryptsetup_and_bitlocker_volumes() {
    for tool in ["gcc", "cryptsetup", "xz"] {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!("SKIPPED: {tool} not found; the C ABI's C test did not run");
            return;
        }
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("test.sh");
    let out = Command::new("bash").arg(&script).env("SEALDISK_LIB_DIR", lib_dir()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "bindings/c/test.sh failed: {}\n{text}", out.status);
    assert!(text.contains("checks passed") && text.contains("test.sh: ok"), "{text}");
}
