//! The server against real clients: libnbd's nbdinfo and nbdcopy, qemu-io, and fio's nbd
//! engine. A missing tool skips its test with a loud message (as nbdkit's `requires`).

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use blockdev::MemDevice;
use common::*;
use nbd::{Export, ServerConfig};

const MIB: u64 = 1 << 20;

fn server_with(name: &str, size: u64, block: u32) -> (TestServer, Arc<MemDevice>) {
    let dev = Arc::new(MemDevice::new(size, block));
    let mut e = Export::new(name, dev.clone());
    e.description = "sealdisk test export".into();
    let mut ro = Export::new("ro", Arc::new(MemDevice::new(MIB, 512)));
    ro.read_only = true;
    (TestServer::start(vec![e, ro]), dev)
}

#[test]
fn nbdinfo_reports_size_block_sizes_and_multi_conn() {
    let Some(nbdinfo) = require("nbdinfo", "nbdinfo_reports_size_block_sizes_and_multi_conn") else { return };
    let (srv, _) = server_with("disk", 8 * MIB, 512);
    let json = check(Command::new(&nbdinfo).arg("--json").arg(srv.uri("disk")), Duration::from_secs(30));
    let squashed: String = json.chars().filter(|c| !c.is_whitespace()).collect();
    for want in [
        "\"export-name\":\"disk\"",
        "\"export-size\":8388608",
        "\"block_size_minimum\":512",
        "\"block_size_preferred\":4096",
        "\"block_size_maximum\":33554432",
        "\"can_multi_conn\":true",
        "\"can_trim\":true",
        "\"can_zero\":true",
        "\"can_fua\":true",
        "\"can_flush\":true",
        "\"is_read_only\":false",
        "\"description\":\"sealdisktestexport\"",
    ] {
        assert!(squashed.contains(want), "nbdinfo --json lacks {want}:\n{json}");
    }
    let json = check(Command::new(&nbdinfo).arg("--json").arg(srv.uri("ro")), Duration::from_secs(30));
    let squashed: String = json.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(squashed.contains("\"is_read_only\":true"), "{json}");

    let list = check(Command::new(&nbdinfo).arg("--list").arg(srv.uri("")), Duration::from_secs(30));
    assert!(list.contains("export=\"disk\"") && list.contains("export=\"ro\""), "{list}");
}

#[test]
fn qemu_io_writes_a_pattern_and_reads_it_back() {
    let Some(qemu_io) = require("qemu-io", "qemu_io_writes_a_pattern_and_reads_it_back") else { return };
    // A 4096-byte-sector device over TCP, to cover the other listener and block size.
    let dev = Arc::new(MemDevice::new(8 * MIB, 4096));
    let srv = TestServer::start_tcp(vec![Export::new("q", dev.clone())], ServerConfig::default());
    {
        let out = check(
            Command::new(&qemu_io).args(["-f", "raw", &srv.uri("q")]).args([
                "-c",
                "write -P 0xab 0 1M",
                "-c",
                "read -P 0xab 0 1M",
                "-c",
                "write -z 1M 64k",
                "-c",
                "read -P 0 1M 64k",
                "-c",
                "flush",
            ]),
            Duration::from_secs(60),
        );
        assert!(!out.contains("Pattern verification failed"), "{out}");
        assert!(out.contains("read 1048576/1048576 bytes at offset 0"), "{out}");
    }
    let data = dev.to_vec();
    assert!(data[..MIB as usize].iter().all(|&b| b == 0xab), "qemu's write reached the device");

    // And the unix socket URI form, on the 512-byte export, with a mismatching pattern that
    // must be noticed (the test can fail).
    let (srv, _) = server_with("disk", 8 * MIB, 512);
    let out = run(
        Command::new(&qemu_io).args(["-f", "raw", &srv.uri("disk")]).args([
            "-c",
            "write -P 0x5a 4096 64k",
            "-c",
            "read -P 0x5b 4096 64k",
        ]),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && stdout.contains("Pattern verification failed"), "{stdout}");
}

#[test]
fn nbdcopy_copies_to_and_from_a_file_over_four_connections() {
    let Some(nbdcopy) = require("nbdcopy", "nbdcopy_copies_to_and_from_a_file_over_four_connections") else {
        return;
    };
    let (srv, dev) = server_with("disk", 16 * MIB, 512);
    let dir = temp_dir("nbdcopy");
    let src = dir.join("src.img");
    let dst = dir.join("dst.img");
    let data = pattern(42, 16 * MIB as usize);
    std::fs::write(&src, &data).unwrap();
    check(
        Command::new(&nbdcopy).args(["-C", "4", "--flush"]).arg(&src).arg(srv.uri("disk")),
        Duration::from_secs(60),
    );
    assert!(dev.to_vec() == data, "the device holds the file");
    check(Command::new(&nbdcopy).args(["-C", "4"]).arg(srv.uri("disk")).arg(&dst), Duration::from_secs(60));
    let back = std::fs::read(&dst).unwrap();
    assert!(back == data, "the copy back matches ({} bytes)", back.len());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fio_random_read_write_verifies() {
    let Some(fio) = require("fio", "fio_random_read_write_verifies") else { return };
    let out = run(Command::new(&fio).arg("--enghelp=nbd"), Duration::from_secs(10));
    if !out.status.success() {
        eprintln!("SKIPPED fio_random_read_write_verifies: this fio has no nbd engine");
        return;
    }
    let (srv, _) = server_with("disk", 32 * MIB, 512);
    // fio leaves verify state files in its working directory.
    let dir = temp_dir("fio");
    let out = check(
        Command::new(&fio).current_dir(&dir).args([
            "--verify_state_save=0",
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", srv.uri("disk")),
            "--rw=randrw",
            "--bs=4k",
            "--size=16M",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--runtime=3",
        ]),
        Duration::from_secs(60),
    );
    assert!(out.contains("err= 0"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}
