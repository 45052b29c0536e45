//! `sealdisk repair` of LUKS headers, against the real cryptsetup 2.6 on image files:
//!
//! * a LUKS1 header whose disabled keyslots are damaged (offset, stripes): sealdisk and
//!   cryptsetup repair copies of one image to the same bytes, with the same messages, and
//!   the passphrase still opens it in cryptsetup;
//! * a damaged enabled keyslot cannot be repaired by either: both refuse, nothing written;
//! * a LUKS2 header with a damaged primary copy: repaired from the secondary, so cryptsetup
//!   reads the volume with the secondary then destroyed;
//! * a sound header: nothing written ("No known problems detected for LUKS header.");
//!   bad input (not LUKS, a missing device, the wrong `--type`, a device in use) gets
//!   cryptsetup's errors and exit codes.
//!
//! The reencryption recovery half of `repair` is tested in reencrypt_online.rs (a run
//! killed mid-hotzone) and volume's luks_reencrypt.rs (a crash at every flush).

use crate::common;

use std::path::Path;
use std::process::Output;

use common::cryptsetup::{available, cs, ok, Vol};
use common::{run as sealdisk, FAST_PBKDF2};

const MIB: u64 = 1 << 20;

fn luks(kind: &str) -> Vol {
    let v = Vol::empty(20 * MIB, b"correct horse");
    let mut args = vec!["luksFormat", "--type", kind, "--batch-mode", "--key-file", v.pass()];
    args.extend(FAST_PBKDF2);
    args.push(v.img());
    ok(&cs(&args), "luksFormat");
    v
}

/// Writes `value` big-endian at `off` of the image.
fn poke_u32(img: &Path, off: u64, value: u32) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.write_all_at(&value.to_be_bytes(), off).unwrap();
}

/// LUKS1 keyslot `i`'s key-material offset and stripes fields.
fn keyslot_fields(i: u64) -> (u64, u64) {
    let base = 208 + 48 * i;
    (base + 40, base + 44)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn copy(v: &Vol, name: &str) -> std::path::PathBuf {
    let p = v.dir.path().join(name);
    std::fs::copy(&v.img, &p).unwrap();
    p
}

#[test]
fn luks1_damaged_disabled_keyslots_are_repaired_as_cryptsetup_does() {
    if !available() {
        return;
    }
    let v = luks("luks1");
    let (off7, _) = keyslot_fields(7);
    let (_, stripes3) = keyslot_fields(3);
    poke_u32(&v.img, off7, 9999);
    poke_u32(&v.img, stripes3, 3999);
    let damaged = std::fs::read(&v.img).unwrap();
    assert!(!cs(&["isLuks", v.img()]).status.success(), "cryptsetup should refuse the damaged header");
    let theirs = copy(&v, "theirs.img");
    let t = cs(&["repair", "--batch-mode", theirs.to_str().unwrap()]);
    ok(&t, "cryptsetup repair");
    let s = sealdisk(&["repair", "--batch-mode", v.img()]);
    ok(&s, "sealdisk repair");
    let (ours, theirs) = (std::fs::read(&v.img).unwrap(), std::fs::read(&theirs).unwrap());
    assert_ne!(ours, damaged, "nothing was written");
    assert!(ours == theirs, "sealdisk and cryptsetup repaired the header to different bytes");
    // cryptsetup's messages for what it changed, in its order (it prints them as errors).
    let lines = |o: &Output| {
        stderr(o).lines().filter(|l| l.starts_with("Keyslot ")).map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(lines(&s), lines(&t), "messages differ");
    assert_eq!(lines(&s).len(), 4, "{}", stderr(&s));
    ok(&cs(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]), "open after repair");
    // Once repaired, there is nothing left to do.
    assert_nothing_to_repair(&v, &ours);
}

/// `repair` of a sound `v` (whose image is `image`) says so and writes nothing.
fn assert_nothing_to_repair(v: &Vol, image: &[u8]) {
    let s = sealdisk(&["-v", "repair", "--batch-mode", v.img()]);
    ok(&s, "repair of a sound volume");
    assert!(stderr(&s).contains("No known problems detected for LUKS header."), "{}", stderr(&s));
    assert!(std::fs::read(&v.img).unwrap() == image, "a sound header was rewritten");
}

#[test]
fn a_damaged_enabled_keyslot_is_refused_by_both_and_nothing_written() {
    if !available() {
        return;
    }
    let v = luks("luks1");
    let (off0, _) = keyslot_fields(0);
    poke_u32(&v.img, off0, 99_999);
    let before = std::fs::read(&v.img).unwrap();
    let t = cs(&["repair", "--batch-mode", v.img()]);
    assert_eq!(t.status.code(), Some(1), "cryptsetup: {}", stderr(&t));
    let s = sealdisk(&["repair", "--batch-mode", v.img()]);
    assert_eq!(s.status.code(), Some(1), "sealdisk: {}", stderr(&s));
    assert!(stderr(&s).contains("Repair failed"), "{}", stderr(&s));
    assert!(std::fs::read(&v.img).unwrap() == before, "a failed repair wrote");
}

#[test]
fn luks2_damaged_primary_copy_is_rewritten_from_the_secondary() {
    if !available() {
        return;
    }
    let v = luks("luks2");
    let before = std::fs::read(&v.img).unwrap();
    poke_u32(&v.img, 512, 0xdead_beef); // covered by the primary's checksum
    let s = sealdisk(&["repair", "--batch-mode", v.img()]);
    ok(&s, "sealdisk repair");
    assert!(stderr(&s).contains("primary header repaired"), "{}", stderr(&s));
    // The secondary copy is now destroyed: cryptsetup must read the repaired primary.
    let hdr_size = u64::from_be_bytes(before[8..16].try_into().unwrap());
    poke_u32(&v.img, hdr_size + 512, 0xdead_beef);
    let dump = ok(&cs(&["luksDump", v.img()]), "luksDump with the secondary destroyed");
    assert!(dump.contains("Keyslots:"), "{dump}");
    ok(&cs(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]), "open after repair");
}

