//! `instr-bench CASE N`: runs one hot path N times, for `scripts/instr-bench.sh`, which runs
//! it under valgrind (callgrind) with two values of N and takes the difference of the
//! instruction counts divided by the difference of N: the instructions of one operation,
//! without the setup, the same on every run of the same binary (no clock involved).
//!
//! Cases (each through the public API the server uses):
//! * `xts-4k`: one 4096-byte sector encrypted with aes-xts-plain64, 512-bit key.
//! * `aead-4k`: one 4096-byte sector encrypted with gcm(aes)-random (LUKS2 `--integrity
//!   aead`), its tuple written.
//! * `tag-crc32c-4k`, `tag-hmac-sha256-4k`: one dm-integrity tag of a 4096-byte block.
//! * `nbd-read-4k`, `nbd-write-4k`: one NBD request read, decoded, checked, executed on an
//!   in-memory device and answered (structured reply), by the real server code on one
//!   connection (a Unix socket pair, one worker); the script counts the serving thread only.
//! * `journal-commit-4k`: one 4096-byte write through an `IntegrityTarget` in journal mode
//!   (crc32c, 4096-byte blocks) on a memory device, then a flush, which commits it; the
//!   journal holds every commit of the run, and the close copies all of them out (counted
//!   per write): no copy-out depends on when the writer thread runs.
//!
//! Not a wall-clock benchmark: the figure of interest is the instruction count.

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::Arc;

use blockdev::{BlockDevice, MemDevice, WriteFlags};
use formats::integrity::FormatParams;
use nbd::wire::{self, cmd, handshake_flag, opt, InfoRequest, OptionHeader, Request};
use nbd::{Export, Server, ServerConfig};
use sector_crypto::tag::{TagHash, MAX_DIGEST_SIZE};
use sector_crypto::{AeadSectorCipher, AeadSpec, CipherSpec, SectorCipher, SectorParams, VolumeKey};
use targets::integrity::{format, FormatOptions, IntegrityConfig, IntegrityTarget, Mode};

const CASES: &[&str] = &[
    "xts-4k",
    "aead-4k",
    "tag-crc32c-4k",
    "tag-hmac-sha256-4k",
    "nbd-read-4k",
    "nbd-write-4k",
    "journal-commit-4k",
];

const SECTOR: usize = 4096;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 2 && args[1] == "--list" {
        for c in CASES {
            println!("{c}");
        }
        return ExitCode::SUCCESS;
    }
    let (case, n) = match (args.get(1), args.get(2).map(|s| s.parse::<u64>())) {
        (Some(c), Some(Ok(n))) if args.len() == 3 && CASES.contains(&c.as_str()) => (c.as_str(), n),
        _ => {
            eprintln!("usage: instr-bench CASE N | --list\ncases: {}", CASES.join(" "));
            return ExitCode::from(2);
        }
    };
    match run(case, n) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("instr-bench {case}: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn run(case: &str, n: u64) -> Result<()> {
    match case {
        "xts-4k" => xts(n),
        "aead-4k" => aead(n),
        "tag-crc32c-4k" => tag("crc32c", None, n),
        "tag-hmac-sha256-4k" => tag("hmac(sha256)", Some(&[0x4b; 32]), n),
        "nbd-read-4k" => nbd(cmd::READ, n),
        "nbd-write-4k" => nbd(cmd::WRITE, n),
        "journal-commit-4k" => journal(n),
        _ => unreachable!("checked in main"),
    }
}

fn data() -> Vec<u8> {
    (0..SECTOR).map(|i| (i * 7 + 3) as u8).collect()
}

fn xts(n: u64) -> Result<()> {
    let spec: CipherSpec = "aes-xts-plain64".parse()?;
    let key = VolumeKey::new((0..64u8).collect());
    let params = SectorParams { sector_size: 4096, iv_offset: 0, iv_large_sectors: false };
    let c = SectorCipher::new(&spec, &key, params)?;
    let mut buf = data();
    for i in 0..n {
        c.encrypt(black_box(i * 8), black_box(&mut buf[..]))?;
    }
    black_box(&buf);
    Ok(())
}

fn aead(n: u64) -> Result<()> {
    let spec: AeadSpec = "capi:gcm(aes)-random".parse()?;
    let klen = spec.valid_key_sizes().into_iter().max().ok_or("no key size")?;
    let key = VolumeKey::new((0..klen as u8).collect());
    let params = SectorParams { sector_size: 4096, iv_offset: 0, iv_large_sectors: false };
    let c = AeadSectorCipher::new(&spec, &key, params, spec.tuple_size())?;
    let mut buf = data();
    let mut tuple = vec![0u8; c.tuple_size()];
    for i in 0..n {
        c.encrypt(black_box(i * 8), black_box(&mut buf[..]), &mut tuple)?;
    }
    black_box((&buf, &tuple));
    Ok(())
}

fn tag(alg: &str, key: Option<&[u8]>, n: u64) -> Result<()> {
    let h = TagHash::new(alg, key)?;
    let buf = data();
    let salt = [0x5a; 16];
    let mut digest = [0u8; MAX_DIGEST_SIZE];
    for i in 0..n {
        black_box(h.digest(Some(&salt), black_box(i), black_box(&buf), &mut digest));
    }
    black_box(&digest);
    Ok(())
}

