//! `sealdisk reencrypt` against the real cryptsetup (2.6 on the host, on image files with
//! `--force-offline-reencrypt`), both directions:
//!
//! * a cryptsetup volume reencrypted by sealdisk: cryptsetup accepts the result and its
//!   `--dump-volume-key` key decrypts the data that was there before;
//! * `--init-only` in one tool, the run in the other (each checks the other's
//!   reencryption verification digest);
//! * a run killed with SIGKILL mid-way in one tool resumes in the other without loss;
//! * bad input gets cryptsetup's messages and exit codes.
//!
//! Data is checked outside both tools: the plaintext is encrypted with the volume key
//! cryptsetup prints before the run, and decrypted with the one it prints after.

use crate::common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::cryptsetup::{
    available as cryptsetup, cipher, cs, in_progress, layout, ok, plaintext, volume_key, write_at, Vol,
};
use common::{bin, run as sealdisk, FAST_PBKDF2};

const MIB: u64 = 1 << 20;

/// A cryptsetup LUKS2 volume of `size` bytes whose data area holds `plaintext`.
fn volume(size: u64) -> Vol {
    let v = Vol::empty(size, b"correct horse");
    let mut args = vec!["luksFormat", "--type", "luks2", "--batch-mode", "--key-file", v.pass()];
    args.extend(FAST_PBKDF2);
    args.push(v.img());
    ok(&cs(&args), "luksFormat");
    let (off, spec, ss) = layout(v.img());
    let mut data = plaintext((size - off) as usize, 0);
    cipher(&spec, &volume_key(v.img(), v.pass()), ss).encrypt(0, &mut data).unwrap();
    write_at(&v.img, off, &data);
    v
}

/// The data, decrypted with the key and layout cryptsetup reports now, equals what was
/// written before; the header is a plain one (no requirement) and the passphrase opens it.
fn assert_data_intact(v: &Vol) {
    let dump = ok(&cs(&["luksDump", v.img()]), "luksDump");
    assert!(!dump.contains("online-reencrypt"), "still in reencryption:\n{dump}");
    ok(&cs(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]), "open --test-passphrase");
    let (off, spec, ss) = layout(v.img());
    let mut data = std::fs::read(&v.img).unwrap().split_off(off as usize);
    cipher(&spec, &volume_key(v.img(), v.pass()), ss).decrypt(0, &mut data).unwrap();
    assert!(data == plaintext(data.len(), 0), "data changed by the reencryption");
}

fn sd_reencrypt(v: &Vol, extra: &[&str]) -> Output {
    let mut args = vec!["reencrypt", "--key-file", v.pass()];
    args.extend(FAST_PBKDF2);
    args.extend(extra);
    args.push(v.img());
    sealdisk(&args)
}

fn cs_reencrypt(v: &Vol, extra: &[&str]) -> Output {
    let mut args = vec!["reencrypt", "--batch-mode", "--force-offline-reencrypt", "--key-file", v.pass()];
    args.extend(FAST_PBKDF2);
    args.extend(extra);
    args.push(v.img());
    cs(&args)
}

#[test]
fn sealdisk_reencrypts_a_cryptsetup_volume() {
    if !cryptsetup() {
        return;
    }
    for extra in [
        &[][..],
        &["--resilience", "journal", "--cipher", "aes-xts-plain64", "--key-size", "256"][..],
        &["--resilience", "none", "--sector-size", "512"][..],
    ] {
        let v = volume(40 * MIB);
        let old = volume_key(v.img(), v.pass());
        ok(&sd_reencrypt(&v, extra), "sealdisk reencrypt");
        assert_ne!(volume_key(v.img(), v.pass()), old, "{extra:?}: the volume key did not change");
        assert_data_intact(&v);
    }
}

