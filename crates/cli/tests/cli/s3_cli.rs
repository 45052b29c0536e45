//! Volumes on object storage through the binary, against a real S3 server (moto's server
//! mode, started and stopped here): every stack (plain, LUKS1, LUKS2, LUKS2 AEAD, standalone
//! dm-integrity) formatted, served over NBD and reopened on `s3://`, the store holding
//! ciphertext only; `export` gives a file cryptsetup opens and `import` a cryptsetup volume
//! sealdisk opens; a second writer is refused. Skips loudly without moto_server, qemu-io or
//! cryptsetup.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{bin, have, qemu_io, run, serve, FAST_PBKDF2};
use testkit::s3server::{http, S3Server, ACCESS_KEY, SECRET_KEY};

fn start(dir: &Path) -> Option<S3Server> {
    // The binary reads its credentials from the environment, as the AWS tools do.
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    std::env::remove_var("AWS_PROFILE");
    let s = S3Server::start(dir)?;
    s.create_bucket("vols");
    Some(s)
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: exit {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every data object under `prefix`, downloaded.
fn objects(s: &S3Server, prefix: &str) -> Vec<Vec<u8>> {
    let (_, body) = http(s.port, "GET", &format!("/vols?list-type=2&prefix={prefix}/data/"), b"").unwrap();
    let text = String::from_utf8_lossy(&body).into_owned();
    text.split("<Key>")
        .skip(1)
        .filter_map(|p| p.split("</Key>").next())
        .map(|k| http(s.port, "GET", &format!("/vols/{k}"), b"").unwrap().1)
        .collect()
}

/// Whether any object holds a 4 KiB run of `byte` (what qemu-io wrote, in the clear).
fn plaintext_in_store(s: &S3Server, prefix: &str, byte: u8) -> bool {
    objects(s, prefix).iter().any(|o| o.windows(4096).step_by(512).any(|w| w.iter().all(|b| *b == byte)))
}

fn serve_integrity(dir: &Path, uri: &str) -> common::Served {
    let sock = dir.join("integ.sock");
    let child = Command::new(bin())
        .args(["integrity", "open", uri, "integ", "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .env("SEALDISK_RUNTIME_DIR", common::runtime_dir(dir))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child = common::wait_for_socket(child, &sock);
    common::Served { child: Some(child), sock, name: "integ".into() }
}

#[test]
fn every_stack_formats_serves_and_reopens_on_s3_with_ciphertext_only_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = start(dir.path()) else { return };
    if !have("qemu-io") {
        return;
    }
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"object storage").unwrap();
    let pass = pass.to_str().unwrap();
    let keyf = dir.path().join("plain.key");
    std::fs::write(&keyf, [7u8; 64]).unwrap();
    let keyf = keyf.to_str().unwrap();
    let e = s.endpoint();
    let stacks: [(&str, Vec<&str>); 4] = [
        ("luks2", vec!["--type", "luks2"]),
        ("luks1", vec!["--type", "luks1"]),
        ("aead", vec!["--type", "luks2", "--integrity", "hmac-sha256"]),
        ("plain", vec![]),
    ];
    for (name, extra) in stacks {
        let uri = format!("s3://vols/{name}?endpoint={e}&size=32M&object_size=1M");
        let open_args: Vec<&str> = if name == "plain" {
            vec![
                "--type",
                "plain",
                "--cipher",
                "aes-xts-plain64",
                "--key-size",
                "512",
                "--key-file",
                keyf,
                &uri,
                name,
            ]
        } else {
            let mut f = vec!["luksFormat", "-q", "--key-file", pass];
            f.extend_from_slice(FAST_PBKDF2);
            f.extend_from_slice(&extra);
            f.push(&uri);
            ok(run(&f), &format!("{name}: luksFormat on s3"));
            let dump = ok(run(&["luksDump", &uri]), &format!("{name}: luksDump on s3"));
            assert!(dump.contains("LUKS header information"), "{name}: {dump}");
            vec!["--key-file", pass, &uri, name]
        };
        let srv = serve(dir.path(), name, &open_args, None);
        qemu_io(&srv.uri(), &["write -P 0x5a 1M 1M", "write -P 0xa5 7M 512k", "flush"]);
        srv.stop_ok();
        assert!(!plaintext_in_store(&s, name, 0x5a), "{name}: plaintext reached the store");
        assert!(!objects(&s, name).is_empty(), "{name}: nothing was uploaded");
        // Reopened by a new process: everything came from the store.
        let srv = serve(dir.path(), name, &open_args, None);
        qemu_io(&srv.uri(), &["read -P 0x5a 1M 1M", "read -P 0xa5 7M 512k"]);
        srv.stop_ok();
    }

    // Standalone dm-integrity on s3.
    let uri = format!("s3://vols/integ?endpoint={e}&size=16M&object_size=1M");
    ok(run(&["integrity", "format", "-q", "--no-progress", &uri]), "integrity format on s3");
    ok(run(&["integrity", "dump", &uri]), "integrity dump on s3");
    let srv = serve_integrity(dir.path(), &uri);
    qemu_io(&srv.uri(), &["write -P 0x33 0 1M", "flush"]);
    srv.stop_ok();
    let srv = serve_integrity(dir.path(), &uri);
    qemu_io(&srv.uri(), &["read -P 0x33 0 1M"]);
    srv.stop_ok();
}

#[test]
fn export_opens_in_cryptsetup_and_a_cryptsetup_volume_imports() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = start(dir.path()) else { return };
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"round trip").unwrap();
    let pass = pass.to_str().unwrap();
    let e = s.endpoint();

    // Made on S3, exported, opened by cryptsetup.
    let uri = format!("s3://vols/made?endpoint={e}&size=32M");
    let mut f = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", pass];
    f.extend_from_slice(FAST_PBKDF2);
    f.push(&uri);
    ok(run(&f), "luksFormat on s3");
    let have_qemu = have("qemu-io");
    if have_qemu {
        let srv = serve(dir.path(), "made", &["--key-file", pass, &uri, "made"], None);
        qemu_io(&srv.uri(), &["write -P 0x42 2M 3M", "flush"]);
        srv.stop_ok();
    }
    let img = dir.path().join("made.img");
    let img = img.to_str().unwrap();
    ok(run(&["export", &uri, img]), "export");
    assert_eq!(std::fs::metadata(img).unwrap().len(), 32 << 20);
    let again = run(&["export", &uri, img]);
    assert!(!again.status.success(), "export refuses to overwrite a file");
    if have("cryptsetup") {
        let dump =
            ok(Command::new("cryptsetup").args(["luksDump", img]).output().unwrap(), "cryptsetup luksDump");
        assert!(dump.contains("Version:       \t2") || dump.contains("Version:"), "{dump}");
        ok(
            Command::new("cryptsetup")
                .args(["open", "--test-passphrase", "--key-file", pass, img])
                .output()
                .unwrap(),
            "cryptsetup open --test-passphrase on the exported file",
        );
    }
    if have_qemu {
        // The exported bytes decrypt to what was written on S3.
        let srv = serve(dir.path(), "exported", &["--key-file", pass, img, "exported"], None);
        qemu_io(&srv.uri(), &["read -P 0x42 2M 3M"]);
        srv.stop_ok();
    }

    // Made by cryptsetup, imported, opened by sealdisk on S3.
    if !have("cryptsetup") {
        return;
    }
    let theirs = dir.path().join("theirs.img");
    std::fs::File::create(&theirs).unwrap().set_len(24 << 20).unwrap();
    let theirs = theirs.to_str().unwrap();
    let mut cf = vec!["luksFormat", "--batch-mode", "--type", "luks2", "--key-file", pass];
    cf.extend_from_slice(FAST_PBKDF2);
    cf.push(theirs);
    ok(Command::new("cryptsetup").args(&cf).stdin(Stdio::null()).output().unwrap(), "cryptsetup luksFormat");
    let uri2 = format!("s3://vols/imported?endpoint={e}&object_size=1M");
    ok(run(&["import", theirs, &uri2]), "import");
    let again = run(&["import", theirs, &uri2]);
    assert!(!again.status.success(), "import refuses an existing volume");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds a volume"));
    let ours = ok(run(&["luksDump", &uri2]), "luksDump of the imported volume");
    let cs_dump =
        ok(Command::new("cryptsetup").args(["luksDump", theirs]).output().unwrap(), "cryptsetup luksDump");
    let uuid = |t: &str| t.lines().find(|l| l.starts_with("UUID")).map(str::to_owned);
    assert_eq!(uuid(&ours), uuid(&cs_dump), "same header");
    ok(run(&["open", "--test-passphrase", "--key-file", pass, &uri2]), "open --test-passphrase on s3");
    // Mostly zeroes: only the header's objects were uploaded.
    let n = objects(&s, "imported").len();
    assert!((1..=17).contains(&n), "sparse import uploaded {n} of 24 objects");
}

