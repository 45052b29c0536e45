//! `--ublk` on the host: bad options and a kernel without ublk fail with a clear error,
//! before the volume is unlocked and before anything is written. (Serving through a real
//! ublk driver is tests/ublk_kernel.rs, in a Linux 6.12 guest.)

use crate::common;

use std::path::Path;

use common::{run, sha_hex, FAST_PBKDF2};

fn luks2(dir: &Path) -> (String, String) {
    let img = dir.join("v.img");
    let pass = dir.join("pass");
    std::fs::File::create(&img).unwrap().set_len(20 << 20).unwrap();
    std::fs::write(&pass, b"ublk host test").unwrap();
    let (img, pass) = (img.to_str().unwrap().to_owned(), pass.to_str().unwrap().to_owned());
    let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", &pass];
    args.extend_from_slice(FAST_PBKDF2);
    args.push(&img);
    let out = run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (img, pass)
}

#[test]
fn ublk_without_a_driver_fails_before_unlocking_or_writing() {
    if Path::new("/dev/ublk-control").exists() {
        eprintln!(
            "SKIPPED ublk_without_a_driver: this host has /dev/ublk-control (ublk_kernel.rs covers serving)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, pass) = luks2(dir.path());
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, b"not the passphrase").unwrap();
    let before = sha_hex(&std::fs::read(&img).unwrap());
    for key in [&pass, wrong.to_str().unwrap()] {
        for ublk in [&["--ublk"][..], &["--ublk", "3"]] {
            let mut args = vec!["open", "--key-file", key, &img, "v"];
            args.extend_from_slice(ublk);
            let out = run(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} succeeded");
            // The driver check comes first: a wrong passphrase is never even tried. A build
            // without the `ublk` feature says so just as early.
            if cfg!(feature = "ublk") {
                assert!(err.contains("/dev/ublk-control does not exist"), "{args:?}: {err}");
                assert!(err.contains("modprobe ublk_drv"), "{args:?}: {err}");
            } else {
                assert!(err.contains("built without ublk support"), "{args:?}: {err}");
                assert!(err.contains("--features ublk"), "{args:?}: {err}");
            }
            assert!(!err.contains("passphrase"), "{args:?}: unlocked before the check: {err}");
        }
    }
    assert_eq!(sha_hex(&std::fs::read(&img).unwrap()), before, "the image changed");
}

/// (The options are checked by the ublk transport, so only in a build with the feature.)
#[cfg(feature = "ublk")]
#[test]
fn bad_ublk_options_are_refused_before_the_driver_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (img, pass) = luks2(dir.path());
    let base = ["open", "--key-file", &pass, &img, "v"];
    for (extra, says) in [
        (&["--ublk", "--ublk-recover"][..], "--ublk-recover needs the device id"),
        (&["--ublk", "3", "--ublk-depth", "0"], "queue depth 0"),
        (&["--ublk", "3", "--ublk-depth", "5000"], "queue depth 5000"),
        (&["--ublk", "3", "--ublk-queues", "1000"], "at most 128"),
        (&["--ublk", "-5"], "between 0 and 1048575"),
        (&["--ublk", "3", "--tls", "on"], "--tls options apply to --listen"),
        (&["--ublk", "--listen", "unix:/tmp/x.sock"], "cannot be used with"),
        (&["--ublk", "--fuse", "/tmp"], "cannot be used with"),
        (&["--ublk-queues", "2", "--listen", "unix:/tmp/x.sock"], "--ublk"),
        (&["--ublk", "3", "--ublk-recover", "--ublk-recoverable"], "cannot be used with"),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} accepted");
        assert!(err.contains(says), "{extra:?}: expected {says:?} in: {err}");
        assert!(!err.contains("ublk-control"), "{extra:?}: asked the driver before checking options: {err}");
    }
}
