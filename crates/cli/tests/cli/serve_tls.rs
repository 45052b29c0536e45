//! `--tls`, `--tls-psk`, `--tls-certificates` and `--insecure-listen` on the real binary:
//! a non-loopback listener without required TLS is refused unless the insecure flag is
//! given, inconsistent TLS flags are usage errors, and a PSK-protected volume is read and
//! written by libnbd's nbdcopy while a plaintext client gets nothing.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const KEY: &str = "8d1b5c2f610e9a4473c805be3197d26a0fe45822ab913c76e0194db7682ef503";

struct Setup {
    dir: tempfile::TempDir,
    img: String,
    keyf: String,
    psk: String,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(4 << 20).unwrap();
    let keyf = dir.path().join("key");
    std::fs::write(&keyf, pattern(64, 3)).unwrap();
    let psk = dir.path().join("keys.psk");
    std::fs::write(&psk, format!("alice:{KEY}\n")).unwrap();
    let s = |p: std::path::PathBuf| p.to_str().unwrap().to_string();
    Setup { img: s(img), keyf: s(keyf), psk: s(psk), dir }
}

fn open_args<'a>(s: &'a Setup, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "open",
        "--type",
        "plain",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "--key-file",
        &s.keyf,
    ];
    v.extend_from_slice(extra);
    v.extend([s.img.as_str(), "v"]);
    v
}

/// Starts `sealdisk ARGS` and waits for its "serving" line; `Err(stderr)` if it exits.
fn start(args: &[&str]) -> Result<std::process::Child, String> {
    // Each test's server gets the control runtime directory beside its image: the tests
    // run in parallel and all name their volume "v".
    let image = args.iter().find(|a| a.ends_with("disk.img")).expect("an image argument");
    let rt = common::runtime_dir(std::path::Path::new(image).parent().unwrap());
    let mut child = Command::new(bin())
        .args(args)
        .env("SEALDISK_RUNTIME_DIR", rt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let t0 = Instant::now();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("sealdisk: serving") {
            // Keep draining stderr so the server never blocks on it.
            std::thread::spawn(move || lines.for_each(drop));
            return Ok(child);
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no serving line: {seen}");
    }
    let status = child.wait().unwrap();
    Err(format!("exit {status}: {seen}"))
}

fn stop(mut child: std::process::Child) {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let status = child.wait().unwrap();
    assert!(status.success(), "server exit {status}");
}

#[test]
fn non_loopback_listen_needs_tls_require_or_the_insecure_flag() {
    let s = setup();
    for extra in [
        vec!["--listen", "tcp:0.0.0.0:0"],
        vec!["--listen", "tcp:[::]:0"],
        vec!["--listen", "tcp:0.0.0.0:0", "--tls=on", "--tls-psk", &s.psk],
    ] {
        let err = start(&open_args(&s, &extra)).expect_err("must be refused");
        assert!(err.contains("--insecure-listen") && err.contains("--tls=require"), "{extra:?}: {err}");
        assert!(err.contains("exit status: 1"), "a usage error: {err}");
    }
    // Loopback, unix sockets, --tls=require and the explicit flag are served.
    let sock = format!("unix:{}", s.dir.path().join("v.sock").display());
    for extra in [
        vec!["--listen", "tcp:127.0.0.1:0"],
        vec!["--listen", "tcp:localhost:0"],
        vec!["--listen", &sock],
        vec!["--listen", "tcp:0.0.0.0:0", "--tls=require", "--tls-psk", &s.psk],
        vec!["--listen", "tcp:0.0.0.0:0", "--insecure-listen"],
    ] {
        match start(&open_args(&s, &extra)) {
            Ok(child) => stop(child),
            Err(e) => panic!("{extra:?} refused: {e}"),
        }
    }
}

#[test]
fn inconsistent_tls_flags_are_usage_errors() {
    let s = setup();
    let sock = format!("unix:{}", s.dir.path().join("x.sock").display());
    let certs = s.dir.path().to_str().unwrap().to_string();
    for (extra, needle) in [
        (vec!["--tls-psk", &s.psk], "--tls=on or --tls=require"),
        (vec!["--tls=require"], "--tls-certificates DIR or --tls-psk FILE"),
        (vec!["--tls=on", "--tls-psk", &s.psk, "--tls-certificates", &certs], "cannot be used with"),
        (vec!["--tls=on", "--tls-psk", &s.psk, "--tls-verify-peer"], "--tls-certificates"),
        // The directory has no server-cert.pem: the path is named.
        (vec!["--tls=on", "--tls-certificates", &certs], "server-cert.pem"),
    ] {
        let mut args = open_args(&s, &extra);
        args.extend(["--listen", &sock]);
        let err = match start(&args) {
            Err(err) => err,
            Ok(child) => {
                stop(child);
                panic!("{extra:?} was served");
            }
        };
        assert!(!err.contains("exit status: 0") && err.contains(needle), "{extra:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains(KEY), "{err}");
    }
}

#[test]
fn psk_volume_is_read_and_written_by_nbdcopy_and_plaintext_gets_nothing() {
    if !have("nbdcopy") || !have("nbdinfo") {
        eprintln!("SKIPPED psk_volume_is_read_and_written_by_nbdcopy_and_plaintext_gets_nothing");
        return;
    }
    let s = setup();
    let srv = serve(s.dir.path(), "v", &open_args(&s, &["--tls=require", "--tls-psk", &s.psk])[1..], None);
    let uri = format!("nbds+unix://alice@/v?socket={}&tls-psk-file={}", srv.sock.display(), s.psk);
    let data = pattern(1 << 20, 77);
    let src = s.dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    run_tool(Command::new("nbdcopy").arg("--flush").arg(&src).arg(&uri));
    let back = s.dir.path().join("back");
    run_tool(Command::new("nbdcopy").arg(&uri).arg(&back));
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "read back through TLS");
    let out = Command::new("nbdcopy").arg(srv.uri()).arg(s.dir.path().join("stolen")).output().unwrap();
    assert!(!out.status.success(), "a plaintext client copied the volume");
    srv.stop_ok();
    // The image holds ciphertext, not the pattern.
    assert!(std::fs::read(&s.img).unwrap()[..data.len()] != data[..]);
}
