//! sealdisk-formatted LUKS1 and LUKS2 volumes with every hash Debian's cryptsetup accepts
//! (PBKDF2 keyslot, AF splitter and volume-key digest all use it) pass host
//! `cryptsetup open --test-passphrase` and `luksDump --dump-volume-key`, which must give the
//! key sealdisk was handed; hashes cryptsetup refuses are refused by name, as cryptsetup
//! does. Skips loudly without cryptsetup.

use crate::common;

use std::process::{Command, Stdio};

use common::{have, run as sealdisk, FAST_PBKDF2};

const HASHES: &[&str] = &[
    "sha1",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "sha512-224",
    "sha512-256",
    "sha3-224",
    "sha3-256",
    "sha3-384",
    "sha3-512",
    "ripemd160",
    "whirlpool",
    "sm3",
    "blake2b-512",
    "blake2s-256",
    "md5",
    "md4",
];

#[test]
fn sealdisk_made_volumes_with_every_hash_pass_cryptsetup() {
    if !have("cryptsetup") {
        eprintln!("SKIPPED: cryptsetup is not installed (apt-get install cryptsetup-bin)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"hash interop").unwrap();
    let vk = dir.path().join("vk");
    let key: Vec<u8> = (0..32u8).collect();
    std::fs::write(&vk, &key).unwrap();
    for &h in HASHES {
        let short = matches!(h, "md5" | "md4");
        for version in ["luks1", "luks2"] {
            let img = dir.path().join(format!("{version}-{h}.img"));
            std::fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
            let mut args = vec!["luksFormat", "-q", "--type", version, "--hash", h];
            if version == "luks2" {
                // Small: 1 MiB of keyslots, data at 2 MiB.
                args.extend(["--luks2-keyslots-size", "1m", "--offset", "4096"]);
            }
            args.extend(["--cipher", "aes-xts-plain64", "--key-size", "256"]);
            args.extend(["--volume-key-file", vk.to_str().unwrap()]);
            args.extend_from_slice(FAST_PBKDF2);
            args.extend(["--key-file", pass.to_str().unwrap(), img.to_str().unwrap()]);
            let out = sealdisk(&args);
            if version == "luks1" && short {
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(!out.status.success() && err.contains(h), "{version} {h}: {err}");
                continue;
            }
            assert!(out.status.success(), "{version} {h}: {}", String::from_utf8_lossy(&out.stderr));
            let cs = |a: &[&str]| {
                Command::new("cryptsetup").args(a).stdin(Stdio::null()).output().expect("run cryptsetup")
            };
            let (p, i) = (pass.to_str().unwrap(), img.to_str().unwrap());
            let o = cs(&["open", "--test-passphrase", "--key-file", p, i]);
            assert!(o.status.success(), "{version} {h}: {}", String::from_utf8_lossy(&o.stderr));
            let o = cs(&["luksDump", "--dump-volume-key", "--batch-mode", "--key-file", p, i]);
            assert!(o.status.success(), "{version} {h}: {}", String::from_utf8_lossy(&o.stderr));
            let dump = String::from_utf8_lossy(&o.stdout);
            let hexs: String =
                dump.split("MK dump:").nth(1).unwrap().chars().filter(char::is_ascii_hexdigit).collect();
            assert_eq!(hex::decode(hexs).unwrap(), key, "{version} {h}: volume key");
            let o = cs(&["luksDump", i]);
            assert!(
                String::from_utf8_lossy(&o.stdout).to_lowercase().contains(h),
                "{version} {h}: hash not in dump"
            );
        }
    }
    // What cryptsetup refuses ("Requested hash ... is not supported."), sealdisk refuses too.
    for bad in ["shake256", "crc32", "sha256x"] {
        let img = dir.path().join("bad.img");
        std::fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
        let mut args = vec!["luksFormat", "-q", "--hash", bad];
        args.extend_from_slice(FAST_PBKDF2);
        args.extend(["--key-file", pass.to_str().unwrap(), img.to_str().unwrap()]);
        let out = sealdisk(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(bad), "{bad}: {err}");
    }
}
