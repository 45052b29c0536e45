//! Where users and scripts lean on cryptsetup's behaviour (issue 17): exit codes of
//! command-line errors, `open` defaulting to LUKS and naming what it found instead, the
//! storage lock (one writer per image), cheap checks before a slow key derivation,
//! `--tries` on the terminal, AES-192-XTS refused for LUKS, and a silent `isLuks`.

use crate::common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{bin, pattern, run, serve, sha_hex, FAST_PBKDF2};

fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// Large enough for LUKS2's default 16 MiB data offset (sparse).
const LUKS2_IMAGE: u64 = 20 << 20;

/// A zeroed image of `len` bytes and a passphrase file, in a fresh directory.
fn setup(len: u64) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(len).unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"correct horse").unwrap();
    let (img, pass) = (s(&img), s(&pass));
    (dir, img, pass)
}

fn luks_format(img: &str, pass: &str, extra: &[&str]) {
    let mut args = vec!["luksFormat", "-q", "--key-file", pass];
    args.extend_from_slice(FAST_PBKDF2);
    args.extend_from_slice(extra);
    args.push(img);
    let o = run(&args);
    assert!(o.status.success(), "luksFormat: {}", stderr(&o));
}

/// Runs a command that must be refused: bounded, so that one that serves instead (the bug)
/// fails the test rather than hanging it.
fn refused(args: &[&str]) -> Output {
    let (o, in_time) = run_within(args, Duration::from_secs(30));
    assert!(in_time, "{args:?} was not refused (still running after 30 s)");
    o
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn file_sha(path: &str) -> String {
    sha_hex(&std::fs::read(path).unwrap())
}

/// cryptsetup exits 1 for every command-line error; clap's default (2) is the code for a
/// wrong passphrase here. Help and version exit 0.
#[test]
fn command_line_errors_exit_1_and_help_exits_0() {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["open", "--key-fil", "k", "disk", "vol"], 1, "--key-fil"),
        (&["open"], 1, "required"),
        (&["open", "--key-size", "abc", "disk", "vol"], 1, "abc"),
        (&["open", "--crypt-mode", "sideways", "disk", "vol"], 1, "sideways"),
        (&["luksFormat", "--sector-size", "4k", "disk"], 1, "4k"),
        (&["luksKillSlot", "disk"], 1, "required"),
        (&["frobnicate"], 1, "frobnicate"),
        (&[], 1, "Usage"),
        (&["--help"], 0, "Usage"),
        (&["--version"], 0, "sealdisk"),
        (&["open", "--help"], 0, "DEVICE NAME"),
        (&["isLuks", "--help"], 0, "Usage"),
    ];
    for (args, want, needle) in cases {
        let o = run(args);
        let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
        assert_eq!(code(&o), Some(*want), "{args:?}: {all}");
        assert!(all.contains(needle), "{args:?} does not mention {needle:?}: {all}");
    }
    // `open --help` no longer says NAME is for plain mode only, and shows the new options.
    let help = String::from_utf8_lossy(&run(&["open", "--help"]).stdout).into_owned();
    assert!(!help.contains("for plain mode"), "{help}");
    for flag in ["--tries", "--shared", "--type"] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
}

/// `open` without `--type` is LUKS, as in cryptsetup: a missing file, a dm-integrity
/// image and an image without a header are each named, and nothing is written.
#[test]
fn open_defaults_to_luks_and_names_what_it_finds() {
    let (dir, img, pass) = setup(4 << 20);
    std::fs::write(&img, pattern(4 << 20, 7)).unwrap();
    let listen = format!("unix:{}/v.sock", dir.path().display());
    let before = file_sha(&img);

    let o = refused(&["open", "--key-file", &pass, "/nonexistent/disk", "v", "--listen", &listen]);
    assert_eq!(code(&o), Some(4), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("Device /nonexistent/disk does not exist or access denied."),
        "{}",
        stderr(&o)
    );

    let o = refused(&["open", "--key-file", &pass, &img, "v", "--listen", &listen]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("Device {img} is not a valid LUKS device.")), "{}", stderr(&o));
    assert!(stderr(&o).contains("--type plain"), "no hint for plain mode: {}", stderr(&o));
    let o = refused(&["open", "--test-passphrase", "--key-file", &pass, &img]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert_eq!(file_sha(&img), before, "a refused open changed the image");
    assert!(!dir.path().join("v.sock").exists());

    // The same image opens as plain only when asked.
    let key = dir.path().join("key");
    std::fs::write(&key, pattern(64, 1)).unwrap();
    let plain = ["--type", "plain", "--cipher", "aes-xts-plain64", "--key-size", "512", "--key-file"];
    let mut args = plain.to_vec();
    args.extend([key.to_str().unwrap(), &img, "p"]);
    serve(dir.path(), "p", &args, None).stop_ok();

    let integ = dir.path().join("integ.img");
    std::fs::File::create(&integ).unwrap().set_len(4 << 20).unwrap();
    let integ = s(&integ);
    let o = run(&["integrity", "format", "-q", "--no-wipe", "--no-progress", &integ]);
    assert!(o.status.success(), "integrity format: {}", stderr(&o));
    let before = file_sha(&integ);
    let o = refused(&["open", "--key-file", &pass, &integ, "v", "--listen", &listen]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("dm-integrity"), "{}", stderr(&o));
    assert!(stderr(&o).contains("sealdisk integrity open"), "{}", stderr(&o));
    assert_eq!(file_sha(&integ), before, "a refused open changed the integrity image");
}

