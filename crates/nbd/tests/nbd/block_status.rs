//! `NBD_CMD_BLOCK_STATUS` with the `base:allocation` metadata context: negotiation
//! (`NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`), replies for a sparse file
//! export, hostile requests, and real clients (nbdinfo --map, qemu-img map, nbdcopy and
//! qemu-img convert) that must skip the holes of a raw export without reading them.

use crate::common;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blockdev::{
    BlockDevice, BlockResult, Caps, Extent, ExtentFlags, FileDevice, FileOptions, Geometry, MemDevice,
    WriteFlags, ZeroFlags,
};
use common::*;
use nbd::wire::{opt, rep, state, MetaContextRequest, BASE_ALLOCATION};
use nbd::Export;

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;
const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
const HZ: u32 = state::HOLE | state::ZERO;

/// A device that counts the bytes read from it (to see which ranges a client skipped).
#[derive(Debug)]
struct Counting<D> {
    inner: D,
    read: AtomicU64,
}

impl<D: BlockDevice> BlockDevice for Counting<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.read.fetch_add(buf.len() as u64, Ordering::SeqCst);
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.inner.write_at(off, buf, flags)
    }
    fn flush(&self) -> BlockResult<()> {
        self.inner.flush()
    }
    fn discard(&self, off: u64, len: u64) -> BlockResult<()> {
        self.inner.discard(off, len)
    }
    fn write_zeroes(&self, off: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.inner.write_zeroes(off, len, flags)
    }
    fn allocation(&self, off: u64, len: u64, max: usize) -> BlockResult<Vec<Extent>> {
        self.inner.allocation(off, len, max)
    }
}

/// A 16 MiB sparse image file (under the target directory: a disk filesystem that reports
/// holes) with data at [1M, 2M) and [8M, 8M+64K), served raw as "raw".
struct Sparse {
    srv: TestServer,
    dev: Arc<Counting<FileDevice>>,
    data: Vec<u8>,
    _dir: tempfile::TempDir,
}

fn sparse_server() -> Sparse {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = FileDevice::create(dir.path().join("raw.img"), 16 * MIB, FileOptions::default()).unwrap();
    let mut data = vec![0u8; (16 * MIB) as usize];
    for (off, len, seed) in [(MIB, MIB, 1), (8 * MIB, 64 * KIB, 2)] {
        let p = pattern(seed, len as usize);
        file.write_at(off, &p, WriteFlags::empty()).unwrap();
        data[off as usize..(off + len) as usize].copy_from_slice(&p);
    }
    let dev = Arc::new(Counting { inner: file, read: AtomicU64::new(0) });
    let srv = TestServer::start(vec![Export::new("raw", dev.clone())]);
    Sparse { srv, dev, data, _dir: dir }
}

/// The filesystem of the target directory reports holes (else the tests that need them
/// skip loudly: a filesystem without SEEK_HOLE makes every file all data, correctly).
fn holes_reported(s: &Sparse, test: &str) -> bool {
    let ok = s.dev.allocation(0, MIB, 4).unwrap()[0].flags.contains(ExtentFlags::HOLE);
    if !ok {
        eprintln!("SKIPPED {test}: the filesystem of {} reports no holes", env!("CARGO_TARGET_TMPDIR"));
    }
    ok
}

fn meta_data(export: &str, queries: &[&str]) -> Vec<u8> {
    MetaContextRequest { name: export.as_bytes(), queries: queries.iter().map(|q| q.as_bytes()).collect() }
        .encode()
}

/// Sends LIST or SET and collects (context id, name) replies up to the ACK, or the error.
fn meta(c: &mut RawClient, option: u32, export: &str, queries: &[&str]) -> Result<Vec<(u32, String)>, u32> {
    c.send_option(option, &meta_data(export, queries));
    let mut out = Vec::new();
    loop {
        let (o, typ, data) = c.read_option_reply();
        assert_eq!(o, option);
        match typ {
            rep::ACK => return Ok(out),
            rep::META_CONTEXT => {
                let id = u32::from_be_bytes(data[..4].try_into().unwrap());
                out.push((id, String::from_utf8(data[4..].to_vec()).unwrap()));
            }
            t if t & rep::ERR_BIT != 0 => return Err(t),
            t => panic!("unexpected reply type {t:#x}"),
        }
    }
}

