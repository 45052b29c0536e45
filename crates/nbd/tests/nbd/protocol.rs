//! The server against a raw client: handshake, transmission, malformed and hostile input,
//! concurrency, shutdown. Every test checks that the server still answers afterwards.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::{Caps, MemDevice, WriteFlags, ZeroFlags};
use common::*;
use nbd::{Export, ListenAddr, Server, ServerConfig};

const MIB: u64 = 1 << 20;

fn one_disk() -> (TestServer, Arc<MemDevice>) {
    let (mut e, dev) = mem_export("disk", 8 * MIB, 512);
    e.description = "test disk".into();
    (TestServer::start(vec![e]), dev)
}

fn test_device_server(dev: TestDevice, config: ServerConfig) -> (TestServer, Arc<TestDevice>) {
    let dev = Arc::new(dev);
    (TestServer::start_with(vec![Export::new("t", dev.clone())], config), dev)
}

// ---------------------------------------------------------------------------------------
// Handshake

#[test]
fn go_reports_size_flags_and_block_sizes() {
    let (srv, _) = one_disk();
    let mut c = srv.connect();
    let info = c.go("disk", false);
    assert_eq!(info.size, 8 * MIB);
    let want = NBD_FLAG_HAS_FLAGS
        | NBD_FLAG_SEND_FLUSH
        | NBD_FLAG_SEND_FUA
        | NBD_FLAG_SEND_TRIM
        | NBD_FLAG_SEND_WRITE_ZEROES
        | NBD_FLAG_CAN_MULTI_CONN;
    assert_eq!(info.flags, want);
    assert_eq!(info.block_sizes, Some((512, 4096, 32 << 20)));
    assert_eq!(info.name.as_deref(), Some("disk"));
    assert_eq!(info.description.as_deref(), Some("test disk"));

    // Structured replies add "don't fragment".
    let mut c = srv.connect();
    let info = c.go("disk", true);
    assert_eq!(info.flags, want | NBD_FLAG_SEND_DF);
}

#[test]
fn rotational_exports_advertise_the_rotational_flag() {
    const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
    let (mut e, _) = mem_export("spinning", MIB, 512);
    e.rotational = true;
    let (flat, _) = mem_export("flat", MIB, 512);
    let srv = TestServer::start(vec![e, flat]);
    let mut c = srv.connect();
    assert_ne!(c.go("spinning", false).flags & NBD_FLAG_ROTATIONAL, 0);
    let mut c = srv.connect();
    assert_eq!(c.go("flat", false).flags & NBD_FLAG_ROTATIONAL, 0);
    // The old-style EXPORT_NAME reply carries the same flags.
    let mut c = srv.connect();
    c.greet(3);
    c.send_option(NBD_OPT_EXPORT_NAME, b"spinning");
    let reply = c.read_exact(10);
    assert_ne!(u16::from_be_bytes([reply[8], reply[9]]) & NBD_FLAG_ROTATIONAL, 0);
}

#[test]
fn block_sizes_follow_the_device_geometry() {
    let dev = Arc::new(MemDevice::new(4 * MIB, 4096));
    let cfg = ServerConfig { max_request: MIB as u32, ..Default::default() };
    let srv = TestServer::start_with(vec![Export::new("big", dev)], cfg);
    let info = srv.connect().go("big", false);
    assert_eq!(info.block_sizes, Some((4096, 4096, MIB as u32)));
}

#[test]
fn export_name_option_enters_transmission_with_and_without_zeroes() {
    let (srv, _) = one_disk();
    for no_zeroes in [true, false] {
        let mut c = srv.connect();
        let server_flags = c.greet(if no_zeroes { 3 } else { 1 });
        assert_eq!(server_flags, 3, "FIXED_NEWSTYLE | NO_ZEROES");
        c.send_option(NBD_OPT_EXPORT_NAME, b"disk");
        let r = c.read_exact(10);
        assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), 8 * MIB);
        if !no_zeroes {
            assert_eq!(c.read_exact(124), vec![0u8; 124]);
        }
        // The stream is in sync: a request is answered.
        assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
    }
}

#[test]
fn export_name_option_with_unknown_name_closes_the_connection() {
    let (srv, _) = one_disk();
    let mut c = srv.connect();
    c.greet(3);
    c.send_option(NBD_OPT_EXPORT_NAME, b"nope");
    assert!(c.is_closed());
    srv.connect().go("disk", false);
}

#[test]
fn empty_name_selects_the_first_export() {
    let (a, _) = mem_export("first", MIB, 512);
    let (b, _) = mem_export("second", 2 * MIB, 512);
    let srv = TestServer::start(vec![a, b]);
    let info = srv.connect().go("", false);
    assert_eq!((info.size, info.name.as_deref()), (MIB, Some("first")));
    let info = srv.connect().go("second", false);
    assert_eq!((info.size, info.name.as_deref()), (2 * MIB, Some("second")));
}

#[test]
fn list_returns_every_export_with_its_description() {
    let (mut a, _) = mem_export("a", MIB, 512);
    a.description = "first one".into();
    let (b, _) = mem_export("bb", MIB, 512);
    let srv = TestServer::start(vec![a, b]);
    let mut c = srv.connect();
    c.greet(3);
    c.send_option(NBD_OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let (opt, typ, data) = c.read_option_reply();
        assert_eq!(opt, NBD_OPT_LIST);
        if typ == NBD_REP_ACK {
            break;
        }
        assert_eq!(typ, NBD_REP_SERVER);
        let n = u32::from_be_bytes(data[..4].try_into().unwrap()) as usize;
        names.push((
            String::from_utf8(data[4..4 + n].to_vec()).unwrap(),
            String::from_utf8(data[4 + n..].to_vec()).unwrap(),
        ));
    }
    assert_eq!(names, vec![("a".into(), "first one".into()), ("bb".into(), String::new())]);
    // LIST with data is invalid.
    c.send_option(NBD_OPT_LIST, b"x");
    assert_eq!(c.read_option_reply().1, NBD_REP_ERR_INVALID);
    c.info_or_go(NBD_OPT_GO, "bb", &[]).unwrap();
    assert!(c.read(0, 512).is_ok());
}

