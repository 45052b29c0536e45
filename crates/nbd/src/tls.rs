//! NBD over TLS: `NBD_OPT_STARTTLS`, x509 and TLS-PSK credentials, and the per-connection
//! pump that lets the unchanged transmission code run over a TLS session.
//!
//! # Credentials
//!
//! * x509 ([`TlsConfig::x509`]), in the directory layout nbdkit and qemu-nbd share:
//!   `DIR/server-cert.pem` (the server's certificate, optionally followed by its chain),
//!   `DIR/server-key.pem`, and for client verification `DIR/ca-cert.pem` (the CA that
//!   signs client certificates) and optionally `DIR/ca-crl.pem` (its revocation list).
//!   With `verify_peer` a client must present a certificate that chains to `ca-cert.pem`:
//!   that is the authentication.
//! * TLS-PSK ([`TlsConfig::psk`]): a key file in psktool's format, one `identity:hexkey`
//!   line per client. The client must know an identity and its key; TLS 1.3 and TLS 1.2
//!   PSK handshakes are both accepted (OpenSSL serves a TLS 1.3 external PSK through the
//!   same callback, with a SHA-256 cipher suite).
//!
//! # Modes
//!
//! `required == false` (nbdkit's `--tls=on`): clients may use TLS or not. `required ==
//! true` (`--tls=require`): before TLS every option but `STARTTLS` and `ABORT` is
//! answered `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` (which has no error reply)
//! ends the connection. A server without a `TlsConfig` answers `STARTTLS` with
//! `NBD_REP_ERR_UNSUP`. After `STARTTLS` the option negotiation continues inside TLS and
//! options negotiated before it (structured replies) are forgotten, as the spec asks.
//!
//! # The pump
//!
//! The transmission phase splits a connection into a reader and a writer used by several
//! worker threads at once (see the crate docs). A TLS session is one object that both
//! reads and writes, and OpenSSL may need to write while reading (TLS 1.3 key updates)
//! or read while writing. Rather than a lock around the session in the hot path, once the
//! TLS handshake is done one thread per connection owns the session and pumps bytes
//! between it and one end of a `UnixStream::pair()`; the negotiation and the transmission
//! code use the other end exactly as they use a plain Unix socket:
//!
//! ```text
//!   client ══TLS══ socket ◄─► pump thread (SslStream, non-blocking, poll) ◄─► socketpair
//!                                   decrypt → buffer → write(pair)         ▲
//!                                   read(pair) → buffer → encrypt          │
//!                                                       reader/writer, workers (unchanged)
//! ```
//!
//! Copies TLS adds per byte, beyond the encryption itself: inbound, OpenSSL decrypts into
//! the pump's buffer, which is written into the socketpair (one kernel copy) and read out
//! by a worker (one kernel copy); outbound, a worker's `writev` into the socketpair and the
//! pump's `read` from it (two kernel copies), then OpenSSL encrypts into its record buffer.
//! Plain connections never see any of this: their code path is the one without TLS.
//!
//! The pump ends when both directions are done: the client's side closed (or failed) and
//! the transmission code has dropped its end. The connection thread joins it, so a
//! connection's last replies are sent before the server counts it as finished. Shutting
//! the raw socket down (server shutdown) ends the pump's reads and writes as it ends a
//! plain connection's.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use log::{debug, info, warn};
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::pkey::PKey;
use openssl::ssl::{
    ErrorCode, HandshakeError, Ssl, SslAcceptor, SslFiletype, SslMethod, SslMode, SslOptions,
    SslSessionCacheMode, SslStream, SslVerifyMode,
};
use openssl::x509::store::X509Lookup;
use openssl::x509::verify::X509VerifyFlags;
use openssl::x509::X509;
use rustix::event::{poll, PollFd, PollFlags};
use thiserror::Error;
use zeroize::Zeroizing;

use crate::stream::Stream;