/// A connection in transmission on `export` with structured replies and base:allocation.
fn connect_with_allocation(srv: &TestServer, export: &str) -> RawClient {
    let mut c = srv.connect();
    c.greet(3);
    c.negotiate_structured();
    let set = meta(&mut c, opt::SET_META_CONTEXT, export, &[BASE_ALLOCATION]).unwrap();
    assert_eq!(set.len(), 1);
    assert_eq!(set[0].1, BASE_ALLOCATION);
    c.info_or_go(NBD_OPT_GO, export, &[]).unwrap();
    c
}

/// BLOCK_STATUS: the context id and the (length, flags) descriptors, or the error.
fn block_status(c: &mut RawClient, flags: u16, offset: u64, len: u32) -> Result<(u32, Vec<(u32, u32)>), u32> {
    let r = c.request(flags, NBD_CMD_BLOCK_STATUS, offset, len, &[]);
    if r.error != 0 {
        return Err(r.error);
    }
    let be = |b: &[u8]| u32::from_be_bytes(b[..4].try_into().unwrap());
    let id = be(&r.data);
    let descs = r.data[4..].chunks_exact(8).map(|d| (be(d), be(&d[4..]))).collect();
    Ok((id, descs))
}

#[test]
fn list_and_set_meta_context_follow_the_spec() {
    let (e, _) = mem_export("disk", MIB, 512);
    let (e2, _) = mem_export("other", MIB, 512);
    let srv = TestServer::start(vec![e, e2]);
    let mut c = srv.connect();
    c.greet(3);
    // Both need structured replies first.
    assert_eq!(meta(&mut c, opt::LIST_META_CONTEXT, "disk", &[]), Err(rep::ERR_INVALID));
    assert_eq!(meta(&mut c, opt::SET_META_CONTEXT, "disk", &[BASE_ALLOCATION]), Err(rep::ERR_INVALID));
    c.negotiate_structured();
    // LIST: no query lists everything; "base:" is a wildcard; other namespaces are ignored.
    let base = vec![(0, BASE_ALLOCATION.to_string())];
    assert_eq!(meta(&mut c, opt::LIST_META_CONTEXT, "disk", &[]), Ok(base.clone()));
    assert_eq!(meta(&mut c, opt::LIST_META_CONTEXT, "disk", &["base:"]), Ok(base.clone()));
    assert_eq!(
        meta(&mut c, opt::LIST_META_CONTEXT, "disk", &["qemu:dirty-bitmap:x", "base:nope"]),
        Ok(vec![])
    );
    assert_eq!(meta(&mut c, opt::LIST_META_CONTEXT, "nope", &[]), Err(rep::ERR_UNKNOWN));
    assert_eq!(meta(&mut c, opt::LIST_META_CONTEXT, "disk", &["nocolon"]), Err(rep::ERR_INVALID));
    // SET: "base:" selects nothing; a malformed request is invalid and clears the selection.
    assert_eq!(meta(&mut c, opt::SET_META_CONTEXT, "disk", &["base:"]), Ok(vec![]));
    assert_eq!(meta(&mut c, opt::SET_META_CONTEXT, "disk", &[]), Ok(vec![]));
    c.send_option(opt::SET_META_CONTEXT, &[0, 0, 0, 4, b'd', b'i', b's', b'k', 0, 0, 0, 1, 0, 0, 0, 9]);
    assert_eq!(c.read_option_reply().1, rep::ERR_INVALID);
    let sel =
        meta(&mut c, opt::SET_META_CONTEXT, "disk", &["x-other:thing", BASE_ALLOCATION, BASE_ALLOCATION]);
    assert_eq!(sel.unwrap().len(), 1, "one context, selected once");
    // Selected for "disk", but the client enters "other": BLOCK_STATUS is refused there.
    c.info_or_go(NBD_OPT_GO, "other", &[]).unwrap();
    assert_eq!(block_status(&mut c, 0, 0, 4096), Err(NBD_EINVAL));
    assert!(c.read(0, 512).is_ok(), "the connection goes on");

    // A selection replaced by a SET that selects nothing leaves no context.
    let mut c = srv.connect();
    c.greet(3);
    c.negotiate_structured();
    meta(&mut c, opt::SET_META_CONTEXT, "disk", &[BASE_ALLOCATION]).unwrap();
    meta(&mut c, opt::SET_META_CONTEXT, "disk", &["base:unknown"]).unwrap();
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    assert_eq!(block_status(&mut c, 0, 0, 4096), Err(NBD_EINVAL));
}

