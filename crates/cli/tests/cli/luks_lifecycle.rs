//! LUKS2 header maintenance against the real cryptsetup (the host's cryptsetup-bin 2.6
//! handles LUKS headers on image files without root): `token add|remove|import|export`,
//! `luksDump --dump-json-metadata`, `config`, unbound keyslots (`luksAddKey --unbound`,
//! `luksDump --unbound`, `open --unbound --test-passphrase`), `luks2-keyring` tokens at
//! `open` (`--token-only`, `--token-id`) and `open --persistent`. Each direction: what
//! sealdisk writes, cryptsetup reads back the same, and the reverse; errors with
//! cryptsetup's messages and exit codes, leaving the image unchanged.

use crate::common;

use std::process::Output;

use common::cryptsetup::{available as cryptsetup, cs, ok};
use common::{run as sealdisk, serve, FAST_PBKDF2};

/// Asserts `out` failed with `code` and `msg` on stderr.
fn fails(out: &Output, code: i32, msg: &str, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{what}: {err}");
    assert!(err.contains(msg), "{what}: expected {msg:?} in {err}");
}

struct Vol {
    dir: tempfile::TempDir,
    img: String,
    pass: String,
}

impl Vol {
    /// A 20 MiB LUKS2 image (fast PBKDF2) made by sealdisk (`by_cryptsetup`: by cryptsetup).
    fn new(by_cryptsetup: bool) -> Vol {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(20 << 20).unwrap();
        let pass = dir.path().join("pass");
        std::fs::write(&pass, b"first passphrase").unwrap();
        let (img, pass) = (img.to_str().unwrap().to_owned(), pass.to_str().unwrap().to_owned());
        let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", &pass];
        args.extend(FAST_PBKDF2);
        args.push(&img);
        if by_cryptsetup {
            ok(&cs(&args), "cryptsetup luksFormat");
        } else {
            ok(&sealdisk(&args), "sealdisk luksFormat");
        }
        Vol { dir, img, pass }
    }

    fn file(&self, name: &str, data: &[u8]) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p.to_str().unwrap().to_owned()
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.img).unwrap()
    }

    /// `luksDump` and `--dump-json-metadata` of both tools are identical.
    fn same_dumps(&self, what: &str) {
        let a = ok(&sealdisk(&["luksDump", &self.img]), "sealdisk luksDump");
        let b = ok(&cs(&["luksDump", &self.img]), "cryptsetup luksDump");
        assert_eq!(a, b, "{what}: luksDump differs");
        let a = ok(&sealdisk(&["luksDump", "--dump-json-metadata", &self.img]), "sealdisk json");
        let b = ok(&cs(&["luksDump", "--dump-json-metadata", &self.img]), "cryptsetup json");
        assert_eq!(a, b, "{what}: --dump-json-metadata differs");
    }
}

/// A token of a type only a plugin would unlock, members in no particular order.
const FOREIGN_TOKEN: &str =
    r#"{"type":"my-plugin","keyslots":["0"],"zeta":"abc","x":[1,{"a":null}],"alpha":true}"#;