/// nbdkit's and qemu's file names inside a `--tls-certificates` directory.
pub const CA_CERT: &str = "ca-cert.pem";
/// The server's certificate (and chain), PEM.
pub const SERVER_CERT: &str = "server-cert.pem";
/// The server's private key, PEM.
pub const SERVER_KEY: &str = "server-key.pem";
/// The CA's certificate revocation list, PEM (optional; used with client verification).
pub const CA_CRL: &str = "ca-crl.pem";

/// Most bytes of a PSK key (psktool writes 32 by default; OpenSSL accepts up to 256).
const MAX_PSK: usize = 256;
/// Most bytes of a PSK identity (RFC 4279: 2^16-1; psktool's usernames are short).
const MAX_IDENTITY: usize = 1024;
/// Largest key or certificate file read (a PEM bundle with a long chain is well under this).
const MAX_PEM_FILE: u64 = 1 << 20;

/// Credentials and policy for `NBD_OPT_STARTTLS`; give it to [`crate::Server::new_with_tls`].
#[derive(Clone)]
pub struct TlsConfig {
    acceptor: SslAcceptor,
    required: bool,
    kind: &'static str,
    /// Where the PSK callback leaves the identity it accepted (OpenSSL does not report a
    /// TLS 1.3 external PSK's identity afterwards), for the log.
    psk_identity: Option<Index<Ssl, Vec<u8>>>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig").field("kind", &self.kind).field("required", &self.required).finish()
    }
}