/// The client's whole side of a session: handshake (structured replies, `NBD_OPT_GO`), `n`
/// requests of 4 KiB spread over the export, `NBD_CMD_DISC`. At most 250 READs: the session
/// keeps the first MiB of replies.
fn nbd(typ: u16, n: u64) -> Result<()> {
    const SIZE: u64 = 64 << 20;
    let export = Export::new("bench", Arc::new(MemDevice::new(SIZE, 512)));
    // One worker: the request is read, executed and answered on the calling thread.
    // No busy polling: it waits for the client, and its peeks would count as work.
    let config = ServerConfig { threads_per_connection: 1, busy_poll: None, ..ServerConfig::default() };
    let server = Server::new(vec![export], config);

    let mut input = Vec::new();
    let flags = u32::from(handshake_flag::FIXED_NEWSTYLE | handshake_flag::NO_ZEROES);
    input.extend_from_slice(&flags.to_be_bytes());
    input.extend_from_slice(&OptionHeader { option: opt::STRUCTURED_REPLY, length: 0 }.encode());
    let go = InfoRequest { name: b"bench", requests: vec![] }.encode();
    input.extend_from_slice(&OptionHeader { option: opt::GO, length: go.len() as u32 }.encode());
    input.extend_from_slice(&go);
    let payload = data();
    let blocks = SIZE / SECTOR as u64;
    for i in 0..n {
        // A fixed stride through the export (odd, so every block is visited).
        let offset = (i * 4099 % blocks) * SECTOR as u64;
        let req = Request { flags: 0, typ, cookie: i, offset, length: SECTOR as u32 };
        input.extend_from_slice(&req.encode());
        if typ == cmd::WRITE {
            input.extend_from_slice(&payload);
        }
    }
    input.extend_from_slice(&Request { flags: 0, typ: cmd::DISC, cookie: n, offset: 0, length: 0 }.encode());
    let reply = nbd::fuzzing::run_session_with(&server, &input)?;
    // Each answer is a structured chunk: check that all n came back (none an error).
    let per = if typ == cmd::READ { 28 + SECTOR } else { 20 };
    let magic = wire::STRUCTURED_REPLY_MAGIC.to_be_bytes();
    let ok = reply.len() >= n as usize * per
        && reply[reply.len() - n as usize * per..].chunks(per).all(|c| c[..4] == magic && c[4..6] == [0, 1]);
    if !ok {
        return Err(format!("the server did not answer {n} requests as expected").into());
    }
    Ok(())
}

fn journal(n: u64) -> Result<()> {
    // Room for every commit of the run without a copy-out before the close (each flush
    // commits one section): a copy-out by the writer thread would start whenever that thread
    // got scheduled and take whatever was durable by then, so the work per commit would
    // depend on timing. The close copies out all `n` blocks (merged and parallel in the same
    // way for every run), so that cost is counted per write too. The geometry does not
    // depend on `n`: the setup cancels between the two runs.
    const SECTIONS: u32 = 40;
    if n + 2 > u64::from(SECTIONS) {
        return Err(format!("journal-commit-4k runs at most {} writes", SECTIONS - 2).into());
    }
    const DATA: u64 = 16 << 20;
    let mut p = FormatParams::new(4, 4096);
    p.salt = [0x5a; 16];
    let opts = |p: FormatParams| FormatOptions {
        params: p,
        start: 0,
        buffer_sectors: 128,
        sectors_per_bit: None,
        journal_mac: None,
        journal_crypt: None,
    };
    // The section size for this tag and block size, from a throwaway format.
    let (_, probe) = format(&MemDevice::new(DATA, 512), &opts(p.clone()))?;
    let section_sectors = probe.journal.section_sectors;
    p.journal_sectors = Some(section_sectors * SECTIONS);
    let size = DATA + u64::from(section_sectors * SECTIONS) * 512 + (4 << 20);
    let dev = Arc::new(MemDevice::new(size, 512));
    let (_, layout) = format(&*dev, &opts(p))?;
    if layout.journal_sections < SECTIONS {
        return Err(format!(
            "journal-commit-4k: {} journal sections, not {SECTIONS}",
            layout.journal_sections
        )
        .into());
    }
    let hash = || TagHash::new("crc32c", None);
    let mut cfg = IntegrityConfig::new(Mode::Journal, Some(hash()?));
    cfg.block_size = 4096;
    // No commit timer: every commit is the flush below; the writer thread copies out only a
    // full journal, which this run never fills.
    cfg.commit_time_ms = 0;
    cfg.journal_watermark = 100;
    cfg.bitmap_flush_interval_ms = 0;
    // Commits and copy-outs write from the thread that runs them: an I/O thread pool's idle
    // workers steal and spin as often as the scheduler lets them, which callgrind counts.
    cfg.journal_io_threads = 1;
    let t = IntegrityTarget::open(dev, cfg)?;
    let blocks = t.geometry().size / SECTOR as u64;
    let mut buf = data();
    for i in 0..n {
        buf[0] = i as u8;
        t.write_at((i * 4099 % blocks) * SECTOR as u64, &buf, WriteFlags::empty())?;
        t.flush()?;
    }
    t.close()?;
    Ok(())
}