#[test]
fn unsupported_options_get_err_unsup_and_negotiation_goes_on() {
    let (srv, _) = one_disk();
    let mut c = srv.connect();
    c.greet(3);
    // (NBD_OPT_EXTENDED_HEADERS = 11 is not supported either.)
    for opt in [99u32, NBD_OPT_STARTTLS, 11, 0xffff_ffff] {
        c.send_option(opt, b"some data");
        let (o, typ, _) = c.read_option_reply();
        assert_eq!((o, typ), (opt, NBD_REP_ERR_UNSUP));
    }
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    assert!(c.read(0, 4096).is_ok());
}

#[test]
fn go_with_unknown_or_malformed_export_is_refused_and_a_retry_works() {
    let (srv, _) = one_disk();
    let mut c = srv.connect();
    c.greet(3);
    assert_eq!(c.info_or_go(NBD_OPT_GO, "missing", &[]), Err(NBD_REP_ERR_UNKNOWN));
    assert_eq!(c.info_or_go(NBD_OPT_INFO, "missing", &[]), Err(NBD_REP_ERR_UNKNOWN));
    // Name length larger than the data; trailing garbage; too short.
    for bad in [vec![0, 0, 1, 0, b'd'], [RawClient::info_data("disk", &[]), vec![1]].concat(), vec![0, 0]] {
        c.send_option(NBD_OPT_GO, &bad);
        assert_eq!(c.read_option_reply().1, NBD_REP_ERR_INVALID);
    }
    // INFO does not enter transmission; GO afterwards does.
    let info = c.info_or_go(NBD_OPT_INFO, "disk", &[NBD_INFO_BLOCK_SIZE]).unwrap();
    assert_eq!(info.size, 8 * MIB);
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    assert!(c.read(0, 512).is_ok());
}

#[test]
fn oversized_option_data_gets_err_too_big_and_negotiation_goes_on() {
    let (srv, _) = one_disk();
    let mut c = srv.connect();
    c.greet(3);
    c.send_option(NBD_OPT_GO, &vec![7u8; 100 * 1024]);
    assert_eq!(c.read_option_reply().1, NBD_REP_ERR_TOO_BIG);
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    assert!(c.read(0, 512).is_ok());
}

#[test]
fn bad_client_flags_or_option_magic_close_the_connection() {
    let (srv, _) = one_disk();
    let mut c = srv.connect();
    c.greet(1 | 0x80);
    assert!(c.is_closed(), "unknown client flag");
    let mut c = srv.connect();
    c.greet(0);
    assert!(c.is_closed(), "client without fixed newstyle");
    let mut c = srv.connect();
    c.greet(3);
    std::io::Write::write_all(&mut c.s, b"IHAVEOPX\0\0\0\x07\0\0\0\0").unwrap();
    assert!(c.is_closed(), "bad option magic");
    srv.connect().go("disk", false);
}

#[test]
fn abort_is_acknowledged_and_closes() {
    let (srv, _) = one_disk();
    let mut c = srv.connect();
    c.greet(3);
    c.send_option(NBD_OPT_ABORT, &[]);
    assert_eq!(c.read_option_reply(), (NBD_OPT_ABORT, NBD_REP_ACK, vec![]));
    assert!(c.is_closed());
}

// ---------------------------------------------------------------------------------------
// Transmission: the happy path

#[test]
fn writes_read_back_with_simple_and_structured_replies() {
    let (srv, dev) = one_disk();
    for structured in [false, true] {
        let mut c = srv.connect();
        c.go("disk", structured);
        let data = pattern(structured as u64, 64 * 1024);
        let off = if structured { MIB } else { 0 };
        c.write(off, &data, 0).unwrap();
        c.write(off + 64 * 1024, &data[..512], NBD_CMD_FLAG_FUA).unwrap();
        assert_eq!(c.read(off, 64 * 1024).unwrap(), data);
        assert_eq!(c.read(off + 64 * 1024, 512).unwrap(), data[..512]);
        c.cmd(NBD_CMD_FLUSH, 0, 0, 0).unwrap();
        assert_eq!(dev.to_vec()[off as usize..][..64 * 1024], data[..]);
        // Reads of a whole maximum-size request work in one reply.
        assert_eq!(c.read(0, 8 << 20).unwrap().len(), 8 << 20);
    }
}

#[test]
fn zero_length_requests_succeed() {
    let (srv, _) = one_disk();
    for structured in [false, true] {
        let mut c = srv.connect();
        c.go("disk", structured);
        assert_eq!(c.read(4096, 0).unwrap(), Vec::<u8>::new());
        c.write(4096, &[], 0).unwrap();
        c.cmd(NBD_CMD_TRIM, 0, 0, 0).unwrap();
        c.cmd(NBD_CMD_WRITE_ZEROES, 0, 8 * MIB, 0).unwrap();
    }
}

#[test]
fn trim_and_write_zeroes_reach_the_device_with_mapped_flags() {
    let (srv, dev) = test_device_server(TestDevice::new(4 * MIB, 512), ServerConfig::default());
    let mut c = srv.connect();
    c.go("t", false);
    c.write(0, &[0xaa; 8192], 0).unwrap();
    c.cmd(NBD_CMD_WRITE_ZEROES, 0, 0, 4096).unwrap();
    c.cmd(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE, 4096, 4096).unwrap();
    c.cmd(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FUA, 8192, 512).unwrap();
    c.cmd(NBD_CMD_TRIM, 0, MIB, 2 * MIB as u32).unwrap();
    c.cmd(NBD_CMD_TRIM, NBD_CMD_FLAG_FUA, 0, 512).unwrap();
    c.write(0, &[1; 512], NBD_CMD_FLAG_FUA).unwrap();
    c.cmd(NBD_CMD_FLUSH, 0, 0, 0).unwrap();
    assert_eq!(
        dev.calls(),
        vec![
            Call::Write(0, 8192, WriteFlags::empty()),
            Call::Zeroes(0, 4096, ZeroFlags::MAY_UNMAP),
            Call::Zeroes(4096, 4096, ZeroFlags::empty()),
            Call::Zeroes(8192, 512, ZeroFlags::MAY_UNMAP | ZeroFlags::FUA),
            Call::Discard(MIB, 2 * MIB),
            Call::Discard(0, 512),
            Call::Flush,
            Call::Write(0, 512, WriteFlags::FUA),
            Call::Flush,
        ]
    );
    assert_eq!(c.read(0, 8192).unwrap()[512..], [0u8; 8192 - 512][..]);
}