#[test]
fn tokens_round_trip_both_ways() {
    if !cryptsetup() {
        return;
    }
    for by_cs in [false, true] {
        let v = Vol::new(by_cs);
        let what = if by_cs { "cryptsetup-made" } else { "sealdisk-made" };
        // sealdisk adds a keyring token (every keyslot), imports a foreign one as id 4 with
        // keyslot 0; cryptsetup exports them as sealdisk does.
        ok(&sealdisk(&["token", "add", "--key-description", "sd:desc", &v.img]), "token add");
        let json = v.file("t.json", FOREIGN_TOKEN.as_bytes());
        ok(&sealdisk(&["token", "import", "--json-file", &json, "--token-id", "4", &v.img]), "import");
        for id in ["0", "4"] {
            let a = ok(&sealdisk(&["token", "export", "--token-id", id, &v.img]), "sealdisk export");
            let b = ok(&cs(&["token", "export", "--token-id", id, &v.img]), "cryptsetup export");
            assert_eq!(a, b, "{what}: token {id}");
        }
        assert_eq!(
            ok(&sealdisk(&["token", "export", "--token-id", "0", &v.img]), "export"),
            r#"{"type":"luks2-keyring","keyslots":["0"],"key_description":"sd:desc"}"#
        );
        assert_eq!(ok(&sealdisk(&["token", "export", "--token-id", "4", &v.img]), "export"), FOREIGN_TOKEN);
        // cryptsetup adds token 2 after 4 (json-c keeps that order on disk); sealdisk's JSON
        // dump follows the disk, its text dump the ids.
        ok(&cs(&["token", "add", "--key-description", "cs:desc", "--token-id", "2", &v.img]), "cs add");
        let a = ok(&sealdisk(&["token", "export", "--token-id", "2", &v.img]), "sealdisk export");
        assert_eq!(a, r#"{"type":"luks2-keyring","keyslots":["0"],"key_description":"cs:desc"}"#);
        v.same_dumps(what);
        // sealdisk's header rewrites keep every token.
        ok(&sealdisk(&["token", "remove", "--token-id", "0", &v.img]), "remove");
        let out = ok(&cs(&["token", "export", "--token-id", "4", &v.img]), "cryptsetup export");
        assert_eq!(out, FOREIGN_TOKEN, "{what}: the foreign token after a rewrite");
        fails(&cs(&["token", "export", "--token-id", "0", &v.img]), 1, "Failed to get token 0", what);
        v.same_dumps(what);
    }
}

#[test]
fn token_errors_are_cryptsetups_and_change_nothing() {
    let v = Vol::new(false);
    ok(&sealdisk(&["token", "add", "--key-description", "x", &v.img]), "token add");
    let before = v.bytes();
    let bad = v.file("bad.json", br#"{"type":"x","keyslots":["9"]}"#);
    let no_type = v.file("no-type.json", br#"{"keyslots":[]}"#);
    let keyring_no_desc = v.file("kr.json", br#"{"type":"luks2-keyring","keyslots":["0"]}"#);
    let junk = v.file("junk.json", b"nonsense");
    let good = v.file("good.json", FOREIGN_TOKEN.as_bytes());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["token", "remove", &v.img], "Action requires specific token. Use --token-id parameter."),
        (vec!["token", "export", &v.img], "Action requires specific token. Use --token-id parameter."),
        (vec!["token", "remove", "--token-id", "7", &v.img], "Token 7 is not in use."),
        (vec!["token", "export", "--token-id", "7", &v.img], "Failed to get token 7 for export."),
        (vec!["token", "add", &v.img], "--key-description parameter is mandatory for token add action."),
        (vec!["token", "add", "--key-description", "y", "--token-id", "0", &v.img], "Token 0 in use."),
        (vec!["token", "add", "--key-description", "y", "-S", "7", &v.img], "Keyslot 7 is not active."),
        (vec!["token", "import", "--json-file", &bad, &v.img], "Keyslot 9 is not active."),
        (vec!["token", "import", "--json-file", &no_type, &v.img], "Failed to import token from file."),
        (
            vec!["token", "import", "--json-file", &keyring_no_desc, &v.img],
            "Failed to import token from file.",
        ),
        (vec!["token", "import", "--json-file", &junk, &v.img], "Failed to import token from file."),
        (vec!["token", "import", "--json-file", &good, "--token-id", "32", &v.img], "Token 32 is invalid."),
    ];
    for (args, msg) in &cases {
        fails(&sealdisk(args), 1, msg, &format!("{args:?}"));
        assert!(v.bytes() == before, "{args:?} changed the image");
    }
    // LUKS1 has no tokens.
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("l1.img");
    std::fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
    let img = img.to_str().unwrap();
    let mut args = vec!["luksFormat", "-q", "--type", "luks1", "--key-file", &v.pass];
    args.extend(FAST_PBKDF2);
    args.push(img);
    ok(&sealdisk(&args), "luksFormat luks1");
    fails(
        &sealdisk(&["token", "add", "--key-description", "x", img]),
        1,
        "is not a valid LUKS2 device",
        "luks1",
    );
    fails(
        &sealdisk(&["luksDump", "--dump-json-metadata", img]),
        1,
        "Dump operation is not supported for this device type.",
        "luks1",
    );
    fails(&sealdisk(&["config", "--label", "x", img]), 1, "is not a valid LUKS2 device", "luks1 config");
}

#[test]
fn config_sets_label_subsystem_and_priority() {
    if !cryptsetup() {
        return;
    }
    let v = Vol::new(false);
    let new = v.file("new", b"second passphrase");
    let mut args = vec!["luksAddKey", "--key-file", &v.pass, &v.img, &new];
    args.extend(FAST_PBKDF2);
    ok(&sealdisk(&args), "luksAddKey");
    ok(&sealdisk(&["config", "--label", "mylabel", "--subsystem", "mysub", &v.img]), "config label");
    ok(&sealdisk(&["config", "--priority", "prefer", "-S", "1", &v.img]), "config prefer");
    ok(&sealdisk(&["config", "--priority", "ignore", "-S", "0", &v.img]), "config ignore");
    let dump = ok(&cs(&["luksDump", &v.img]), "cryptsetup luksDump");
    assert!(dump.contains("Label:         \tmylabel\n"), "{dump}");
    assert!(dump.contains("Subsystem:     \tmysub\n"), "{dump}");
    assert!(dump.contains("  0: luks2\n\tKey:        512 bits\n\tPriority:   ignored\n"), "{dump}");
    assert!(dump.contains("  1: luks2\n\tKey:        512 bits\n\tPriority:   preferred\n"), "{dump}");
    v.same_dumps("after config");
    // An ignored keyslot is not tried unless named (cryptsetup's rule, both tools).
    for tool in ["cryptsetup", "sealdisk"] {
        let run = |args: &[&str]| if tool == "cryptsetup" { cs(args) } else { sealdisk(args) };
        let out = run(&["open", "--test-passphrase", "--key-file", &v.pass, &v.img]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{tool}: ignored keyslot tried: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ok(&run(&["open", "--test-passphrase", "-S", "0", "--key-file", &v.pass, &v.img]), tool);
    }
    // cryptsetup's config, read back by sealdisk; "normal" removes the member.
    ok(&cs(&["config", "--label", "cs-label", "--priority", "normal", "-S", "0", &v.img]), "cs config");
    let dump = ok(&sealdisk(&["luksDump", &v.img]), "sealdisk luksDump");
    assert!(dump.contains("Label:         \tcs-label\n"), "{dump}");
    assert!(dump.contains("Priority:   normal\n"), "{dump}");
    ok(&sealdisk(&["config", "--priority", "normal", "-S", "1", &v.img]), "config normal");
    v.same_dumps("normal again");
    let before = v.bytes();
    for (args, msg) in [
        (vec!["config", &v.img], "Option --priority, --label or --subsystem is missing."),
        (vec!["config", "--priority", "prefer", &v.img], "Keyslot specification is required."),
        (
            vec!["config", "--priority", "bogus", "-S", "0", &v.img],
            "Option --priority can be only ignore/normal/prefer.",
        ),
        (vec!["config", "--priority", "ignore", "-S", "9", &v.img], "Keyslot 9 is not active."),
    ] {
        fails(&sealdisk(&args), 1, msg, &format!("{args:?}"));
        assert!(v.bytes() == before, "{args:?} changed the image");
    }
}

/// The unbound key `luksDump --unbound` prints, as hex.
fn unbound_key(dump: &str) -> String {
    let start = dump.find("Unbound Key:").expect("Unbound Key line");
    dump[start + "Unbound Key:".len()..].split_whitespace().collect()
}

#[test]
fn unbound_keyslots_both_ways() {
    if !cryptsetup() {
        return;
    }
    let v = Vol::new(false);
    let ub = v.file("ub", b"unbound passphrase");
    // sealdisk adds an unbound 256-bit key in slot 3; cryptsetup dumps it and its key.
    let mut args = vec!["luksAddKey", "--unbound", "-s", "256", "-S", "3", &v.img, &ub];
    args.extend(FAST_PBKDF2);
    ok(&sealdisk(&args), "luksAddKey --unbound");
    let dump = ok(&cs(&["luksDump", &v.img]), "cryptsetup luksDump");
    assert!(dump.contains("  3: luks2 (unbound)\n\tKey:        256 bits\n"), "{dump}");
    v.same_dumps("unbound");
    let a =
        ok(&sealdisk(&["luksDump", "--unbound", "-S", "3", "--key-file", &ub, &v.img]), "sealdisk --unbound");
    let b = ok(&cs(&["luksDump", "--unbound", "-S", "3", "--key-file", &ub, &v.img]), "cryptsetup --unbound");
    assert_eq!(a, b);
    assert_eq!(unbound_key(&a).len(), 64, "{a}");
    // cryptsetup adds one (slot 1, 128 bits); sealdisk reads its key as cryptsetup does.
    let mut args = vec!["luksAddKey", "--unbound", "-s", "128", &v.img, &ub];
    args.extend(FAST_PBKDF2);
    ok(&cs(&args), "cryptsetup luksAddKey --unbound");
    let a =
        ok(&sealdisk(&["luksDump", "--unbound", "-S", "1", "--key-file", &ub, &v.img]), "sealdisk --unbound");
    let b = ok(&cs(&["luksDump", "--unbound", "-S", "1", "--key-file", &ub, &v.img]), "cryptsetup --unbound");
    assert_eq!(a, b);
    assert_ne!(
        unbound_key(&a),
        unbound_key(&ok(&sealdisk(&["luksDump", "--unbound", "-S", "3", "--key-file", &ub, &v.img]), "3"))
    );
    v.same_dumps("two unbound");
    // open --unbound --test-passphrase takes any keyslot; without --unbound the unbound
    // passphrase opens nothing.
    for tool in ["cryptsetup", "sealdisk"] {
        let run = |args: &[&str]| if tool == "cryptsetup" { cs(args) } else { sealdisk(args) };
        ok(&run(&["open", "--unbound", "--test-passphrase", "--key-file", &ub, &v.img]), tool);
        ok(&run(&["open", "--unbound", "--test-passphrase", "-S", "3", "--key-file", &ub, &v.img]), tool);
        ok(&run(&["open", "--unbound", "--test-passphrase", "-S", "0", "--key-file", &v.pass, &v.img]), tool);
        let out = run(&["open", "--unbound", "--test-passphrase", "-S", "3", "--key-file", &v.pass, &v.img]);
        assert_eq!(out.status.code(), Some(2), "{tool}");
        assert_ne!(
            run(&["open", "--test-passphrase", "--key-file", &ub, &v.img]).status.code(),
            Some(0),
            "{tool}"
        );
    }
    fails(
        &sealdisk(&["luksDump", "--unbound", "--key-file", &ub, &v.img]),
        1,
        "Keyslot specification is required.",
        "no -S",
    );
    fails(
        &sealdisk(&["luksDump", "--unbound", "-S", "0", "--key-file", &v.pass, &v.img]),
        1,
        "Keyslot 0 does not contain unbound key.",
        "bound slot",
    );
    fails(&sealdisk(&["luksAddKey", "--unbound", &v.img, &ub]), 1, "--key-size", "no key size");
    // Killing an unbound keyslot leaves a valid header (its digest goes with it).
    ok(&sealdisk(&["luksKillSlot", "-q", &v.img, "3"]), "luksKillSlot 3");
    ok(&cs(&["luksDump", &v.img]), "cryptsetup luksDump after kill");
    ok(&cs(&["open", "--test-passphrase", "--key-file", &v.pass, &v.img]), "volume key still opens");
}

/// A `user` key in this process's session keyring (children inherit it), or `None` if the
/// kernel keyring is not usable here.
fn keyring_add(desc: &str, payload: &[u8]) -> Option<()> {
    use linux_keyutils::{KeyRing, KeyRingIdentifier};
    let ring = KeyRing::from_special_id(KeyRingIdentifier::Session, true).ok()?;
    ring.add_key(desc, payload).ok()?;
    Some(())
}

#[test]
fn keyring_token_opens_the_volume() {
    let v = Vol::new(false);
    let tag = std::process::id();
    let (good, wrong, missing) =
        (format!("sd-test:{tag}:good"), format!("sd-test:{tag}:wrong"), format!("sd-test:{tag}:missing"));
    if keyring_add(&good, b"first passphrase").is_none() || keyring_add(&wrong, b"nope").is_none() {
        eprintln!("SKIPPED: the kernel keyring is not usable here (keyctl add_key failed)");
        return;
    }
    for d in [&good, &wrong, &missing] {
        ok(&sealdisk(&["token", "add", "--key-description", d, &v.img]), "token add");
    }
    let open = |extra: &[&str]| {
        let mut args = vec!["open", "--test-passphrase"];
        args.extend(extra);
        args.push(&v.img);
        sealdisk(&args)
    };
    ok(&open(&["--token-only"]), "--token-only");
    ok(&open(&["--token-only", "--token-id", "0"]), "--token-id 0");
    fails(
        &open(&["--token-only", "--token-id", "1"]),
        2,
        "Token 1 cannot unlock assigned keyslot(s)",
        "wrong key",
    );
    fails(
        &open(&["--token-only", "--token-id", "2"]),
        2,
        "Token 2 cannot unlock assigned keyslot(s)",
        "missing key",
    );
    fails(&open(&["--token-only", "--token-id", "7"]), 1, "No usable token is available.", "no token 7");
    // A failed token falls back to the passphrase unless --token-only.
    ok(&open(&["--token-id", "1", "--key-file", &v.pass]), "fallback");
    // cryptsetup unlocks through the token sealdisk wrote, as sealdisk does.
    if cryptsetup() {
        ok(
            &cs(&["open", "--test-passphrase", "--token-only", "--token-id", "0", &v.img]),
            "cryptsetup token",
        );
        let out = cs(&["open", "--test-passphrase", "--token-only", "--token-id", "1", &v.img]);
        assert_eq!(out.status.code(), Some(2));
    }
    // --token-type (cryptsetup 2.6): only tokens of that type are tried; each case exits
    // as cryptsetup's does on the same image.
    ok(&open(&["--token-only", "--token-type", "luks2-keyring"]), "--token-type luks2-keyring");
    let tpm2 = ["--token-only", "--token-type", "systemd-tpm2"];
    fails(&open(&tpm2), 1, "No usable token (type systemd-tpm2) is available.", "no token of a type");
    if cryptsetup() {
        let mut args = vec!["open", "--test-passphrase"];
        args.extend(tpm2);
        args.push(&v.img);
        assert_eq!(cs(&args).status.code(), Some(1), "cryptsetup --token-type systemd-tpm2");
    }
    // Only tokens whose key is missing: a wrong passphrase (exit 2), also without an id.
    let w = Vol::new(false);
    ok(&sealdisk(&["token", "add", "--key-description", &missing, &w.img]), "token add");
    fn only<'a>(extra: &[&'a str], img: &'a str) -> Vec<&'a str> {
        let mut args = vec!["open", "--test-passphrase", "--token-only"];
        args.extend(extra);
        args.push(img);
        args
    }
    for (extra, msg) in [
        (&[][..], "Token 0 cannot unlock assigned keyslot(s)"),
        (
            &["--token-type", "luks2-keyring"][..],
            "Token (type luks2-keyring) cannot unlock assigned keyslot(s)",
        ),
    ] {
        fails(&sealdisk(&only(extra, &w.img)), 2, msg, &format!("missing key {extra:?}"));
        if cryptsetup() {
            assert_eq!(cs(&only(extra, &w.img)).status.code(), Some(2), "cryptsetup {extra:?}");
        }
    }
}

#[test]
fn open_persistent_stores_the_activation_flags() {
    if !cryptsetup() {
        return;
    }
    let v = Vol::new(false);
    let srv = serve(
        v.dir.path(),
        "vol",
        &[
            "--persistent",
            "--allow-discards",
            "--perf-no_read_workqueue",
            "--key-file",
            &v.pass,
            &v.img,
            "vol",
        ],
        None,
    );
    srv.stop_ok();
    let dump = ok(&cs(&["luksDump", &v.img]), "cryptsetup luksDump");
    assert!(dump.contains("Flags:       \tallow-discards no-read-workqueue \n"), "{dump}");
    v.same_dumps("persistent");
    // The next open takes them from the header (status shows them), and --persistent with
    // no flags clears them.
    let srv = serve(v.dir.path(), "vol", &["--persistent", "--key-file", &v.pass, &v.img, "vol"], None);
    srv.stop_ok();
    let dump = ok(&cs(&["luksDump", &v.img]), "cryptsetup luksDump");
    assert!(dump.contains("Flags:       \t(no flags)\n"), "{dump}");
}

/// `luksDump --dump-volume-key` of `img` with `pass`, by cryptsetup: the key's hex.
fn cs_volume_key(img: &str, pass: &str) -> String {
    let out =
        ok(&cs(&["luksDump", "-q", "--dump-volume-key", "--key-file", pass, img]), "cryptsetup key dump");
    let start = out.find("MK dump:").expect("MK dump");
    out[start + 8..].split_whitespace().collect()
}

#[test]
fn convert_both_ways_as_cryptsetup_does() {
    if !cryptsetup() {
        return;
    }
    // LUKS2 (512-byte sectors, PBKDF2, keyslots 0 and 3) → LUKS1 → LUKS2, by each tool on
    // its own copy: the dumps agree at every step, the other tool opens the result with
    // both passphrases and finds the same volume key.
    let v = Vol::new(true);
    let second = v.file("second", b"second passphrase");
    let img2 = v.dir.path().join("by-cryptsetup.img").to_str().unwrap().to_owned();
    let mut fmt = vec!["luksFormat", "-q", "--type", "luks2", "--sector-size", "512", "--key-file", &v.pass];
    fmt.extend(FAST_PBKDF2);
    fmt.push(&v.img);
    ok(&cs(&fmt), "cryptsetup luksFormat");
    let mut add = vec!["luksAddKey", "-S", "3", "--key-file", &v.pass, &v.img, &second];
    add.extend(FAST_PBKDF2);
    ok(&cs(&add), "cryptsetup luksAddKey");
    let vk = cs_volume_key(&v.img, &v.pass);
    std::fs::copy(&v.img, &img2).unwrap();
    for to in ["luks1", "luks2"] {
        ok(&sealdisk(&["convert", "-q", "--type", to, &v.img]), "sealdisk convert");
        ok(&cs(&["convert", "-q", "--type", to, &img2]), "cryptsetup convert");
        let a = ok(&sealdisk(&["luksDump", &v.img]), "sealdisk dump");
        let b = ok(&cs(&["luksDump", &img2]), "cryptsetup dump").replace(&img2, &v.img);
        assert_eq!(a, b, "after convert --type {to}");
        for p in [&v.pass, &second] {
            ok(&cs(&["open", "--test-passphrase", "--key-file", p, &v.img]), "cryptsetup opens sealdisk's");
            ok(
                &sealdisk(&["open", "--test-passphrase", "--key-file", p, &img2]),
                "sealdisk opens cryptsetup's",
            );
        }
        assert_eq!(cs_volume_key(&v.img, &second), vk, "volume key after convert --type {to}");
    }
    // A sealdisk-made LUKS1 volume (standard layout) becomes LUKS2 that cryptsetup reads.
    let dir = tempfile::tempdir().unwrap();
    let l1 = dir.path().join("l1.img");
    std::fs::File::create(&l1).unwrap().set_len(8 << 20).unwrap();
    let l1 = l1.to_str().unwrap();
    let mut fmt = vec!["luksFormat", "-q", "--type", "luks1", "--key-file", &v.pass];
    fmt.extend(FAST_PBKDF2);
    fmt.push(l1);
    ok(&sealdisk(&fmt), "sealdisk luksFormat luks1");
    let vk = cs_volume_key(l1, &v.pass);
    ok(&sealdisk(&["convert", "-q", "--type", "luks2", l1]), "sealdisk convert luks2");
    assert!(ok(&cs(&["luksDump", l1]), "dump").starts_with("LUKS header information\nVersion:       \t2\n"));
    assert_eq!(cs_volume_key(l1, &v.pass), vk);
    assert_eq!(ok(&sealdisk(&["isLuks", "--type", "luks2", l1]), "isLuks"), "");
}

#[test]
fn convert_refusals_match_cryptsetup() {
    if !cryptsetup() {
        return;
    }
    let v = Vol::new(false);
    let ub = v.file("ub", b"unbound passphrase");
    let dir = v.dir.path();
    // Each image, the setup that makes it unconvertible, the message both tools print.
    let make = |name: &str, fmt_extra: &[&str]| -> String {
        let img = dir.join(name);
        std::fs::File::create(&img).unwrap().set_len(20 << 20).unwrap();
        let img = img.to_str().unwrap().to_owned();
        let mut args = vec!["luksFormat", "-q", "--key-file", &v.pass];
        args.extend(fmt_extra);
        args.push(&img);
        ok(&sealdisk(&args), "luksFormat");
        img
    };
    let pb =
        ["--type", "luks2", "--sector-size", "512", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let argon = make(
        "argon.img",
        &[
            "--type",
            "luks2",
            "--sector-size",
            "512",
            "--pbkdf",
            "argon2id",
            "--pbkdf-force-iterations",
            "4",
            "--pbkdf-memory",
            "32",
        ],
    );
    let sector4k = make(
        "4k.img",
        &[
            "--type",
            "luks2",
            "--sector-size",
            "4096",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ],
    );
    let token = make("token.img", &pb);
    ok(&sealdisk(&["token", "add", "--key-description", "x", &token]), "token add");
    let unbound = make("unbound.img", &pb);
    let mut args = vec!["luksAddKey", "--unbound", "-s", "256", &unbound, &ub];
    args.extend(FAST_PBKDF2);
    ok(&sealdisk(&args), "luksAddKey --unbound");
    let slot9 = make("slot9.img", &pb);
    let mut args = vec!["luksAddKey", "-S", "9", "--key-file", &v.pass, &slot9, &ub];
    args.extend(FAST_PBKDF2);
    ok(&sealdisk(&args), "luksAddKey -S 9");
    let cases = [
        (&argon, "luks1", "Cannot convert to LUKS1 format - keyslot 0 is not LUKS1 compatible."),
        (
            &sector4k,
            "luks1",
            "Cannot convert to LUKS1 format - default segment encryption sector size is not 512 bytes.",
        ),
        (&token, "luks1", "Cannot convert to LUKS1 format - LUKS2 header contains 1 token(s)."),
        (&unbound, "luks1", "Cannot convert to LUKS1 format - key slot digests are not LUKS1 compatible."),
        (&slot9, "luks1", "Cannot convert to LUKS1 format - slot 9 (over maximum slots) is still active."),
        (&argon, "luks2", "Device is already LUKS2 type."),
        (&argon, "luks3", "Invalid LUKS type, only luks1 and luks2 are supported."),
    ];
    for (img, to, msg) in cases {
        let before = std::fs::read(img).unwrap();
        fails(&sealdisk(&["convert", "-q", "--type", to, img]), 1, msg, &format!("sealdisk {img} {to}"));
        assert!(std::fs::read(img).unwrap() == before, "sealdisk convert {img} changed it");
        fails(&cs(&["convert", "-q", "--type", to, img]), 1, msg, &format!("cryptsetup {img} {to}"));
        assert!(std::fs::read(img).unwrap() == before, "cryptsetup convert {img} changed it");
    }
}

#[test]
fn offline_resize_grows_the_image() {
    let v = Vol::new(false);
    let len = |p: &str| std::fs::metadata(p).unwrap().len();
    // 20 MiB, data at 16 MiB: 8192 sectors. Grow to 65536 sectors (32 MiB of data).
    ok(&sealdisk(&["resize", &v.img, "--size", "65536"]), "offline resize");
    assert_eq!(len(&v.img), (16 << 20) + (32 << 20));
    let srv = serve(v.dir.path(), "vol", &["--print-table", "--key-file", &v.pass, &v.img, "vol"], None);
    // The table of the next open spans the new size; the server holds the image locked, so
    // an offline resize meanwhile is refused (exit 5) and changes nothing.
    fails(&sealdisk(&["resize", &v.img, "--size", "131072"]), 5, "in use", "resize while served");
    assert_eq!(len(&v.img), (16 << 20) + (32 << 20));
    let out = srv.stop_ok();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("0 65536 crypt aes-xts-plain64 "), "{table}");
    if cryptsetup() {
        ok(&cs(&["open", "--test-passphrase", "--key-file", &v.pass, &v.img]), "cryptsetup after resize");
    }
    let before = v.bytes();
    for (args, msg) in [
        (vec!["resize", &v.img, "--size", "4096"], "would cut off its data"),
        (vec!["resize", &v.img], "needs --size"),
    ] {
        fails(&sealdisk(&args), 1, msg, &format!("{args:?}"));
        assert!(v.bytes() == before, "{args:?} changed the image");
    }
    // A plain image: the data after --offset.
    let plain = v.file("plain.img", &[]);
    ok(
        &sealdisk(&["resize", "--type", "plain", "--offset", "2048", "--size", "4096", &plain]),
        "plain resize",
    );
    assert_eq!(len(&plain), (2048 + 4096) * 512);
    let out = sealdisk(&["resize", "--type", "plain", "--sector-size", "4096", "--size", "8193", &plain]);
    fails(&out, 1, "Device size is not aligned to requested sector size.", "misaligned");
    assert_eq!(len(&plain), (2048 + 4096) * 512);
}

/// A keyslot whose KDF is named `argon2` (the legacy name, as early LUKS2 writers used):
/// `luksDump` prints it as cryptsetup does, with the Argon2 fields.
#[test]
fn legacy_argon2_kdf_name_dumps_as_cryptsetup() {
    use volume::luks::{Luks, LuksHeader};
    let v = Vol::new(false);
    let dev = blockdev::MemDevice::from_vec(v.bytes(), 512);
    let mut l = Luks::load(&dev, false).unwrap();
    let LuksHeader::V2(s) = &mut l.header else { panic!("LUKS2") };
    let ks = s.header.metadata.keyslots.get_mut(&0).unwrap();
    let obj: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        r#"{"type":"argon2","time":4,"memory":1024,"cpus":2,"salt":"cFk3bJQhY6fqcncwEtjRz6y/5ry9Xsdwa0FLNu8/Hqs="}"#,
    )
    .unwrap();
    ks.kdf = Some(formats::luks2::Kdf::Other(obj));
    let plan = s.header.write_plan(s.header.seqid + 1, &s.salts).unwrap();
    let mut image = v.bytes();
    for step in &plan.steps {
        if let formats::luks2::WriteStep::Write { offset, bytes } = step {
            image[*offset as usize..*offset as usize + bytes.len()].copy_from_slice(bytes);
        }
    }
    std::fs::write(&v.img, &image).unwrap();
    let ours = ok(&sealdisk(&["luksDump", &v.img]), "sealdisk luksDump");
    assert!(
        ours.contains("\tPBKDF:      argon2\n\tTime cost:  4\n\tMemory:     1024\n\tThreads:    2\n\tSalt:       70 59 37 6c"),
        "{ours}"
    );
    if cryptsetup() {
        let theirs = cs(&["luksDump", &v.img]);
        if theirs.status.success() {
            assert_eq!(ours, String::from_utf8_lossy(&theirs.stdout));
        } else {
            eprintln!("cryptsetup refuses the legacy name: {}", String::from_utf8_lossy(&theirs.stderr));
        }
    }
}

/// A token unlocks through the keyslots it names only (cryptsetup 2.6.1's
/// `LUKS2_keyslot_open_by_token`): a passphrase that opens another keyslot fails as a wrong
/// one (exit 2); a token with no keyslot is unusable (exit 1); without `--token-id` the
/// token's `ignore`-priority keyslots are skipped, with it they are tried. Each case exits as
/// cryptsetup's does on the same image.
#[test]
fn token_unlock_tries_only_the_tokens_keyslots() {
    let v = Vol::new(false);
    let tag = std::process::id();
    let second = format!("sd-test:{tag}:second");
    if keyring_add(&second, b"second passphrase").is_none() {
        eprintln!("SKIPPED: the kernel keyring is not usable here (keyctl add_key failed)");
        return;
    }
    let p2 = v.file("pass2", b"second passphrase");
    let mut args = vec!["luksAddKey", "-q", "--key-file", &v.pass, "--key-slot", "1"];
    args.extend(FAST_PBKDF2);
    args.extend([v.img.as_str(), p2.as_str()]);
    ok(&sealdisk(&args), "luksAddKey slot 1");
    // Token 0: the second passphrase, but assigned to keyslot 0 (the first passphrase's).
    ok(&sealdisk(&["token", "add", "--key-description", &second, "--key-slot", "0", &v.img]), "token 0");
    let only = |extra: &[&str]| {
        let mut a = vec!["open", "--test-passphrase", "--token-only"];
        a.extend_from_slice(extra);
        a.push(&v.img);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let both = |extra: &[&str], code: i32, msg: &str, what: &str| {
        let args = only(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if code == 0 {
            ok(&sealdisk(&args), what);
        } else {
            fails(&sealdisk(&args), code, msg, what);
        }
        if cryptsetup() {
            assert_eq!(cs(&args).status.code(), Some(code), "cryptsetup {what}");
        }
    };
    both(&[], 2, "Token 0 cannot unlock assigned keyslot(s)", "token 0 on keyslot 0");
    both(&["--token-id", "0"], 2, "Token 0 cannot unlock assigned keyslot(s)", "--token-id 0");
    // Falls back to the passphrase without --token-only.
    ok(
        &sealdisk(&["open", "--test-passphrase", "--key-file", &v.pass, "--token-id", "0", &v.img]),
        "fallback",
    );
    // Token 1: the same key on keyslot 1: it unlocks.
    ok(&sealdisk(&["token", "add", "--key-description", &second, "--key-slot", "1", &v.img]), "token 1");
    both(&["--token-id", "1"], 0, "", "--token-id 1");
    both(&[], 0, "", "any token");
    // Keyslot 1 `ignore`: tokens skip it unless asked for by id.
    ok(&sealdisk(&["config", "--priority", "ignore", "--key-slot", "1", &v.img]), "priority ignore");
    both(&[], 2, "Token 0 cannot unlock assigned keyslot(s)", "ignore skipped");
    both(&["--token-id", "1"], 0, "", "ignore tried with --token-id");
    // A token naming no keyslot is never usable.
    ok(&sealdisk(&["token", "remove", "--token-id", "0", &v.img]), "remove 0");
    ok(&sealdisk(&["token", "remove", "--token-id", "1", &v.img]), "remove 1");
    let json = format!(r#"{{"type":"luks2-keyring","keyslots":[],"key_description":"{second}"}}"#);
    let f = v.file("t.json", json.as_bytes());
    ok(&sealdisk(&["token", "import", "--json-file", &f, "--token-id", "3", &v.img]), "import");
    both(&["--token-id", "3"], 1, "No usable token is available.", "no keyslot");
    both(&[], 1, "No usable token is available.", "no keyslot, any token");
}