/// Why TLS credentials could not be loaded.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A certificate, key or CRL file holds no usable PEM data.
    #[error("{}: not a usable PEM {what}", .path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// "certificate", "private key", "CRL".
        what: &'static str,
        /// OpenSSL's reasons.
        #[source]
        source: ErrorStack,
    },
    /// The private key does not belong to the certificate.
    #[error("{} does not match {}", .key.display(), .cert.display())]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
        /// OpenSSL's reasons.
        #[source]
        source: ErrorStack,
    },
    /// A line of a PSK key file is malformed (the key itself is never shown).
    #[error("{}: line {line}: {reason}", .path.display())]
    PskLine {
        /// The key file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A PSK key file has no keys.
    #[error("{}: no identity:hexkey lines", .0.display())]
    PskEmpty(PathBuf),
    /// Setting up the TLS context failed.
    #[error("setting up TLS")]
    Setup(#[source] ErrorStack),
}

impl TlsConfig {
    /// x509 credentials from `dir` (nbdkit's and qemu's layout, see the module docs).
    /// With `verify_peer`, clients must present a certificate signed by `dir/ca-cert.pem`
    /// (and not revoked by `dir/ca-crl.pem`, when that file exists).
    pub fn x509(dir: &Path, verify_peer: bool) -> Result<TlsConfig, TlsError> {
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(TlsError::Setup)?;
        let cert_path = dir.join(SERVER_CERT);
        let key_path = dir.join(SERVER_KEY);
        let chain = X509::stack_from_pem(&read_pem(&cert_path)?).map_err(|source| TlsError::Pem {
            path: cert_path.clone(),
            what: "certificate",
            source,
        })?;
        let mut chain = chain.into_iter();
        let Some(leaf) = chain.next() else {
            return Err(TlsError::Pem { path: cert_path, what: "certificate", source: ErrorStack::get() });
        };
        b.set_certificate(&leaf).map_err(TlsError::Setup)?;
        for c in chain {
            b.add_extra_chain_cert(c).map_err(TlsError::Setup)?;
        }
        let key = PKey::private_key_from_pem(&read_pem(&key_path)?).map_err(|source| TlsError::Pem {
            path: key_path.clone(),
            what: "private key",
            source,
        })?;
        let mismatch =
            |source| TlsError::KeyMismatch { key: key_path.clone(), cert: cert_path.clone(), source };
        b.set_private_key(&key).map_err(mismatch)?;
        b.check_private_key().map_err(mismatch)?;
        if verify_peer {
            let ca_path = dir.join(CA_CERT);
            let cas = X509::stack_from_pem(&read_pem(&ca_path)?).map_err(|source| TlsError::Pem {
                path: ca_path.clone(),
                what: "certificate",
                source,
            })?;
            if cas.is_empty() {
                return Err(TlsError::Pem { path: ca_path, what: "certificate", source: ErrorStack::get() });
            }
            for ca in cas {
                b.add_client_ca(&ca).map_err(TlsError::Setup)?;
                b.cert_store_mut().add_cert(ca).map_err(TlsError::Setup)?;
            }
            let crl_path = dir.join(CA_CRL);
            if crl_path.exists() {
                // OpenSSL's loader takes a C string; a path it cannot take is refused here.
                let Some(p) = crl_path.to_str().filter(|p| !p.contains('\0')) else {
                    return Err(TlsError::Read {
                        path: crl_path,
                        source: io::Error::new(io::ErrorKind::InvalidInput, "path is not UTF-8"),
                    });
                };
                let store = b.cert_store_mut();
                let lookup = store.add_lookup(X509Lookup::file()).map_err(TlsError::Setup)?;
                lookup.load_crl_file(p, SslFiletype::PEM).map_err(|source| TlsError::Pem {
                    path: crl_path.clone(),
                    what: "CRL",
                    source,
                })?;
                store.set_flags(X509VerifyFlags::CRL_CHECK).map_err(TlsError::Setup)?;
            }
            b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        common_setup(&mut b)?;
        Ok(TlsConfig {
            acceptor: b.build(),
            required: false,
            kind: if verify_peer { "x509+verify" } else { "x509" },
            psk_identity: None,
        })
    }

    /// TLS-PSK with the keys of a psktool key file (`identity:hexkey` lines).
    pub fn psk(file: &Path) -> Result<TlsConfig, TlsError> {
        let text = Zeroizing::new(read_pem(file)?);
        let keys = Arc::new(PskKeys::parse(&text, file)?);
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(TlsError::Setup)?;
        // TLS 1.2 needs PSK cipher suites (the x509 list has none); TLS 1.3's suites are
        // shared, and its external PSK uses TLS_AES_128_GCM_SHA256.
        b.set_cipher_list(
            "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES128-GCM-SHA256:DHE-PSK-AES256-GCM-SHA384:\
             DHE-PSK-CHACHA20-POLY1305:PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384",
        )
        .map_err(TlsError::Setup)?;
        let index = Ssl::new_ex_index::<Vec<u8>>().map_err(TlsError::Setup)?;
        b.set_psk_server_callback(move |ssl, identity, out| {
            let (Some(id), Some(key)) = (identity, identity.and_then(|id| keys.get(id))) else {
                debug!("TLS-PSK: unknown identity {:?}", identity.map(String::from_utf8_lossy));
                return Ok(0); // unknown identity: the handshake fails
            };
            if key.len() > out.len() {
                return Ok(0);
            }
            out[..key.len()].copy_from_slice(key);
            ssl.set_ex_data(index, id.to_vec());
            Ok(key.len())
        });
        common_setup(&mut b)?;
        Ok(TlsConfig { acceptor: b.build(), required: false, kind: "psk", psk_identity: Some(index) })
    }

    /// `true`: refuse every option but `STARTTLS`/`ABORT` until TLS is on (nbdkit's
    /// `--tls=require`); `false` (the default): TLS is offered, not required.
    pub fn required(mut self, required: bool) -> TlsConfig {
        self.required = required;
        self
    }

    /// Whether TLS is required.
    pub fn is_required(&self) -> bool {
        self.required
    }
}

fn common_setup(b: &mut openssl::ssl::SslAcceptorBuilder) -> Result<(), TlsError> {
    // No resumption: every connection authenticates in full, and no ticket key to keep.
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    b.set_options(SslOptions::NO_TICKET);
    b.set_num_tickets(0).map_err(TlsError::Setup)?;
    b.set_session_id_context(b"sealdisk-nbd").map_err(TlsError::Setup)?;
    // The pump retries a blocked write with a buffer that may have moved or grown.
    b.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER | SslMode::ENABLE_PARTIAL_WRITE);
    Ok(())
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    let err = |source| TlsError::Read { path: path.to_path_buf(), source };
    let f = std::fs::File::open(path).map_err(err)?;
    // Sized up front so that a key file's bytes are not left behind by a reallocation.
    let len = f.metadata().map_err(err)?.len().min(MAX_PEM_FILE + 1);
    let mut v = Vec::with_capacity(len as usize + 1);
    f.take(MAX_PEM_FILE + 1).read_to_end(&mut v).map_err(err)?;
    if v.len() as u64 > MAX_PEM_FILE {
        v.fill(0);
        return Err(err(io::Error::new(io::ErrorKind::InvalidData, "file larger than 1 MiB")));
    }
    Ok(v)
}

/// The keys of a psktool key file, by identity. Debug shows the identities only.
struct PskKeys(HashMap<Vec<u8>, Zeroizing<Vec<u8>>>);

impl fmt::Debug for PskKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys().map(|k| String::from_utf8_lossy(k))).finish()
    }
}