#[test]
fn fua_is_emulated_with_flush_and_caps_narrow_the_flags() {
    // FLUSH but no native FUA: FUA writes become write + flush.
    let mut d = TestDevice::new(MIB, 512);
    d.caps = Caps::FLUSH;
    let (srv, dev) = test_device_server(d, ServerConfig::default());
    let mut c = srv.connect();
    let info = c.go("t", false);
    assert_eq!(
        info.flags & (NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_FLUSH),
        NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_FLUSH
    );
    assert_eq!(info.flags & NBD_FLAG_SEND_TRIM, 0, "no DISCARD, no TRIM");
    c.write(0, &[3; 1024], NBD_CMD_FLAG_FUA).unwrap();
    c.cmd(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FUA, 0, 512).unwrap();
    assert_eq!(c.cmd(NBD_CMD_TRIM, 0, 0, 512), Err(NBD_EINVAL));
    assert_eq!(
        dev.calls(),
        vec![
            Call::Write(0, 1024, WriteFlags::empty()),
            Call::Flush,
            Call::Zeroes(0, 512, ZeroFlags::MAY_UNMAP),
            Call::Flush
        ]
    );

    // No volatile cache at all: neither FLUSH nor FUA is advertised, and both are refused.
    let mut d = TestDevice::new(MIB, 512);
    d.caps = Caps::empty();
    let (srv, dev) = test_device_server(d, ServerConfig::default());
    let mut c = srv.connect();
    let info = c.go("t", false);
    assert_eq!(info.flags & (NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_TRIM), 0);
    assert_ne!(info.flags & NBD_FLAG_SEND_WRITE_ZEROES, 0, "zeroing works on every device");
    assert_eq!(c.cmd(NBD_CMD_FLUSH, 0, 0, 0), Err(NBD_EINVAL));
    assert_eq!(c.write(0, &[1; 512], NBD_CMD_FLAG_FUA), Err(NBD_EINVAL));
    c.cmd(NBD_CMD_WRITE_ZEROES, 0, 0, 512).unwrap();
    assert_eq!(dev.calls(), vec![Call::Zeroes(0, 512, ZeroFlags::MAY_UNMAP)]);
}

// ---------------------------------------------------------------------------------------
// Transmission: invalid requests are answered, and the connection goes on

#[test]
fn out_of_range_requests_get_einval_or_enospc() {
    let (srv, dev) = one_disk();
    for structured in [false, true] {
        let mut c = srv.connect();
        c.go("disk", structured);
        let end = 8 * MIB;
        assert_eq!(c.read(end, 512), Err(NBD_EINVAL));
        assert_eq!(c.read(end - 512, 1024), Err(NBD_EINVAL));
        assert_eq!(c.read(u64::MAX - 511, 1024), Err(NBD_EINVAL), "offset + length overflows");
        assert_eq!(c.write(end - 512, &[9; 1024], 0), Err(NBD_ENOSPC));
        assert_eq!(c.write(u64::MAX - 511, &[9; 1024], 0), Err(NBD_ENOSPC));
        assert_eq!(c.cmd(NBD_CMD_WRITE_ZEROES, 0, end, 512), Err(NBD_ENOSPC));
        assert_eq!(c.cmd(NBD_CMD_TRIM, 0, end - 512, 1024), Err(NBD_EINVAL));
        // The rejected payloads were consumed: the stream is still in sync.
        assert_eq!(c.read(end - 512, 512).unwrap(), vec![0u8; 512]);
    }
    assert!(dev.to_vec().iter().all(|&b| b == 0), "nothing was written");
}

#[test]
fn misaligned_requests_get_einval() {
    let dev = Arc::new(MemDevice::new(MIB, 4096));
    let srv = TestServer::start(vec![Export::new("d", dev.clone())]);
    let mut c = srv.connect();
    c.go("d", false);
    assert_eq!(c.read(512, 4096), Err(NBD_EINVAL));
    assert_eq!(c.read(0, 512), Err(NBD_EINVAL));
    assert_eq!(c.write(100, &[5; 4096], 0), Err(NBD_EINVAL));
    assert_eq!(c.write(0, &[5; 4000], 0), Err(NBD_EINVAL));
    assert_eq!(c.cmd(NBD_CMD_TRIM, 0, 4096, 100), Err(NBD_EINVAL));
    assert_eq!(c.cmd(NBD_CMD_WRITE_ZEROES, 0, 1, 4096), Err(NBD_EINVAL));
    c.write(4096, &[5; 4096], 0).unwrap();
    assert_eq!(c.read(0, 8192).unwrap(), [vec![0; 4096], vec![5; 4096]].concat());
    assert!(dev.to_vec()[8192..].iter().all(|&b| b == 0));
}

#[test]
fn oversized_requests_get_eoverflow_or_einval() {
    let dev = Arc::new(MemDevice::new(8 * MIB, 512));
    let cfg = ServerConfig { max_request: MIB as u32, ..Default::default() };
    let srv = TestServer::start_with(vec![Export::new("d", dev.clone())], cfg);

    let mut c = srv.connect();
    c.go("d", false);
    assert_eq!(c.read(0, 2 * MIB as u32), Err(NBD_EINVAL), "simple replies: no DF, no EOVERFLOW");
    assert_eq!(c.write(0, &vec![1u8; 2 * MIB as usize], 0), Err(NBD_EINVAL));
    // Payload-less commands may exceed the maximum.
    c.cmd(NBD_CMD_WRITE_ZEROES, 0, 0, 4 * MIB as u32).unwrap();
    c.cmd(NBD_CMD_TRIM, 0, 0, 4 * MIB as u32).unwrap();
    assert_eq!(c.read(0, MIB as u32).unwrap(), vec![0u8; MIB as usize]);

    let mut c = srv.connect();
    c.go("d", true);
    assert_eq!(c.read(0, 2 * MIB as u32), Err(NBD_EOVERFLOW));
    assert_eq!(c.read(0, u32::MAX), Err(NBD_EOVERFLOW));
    let r = c.request(NBD_CMD_FLAG_DF, NBD_CMD_READ, 0, 4096, &[]);
    assert_eq!((r.error, r.data.len()), (0, 4096), "DF reads are served in one chunk");
    assert!(dev.to_vec().iter().all(|&b| b == 0));
}

