//! A real S3-compatible server for tests: moto's server mode (`moto_server`, PyPI `moto[server]`,
//! installed by `.ci/run`), started on a free loopback port in a temporary directory and
//! killed when dropped. Tests that need it skip loudly when it is not installed.
//!
//! moto keeps its objects in memory; for the kill-and-restart fault the server runs with
//! moto's request recorder on (every request appended to a file before it is served), and
//! [`S3Server::restart`] replays that log into the new process: the restarted server holds
//! what the killed one had acknowledged.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Credentials the tests use (moto accepts any unless its IAM checks are on).
pub const ACCESS_KEY: &str = "sealdisk-test-key";
/// See [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "sealdisk-test-secret";

/// A running moto server.
pub struct S3Server {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    record: bool,
    auth: bool,
}

/// Whether `moto_server` can be run; prints a SKIPPED line when not.
pub fn available() -> bool {
    let ok = Command::new("moto_server")
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED: moto_server is not installed (pip install 'moto[server]'; .ci/run installs it)");
    }
    ok
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Sends one unsigned HTTP/1.1 request to 127.0.0.1:`port`; returns the status and body.
pub fn http(port: u16, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    http_with(port, method, path, body, "")
}

/// [`http`] with extra header lines (each ending in `\r\n`).
pub fn http_with(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &str,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp);
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let at = resp.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4).unwrap_or(resp.len());
    Ok((status, resp[at..].to_vec()))
}

impl S3Server {
    /// Starts a server (None, after a SKIPPED line, when moto is not installed).
    pub fn start(dir: &Path) -> Option<S3Server> {
        Self::start_with(dir, false, false)
    }

    /// Starts a server that records every request so [`restart`](Self::restart) keeps its
    /// objects.
    pub fn start_recording(dir: &Path) -> Option<S3Server> {
        Self::start_with(dir, true, false)
    }

    /// Starts a server that checks signatures (moto's IAM checks): only
    /// [`ACCESS_KEY`]/[`SECRET_KEY`] are accepted, created with the first requests.
    pub fn start_with_auth(dir: &Path) -> Option<S3Server> {
        Self::start_with(dir, false, true)
    }