/// Like device-mapper, one image is never mapped twice for writing: a second writable
/// server, and header writes while one serves, are refused with "in use" (exit 5) and
/// write nothing; `--readonly` openers share; plain `--shared` openers share.
#[test]
fn a_second_writer_of_one_image_is_refused() {
    let (dir, img, pass) = setup(LUKS2_IMAGE);
    luks_format(&img, &pass, &[]);
    let first = serve(dir.path(), "a", &["--key-file", &pass, &img, "a"], None);
    let before = file_sha(&img);
    let listen_b = format!("unix:{}/b.sock", dir.path().display());
    let must_refuse: &[&[&str]] = &[
        &["open", "--key-file", &pass, &img, "b", "--listen", &listen_b],
        &["open", "--readonly", "--key-file", &pass, &img, "b", "--listen", &listen_b],
        &["open", "--test-passphrase", "--key-file", &pass, &img],
        &["luksAddKey", "--key-file", &pass, &img, &pass],
        &["luksUUID", "--uuid", "01234567-89ab-cdef-0123-456789abcdef", &img],
        &["erase", "-q", &img],
        &["luksFormat", "-q", "--key-file", &pass, &img],
    ];
    for args in must_refuse {
        let o = refused(args);
        assert_eq!(code(&o), Some(5), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("in use"), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(&img), "{args:?} does not name the device: {}", stderr(&o));
    }
    assert!(!dir.path().join("b.sock").exists());
    // Reading the header is still allowed, as with cryptsetup.
    assert!(run(&["luksDump", &img]).status.success());
    assert!(run(&["isLuks", &img]).status.success());
    first.stop_ok();
    assert_eq!(file_sha(&img), before, "a refused command changed the image");

    let ro1 = serve(dir.path(), "r1", &["--readonly", "--key-file", &pass, &img, "r1"], None);
    let ro2 = serve(dir.path(), "r2", &["--readonly", "--key-file", &pass, &img, "r2"], None);
    let o = refused(&["open", "--key-file", &pass, &img, "b", "--listen", &listen_b]);
    assert_eq!(code(&o), Some(5), "a writer next to readers: {}", stderr(&o));
    ro1.stop_ok();
    ro2.stop_ok();

    let o = refused(&["open", "--shared", "--key-file", &pass, &img, "b", "--listen", &listen_b]);
    assert_eq!(code(&o), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("Option --shared is allowed only for open of plain device."),
        "{}",
        stderr(&o)
    );

    let key = dir.path().join("key");
    std::fs::write(&key, pattern(64, 2)).unwrap();
    let k = s(&key);
    let plain = |offset: &'static str, name: &'static str, shared: bool| {
        let mut v = vec!["--type", "plain", "--cipher", "aes-xts-plain64", "--key-size", "512", "--key-file"];
        v.extend([k.as_str(), "--offset", offset, "--size", "4096"]);
        if shared {
            v.push("--shared");
        }
        v.extend([img.as_str(), name]);
        v.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let a1 = plain("0", "s1", true);
    let a2 = plain("4096", "s2", true);
    let s1 = serve(dir.path(), "s1", &strs(&a1), None);
    let s2 = serve(dir.path(), "s2", &strs(&a2), None);
    let mut excl = vec!["open".to_string()];
    excl.extend(plain("8192", "x", false));
    excl.extend(["--listen".to_string(), listen_b.clone()]);
    let o = refused(&strs(&excl));
    assert_eq!(code(&o), Some(5), "an exclusive plain open next to shared ones: {}", stderr(&o));
    s1.stop_ok();
    s2.stop_ok();
}

/// dm-integrity volumes take the same lock: no second server and no format while one serves.
#[test]
fn integrity_volumes_are_locked_too() {
    let (dir, img, _) = setup(4 << 20);
    let o = run(&["integrity", "format", "-q", "--no-wipe", "--no-progress", &img]);
    assert!(o.status.success(), "integrity format: {}", stderr(&o));
    let sock = dir.path().join("i.sock");
    let child = Command::new(bin())
        .args(["integrity", "open", &img, "i", "--listen", &format!("unix:{}", sock.display())])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child = common::wait_for_socket(child, &sock);
    let served = common::Served { child: Some(child), sock, name: "i".into() };
    let before = file_sha(&img);
    let o = refused(&["integrity", "format", "-q", "--no-wipe", "--no-progress", &img]);
    assert_eq!(code(&o), Some(5), "format while served: {}", stderr(&o));
    let o =
        run(&["integrity", "open", &img, "j", "--listen", &format!("unix:{}/j.sock", dir.path().display())]);
    assert_eq!(code(&o), Some(5), "second integrity server: {}", stderr(&o));
    assert!(stderr(&o).contains("in use"), "{}", stderr(&o));
    served.stop_ok();
    assert_eq!(file_sha(&img), before);
}

/// Offset of keyslot 0's PBKDF2 iteration count in a LUKS1 header.
const LUKS1_SLOT0_ITERATIONS: usize = 212;

/// Runs `sealdisk ARGS`, killing it if it takes longer than `limit`; returns its output and
/// whether it finished in time.
fn run_within(args: &[&str], limit: Duration) -> (Output, bool) {
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut in_time = true;
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            in_time = false;
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (child.wait_with_output().unwrap(), in_time)
}

/// Cheap mistakes are reported before the key derivation, not after it: the header here
/// asks for 100 million PBKDF2 iterations (tens of seconds), and every refusal must come
/// within a few seconds.
#[test]
fn cheap_errors_come_before_a_slow_kdf() {
    let (dir, img, pass) = setup(4 << 20);
    let o = run(&[
        "luksFormat",
        "-q",
        "--type",
        "luks1",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &pass,
        &img,
    ]);
    assert!(o.status.success(), "luksFormat: {}", stderr(&o));
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[LUKS1_SLOT0_ITERATIONS..LUKS1_SLOT0_ITERATIONS + 4].copy_from_slice(&100_000_000u32.to_be_bytes());
    std::fs::write(&img, &bytes).unwrap();

    // A socket some other server holds.
    let key = dir.path().join("key");
    std::fs::write(&key, pattern(64, 3)).unwrap();
    let other = dir.path().join("other.img");
    std::fs::File::create(&other).unwrap().set_len(1 << 20).unwrap();
    let plain = ["--type", "plain", "--cipher", "aes-xts-plain64", "--key-size", "512", "--key-file"];
    let mut args = plain.to_vec();
    args.extend([key.to_str().unwrap(), other.to_str().unwrap(), "busy"]);
    let busy = serve(dir.path(), "busy", &args, None);
    let busy_listen = format!("unix:{}", busy.sock.display());
    let sock = format!("unix:{}/v.sock", dir.path().display());

    let base = ["open", "--key-file", pass.as_str(), img.as_str(), "v"];
    // (extra options, exit code if it is cryptsetup's, what the message names)
    let cases: Vec<(Vec<&str>, Option<i32>, &str)> = vec![
        (vec![], Some(1), "--listen"),
        (vec!["--listen", "bogus:here"], Some(1), "bogus"),
        (vec!["--listen", &busy_listen], Some(5), "locked by another server"),
        (vec!["--listen", &sock, "--tls=require", "--tls-psk", "/nonexistent/keys.psk"], None, "keys.psk"),
        (vec!["--listen", &sock, "--tls-verify-peer"], Some(1), "--tls-verify-peer"),
        (vec!["--listen", &sock, "--tls=on"], Some(1), "--tls-certificates"),
        (vec!["--listen", "tcp:192.0.2.1:10809"], Some(1), "--insecure-listen"),
    ];
    for (extra, want, needle) in cases {
        let mut a = base.to_vec();
        a.extend(extra);
        let (o, in_time) = run_within(&a, Duration::from_secs(5));
        assert!(in_time, "{a:?} ran the key derivation before refusing");
        assert!(!o.status.success(), "{a:?} succeeded");
        if want.is_some() {
            assert_eq!(code(&o), want, "{a:?}: {}", stderr(&o));
        }
        assert!(stderr(&o).contains(needle), "{a:?} does not mention {needle:?}: {}", stderr(&o));
    }
    busy.stop_ok();
}

/// Types `answers` at `sealdisk ARGS`' terminal prompts (through a pseudo-terminal driven
/// by python3's `pty`); returns the exit code and everything the terminal showed.
fn on_a_terminal(args: &[&str], answers: &[&str]) -> Option<(i32, String)> {
    const DRIVER: &str = r#"
import os, pty, select, signal, sys
sep = sys.argv.index("--")
argv, answers = sys.argv[1:sep], sys.argv[sep + 1:]
pid, fd = pty.fork()
if pid == 0:
    os.execv(argv[0], argv)
seen = b""
def read_some(timeout):
    global seen
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return False
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        return False
    seen += chunk
    return bool(chunk)
for i, answer in enumerate(answers):
    while seen.count(b"Enter passphrase") <= i and read_some(60):
        pass
    if seen.count(b"Enter passphrase") <= i:
        break
    os.write(fd, answer.encode() + b"\n")
while read_some(60):
    pass
done, status = os.waitpid(pid, os.WNOHANG)
if done == 0:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
sys.stdout.write(seen.decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
"#;
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(DRIVER).arg(bin()).args(args).arg("--").args(answers);
    let out = match cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
        Ok(mut c) => {
            let mut text = String::new();
            c.stdout.take().unwrap().read_to_string(&mut text).unwrap();
            let status = c.wait().unwrap();
            (status.code().unwrap_or(-1), text)
        }
        Err(e) => {
            eprintln!("SKIPPED: python3 is not available ({e}); --tries is not tested through a terminal");
            return None;
        }
    };
    Some(out)
}

/// `--tries` (default 3): a wrong passphrase typed on the terminal is asked for again; a
/// key file gets one try.
#[test]
fn wrong_passphrases_on_a_terminal_are_asked_again() {
    let (_dir, img, pass) = setup(LUKS2_IMAGE);
    luks_format(&img, &pass, &[]);
    let test = ["open", "--test-passphrase", img.as_str()];
    let Some((code2, shown)) = on_a_terminal(&test, &["wrong", "also wrong", "correct horse"]) else {
        return;
    };
    assert_eq!(code2, 0, "third try should open: {shown}");
    assert_eq!(shown.matches("Enter passphrase").count(), 3, "{shown}");
    assert_eq!(shown.matches("No key available with this passphrase.").count(), 2, "{shown}");

    let (c, shown) = on_a_terminal(&test, &["wrong", "wrong", "wrong", "correct horse"]).unwrap();
    assert_eq!(c, 2, "three wrong tries must fail: {shown}");
    assert_eq!(shown.matches("Enter passphrase").count(), 3, "{shown}");

    let mut one = test.to_vec();
    one.insert(1, "--tries=1");
    let (c, shown) = on_a_terminal(&one, &["wrong", "correct horse"]).unwrap();
    assert_eq!(c, 2, "--tries 1: {shown}");
    assert_eq!(shown.matches("Enter passphrase").count(), 1, "{shown}");

    // A key file is read once, whatever --tries says.
    let wrong = std::path::Path::new(&pass).with_file_name("wrong");
    std::fs::write(&wrong, b"nope").unwrap();
    let o = run(&["open", "--test-passphrase", "--tries", "5", "--key-file", wrong.to_str().unwrap(), &img]);
    assert_eq!(code(&o), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o).matches("No key available").count(), 1, "{}", stderr(&o));
}

