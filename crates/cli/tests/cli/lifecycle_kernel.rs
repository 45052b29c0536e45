//! LUKS lifecycle actions against the real kernel and its cryptsetup (Linux 6.1 dm-crypt,
//! cryptsetup 2.6, under /work/shared/oracle/kernel-run), both ways, in one boot:
//!
//! * `convert`: LUKS1→LUKS2 and LUKS2→LUKS1 by sealdisk, then `cryptsetup open` in the
//!   guest reads the original plaintext through dm-crypt; the same conversions by the
//!   guest's cryptsetup on block devices, then sealdisk serves the result and reads it.
//! * tokens: a `luks2-keyring` token sealdisk added is exported unchanged by the guest's
//!   cryptsetup, before and after cryptsetup rewrote the header (`config --label`); one
//!   the guest's cryptsetup added is exported by sealdisk and unlocks it on the host.
//! * resize: an image grown by sealdisk's offline `resize` opens in the guest with the new
//!   size and the old data; the guest's `cryptsetup resize` (a size, the whole device, a
//!   size beyond it) and sealdisk's running `resize` give the same sizes and the same error.
//! * integrity resize: a standalone integrity image grown by sealdisk's offline `resize`
//!   opens in the guest (`integritysetup open`) at its new size and reads whole, no
//!   mismatch; one grown by the guest's `integritysetup resize` (its device grown under a
//!   dm-linear) reads whole in sealdisk at the kernel's size. A LUKS2 `--integrity` volume's
//!   `cryptsetup resize` is refused, and sealdisk's running `resize` says the same.
//!
//! Boots a kernel (~1 min under TCG): `cargo test -p sealdisk --test cli lifecycle_kernel:: -- --ignored`.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{
    bin, boot_kernel, have, kernel_run, qemu_io, run as sealdisk, serve, sha_hex, tagged_lines, FAST_PBKDF2,
};
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

const SIZE: u64 = 32 << 20;
const PASS: &str = "lifecycle kernel pass";

fn cs(args: &[&str]) -> Output {
    Command::new("cryptsetup").args(args).stdin(Stdio::null()).output().expect("run cryptsetup")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn plaintext(len: usize, seed: u64) -> Vec<u8> {
    let mut x = 0x0123_4567_89ab_cdefu64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The volume key (host cryptsetup reads headers of image files without root).
fn volume_key(img: &str, pass: &str) -> Vec<u8> {
    let out =
        ok(&cs(&["luksDump", "--dump-volume-key", "--batch-mode", "--key-file", pass, img]), "dump key");
    hex::decode(
        out.split("MK dump:").nth(1).unwrap().chars().filter(|c| c.is_ascii_hexdigit()).collect::<String>(),
    )
    .unwrap()
}

/// Data offset in bytes, cipher spec and sector size of a LUKS1 or LUKS2 image.
fn layout(img: &str) -> (u64, String, u32) {
    let out = ok(&cs(&["luksDump", img]), "luksDump");
    let find = |text: &str, k: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(k))
            .map(|l| l.split_once(':').unwrap().1.trim().to_owned())
    };
    if out.starts_with("LUKS header information for") && out.contains("Version:       \t1") {
        let off: u64 = find(&out, "Payload offset").unwrap().parse().unwrap();
        let spec = format!("{}-{}", find(&out, "Cipher name").unwrap(), find(&out, "Cipher mode").unwrap());
        return (off * 512, spec, 512);
    }
    let seg = out.split("Data segments:").nth(1).unwrap();
    (
        find(seg, "offset").unwrap().split_whitespace().next().unwrap().parse().unwrap(),
        find(seg, "cipher").unwrap(),
        find(seg, "sector").unwrap().split_whitespace().next().unwrap().parse().unwrap(),
    )
}

fn cipher(spec: &str, key: &[u8], ss: u32) -> SectorCipher {
    let s: CipherSpec = spec.parse().unwrap();
    SectorCipher::new(
        &s,
        &VolumeKey::from_slice(key),
        SectorParams { sector_size: ss, iv_offset: 0, iv_large_sectors: false },
    )
    .unwrap()
}