impl PskKeys {
    /// Parses `identity:hexkey` lines (psktool's format; empty lines and `#` comments are
    /// skipped). A later line for the same identity replaces the earlier one, as in GnuTLS.
    fn parse(text: &[u8], path: &Path) -> Result<PskKeys, TlsError> {
        let bad = |line, reason| TlsError::PskLine { path: path.to_path_buf(), line, reason };
        let mut keys = HashMap::new();
        for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
            let line = raw.strip_suffix(b"\r").unwrap_or(raw);
            if line.iter().all(u8::is_ascii_whitespace) || line.first() == Some(&b'#') {
                continue;
            }
            let Some(colon) = line.iter().rposition(|&b| b == b':') else {
                return Err(bad(i + 1, "no ':' between identity and key"));
            };
            let (id, hexkey) = (&line[..colon], &line[colon + 1..]);
            if id.is_empty() || id.len() > MAX_IDENTITY {
                return Err(bad(i + 1, "identity empty or longer than 1024 bytes"));
            }
            if hexkey.is_empty() || hexkey.len() % 2 != 0 || hexkey.len() / 2 > MAX_PSK {
                return Err(bad(i + 1, "key must be 1 to 256 bytes of hex"));
            }
            let mut key = Zeroizing::new(vec![0u8; hexkey.len() / 2]);
            hex::decode_to_slice(hexkey, &mut key).map_err(|_| bad(i + 1, "key is not hex"))?;
            keys.insert(id.to_vec(), key);
        }
        if keys.is_empty() {
            return Err(TlsError::PskEmpty(path.to_path_buf()));
        }
        Ok(PskKeys(keys))
    }

    fn get(&self, identity: &[u8]) -> Option<&[u8]> {
        self.0.get(identity).map(|k| k.as_slice())
    }
}

/// A connection's pump thread; `join` after the transmission code has dropped its end.
#[derive(Debug)]
pub(crate) struct Pump {
    thread: JoinHandle<()>,
}

impl Pump {
    /// Waits until the last bytes are sent (or the client is gone).
    pub(crate) fn join(self, peer: &str) {
        if self.thread.join().is_err() {
            warn!("{peer}: the TLS pump thread panicked");
        }
    }
}