#[test]
fn block_status_reports_the_holes_of_a_raw_file_export() {
    let s = sparse_server();
    if !holes_reported(&s, "block_status_reports_the_holes_of_a_raw_file_export") {
        return;
    }
    let mut c = connect_with_allocation(&s.srv, "raw");
    let mib = MIB as u32;
    let (id, d) = block_status(&mut c, 0, 0, 16 * mib).unwrap();
    assert_eq!(id, 1, "the id SET_META_CONTEXT gave");
    assert_eq!(d, [(mib, HZ), (mib, 0), (6 * mib, HZ), (64 << 10, 0), (8 * mib - (64 << 10), HZ)]);
    // A window, and REQ_ONE: exactly one extent, no longer than asked.
    let (_, d) = block_status(&mut c, 0, 1536 * KIB, mib).unwrap();
    assert_eq!(d, [(512 << 10, 0), (512 << 10, HZ)]);
    let (_, d) = block_status(&mut c, NBD_CMD_FLAG_REQ_ONE, 0, 4 * mib).unwrap();
    assert_eq!(d, [(mib, HZ)]);
    let (_, d) = block_status(&mut c, NBD_CMD_FLAG_REQ_ONE, MIB + 4096, 8192).unwrap();
    assert_eq!(d, [(8192, 0)]);
    // A TRIM punches a hole that the next answer shows.
    assert_eq!(c.cmd(NBD_CMD_TRIM, 0, MIB, mib), Ok(()));
    let (_, d) = block_status(&mut c, 0, 0, 8 * mib).unwrap();
    assert_eq!(d, [(8 * mib, HZ)]);
    assert_eq!(s.dev.read.load(Ordering::SeqCst), 0, "block status reads no data");
}

#[test]
fn hostile_block_status_requests_get_einval_and_the_connection_goes_on() {
    let (e, _) = mem_export("disk", MIB, 512);
    let srv = TestServer::start(vec![e]);
    // Without structured replies or without a context, BLOCK_STATUS is invalid.
    for structured in [false, true] {
        let mut c = srv.connect();
        c.go("disk", structured);
        assert_eq!(block_status(&mut c, 0, 0, 4096), Err(NBD_EINVAL));
        assert!(c.read(0, 512).is_ok());
    }
    let mut c = connect_with_allocation(&srv, "disk");
    for (flags, offset, len, what) in [
        (0, 0, 0, "zero length"),
        (0, MIB, 512, "at the end"),
        (0, MIB - 512, 1024, "across the end"),
        (0, 0, u32::MAX, "4 GiB on a 1 MiB export"),
        (0, u64::MAX - 511, 1024, "offset + length overflows"),
        (0, 100, 512, "misaligned offset"),
        (0, 0, 100, "misaligned length"),
        (NBD_CMD_FLAG_FUA, 0, 512, "FUA is not a BLOCK_STATUS flag"),
        (NBD_CMD_FLAG_DF, 0, 512, "DF is not a BLOCK_STATUS flag"),
        (0x8000, 0, 512, "an unknown flag"),
    ] {
        assert_eq!(block_status(&mut c, flags, offset, len), Err(NBD_EINVAL), "{what}");
    }
    // The default (a memory device): the whole range is one allocated extent.
    assert_eq!(block_status(&mut c, 0, 4096, 8192), Ok((1, vec![(8192, 0)])));
    assert_eq!(block_status(&mut c, NBD_CMD_FLAG_REQ_ONE, 0, MIB as u32), Ok((1, vec![(MIB as u32, 0)])));
}

/// A device whose allocation answer breaks the contract (too long, then empty).
#[derive(Debug)]
struct Liar(MemDevice, bool);

impl BlockDevice for Liar {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> BlockResult<()> {
        self.0.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8], flags: WriteFlags) -> BlockResult<()> {
        self.0.write_at(off, buf, flags)
    }
    fn flush(&self) -> BlockResult<()> {
        self.0.flush()
    }
    fn allocation(&self, _: u64, len: u64, _: usize) -> BlockResult<Vec<Extent>> {
        if self.1 {
            return Ok(Vec::new());
        }
        let hz = ExtentFlags::HOLE | ExtentFlags::ZERO;
        Ok(vec![
            Extent { len: len / 2, flags: hz },
            Extent { len, flags: ExtentFlags::empty() },
            Extent { len: 512, flags: hz },
        ])
    }
}