/// Formats `img` (`SIZE` bytes) as `kind` with `tool` ("cryptsetup" or "sealdisk") and fills
/// its data area with `plaintext(_, seed)`; returns the plaintext's SHA-256.
fn make(img: &Path, kind: &str, tool: &str, pass: &str, seed: u64) -> String {
    std::fs::File::create(img).unwrap().set_len(SIZE).unwrap();
    let i = img.to_str().unwrap();
    let mut args = vec!["luksFormat", "--type", kind, "--batch-mode", "--key-file", pass];
    if kind == "luks2" {
        // LUKS1 holds only 512-byte sectors (cryptsetup picks 4096 on image files).
        args.extend(["--sector-size", "512"]);
    }
    args.extend(FAST_PBKDF2);
    args.push(i);
    if tool == "cryptsetup" {
        ok(&cs(&args), "cryptsetup luksFormat");
    } else {
        ok(&sealdisk(&args), "sealdisk luksFormat");
    }
    let (off, spec, ss) = layout(i);
    let plain = plaintext((SIZE - off) as usize, seed);
    let sum = sha_hex(&plain);
    let mut data = plain;
    cipher(&spec, &volume_key(i, pass), ss).encrypt(0, &mut data).unwrap();
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new().write(true).open(img).unwrap().write_all_at(&data, off).unwrap();
    sum
}

