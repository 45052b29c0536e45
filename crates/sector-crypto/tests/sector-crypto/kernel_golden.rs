//! Golden images written by the real Linux 6.1 dm-crypt (see `testdata/dm-crypt/README.md`
//! for AES and its IV generators, `testdata/dm-crypt-ciphers/README.md` for the other
//! ciphers, chain modes, keycounts, lmk and tcw; those images are xz-compressed).
//!
//! For every row of each directory's `cases.tsv` the image's ciphertext region (after
//! `offset` 512-byte sectors) must
//! * decrypt to the deterministic plaintext with `SectorCipher::decrypt`, whole and in chunks
//!   that start at nonzero sectors, and
//! * be reproduced byte for byte by `SectorCipher::encrypt` of that plaintext, likewise.
//!
//! The images and the manifest are checked for accidental edits (sha256, sizes, and the
//! recorded dm table line against the other columns). All cases are run; failures are
//! collected and reported together, with the first mismatching byte of each.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};

/// SHA-256 of the plaintext stream's first `PLAINTEXT_LEN` bytes (guards the generator).
const PLAINTEXT_SHA256: &str = "9df9582519475875aa9b556d8e7b70e2ee61c00b57b715300a26d3f9d8a0b306";
const PLAINTEXT_LEN: usize = 262_144;
/// One directory of golden images.
#[derive(Debug, Clone, Copy)]
struct Set {
    /// Directory under testdata/.
    dir: &'static str,
    /// The manifest was generated with this many image rows; fewer means rows were lost.
    min_rows: usize,
    /// Images are stored as `<file>.xz`.
    xz: bool,
}

const AES_SET: Set = Set { dir: "dm-crypt", min_rows: 90, xz: false };
const CIPHERS_SET: Set = Set { dir: "dm-crypt-ciphers", min_rows: 100, xz: true };

fn golden_dir(set: Set) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(set.dir)
}

/// True (after saying so loudly) when `set` needs `xz` and it cannot run.
fn skip_without_xz(set: Set) -> bool {
    if !set.xz || Command::new("xz").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return false;
    }
    eprintln!("SKIPPED: testdata/{} needs `xz` (Debian xz-utils) to decompress its images", set.dir);
    true
}

// ---------------------------------------------------------------- SHA-256 (FIPS 180-4)

#[rustfmt::skip]
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

fn sha256(data: &[u8]) -> [u8; 32] {
    let mut h: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha256(data))
}

/// `SHA256("sealdisk dm-crypt golden plaintext block 0") || SHA256("... block 1") || ...`
fn plaintext(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(&sha256(format!("sealdisk dm-crypt golden plaintext block {i}").as_bytes()));
        i += 1;
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------- manifest

#[derive(Debug, Clone)]
struct Case {
    file: String,
    kind: String,
    cipher: String,
    key_hex: String,
    key_bits: usize,
    iv_offset: u64,
    offset: u64,
    sector_size: u32,
    iv_large_sectors: bool,
    payload_len: usize,
    table: String,
    sha256: String,
}

impl Case {
    fn name(&self) -> &str {
        self.file.trim_end_matches(".img")
    }

    fn key(&self) -> Vec<u8> {
        if self.key_hex == "-" {
            Vec::new()
        } else {
            hex::decode(&self.key_hex).unwrap_or_else(|e| panic!("{}: bad key hex: {e}", self.file))
        }
    }

    fn params(&self) -> SectorParams {
        SectorParams {
            sector_size: self.sector_size,
            iv_offset: self.iv_offset,
            iv_large_sectors: self.iv_large_sectors,
        }
    }
}

fn load_manifest(set: Set) -> Vec<Case> {
    let path = golden_dir(set).join("cases.tsv");
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read golden manifest {}: {e}", path.display()));
    let mut cases = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(
            f.len(),
            12,
            "cases.tsv line {}: expected 12 tab-separated columns, got {}",
            lineno + 1,
            f.len()
        );
        let num = |i: usize| -> u64 {
            f[i].parse()
                .unwrap_or_else(|e| panic!("cases.tsv line {} column {}: {:?}: {e}", lineno + 1, i + 1, f[i]))
        };
        cases.push(Case {
            file: f[0].to_string(),
            kind: f[1].to_string(),
            cipher: f[2].to_string(),
            key_hex: f[3].to_string(),
            key_bits: num(4) as usize,
            iv_offset: num(5),
            offset: num(6),
            sector_size: num(7) as u32,
            iv_large_sectors: match f[8] {
                "0" => false,
                "1" => true,
                other => panic!("cases.tsv line {}: iv_large_sectors {other:?}", lineno + 1),
            },
            payload_len: num(9) as usize,
            table: f[10].to_string(),
            sha256: f[11].to_string(),
        });
    }
    assert!(
        !cases.is_empty(),
        "golden manifest {} has no cases: regenerate with testdata/{}/make-golden.sh",
        path.display(),
        set.dir
    );
    assert!(
        cases.len() >= set.min_rows,
        "golden manifest {} has only {} cases (expected at least {}): rows were lost",
        path.display(),
        cases.len(),
        set.min_rows
    );
    cases
}

