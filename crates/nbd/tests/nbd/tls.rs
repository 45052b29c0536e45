//! NBD over TLS: the policy (`--tls=on|require`), x509 with and without client
//! verification, TLS-PSK, and attacks (plaintext clients against `require`, clients without
//! or with the wrong credentials, a client that gives up mid-handshake), first with a raw
//! client on OpenSSL, then with the real GnuTLS clients: libnbd's nbdinfo/nbdcopy and qemu.
//! A missing tool skips its test loudly.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use blockdev::{BlockDevice, MemDevice};
use common::certs::{make_pki, Pki};
use common::*;
use nbd::{Export, TlsConfig};
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};

const MIB: u64 = 1 << 20;

fn export(name: &str) -> (Export, Arc<MemDevice>) {
    mem_export(name, 16 * MIB, 512)
}

/// An OpenSSL client that trusts the test CA and presents `client` (cert, key) if given.
fn x509_connector(pki: &Pki, client: Option<&common::certs::Issued>) -> SslConnector {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.cert_store_mut().add_cert(pki.ca.cert.clone()).unwrap();
    b.set_verify(SslVerifyMode::PEER);
    if let Some(c) = client {
        b.set_certificate(&c.cert).unwrap();
        b.set_private_key(&c.key).unwrap();
    }
    b.build()
}

/// An OpenSSL PSK client with `identity` and `key`.
fn psk_connector(identity: &'static str, key: &'static [u8]) -> SslConnector {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_cipher_list("PSK:ECDHEPSK:DHEPSK").unwrap();
    b.set_psk_client_callback(move |_ssl, _hint, id, psk| {
        id[..identity.len()].copy_from_slice(identity.as_bytes());
        id[identity.len()] = 0;
        psk[..key.len()].copy_from_slice(key);
        Ok(key.len())
    });
    b.build()
}

const PSK_KEY: &[u8] = &[
    0x8d, 0x1b, 0x5c, 0x2f, 0x61, 0x0e, 0x9a, 0x44, 0x73, 0xc8, 0x05, 0xbe, 0x31, 0x97, 0xd2, 0x6a, 0x0f,
    0xe4, 0x58, 0x22, 0xab, 0x91, 0x3c, 0x76, 0xe0, 0x19, 0x4d, 0xb7, 0x68, 0x2e, 0xf5, 0x03,
];

