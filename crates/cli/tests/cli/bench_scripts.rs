//! The benchmark scripts behind BENCHMARKS.md run end to end (tiny sizes, one second per job:
//! the numbers mean nothing, the plumbing is what is checked), so they cannot rot unseen.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bin, have};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Runs a script with `env`, output under a fresh directory; returns (status, stderr, out dir).
fn run_script(name: &str, env: &[(&str, &str)]) -> (bool, String, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(repo().join("scripts").join(name));
    cmd.env("SEALDISK_BIN", bin()).env("OUT_DIR", out.path().join("out")).env("TMPDIR", out.path());
    cmd.env("BENCH_DIR", out.path().join("files"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned(), out)
}

fn tools(list: &[&str]) -> bool {
    list.iter().all(|t| have(t))
        && Command::new("fio").arg("--enghelp=nbd").output().is_ok_and(|o| o.status.success())
}

/// The markdown table row of `job`, split into its cells.
fn row(report: &str, job: &str) -> Vec<String> {
    let line = report
        .lines()
        .find(|l| l.starts_with(&format!("| {job} |")))
        .unwrap_or_else(|| panic!("no row for {job} in:\n{report}"));
    line.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect()
}

#[test]
fn bench_peers_compares_sealdisk_with_nbdkit_on_equal_page_cache() {
    if !tools(&["fio", "nbdkit", "nbdinfo"]) {
        return;
    }
    let (ok, stderr, out) = run_script(
        "bench-peers.sh",
        &[
            ("SIZE", "16M"),
            ("RUNTIME", "1"),
            ("RAMP", "0"),
            ("VARIANTS", "nbdkit-file sealdisk-auto sealdisk-nocrypt"),
            ("JOBS", "randwrite-4k-qd1 seqread-1m"),
        ],
    );
    assert!(ok, "bench-peers.sh failed:\n{stderr}");
    let report = std::fs::read_to_string(out.path().join("out/report.md")).unwrap();
    assert!(report.contains("read back in 4 KiB pages"), "page-cache reset not reported:\n{report}");
    for job in ["randwrite-4k-qd1", "seqread-1m"] {
        let cells = row(&report, job);
        // job, then one throughput per variant, each a positive figure.
        assert_eq!(cells.len(), 4, "{cells:?}");
        for c in &cells[1..] {
            let n: f64 =
                c.split_whitespace().next().unwrap().trim_end_matches('k').replace(',', "").parse().unwrap();
            assert!(n > 0.0, "{job}: {c}");
        }
    }
    assert!(report.contains("sealdisk-auto ÷ nbdkit-file"), "{report}");
    assert!(!out.path().join("out/problems.txt").exists(), "servers did not stop cleanly:\n{report}");
}

#[test]
fn bench_peers_tls_variants_serve_fio_over_tls() {
    // `openssl` has no --version flag.
    let openssl = Command::new("openssl").arg("version").output().is_ok_and(|o| o.status.success());
    if !openssl || !tools(&["fio", "nbdkit", "nbdinfo"]) {
        eprintln!("SKIPPED bench_peers_tls_variants_serve_fio_over_tls: needs openssl, fio, nbdkit, nbdinfo");
        return;
    }
    // A port of its own, so concurrent runs of this test do not collide.
    let port = (20000 + std::process::id() % 20000).to_string();
    let (ok, stderr, out) = run_script(
        "bench-peers.sh",
        &[
            ("SIZE", "16M"),
            ("RUNTIME", "1"),
            ("RAMP", "0"),
            ("VARIANTS", "nbdkit-file-tls sealdisk-tls"),
            ("JOBS", "randread-4k-qd1"),
            ("TLS_PORT", &port),
        ],
    );
    assert!(ok, "bench-peers.sh failed:\n{stderr}");
    let report = std::fs::read_to_string(out.path().join("out/report.md")).unwrap();
    assert_eq!(row(&report, "randread-4k-qd1").len(), 3, "{report}");
    assert!(report.contains("sealdisk-tls ÷ nbdkit-file-tls"), "{report}");
    assert!(report.contains("--tls=require"), "{report}");
    let log = std::fs::read_to_string(out.path().join("out/raw/rep1/sealdisk-tls/server.log")).unwrap();
    assert!(log.contains("(TLS required)"), "{log}");
    assert!(!out.path().join("out/problems.txt").exists(), "servers did not stop cleanly:\n{report}");
}

#[test]
fn bench_peers_cipher_variants_serve_luks2_volumes_with_and_without_aes() {
    if !tools(&["fio", "nbdinfo"]) {
        return;
    }
    // The plumbing only: the "software-AES build" is the test's own binary here.
    let (ok, stderr, out) = run_script(
        "bench-peers.sh",
        &[
            ("SIZE", "16M"),
            ("RUNTIME", "1"),
            ("RAMP", "0"),
            ("VARIANTS", "sealdisk-luks2-aes sealdisk-luks2-twofish sealdisk-luks2-aes-noaes sealdisk-luks2-adiantum20-noaes"),
            ("JOBS", "randread-4k-qd1"),
            ("SEALDISK_SOFT_BIN", bin().to_str().unwrap()),
        ],
    );
    assert!(ok, "bench-peers.sh failed:\n{stderr}");
    let report = std::fs::read_to_string(out.path().join("out/report.md")).unwrap();
    assert_eq!(row(&report, "randread-4k-qd1").len(), 5, "{report}");
    assert!(report.contains("| twofish ÷ aes | adiantum20-noaes ÷ aes-noaes |"), "{report}");
    assert!(report.contains("OPENSSL_ia32cap=~0x200000200000000:~0x60000000000"), "{report}");
    assert!(!out.path().join("out/problems.txt").exists(), "servers did not stop cleanly:\n{report}");
    // Without SEALDISK_SOFT_BIN the -noaes variants are refused before anything is made.
    let (ok, stderr, out) =
        run_script("bench-peers.sh", &[("VARIANTS", "sealdisk-luks2-aes-noaes"), ("SEALDISK_SOFT_BIN", "")]);
    assert!(!ok && stderr.contains("SEALDISK_SOFT_BIN"), "{stderr}");
    assert!(!out.path().join("files").exists());
}

#[test]
fn bench_vs_fio_reports_both_tools_on_the_same_job() {
    if !tools(&["fio", "nbdinfo"]) {
        return;
    }
    let (ok, stderr, out) = run_script(
        "bench-vs-fio.sh",
        &[("SIZE", "16M"), ("RUNTIME", "1"), ("RAMP", "0"), ("REPS", "1"), ("JOBS", "randread-4k-qd1")],
    );
    assert!(ok, "bench-vs-fio.sh failed:\n{stderr}");
    let report = std::fs::read_to_string(out.path().join("out/report.md")).unwrap();
    let cells = row(&report, "randread-4k-qd1");
    let fio: f64 = cells[1].replace(',', "").parse().unwrap();
    let harness: f64 = cells[2].replace(',', "").parse().unwrap();
    let ratio: f64 = cells[3].parse().unwrap();
    assert!(fio > 0.0 && harness > 0.0, "{cells:?}");
    assert!((ratio - harness / fio).abs() < 0.01, "{cells:?}");
}

#[test]
fn bench_scripts_refuse_bad_knobs_before_doing_anything() {
    for (script, env) in [
        ("bench-peers.sh", ("PAGECACHE", "huge")),
        ("bench-peers.sh", ("VARIANTS", "nbdkit-nope")),
        ("bench-vs-fio.sh", ("BACKEND", "tape")),
        ("bench-vs-fio.sh", ("JOBS", "randread-8k")),
    ] {
        let (ok, stderr, out) = run_script(script, &[env]);
        assert!(!ok, "{script} accepted {env:?}");
        assert!(stderr.contains(env.0) || stderr.contains(env.1), "{script} {env:?}: {stderr}");
        assert!(!out.path().join("files").exists(), "{script} created files before refusing {env:?}");
    }
}
