//! `luksAddKey` and `luksChangeKey` take the new passphrase the same way, and refuse, before
//! reading or writing anything, to take both passphrases from stdin.

use crate::common;

use common::{run, run_stdin};

/// A fresh LUKS2 image (fast PBKDF2) opened by `old`.
fn image(dir: &std::path::Path, old: &[u8]) -> (String, String) {
    let img = dir.join("v.img");
    std::fs::write(&img, vec![0u8; 20 << 20]).unwrap();
    let pass = dir.join("old.key");
    std::fs::write(&pass, old).unwrap();
    let (img, pass) = (img.to_str().unwrap().to_string(), pass.to_str().unwrap().to_string());
    let out = run(&[
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &pass,
        &img,
    ]);
    assert!(out.status.success(), "luksFormat: {}", String::from_utf8_lossy(&out.stderr));
    (img, pass)
}

#[test]
fn both_passphrases_from_stdin_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = image(dir.path(), b"old passphrase");
    let before = std::fs::read(&img).unwrap();
    for action in ["luksAddKey", "luksChangeKey"] {
        for new in [vec!["-"], vec!["--new-keyfile", "-"]] {
            let mut args = vec![
                action,
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                "-",
                img.as_str(),
            ];
            args.extend(new.iter().copied());
            let out = run_stdin(&args, b"old passphrase");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains("only one of the passphrases can come from stdin"), "{args:?}: {err}");
            assert!(std::fs::read(&img).unwrap() == before, "{args:?} changed the image");
        }
    }
}

#[test]
fn change_key_takes_the_new_passphrase_from_the_positional_file() {
    let dir = tempfile::tempdir().unwrap();
    let (img, old) = image(dir.path(), b"old passphrase");
    let new = dir.path().join("new.key");
    std::fs::write(&new, b"new passphrase").unwrap();
    let new = new.to_str().unwrap();
    let out = run(&[
        "luksChangeKey",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &old,
        &img,
        new,
    ]);
    assert!(out.status.success(), "luksChangeKey: {}", String::from_utf8_lossy(&out.stderr));
    let opens = |key: &str| run(&["open", "--test-passphrase", "--key-file", key, &img]).status.success();
    assert!(opens(new), "the new passphrase does not open the volume");
    assert!(!opens(&old), "the old passphrase still opens the volume");
}