fn load_image(set: Set, case: &Case) -> Vec<u8> {
    let path = golden_dir(set).join(&case.file);
    if !set.xz {
        return fs::read(&path)
            .unwrap_or_else(|e| panic!("golden image {} is missing or unreadable: {e}", path.display()));
    }
    let xz = path.with_extension("img.xz");
    let out = Command::new("xz")
        .arg("-dc")
        .arg(&xz)
        .output()
        .unwrap_or_else(|e| panic!("running xz -dc {}: {e}", xz.display()));
    assert!(out.status.success(), "xz -dc {}: {}", xz.display(), String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn ciphertext(case: &Case, image: &[u8]) -> Vec<u8> {
    let start = (case.offset * 512) as usize;
    image[start..start + case.payload_len].to_vec()
}

// ---------------------------------------------------------------- comparison helpers

/// `None` if equal, else a description of where and how `got` differs from `want`.
fn describe_mismatch(got: &[u8], want: &[u8], input: &[u8], sector_size: usize) -> Option<String> {
    if got == want {
        return None;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
    let nsec = want.len() / sector_size;
    let bad: Vec<usize> = (0..nsec)
        .filter(|&s| {
            got[s * sector_size..(s + 1) * sector_size] != want[s * sector_size..(s + 1) * sector_size]
        })
        .collect();
    let mut msg = format!(
        "first mismatch at byte {first} (encryption sector {} of {nsec}, byte {} in it); {} of {nsec} sectors differ {:?}",
        first / sector_size,
        first % sector_size,
        bad.len(),
        if bad.len() > 12 { &bad[..12] } else { &bad[..] },
    );
    if got == input {
        msg.push_str("; output == input (cipher did nothing)");
    }
    // Per-sector diagnosis: how much of the first bad sector differs.
    let s = first / sector_size;
    let g = &got[s * sector_size..(s + 1) * sector_size];
    let w = &want[s * sector_size..(s + 1) * sector_size];
    let same16 = g.chunks(16).zip(w.chunks(16)).filter(|(a, b)| a == b).count();
    let _ = write!(msg, "; in that sector {same16}/{} 16-byte blocks match", sector_size / 16);
    let _ = write!(msg, "; got[{first}..+16]={} want={}", hex16(got, first), hex16(want, first));
    Some(msg)
}

fn hex16(data: &[u8], at: usize) -> String {
    hex::encode(&data[at..(at + 16).min(data.len())])
}

type Op = fn(&SectorCipher, u64, &mut [u8]) -> Result<(), sector_crypto::CryptoError>;

fn op_decrypt(c: &SectorCipher, sector: u64, data: &mut [u8]) -> Result<(), sector_crypto::CryptoError> {
    c.decrypt(sector, data)
}

fn op_encrypt(c: &SectorCipher, sector: u64, data: &mut [u8]) -> Result<(), sector_crypto::CryptoError> {
    c.encrypt(sector, data)
}

/// Applies `op` to `input` split into `chunks` (in encryption sectors, applied in the given
/// order); each chunk is passed with its own target-relative 512-byte start sector.
fn apply_chunked(
    cipher: &SectorCipher,
    op: Op,
    input: &[u8],
    sector_size: usize,
    chunks: &[(usize, usize)],
) -> Result<Vec<u8>, String> {
    let mut buf = input.to_vec();
    let step = (sector_size / 512) as u64;
    for &(first, count) in chunks {
        let range = first * sector_size..(first + count) * sector_size;
        op(cipher, first as u64 * step, &mut buf[range])
            .map_err(|e| format!("error at chunk ({first},{count}): {e}"))?;
    }
    Ok(buf)
}

/// The chunkings exercised for a payload of `n` encryption sectors, with a label.
fn chunkings(n: usize) -> Vec<(String, Vec<(usize, usize)>)> {
    let mut v = vec![("whole".to_string(), vec![(0, n)])];
    if n > 1 {
        v.push(("one sector at a time, last first".to_string(), (0..n).rev().map(|i| (i, 1)).collect()));
        v.push(("split 1 + rest (rest starts at sector 1)".to_string(), vec![(1, n - 1), (0, 1)]));
    }
    if n > 3 {
        v.push((
            "split at n/2, odd chunk sizes".to_string(),
            vec![(n / 2, n - n / 2), (1, n / 2 - 1), (0, 1)],
        ));
    }
    v
}

enum Outcome {
    Pass,
    Fail(Vec<String>),
}

fn run_direction(set: Set, cases: &[Case], decrypt: bool) -> Vec<(String, Outcome)> {
    let plain = plaintext(PLAINTEXT_LEN);
    let mut results = Vec::new();
    for case in cases {
        let image = load_image(set, case);
        let ct = ciphertext(case, &image);
        let pt = &plain[..case.payload_len];
        let mut errors = Vec::new();
        let spec: Result<CipherSpec, _> = case.cipher.parse();
        let cipher = spec
            .map_err(|e| format!("CipherSpec::from_str({:?}) failed: {e}", case.cipher))
            .and_then(|spec| {
                SectorCipher::new(&spec, &VolumeKey::new(case.key()), case.params())
                    .map_err(|e| format!("SectorCipher::new failed: {e}"))
            });
        match cipher {
            Err(e) => errors.push(e),
            Ok(cipher) => {
                if cipher.sector_size() != case.sector_size {
                    errors.push(format!(
                        "sector_size() = {}, want {}",
                        cipher.sector_size(),
                        case.sector_size
                    ));
                }
                let ss = case.sector_size as usize;
                let (input, want, op): (&[u8], &[u8], Op) =
                    if decrypt { (&ct, pt, op_decrypt) } else { (pt, &ct, op_encrypt) };
                for (label, chunks) in chunkings(case.payload_len / ss) {
                    match apply_chunked(&cipher, op, input, ss, &chunks) {
                        Err(e) => errors.push(format!("{label}: {e}")),
                        Ok(got) => {
                            if let Some(m) = describe_mismatch(&got, want, input, ss) {
                                errors.push(format!("{label}: {m}"));
                            }
                        }
                    }
                }
            }
        }
        let outcome = if errors.is_empty() { Outcome::Pass } else { Outcome::Fail(errors) };
        results.push((case.name().to_string(), outcome));
    }
    results
}

fn report(what: &str, results: Vec<(String, Outcome)>) {
    let total = results.len();
    let mut summary = String::new();
    let mut failed = Vec::new();
    for (name, outcome) in &results {
        match outcome {
            Outcome::Pass => {
                let _ = writeln!(summary, "PASS {what} {name}");
            }
            Outcome::Fail(errors) => {
                let _ = writeln!(summary, "FAIL {what} {name}");
                for e in errors {
                    let _ = writeln!(summary, "       {e}");
                }
                failed.push(name.clone());
            }
        }
    }
    println!("{summary}");
    println!("{what}: {} of {total} golden cases pass", total - failed.len());
    assert!(
        failed.is_empty(),
        "{what}: {} of {total} kernel golden cases FAIL: {}\n{summary}",
        failed.len(),
        failed.join(", ")
    );
}

// ---------------------------------------------------------------- tests

#[test]
fn plaintext_generator_matches_make_golden() {
    let p = plaintext(PLAINTEXT_LEN);
    assert_eq!(hex::encode(&p[..16]), "14b6d8bc9eba3d141585fffd348feea5");
    assert_eq!(sha256_hex(&p), PLAINTEXT_SHA256);
    // Self-check of the embedded SHA-256 against FIPS 180-4 test vectors.
    assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(
        sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
}

fn check_manifest_and_images(set: Set) {
    let cases = load_manifest(set);
    let mut problems = Vec::new();
    for case in &cases {
        let image = load_image(set, case);
        let sum = sha256_hex(&image);
        if sum != case.sha256 {
            problems.push(format!("{}: sha256 {sum} != manifest {}", case.file, case.sha256));
        }
        let want_len = case.offset as usize * 512 + case.payload_len;
        if image.len() != want_len {
            problems.push(format!(
                "{}: {} bytes, want offset*512+payload = {want_len}",
                case.file,
                image.len()
            ));
        }
        if case.payload_len == 0 || case.payload_len % case.sector_size as usize != 0 {
            problems.push(format!(
                "{}: payload {} not a positive multiple of {}",
                case.file, case.payload_len, case.sector_size
            ));
        }
        let key_len_ok =
            if case.key_hex == "-" { case.key_bits == 0 } else { case.key_hex.len() * 4 == case.key_bits };
        if !key_len_ok {
            problems.push(format!(
                "{}: key_bits {} does not match key {:?}",
                case.file, case.key_bits, case.key_hex
            ));
        }
        if !matches!(case.kind.as_str(), "sector" | "volume") {
            problems.push(format!("{}: unknown kind {:?}", case.file, case.kind));
        }
        // The recorded table line must agree with the other columns.
        let mut opts = Vec::new();
        if case.sector_size != 512 {
            opts.push(format!("sector_size:{}", case.sector_size));
        }
        if case.iv_large_sectors {
            opts.push("iv_large_sectors".to_string());
        }
        let mut table = format!(
            "0 {} crypt {} {} {} /dev/mapper/golden-src {}",
            case.payload_len / 512,
            case.cipher,
            case.key_hex,
            case.iv_offset,
            case.offset
        );
        if !opts.is_empty() {
            let _ = write!(table, " {} {}", opts.len(), opts.join(" "));
        }
        if table != case.table {
            problems.push(format!("{}: table {:?} disagrees with columns {table:?}", case.file, case.table));
        }
    }
    // Every image in the directory is in the manifest, and names are unique.
    let mut listed: Vec<&str> = cases.iter().map(|c| c.file.as_str()).collect();
    listed.sort_unstable();
    let n = listed.len();
    listed.dedup();
    if listed.len() != n {
        problems.push("duplicate file names in cases.tsv".to_string());
    }
    for entry in fs::read_dir(golden_dir(set)).expect("read the golden directory") {
        let name = entry.expect("dir entry").file_name().to_string_lossy().into_owned();
        let name = name.strip_suffix(".xz").unwrap_or(&name).to_string();
        if name.ends_with(".img") && listed.binary_search(&name.as_str()).is_err() {
            problems.push(format!("{name}: image not listed in cases.tsv"));
        }
    }
    assert!(problems.is_empty(), "golden data problems:\n{}", problems.join("\n"));
}

#[test]
fn manifest_and_images_are_intact() {
    check_manifest_and_images(AES_SET);
}

#[test]
fn cipher_manifest_and_images_are_intact() {
    if !skip_without_xz(CIPHERS_SET) {
        check_manifest_and_images(CIPHERS_SET);
    }
}

#[test]
fn kernel_golden_decrypt() {
    let cases = load_manifest(AES_SET);
    report("decrypt", run_direction(AES_SET, &cases, true));
}

#[test]
fn kernel_golden_encrypt() {
    let cases = load_manifest(AES_SET);
    report("encrypt", run_direction(AES_SET, &cases, false));
}

/// Serpent, twofish, camellia, cast5, cast6, blowfish, des3_ede; lrw, ctr, pcbc; keycounts;
/// lmk and tcw: the kernel's images decrypt to the plaintext.
#[test]
fn kernel_golden_ciphers_decrypt() {
    if skip_without_xz(CIPHERS_SET) {
        return;
    }
    let cases = load_manifest(CIPHERS_SET);
    report("decrypt", run_direction(CIPHERS_SET, &cases, true));
}

/// ... and encrypting the plaintext gives the kernel's images byte for byte.
#[test]
fn kernel_golden_ciphers_encrypt() {
    if skip_without_xz(CIPHERS_SET) {
        return;
    }
    let cases = load_manifest(CIPHERS_SET);
    report("encrypt", run_direction(CIPHERS_SET, &cases, false));
}

/// Ciphertext must actually differ from the plaintext (catches an identity "cipher"),
/// except for cipher_null.
#[test]
fn kernel_images_are_really_encrypted() {
    let plain = plaintext(PLAINTEXT_LEN);
    let mut sets = vec![AES_SET];
    if !skip_without_xz(CIPHERS_SET) {
        sets.push(CIPHERS_SET);
    }
    for (set, case) in sets.into_iter().flat_map(|set| load_manifest(set).into_iter().map(move |c| (set, c)))
    {
        let image = load_image(set, &case);
        let ct = ciphertext(&case, &image);
        let is_null = case.cipher.starts_with("cipher_null");
        assert_eq!(ct == plain[..case.payload_len], is_null, "{}: ciphertext vs plaintext", case.file);
    }
}
