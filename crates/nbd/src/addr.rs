//! Listening addresses: `unix:PATH` and `tcp:HOST:PORT`, and the NBD URIs that reach them.

use std::fmt;
use std::io;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::str::FromStr;

use thiserror::Error;

/// Host used when a TCP address names only a port.
pub const DEFAULT_HOST: &str = "127.0.0.1";

/// Where a server listens.
///
/// Parsed from `unix:PATH`, `tcp:HOST:PORT`, `tcp:[V6ADDR]:PORT`, `tcp::PORT` or `tcp:PORT`
/// (the last two listen on `127.0.0.1`). Port 0 picks a free port; the bound server reports
/// the real one (`BoundServer::local_addr`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ListenAddr {
    /// A Unix domain stream socket at this path.
    Unix(PathBuf),
    /// A TCP socket, `host:port` (IPv6 hosts in brackets).
    Tcp(String),
}

/// A listening address that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AddrParseError {
    /// Neither `unix:` nor `tcp:`.
    #[error("listen address {0:?} must start with \"unix:\" or \"tcp:\"")]
    UnknownScheme(String),
    /// `unix:` with nothing after it.
    #[error("unix socket path is empty")]
    EmptyPath,
    /// The port is missing or not a number in 0..=65535.
    #[error("bad TCP port in {0:?}")]
    BadPort(String),
}

impl FromStr for ListenAddr {
    type Err = AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(AddrParseError::EmptyPath);
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        let Some(rest) = s.strip_prefix("tcp:") else {
            return Err(AddrParseError::UnknownScheme(s.to_string()));
        };
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => (host, port),
            None => ("", rest),
        };
        if port.is_empty() || port.parse::<u16>().is_err() {
            return Err(AddrParseError::BadPort(s.to_string()));
        }
        let host = if host.is_empty() { DEFAULT_HOST } else { host };
        Ok(ListenAddr::Tcp(format!("{host}:{port}")))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

impl ListenAddr {
    /// Whether only this machine can connect: a Unix socket, or a TCP host every address
    /// of which is a loopback address (`127.0.0.0/8`, `::1`). A wildcard (`0.0.0.0`, `[::]`)
    /// or any other address is not local. Host names are resolved.
    pub fn is_local(&self) -> io::Result<bool> {
        match self {
            ListenAddr::Unix(_) => Ok(true),
            ListenAddr::Tcp(a) => {
                let mut any = false;
                for sa in a.as_str().to_socket_addrs()? {
                    if !sa.ip().is_loopback() {
                        return Ok(false);
                    }
                    any = true;
                }
                Ok(any)
            }
        }
    }

    /// The NBD URI (as understood by libnbd, qemu and fio) for `export` at this address:
    /// `nbd+unix:///EXPORT?socket=PATH` or `nbd://HOST:PORT/EXPORT`.
    ///
    /// A TCP address listening on every interface (`0.0.0.0`, `[::]`) is given as the
    /// loopback address.
    pub fn uri(&self, export: &str) -> String {
        match self {
            ListenAddr::Unix(p) => format!(
                "nbd+unix:///{}?socket={}",
                percent_encode(export, false),
                percent_encode(&p.to_string_lossy(), true)
            ),
            ListenAddr::Tcp(a) => format!("nbd://{}/{}", connectable_tcp(a), percent_encode(export, false)),
        }
    }
}

/// `host:port` with a wildcard host replaced by the loopback address of its family.
pub(crate) fn connectable_tcp(addr: &str) -> String {
    match addr.rsplit_once(':') {
        Some(("0.0.0.0", port)) => format!("127.0.0.1:{port}"),
        Some(("[::]", port)) => format!("[::1]:{port}"),
        _ => addr.to_string(),
    }
}

/// Escapes everything but RFC 3986 unreserved characters (and `/` when `keep_slash`).
fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_and_tcp_forms() {
        assert_eq!("unix:/tmp/s".parse(), Ok(ListenAddr::Unix("/tmp/s".into())));
        assert_eq!("tcp:0.0.0.0:10809".parse(), Ok(ListenAddr::Tcp("0.0.0.0:10809".into())));
        assert_eq!("tcp::10809".parse(), Ok(ListenAddr::Tcp("127.0.0.1:10809".into())));
        assert_eq!("tcp:10809".parse(), Ok(ListenAddr::Tcp("127.0.0.1:10809".into())));
        assert_eq!("tcp:[::1]:0".parse(), Ok(ListenAddr::Tcp("[::1]:0".into())));
        assert_eq!("tcp:localhost:5".parse(), Ok(ListenAddr::Tcp("localhost:5".into())));
    }

    #[test]
    fn rejects_malformed_addresses() {
        assert_eq!("unix:".parse::<ListenAddr>(), Err(AddrParseError::EmptyPath));
        assert!(matches!("http:x".parse::<ListenAddr>(), Err(AddrParseError::UnknownScheme(_))));
        assert!(matches!("tcp:host:".parse::<ListenAddr>(), Err(AddrParseError::BadPort(_))));
        assert!(matches!("tcp:host:99999".parse::<ListenAddr>(), Err(AddrParseError::BadPort(_))));
        assert!(matches!("tcp:".parse::<ListenAddr>(), Err(AddrParseError::BadPort(_))));
        assert!(matches!("tcp:host:x1".parse::<ListenAddr>(), Err(AddrParseError::BadPort(_))));
    }

    #[test]
    fn display_round_trips() {
        for s in ["unix:/run/x.sock", "tcp:127.0.0.1:1", "tcp:[::1]:2"] {
            assert_eq!(s.parse::<ListenAddr>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn only_unix_and_loopback_addresses_are_local() {
        for (a, local) in [
            ("unix:/tmp/s", true),
            ("tcp:127.0.0.1:0", true),
            ("tcp:127.1.2.3:0", true),
            ("tcp:[::1]:0", true),
            ("tcp:localhost:0", true),
            ("tcp:0.0.0.0:0", false),
            ("tcp:[::]:0", false),
            ("tcp:192.0.2.1:0", false),
        ] {
            assert_eq!(a.parse::<ListenAddr>().unwrap().is_local().unwrap(), local, "{a}");
        }
    }

    #[test]
    fn uris_for_clients() {
        let u: ListenAddr = "unix:/tmp/a b.sock".parse().unwrap();
        assert_eq!(u.uri("disk"), "nbd+unix:///disk?socket=/tmp/a%20b.sock");
        assert_eq!(u.uri(""), "nbd+unix:///?socket=/tmp/a%20b.sock");
        let t: ListenAddr = "tcp:0.0.0.0:10809".parse().unwrap();
        assert_eq!(t.uri("a/b"), "nbd://127.0.0.1:10809/a%2Fb");
        let t6: ListenAddr = "tcp:[::]:7".parse().unwrap();
        assert_eq!(t6.uri("x"), "nbd://[::1]:7/x");
    }
}