    fn start_with(dir: &Path, record: bool, auth: bool) -> Option<S3Server> {
        if !available() {
            return None;
        }
        let mut s = S3Server { child: None, port: free_port(), dir: dir.to_owned(), record, auth };
        s.spawn();
        Some(s)
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.join(format!("moto-{}.log", self.port))).expect("log");
        let mut cmd = Command::new("moto_server");
        cmd.args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        if self.record {
            cmd.env("MOTO_ENABLE_RECORDING", "true").env("MOTO_RECORDER_FILEPATH", self.dir.join("moto.rec"));
        }
        if self.auth {
            // The first 5 requests (user, policy, attach, key, bucket) go unchecked; every
            // later one must be signed by that user's key.
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", "5");
        }
        self.child = Some(cmd.spawn().expect("spawn moto_server"));
        let t0 = Instant::now();
        while http(self.port, "GET", "/moto-api/", b"").map(|(c, _)| c == 0).unwrap_or(true) {
            assert!(t0.elapsed() < Duration::from_secs(60), "moto_server did not come up on {}", self.port);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The endpoint URL (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates `bucket`; with auth on, first the IAM user whose key the tests sign with.
    pub fn create_bucket(&self, bucket: &str) {
        if self.auth {
            let q = |action: &str, args: &str| {
                // moto routes a request by the service its credential scope names.
                let scope = "Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20250101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=00\r\n";
                let path = format!("/?Action={action}&Version=2010-05-08{args}");
                let (code, body) = http_with(self.port, "POST", &path, b"", scope).expect("iam");
                assert!(code == 200, "IAM {action}: {code} {}", String::from_utf8_lossy(&body));
                String::from_utf8_lossy(&body).into_owned()
            };
            // moto's IAM answers with its own key; the tests then use that one.
            q("CreateUser", "&UserName=sealdisk");
            let _ = q("CreatePolicy", "&PolicyName=all&PolicyDocument=%7B%22Version%22%3A%222012-10-17%22%2C%22Statement%22%3A%5B%7B%22Effect%22%3A%22Allow%22%2C%22Action%22%3A%22*%22%2C%22Resource%22%3A%22*%22%7D%5D%7D");
            q("AttachUserPolicy", "&UserName=sealdisk&PolicyArn=arn:aws:iam::123456789012:policy/all");
            let key = q("CreateAccessKey", "&UserName=sealdisk");
            let grab = |tag: &str| {
                let a = key.find(&format!("<{tag}>")).expect(tag) + tag.len() + 2;
                let b = key[a..].find('<').expect(tag) + a;
                key[a..b].to_owned()
            };
            std::fs::write(
                self.dir.join("key"),
                format!("{}\n{}\n", grab("AccessKeyId"), grab("SecretAccessKey")),
            )
            .expect("key");
        }
        let (code, body) = http(self.port, "PUT", &format!("/{bucket}"), b"").expect("create bucket");
        assert!(code == 200, "create bucket: {code} {}", String::from_utf8_lossy(&body));
    }

    /// With auth on: the access key and secret moto issued in [`create_bucket`](Self::create_bucket).
    pub fn issued_key(&self) -> (String, String) {
        let s = std::fs::read_to_string(self.dir.join("key")).expect("key");
        let mut l = s.lines();
        (l.next().unwrap_or_default().to_owned(), l.next().unwrap_or_default().to_owned())
    }

    /// The server's process id (for its CPU time in /proc), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server at once (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port; a recording server replays every request
    /// the killed one received.
    pub fn restart(&mut self) {
        self.kill();
        let rec = self.dir.join("moto.rec");
        let saved = if self.record { std::fs::read(&rec).ok() } else { None };
        // The new process appends to the same file; keep the old log aside and replay it.
        if saved.is_some() {
            let _ = std::fs::remove_file(&rec);
        }
        self.spawn();
        if let Some(log) = saved {
            let (c, b) =
                http(self.port, "POST", "/moto-api/recorder/upload-recording", &log).expect("upload");
            assert_eq!(c, 200, "upload-recording: {}", String::from_utf8_lossy(&b));
            let (c, b) = http(self.port, "POST", "/moto-api/recorder/replay-recording", b"").expect("replay");
            assert_eq!(c, 200, "replay-recording: {}", String::from_utf8_lossy(&b));
        }
    }

    /// Whether the process is alive.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a [`FaultProxy`] does to the requests it relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Relays everything.
    Pass,
    /// Answers every request with `500 InternalError` (the server's own error), relaying nothing.
    Error500,
    /// Closes every connection at once (a network failure).
    Reset,
}

/// A TCP proxy on 127.0.0.1 in front of a server, that injects [`Fault`]s: switching the
/// fault affects connections already open (the client's keep-alive pool) at their next read.
pub struct FaultProxy {
    /// The port clients connect to.
    pub port: u16,
    mode: std::sync::Arc<std::sync::atomic::AtomicU8>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FaultProxy {
    /// Starts relaying to 127.0.0.1:`upstream`.
    pub fn start(upstream: u16) -> FaultProxy {
        let mode = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
        let m = std::sync::Arc::clone(&mode);
        let (port, stop) = serve_local(move |client| relay(client, upstream, &m));
        FaultProxy { port, mode, stop }
    }

    /// Sets what happens to requests from now on.
    pub fn set(&self, f: Fault) {
        self.mode.store(f as u8, std::sync::atomic::Ordering::SeqCst);
    }

    /// The endpoint URL clients use.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Accepts connections on a new port of 127.0.0.1 until the returned flag is set, each one
/// handled by `handle` on a thread of its own: the listening half of a test proxy.
pub(crate) fn serve_local(
    handle: impl Fn(TcpStream) + Send + Sync + 'static,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let stop = Arc::new(AtomicBool::new(false));
    let st = Arc::clone(&stop);
    let handle = Arc::new(handle);
    std::thread::spawn(move || {
        while !st.load(Ordering::Relaxed) {
            let client = match listener.accept() {
                Ok((c, _)) => c,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            };
            let _ = client.set_nonblocking(false);
            let handle = Arc::clone(&handle);
            std::thread::spawn(move || handle(client));
        }
    });
    (port, stop)
}

/// Copies what `server` sends to `client` on a thread of its own, closing `client` at the end
/// (None when a socket cannot be cloned): the return half of a test proxy.
pub(crate) fn pipe_back(server: &TcpStream, client: &TcpStream) -> Option<std::thread::JoinHandle<()>> {
    let (mut c2, mut s2) = (client.try_clone().ok()?, server.try_clone().ok()?);
    Some(std::thread::spawn(move || {
        let _ = std::io::copy(&mut s2, &mut c2);
        let _ = c2.shutdown(std::net::Shutdown::Both);
    }))
}

fn current(m: &std::sync::atomic::AtomicU8) -> Fault {
    match m.load(std::sync::atomic::Ordering::SeqCst) {
        0 => Fault::Pass,
        1 => Fault::Error500,
        _ => Fault::Reset,
    }
}

/// Relays one client connection, checking the fault before every chunk from the client.
fn relay(mut client: TcpStream, upstream: u16, m: &std::sync::atomic::AtomicU8) {
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else { return };
    let Some(back) = pipe_back(&server, &client) else { return };
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match current(m) {
            Fault::Pass => {
                if server.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Fault::Error500 => {
                let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code>\
                            <Message>injected</Message></Error>";
                let _ = write!(
                    client,
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                break;
            }
            Fault::Reset => break,
        }
    }
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = server.shutdown(std::net::Shutdown::Both);
    let _ = back.join();
}
