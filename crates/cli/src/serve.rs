//! Serving one device in the foreground until SIGINT/SIGTERM, then flushing: over NBD
//! (`--listen`), or as the single file `DIR/NAME` of a FUSE mount (`--fuse DIR`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use blockdev::BlockDevice;
use clap::{Args, ValueEnum};
use nbd::{Export, ListenAddr, Server, ServerConfig, TlsConfig};

use crate::actions::UsageError;

/// Where and how to serve.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH or tcp:HOST:PORT (TCP binds 127.0.0.1 unless told).
    /// This or --fuse is required, except for actions that serve nothing
    /// (`open --test-passphrase`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Instead of NBD, expose the volume as the file DIR/NAME in a FUSE mount on DIR (an
    /// existing empty directory; needs /dev/fuse and fusermount3, not root). Unmounted on
    /// SIGINT/SIGTERM, and by fusermount3 if the server dies.
    #[arg(long, value_name = "DIR", conflicts_with = "listen")]
    pub fuse: Option<PathBuf>,
    /// Worker threads per NBD connection (requests in flight per client); with --fuse, the
    /// FUSE request threads.
    #[arg(long, default_value_t = ServerConfig::default().threads_per_connection)]
    pub threads: usize,
    /// Open the backing file with O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// Send buffer per Unix-socket connection in bytes (SO_SNDBUF, capped by the kernel at
    /// net.core.wmem_max; 0 = the kernel's default). Large reads leave in fewer pieces.
    #[arg(long, value_name = "BYTES", default_value_t = ServerConfig::default().unix_send_buffer)]
    pub send_buffer: usize,

    // Limits against hostile or broken clients (SECURITY.md, "Hostile clients").
    /// Server-wide budget for request payloads in flight (reads and writes being received,
    /// executed, or waiting for the client to take the reply) and buffers kept for reuse;
    /// k/m/g suffixes. A connection that cannot get budget stops reading requests until it
    /// can. Default: 1g, at most a quarter of RAM.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value_t = nbd::default_memory_budget())]
    pub memory_budget: usize,
    /// The most payload bytes one connection may hold at once (k/m/g). Keeps a client that
    /// does not read its replies from taking more; --max-request is lowered to fit in it.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, default_value_t = ServerConfig::default().connection_budget)]
    pub connection_budget: usize,
    /// Largest READ/WRITE request accepted (k/m/g; advertised as the maximum block size).
    #[arg(long, value_name = "BYTES", value_parser = parse_request_size, default_value_t = ServerConfig::default().max_request)]
    pub max_request: u32,
    /// Most connections at once; further ones are closed right after accept.
    #[arg(long, value_name = "N", default_value_t = ServerConfig::default().max_connections)]
    pub max_connections: usize,
    /// Seconds a client has from connecting to selecting an export before it is
    /// disconnected (0 = no limit).
    #[arg(long, value_name = "SECS", default_value_t = ServerConfig::default().handshake_timeout.map_or(0, |d| d.as_secs()))]
    pub handshake_timeout: u64,
    /// Seconds a connection may stay without any request in flight, or with a reply the
    /// client does not take, before it is disconnected (0 = never).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub idle_timeout: u64,
    /// Permission bits of the unix socket file, octal (0600: only this user may connect;
    /// 0660 lets the socket's group in). Must include 0600.
    #[arg(long, value_name = "MODE", value_parser = parse_socket_mode, default_value = "0600")]
    pub socket_mode: u32,

    // TLS and who may connect (SECURITY.md, "Who may connect: TLS").
    /// NBD TLS (STARTTLS): off; on (clients choose); require (nothing but STARTTLS before
    /// TLS, as nbdkit's --tls=require). Needs --tls-certificates or --tls-psk.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = TlsMode::Off)]
    pub tls: TlsMode,
    /// x509 credentials: DIR/server-cert.pem, DIR/server-key.pem, and DIR/ca-cert.pem (and
    /// optionally DIR/ca-crl.pem) for --tls-verify-peer; nbdkit's and qemu-nbd's layout.
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    pub tls_certificates: Option<PathBuf>,
    /// TLS-PSK keys: psktool's key file, one `identity:hexkey` line per client.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Only clients with a certificate signed by DIR/ca-cert.pem may connect.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Listen on a non-loopback TCP address without --tls=require. Anyone who reaches the
    /// port can then read and write the plaintext volume.
    #[arg(long)]
    pub insecure_listen: bool,
}