/// Runs the TLS handshake as the server on `raw` (blocking), then starts the pump. Returns
/// it and the plain end of the socketpair, which carries the session's cleartext. An error
/// means the handshake failed (a wrong key or certificate, a client that went away).
pub(crate) fn start(
    cfg: &TlsConfig,
    raw: &Stream,
    peer: &str,
    send_buffer: usize,
) -> io::Result<(Pump, UnixStream)> {
    let sock = raw.try_clone()?;
    let tls = match cfg.acceptor.accept(sock) {
        Ok(s) => s,
        Err(HandshakeError::SetupFailure(e)) => return Err(io::Error::other(e)),
        Err(HandshakeError::Failure(m)) | Err(HandshakeError::WouldBlock(m)) => {
            let e = m.error();
            let why = match (e.io_error(), e.ssl_error()) {
                (Some(io), _) => io.to_string(),
                (None, Some(s)) => s.to_string(),
                (None, None) => format!("{:?}", e.code()),
            };
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("TLS handshake failed: {why}"),
            ));
        }
    };
    let ssl = tls.ssl();
    let psk_id =
        cfg.psk_identity.and_then(|i| ssl.ex_data(i)).map(Vec::as_slice).or_else(|| ssl.psk_identity());
    let who = match (psk_id, ssl.peer_certificate()) {
        (Some(id), _) => format!("PSK identity {:?}", String::from_utf8_lossy(id)),
        (None, Some(c)) => format!("client certificate {:?}", c.subject_name()),
        (None, None) => "no client authentication".to_string(),
    };
    info!("{peer}: TLS {} ({}, {who})", ssl.version_str(), ssl.current_cipher().map_or("?", |c| c.name()));
    tls.get_ref().set_nonblocking(true)?;
    let (inner, outer) = UnixStream::pair()?;
    outer.set_nonblocking(true)?;
    if send_buffer > 0 {
        for s in [&inner, &outer] {
            if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(s, send_buffer) {
                debug!("cannot set SO_SNDBUF to {send_buffer}: {e}");
            }
        }
    }
    let name = peer.to_string();
    let thread = thread::Builder::new().name("nbd-tls".into()).spawn(move || pump(tls, outer, &name))?;
    Ok((Pump { thread }, inner))
}

/// Bytes buffered per direction in the pump: four full TLS records, so one socketpair read
/// feeds several records to one `ssl_write`, while a TLS connection costs 128 KiB here
/// (plus OpenSSL's record buffers and the socketpair's kernel buffers) however many exist.
const PUMP_BUFFER: usize = 64 * 1024;