#[test]
fn a_second_writer_is_refused_while_a_volume_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = start(dir.path()) else { return };
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"one writer").unwrap();
    let pass = pass.to_str().unwrap();
    let uri = format!("s3://vols/shared?endpoint={}&size=32M", s.endpoint());
    let mut f = vec!["luksFormat", "-q", "--key-file", pass];
    f.extend_from_slice(FAST_PBKDF2);
    f.push(&uri);
    ok(run(&f), "luksFormat on s3");
    let first = serve(dir.path(), "first", &["--key-file", pass, &uri, "first"], None);
    let sock = dir.path().join("second.sock");
    let out =
        run(&["open", "--key-file", pass, &uri, "second", "--listen", &format!("unix:{}", sock.display())]);
    assert_eq!(out.status.code(), Some(5), "busy: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another writer"));
    // Reading the header is fine meanwhile.
    ok(run(&["luksDump", &uri]), "luksDump while served");
    first.stop_ok();
    // Gone: the lease was released and the next writer gets in.
    let again = serve(dir.path(), "second", &["--key-file", pass, &uri, "second"], None);
    again.stop_ok();
}

#[test]
fn bad_locators_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = start(dir.path()) else { return };
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for (uri, want) in [
        (format!("s3://vols/x?endpoint=http://127.0.0.1:{dead}&timeout=5"), format!("127.0.0.1:{dead}")),
        (format!("s3://vols/none?endpoint={}", s.endpoint()), "no volume here".to_owned()),
        (
            format!("s3://vols/x?endpoint={}&secret_access_key=zzz", s.endpoint()),
            "never taken from".to_owned(),
        ),
    ] {
        let out = run(&["luksDump", &uri]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&want), "{uri}: {err}");
        assert!(!err.contains("zzz"), "{err}");
    }
}

