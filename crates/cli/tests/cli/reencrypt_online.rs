//! A LUKS2 volume mid-reencryption, opened and served (cryptsetup activates such a volume
//! as the new segment below the reencryption offset and the old one above it), against the
//! real cryptsetup 2.6 on image files:
//!
//! * a reencryption killed (SIGKILL) mid-run, in cryptsetup or in sealdisk, with the
//!   hotzone mid-write or not: `sealdisk open` (recovering the hotzone first) serves exactly
//!   the plaintext written before;
//! * writes through that server land in the right segment: after the reencryption is
//!   finished (by cryptsetup, or by sealdisk), the data decrypted outside both tools with the
//!   key cryptsetup prints is what was written.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::cryptsetup::{cipher, cs, in_progress, layout, ok, plaintext, volume_key, write_at, Vol};
use common::{bin, have, run as sealdisk, run_tool, serve, FAST_PBKDF2};

const MIB: u64 = 1 << 20;

fn tools() -> bool {
    for t in ["cryptsetup", "nbdcopy"] {
        if !have(t) {
            eprintln!("SKIPPED: {t} is not installed");
            return false;
        }
    }
    true
}

/// A cryptsetup LUKS2 volume of `size` bytes whose data area holds `plaintext(_, 0)`.
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

/// The reencryption is over and the data, decrypted with the key and layout cryptsetup
/// reports, is `want`.
fn assert_data(v: &Vol, want: &[u8], what: &str) {
    let dump = ok(&cs(&["luksDump", v.img()]), "luksDump");
    assert!(!dump.contains("online-reencrypt"), "{what}: still in reencryption:\n{dump}");
    let (off, spec, ss) = layout(v.img());
    let mut data = std::fs::read(&v.img).unwrap().split_off(off as usize);
    cipher(&spec, &volume_key(v.img(), v.pass()), ss).decrypt(0, &mut data).unwrap();
    assert!(data == want, "{what}: data differs after the reencryption finished");
}

/// Starts `cmd`, SIGKILLs it after a delay; tries shorter delays until the kill lands mid-run
/// with the hotzone mid-write (`want_hot`) or between hotzones. `None` if never caught so.
fn killed_mid_run(want_hot: Option<bool>, mut cmd: impl FnMut(&Vol) -> Command) -> Option<(Vol, bool)> {
    for ms in [700u64, 500, 400, 300, 200, 150, 100, 70, 50, 25] {
        let v = volume(160 * MIB);
        let mut child =
            cmd(&v).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(ms));
        let _ = child.kill();
        let _ = child.wait();
        match in_progress(v.img()) {
            Some(hot) if want_hot.is_none_or(|w| w == hot) => {
                eprintln!("killed after {ms} ms, hotzone mid-write: {hot}");
                return Some((v, hot));
            }
            _ => {}
        }
    }
    None
}

fn cs_run(v: &Vol) -> Command {
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
}

fn sd_run(resilience: &'static str) -> impl FnMut(&Vol) -> Command {
    move |v| {
        let mut c = Command::new(bin());
        c.args(["reencrypt", "--hotzone-size", "1M", "--resilience", resilience, "--key-file", v.pass()])
            .args(FAST_PBKDF2)
            .arg(v.img());
        c
    }
}