/// cryptsetup cannot encrypt keyslots with AES-192-XTS ("Cannot use aes-xts-plain64
/// cipher for keyslot encryption."): `luksFormat --key-size 384` is refused for LUKS1 and
/// LUKS2 before anything is written, while plain mode keeps AES-192-XTS.
#[test]
fn luks_refuses_a_384_bit_xts_key_and_plain_keeps_it() {
    let (dir, img, pass) = setup(LUKS2_IMAGE);
    for kind in ["luks2", "luks1"] {
        let mut args = vec!["luksFormat", "-q", "--type", kind, "--key-size", "384", "--key-file", &pass];
        args.extend_from_slice(FAST_PBKDF2);
        args.push(&img);
        let o = run(&args);
        assert_eq!(code(&o), Some(1), "{kind}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("Cannot use aes-xts-plain64 cipher for keyslot encryption."),
            "{kind}: {}",
            stderr(&o)
        );
        assert!(std::fs::read(&img).unwrap().iter().all(|&b| b == 0), "{kind}: the refused format wrote");
    }
    luks_format(&img, &pass, &["--key-size", "256"]);
    let key = dir.path().join("key48");
    std::fs::write(&key, pattern(48, 4)).unwrap();
    let args = [
        "--type",
        "plain",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "384",
        "--key-file",
        key.to_str().unwrap(),
        &img,
        "p",
    ];
    serve(dir.path(), "p", &args, None).stop_ok();
}