#[test]
fn unknown_commands_and_bad_flags_get_einval() {
    let (srv, _) = one_disk();
    for structured in [false, true] {
        let mut c = srv.connect();
        c.go("disk", structured);
        for typ in [NBD_CMD_CACHE, NBD_CMD_BLOCK_STATUS, 8, 99, 0xffff] {
            assert_eq!(c.cmd(typ, 0, 0, 512), Err(NBD_EINVAL), "command {typ}");
        }
        assert_eq!(c.read(0, 512).err(), None);
        assert_eq!(c.request(NBD_CMD_FLAG_FUA, NBD_CMD_READ, 0, 512, &[]).error, NBD_EINVAL);
        assert_eq!(c.request(NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE, 0, 512, &[0; 512]).error, NBD_EINVAL);
        assert_eq!(c.request(0x8000, NBD_CMD_WRITE_ZEROES, 0, 512, &[]).error, NBD_EINVAL);
        assert_eq!(c.cmd(NBD_CMD_FLUSH, 0, 512, 0), Err(NBD_EINVAL));
        let df = c.request(NBD_CMD_FLAG_DF, NBD_CMD_READ, 0, 512, &[]).error;
        assert_eq!(df, if structured { 0 } else { NBD_EINVAL }, "DF needs structured replies");
        assert!(c.read(0, 512).is_ok());
    }
}

#[test]
fn structured_errors_carry_a_message() {
    let (srv, _) = one_disk();
    let mut c = srv.connect();
    c.go("disk", true);
    let r = c.request(0, NBD_CMD_READ, 8 * MIB, 512, &[]);
    assert!(r.structured);
    assert_eq!(r.error, NBD_EINVAL);
    assert!(r.message.contains("end"), "message: {:?}", r.message);
}