/// A byte buffer filled at `end` and drained from `start`.
struct Buf {
    data: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Buf {
    fn new() -> Buf {
        Buf { data: vec![0u8; PUMP_BUFFER].into_boxed_slice(), start: 0, end: 0 }
    }
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
    fn filled(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }
    /// Free space at the end, moving the filled part to the front when that frees some.
    fn space(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.data.len() && self.start > 0 {
            self.data.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.data[self.end..]
    }
}

/// What a blocked TLS operation waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    None,
    Read,
    Write,
}

fn want_of(code: ErrorCode) -> Option<Want> {
    match code {
        ErrorCode::WANT_READ => Some(Want::Read),
        ErrorCode::WANT_WRITE => Some(Want::Write),
        _ => None,
    }
}

/// Moves bytes between the TLS session and the plain end until both directions are done.
fn pump(mut tls: SslStream<Stream>, plain: UnixStream, peer: &str) {
    let mut down = Buf::new(); // TLS → plain: requests
    let mut up = Buf::new(); // plain → TLS: replies
    let mut tls_in_done = false; // the client's side closed or failed
    let mut plain_out_shut = false;
    let mut plain_in_done = false; // the transmission code dropped its end
    loop {
        let mut tls_read_want = Want::None;
        let mut tls_write_want = Want::None;
        let mut plain_write_blocked = false;
        let mut plain_read_blocked = false;
        loop {
            let mut progress = false;
            if !tls_in_done {
                let space = down.space();
                if !space.is_empty() {
                    match tls.ssl_read(space) {
                        Ok(n) => {
                            down.end += n;
                            progress = true;
                        }
                        Err(e) => match want_of(e.code()) {
                            Some(w) => tls_read_want = w,
                            None => {
                                if e.code() != ErrorCode::ZERO_RETURN {
                                    debug!("{peer}: TLS read ended: {e}");
                                }
                                tls_in_done = true;
                            }
                        },
                    }
                }
            }
            if !down.is_empty() {
                match (&plain).write(down.filled()) {
                    Ok(n) => {
                        down.start += n;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => plain_write_blocked = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => progress = true,
                    Err(_) => {
                        // The transmission side is gone; nothing more will be read.
                        down.start = down.end;
                        tls_in_done = true;
                    }
                }
            }
            if tls_in_done && down.is_empty() && !plain_out_shut {
                // End of requests: the reader sees EOF, in-flight requests still finish.
                let _ = plain.shutdown(Shutdown::Write);
                plain_out_shut = true;
            }
            if !plain_in_done {
                let space = up.space();
                if !space.is_empty() {
                    match (&plain).read(space) {
                        Ok(0) => plain_in_done = true,
                        Ok(n) => {
                            up.end += n;
                            progress = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => plain_read_blocked = true,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => progress = true,
                        Err(_) => plain_in_done = true,
                    }
                }
            }
            if !up.is_empty() {
                match tls.ssl_write(up.filled()) {
                    Ok(n) => {
                        up.start += n;
                        progress = true;
                    }
                    Err(e) => match want_of(e.code()) {
                        Some(w) => tls_write_want = w,
                        None => {
                            debug!("{peer}: TLS write failed: {e}");
                            return; // dropping `plain` fails the workers' writes
                        }
                    },
                }
            }
            if plain_in_done && up.is_empty() {
                // Best effort close_notify; the socket is non-blocking and may be gone.
                let _ = tls.shutdown();
                return;
            }
            if !progress {
                break;
            }
        }
        // Wait for whatever the blocked operations need.
        let mut tls_flags = PollFlags::empty();
        for w in [tls_read_want, tls_write_want] {
            match w {
                Want::Read => tls_flags |= PollFlags::IN,
                Want::Write => tls_flags |= PollFlags::OUT,
                Want::None => {}
            }
        }
        let mut plain_flags = PollFlags::empty();
        if plain_write_blocked {
            plain_flags |= PollFlags::OUT;
        }
        if plain_read_blocked {
            plain_flags |= PollFlags::IN;
        }
        // A descriptor is polled only when something waits on it: poll reports a hang-up
        // even unasked, which would spin this loop once a direction is finished.
        let tls_fd = tls.get_ref().as_fd();
        let mut fds = Vec::with_capacity(2);
        if !tls_flags.is_empty() {
            fds.push(PollFd::from_borrowed_fd(tls_fd, tls_flags));
        }
        if !plain_flags.is_empty() {
            fds.push(PollFd::from_borrowed_fd(plain.as_fd(), plain_flags));
        }
        if fds.is_empty() {
            // Nothing blocked and no progress: cannot happen while a direction is open, but
            // never spin or hang on it.
            warn!("{peer}: TLS pump has nothing to wait for, closing");
            return;
        }
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                warn!("{peer}: TLS pump poll failed: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PskKeys, TlsError> {
        PskKeys::parse(text.as_bytes(), Path::new("keys.psk"))
    }

    #[test]
    fn psk_file_in_psktool_format_parses() {
        let k = parse("alice:0123456789abcdef\n\n# comment\nbob:FFEE\r\n").unwrap();
        assert_eq!(k.get(b"alice"), Some(&[0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef][..]));
        assert_eq!(k.get(b"bob"), Some(&[0xff, 0xee][..]));
        assert_eq!(k.get(b"carol"), None);
        // The key never shows in Debug.
        let dbg = format!("{k:?}");
        assert!(
            dbg.contains("alice") && !dbg.contains("0123") && !dbg.to_lowercase().contains("ffee"),
            "{dbg}"
        );
    }

    #[test]
    fn psk_file_malformed_lines_are_refused_by_line_without_the_key() {
        for (text, line) in [
            ("alice\n", 1),
            ("a:00\n:0011\n", 2),
            ("alice:abc\n", 1),
            ("alice:zz\n", 1),
            ("alice:\n", 1),
            (&format!("a:{}\n", "00".repeat(257)), 1),
        ] {
            match parse(text) {
                Err(TlsError::PskLine { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert!(matches!(parse("\n# only a comment\n"), Err(TlsError::PskEmpty(_))));
        let msg = parse("alice:5ecre7zz\n").err().unwrap().to_string();
        assert!(!msg.contains("5ecre7"), "{msg}");
    }

    #[test]
    fn buf_compacts_when_the_end_is_reached() {
        let mut b = Buf::new();
        let n = b.space().len();
        b.end = n;
        b.start = n - 3;
        b.data[n - 3..].copy_from_slice(b"abc");
        assert_eq!(b.space().len(), n - 3);
        assert_eq!(b.filled(), b"abc");
    }
}