#[test]
fn a_device_answer_beyond_the_request_is_cut_to_it() {
    let liar = Export::new("l", Arc::new(Liar(MemDevice::new(MIB, 512), false)));
    let empty = Export::new("e", Arc::new(Liar(MemDevice::new(MIB, 512), true)));
    let srv = TestServer::start(vec![liar, empty]);
    let mut c = connect_with_allocation(&srv, "l");
    assert_eq!(block_status(&mut c, 0, 0, 8192), Ok((1, vec![(4096, HZ), (4096, 0)])));
    assert_eq!(block_status(&mut c, NBD_CMD_FLAG_REQ_ONE, 0, 8192), Ok((1, vec![(4096, HZ)])));
    let mut c = connect_with_allocation(&srv, "e");
    assert_eq!(block_status(&mut c, 0, 0, 8192), Err(NBD_EIO), "never an empty chunk");
    assert!(c.read(0, 512).is_ok());
}

// ---- Real clients ----

#[test]
fn nbdinfo_map_shows_holes_and_data() {
    let Some(nbdinfo) = require("nbdinfo", "nbdinfo_map_shows_holes_and_data") else { return };
    let s = sparse_server();
    if !holes_reported(&s, "nbdinfo_map_shows_holes_and_data") {
        return;
    }
    let out = check(Command::new(&nbdinfo).arg("--map").arg(s.srv.uri("raw")), Duration::from_secs(30));
    // nbdinfo prints "offset length type description" per extent.
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    let want: [(u64, u64, u32); 5] = [
        (0, MIB, 3),
        (MIB, MIB, 0),
        (2 * MIB, 6 * MIB, 3),
        (8 * MIB, 64 * KIB, 0),
        (8 * MIB + 64 * KIB, 8 * MIB - 64 * KIB, 3),
    ];
    assert_eq!(rows.len(), want.len(), "{out}");
    for (row, (off, len, typ)) in rows.iter().zip(want) {
        assert_eq!(row[..3], [off.to_string(), len.to_string(), typ.to_string()], "{out}");
    }
    assert!(out.contains("hole,zero") && out.contains("data"), "{out}");
    let list = check(Command::new(&nbdinfo).arg("--json").arg(s.srv.uri("raw")), Duration::from_secs(30));
    assert!(list.contains(BASE_ALLOCATION), "nbdinfo lists the context: {list}");
}

#[test]
fn qemu_img_map_reports_zero_holes() {
    let Some(qemu_img) = require("qemu-img", "qemu_img_map_reports_zero_holes") else { return };
    let s = sparse_server();
    if !holes_reported(&s, "qemu_img_map_reports_zero_holes") {
        return;
    }
    let out = check(
        Command::new(&qemu_img).args(["map", "-f", "raw", "--output=json"]).arg(s.srv.uri("raw")),
        Duration::from_secs(60),
    );
    let squashed: String = out.chars().filter(|c| !c.is_whitespace()).collect();
    for want in [
        "\"start\":0,\"length\":1048576,\"depth\":0,\"present\":true,\"zero\":true,\"data\":false",
        "\"start\":1048576,\"length\":1048576,\"depth\":0,\"present\":true,\"zero\":false,\"data\":true",
        "\"start\":8388608,\"length\":65536,\"depth\":0,\"present\":true,\"zero\":false,\"data\":true",
        "\"start\":8454144,\"length\":8323072,\"depth\":0,\"present\":true,\"zero\":true,\"data\":false",
    ] {
        assert!(squashed.contains(want), "qemu-img map lacks {want}:\n{out}");
    }
}

#[test]
fn nbdcopy_and_qemu_img_convert_skip_the_holes() {
    let s = sparse_server();
    if !holes_reported(&s, "nbdcopy_and_qemu_img_convert_skip_the_holes") {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data_bytes = MIB + 64 * KIB;
    let tools: [(&str, &[&str]); 2] =
        [("nbdcopy", &[]), ("qemu-img", &["convert", "-f", "raw", "-O", "raw"])];
    for (tool, args) in tools {
        let Some(path) = require(tool, "nbdcopy_and_qemu_img_convert_skip_the_holes") else { continue };
        let dst = dir.path().join(format!("{tool}.img"));
        s.dev.read.store(0, Ordering::SeqCst);
        check(Command::new(&path).args(args).arg(s.srv.uri("raw")).arg(&dst), Duration::from_secs(60));
        let read = s.dev.read.load(Ordering::SeqCst);
        assert!(
            (data_bytes..=2 * data_bytes).contains(&read),
            "{tool} read {read} bytes of a 16 MiB export with {data_bytes} bytes of data"
        );
        let copy = std::fs::read(&dst).unwrap();
        assert!(copy == s.data, "{tool}: the copy differs from the export");
    }
}