/// A byte count with an optional k/m/g suffix.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let n = crate::actions::luks::parse_size(s)?;
    usize::try_from(n).map_err(|_| format!("{s:?} is too large"))
}

fn parse_request_size(s: &str) -> Result<u32, String> {
    let n = crate::actions::luks::parse_size(s)?;
    if !(4096..=1 << 30).contains(&n) {
        return Err(format!("{s:?} must be between 4k and 1g"));
    }
    Ok(n as u32)
}

/// An octal permission mode such as 0600 or 660.
fn parse_socket_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{s:?} is not an octal mode"))?;
    if m > 0o777 || m & 0o600 != 0o600 {
        return Err(format!("socket mode {s} must be at most 0777 and include owner read and write (0600)"));
    }
    Ok(m)
}

impl ServeArgs {
    /// The server configuration these flags describe.
    pub fn server_config(&self) -> ServerConfig {
        let secs = |n: u64| (n > 0).then(|| Duration::from_secs(n));
        ServerConfig {
            threads_per_connection: self.threads.max(1),
            unix_send_buffer: self.send_buffer,
            memory_budget: self.memory_budget,
            connection_budget: self.connection_budget,
            max_request: self.max_request,
            max_connections: self.max_connections.max(1),
            handshake_timeout: secs(self.handshake_timeout),
            idle_timeout: secs(self.idle_timeout),
            socket_mode: self.socket_mode,
            ..ServerConfig::default()
        }
    }
}

/// `--tls`: nbdkit's modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TlsMode {
    /// `NBD_OPT_STARTTLS` is answered "unsupported".
    Off,
    /// TLS is offered; plaintext clients are served too.
    On,
    /// Every client must start TLS before anything else.
    Require,
}

/// The TLS configuration `args` ask for, checked for consistency; `None` with `--tls=off`.
fn tls_config(args: &ServeArgs) -> Result<Option<TlsConfig>> {
    if args.tls_verify_peer && args.tls_certificates.is_none() {
        anyhow::bail!(UsageError("--tls-verify-peer needs --tls-certificates DIR".into()));
    }
    let cfg = match (args.tls, &args.tls_certificates, &args.tls_psk) {
        (TlsMode::Off, None, None) => return Ok(None),
        (TlsMode::Off, _, _) => {
            anyhow::bail!(UsageError(
                "--tls-certificates and --tls-psk need --tls=on or --tls=require".into()
            ))
        }
        (_, Some(dir), None) => TlsConfig::x509(dir, args.tls_verify_peer)
            .with_context(|| format!("loading TLS certificates from {}", dir.display()))?,
        (_, None, Some(file)) => {
            TlsConfig::psk(file).with_context(|| format!("loading TLS-PSK keys from {}", file.display()))?
        }
        (_, _, _) => anyhow::bail!(UsageError(
            "--tls=on/require needs --tls-certificates DIR or --tls-psk FILE".into()
        )),
    };
    Ok(Some(cfg.required(args.tls == TlsMode::Require)))
}

/// Where [`serve`] will serve, with everything about it that can fail cheaply done before
/// a volume is unlocked ([`listen`]).
#[derive(Debug)]
pub struct Listener(Endpoint);

#[derive(Debug)]
enum Endpoint {
    /// A listening socket and the TLS configuration to serve it with.
    Nbd { socket: nbd::Listening, tls: Option<TlsConfig>, listen: String },
    /// A checked mount directory (`--fuse`).
    Fuse { dir: PathBuf },
}