#[test]
fn cryptsetup_init_only_then_sealdisk_runs() {
    if !cryptsetup() {
        return;
    }
    let v = volume(40 * MIB);
    ok(
        &cs_reencrypt(&v, &["--init-only", "--cipher", "aes-xts-plain64", "--key-size", "256"]),
        "cryptsetup --init-only",
    );
    assert_eq!(in_progress(v.img()), Some(false));
    // sealdisk prints the reencryption state as cryptsetup does.
    let theirs = ok(&cs(&["luksDump", v.img()]), "cryptsetup luksDump");
    let ours = ok(&sealdisk(&["luksDump", v.img()]), "sealdisk luksDump");
    assert_eq!(ours, theirs, "luksDump of a volume in reencryption");
    ok(&sd_reencrypt(&v, &["--resume-only"]), "sealdisk reencrypt --resume-only");
    assert_data_intact(&v);
    assert_eq!(volume_key(v.img(), v.pass()).len(), 32);
}

#[test]
fn sealdisk_init_only_then_cryptsetup_runs() {
    if !cryptsetup() {
        return;
    }
    for resilience in ["checksum", "journal", "none"] {
        let v = volume(40 * MIB);
        ok(&sd_reencrypt(&v, &["--init-only", "--resilience", resilience]), "sealdisk --init-only");
        assert_eq!(in_progress(v.img()), Some(false));
        let theirs = ok(&cs(&["luksDump", v.img()]), "cryptsetup luksDump");
        let ours = ok(&sealdisk(&["luksDump", v.img()]), "sealdisk luksDump");
        assert_eq!(ours, theirs, "luksDump of a volume in reencryption ({resilience})");
        ok(&cs_reencrypt(&v, &["--resume-only"]), "cryptsetup reencrypt --resume-only");
        assert_data_intact(&v);
    }
}

/// Whether the header's JSON areas (the image's first 32 KiB) name a reencryption: a tool
/// has written its start state. Reads bytes only, so a header being written never fails it.
fn marked(v: &Vol) -> bool {
    use std::io::Read;
    let mut b = Vec::new();
    let Ok(f) = std::fs::File::open(&v.img) else { return false };
    let _ = f.take(32 << 10).read_to_end(&mut b);
    b.windows(16).any(|w| w == b"online-reencrypt")
}

/// Starts `cmd`, SIGKILLs it a delay after its start state appears in the header; tries
/// other delays until the kill lands mid-run. Returns the volume, in progress, and whether a hotzone was mid-write.
fn killed_mid_run(mut cmd: impl FnMut(&Vol) -> Command) -> Option<(Vol, bool)> {
    for ms in [30u64, 0, 10, 60, 150, 300] {
        let v = volume(160 * MIB);
        let mut child =
            cmd(&v).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        // The delay counts from the moment the tool's start state is in the header (polled),
        // however long its key derivations took on this machine.
        let start = std::time::Instant::now();
        while !marked(&v) && start.elapsed() < Duration::from_secs(30) {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(ms));
        let _ = child.kill();
        let _ = child.wait();
        if let Some(hot) = in_progress(v.img()) {
            eprintln!("killed {ms} ms after the start state, hotzone mid-write: {hot}");
            return Some((v, hot));
        }
    }
    None
}

#[test]
fn cryptsetup_killed_mid_run_resumes_in_sealdisk() {
    if !cryptsetup() {
        return;
    }
    let (v, _) = killed_mid_run(|v| {
        let mut c = Command::new("cryptsetup");
        c.args([
            "reencrypt",
            "--batch-mode",
            "--force-offline-reencrypt",
            "--hotzone-size",
            "1M",
            "--key-file",
            v.pass(),
        ])
        .args(FAST_PBKDF2)
        .arg(v.img());
        c
    })
    .expect("cryptsetup was never caught mid-run");
    // Killed in its teardown (old keyslots wiped, metadata not yet dropped), cryptsetup
    // cannot resume ("No usable token is available."); sealdisk finishes it (the flake seen
    // once here, "No key available", was that state).
    let resumed = sd_reencrypt(&v, &[]);
    ok(&resumed, "sealdisk reencrypt (resume)");
    assert_data_intact(&v);
}