#[test]
fn bad_input_gets_cryptsetup_errors() {
    if !available() {
        return;
    }
    let v = luks("luks2");
    let before = std::fs::read(&v.img).unwrap();
    let plain = v.dir.path().join("plain.img");
    std::fs::File::create(&plain).unwrap().set_len(4 * MIB).unwrap();
    let plain = plain.to_str().unwrap();
    for (args, code, words) in [
        (vec!["repair", "--batch-mode", plain], 1, "is not a valid LUKS device."),
        (vec!["repair", "--batch-mode", "/nonexistent/disk.img"], 4, "does not exist or access denied."),
        (vec!["repair", "--batch-mode", "--type", "luks1", v.img()], 1, "is not a valid LUKS1 device"),
        (vec!["repair", "--batch-mode", "--type", "plain", v.img()], 1, "LUKS devices only"),
    ] {
        let s = sealdisk(&args);
        assert_eq!(s.status.code(), Some(code), "{args:?}: {}", stderr(&s));
        assert!(stderr(&s).contains(words), "{args:?}: {}", stderr(&s));
        // cryptsetup agrees on the exit code (it says nothing for a wrong --type).
        let mut ca: Vec<&str> = args.clone();
        ca.retain(|a| *a != "--batch-mode");
        ca.insert(1, "--batch-mode");
        assert_eq!(cs(&ca).status.code(), Some(code), "cryptsetup {ca:?}");
    }
    // A sound LUKS2 volume: nothing to do, nothing written.
    assert_nothing_to_repair(&v, &before);
    // Served by another sealdisk, the device is busy (exit 5) and left alone.
    let srv = common::serve(v.dir.path(), "vol", &["--key-file", v.pass(), v.img(), "vol"], None);
    let s = sealdisk(&["repair", "--batch-mode", v.img()]);
    assert_eq!(s.status.code(), Some(5), "repair of a served volume: {}", stderr(&s));
    srv.stop_ok();
}

/// A hostile LUKS1 header (a 4 GiB key size, a damaged keyslot): refused on the key size
/// before anything is sized by it, nothing written.
#[test]
fn a_hostile_key_size_is_refused_before_use() {
    if !available() {
        return;
    }
    let v = luks("luks1");
    poke_u32(&v.img, 108, 0xffff_fff0); // keyBytes
    poke_u32(&v.img, keyslot_fields(7).0, 9999);
    let before = std::fs::read(&v.img).unwrap();
    let s = sealdisk(&["repair", "--batch-mode", v.img()]);
    assert_eq!(s.status.code(), Some(1), "{}", stderr(&s));
    assert!(stderr(&s).contains("Non standard key size"), "{}", stderr(&s));
    assert!(std::fs::read(&v.img).unwrap() == before, "a refused repair wrote");
}