/// Serves `v` (mid-reencryption), checks it reads back the original plaintext, writes a new
/// plaintext through it, and returns that plaintext.
fn serve_read_write(v: &Vol) -> Vec<u8> {
    let srv = serve(v.dir.path(), "vol", &["--key-file", v.pass(), v.img(), "vol"], None);
    let back = v.dir.path().join("back.raw");
    run_tool(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert!(got == plaintext(got.len(), 0), "a volume mid-reencryption does not read back its plaintext");
    let new = plaintext(got.len(), 7);
    std::fs::write(&back, &new).unwrap();
    run_tool(Command::new("nbdcopy").arg(&back).arg(srv.uri()));
    srv.stop_ok();
    assert!(
        in_progress(v.img()).is_some_and(|hot| !hot),
        "after open the reencryption is in progress, hotzone recovered"
    );
    new
}

#[test]
fn cryptsetup_killed_mid_run_opens_in_sealdisk_then_cryptsetup_finishes() {
    if !tools() {
        return;
    }
    let (v, hot) = killed_mid_run(None, cs_run).expect("cryptsetup was never caught mid-run");
    let new = serve_read_write(&v);
    let _ = hot;
    ok(&cs_resume(&v), "cryptsetup reencrypt --resume-only");
    assert_data(&v, &new, "cryptsetup killed, sealdisk served, cryptsetup finished");
}

#[test]
fn sealdisk_killed_mid_hotzone_opens_then_finishes() {
    if !tools() {
        return;
    }
    for resilience in ["checksum", "journal"] {
        let (v, hot) = killed_mid_run(Some(true), sd_run(resilience))
            .or_else(|| killed_mid_run(None, sd_run(resilience)))
            .expect("sealdisk was never caught mid-run");
        eprintln!("{resilience}: hotzone mid-write: {hot}");
        let new = serve_read_write(&v);
        ok(
            &sealdisk(&["reencrypt", "--resume-only", "--key-file", v.pass(), v.img()]),
            "sealdisk reencrypt --resume-only",
        );
        assert_data(&v, &new, resilience);
    }
}

/// `cryptsetup reencrypt --resume-only` of `v`, offline.
fn cs_resume(v: &Vol) -> Output {
    cs(&[
        "reencrypt",
        "--batch-mode",
        "--force-offline-reencrypt",
        "--resume-only",
        "--key-file",
        v.pass(),
        v.img(),
    ])
}

/// What [`volume`] wrote into the data area.
fn original(v: &Vol) -> Vec<u8> {
    let (off, _, _) = layout(v.img());
    plaintext((std::fs::metadata(&v.img).unwrap().len() - off) as usize, 0)
}

/// A run killed mid-hotzone (cryptsetup's `CRYPT_REENCRYPT_CRASH`): cryptsetup's resume asks
/// for `repair` first. `sealdisk repair` recovers the hotzone (a wrong passphrase changes
/// nothing), and cryptsetup then resumes and finishes without loss; and the other way round,
/// `cryptsetup repair` of a hotzone sealdisk left, then sealdisk finishes.
#[test]
fn repair_recovers_a_hotzone_for_the_other_tool_to_resume() {
    if !tools() {
        return;
    }
    let cs_journal = |v: &Vol| {
        let mut c = cs_run(v);
        c.args(["--resilience", "journal"]);
        c
    };
    let mut caught = 0;
    if let Some((v, _)) = killed_mid_run(Some(true), cs_journal) {
        caught += 1;
        let refused = cs_resume(&v);
        assert!(
            !refused.status.success()
                && String::from_utf8_lossy(&refused.stderr).contains("Run repair first"),
            "cryptsetup resumed a crashed hotzone without repair: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
        let before = std::fs::read(&v.img).unwrap();
        let wrong = v.dir.path().join("wrong");
        std::fs::write(&wrong, b"wrong horse").unwrap();
        let out = sealdisk(&["repair", "--batch-mode", "--key-file", wrong.to_str().unwrap(), v.img()]);
        assert_eq!(out.status.code(), Some(2), "wrong passphrase: {}", String::from_utf8_lossy(&out.stderr));
        assert!(std::fs::read(&v.img).unwrap() == before, "a repair with the wrong passphrase wrote");
        ok(&sealdisk(&["repair", "--batch-mode", "--key-file", v.pass(), v.img()]), "sealdisk repair");
        assert_eq!(in_progress(v.img()), Some(false), "the hotzone is still flagged after repair");
        ok(&cs_resume(&v), "cryptsetup reencrypt --resume-only after sealdisk repair");
        assert_data(&v, &original(&v), "cryptsetup killed, sealdisk repaired, cryptsetup finished");
    }
    if let Some((v, _)) = killed_mid_run(Some(true), sd_run("journal")) {
        caught += 1;
        ok(&cs(&["repair", "--batch-mode", "--key-file", v.pass(), v.img()]), "cryptsetup repair");
        assert_eq!(in_progress(v.img()), Some(false), "cryptsetup left the hotzone flagged");
        ok(
            &sealdisk(&["reencrypt", "--resume-only", "--key-file", v.pass(), v.img()]),
            "sealdisk reencrypt --resume-only after cryptsetup repair",
        );
        assert_data(&v, &original(&v), "sealdisk killed, cryptsetup repaired, sealdisk finished");
    }
    assert!(caught > 0, "neither tool was ever killed mid-hotzone");
}

/// Opened read-only, a volume with a hotzone to recover is refused (recovery writes) and
/// nothing changes; one between hotzones is served read-only.
#[test]
fn read_only_open_mid_reencryption() {
    if !tools() {
        return;
    }
    let v = volume(24 * MIB);
    let mut args = vec!["reencrypt", "--init-only", "--key-file", v.pass()];
    args.extend(FAST_PBKDF2);
    args.push(v.img());
    ok(&sealdisk(&args), "sealdisk reencrypt --init-only");
    let srv = serve(v.dir.path(), "ro", &["--readonly", "--key-file", v.pass(), v.img(), "ro"], None);
    let back = v.dir.path().join("back.raw");
    run_tool(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert!(got == plaintext(got.len(), 0));
    srv.stop_ok();
    // A wrong passphrase: cryptsetup's exit code 2, nothing written.
    std::fs::write(&v.pass, "wrong").unwrap();
    let before = std::fs::read(&v.img).unwrap();
    let out = sealdisk(&["open", "--test-passphrase", "--key-file", v.pass(), v.img()]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&v.img).unwrap() == before);
}

/// A volume opened mid-reencryption takes the header's persistent flags as a volume of one
/// segment does (`status` shows them), and `refresh` of it says why it cannot rebuild it
/// (no "integrity" message), changing nothing.
#[test]
fn mid_reencryption_persistent_flags_and_refresh() {
    if !tools() {
        return;
    }
    let v = volume(24 * MIB);
    let d = v.dir.path();
    let srv =
        serve(d, "p", &["--persistent", "--perf-same_cpu_crypt", "--key-file", v.pass(), v.img(), "p"], None);
    srv.stop_ok();
    let mut args = vec!["reencrypt", "--init-only", "--key-file", v.pass()];
    args.extend(FAST_PBKDF2);
    args.push(v.img());
    ok(&sealdisk(&args), "sealdisk reencrypt --init-only");
    let srv = serve(d, "mid", &["--key-file", v.pass(), v.img(), "mid"], None);
    let st = status_of(&v, "mid");
    assert!(st.lines().any(|l| l.contains("flags:") && l.contains("same_cpu_crypt")), "{st}");
    let out = sd_in(d, &["refresh", "mid", "--perf-no_read_workqueue"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("reencryption is unfinished") && !err.contains("integrity"), "{err}");
    let st = status_of(&v, "mid");
    assert!(!st.contains("no_read_workqueue"), "{st}");
    let back = d.join("back.raw");
    run_tool(Command::new("nbdcopy").arg(srv.uri()).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert!(got == plaintext(got.len(), 0));
    srv.stop_ok();
}

// ---- Online reencryption of a served volume ----

/// `sealdisk ARGS` with the runtime directory of the servers `serve` starts in `dir`.
fn sd_in(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args).env("SEALDISK_RUNTIME_DIR", common::runtime_dir(dir)).stdin(Stdio::null());
    c
}

fn online_reencrypt(v: &Vol, extra: &[&str]) -> Command {
    let mut args = vec!["reencrypt", "--key-file", v.pass(), "--progress-frequency", "1"];
    args.extend(FAST_PBKDF2);
    args.extend(extra);
    args.push(v.img());
    let mut c = sd_in(v.dir.path(), &args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn status_of(v: &Vol, name: &str) -> String {
    ok(&sd_in(v.dir.path(), &["status", name]).output().unwrap(), "sealdisk status")
}

/// Waits until `status` shows the reencryption running with some bytes done.
fn wait_running(v: &Vol, name: &str) -> String {
    let t0 = std::time::Instant::now();
    loop {
        let s = status_of(v, name);
        if let Some(line) = s.lines().find(|l| l.contains("reencryption: running")) {
            if !line.contains("(0 of") {
                return s;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the reencryption never showed progress:\n{s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deterministic writes: `(offset, length, byte)`, 4 KiB aligned, inside `size`.
fn writes(seed: u64, n: usize, size: u64) -> Vec<(u64, u64, u8)> {
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|_| {
            let len = (next() % 64 + 1) * 4096;
            let off = next() % ((size - len) / 4096) * 4096;
            (off, len, (next() % 250 + 1) as u8)
        })
        .collect()
}

/// Writes through the server with qemu-io and applies them to `model`.
fn write_batch(uri: &str, batch: &[(u64, u64, u8)], model: &mut [u8]) {
    let cmds: Vec<String> = batch.iter().map(|(o, l, b)| format!("write -P {b} {o} {l}")).collect();
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    common::qemu_io(uri, &refs);
    for (o, l, b) in batch {
        model[*o as usize..(*o + *l) as usize].fill(*b);
    }
}

fn read_all(v: &Vol, uri: &str) -> Vec<u8> {
    let back = v.dir.path().join("read.raw");
    run_tool(Command::new("nbdcopy").arg(uri).arg(&back));
    std::fs::read(&back).unwrap()
}

#[test]
fn online_reencryption_while_clients_write() {
    if !tools() || !have("qemu-io") {
        return;
    }
    let v = volume(96 * MIB);
    let srv = serve(v.dir.path(), "vol", &["--key-file", v.pass(), v.img(), "vol"], None);
    let uri = srv.uri();
    let mut model = read_all(&v, &uri);
    assert!(model == plaintext(model.len(), 0));
    let size = model.len() as u64;
    let child =
        online_reencrypt(&v, &["--hotzone-size", "256k", "--cipher", "aes-xts-plain64", "--key-size", "256"])
            .spawn()
            .unwrap();
    let st = wait_running(&v, "vol");
    eprintln!("{st}");
    // A second reencryption while one runs: cryptsetup's refusal (device busy).
    let out = online_reencrypt(&v, &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Reencryption process is already running."));
    // `refresh` while it runs: busy, and it says why.
    let out = sd_in(v.dir.path(), &["refresh", "vol", "--perf-same_cpu_crypt"]).output().unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is being reencrypted"));
    // Clients write and read while it runs.
    let mut batches = 0;
    let mut during = 0;
    for seed in 1..400u64 {
        let running = status_of(&v, "vol").contains("reencryption: running");
        if !running && batches >= 4 {
            break;
        }
        write_batch(&uri, &writes(seed, 8, size), &mut model);
        batches += 1;
        during += usize::from(running);
        if seed % 4 == 0 {
            assert!(read_all(&v, &uri) == model, "a read during the reencryption differs from the model");
        }
    }
    let out = child.wait_with_output().unwrap();
    let msg = String::from_utf8_lossy(&out.stderr);
    ok(&out, "sealdisk reencrypt (online)");
    assert!(
        msg.contains("Progress:") && msg.contains("MiB/s") && msg.contains("ETA"),
        "no progress line: {msg}"
    );
    assert!(during >= 1, "no client write ran during the reencryption ({batches} batches)");
    eprintln!("{batches} batches of writes, {during} during the reencryption");
    assert!(status_of(&v, "vol").contains("reencryption: finished 100.0%"));
    assert!(read_all(&v, &uri) == model, "after the reencryption the volume differs from the model");
    srv.stop_ok();
    assert_data(&v, &model, "online reencryption");
    assert_eq!(volume_key(v.img(), v.pass()).len(), 32, "the new key is the one asked for");
}

/// The server is SIGKILLed mid-reencryption: the header is left as offline runs leave it,
/// and both offline sealdisk and cryptsetup resume it with nothing lost.
#[test]
fn server_killed_mid_online_reencryption_resumes_offline() {
    if !tools() || !have("qemu-io") {
        return;
    }
    for finisher in ["sealdisk", "cryptsetup"] {
        let v = volume(96 * MIB);
        // (cryptsetup waits for the image's lock while a server holds it: no luksDump then.)
        let mut model = plaintext((96 * MIB - layout(v.img()).0) as usize, 0);
        let mut srv = serve(v.dir.path(), "vol", &["--key-file", v.pass(), v.img(), "vol"], None);
        let uri = srv.uri();
        let size = model.len() as u64;
        let child = online_reencrypt(&v, &["--hotzone-size", "256k"]).spawn().unwrap();
        wait_running(&v, "vol");
        write_batch(&uri, &writes(99, 16, size), &mut model);
        let server = srv.child.take().unwrap();
        let _ = Command::new("kill").arg("-KILL").arg(server.id().to_string()).status();
        let _ = server.wait_with_output();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "the reencrypt client did not notice its server died");
        let hot = in_progress(v.img()).expect("killed mid-run: the reencryption is in progress");
        eprintln!("{finisher}: killed with the hotzone mid-write: {hot}");
        if finisher == "sealdisk" {
            ok(
                &sealdisk(&["reencrypt", "--resume-only", "--key-file", v.pass(), v.img()]),
                "sealdisk resume",
            );
        } else {
            if hot {
                ok(&cs(&["repair", "--batch-mode", "--key-file", v.pass(), v.img()]), "cryptsetup repair");
            }
            ok(&cs_resume(&v), "cryptsetup resume");
        }
        assert_data(&v, &model, finisher);
    }
}