/// Checks the serving options and binds the socket: a missing `--listen`, an unparsable or
/// non-loopback address without TLS, unreadable TLS credentials, or an address in use fail
/// here, before any key derivation. A client connecting before [`serve`] starts waits in
/// the socket's backlog. With `--fuse DIR`: no /dev/fuse, no fusermount3, and a DIR that is
/// missing, not a directory or not empty fail here (nothing is mounted yet).
pub fn listen(args: &ServeArgs) -> Result<Listener> {
    if let Some(dir) = &args.fuse {
        if args.tls != TlsMode::Off || args.tls_certificates.is_some() || args.tls_psk.is_some() {
            anyhow::bail!(UsageError("--tls options apply to --listen, not to --fuse".into()));
        }
        fuse::check_mountpoint(dir).with_context(|| format!("cannot mount --fuse {}", dir.display()))?;
        return Ok(Listener(Endpoint::Fuse { dir: dir.clone() }));
    }
    let Some(listen) = args.listen.as_deref() else {
        anyhow::bail!(UsageError("--listen ADDR or --fuse DIR is required to serve a volume".into()));
    };
    let addr: ListenAddr =
        listen.parse().map_err(|e| UsageError(format!("invalid --listen {listen:?}: {e}")))?;
    let tls = tls_config(args)?;
    let local = addr.is_local().with_context(|| format!("resolving --listen {listen:?}"))?;
    if !local && args.tls != TlsMode::Require {
        if !args.insecure_listen {
            anyhow::bail!(UsageError(format!(
                "--listen {listen} is reachable from other machines: serve it with --tls=require \
                 (and --tls-verify-peer or --tls-psk to authenticate clients), or pass \
                 --insecure-listen to serve it without"
            )));
        }
        log::warn!("--insecure-listen: {listen} serves without required TLS; anyone who reaches it can read and write");
    }
    let socket =
        nbd::Listening::bind(&addr, args.socket_mode).with_context(|| format!("listening on {listen}"))?;
    Ok(Listener(Endpoint::Nbd { socket, tls, listen: listen.to_owned() }))
}

/// Serves `device` as export `name` on `listener` (or as the file `DIR/name` of a FUSE
/// mount) until SIGINT or SIGTERM, then flushes and returns. With `rotational` (the volume's
/// storage is on rotational media) the export says so (`NBD_FLAG_ROTATIONAL`).
pub fn serve(
    name: &str,
    device: Arc<dyn BlockDevice>,
    rotational: bool,
    listener: Listener,
    args: &ServeArgs,
    read_only: bool,
) -> Result<()> {
    let (socket, tls, listen) = match listener.0 {
        Endpoint::Nbd { socket, tls, listen } => (socket, tls, listen),
        Endpoint::Fuse { dir } => return serve_fuse(name, device, &dir, args, read_only),
    };
    log::debug!("serving on {listen}");
    let g = device.geometry();
    let export = Export {
        name: name.to_string(),
        description: format!("sealdisk {name}"),
        device,
        read_only,
        rotational,
    };
    let config = args.server_config();
    let server = match tls {
        Some(tls) => Server::new_with_tls(vec![export], config, tls),
        None => Server::new(vec![export], config),
    };
    let bound = server.attach(socket);
    let handle = bound.shutdown_handle();
    let mut signals =
        signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
            .context("installing signal handlers")?;
    crate::hardening::serving();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                log::info!("signal {sig}: shutting down");
                handle.shutdown();
            }
        })
        .context("starting the signal thread")?;
    eprintln!(
        "sealdisk: serving {name} ({} bytes, {}-byte blocks{}) on {}{}",
        g.size,
        g.logical_block,
        if read_only { ", read-only" } else { "" },
        bound.local_addr(),
        match args.tls {
            TlsMode::Off => "",
            TlsMode::On => " (TLS offered)",
            TlsMode::Require => " (TLS required)",
        }
    );
    bound.serve().context("NBD server failed")?;
    eprintln!("sealdisk: {name} flushed and closed");
    Ok(())
}

