//! The filesystem presets, tiny: `sealdisk bench --preset fs-untar` and `--preset fs-randrw`
//! serve each volume as a FUSE file, put it on a loop device, make ext4 with the host kernel
//! and run the seed's workload on it. Where the host allows it (root, /dev/fuse, fusermount3,
//! loop devices, mkfs.ext4, tar, fio) the report must hold every variant and phase with
//! figures, and nothing may be left mounted or attached; elsewhere the preset must skip
//! loudly and exit 0. No timing assertions.

use std::path::Path;
use std::process::Command;

fn sealdisk(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sealdisk"))
        .args(args)
        .env("SEALDISK_BENCH_DIR", dir)
        .output()
        .expect("running sealdisk")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Why this host cannot run a filesystem preset, if it cannot (the test's own check, not
/// the harness's, so that a harness that skips wrongly fails here).
fn host_lacks(fio: bool) -> Option<String> {
    let root = Command::new("id").arg("-u").output().map(|o| text(&o.stdout).trim() == "0").unwrap_or(false);
    if !root {
        return Some("not root".into());
    }
    if !Path::new("/dev/fuse").exists() || !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/fuse or no loop devices".into());
    }
    let mut tools = vec![("fusermount3", "-V"), ("losetup", "-V"), ("mkfs.ext4", "-V"), ("tar", "--version")];
    if fio {
        tools.push(("fio", "--version"));
    }
    for (tool, arg) in tools {
        if !Command::new(tool).arg(arg).output().is_ok_and(|o| o.status.success()) {
            return Some(format!("no {tool}"));
        }
    }
    None
}

/// Nothing of a run in `dir` is still mounted or on a loop device.
fn nothing_left(dir: &Path) {
    let d = dir.to_str().unwrap();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.lines().any(|l| l.contains(d)), "still mounted under {d}:\n{mounts}");
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    assert!(!text(&loops.stdout).contains(d), "a loop device still on {d}: {}", text(&loops.stdout));
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "temporary volumes and directories removed");
}

/// Runs a preset tiny with JSON output; checks it skipped loudly where the host cannot run
/// it, else that every (point, variant) cell has figures. Returns the report, if it ran.
fn run_preset(name: &str, extra: &[&str], fio: bool) -> Option<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["bench", "--preset", name, "--repeat", "1", "--output-format", "json"];
    args.extend(extra);
    let out = sealdisk(&args, dir.path());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{name}: {stderr}");
    if let Some(why) = host_lacks(fio) {
        assert!(
            stderr.contains(&format!("SKIPPED preset {name}")),
            "{name} should have skipped ({why}): {stderr}"
        );
        eprintln!("SKIPPED bench_fs {name}: {why}");
        return None;
    }
    assert!(!stderr.contains("SKIPPED"), "{name} skipped on a host that can run it: {stderr}");
    nothing_left(dir.path());
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    Some(report)
}

/// (point label, variant, has read, has write) of every cell with a positive median bandwidth.
fn cells(report: &serde_json::Value) -> Vec<(String, String, bool, bool)> {
    let c = &report["comparisons"][0];
    let mut out = Vec::new();
    for p in c["points"].as_array().unwrap() {
        for cell in p["cells"].as_array().unwrap() {
            let pos = |d: &str| cell[d]["bw_bytes"]["median"].as_f64().is_some_and(|x| x > 0.0);
            out.push((
                p["label"].as_str().unwrap().to_string(),
                cell["variant"].as_str().unwrap().to_string(),
                pos("read"),
                pos("write"),
            ));
        }
    }
    out
}

#[test]
fn fs_untar_times_mkfs_untar_and_rm_on_every_variant() {
    let Some(report) = run_preset("fs-untar", &["--size", "40M"], false) else { return };
    let got = cells(&report);
    for point in ["mkfs", "untar+sync", "rm+sync"] {
        for variant in ["B-buf128", "B-buf1", "J-buf128", "J-buf1"] {
            assert!(
                got.iter().any(|c| c.0 == point && c.1 == variant && !c.2 && c.3),
                "no timed {point} for {variant}: {got:?}"
            );
        }
    }
    assert_eq!(got.len(), 12);
}

#[test]
fn fs_untar_unpacks_a_given_tarball() {
    let t = tempfile::tempdir().unwrap();
    let tar = t.path().join("crates.tar");
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    assert!(Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&crates)
        .args(["fuse", "blockdev"])
        .status()
        .unwrap()
        .success());
    let Some(report) = run_preset("fs-untar", &["--size", "40M", "--tree", tar.to_str().unwrap()], false)
    else {
        return;
    };
    let jobs = report["comparisons"][0]["points"][1]["jobs"][0].as_str().unwrap().to_string();
    assert!(jobs.contains("crates.tar"), "{jobs}");
    let bad = sealdisk(&["bench", "--preset", "fs-randrw", "--tree", tar.to_str().unwrap()], t.path());
    assert!(!bad.status.success() && text(&bad.stderr).contains("--tree"), "{}", text(&bad.stderr));
}

#[test]
fn fs_randrw_runs_fio_on_ext4_on_every_stack() {
    let extra = ["--size", "64M", "--runtime", "1s", "--ramp_time", "0s"];
    let Some(report) = run_preset("fs-randrw", &extra, true) else { return };
    let got = cells(&report);
    for point in ["4k", "64k", "1M"] {
        for variant in ["raw", "crypt", "integ-J", "aead"] {
            assert!(
                got.iter().any(|c| c.0 == point && c.1 == variant && c.2 && c.3),
                "no read and write figures at {point} for {variant}: {got:?}"
            );
        }
    }
}
