//! The first hour with sealdisk (issue 17): progress of long wipes, an interrupted
//! `luksFormat --integrity` wipe and `luksResumeWipe`, shell completions and the man page,
//! and integritysetup's behaviour for `integrity format` (options, confirmation, a wrong
//! `-I` or key named as the likely cause).

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use blockdev::{BlockDevice, WriteFlags};
use common::{bin, pattern, run, FAST_PBKDF2};
use sector_crypto::kdf::Passphrase;
use volume::luks::OpenParams;

const PASS: &[u8] = b"first hour";

fn sparse(dir: &Path, name: &str, size: u64) -> String {
    let img = dir.join(name);
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    img.to_str().unwrap().to_owned()
}

fn pass_file(dir: &Path) -> String {
    let p = dir.join("pass");
    std::fs::write(&p, PASS).unwrap();
    p.to_str().unwrap().to_owned()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether `tool` runs at all (`-n` checks need only that).
fn have_shell(tool: &str) -> bool {
    let ok =
        Command::new(tool).arg("-c").arg("true").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if !ok {
        eprintln!("SKIPPED PART: {tool} is not installed");
    }
    ok
}

#[test]
fn completions_name_every_command_and_parse_in_their_shell() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        for name in ["luksFormat", "luksResumeWipe", "integrity", "open", "completions", "man"] {
            assert!(script.contains(name), "{shell} completions lack {name}");
        }
        let file = dir.path().join(format!("sealdisk.{shell}"));
        std::fs::write(&file, &script).unwrap();
        if have_shell(shell) {
            let check = Command::new(shell).arg("-n").arg(&file).output().unwrap();
            assert!(check.status.success(), "{shell} -n: {}", text(&check.stderr));
        }
    }
    assert!(!run(&["completions", "tcsh"]).status.success());
}