/// `isLuks` is silent on failure (exit 1), as cryptsetup; -v says why. A missing device is
/// still reported (exit 4).
#[test]
fn is_luks_is_silent_unless_verbose() {
    let (_dir, img, pass) = setup(LUKS2_IMAGE);
    let o = run(&["isLuks", &img]);
    assert_eq!(code(&o), Some(1));
    assert!(o.stdout.is_empty() && o.stderr.is_empty(), "isLuks printed: {}", stderr(&o));
    let o = run(&["isLuks", "--type", "luks2", &img]);
    assert_eq!(code(&o), Some(1));
    assert!(o.stderr.is_empty(), "isLuks --type printed: {}", stderr(&o));
    let o = run(&["-v", "isLuks", &img]);
    assert_eq!(code(&o), Some(1));
    assert!(stderr(&o).contains("not a valid LUKS device"), "{}", stderr(&o));
    let o = run(&["isLuks", "/nonexistent/disk"]);
    assert_eq!(code(&o), Some(4));
    assert!(
        stderr(&o).contains("Device /nonexistent/disk does not exist or access denied."),
        "{}",
        stderr(&o)
    );
    luks_format(&img, &pass, &[]);
    let o = run(&["isLuks", &img]);
    assert_eq!(code(&o), Some(0), "{}", stderr(&o));
    let o = run(&["isLuks", "--type", "luks1", &img]);
    assert_eq!(code(&o), Some(1));
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
}