fn psk_file(dir: &Path) -> PathBuf {
    let p = dir.join("keys.psk");
    std::fs::write(&p, format!("bob:00112233445566778899aabbccddeeff\nalice:{}\n", hex(PSK_KEY))).unwrap();
    p
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Sends a request and reports whether the connection died instead of answering.
fn go_fails(c: &mut RawClient) -> bool {
    let mut b = b"IHAVEOPT".to_vec();
    let data = RawClient::info_data("disk", &[]);
    b.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(&data);
    c.s.write_all(&b).is_err() || c.is_closed()
}

#[test]
fn require_refuses_every_option_before_starttls_and_export_name_ends_the_connection() {
    let dir = temp_dir("pki");
    let pki = make_pki(&dir);
    let (e, dev) = export("disk");
    dev.write_at(0, &[0x5a; 4096], blockdev::WriteFlags::empty()).unwrap();
    let srv =
        TestServer::start_tls(vec![e], TlsConfig::x509(&pki.server, false).unwrap().required(true), false);

    let mut c = srv.connect();
    c.greet(3);
    for (opt, data) in [
        (NBD_OPT_LIST, vec![]),
        (NBD_OPT_STRUCTURED_REPLY, vec![]),
        (NBD_OPT_INFO, RawClient::info_data("disk", &[])),
        (NBD_OPT_GO, RawClient::info_data("disk", &[])),
        (NBD_OPT_SET_META_CONTEXT, vec![0; 8]),
    ] {
        c.send_option(opt, &data);
        let (o, typ, msg) = c.read_option_reply();
        assert_eq!((o, typ), (opt, NBD_REP_ERR_TLS_REQD), "option {opt}: {}", String::from_utf8_lossy(&msg));
    }
    // NBD_OPT_EXPORT_NAME has no error reply: the connection ends, no export data is sent.
    c.send_option(NBD_OPT_EXPORT_NAME, b"disk");
    assert!(c.is_closed(), "EXPORT_NAME without TLS must end the connection");

    // The same client with TLS is served; a structured reply negotiated in plaintext was
    // refused, and one negotiated inside TLS is honoured.
    let mut c = srv.connect();
    c.greet(3);
    c.starttls(&x509_connector(&pki, None)).unwrap();
    c.negotiate_structured();
    let info = c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    assert_eq!(info.size, 16 * MIB);
    assert_eq!(c.read(0, 4096).unwrap(), vec![0x5a; 4096]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tls_on_serves_plain_and_tls_clients_and_starttls_forgets_earlier_options() {
    let dir = temp_dir("pki");
    let pki = make_pki(&dir);
    let (e, dev) = export("disk");
    let srv = TestServer::start_tls(vec![e], TlsConfig::x509(&pki.server, false).unwrap(), true);

    let mut plain = srv.connect();
    plain.go("disk", false);
    plain.write(0, &[1; 512], 0).unwrap();

    let mut c = srv.connect();
    c.greet(3);
    c.negotiate_structured(); // before TLS: to be forgotten
    c.starttls(&x509_connector(&pki, None)).unwrap();
    // STARTTLS again inside TLS is invalid, and the session goes on.
    c.send_option(NBD_OPT_STARTTLS, &[]);
    let (_, typ, _) = c.read_option_reply();
    assert_eq!(typ, NBD_REP_ERR_INVALID);
    c.structured = false;
    let info = c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    assert_eq!(info.flags & NBD_FLAG_SEND_DF, 0, "structured replies were negotiated before TLS only");
    assert_eq!(c.read(0, 512).unwrap(), vec![1; 512]);

    // Several large requests in flight through the pump, both ways.
    let data = pattern(7, 8 * MIB as usize);
    let mut cookies = Vec::new();
    for (i, chunk) in data.chunks(MIB as usize).enumerate() {
        let cookie = c.cookie();
        c.send(0, NBD_CMD_WRITE, cookie, i as u64 * MIB, MIB as u32, chunk);
        cookies.push(cookie);
    }
    for _ in &cookies {
        assert_eq!(c.read_reply().error, 0);
    }
    for i in 0..8u64 {
        let cookie = c.cookie();
        c.send(0, NBD_CMD_READ, cookie, i * MIB, MIB as u32, &[]);
    }
    let mut back = vec![Vec::new(); 8];
    for _ in 0..8 {
        let r = c.read_reply();
        assert_eq!(r.error, 0);
        back[(r.cookie - cookies[0] - 8) as usize] = r.data;
    }
    assert!(back.concat() == data, "data read back through TLS");
    assert!(dev.to_vec()[..8 * MIB as usize] == data[..], "data reached the device");
    let cookie = c.cookie();
    c.send(0, NBD_CMD_DISC, cookie, 0, 0, &[]);
    assert!(c.is_closed(), "NBD_CMD_DISC closes the TLS connection");
    srv.stop().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn starttls_without_tls_configured_is_unsupported() {
    let (e, _) = export("disk");
    let srv = TestServer::start(vec![e]);
    let mut c = srv.connect();
    c.greet(3);
    c.send_option(NBD_OPT_STARTTLS, &[]);
    let (_, typ, _) = c.read_option_reply();
    assert_eq!(typ, NBD_REP_ERR_UNSUP);
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
}

#[test]
fn verify_peer_refuses_clients_without_a_certificate_from_the_ca() {
    let dir = temp_dir("pki");
    let pki = make_pki(&dir);
    let (e, dev) = export("disk");
    dev.write_at(0, &[0x77; 512], blockdev::WriteFlags::empty()).unwrap();
    let srv =
        TestServer::start_tls(vec![e], TlsConfig::x509(&pki.server, true).unwrap().required(true), true);

    for (what, client) in [("no certificate", None), ("a rogue CA's certificate", Some(&pki.rogue_client))] {
        let mut c = srv.connect();
        c.greet(3);
        let refused = match c.starttls(&x509_connector(&pki, client)) {
            Err(_) => true,
            // TLS 1.3: the client's side finished; the server's alert arrives next.
            Ok(()) => go_fails(&mut c),
        };
        assert!(refused, "a client with {what} was served");
    }

    let mut c = srv.connect();
    c.greet(3);
    c.starttls(&x509_connector(&pki, Some(&pki.good_client))).unwrap();
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    assert_eq!(c.read(0, 512).unwrap(), vec![0x77; 512]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn psk_refuses_a_wrong_key_or_unknown_identity_and_serves_the_right_one() {
    let dir = temp_dir("psk");
    let srv = {
        let (e, _) = export("disk");
        TestServer::start_tls(vec![e], TlsConfig::psk(&psk_file(&dir)).unwrap().required(true), false)
    };
    static WRONG: [u8; 32] = [0x11; 32];
    for (what, conn) in [
        ("a wrong key", psk_connector("alice", &WRONG)),
        ("an unknown identity", psk_connector("mallory", PSK_KEY)),
    ] {
        let mut c = srv.connect();
        c.greet(3);
        let refused = match c.starttls(&conn) {
            Err(_) => true,
            Ok(()) => go_fails(&mut c),
        };
        assert!(refused, "a client with {what} was served");
    }
    let mut c = srv.connect();
    c.greet(3);
    c.starttls(&psk_connector("alice", PSK_KEY)).unwrap();
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    c.write(4096, &[9; 4096], 0).unwrap();
    assert_eq!(c.read(4096, 4096).unwrap(), vec![9; 4096]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn clients_abandoning_the_tls_handshake_do_not_hurt_the_server() {
    let dir = temp_dir("pki");
    let pki = make_pki(&dir);
    let (e, _) = export("disk");
    let srv =
        TestServer::start_tls(vec![e], TlsConfig::x509(&pki.server, false).unwrap().required(true), true);
    // Garbage instead of a ClientHello; half a ClientHello then a hang-up; a hang-up right
    // after the ACK; bytes sent ahead of the ACK.
    let hello_start: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
    for junk in [&b"GET / HTTP/1.0\r\n\r\n"[..], hello_start, &[]] {
        let mut c = srv.connect();
        c.greet(3);
        c.send_option(NBD_OPT_STARTTLS, &[]);
        let (_, typ, _) = c.read_option_reply();
        assert_eq!(typ, NBD_REP_ACK);
        c.s.write_all(junk).unwrap();
        if junk.len() > 12 {
            assert!(c.is_closed(), "the server gave up on garbage");
        }
    }
    let mut c = srv.connect();
    c.greet(3);
    let mut ahead = Vec::new();
    for part in [&b"IHAVEOPT"[..], &NBD_OPT_STARTTLS.to_be_bytes(), &0u32.to_be_bytes(), hello_start] {
        ahead.extend_from_slice(part);
    }
    c.s.write_all(&ahead).unwrap();
    assert!(c.is_closed() || c.is_closed(), "data sent ahead of the STARTTLS ACK ends the connection");

    // A good client is still served, and the server stops cleanly.
    let mut c = srv.connect();
    c.greet(3);
    c.starttls(&x509_connector(&pki, None)).unwrap();
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    c.write(0, &[3; 512], 0).unwrap();
    assert_eq!(c.read(0, 512).unwrap(), vec![3; 512]);
    srv.stop().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_client_certificate_revoked_by_ca_crl_pem_is_refused() {
    let Some(certtool) = require("certtool", "a_client_certificate_revoked_by_ca_crl_pem_is_refused") else {
        return;
    };
    let dir = temp_dir("crl");
    let pki = make_pki(&dir);
    let other_client = common::certs::issue("other client", common::certs::Role::Client, Some(&pki.ca));
    // The CA revokes the good client's certificate (certtool from gnutls-bin writes the CRL).
    let ca_dir = dir.join("ca");
    std::fs::create_dir_all(&ca_dir).unwrap();
    common::certs::write(&ca_dir, "ca", &pki.ca);
    common::certs::write(&ca_dir, "revoked", &pki.good_client);
    std::fs::write(ca_dir.join("crl.tmpl"), "crl_next_update = 7\ncrl_number = 1\n").unwrap();
    check(
        Command::new(&certtool)
            .arg("--generate-crl")
            .arg("--load-ca-privkey")
            .arg(ca_dir.join("ca-key.pem"))
            .arg("--load-ca-certificate")
            .arg(ca_dir.join("ca-cert.pem"))
            .arg("--load-certificate")
            .arg(ca_dir.join("revoked-cert.pem"))
            .arg("--template")
            .arg(ca_dir.join("crl.tmpl"))
            .arg("--outfile")
            .arg(pki.server.join("ca-crl.pem")),
    );
    let (e, _) = export("disk");
    let srv =
        TestServer::start_tls(vec![e], TlsConfig::x509(&pki.server, true).unwrap().required(true), false);
    let mut c = srv.connect();
    c.greet(3);
    let refused = match c.starttls(&x509_connector(&pki, Some(&pki.good_client))) {
        Err(_) => true,
        Ok(()) => go_fails(&mut c),
    };
    assert!(refused, "a revoked client certificate was accepted");
    let mut c = srv.connect();
    c.greet(3);
    c.starttls(&x509_connector(&pki, Some(&other_client))).unwrap();
    c.info_or_go(NBD_OPT_GO, "disk", &[]).unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn credentials_that_do_not_load_are_clear_errors() {
    let dir = temp_dir("badpki");
    let err = TlsConfig::x509(&dir, false).unwrap_err().to_string();
    assert!(err.contains("server-cert.pem"), "{err}");
    let pki = make_pki(&dir);
    // verify-peer without ca-cert.pem
    std::fs::remove_file(pki.server.join("ca-cert.pem")).unwrap();
    let err = TlsConfig::x509(&pki.server, true).unwrap_err().to_string();
    assert!(err.contains("ca-cert.pem"), "{err}");
    // A key that is not the certificate's.
    std::fs::copy(pki.client.join("client-key.pem"), pki.server.join("server-key.pem")).unwrap();
    let err = TlsConfig::x509(&pki.server, false).unwrap_err().to_string();
    assert!(err.contains("does not match"), "{err}");
    let psk = dir.join("bad.psk");
    std::fs::write(&psk, "alice:nothex\n").unwrap();
    let err = TlsConfig::psk(&psk).unwrap_err().to_string();
    assert!(err.contains("line 1") && !err.contains("nothex"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

// ---- Real clients: libnbd (GnuTLS) and qemu (GnuTLS). ----

/// A client command that must succeed within a minute; its stdout.
fn check(cmd: &mut Command) -> String {
    common::check(cmd, Duration::from_secs(60))
}

fn fails(cmd: &mut Command) -> String {
    let out = run(cmd, Duration::from_secs(60));
    assert!(
        !out.status.success(),
        "{cmd:?} succeeded but must be refused:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `nbds+unix://` or `nbds://` for `srv` with extra query parameters.
fn tls_uri(srv: &TestServer, export: &str, query: &str) -> String {
    tls_uri_as(srv, "", export, query)
}

/// The same with a user (libnbd's TLS-PSK identity; libnbd asks getlogin_r without one,
/// which fails without a login terminal).
fn tls_uri_as(srv: &TestServer, user: &str, export: &str, query: &str) -> String {
    let plain = srv.uri(export);
    let user = if user.is_empty() { String::new() } else { format!("{user}@") };
    let tls = plain.replacen("nbd+unix://", &format!("nbds+unix://{user}"), 1).replacen(
        "nbd://",
        &format!("nbds://{user}"),
        1,
    );
    let sep = if tls.contains('?') { '&' } else { '?' };
    format!("{tls}{sep}{query}")
}

#[test]
fn libnbd_x509_with_client_certificates_over_unix_and_tcp() {
    let test = "libnbd_x509_with_client_certificates_over_unix_and_tcp";
    let (Some(nbdinfo), Some(nbdcopy)) = (require("nbdinfo", test), require("nbdcopy", test)) else { return };
    let dir = temp_dir("pki");
    let pki = make_pki(&dir);
    let certs = |d: &Path| format!("tls-certificates={}", d.display());
    for tcp in [false, true] {
        let (e, dev) = export("disk");
        let srv =
            TestServer::start_tls(vec![e], TlsConfig::x509(&pki.server, true).unwrap().required(true), tcp);
        let json =
            check(Command::new(&nbdinfo).arg("--json").arg(tls_uri(&srv, "disk", &certs(&pki.client))));
        assert!(json.contains("16777216"), "{json}");

        let src = dir.join("src.img");
        let back = dir.join("back.img");
        let data = pattern(tcp as u64 + 1, 4 * MIB as usize);
        std::fs::write(&src, &data).unwrap();
        check(Command::new(&nbdcopy).arg("--flush").arg(&src).arg(tls_uri(
            &srv,
            "disk",
            &certs(&pki.client),
        )));
        assert!(dev.to_vec()[..data.len()] == data[..], "nbdcopy's data reached the device (tcp: {tcp})");
        let _ = std::fs::remove_file(&back);
        check(Command::new(&nbdcopy).arg(tls_uri(&srv, "disk", &certs(&pki.client))).arg(&back));
        assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "read back through TLS");

        // Attacks: no client certificate, a rogue one, and plaintext.
        fails(Command::new(&nbdinfo).arg(tls_uri(&srv, "disk", &certs(&pki.anonymous))));
        fails(Command::new(&nbdinfo).arg(tls_uri(&srv, "disk", &certs(&pki.rogue))));
        fails(Command::new(&nbdinfo).arg(srv.uri("disk")));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn libnbd_psk_reads_and_writes_and_a_wrong_key_is_refused() {
    let test = "libnbd_psk_reads_and_writes_and_a_wrong_key_is_refused";
    let (Some(nbdinfo), Some(nbdcopy)) = (require("nbdinfo", test), require("nbdcopy", test)) else { return };
    let dir = temp_dir("psk");
    let keys = psk_file(&dir);
    let wrong = dir.join("wrong.psk");
    std::fs::write(&wrong, format!("alice:{}\n", hex(&[0x42; 32]))).unwrap();
    for tcp in [false, true] {
        let (e, dev) = export("disk");
        let srv = TestServer::start_tls(vec![e], TlsConfig::psk(&keys).unwrap().required(true), tcp);
        let q = |f: &Path| format!("tls-psk-file={}", f.display());
        let src = dir.join("src.img");
        let data = pattern(9 + tcp as u64, 2 * MIB as usize);
        std::fs::write(&src, &data).unwrap();
        check(Command::new(&nbdcopy).arg("--flush").arg(&src).arg(tls_uri_as(
            &srv,
            "alice",
            "disk",
            &q(&keys),
        )));
        assert!(dev.to_vec()[..data.len()] == data[..]);
        let back = dir.join("back.img");
        let _ = std::fs::remove_file(&back);
        check(Command::new(&nbdcopy).arg(tls_uri_as(&srv, "alice", "disk", &q(&keys))).arg(&back));
        assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..]);
        fails(Command::new(&nbdinfo).arg(tls_uri_as(&srv, "alice", "disk", &q(&wrong))));
        fails(Command::new(&nbdinfo).arg(tls_uri_as(&srv, "mallory", "disk", &q(&keys))));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// qemu-io against `srv` through a `--object` TLS credential.
fn qemu_io(qemu_io: &Path, srv: &TestServer, object: &str, cmds: &[&str]) -> Command {
    let server = match &srv.addr {
        nbd::ListenAddr::Unix(p) => format!("file.server.type=unix,file.server.path={}", p.display()),
        nbd::ListenAddr::Tcp(a) => {
            let (host, port) = a.rsplit_once(':').unwrap();
            format!("file.server.type=inet,file.server.host={host},file.server.port={port}")
        }
    };
    let mut c = Command::new(qemu_io);
    c.args(["--object", object, "--image-opts"]).arg(format!(
        "driver=raw,file.driver=nbd,{server},file.export=disk,file.tls-creds=tls0,file.tls-hostname=localhost"
    ));
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c
}

#[test]
fn qemu_x509_and_psk_write_and_read_back() {
    let test = "qemu_x509_and_psk_write_and_read_back";
    let Some(qio) = require("qemu-io", test) else { return };
    let dir = temp_dir("qemu");
    let pki = make_pki(&dir);
    let x509 = |d: &Path| format!("tls-creds-x509,id=tls0,dir={},endpoint=client", d.display());
    for tcp in [false, true] {
        let (e, dev) = export("disk");
        let srv =
            TestServer::start_tls(vec![e], TlsConfig::x509(&pki.server, true).unwrap().required(true), tcp);
        let out = check(&mut qemu_io(
            &qio,
            &srv,
            &x509(&pki.client),
            &["write -P 0xc3 64k 1M", "read -P 0xc3 64k 1M", "flush"],
        ));
        assert!(!out.contains("Pattern verification failed"), "{out}");
        assert!(dev.to_vec()[64 << 10..(64 << 10) + MIB as usize].iter().all(|&b| b == 0xc3));
        fails(&mut qemu_io(&qio, &srv, &x509(&pki.anonymous), &["read 0 4k"]));
    }
    // PSK: qemu reads DIR/keys.psk.
    let psk_dir = dir.join("psk");
    std::fs::create_dir_all(&psk_dir).unwrap();
    let keys = psk_file(&psk_dir);
    let (e, dev) = export("disk");
    let srv = TestServer::start_tls(vec![e], TlsConfig::psk(&keys).unwrap().required(true), true);
    let psk = format!("tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client", psk_dir.display());
    let out = check(&mut qemu_io(&qio, &srv, &psk, &["write -P 0x3c 0 512k", "read -P 0x3c 0 512k"]));
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(dev.to_vec()[..512 << 10].iter().all(|&b| b == 0x3c));
    let wrong_dir = dir.join("wrong");
    std::fs::create_dir_all(&wrong_dir).unwrap();
    std::fs::write(wrong_dir.join("keys.psk"), format!("alice:{}\n", hex(&[0x42; 32]))).unwrap();
    let wrong = format!("tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client", wrong_dir.display());
    fails(&mut qemu_io(&qio, &srv, &wrong, &["read 0 4k"]));
    let _ = std::fs::remove_dir_all(dir);
}
