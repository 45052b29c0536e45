//! `sealdisk bench` and `sealdisk benchmark` from the command line: a single job on a
//! temporary volume (text and JSON), a two-variant comparison with its chart, the preset list,
//! the integrity presets (format speed, read-modify-write) and stacks, and `benchmark`'s JSON.
//! Short runs; no timing assertions.

use std::process::Command;

fn sealdisk(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sealdisk"))
        .args(args)
        .env("SEALDISK_BENCH_DIR", dir)
        .output()
        .expect("running sealdisk")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn single_job_prints_fio_text_and_leaves_no_volume_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = sealdisk(
        &[
            "bench",
            "--rw=randrw",
            "--bs=4k",
            "--size=4M",
            "--iodepth=4",
            "--verify",
            "--stack=crypt",
            "--crypt-mode=inline",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    for want in [
        "randrw-4k: (jobs=1)",
        "read: IOPS=",
        "write: IOPS=",
        "clat percentiles",
        "99.99th=",
        "cpu          : usr=",
        "verify",
        "Run status",
    ] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "temporary volume removed");
}

#[test]
fn json_output_is_one_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = sealdisk(
        &[
            "bench",
            "--rw=read",
            "--bs=64k",
            "--size=2M",
            "--stack=raw",
            "--output-format=json",
            "--no-progress",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is only the JSON report");
    assert_eq!(v["schema"], "sealdisk-bench-report/1");
    assert_eq!(v["jobs"][0]["read"]["io_bytes"], 2 << 20);
    assert_eq!(v["jobs"][0]["options"]["bs"], 65536);
}

#[test]
fn compare_prints_the_side_by_side_table_and_writes_a_chart() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("chart.svg");
    let vols = dir.path().join("vols");
    std::fs::create_dir(&vols).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sealdisk"))
        .args([
            "bench",
            "--compare",
            "--variant",
            "pool:crypt-mode=pool",
            "--variant",
            "inline:crypt-mode=inline",
        ])
        .args(["--rw=readwrite", "--size=2M", "--sweep-bs=4k,64k", "--repeat=2", "--svg"])
        .arg(&svg)
        .arg("--dir")
        .arg(&vols)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("pool")
            && s.contains("inline")
            && s.contains("READ")
            && s.contains("WRITE")
            && s.contains("64k"),
        "{s}"
    );
    assert!(s.contains('%'), "change column: {s}");
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
}

#[test]
fn presets_are_listed_and_unknown_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = sealdisk(&["bench", "--list-presets"], dir.path());
    assert!(out.status.success());
    let s = text(&out.stdout);
    for p in [
        "dm-crypt-workqueue",
        "iv-sector-size",
        "ext4-parallel-dio",
        "integrity-ahash",
        "integrity-rmw",
        "integrity-modes",
    ] {
        assert!(s.contains(p), "{p} missing from:\n{s}");
    }
    assert!(!s.contains("not implemented yet"), "{s}");
    let out = sealdisk(&["bench", "--preset", "nope"], dir.path());
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn integrity_presets_run_format_speed_and_rmw_tables() {
    let dir = tempfile::tempdir().unwrap();
    let short = ["--size=8M", "--repeat=1", "--runtime=100ms", "--no-progress", "--output-format=json"];
    let run = |preset: &str| {
        let mut args = vec!["bench", "--preset", preset];
        args.extend(short);
        let out = sealdisk(&args, dir.path());
        assert!(out.status.success(), "{preset}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["comparisons"].as_array().unwrap().clone()
    };
    let ahash = run("integrity-ahash");
    assert_eq!(ahash.len(), 2, "format speed, then the dd jobs");
    assert_eq!(ahash[0]["points"][0]["label"], "format");
    assert_eq!(ahash[0]["variants"].as_array().unwrap().len(), 5);
    assert_eq!(ahash[1]["variants"].as_array().unwrap().len(), 6);
    let rmw = run("integrity-rmw");
    let names: Vec<_> = rmw[0]["variants"].as_array().unwrap().iter().map(|v| v["name"].clone()).collect();
    assert_eq!(names, ["buf1", "buf1-rmw", "buf128", "buf128-rmw"]);
    assert!(rmw[0]["variants"][1]["stack"].as_str().unwrap().contains("rmw forced"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "temporary volumes removed");
}

#[test]
fn integrity_and_luks2_stacks_run_single_jobs() {
    let dir = tempfile::tempdir().unwrap();
    for stack in [
        &["--stack=integrity", "--integrity-alg=hmac-sha256", "--integrity-mode=B", "--hash-mode=pool"][..],
        &["--stack=crypt-integrity", "--block-size=512", "--buffer-sectors=1", "--rmw"][..],
        &["--stack=luks2"][..],
        &["--stack=luks2-integrity", "--integrity-mode=D"][..],
        &["--stack=luks2-integrity", "--cipher=aes-gcm-random", "--key-size=256", "--luks-integrity=aead"][..],
    ] {
        let mut args = vec!["bench", "--rw=randrw", "--bs=4k", "--size=4M", "--iodepth=2", "--verify"];
        args.extend(stack);
        let out = sealdisk(&args, dir.path());
        assert!(out.status.success(), "{stack:?}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("write: IOPS="), "{stack:?}");
    }
    let out = sealdisk(&["bench", "--stack=integrity", "--integrity-mode=X", "--rw=read"], dir.path());
    assert_eq!(out.status.code(), Some(1), "usage error: {}", text(&out.stderr));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "temporary volumes removed");
}

#[test]
fn benchmark_reports_ciphers_hashes_and_pbkdf2() {
    let dir = tempfile::tempdir().unwrap();
    let out = sealdisk(&["benchmark", "--time-per-test", "2", "--output-format", "json"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["micro"]["pbkdf2_sha256_iterations_per_s"].as_f64().unwrap() > 0.0);
    // cryptsetup's 12 rows, then every other cipher and mode sealdisk has.
    assert_eq!(v["micro"]["ciphers"].as_array().unwrap().len(), 30);
    let out = sealdisk(&["benchmark", "--time-per-test", "2"], dir.path());
    let t = text(&out.stdout);
    assert!(t.contains("PBKDF2-sha256"));
    assert!(t.contains("#     Algorithm |       Key |      Encryption |      Decryption"), "{t}");
    for row in [
        "    serpent-xts        512b ",
        "    twofish-cbc        128b ",
        "   des3_ede-cbc        192b ",
        "xchacha20,aes-adiantum        256b ",
        "      aes-hctr2        256b ",
    ] {
        assert!(t.contains(row), "no {row:?} in\n{t}");
    }
    // One cipher, as `cryptsetup benchmark -c serpent-xts -s 256`.
    let out = sealdisk(&["benchmark", "--time-per-test", "2", "-c", "serpent-xts", "-s", "256"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(t.contains("    serpent-xts        256b ") && !t.contains("aes-xts"), "{t}");
    // What the kernel refuses is refused with cryptsetup's words and exit 1.
    let out = sealdisk(&["benchmark", "-c", "blowfish-xts"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("Cipher blowfish-xts is not available."), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("128-bit block cipher"), "{}", text(&out.stderr));
}
