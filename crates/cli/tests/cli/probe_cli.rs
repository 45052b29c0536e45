//! `sealdisk probe` and `open` without `--type` on every kind of golden image in testdata/
//! (made by cryptsetup, integritysetup or the kernel), and on hostile inputs: what is
//! recognised, what it says (blkid-style and JSON), the exit codes (0 found, 2 nothing),
//! and that `open` goes where the probe points.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{bin, run, run_stdin};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// `testdata/<rel>` decompressed into `dir` (`None`, loudly, without xz).
fn unxz(dir: &Path, rel: &str) -> Option<PathBuf> {
    let src = testdata().join(rel);
    let out = match Command::new("xz").arg("-dc").arg(&src).output() {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!("xz -dc {}: {}", src.display(), String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED PART: cannot run xz ({e}); {rel} not probed");
            return None;
        }
    };
    let name = Path::new(rel).file_name().unwrap().to_str().unwrap().trim_end_matches(".xz");
    let path = dir.join(name);
    std::fs::write(&path, out.stdout).unwrap();
    Some(path)
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn probe(path: &Path) -> (Option<i32>, String) {
    let o = run(&["probe", path.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert!(err.is_empty(), "probe {}: {err}", path.display());
    (o.status.code(), out)
}

fn probe_json(path: &Path) -> serde_json::Value {
    let o = run(&["probe", "--json", path.to_str().unwrap()]);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o).0))
}

fn dump_field(dump: &str, key: &str) -> String {
    let text = std::fs::read_to_string(testdata().join(dump)).unwrap();
    let line = text.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} in {dump}"));
    line[key.len()..].trim_start_matches(':').trim().to_owned()
}

#[test]
fn luks_headers_are_described_with_uuid_label_and_cipher() {
    // The header file grown (sparse) to a device its keyslot areas fit in.
    let dir = tempfile::tempdir().unwrap();
    let l2 = dir.path().join("luks2.img");
    std::fs::copy(testdata().join("luks/luks2-pbkdf2-xts512.hdr"), &l2).unwrap();
    std::fs::OpenOptions::new().write(true).open(&l2).unwrap().set_len(20 << 20).unwrap();
    let (code, out) = probe(&l2);
    assert_eq!(code, Some(0), "{out}");
    let uuid = dump_field("luks/luks2-pbkdf2-xts512.dump", "UUID");
    let want = format!(
        "{}: TYPE=\"luks2\" VERSION=\"2\" UUID=\"{uuid}\" LABEL=\"golden-label\" SIZE=\"20971520\" \
         CIPHER=\"aes-xts-plain64\" AUTHENTICATED=\"no\"\n",
        l2.display()
    );
    assert_eq!(out, want);
    let l1 = dir.path().join("luks1.img");
    std::fs::copy(testdata().join("luks/luks1-cbc-essiv-sha1.hdr"), &l1).unwrap();
    std::fs::OpenOptions::new().write(true).open(&l1).unwrap().set_len(4 << 20).unwrap();
    let j = probe_json(&l1);
    assert_eq!(j["type"], "luks1");
    assert_eq!(j["format"], "LUKS1");
    assert_eq!(j["uuid"], dump_field("luks/luks1-cbc-essiv-sha1.dump", "UUID").as_str());
    let d = "luks/luks1-cbc-essiv-sha1.dump";
    assert_eq!(
        j["cipher"],
        format!("{}-{}", dump_field(d, "Cipher name"), dump_field(d, "Cipher mode")).as_str()
    );
    assert_eq!(j["authenticated"], false);
    assert_eq!(j["label"], serde_json::Value::Null);
}