/// What sealdisk reads from the volume on `img`: the SHA-256 of its whole data area, served
/// over NBD and copied out with nbdcopy.
fn sealdisk_sha(dir: &Path, img: &Path, pass: &str, name: &str) -> String {
    let s = serve(dir, name, &["--key-file", pass, img.to_str().unwrap(), name], None);
    let out = dir.join(format!("{name}.out"));
    let copied = Command::new("nbdcopy").arg(s.uri()).arg(&out).output().unwrap();
    assert!(copied.status.success(), "nbdcopy: {}", String::from_utf8_lossy(&copied.stderr));
    s.stop_ok();
    let sum = sha_hex(&std::fs::read(&out).unwrap());
    std::fs::remove_file(&out).unwrap();
    sum
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

/// A `user` key in this process's session keyring (children inherit it), or `None` if the
/// kernel keyring is not usable here.
fn keyring_add(desc: &str, payload: &[u8]) -> Option<()> {
    use linux_keyutils::{KeyRing, KeyRingIdentifier};
    let ring = KeyRing::from_special_id(KeyRingIdentifier::Session, true).ok()?;
    ring.add_key(desc, payload).ok()?;
    Some(())
}

/// The size a new NBD connection is told, in bytes (`qemu-io -c length`).
fn nbd_length(uri: &str) -> u64 {
    let out = qemu_io(uri, &["length"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    let (n, unit) = (it.next().unwrap(), it.next().unwrap());
    let n: f64 = n.parse().unwrap();
    let mul = match unit {
        "bytes" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        u => panic!("unit {u} in {text}"),
    };
    (n * mul as f64) as u64
}

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~1 min"]
fn convert_tokens_and_resize_interoperate_with_the_kernel() {
    let Some(kr) = kernel_run() else { return };
    for tool in ["cryptsetup", "nbdcopy", "qemu-io"] {
        if !have(tool) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pass = d.join("pass");
    std::fs::write(&pass, PASS).unwrap();
    let p = pass.to_str().unwrap();
    let disk = |n: &str| d.join(format!("{n}.img"));
    let s = |x: &Path| x.to_str().unwrap().to_owned();

    // Converted by sealdisk on the host, opened by the guest (vda, vdb).
    let sum_a = make(&disk("a"), "luks1", "cryptsetup", p, 1);
    ok(&sealdisk(&["convert", "-q", "--type", "luks2", &s(&disk("a"))]), "sealdisk convert luks2");
    let sum_b = make(&disk("b"), "luks2", "cryptsetup", p, 2);
    ok(&sealdisk(&["convert", "-q", "--type", "luks1", &s(&disk("b"))]), "sealdisk convert luks1");
    // Converted by the guest, read by sealdisk (vdc, vdd).
    let sum_c = make(&disk("c"), "luks1", "sealdisk", p, 3);
    let sum_d = make(&disk("d"), "luks2", "sealdisk", p, 4);
    // Tokens (vde): sealdisk's, to be exported and kept by the guest's cryptsetup.
    make(&disk("e"), "luks2", "sealdisk", p, 5);
    let e = s(&disk("e"));
    ok(&sealdisk(&["token", "add", "--key-description", "sd:kt", "--key-slot", "0", &e]), "token add");
    let sd_token = json(&ok(&sealdisk(&["token", "export", "--token-id", "0", &e]), "token export"));
    // Resize (vdf): grown offline by sealdisk from 32 to 48 MiB; its old data area stays.
    let sum_f = make(&disk("f"), "luks2", "sealdisk", p, 6);
    let (off_f, _, _) = layout(&s(&disk("f")));
    let grown = (48u64 << 20) - off_f;
    ok(&sealdisk(&["resize", &s(&disk("f")), "--size", &(grown / 512).to_string()]), "offline resize");
    assert_eq!(std::fs::metadata(disk("f")).unwrap().len(), 48 << 20);
    let old_f = (SIZE - off_f) / 512;

    // Integrity (vdg): formatted and filled by sealdisk, grown offline by sealdisk 8 → 16
    // MiB of data. (vdh): the same at 8 MiB, its file then 24 MiB long: the guest grows it
    // under a dm-linear with `integritysetup resize`.
    let ip = volume::integrity::IntegrityParams::default();
    let idata = plaintext(1 << 20, 8);
    let iformat = |img: &Path| {
        std::fs::File::create(img).unwrap().set_len(8 << 20).unwrap();
        ok(&sealdisk(&["integrity", "format", "-q", "--no-progress", &s(img)]), "integrity format");
        use blockdev::BlockDevice;
        let t = volume::integrity::open(&s(img), &ip).unwrap();
        t.write_at(0, &idata, blockdev::WriteFlags::empty()).unwrap();
        t.flush().unwrap();
    };
    iformat(&disk("g"));
    ok(&sealdisk(&["resize", &s(&disk("g")), "--size", "32768"]), "integrity offline resize");
    iformat(&disk("h"));
    let h_old = std::fs::metadata(disk("h")).unwrap().len() / 512;
    std::fs::OpenOptions::new().write(true).open(disk("h")).unwrap().set_len(24 << 20).unwrap();
    // (vdi): formatted LUKS2 --integrity by the guest.
    std::fs::File::create(disk("i")).unwrap().set_len(32 << 20).unwrap();
    let isum = |sectors: u64| {
        let mut v = idata.clone();
        v.resize(sectors as usize * 512, 0);
        sha_hex(&v)
    };

    let script = d.join("guest.sh");
    std::fs::write(
        &script,
        format!(
            r#"set -e
P=/kr/pass
for x in a:vda b:vdb; do
  n=${{x%%:*}}; dev=/dev/${{x#*:}}
  echo "TYPE $n $(cryptsetup luksDump $dev | sed -n 's/^Version:[[:space:]]*//p')"
  cryptsetup open --key-file $P $dev $n
  echo "SHA $n $(sha256sum /dev/mapper/$n | cut -d' ' -f1)"
  cryptsetup close $n
done
cryptsetup convert --batch-mode --type luks2 /dev/vdc
cryptsetup convert --batch-mode --type luks1 /dev/vdd
# Tokens: sealdisk's is exported as written, and kept when cryptsetup rewrites the header.
echo "TOK sd $(cryptsetup token export --token-id 0 /dev/vde)"
cryptsetup token add --key-description cs:kt --key-slot 0 /dev/vde
cryptsetup config --label kept /dev/vde
echo "TOK sd_after $(cryptsetup token export --token-id 0 /dev/vde)"
echo "TOK cs $(cryptsetup token export --token-id 1 /dev/vde)"
# Resize: the grown image opens with its new size and the old data.
cryptsetup open --key-file $P /dev/vdf f
echo "SZ grown $(blockdev --getsz /dev/mapper/f)"
echo "SHA f $(head -c {old_bytes} /dev/mapper/f | sha256sum | cut -d' ' -f1)"
cryptsetup resize --key-file $P --size 8192 f
echo "SZ small $(blockdev --getsz /dev/mapper/f)"
if cryptsetup resize --key-file $P --size {too_big} f 2>/tmp/err; then echo "ERR big none"; else echo "ERR big $(cat /tmp/err)"; fi
echo "SZ after_big $(blockdev --getsz /dev/mapper/f)"
cryptsetup resize --key-file $P f
echo "SZ full $(blockdev --getsz /dev/mapper/f)"
cryptsetup close f
# Integrity grown by sealdisk: the kernel's size, every sector read without an error.
integritysetup open /dev/vdg g
echo "SZ ig $(blockdev --getsz /dev/mapper/g)"
echo "SHA ig $(sha256sum /dev/mapper/g | cut -d' ' -f1)"
echo "ST ig $(dmsetup status g | cut -d' ' -f4)"
integritysetup close g
# Integrity grown by the kernel: integritysetup resize of a volume whose device grew.
dmsetup create hl --table "0 {h_old} linear /dev/vdh 0"
integritysetup open /dev/mapper/hl h
dmsetup reload hl --table "0 49152 linear /dev/vdh 0"
dmsetup resume hl
integritysetup resize h
echo "INFO ih_after_resize $(dmsetup status h | cut -d' ' -f4-) $(dmsetup table h | cut -d' ' -f4-8)"
for i in $(seq 100); do
  set -- $(dmsetup status h)
  [ "$6" = "$5" ] && break
  sleep 0.1
done
echo "SZ ih $(blockdev --getsz /dev/mapper/h)"
echo "SHA ih $(sha256sum /dev/mapper/h | cut -d' ' -f1)"
echo "ST ih $(dmsetup status h | cut -d' ' -f4-)"
integritysetup close h
# LUKS2 --integrity: cryptsetup's resize refuses it.
cryptsetup luksFormat -q --type luks2 --integrity hmac-sha256 --integrity-no-wipe --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file $P /dev/vdi
cryptsetup open --key-file $P /dev/vdi li
if cryptsetup resize --key-file $P li 2>/tmp/err; then echo "ERR li none"; else echo "ERR li $? $(cat /tmp/err)"; fi
cryptsetup close li
echo "INFO ih_dump $(integritysetup dump /dev/mapper/hl | grep -E 'provided|flags|recalc' | tr '\n' ' ')"
echo "INFO ig_dump $(integritysetup dump /dev/vdg | grep -E 'provided|flags|recalc' | tr '\n' ' ')"
dmsetup remove hl
sync
"#,
            old_bytes = old_f * 512,
            too_big = grown / 512 + 8,
            h_old = h_old,
        ),
    )
    .unwrap();
    let disks: Vec<_> = ["a", "b", "c", "d", "e", "f", "g", "h", "i"].iter().map(|n| disk(n)).collect();
    let log = boot_kernel(&kr, std::slice::from_ref(&pass), &disks, &script);
    let types = tagged_lines(&log, "TYPE");
    let sums = tagged_lines(&log, "SHA");
    let toks = tagged_lines(&log, "TOK");
    let sizes = tagged_lines(&log, "SZ");
    let errs = tagged_lines(&log, "ERR");

    // convert, sealdisk → kernel.
    assert_eq!(types.get("a").map(String::as_str), Some("2"), "{log}");
    assert_eq!(types.get("b").map(String::as_str), Some("1"), "{log}");
    assert_eq!(sums.get("a"), Some(&sum_a), "dm-crypt reads other data after sealdisk's luks1→luks2");
    assert_eq!(sums.get("b"), Some(&sum_b), "dm-crypt reads other data after sealdisk's luks2→luks1");
    // convert, cryptsetup (guest) → sealdisk.
    assert!(ok(&cs(&["luksDump", &s(&disk("c"))]), "dump c").contains("Version:       \t2"));
    assert_eq!(
        sealdisk_sha(d, &disk("c"), p, "c"),
        sum_c,
        "sealdisk reads other data after cryptsetup's luks1→luks2"
    );
    assert!(ok(&cs(&["luksDump", &s(&disk("d"))]), "dump d").contains("Version:       \t1"));
    assert_eq!(
        sealdisk_sha(d, &disk("d"), p, "d"),
        sum_d,
        "sealdisk reads other data after cryptsetup's luks2→luks1"
    );

    // Tokens both ways.
    assert_eq!(
        toks.get("sd").map(|t| json(t)),
        Some(sd_token.clone()),
        "cryptsetup exports sealdisk's token differently"
    );
    assert_eq!(
        toks.get("sd_after").map(|t| json(t)),
        Some(sd_token),
        "cryptsetup's header rewrite changed the token"
    );
    let cs_token =
        json(&ok(&sealdisk(&["token", "export", "--token-id", "1", &e]), "sealdisk token export 1"));
    assert_eq!(
        toks.get("cs").map(|t| json(t)),
        Some(cs_token.clone()),
        "sealdisk exports cryptsetup's token differently"
    );
    assert_eq!(cs_token["key_description"], "cs:kt");
    assert_eq!(cs_token["keyslots"], serde_json::json!(["0"]));
    let desc = format!("sd-lifecycle-kernel:{}", std::process::id());
    if keyring_add(&desc, PASS.as_bytes()).is_some() {
        // The guest's token names cs:kt: give the host's keyring that key (under a name only
        // this test uses, through a token sealdisk imports with cryptsetup's JSON otherwise).
        let mut t = cs_token.clone();
        t["key_description"] = serde_json::Value::String(desc.clone());
        let f = d.join("cs-token.json");
        std::fs::write(&f, t.to_string()).unwrap();
        ok(&sealdisk(&["token", "import", "--json-file", &s(&f), "--token-id", "5", &e]), "token import");
        ok(&sealdisk(&["open", "--test-passphrase", "--token-only", "--token-id", "5", &e]), "token unlock");
    } else {
        eprintln!("SKIPPED PART: the kernel keyring is not usable here (token unlock on the host)");
    }

    // Resize: sealdisk's offline growth as the kernel sees it.
    assert_eq!(sizes.get("grown"), Some(&(grown / 512).to_string()), "{log}");
    assert_eq!(sums.get("f"), Some(&sum_f), "the old data changed in sealdisk's offline resize");
    assert_eq!(sizes.get("small").map(String::as_str), Some("8192"));
    assert_eq!(sizes.get("after_big").map(String::as_str), Some("8192"), "a refused resize changed the size");
    assert_eq!(sizes.get("full"), Some(&(grown / 512).to_string()));
    let cs_err = errs.get("big").expect("no ERR big line").replace("/dev/vdf", "DEV");
    assert!(cs_err.contains("is too small"), "cryptsetup's error: {cs_err}");
    // The same three resizes of the running volume by sealdisk: the same sizes, the same error.
    let f = s(&disk("f"));
    let rt = common::runtime_dir(d);
    let ctl =
        |args: &[&str]| Command::new(bin()).args(args).env("SEALDISK_RUNTIME_DIR", &rt).output().unwrap();
    let srv = serve(d, "f", &["--key-file", p, &f, "f"], None);
    ok(&ctl(&["resize", "f", "--size", "8192"]), "sealdisk resize 8192");
    assert_eq!(nbd_length(&srv.uri()), 8192 * 512);
    let out = ctl(&["resize", "f", "--size", &(grown / 512 + 8).to_string()]);
    assert!(!out.status.success());
    let sd_err = String::from_utf8_lossy(&out.stderr).replace(&f, "DEV");
    assert!(sd_err.contains(cs_err.trim()), "sealdisk says {sd_err:?}, cryptsetup {cs_err:?}");
    assert_eq!(nbd_length(&srv.uri()), 8192 * 512);
    ok(&ctl(&["resize", "f"]), "sealdisk resize");
    assert_eq!(nbd_length(&srv.uri()), grown);
    srv.stop_ok();

    for (k, v) in tagged_lines(&log, "INFO") {
        eprintln!("guest {k}: {v}");
    }
    // Integrity grown by sealdisk, read by the kernel: its size, the data, no mismatch.
    let ig: u64 = sizes.get("ig").expect("no SZ ig line").parse().unwrap();
    assert!(ig >= 32768, "{log}");
    assert_eq!(sums.get("ig"), Some(&isum(ig)), "dm-integrity reads other data after sealdisk's resize");
    assert_eq!(tagged_lines(&log, "ST").get("ig").map(String::as_str), Some("0"), "mismatches: {log}");
    // LUKS2 --integrity: cryptsetup refuses resize; sealdisk's running resize says the same.
    let li = errs.get("li").expect("no ERR li line");
    assert_eq!(li, "1 Unsupported parameters on device li.", "cryptsetup's resize of LUKS2 --integrity");
    let srv = serve(d, "li", &["--key-file", p, &s(&disk("i")), "li"], None);
    let out = ctl(&["resize", "li"]);
    assert_eq!(out.status.code(), Some(1));
    let sd = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    assert!(sd.ends_with(&li[2..]), "sealdisk says {sd:?}, cryptsetup {li:?}");
    srv.stop_ok();
    // Grown by the kernel (integritysetup resize), read by sealdisk: the same size and data.
    let ih: u64 = sizes.get("ih").expect("no SZ ih line").parse().unwrap();
    assert!(ih > h_old, "{log}");
    assert_eq!(sums.get("ih"), Some(&isum(ih)), "dm-integrity after its own resize: {log}");
    {
        use blockdev::BlockDevice;
        let t = volume::integrity::open(&s(&disk("h")), &ip).unwrap();
        t.wait_recalculated();
        assert_eq!(t.geometry().size / 512, ih, "sealdisk's size of the kernel-grown volume");
        let mut all = vec![0u8; ih as usize * 512];
        t.read_at(0, &mut all).expect("sealdisk reads the kernel-grown volume");
        assert_eq!(sha_hex(&all), isum(ih));
        assert_eq!(t.status().mismatches, 0);
    }
}