/// Mounts `device` as `dir/name` and serves it until SIGINT/SIGTERM (which unmounts; a user
/// that still has the file open, such as a loop device, is served until it closes it; a
/// second signal stops at once) or an outside unmount, then flushes.
fn serve_fuse(
    name: &str,
    device: Arc<dyn BlockDevice>,
    dir: &Path,
    args: &ServeArgs,
    read_only: bool,
) -> Result<()> {
    let cfg = fuse::FuseConfig { name: name.to_owned(), threads: args.threads.max(1), read_only };
    let mounted =
        fuse::mount(dir, device.clone(), &cfg).with_context(|| format!("serving {name} with FUSE"))?;
    let mut unmounter = mounted.unmounter();
    let mut signals =
        signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
            .context("installing signal handlers")?;
    crate::hardening::serving();
    let file = dir.join(name);
    {
        let (file, device) = (file.clone(), device.clone());
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let mut signals = signals.forever();
                if let Some(sig) = signals.next() {
                    log::info!("signal {sig}: unmounting {}", file.display());
                    unmounter.unmount();
                    // Still here a moment later: someone (a loop device, say) has the file
                    // open, and the kernel keeps it until they close it.
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    eprintln!(
                        "sealdisk: {} unmounted but still open; serving it until it is closed \
                         (signal again to stop now)",
                        file.display()
                    );
                }
                if let Some(sig) = signals.next() {
                    // The file is still open somewhere (the first signal's unmount waits for
                    // its last user): stop now; its users get errors from here on.
                    eprintln!(
                        "sealdisk: signal {sig} again: stopping while {} is still open",
                        file.display()
                    );
                    let code = match device.flush() {
                        Ok(()) => 128 + sig,
                        Err(e) => {
                            eprintln!("sealdisk: flush failed: {e}");
                            1
                        }
                    };
                    std::process::exit(code);
                }
            })
            .context("starting the signal thread")?;
    }
    let g = device.geometry();
    eprintln!(
        "sealdisk: serving {name} ({} bytes, {}-byte blocks{}) as {}",
        g.size,
        g.logical_block,
        if read_only { ", read-only" } else { "" },
        file.display()
    );
    // Flushed also when the session ended with an error: what was written stays written.
    let ran = mounted.run().context("FUSE server failed");
    let flushed = device.flush().with_context(|| format!("flushing {name}"));
    ran?;
    flushed?;
    eprintln!("sealdisk: {name} flushed and closed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn defaults_are_the_servers() {
        let a = Cli::try_parse_from(["x"]).unwrap().serve;
        let c = a.server_config();
        let d = ServerConfig::default();
        assert_eq!(c, ServerConfig { memory_budget: c.memory_budget, ..d.clone() });
        assert_eq!(c.memory_budget, nbd::default_memory_budget());
        assert_eq!(c.handshake_timeout, Some(Duration::from_secs(10)));
        assert_eq!((c.idle_timeout, c.socket_mode), (None, 0o600));
    }

    #[test]
    fn limits_are_taken_from_the_flags() {
        let a = Cli::try_parse_from([
            "x",
            "--memory-budget",
            "512m",
            "--connection-budget",
            "16m",
            "--max-request",
            "4m",
            "--max-connections",
            "8",
            "--handshake-timeout",
            "0",
            "--idle-timeout",
            "30",
            "--socket-mode",
            "0660",
        ])
        .unwrap()
        .serve;
        let c = a.server_config();
        assert_eq!((c.memory_budget, c.connection_budget, c.max_request), (512 << 20, 16 << 20, 4 << 20));
        assert_eq!((c.max_connections, c.handshake_timeout), (8, None));
        assert_eq!((c.idle_timeout, c.socket_mode), (Some(Duration::from_secs(30)), 0o660));
    }

    #[test]
    fn bad_limits_are_refused() {
        for bad in [
            &["--socket-mode", "0400"][..],
            &["--socket-mode", "1777"],
            &["--socket-mode", "rw"],
            &["--max-request", "2g"],
            &["--max-request", "512"],
            &["--memory-budget", "lots"],
        ] {
            let mut argv = vec!["x"];
            argv.extend_from_slice(bad);
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_socket_mode("600"), Ok(0o600));
        assert_eq!(parse_socket_mode("0o644"), Ok(0o644));
    }
}