#[test]
fn the_man_page_renders_and_one_page_per_command_is_written() {
    let out = run(&["man"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(page.contains(".TH sealdisk"), "{page}");
    assert!(page.contains("luksFormat") && page.contains("integrity"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("sealdisk.1");
    std::fs::write(&main, &page).unwrap();
    if Command::new("groff").arg("--version").stdout(Stdio::null()).status().is_ok() {
        // Plain text (no overstriking or escapes), every warning on.
        let r = Command::new("groff").args(["-man", "-Tutf8", "-ww", "-P-cbu"]).arg(&main).output().unwrap();
        assert!(r.status.success(), "groff: {}", text(&r.stderr));
        assert!(text(&r.stdout).contains("SYNOPSIS"), "{}", text(&r.stdout));
    } else {
        eprintln!("SKIPPED PART: groff is not installed (apt-get install groff-base)");
    }
    let pages = dir.path().join("pages");
    let out = run(&["man", "--out-dir", pages.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for p in
        ["sealdisk.1", "sealdisk-luksFormat.1", "sealdisk-luksResumeWipe.1", "sealdisk-integrity-format.1"]
    {
        let body = std::fs::read_to_string(pages.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(body.contains(".TH"), "{p}");
    }
}

#[test]
fn integrity_format_help_lists_only_format_options_and_runs_without_a_terminal() {
    let help = text(&run(&["integrity", "format", "--help"]).stdout);
    for open_only in
        ["--journal-watermark", "--journal-commit-time", "--allow-discards", "--integrity-recovery-mode"]
    {
        assert!(!help.contains(open_only), "format --help lists {open_only}:\n{help}");
    }
    for opt in ["--sector-size", "--interleave-sectors", "--integrity", "--progress-frequency"] {
        assert!(help.contains(opt), "format --help lacks {opt}");
    }
    let help = text(&run(&["integrity", "open", "--help"]).stdout);
    assert!(help.contains("--journal-watermark") && !help.contains("--interleave-sectors"), "{help}");

    // Without -q and with stdin not a terminal, integritysetup formats (no question asked).
    let dir = tempfile::tempdir().unwrap();
    let img = sparse(dir.path(), "i.img", 8 << 20);
    let out = run(&["integrity", "format", "--progress-frequency", "0", &img]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(!err.contains("Are you sure"), "{err}");
    assert!(err.contains("Progress: 100.0%") && err.contains("MiB/s"), "{err}");
    assert!(text(&run(&["integrity", "dump", &img]).stdout).contains("tag_size 4"));
}

/// Writes through the journal and leaves it unreplayed (as a crash would), so that the next
/// open replays it with whatever -I it is given.
fn leave_journal(img: &str, p: &volume::integrity::IntegrityParams) {
    let t = volume::integrity::open(img, p).unwrap();
    t.write_at(8192, &pattern(64 << 10, 3), WriteFlags::FUA).unwrap();
    std::sync::Arc::into_inner(t).unwrap().abandon();
}

fn integrity_open_err(dir: &Path, img: &str, extra: &[&str]) -> String {
    let sock = dir.join("i.sock");
    let mut args = vec!["integrity", "open"];
    args.extend_from_slice(extra);
    let listen = format!("unix:{}", sock.display());
    args.extend_from_slice(&[img, "vol", "--listen", listen.as_str()]);
    let out = run(&args);
    assert!(!out.status.success(), "{extra:?} opened");
    text(&out.stderr)
}

#[test]
fn a_wrong_integrity_algorithm_or_key_is_named_as_the_likely_cause() {
    let dir = tempfile::tempdir().unwrap();
    let img = sparse(dir.path(), "crc.img", 8 << 20);
    assert!(run(&["integrity", "format", "-q", "--no-progress", &img]).status.success());
    let p = volume::integrity::IntegrityParams { journal_commit_time: 0, ..Default::default() };
    leave_journal(&img, &p);
    let err = integrity_open_err(dir.path(), &img, &["-I", "sha256"]);
    assert!(err.contains("the integrity algorithm (-I) or its key"), "{err}");
    assert!(err.contains("tag size is 4 bytes") && err.contains("32-byte digests"), "{err}");
    // The right algorithm replays it.
    let t = volume::integrity::open(&img, &p).unwrap();
    let mut back = vec![0u8; 64 << 10];
    t.read_at(8192, &mut back).unwrap();
    assert!(back == pattern(64 << 10, 3));
    drop(t);

    // A keyed hash with another key: same tag size, so the key is named.
    let img = sparse(dir.path(), "hmac.img", 8 << 20);
    let (k1, k2) = (dir.path().join("k1"), dir.path().join("k2"));
    std::fs::write(&k1, [1u8; 32]).unwrap();
    std::fs::write(&k2, [2u8; 32]).unwrap();
    let (k1, k2) = (k1.to_str().unwrap(), k2.to_str().unwrap());
    let out = run(&[
        "integrity",
        "format",
        "-q",
        "--no-progress",
        "-I",
        "hmac-sha256",
        "--integrity-key-file",
        k1,
        &img,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let p = volume::integrity::IntegrityParams {
        integrity: "hmac-sha256".into(),
        key: Some(sector_crypto::secure::SecretBuf::from_slice(&[1u8; 32])),
        journal_commit_time: 0,
        ..Default::default()
    };
    leave_journal(&img, &p);
    let err = integrity_open_err(dir.path(), &img, &["-I", "hmac-sha256", "--integrity-key-file", k2]);
    assert!(err.contains("do not match hmac-sha256 with this key"), "{err}");
    assert!(!err.contains("digests"), "{err}");
}

fn luks_params(img: &str) -> OpenParams {
    OpenParams::new(img)
}

#[test]
fn luks_format_integrity_prints_progress_lines() {
    let dir = tempfile::tempdir().unwrap();
    let img = sparse(dir.path(), "p.img", 24 << 20);
    let pass = pass_file(dir.path());
    let mut args = vec!["luksFormat", "-q", "--key-file", &pass, "--integrity", "hmac-sha256"];
    args.extend_from_slice(FAST_PBKDF2);
    args.extend_from_slice(&["--progress-frequency", "0", &img]);
    let out = run(&args);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("Wiping device to initialize integrity checksum."), "{err}");
    assert!(err.contains("Progress: 100.0%, ETA 00:00,"), "{err}");
    assert!(err.lines().filter(|l| l.starts_with("Progress:")).count() > 2, "{err}");
}

#[test]
fn an_interrupted_integrity_wipe_says_where_it_stopped_and_resumes_to_a_readable_volume() {
    let dir = tempfile::tempdir().unwrap();
    // Big enough that the wipe takes seconds (sparse: only what is wiped takes space).
    let size = 512u64 << 20;
    let img = sparse(dir.path(), "w.img", size);
    let pass = pass_file(dir.path());
    let mut args = vec!["luksFormat", "-q", "--key-file", &pass, "--integrity", "hmac-sha256"];
    args.extend_from_slice(FAST_PBKDF2);
    args.extend_from_slice(&["--integrity-no-journal", "--progress-frequency", "0", &img]);
    let mut child =
        Command::new(bin()).args(&args).stdin(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    let mut progress_lines = 0;
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with("Progress:") {
            progress_lines += 1;
            if progress_lines == 3 {
                break;
            }
        }
    }
    assert_eq!(progress_lines, 3, "no progress before the end: {seen}");
    assert!(seen.contains("Wiping device"), "{seen}");
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    for line in lines {
        seen.push_str(&line.unwrap());
        seen.push('\n');
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(6), "{seen}");
    assert!(seen.contains("Wipe interrupted by signal 2"), "{seen}");
    assert!(seen.contains("sectors from byte"), "{seen}");
    let from: u64 = seen
        .split("luksResumeWipe --from ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no resume command: {seen}"));
    assert!(seen.contains(&format!("luksResumeWipe --from {from} --integrity-no-journal {img}")), "{seen}");

    // The header unlocks; what was wiped reads, the rest fails its tag check.
    let pass_v = || Passphrase::new(PASS.to_vec());
    {
        let opened = volume::luks::open(&luks_params(&img), &pass_v()).unwrap();
        let dev = opened.volume.device;
        let total = dev.geometry().size;
        assert!(from > 0 && from < total, "stopped at {from} of {total}");
        let mut buf = vec![0u8; 4096];
        dev.read_at(from - 4096, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert!(dev.read_at(from, &mut buf).is_err(), "past the wipe reads");
    }

    // Refused before anything is written: an offset off the sector grid.
    let odd = (from + 1).to_string();
    let out = run(&["luksResumeWipe", "--from", &odd, "--key-file", &pass, &img]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    let from_s = from.to_string();
    let out =
        run(&["luksResumeWipe", "--from", &from_s, "--integrity-no-journal", "--key-file", &pass, &img]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Every byte of the volume now reads, as zeroes.
    let opened = volume::luks::open(&luks_params(&img), &pass_v()).unwrap();
    let dev = opened.volume.device;
    let total = dev.geometry().size;
    let mut buf = vec![0u8; 8 << 20];
    let mut off = 0;
    while off < total {
        let n = buf.len().min((total - off) as usize);
        dev.read_at(off, &mut buf[..n]).unwrap_or_else(|e| panic!("read at {off}: {e}"));
        assert!(buf[..n].iter().all(|&b| b == 0), "non-zero at {off}");
        off += n as u64;
    }
}

#[test]
fn resume_wipe_refuses_a_volume_without_integrity() {
    let dir = tempfile::tempdir().unwrap();
    let img = sparse(dir.path(), "plain.img", 20 << 20);
    let pass = pass_file(dir.path());
    let mut args = vec!["luksFormat", "-q", "--key-file", &pass];
    args.extend_from_slice(FAST_PBKDF2);
    args.push(&img);
    assert!(run(&args).status.success());
    let out = run(&["luksResumeWipe", "--key-file", &pass, &img]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no integrity segment"), "{}", text(&out.stderr));
}

#[test]
fn an_interrupted_integrity_format_wipe_says_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let img = sparse(dir.path(), "i.img", 1 << 30);
    let mut child = Command::new(bin())
        .args(["integrity", "format", "-q", "--progress-frequency", "0", &img])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen += &line;
        seen.push('\n');
        if line.starts_with("Progress:") {
            break;
        }
    }
    assert!(seen.contains("Progress:"), "{seen}");
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    for line in lines {
        seen += &line.unwrap();
        seen.push('\n');
    }
    assert_eq!(child.wait().unwrap().code(), Some(6), "{seen}");
    assert!(seen.contains("Wipe interrupted by signal 15"), "{seen}");
    let wiped: u64 = seen
        .split("wiped (bytes 0..")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no wiped range: {seen}"));
    assert!(seen.contains("run `sealdisk integrity format` again"), "{seen}");
    // The volume opens; the wiped prefix reads, the first sector past it does not.
    let t = volume::integrity::open(&img, &volume::integrity::IntegrityParams::default()).unwrap();
    let total = t.geometry().size;
    assert!(wiped > 0 && wiped < total, "wiped {wiped} of {total}");
    let mut buf = vec![0u8; 4096];
    t.read_at(wiped - 4096, &mut buf).unwrap();
    assert!(t.read_at(wiped, &mut buf).is_err(), "past the wipe reads");
}