/// `luksFormat --luks2-keyslots-size / --luks2-metadata-size / --offset`: the same exit code
/// and the same warnings on stdout as cryptsetup ("keyslots area … is very small"), and
/// cryptsetup's refusal of a keyslots area it would have to round ("Unsupported LUKS2
/// metadata size options.").
#[test]
fn luks2_metadata_size_options_warn_and_refuse_as_cryptsetup() {
    if !common::have("cryptsetup") {
        eprintln!("SKIPPED: cryptsetup is not installed");
        return;
    }
    let (_dir, img, pass) = setup(LUKS2_IMAGE);
    for opts in [
        &["--luks2-keyslots-size", "1M"][..],
        &["--luks2-keyslots-size", "100000"],
        &["--luks2-keyslots-size", "200M"],
        &["--luks2-keyslots-size", "4M"],
        &["--luks2-metadata-size", "64k", "--luks2-keyslots-size", "2M"],
        &["--luks2-metadata-size", "20k"],
        &["--offset", "4096"],
        &[],
    ] {
        let mut args = vec!["luksFormat", "--type", "luks2", "--batch-mode", "--key-file", &pass];
        args.extend(FAST_PBKDF2);
        args.extend(opts);
        args.push(&img);
        let ours = run(&args);
        let theirs = Command::new("cryptsetup").args(&args[..]).stdin(Stdio::null()).output().unwrap();
        assert_eq!(code(&ours), code(&theirs), "{opts:?}: {} / {}", stderr(&ours), stderr(&theirs));
        let warnings = |o: &Output| -> Vec<String> {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("WARNING"))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(warnings(&ours), warnings(&theirs), "{opts:?}");
        if !theirs.status.success() {
            let words = "Unsupported LUKS2 metadata size options.";
            assert!(
                stderr(&theirs).contains(words) && stderr(&ours).contains(words),
                "{opts:?}: {}",
                stderr(&ours)
            );
        }
    }
}