#[test]
fn luks2_made_on_s3_decrypts_in_cryptsetup_and_a_cryptsetup_encrypted_file_reads_on_s3() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = start(dir.path()) else { return };
    let e = s.endpoint();
    common::luks2_object_store_round_trip(dir.path(), &|name| format!("s3://vols/{name}?endpoint={e}"));
}

/// Every object in bucket `vols`, key and bytes (moto answers unsigned requests).
fn bucket(s: &S3Server) -> std::collections::BTreeMap<String, Vec<u8>> {
    let (_, body) = http(s.port, "GET", "/vols?list-type=2", b"").unwrap();
    let text = String::from_utf8_lossy(&body).into_owned();
    text.split("<Key>")
        .skip(1)
        .filter_map(|p| p.split("</Key>").next())
        .map(|k| (k.to_owned(), http(s.port, "GET", &format!("/vols/{k}"), b"").unwrap().1))
        .collect()
}

/// Bad input through the binary (issue 15's list): an unreachable endpoint, objects that
/// are not a volume, a manifest that is not one, an object of the wrong size, bad
/// credentials. `luksFormat`, `import` and `open` each fail with a message naming the
/// problem, and the bucket is byte-for-byte what it was.
#[test]
fn bad_input_through_the_binary_is_a_clear_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = start(dir.path()) else { return };
    let e = s.endpoint();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"bad input").unwrap();
    let pass = pass.to_str().unwrap();
    let img = dir.path().join("small.img");
    std::fs::write(&img, vec![0x11u8; 4 << 20]).unwrap();
    let img = img.to_str().unwrap();
    let put = |key: &str, body: &[u8]| {
        let auth = "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20250101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00\r\n";
        let (code, b) =
            testkit::s3server::http_with(s.port, "PUT", &format!("/vols/{key}"), body, auth).unwrap();
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&b));
    };
    // A real volume whose object 2 is then replaced by one of the wrong size.
    let vol = format!("s3://vols/vol?endpoint={e}&object_size=1M");
    ok(run(&["import", img, &vol]), "import");
    put("vol/data/0000000000000002", &[1; 1000]);
    put("foreign/photo.jpg", b"not a volume");
    put("badman/sealdisk-volume.json", b"{\"format\":\"zip\"}");
    let before = bucket(&s);
    assert_eq!(before.len(), 7, "{:?}", before.keys());

    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cases = [
        (format!("s3://vols/new?endpoint=http://127.0.0.1:{dead}&timeout=5"), format!("127.0.0.1:{dead}")),
        (format!("s3://vols/foreign?endpoint={e}"), "not a sealdisk volume; refusing".to_owned()),
        (format!("s3://vols/badman?endpoint={e}"), "not a sealdisk volume manifest".to_owned()),
        (vol.clone(), "is 1000 bytes, expected 1048576".to_owned()),
    ];
    for (uri, want) in &cases {
        let sized = format!("{uri}&size=4M");
        let mut f = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", pass];
        f.extend_from_slice(FAST_PBKDF2);
        f.push(&sized);
        let sock = dir.path().join("bad.sock");
        let listen = format!("unix:{}", sock.display());
        for (what, out) in [
            ("luksFormat", run(&f)),
            ("import", run(&["import", img, uri])),
            ("open", run(&["open", "--key-file", pass, uri, "bad", "--listen", &listen])),
            ("export", run(&["export", uri, dir.path().join("out.img").to_str().unwrap()])),
        ] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{what} {uri} succeeded");
            // import of a volume that exists says so first; everything else names the problem.
            let named =
                err.contains(want.as_str()) || (what == "import" && err.contains("already holds a volume"));
            assert!(named, "{what} {uri}: {err:?} does not say {want:?}");
            assert!(!err.contains("panicked"), "{what} {uri}: {err}");
        }
        assert!(!dir.path().join("out.img").exists(), "a failed export left a file");
        assert!(bucket(&s) == before, "{uri}: the bucket changed");
    }

    // Bad credentials, against a server that checks signatures.
    let sd = tempfile::tempdir().unwrap();
    let Some(a) = S3Server::start_with_auth(sd.path()) else { return };
    a.create_bucket("vols");
    let (id, _) = a.issued_key();
    let uri = format!("s3://vols/auth?endpoint={}&size=4M", a.endpoint());
    let mut f = vec!["luksFormat", "-q", "--type", "luks2", "--key-file", pass];
    f.extend_from_slice(FAST_PBKDF2);
    f.push(&uri);
    let out = Command::new(bin())
        .args(&f)
        .env("AWS_ACCESS_KEY_ID", &id)
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret-z3")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("access denied") && err.contains("AWS_SECRET_ACCESS_KEY"),
        "{err}"
    );
    assert!(!err.contains("not-the-secret-z3"), "{err}");
    let (_, state) = http(a.port, "GET", "/moto-api/data.json", b"").unwrap();
    let state = String::from_utf8_lossy(&state);
    assert!(state.contains("\"name\": \"vols\"") && !state.contains("\"name\": \"auth/"), "nothing written");
}