#[test]
fn authenticated_luks2_integrity_and_headerless_images_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    if let Some(img) = unxz(dir.path(), "luks-integrity/aead-gcm-s512.img.xz") {
        let j = probe_json(&img);
        assert_eq!((j["type"].as_str(), j["authenticated"].as_bool()), (Some("luks2"), Some(true)), "{j}");
        assert_eq!(j["cipher"], "aes-gcm-random");
        assert_eq!(j["size"], 4 << 20);
    }
    // Tag size and flags as integritysetup dump (the .dump beside each image) says them.
    for name in ["crc32c-j-s512", "crc32c-b-s4096", "sha256-j-s4096"] {
        let Some(img) = unxz(dir.path(), &format!("integrity/{name}.img.xz")) else { continue };
        let j = probe_json(&img);
        assert_eq!(j["type"], "integrity", "{name}: {j}");
        let dump = format!("integrity/{name}.dump");
        let tag: u64 = dump_field(&dump, "integrity_tag_size").parse().unwrap();
        assert_eq!(j["tag_size"].as_u64(), Some(tag), "{name}: {j}");
        let flags = dump_field(&dump, "flags");
        let got: Vec<&str> =
            j["integrity_flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        assert_eq!(got.join(" "), flags, "{name}");
        assert_eq!(j["integrity_mode"], serde_json::Value::Null, "{name}: closed cleanly, no mode recorded");
        assert_eq!(probe(&img).0, Some(0));
    }
    // Plain dm-crypt made by the kernel: no header, nothing recognised (blkid's exit 2).
    for name in ["aes-xts-plain64-k384-ss512", "serpent-cbc-essiv-sha256-k256-ss512"] {
        let rel = format!("dm-crypt-ciphers/{name}.img.xz");
        if !testdata().join(&rel).exists() {
            continue;
        }
        let Some(img) = unxz(dir.path(), &rel) else { continue };
        assert_eq!(probe(&img), (Some(2), String::new()), "{name}");
        let j = probe_json(&img);
        assert_eq!((j["type"].is_null(), j["format"].as_str()), (true, Some("unknown")));
    }
}

#[test]
fn hostile_inputs_are_unknown_or_refused_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<u8>); 4] = [
        ("empty", Vec::new()),
        ("short", b"LUKS\xba\xbe\x00".to_vec()),
        ("garbage", (0..65536u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()),
        // A FAT boot sector's OEM name is BitLocker To Go's, but without its GUID it is not one.
        ("fat", {
            let mut v = vec![0u8; 4096];
            v[3..11].copy_from_slice(b"MSWIN4.1");
            v
        }),
    ];
    for (name, bytes) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let o = run(&["probe", p.to_str().unwrap()]);
        let code = o.status.code();
        // A short LUKS magic is not a header: either "nothing here" or a clear refusal.
        assert!(matches!(code, Some(1 | 2)), "{name}: {code:?} {:?}", text(&o));
        assert!(!text(&o).1.contains("panicked"), "{name}: {:?}", text(&o));
    }
    let o = run(&["probe", "/nonexistent/device"]);
    assert_eq!(o.status.code(), Some(4), "{:?}", text(&o));
    // BitLocker: the signature alone is recognised; `open` takes it to the BitLocker reader,
    // which refuses the missing metadata before it asks for a passphrase.
    let mut v = vec![0u8; 1 << 20];
    v[3..11].copy_from_slice(b"-FVE-FS-");
    let p = dir.path().join("bitlk");
    std::fs::write(&p, v).unwrap();
    assert_eq!(
        probe(&p).1,
        format!("{}: TYPE=\"bitlk\" SIZE=\"1048576\" AUTHENTICATED=\"no\"\n", p.display())
    );
    let sock = dir.path().join("x.sock");
    let o = Command::new(bin())
        .args(["open", p.to_str().unwrap(), "x", "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .env("SEALDISK_RUNTIME_DIR", dir.path().join("run"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(text(&o).1.contains("BITLK metadata"), "{:?}", text(&o));
}

#[test]
fn open_without_type_goes_where_the_probe_points() {
    let dir = tempfile::tempdir().unwrap();
    let pass = std::fs::read(testdata().join("luks-integrity/pass.txt")).unwrap();
    if let Some(img) = unxz(dir.path(), "luks-integrity/hmac-sha256-xts-s512.img.xz") {
        let img = img.to_str().unwrap();
        let o = run_stdin(&["open", "--test-passphrase", "--key-file", "-", img], &pass);
        assert!(o.status.success(), "{:?}", text(&o));
        let o = run_stdin(&["open", "--test-passphrase", "--key-file", "-", img], b"wrong");
        assert_eq!(o.status.code(), Some(2), "a wrong passphrase, as LUKS says it: {:?}", text(&o));
    }
    if let Some(img) = unxz(dir.path(), "integrity/crc32c-j-s512.img.xz") {
        let o = run(&["open", img.to_str().unwrap(), "v", "--listen", "unix:/nonexistent/x.sock"]);
        assert_eq!(o.status.code(), Some(1));
        assert!(text(&o).1.contains("holds a dm-integrity superblock"), "{:?}", text(&o));
    }
    if let Some(img) = unxz(dir.path(), "dm-crypt-ciphers/aes-xts-plain64-k384-ss512.img.xz") {
        let o = run_stdin(&["open", "--test-passphrase", "--key-file", "-", img.to_str().unwrap()], b"x");
        assert_eq!(o.status.code(), Some(1));
        let err = text(&o).1;
        assert!(err.contains("is not a valid LUKS device") && err.contains("--type plain"), "{err}");
    }
}