#[test]
fn sealdisk_killed_mid_run_resumes_in_cryptsetup() {
    if !cryptsetup() {
        return;
    }
    for resilience in ["checksum", "journal"] {
        let (v, hot) = killed_mid_run(|v| {
            let mut c = Command::new(bin());
            c.args(["reencrypt", "--hotzone-size", "1M", "--resilience", resilience, "--key-file", v.pass()])
                .args(FAST_PBKDF2)
                .arg(v.img());
            c
        })
        .expect("sealdisk was never caught mid-run");
        if hot {
            // cryptsetup 2.6 recovers a hotzone only through `repair` ("Device requires
            // reencryption recovery. Run repair first.").
            ok(&cs(&["repair", "--batch-mode", "--key-file", v.pass(), v.img()]), "cryptsetup repair");
            assert_eq!(in_progress(v.img()), Some(false), "repair recovered the hotzone");
        }
        ok(&cs_reencrypt(&v, &["--resume-only"]), "cryptsetup reencrypt --resume-only");
        assert_data_intact(&v);
    }
}

#[test]
fn bad_input_gets_cryptsetup_errors() {
    if !cryptsetup() {
        return;
    }
    let v = volume(24 * MIB);
    let before = std::fs::read(&v.img).unwrap();
    // Not in progress.
    let out = sd_reencrypt(&v, &["--resume-only"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Device reencryption not in progress."));
    // Wrong passphrase: exit 2, nothing written.
    std::fs::write(&v.pass, "wrong").unwrap();
    let out = sd_reencrypt(&v, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("No key available with this passphrase."));
    assert!(std::fs::read(&v.img).unwrap() == before, "a refused reencrypt wrote something");
    std::fs::write(&v.pass, "correct horse").unwrap();
    // A second init on a volume in progress (made by cryptsetup): refused, as cryptsetup does.
    ok(&cs_reencrypt(&v, &["--init-only"]), "cryptsetup --init-only");
    let out = sd_reencrypt(&v, &["--init-only"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("LUKS2 reencryption already initialized. Aborting operation."));
    let cs_out = cs_reencrypt(&v, &["--init-only"]);
    assert_eq!(cs_out.status.code(), Some(1), "cryptsetup's own answer to the same");
    // Changing the resilience mode on resume is refused, nothing written.
    let mid = std::fs::read(&v.img).unwrap();
    let out = sd_reencrypt(&v, &["--resilience", "none"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(std::fs::read(&v.img).unwrap() == mid);
    // --decrypt without a detached header: cryptsetup's refusal.
    let out = sd_reencrypt(&v, &["--decrypt"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("LUKS2 decryption requires --header option."));
    // And the volume still finishes.
    ok(&sd_reencrypt(&v, &[]), "sealdisk reencrypt");
    assert_data_intact(&v);
}

/// A token bound to the keyslot that is reencrypted follows it to the new keyslot, as with
/// cryptsetup: the token JSON after sealdisk's run equals the one after cryptsetup's.
#[test]
fn tokens_follow_the_new_keyslot_as_in_cryptsetup() {
    if !cryptsetup() {
        return;
    }
    let token = r#"{"type":"luks2-keyring","keyslots":["0"],"key_description":"sealdisk:test"}"#;
    let mut exported = Vec::new();
    for tool in ["cryptsetup", "sealdisk"] {
        let v = volume(32 * MIB);
        let mut import = Command::new("cryptsetup");
        import.args(["token", "import", v.img()]).stdin(Stdio::piped()).stdout(Stdio::null());
        let mut child = import.spawn().unwrap();
        child.stdin.take().unwrap().write_all(token.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "cryptsetup token import");
        if tool == "cryptsetup" {
            ok(&cs_reencrypt(&v, &[]), "cryptsetup reencrypt");
        } else {
            ok(&sd_reencrypt(&v, &[]), "sealdisk reencrypt");
        }
        assert_data_intact(&v);
        let json = ok(&cs(&["token", "export", "--token-id", "0", v.img()]), "cryptsetup token export");
        assert!(json.contains(r#""keyslots":["1"]"#), "{tool}: token not moved to keyslot 1: {json}");
        exported.push(json);
    }
    assert_eq!(exported[0], exported[1], "the token after cryptsetup's and sealdisk's reencrypt");
}
