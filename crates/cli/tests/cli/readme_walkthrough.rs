//! The book's "A LUKS2 volume's life" block (docs/book/src/keyslots-tokens.md, the
//! walkthrough the README links to), run as written: each `sealdisk` line is run
//! (with the test's binary, its own runtime directory and socket path, and cheap KDF
//! options added to the commands that make keyslots), `keyctl padd` is done with the same
//! add_key call, and a comment after `sealdisk status` is text the status must show.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{bin, runtime_dir, FAST_PBKDF2};

fn block() -> Vec<String> {
    let chapter = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/book/src/keyslots-tokens.md");
    let text = std::fs::read_to_string(&chapter).unwrap();
    let sec = text.split("# A LUKS2 volume's life").nth(1).expect("the walkthrough section");
    let code = sec.split("```sh\n").nth(1).unwrap().split("```").next().unwrap();
    code.lines().map(str::to_owned).collect()
}

fn keyring_add(desc: &str, payload: &[u8]) -> Option<()> {
    use linux_keyutils::{KeyRing, KeyRingIdentifier};
    let ring = KeyRing::from_special_id(KeyRingIdentifier::Session, true).ok()?;
    ring.add_key(desc, payload).ok()?;
    Some(())
}

#[test]
fn the_lifecycle_walkthrough_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("pass"), "walkthrough passphrase").unwrap();
    let sock = d.join("vol.sock");
    let mut servers = Vec::new();
    for line in block() {
        let (cmd, comment) = match line.split_once(" #") {
            Some((c, k)) => (c.trim().to_owned(), Some(k.trim().to_owned())),
            None => (line.trim().to_owned(), None),
        };
        if cmd.is_empty() || cmd.starts_with('#') {
            continue;
        }
        let words: Vec<String> =
            cmd.split_whitespace().map(|w| w.replace("/tmp/vol.sock", sock.to_str().unwrap())).collect();
        match words[0].as_str() {
            "truncate" => {
                assert_eq!(words[1], "-s");
                let size = words[2].trim_end_matches('M').parse::<u64>().unwrap() << 20;
                std::fs::File::create(d.join(&words[3])).unwrap().set_len(size).unwrap();
            }
            "keyctl" => {
                // keyctl padd user DESC @s < FILE
                assert_eq!(&words[1..3], ["padd", "user"]);
                let payload = std::fs::read(d.join(&words[words.len() - 1])).unwrap();
                if keyring_add(&words[3], &payload).is_none() {
                    eprintln!("SKIPPED: the kernel keyring is not usable here (keyctl add_key failed)");
                    return;
                }
            }
            "sealdisk" => {
                let mut args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
                if matches!(args[0], "luksFormat" | "reencrypt") {
                    let at = args.len() - 1;
                    for (i, a) in FAST_PBKDF2.iter().enumerate() {
                        args.insert(at + i, a);
                    }
                }
                let daemon = args.contains(&"--daemon");
                let out = Command::new(bin())
                    .args(&args)
                    .current_dir(d)
                    .env("SEALDISK_RUNTIME_DIR", runtime_dir(d))
                    .stdin(Stdio::null())
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                assert!(
                    out.status.success(),
                    "walkthrough line `{line}` failed ({}): {text}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
                if daemon {
                    servers.push(());
                }
                if args[0] == "status" {
                    if let Some(want) = comment {
                        assert!(text.contains(&want), "line `{line}`: status lacks {want:?}:\n{text}");
                    }
                }
            }
            other => panic!("walkthrough line with an unknown command {other:?}: {line}"),
        }
    }
    assert!(!servers.is_empty());
}
