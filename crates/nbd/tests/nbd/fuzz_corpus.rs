//! The NBD fuzz targets' inputs on stable, in the ordinary test run:
//!
//! * the seed transcripts in `fuzz/seeds/nbd_session/` are made here
//!   (`SEALDISK_WRITE_SEEDS=1 cargo test -p nbd --test nbd fuzz_corpus::` rewrites them); each is
//!   checked to be what this file generates and to get the answer it was written to get;
//! * every file of `fuzz/seeds/nbd_*` and `fuzz/corpus/nbd_*` (the minimised corpora, with the
//!   inputs of past findings) is replayed through the same function as the fuzz target.

use std::path::{Path, PathBuf};

use nbd::fuzzing::{run_session, DISK_SIZE, MAX_REQUEST};
use nbd::wire::{
    self, cmd, cmd_flag, handshake_flag, info, opt, ChunkHeader, InfoRequest, MetaContextRequest,
    OptionHeader, Request, IHAVEOPT, NBDMAGIC, OPT_REPLY_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Every file of `fuzz/{seeds,corpus}/<target>/`.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for kind in ["seeds", "corpus"] {
        let dir = fuzz_dir().join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_file() {
                let bytes = std::fs::read(&p).unwrap();
                out.push((p, bytes));
            }
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------
// Transcript building blocks

const FIXED: u32 = handshake_flag::FIXED_NEWSTYLE as u32;
const NO_ZEROES: u32 = handshake_flag::NO_ZEROES as u32;

struct T(Vec<u8>);

impl T {
    fn new(client_flags: u32) -> T {
        T(client_flags.to_be_bytes().to_vec())
    }
    fn opt(mut self, option: u32, data: &[u8]) -> T {
        self.0.extend_from_slice(&OptionHeader { option, length: data.len() as u32 }.encode());
        self.0.extend_from_slice(data);
        self
    }
    fn go(self, name: &str, requests: &[u16]) -> T {
        let d = InfoRequest { name: name.as_bytes(), requests: requests.to_vec() }.encode();
        self.opt(opt::GO, &d)
    }
    fn req(mut self, flags: u16, typ: u16, offset: u64, length: u32) -> T {
        // The cookie says what a reply answers: command, length and position.
        let cookie = (u64::from(typ) << 48) | (u64::from(length) << 16) | (self.0.len() as u64 & 0xffff);
        self.0.extend_from_slice(&Request { flags, typ, cookie, offset, length }.encode());
        self
    }
    fn write(self, flags: u16, offset: u64, payload: &[u8]) -> T {
        let mut t = self.req(flags, cmd::WRITE, offset, payload.len() as u32);
        t.0.extend_from_slice(payload);
        t
    }
    fn raw(mut self, b: &[u8]) -> T {
        self.0.extend_from_slice(b);
        self
    }
}

/// The seed transcripts: a name and the client's bytes.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let all_info = [info::EXPORT, info::NAME, info::DESCRIPTION, info::BLOCK_SIZE];
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    vec![
        (
            "go-write-read-flush-disc",
            T::new(FIXED | NO_ZEROES)
                .go("disk", &all_info)
                .write(cmd_flag::FUA, 4096, &pattern)
                .req(0, cmd::READ, 4096, 4096)
                .req(0, cmd::FLUSH, 0, 0)
                .req(0, cmd::DISC, 0, 0)
                .0,
        ),
        (
            "structured-go-all-commands",
            T::new(FIXED | NO_ZEROES)
                .opt(opt::STRUCTURED_REPLY, &[])
                .go("", &[])
                .req(cmd_flag::DF, cmd::READ, 0, 512)
                .req(0, cmd::TRIM, 8192, 8192)
                .req(cmd_flag::NO_HOLE | cmd_flag::FUA, cmd::WRITE_ZEROES, 0, 65536)
                .req(0, cmd::WRITE_ZEROES, DISK_SIZE - 512, 512)
                .req(0, cmd::CACHE, 0, 512)
                .req(0, cmd::BLOCK_STATUS, 0, 512)
                .req(0, 99, 0, 0)
                .req(0, cmd::DISC, 0, 0)
                .0,
        ),
        (
            "info-list-then-export-name",
            T::new(FIXED)
                .opt(opt::LIST, &[])
                .opt(opt::LIST, b"junk")
                .opt(opt::INFO, &InfoRequest { name: b"ro", requests: all_info.to_vec() }.encode())
                .opt(opt::INFO, &InfoRequest { name: b"nope", requests: vec![] }.encode())
                .opt(opt::INFO, &[0, 0, 0, 9, b'd'])
                .opt(opt::STARTTLS, &[])
                .opt(opt::LIST_META_CONTEXT, &[0; 8])
                .opt(opt::SET_META_CONTEXT, &[0; 8])
                .opt(opt::EXTENDED_HEADERS, &[])
                .opt(0x1234_5678, b"unknown")
                .opt(opt::STRUCTURED_REPLY, b"x")
                .opt(opt::EXPORT_NAME, b"disk")
                .req(0, cmd::READ, 0, 4096)
                .0,
        ),
        (
            "read-only-export-refusals",
            T::new(FIXED | NO_ZEROES)
                .go("ro", &[info::BLOCK_SIZE])
                .write(0, 0, &pattern)
                .req(0, cmd::TRIM, 0, 4096)
                .req(0, cmd::WRITE_ZEROES, 0, 4096)
                .req(0, cmd::READ, 512, 512)
                .req(0, cmd::READ, 0, 4096)
                .0,
        ),
        (
            "bad-requests",
            T::new(FIXED | NO_ZEROES)
                .go("disk", &[])
                .req(0, cmd::READ, 0, MAX_REQUEST + 512)
                .req(0, cmd::READ, 0, 32 << 20)
                .req(0, cmd::READ, DISK_SIZE, 512)
                .req(0, cmd::READ, u64::MAX - 511, 512)
                .req(0, cmd::READ, 1, 512)
                .req(0, cmd::READ, 0, 1)
                .req(0x8000, cmd::READ, 0, 512)
                .req(0, cmd::FLUSH, 512, 512)
                .write(0, DISK_SIZE - 512, &pattern)
                .write(0x40, 0, &pattern[..512])
                .req(0, cmd::READ, 0, 512)
                .raw(&[0xde, 0xad, 0xbe, 0xef])
                .raw(&[0; 24])
                .0,
        ),
        (
            "block-status-meta-contexts",
            T::new(FIXED | NO_ZEROES)
                .opt(opt::STRUCTURED_REPLY, &[])
                .opt(opt::LIST_META_CONTEXT, &meta("disk", &[]))
                .opt(opt::LIST_META_CONTEXT, &meta("disk", &["base:", "x-unknown:leaf"]))
                .opt(opt::SET_META_CONTEXT, &meta("nope", &[wire::BASE_ALLOCATION]))
                .opt(opt::SET_META_CONTEXT, &[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff])
                .opt(opt::SET_META_CONTEXT, &meta("disk", &["nocolon"]))
                .opt(opt::SET_META_CONTEXT, &meta("disk", &["base:", wire::BASE_ALLOCATION]))
                .go("disk", &[])
                .req(0, cmd::BLOCK_STATUS, 0, DISK_SIZE as u32)
                .req(cmd_flag::REQ_ONE, cmd::BLOCK_STATUS, 4096, 512)
                .req(0, cmd::BLOCK_STATUS, 0, 0)
                .req(0, cmd::BLOCK_STATUS, DISK_SIZE - 512, 1024)
                .req(0, cmd::BLOCK_STATUS, u64::MAX - 511, 1024)
                .req(0, cmd::BLOCK_STATUS, 0, u32::MAX)
                .req(0, cmd::BLOCK_STATUS, 1, 512)
                .req(cmd_flag::FUA, cmd::BLOCK_STATUS, 0, 512)
                .req(0, cmd::DISC, 0, 0)
                .0,
        ),
        ("handshake-abort", T::new(FIXED | NO_ZEROES).opt(opt::LIST, &[]).opt(opt::ABORT, &[]).0),
        (
            "handshake-oversized-option",
            T::new(FIXED | NO_ZEROES)
                .raw(&IHAVEOPT.to_be_bytes())
                .raw(&opt::GO.to_be_bytes())
                .raw(&(100_000u32).to_be_bytes())
                .raw(&[0; 64])
                .0,
        ),
        ("handshake-bad-flags", T::new(0x80).go("disk", &[]).0),
        ("handshake-old-style", T::new(0).go("disk", &[]).0),
        ("handshake-bad-option-magic", T::new(FIXED).raw(&NBDMAGIC.to_be_bytes()).raw(&[0; 8]).0),
        ("handshake-unknown-export-name", T::new(FIXED).opt(opt::EXPORT_NAME, b"missing").0),
    ]
}

/// `NBD_OPT_{LIST,SET}_META_CONTEXT` data.
fn meta(export: &str, queries: &[&str]) -> Vec<u8> {
    MetaContextRequest { name: export.as_bytes(), queries: queries.iter().map(|q| q.as_bytes()).collect() }
        .encode()
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// Walks the option replies after the greeting until a successful GO/EXPORT_NAME (returns the
/// offset after it) or the end; returns the reply types seen.
fn option_replies(out: &[u8], export_name_no_zeroes: Option<bool>) -> (Vec<(u32, u32)>, usize) {
    let mut at = 18;
    let mut seen = Vec::new();
    while at + 20 <= out.len() && be64(out, at) == OPT_REPLY_MAGIC {
        let (option, typ, len) = (be32(out, at + 8), be32(out, at + 12), be32(out, at + 16) as usize);
        seen.push((option, typ));
        at += 20 + len;
        if option == opt::GO && typ == wire::rep::ACK {
            return (seen, at);
        }
    }
    if let Some(no_zeroes) = export_name_no_zeroes {
        at += 10 + if no_zeroes { 0 } else { 124 };
    }
    (seen, at)
}

/// Simple replies after `at`, as (error, cookie); a successful READ's data is skipped.
fn simple_replies(out: &[u8], mut at: usize) -> Vec<(u32, u64)> {
    let mut seen = Vec::new();
    while at + 16 <= out.len() {
        assert_eq!(be32(out, at), SIMPLE_REPLY_MAGIC, "reply at {at}");
        let (err, cookie) = (be32(out, at + 4), be64(out, at + 8));
        seen.push((err, cookie));
        let read = (cookie >> 48) as u16 == cmd::READ && err == 0;
        at += 16 + if read { (cookie >> 16) as u32 as usize } else { 0 };
    }
    assert_eq!(at, out.len(), "a truncated reply");
    seen
}

/// Seeds of `nbd_wire`: one message of each kind the decoders read.
fn wire_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let info = InfoRequest { name: b"disk", requests: vec![info::NAME, info::BLOCK_SIZE] };
    let chunk = ChunkHeader { flags: 1, typ: 1, cookie: 7, length: 4096 };
    vec![
        ("option-header", OptionHeader { option: opt::GO, length: 12 }.encode().to_vec()),
        (
            "request",
            Request { flags: cmd_flag::FUA, typ: cmd::WRITE, cookie: 1, offset: 512, length: 512 }
                .encode()
                .to_vec(),
        ),
        ("chunk-header", chunk.encode().to_vec()),
        ("info-request", info.encode()),
        ("meta-context-request", meta("disk", &["base:allocation", "base:"])),
    ]
}

#[test]
fn seeds_are_committed_as_generated() {
    let write = std::env::var_os("SEALDISK_WRITE_SEEDS").is_some();
    for (target, seeds) in [("nbd_session", seeds()), ("nbd_wire", wire_seeds())] {
        let dir = fuzz_dir().join("seeds").join(target);
        if write {
            std::fs::create_dir_all(&dir).unwrap();
        }
        check_seeds(&dir, seeds, write);
    }
}

fn check_seeds(dir: &Path, seeds: Vec<(&'static str, Vec<u8>)>, write: bool) {
    for (name, bytes) in seeds {
        let path = dir.join(format!("{name}.bin"));
        if write {
            std::fs::write(&path, &bytes).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(on_disk == bytes, "{} differs from what this test generates", path.display());
    }
}

#[test]
fn seed_transcripts_reach_what_they_were_written_for() {
    let seeds: std::collections::HashMap<_, _> = seeds().into_iter().collect();
    let run = |name: &str| run_session(&seeds[name]).unwrap();

    // A whole session: GO with every info, then WRITE (FUA), READ of the same data, FLUSH.
    let out = run("go-write-read-flush-disc");
    assert_eq!(be64(&out, 0), NBDMAGIC);
    let (opts, at) = option_replies(&out, None);
    assert_eq!(opts.last(), Some(&(opt::GO, wire::rep::ACK)));
    let replies = simple_replies(&out, at);
    assert_eq!(replies.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 0, 0]);
    let read_data_at = out.len() - 16 - 4096;
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(&out[read_data_at..read_data_at + 4096], &pattern[..]);

    // Structured replies: every chunk carries the structured magic.
    let out = run("structured-go-all-commands");
    let (opts, mut at) = option_replies(&out, None);
    assert_eq!(opts[0], (opt::STRUCTURED_REPLY, wire::rep::ACK));
    let mut errors = 0;
    while at < out.len() {
        assert_eq!(be32(&out, at), STRUCTURED_REPLY_MAGIC);
        let typ = u16::from_be_bytes([out[at + 6], out[at + 7]]);
        errors += usize::from(typ & 0x8000 != 0);
        at += 20 + be32(&out, at + 16) as usize;
    }
    assert_eq!(errors, 3, "CACHE, BLOCK_STATUS and an unknown command are refused");

    // Every option answered, then the export chosen by name (no NO_ZEROES: 124 zero bytes).
    let out = run("info-list-then-export-name");
    let (opts, at) = option_replies(&out, Some(false));
    let errs = opts.iter().filter(|(_, t)| t & wire::rep::ERR_BIT != 0).count();
    assert_eq!(errs, 9, "{opts:x?}");
    let replies = simple_replies(&out, at);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].0, 0);

    // The read-only export refuses every write with EPERM and misaligned reads with EINVAL.
    let out = run("read-only-export-refusals");
    let (_, at) = option_replies(&out, None);
    let errs: Vec<u32> = simple_replies(&out, at).iter().map(|r| r.0).collect();
    assert_eq!(errs, [1, 1, 1, 22, 0]);

    // Oversized, out-of-range, misaligned, flagged: refused one by one; then bad magic ends
    // the connection.
    let out = run("bad-requests");
    let (_, at) = option_replies(&out, None);
    let errs: Vec<u32> = simple_replies(&out, at).iter().map(|r| r.0).collect();
    assert_eq!(errs, [22, 22, 22, 22, 22, 22, 22, 22, 28, 22, 0]);

    // Meta contexts: two LISTs and one SET answered with a context, three SETs refused; then
    // two block status chunks and six EINVAL errors.
    let out = run("block-status-meta-contexts");
    let (opts, mut at) = option_replies(&out, None);
    let count = |t: u32| opts.iter().filter(|&&(_, typ)| typ == t).count();
    assert_eq!(count(wire::rep::META_CONTEXT), 3, "{opts:x?}");
    assert_eq!(opts.iter().filter(|(_, t)| t & wire::rep::ERR_BIT != 0).count(), 3, "{opts:x?}");
    let mut chunks = Vec::new();
    while at < out.len() {
        assert_eq!(be32(&out, at), STRUCTURED_REPLY_MAGIC);
        let typ = u16::from_be_bytes([out[at + 6], out[at + 7]]);
        let len = be32(&out, at + 16) as usize;
        chunks.push(if typ & 0x8000 != 0 { be32(&out, at + 20) } else { u32::from(typ) });
        at += 20 + len;
    }
    assert_eq!(chunks, [5, 5, 22, 22, 22, 22, 22, 22], "block status chunks, then EINVAL");

    for name in ["handshake-abort", "handshake-oversized-option"] {
        let out = run(name);
        assert!(!option_replies(&out, None).0.is_empty(), "{name}: no option reply");
    }
    for name in [
        "handshake-bad-flags",
        "handshake-old-style",
        "handshake-bad-option-magic",
        "handshake-unknown-export-name",
    ] {
        assert_eq!(run(name).len(), 18, "{name}: only the greeting, then the server hangs up");
    }
}

#[test]
fn nbd_session_corpus_replays() {
    let all = inputs("nbd_session");
    assert!(all.len() >= seeds().len());
    for (path, bytes) in all {
        let out = run_session(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(be64(&out, 0), NBDMAGIC, "{}", path.display());
    }
}

#[test]
fn nbd_wire_corpus_replays() {
    let all = inputs("nbd_wire");
    assert!(!all.is_empty());
    for (_, bytes) in all {
        nbd::fuzzing::decode_all(&bytes);
    }
}