#[test]
fn read_only_exports_refuse_writes_with_eperm() {
    let dev = Arc::new(MemDevice::from_vec(vec![7u8; MIB as usize], 512));
    let mut e = Export::new("ro", dev.clone());
    e.read_only = true;
    let srv = TestServer::start(vec![e]);
    let mut c = srv.connect();
    let info = c.go("ro", false);
    assert_ne!(info.flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(info.flags & (NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FUA), 0);
    assert_eq!(c.write(0, &[1; 4096], 0), Err(NBD_EPERM));
    assert_eq!(c.cmd(NBD_CMD_TRIM, 0, 0, 4096), Err(NBD_EPERM));
    assert_eq!(c.cmd(NBD_CMD_WRITE_ZEROES, 0, 0, 4096), Err(NBD_EPERM));
    assert_eq!(c.read(0, 4096).unwrap(), vec![7u8; 4096]);
    assert!(dev.to_vec().iter().all(|&b| b == 7));

    // A device that is read-only by its caps is exported read-only too.
    let mut d = TestDevice::new(MIB, 512);
    d.caps = Caps::READ_ONLY | Caps::FLUSH;
    let (srv, _) = test_device_server(d, ServerConfig::default());
    let mut c = srv.connect();
    assert_ne!(c.go("t", false).flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(c.write(0, &[1; 512], 0), Err(NBD_EPERM));
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let (srv, _) = one_disk();
    let mut good = srv.connect();
    good.go("disk", false);
    good.write(0, &[1; 512], 0).unwrap();
    let mut bad = srv.connect();
    bad.go("disk", true);
    let mut junk = RawClient::request_bytes(0, NBD_CMD_READ, 1, 0, 512);
    junk[0] = 0xde;
    std::io::Write::write_all(&mut bad.s, &junk).unwrap();
    assert!(bad.is_closed());
    assert_eq!(good.read(0, 512).unwrap(), vec![1; 512]);
    let mut fresh = srv.connect();
    fresh.go("disk", false);
    assert_eq!(fresh.read(0, 512).unwrap(), vec![1; 512]);
}

#[test]
fn client_vanishing_mid_payload_writes_nothing() {
    let (srv, dev) = one_disk();
    let mut c = srv.connect();
    c.go("disk", false);
    c.write(0, &[1; 512], 0).unwrap();
    let mut b = RawClient::request_bytes(0, NBD_CMD_WRITE, 5, 4096, 64 * 1024);
    b.extend_from_slice(&[0xee; 32 * 1024]);
    std::io::Write::write_all(&mut c.s, &b).unwrap();
    drop(c);
    // Give the server time to notice; a server that wrote partial payloads would have now.
    std::thread::sleep(Duration::from_millis(200));
    let mut c = srv.connect();
    c.go("disk", false);
    assert_eq!(c.read(0, 512).unwrap(), vec![1; 512]);
    assert_eq!(c.read(4096, 64 * 1024).unwrap(), vec![0; 64 * 1024]);
    assert!(!dev.to_vec().contains(&0xee));
}

#[test]
fn device_errors_fail_only_their_request() {
    let mut d = TestDevice::new(MIB, 512);
    d.corrupt = Some((8192, 512));
    d.panic_at = Some(65536);
    let (srv, _) = test_device_server(d, ServerConfig::default());
    for structured in [false, true] {
        let mut c = srv.connect();
        c.go("t", structured);
        c.write(0, &[4; 16384], 0).unwrap();
        assert_eq!(c.read(4096, 8192), Err(NBD_EIO), "integrity mismatch is EIO");
        let r = c.request(0, NBD_CMD_READ, 8192, 512, &[]);
        assert_eq!(r.error, NBD_EIO);
        if structured {
            assert!(r.message.contains("integrity"), "message: {:?}", r.message);
        }
        assert_eq!(c.read(0, 8192).unwrap(), vec![4; 8192]);
        assert_eq!(c.read(65536, 512), Err(NBD_EIO), "a panicking device is EIO");
        assert_eq!(c.read(8704, 512).unwrap(), vec![4; 512]);
    }
}

// ---------------------------------------------------------------------------------------
// Concurrency

fn read_req(cookie: u64, offset: u64, len: u32) -> PipelinedRequest {
    PipelinedRequest { flags: 0, typ: NBD_CMD_READ, cookie, offset, len, payload: vec![] }
}

#[test]
fn replies_come_in_completion_order() {
    let mut d = TestDevice::new(MIB, 512);
    d.slow_read = Some((0, Duration::from_millis(400)));
    let (srv, _) = test_device_server(d, ServerConfig::default());
    let mut c = srv.connect();
    c.go("t", true);
    let replies = c.pipeline(vec![read_req(1, 0, 4096), read_req(2, 4096, 4096), read_req(3, 8192, 512)]);
    let order: Vec<u64> = replies.iter().map(|r| r.cookie).collect();
    assert_eq!(order.last(), Some(&1), "the slow read finishes last: {order:?}");
    assert!(replies.iter().all(|r| r.error == 0));
}

#[test]
fn one_thread_per_connection_serialises_requests() {
    let mut d = TestDevice::new(MIB, 512);
    d.slow_read = Some((0, Duration::from_millis(100)));
    let cfg = ServerConfig { threads_per_connection: 1, ..Default::default() };
    let (srv, _) = test_device_server(d, cfg);
    let mut c = srv.connect();
    c.go("t", false);
    let replies = c.pipeline(vec![read_req(1, 0, 4096), read_req(2, 4096, 4096)]);
    assert_eq!(replies.iter().map(|r| r.cookie).collect::<Vec<_>>(), vec![1, 2]);
}

#[test]
fn queue_depth_one_requests_run_on_the_reading_thread() {
    // The fast path (`inline_qd1`): with nothing else in flight, the worker that read a small request runs
    // it itself and keeps the reader, so a QD1 client is served by one thread, with no
    // hand-off (futex wake, thread switch) per request.
    let d = TestDevice::new(MIB, 512);
    let (srv, dev) = test_device_server(d, ServerConfig { inline_qd1: true, ..Default::default() });
    // On a loaded machine one request can take over 200 µs, which turns the fast path off
    // for a while (by design): a fresh connection tries again, a few times; every read must
    // run on one thread in one of them (with the fast path off, the reads move between
    // the connection's workers).
    let mut threads = Vec::new();
    for _ in 0..5 {
        dev.read_threads.lock().unwrap().clear();
        let mut c = srv.connect();
        c.go("t", true);
        for i in 0..64u64 {
            c.write(i * 4096, &pattern(i, 4096), 0).unwrap();
            assert_eq!(c.read(i * 4096, 4096).unwrap(), pattern(i, 4096));
        }
        threads.push(dev.read_threads.lock().unwrap().len());
        if threads.last() == Some(&1) {
            return;
        }
    }
    panic!("QD1 reads ran on more than one thread in every attempt: {threads:?}");
}

/// A server of one 8 MiB disk with `busy_poll` set, and a client connected to it.
fn polling_server(busy_poll: Option<Duration>) -> (TestServer, RawClient) {
    let (e, _) = mem_export("disk", 8 * MIB, 512);
    let srv = TestServer::start_with(vec![e], ServerConfig { busy_poll, ..Default::default() });
    let mut c = srv.connect();
    c.go("disk", true);
    (srv, c)
}

#[test]
fn busy_polling_sees_queue_depth_one_requests_arrive() {
    // A client that sends each request as soon as it has the last reply: the worker waiting
    // for the next request polls the socket (`busy_poll`) and sees it arrive, instead of
    // sleeping in recv. Most polls must see their request (a loaded machine may deschedule
    // the client for longer than a poll now and then).
    let (srv, mut c) = polling_server(Some(Duration::from_millis(5)));
    for i in 0..64u64 {
        c.write(i * 4096, &pattern(i, 4096), 0).unwrap();
        assert_eq!(c.read(i * 4096, 4096).unwrap(), pattern(i, 4096));
    }
    let (hits, misses) = srv.stats.busy_polls();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        // One CPU: polling is off (it would take the CPU from the client).
        assert_eq!((hits, misses), (0, 0));
        return;
    }
    assert!(hits >= 64, "only {hits} of 128 requests were seen by polling ({misses} polls gave up)");
}

#[test]
fn a_client_that_pauses_is_not_polled_for() {
    // Polling pays only when requests come close together: after a wait longer than twice
    // the poll, the connection sleeps in recv until its requests come quickly again. A
    // client pausing 30 ms between requests costs at most one poll that gives up.
    let (srv, mut c) = polling_server(Some(Duration::from_millis(1)));
    for i in 0..8u64 {
        c.write(i * 4096, &pattern(i, 4096), 0).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    let (hits, misses) = srv.stats.busy_polls();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        assert_eq!((hits, misses), (0, 0), "polled on one CPU");
        return;
    }
    assert!(misses <= 1, "{misses} polls gave up on a client pausing 30 ms ({hits} saw a request)");
    // Requests that come quickly again are polled for again.
    for i in 0..32u64 {
        c.write(i * 4096, &pattern(i, 4096), 0).unwrap();
    }
    let (hits_after, _) = srv.stats.busy_polls();
    assert!(hits_after > hits, "polling did not resume once requests came close together");
    // Off: never polls.
    let (off, mut c) = polling_server(None);
    for i in 0..16u64 {
        c.write(i * 4096, &pattern(i, 4096), 0).unwrap();
    }
    assert_eq!(off.stats.busy_polls(), (0, 0));
}

#[test]
fn a_slow_device_turns_the_fast_path_off() {
    // A request read alone runs on the reading thread (the fast path); one that turns out
    // slow must not hold up later requests for long: after it, requests are handed to other
    // workers again, so a fast read sent while a slow one runs is answered first.
    let mut d = TestDevice::new(MIB, 512);
    d.slow_read = Some((0, Duration::from_millis(300)));
    let (srv, _) = test_device_server(d, ServerConfig { inline_qd1: true, ..Default::default() });
    let mut c = srv.connect();
    c.go("t", true);
    assert!(c.read(0, 4096).is_ok());
    c.send(0, NBD_CMD_READ, 1002, 0, 4096, &[]);
    std::thread::sleep(Duration::from_millis(50));
    c.send(0, NBD_CMD_READ, 1003, 8192, 512, &[]);
    let first = c.read_reply();
    let second = c.read_reply();
    assert_eq!((first.cookie, second.cookie), (1003, 1002), "the fast read waited for the slow one");
    assert_eq!((first.error, second.error), (0, 0));
}

#[test]
fn writes_that_arrive_together_run_in_a_batch_until_one_is_slow() {
    // Batches (`inline_batch`, on by default): once a connection's device has been fast,
    // the worker that read a small WRITE runs it itself while the next request has already
    // arrived. So three writes sent in one go run one after another on that worker: the
    // slow first one is answered first (with batches off, it is answered last, as in
    // `replies_come_in_completion_order`). Its slowness then turns batches off, so the
    // same three writes sent again run in parallel.
    let cookies = |replies: &[Reply]| replies.iter().map(|r| r.cookie).collect::<Vec<_>>();
    let write = |cookie: u64, offset: u64| PipelinedRequest {
        flags: 0,
        typ: NBD_CMD_WRITE,
        cookie,
        offset,
        len: 4096,
        payload: pattern(cookie, 4096),
    };
    let three = |c: u64| vec![write(c, 0), write(c + 1, 4096), write(c + 2, 8192)];
    for batches in [true, false] {
        let mut d = TestDevice::new(MIB, 512);
        d.slow_write = Some((0, Duration::from_millis(100)));
        let (srv, _) = test_device_server(d, ServerConfig { inline_batch: batches, ..Default::default() });
        // On a loaded machine a warm-up write can take over 200 µs (which turns batches off
        // for a while) or the three writes can reach the server in two reads: a fresh
        // connection tries again, a few times; batches must show in one of them.
        let mut attempts = 0;
        let (mut c, replies) = loop {
            attempts += 1;
            let mut c = srv.connect();
            c.go("t", true);
            // The warm-up: a connection's first requests never run in a batch.
            for i in 0..80u64 {
                c.write(65536 + i * 4096, &pattern(i, 4096), 0).unwrap();
            }
            let replies = c.pipeline(three(1));
            assert!(replies.iter().all(|r| r.error == 0));
            if !batches || cookies(&replies)[0] == 1 || attempts == 5 {
                break (c, replies);
            }
        };
        if batches {
            assert_eq!(
                cookies(&replies)[0],
                1,
                "the batch did not run the slow write first: {:?}",
                cookies(&replies)
            );
        } else {
            assert_eq!(cookies(&replies)[2], 1, "without batches the slow write is answered last");
        }
        let replies = c.pipeline(three(4));
        assert_eq!(
            cookies(&replies)[2],
            4,
            "after a slow request, requests ran in a batch again (batches={batches})"
        );
        for (i, off) in [(4, 0), (5, 4096), (6, 8192)] {
            assert_eq!(c.read(off, 4096).unwrap(), pattern(i, 4096));
        }
        for i in 0..80u64 {
            assert_eq!(c.read(65536 + i * 4096, 4096).unwrap(), pattern(i, 4096));
        }
    }
}

#[test]
fn a_batch_that_ends_on_the_fast_path_lets_its_replies_out() {
    // A batch holds its replies back until it ends. When its last write finds nothing more
    // buffered and nothing else in flight, the fast path runs it while keeping the reader,
    // and the next read waits for the client: the held replies must have left by then, or
    // client and server wait for each other (a client sending bursts of a few writes, as
    // fio's randwrite at QD32 does, hung this way with both paths on).
    let (e, _) = mem_export("disk", 8 * MIB, 512);
    let srv = TestServer::start_with(
        vec![e],
        ServerConfig { inline_qd1: true, inline_batch: true, ..Default::default() },
    );
    let mut c = srv.connect();
    c.go("disk", true);
    for i in 0..80u64 {
        c.write(i * 4096, &pattern(i, 4096), 0).unwrap();
    }
    for burst in 0..50u64 {
        let reqs = (0..3)
            .map(|k| PipelinedRequest {
                flags: 0,
                typ: NBD_CMD_WRITE,
                cookie: burst * 3 + k,
                offset: (burst * 3 + k) * 4096,
                len: 4096,
                payload: pattern(1000 + burst * 3 + k, 4096),
            })
            .collect();
        let replies = c.pipeline(reqs);
        assert!(replies.iter().all(|r| r.error == 0));
    }
    for i in 0..150u64 {
        assert_eq!(c.read(i * 4096, 4096).unwrap(), pattern(1000 + i, 4096));
    }
}

#[test]
fn many_pipelined_requests_are_all_answered_correctly() {
    let (srv, dev) = one_disk();
    for structured in [false, true] {
        let mut c = srv.connect();
        c.go("disk", structured);
        let n = 512u64;
        let base = if structured { 4 * MIB } else { 0 };
        let writes = (0..n)
            .map(|i| PipelinedRequest {
                flags: if i % 7 == 0 { NBD_CMD_FLAG_FUA } else { 0 },
                typ: NBD_CMD_WRITE,
                cookie: i,
                offset: base + i * 4096,
                len: 4096,
                payload: pattern(i + base, 4096),
            })
            .collect();
        let replies = c.pipeline(writes);
        assert_eq!(replies.len(), n as usize);
        assert!(replies.iter().all(|r| r.error == 0));
        let mut cookies: Vec<u64> = replies.iter().map(|r| r.cookie).collect();
        cookies.sort();
        assert_eq!(cookies, (0..n).collect::<Vec<_>>());

        // Reads mixed with invalid requests, all in flight at once.
        let mut reqs = Vec::new();
        for i in 0..n {
            reqs.push(read_req(1000 + i, base + i * 4096, 4096));
            if i % 50 == 0 {
                reqs.push(read_req(5000 + i, base + 1, 4096)); // misaligned
            }
        }
        for r in c.pipeline(reqs) {
            if r.cookie >= 5000 {
                assert_eq!(r.error, NBD_EINVAL);
            } else {
                let i = r.cookie - 1000;
                assert_eq!(r.error, 0);
                assert_eq!(r.data, pattern(i + base, 4096), "read {i}");
            }
        }
        assert_eq!(dev.to_vec()[base as usize..][..4096], pattern(base, 4096)[..]);
    }
}

#[test]
fn two_clients_at_once_over_unix_and_tcp() {
    let dev = Arc::new(MemDevice::new(8 * MIB, 512));
    let exports = vec![Export::new("d", dev.clone())];
    let unix = TestServer::start(exports.clone());
    let tcp = TestServer::start_tcp(exports, ServerConfig::default());
    let addrs = [unix.addr.clone(), tcp.addr.clone()];
    let threads: Vec<_> = addrs
        .into_iter()
        .enumerate()
        .map(|(k, addr)| {
            std::thread::spawn(move || {
                let mut c = RawClient::connect(&addr);
                c.go("d", k == 1);
                let base = k as u64 * 4 * MIB;
                for i in 0..200u64 {
                    let data = pattern(base + i, 8192);
                    c.write(base + i * 8192, &data, 0).unwrap();
                    assert_eq!(c.read(base + i * 8192, 8192).unwrap(), data);
                }
                c.cmd(NBD_CMD_FLUSH, 0, 0, 0).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let all = dev.to_vec();
    for k in 0..2u64 {
        for i in [0u64, 99, 199] {
            let off = (k * 4 * MIB + i * 8192) as usize;
            assert_eq!(all[off..off + 8192], pattern(k * 4 * MIB + i, 8192)[..]);
        }
    }
}

#[test]
fn tcp_listener_on_port_zero_reports_its_port() {
    let (e, _) = mem_export("d", MIB, 512);
    let srv = TestServer::start_tcp(vec![e], ServerConfig::default());
    let ListenAddr::Tcp(a) = &srv.addr else { panic!("tcp") };
    assert!(!a.ends_with(":0"), "{a}");
    assert!(srv.uri("d").starts_with("nbd://127.0.0.1:"));
    let mut c = srv.connect();
    c.go("d", false);
    assert!(c.read(0, 512).is_ok());
    // Shutdown also ends idle TCP connections (and wakes the TCP accept loop).
    srv.stop().unwrap();
    assert!(c.is_closed());
}

// ---------------------------------------------------------------------------------------
// Disconnect and shutdown

#[test]
fn disc_answers_in_flight_requests_then_closes() {
    let mut d = TestDevice::new(MIB, 512);
    d.slow_read = Some((0, Duration::from_millis(300)));
    let (srv, _) = test_device_server(d, ServerConfig::default());
    let mut c = srv.connect();
    c.go("t", false);
    c.send(0, NBD_CMD_READ, 1, 0, 4096, &[]);
    std::thread::sleep(Duration::from_millis(50));
    c.send(0, NBD_CMD_DISC, 2, 0, 0, &[]);
    let r = c.read_reply();
    assert_eq!((r.cookie, r.error, r.data.len()), (1, 0, 4096));
    assert!(c.is_closed());
    let mut c = srv.connect();
    c.go("t", false);
}

#[test]
fn shutdown_finishes_in_flight_requests_flushes_and_removes_the_socket() {
    let mut d = TestDevice::new(MIB, 512);
    d.slow_read = Some((0, Duration::from_millis(300)));
    let (srv, dev) = test_device_server(d, ServerConfig::default());
    let path = srv.socket_path();
    let mut idle = srv.connect();
    idle.go("t", false);
    let mut handshaking = srv.connect();
    handshaking.greet(3);
    let mut busy = srv.connect();
    busy.go("t", true);
    busy.write(4096, &[8; 512], 0).unwrap();
    busy.send(0, NBD_CMD_READ, 77, 0, 4096, &[]);
    std::thread::sleep(Duration::from_millis(50));
    let flushes_before = dev.flushes.load(Ordering::SeqCst);

    let started = Instant::now();
    let handle = srv.handle.clone();
    let stopper = std::thread::spawn(move || handle.shutdown());
    let r = busy.read_reply();
    assert_eq!((r.cookie, r.error, r.data.len()), (77, 0, 4096), "in-flight read answered");
    assert!(busy.is_closed());
    assert!(idle.is_closed());
    assert!(handshaking.is_closed());
    stopper.join().unwrap();
    srv.stop().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(dev.flushes.load(Ordering::SeqCst) > flushes_before, "devices flushed at shutdown");
    assert!(!path.exists(), "socket file removed");
    assert!(std::os::unix::net::UnixStream::connect(&path).is_err());
}

#[test]
fn shutdown_before_serve_returns_at_once() {
    let dir = temp_dir("early");
    let (e, _) = mem_export("d", MIB, 512);
    let bound = Server::new(vec![e], ServerConfig::default()).bind(&ListenAddr::Unix(dir.join("s"))).unwrap();
    bound.shutdown_handle().shutdown();
    assert!(bound.shutdown_handle().is_shutdown());
    bound.serve().unwrap();
    assert!(!dir.join("s").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn shutdown_wakes_accept_when_the_socket_file_is_gone() {
    // A server whose socket file was removed (its directory cleaned up) cannot be woken by a
    // connection to its address: it used to ignore SIGTERM for ever.
    let dir = temp_dir("gone");
    let (e, _) = mem_export("d", MIB, 512);
    let bound = Server::new(vec![e], ServerConfig::default()).bind(&ListenAddr::Unix(dir.join("s"))).unwrap();
    let stop = bound.shutdown_handle();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(bound.serve()));
    std::thread::sleep(Duration::from_millis(100));
    std::fs::remove_file(dir.join("s")).unwrap();
    stop.shutdown();
    let served = rx.recv_timeout(Duration::from_secs(30)).expect("serve returned after shutdown");
    served.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// A socket bound before the exports exist (the CLI binds before it unlocks a volume):
/// the address is taken at once, a client that connects early waits in the backlog and is
/// greeted once the server is attached and serving, and dropping an unattached socket
/// removes its file.
#[test]
fn a_socket_bound_early_is_served_after_attach() {
    use std::io::Read;
    let dir = temp_dir("early-bind");
    let path = dir.join("s");
    let early = nbd::Listening::bind(&ListenAddr::Unix(path.clone()), 0o600).unwrap();
    assert_eq!(early.local_addr(), &ListenAddr::Unix(path.clone()));
    let again = nbd::Listening::bind(&ListenAddr::Unix(path.clone()), 0o600).unwrap_err();
    assert_eq!(again.kind(), std::io::ErrorKind::AddrInUse);
    drop(early);
    assert!(!path.exists(), "an unattached socket left its file behind");

    let early = nbd::Listening::bind(&ListenAddr::Unix(path.clone()), 0o600).unwrap();
    let mut client = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let (e, _) = mem_export("d", MIB, 512);
    let bound = Server::new(vec![e], ServerConfig::default()).attach(early);
    let handle = bound.shutdown_handle();
    let t = std::thread::spawn(move || bound.serve());
    let mut magic = [0u8; 8];
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    client.read_exact(&mut magic).unwrap();
    assert_eq!(&magic, b"NBDMAGIC");
    drop(client);
    handle.shutdown();
    t.join().unwrap().unwrap();
    assert!(!path.exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn stale_socket_files_are_replaced_and_live_ones_refused() {
    let dir = temp_dir("stale");
    let path = dir.join("s");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let (e, _) = mem_export("d", MIB, 512);
    let server = Server::new(vec![e], ServerConfig::default());
    let bound = server.bind(&ListenAddr::Unix(path.clone())).unwrap();
    let err = server.bind(&ListenAddr::Unix(path.clone())).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    std::fs::write(dir.join("file"), b"not a socket").unwrap();
    assert!(server.bind(&ListenAddr::Unix(dir.join("file"))).is_err());
    assert!(dir.join("file").exists(), "a regular file is never removed");
    drop(bound);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn connections_beyond_the_limit_are_closed() {
    let (e, _) = mem_export("d", MIB, 512);
    let cfg = ServerConfig { max_connections: 1, ..Default::default() };
    let srv = TestServer::start_with(vec![e], cfg);
    let mut first = srv.connect();
    first.go("d", false);
    let mut second = srv.connect();
    assert!(second.is_closed());
    assert!(first.read(0, 512).is_ok());
    drop(first);
    // The slot frees up once the first connection is gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = srv.connect();
        let mut g = [0u8; 8];
        if std::io::Read::read_exact(&mut c.s, &mut g).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "slot never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shutdown_cuts_clients_that_stop_reading_after_the_grace_period() {
    let (e, _) = mem_export("d", 8 * MIB, 512);
    let cfg = ServerConfig { shutdown_grace: Duration::from_millis(300), ..Default::default() };
    let srv = TestServer::start_with(vec![e], cfg);
    let mut c = srv.connect();
    c.go("d", false);
    // 64 MiB of replies that are never read: workers block in writev.
    for i in 0..64u64 {
        c.send(0, NBD_CMD_READ, i, (i % 8) * MIB, MIB as u32, &[]);
    }
    // Another connection floods small reads: the reply queue fills, then pushes back.
    let mut small = srv.connect();
    small.go("d", true);
    let mut flood = Vec::new();
    for i in 0..20_000u64 {
        flood.extend_from_slice(&RawClient::request_bytes(0, NBD_CMD_READ, i, (i % 2048) * 4096, 4096));
    }
    let mut w = small.s.try_clone();
    let flooder = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut w, &flood);
    });
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    srv.stop().unwrap();
    flooder.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    drop(c);
}

/// A tiny deterministic generator, so failures replay.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_requests_never_break_the_server() {
    let (srv, _) = one_disk();
    let mut rng = XorShift(0x5eed_1234_abcd_0001);
    let mut watcher = srv.connect();
    watcher.go("disk", true);
    for round in 0..60 {
        let mut c = srv.connect();
        if round % 3 == 0 {
            // Garbage during negotiation.
            c.greet(3);
            let junk: Vec<u8> = (0..rng.next() % 200).map(|_| rng.next() as u8).collect();
            let _ = std::io::Write::write_all(&mut c.s, &junk);
            drop(c);
            continue;
        }
        c.go("disk", round % 2 == 0);
        // Requests with a valid magic and random fields (biased towards real commands and
        // plausible offsets), then sometimes raw junk.
        let mut bytes = Vec::new();
        for _ in 0..20 {
            let typ = if rng.next() % 4 == 0 { rng.next() as u16 } else { (rng.next() % 8) as u16 };
            let flags = if rng.next() % 2 == 0 { 0 } else { rng.next() as u16 };
            let offset = match rng.next() % 3 {
                0 => rng.next(),
                1 => (rng.next() % 16) * MIB / 2,
                _ => rng.next() % (16 * MIB),
            };
            let len = match rng.next() % 3 {
                0 => rng.next() as u32,
                _ => (rng.next() % 64 * 512) as u32,
            };
            if typ == NBD_CMD_DISC {
                continue;
            }
            bytes.extend_from_slice(&RawClient::request_bytes(flags, typ, rng.next(), offset, len));
            if typ == NBD_CMD_WRITE {
                // Up to the whole payload: a short one leaves the server waiting mid-payload
                // until we close.
                let n = (len as u64).min(rng.next() % (64 * 1024)) as usize;
                bytes.extend((0..n).map(|_| rng.next() as u8));
            }
        }
        if rng.next() % 2 == 0 {
            bytes.extend((0..rng.next() % 100).map(|_| rng.next() as u8));
        }
        let _ = std::io::Write::write_all(&mut c.s, &bytes);
        drop(c);
        // The watcher's connection and fresh connections keep working throughout.
        assert!(watcher.read(0, 4096).is_ok(), "round {round}");
    }
    let mut fresh = srv.connect();
    fresh.go("disk", false);
    fresh.write(0, &[6; 512], 0).unwrap();
    assert_eq!(fresh.read(0, 512).unwrap(), vec![6; 512]);
    srv.stop().unwrap();
}

#[test]
fn api_types_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<nbd::ShutdownHandle>();
    send_sync::<Server>();
    send_sync::<Export>();
    send::<nbd::BoundServer>();
    let h: fn(&nbd::ShutdownHandle) -> nbd::ShutdownHandle = Clone::clone;
    let _ = h;
}
