//! Serving one device in the foreground until SIGINT/SIGTERM, then flushing: over NBD
//! (`--listen`), as the single file `DIR/NAME` of a FUSE mount (`--fuse DIR`), or as the
//! block device `/dev/ublkbN` (`--ublk [ID]`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use blockdev::BlockDevice;
use clap::{Args, ValueEnum};
use nbd::{Export, ListenAddr, Server, ServerConfig, TlsConfig};

use crate::actions::UsageError;
use crate::control;
use crate::control::gate::Gate;
use crate::control::server::{Live, Rebuild, Transport};

/// Where and how to serve.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH or tcp:HOST:PORT (TCP binds 127.0.0.1 unless told).
    /// This, --fuse or --ublk is required, except for actions that serve nothing
    /// (`open --test-passphrase`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Instead of NBD, expose the volume as the file DIR/NAME in a FUSE mount on DIR (an
    /// existing empty directory; needs /dev/fuse and fusermount3, not root). Unmounted on
    /// SIGINT/SIGTERM, and by fusermount3 if the server dies.
    #[arg(long, value_name = "DIR", conflicts_with = "listen")]
    pub fuse: Option<PathBuf>,
    /// Instead of NBD, serve the volume as the block device /dev/ublkbID (Linux ublk; the
    /// next free ID if none is given). Needs /dev/ublk-control and root, or a kernel and
    /// udev rules for unprivileged ublk. Stopped and deleted (after writing back) on
    /// SIGINT/SIGTERM; if the server dies, I/O on the device fails.
    #[arg(long, value_name = "ID", num_args = 0..=1, default_missing_value = "-1",
          allow_negative_numbers = true, conflicts_with_all = ["listen", "fuse"])]
    pub ublk: Option<i64>,
    /// ublk hardware queues (default and 0: one per CPU).
    #[arg(long, value_name = "N", requires = "ublk")]
    pub ublk_queues: Option<u16>,
    /// ublk requests in flight per queue (1..=4096; default 64).
    #[arg(long, value_name = "N", requires = "ublk")]
    pub ublk_depth: Option<u16>,
    /// Create the ublk device with user recovery: if this server dies, the device stays and
    /// a new `--ublk ID --ublk-recover` server re-attaches to it. I/O on the device waits
    /// (instead of failing) until then.
    #[arg(long, requires = "ublk")]
    pub ublk_recoverable: bool,
    /// Re-attach to the existing ublk device ID (made with --ublk-recoverable) whose server
    /// died, serving this volume on it (same size and block size).
    #[arg(long, requires = "ublk", conflicts_with = "ublk_recoverable")]
    pub ublk_recover: bool,
    /// Worker threads per NBD connection (requests in flight per client); with --fuse, the
    /// FUSE request threads; with --ublk, the threads executing requests (all queues).
    #[arg(long, default_value_t = ServerConfig::default().threads_per_connection)]
    pub threads: usize,
    /// Open the backing file with O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// Send buffer per Unix-socket connection in bytes (SO_SNDBUF, capped by the kernel at
    /// net.core.wmem_max; 0 = the kernel's default). Large reads leave in fewer pieces.
    #[arg(long, value_name = "BYTES", default_value_t = ServerConfig::default().unix_send_buffer)]
    pub send_buffer: usize,
    /// Queue-depth-1 fast path (the default): with nothing else of a connection in flight,
    /// the worker that read a small request runs it without handing the socket to another
    /// worker. Less CPU per request.
    #[arg(long, overrides_with = "no_inline_qd1")]
    pub inline_qd1: bool,
    /// Hand every request to another worker, even at queue depth 1 (with --busy-poll 0 this
    /// keeps a second CPU awake, which wakes faster on VMs).
    #[arg(long, overrides_with = "inline_qd1")]
    pub no_inline_qd1: bool,
    /// Run every request on its own worker: no batches of requests that arrived together
    /// (by default the worker that read a small request runs it itself while the next one
    /// has already arrived, and their replies leave together).
    #[arg(long)]
    pub no_inline_batch: bool,
    /// Busy polling, in microseconds (0 = off): a worker about to wait for a connection's
    /// next request first watches the socket this long without sleeping, so a queue-depth-1
    /// client's next request needs no wake-up of an idle CPU. Only queue-depth-1
    /// connections whose requests come close together poll (never over TLS), and at most
    /// half the CPUs at once.
    #[arg(long, value_name = "USECS", default_value_t = 50)]
    pub busy_poll: u64,

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

    // Running in the background (docs/book/src/running.md).
    /// Detach once the volume is served: the command exits 0 when the server is ready (or
    /// with the server's error), and the server runs on in its own session.
    #[arg(long)]
    pub daemon: bool,
    /// Write the server's process id to FILE once it serves (removed when it stops).
    #[arg(long, value_name = "FILE")]
    pub pidfile: Option<PathBuf>,
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
            inline_qd1: !self.no_inline_qd1,
            inline_batch: !self.no_inline_batch,
            busy_poll: (self.busy_poll > 0).then(|| Duration::from_micros(self.busy_poll)),
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
    /// A kernel with a usable ublk driver and the device's configuration (`--ublk`).
    #[cfg(feature = "ublk")]
    Ublk { cfg: ublk::UblkConfig },
}

/// Checks the serving options and binds the socket: a missing `--listen`, an unparsable or
/// non-loopback address without TLS, unreadable TLS credentials, or an address in use fail
/// here, before any key derivation. A client connecting before [`serve`] starts waits in
/// the socket's backlog. With `--fuse DIR`: no /dev/fuse, no fusermount3, and a DIR that is
/// missing, not a directory or not empty fail here (nothing is mounted yet).
pub fn listen(args: &ServeArgs) -> Result<Listener> {
    if let Some(id) = args.ublk {
        return listen_ublk(id, args);
    }
    if args.ublk_queues.is_some() || args.ublk_depth.is_some() || args.ublk_recoverable || args.ublk_recover {
        anyhow::bail!(UsageError(
            "--ublk-queues, --ublk-depth, --ublk-recoverable and --ublk-recover need --ublk".into()
        ));
    }
    if let Some(dir) = &args.fuse {
        if args.tls != TlsMode::Off || args.tls_certificates.is_some() || args.tls_psk.is_some() {
            anyhow::bail!(UsageError("--tls options apply to --listen, not to --fuse".into()));
        }
        fuse::check_mountpoint(dir).with_context(|| format!("cannot mount --fuse {}", dir.display()))?;
        return Ok(Listener(Endpoint::Fuse { dir: dir.clone() }));
    }
    let Some(listen) = args.listen.as_deref() else {
        anyhow::bail!(UsageError(
            "--listen ADDR, --fuse DIR or --ublk [ID] is required to serve a volume".into()
        ));
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

/// `--ublk` in a build without the `ublk` feature: refused before anything else happens.
#[cfg(not(feature = "ublk"))]
fn listen_ublk(_id: i64, _args: &ServeArgs) -> Result<Listener> {
    anyhow::bail!(UsageError(
        "this sealdisk was built without ublk support: rebuild it with `cargo build --release -p sealdisk \
         --features ublk` (needs libclang, Debian package libclang1)"
            .into()
    ))
}

/// `--ublk`: the options checked and the driver asked for its features, before any key
/// derivation. A kernel without ublk fails here.
#[cfg(feature = "ublk")]
fn listen_ublk(id: i64, args: &ServeArgs) -> Result<Listener> {
    if args.tls != TlsMode::Off || args.tls_certificates.is_some() || args.tls_psk.is_some() {
        anyhow::bail!(UsageError("--tls options apply to --listen, not to --ublk".into()));
    }
    let id =
        match id {
            -1 => None,
            n => Some(u32::try_from(n).ok().filter(|&n| n < 1 << 20).ok_or_else(|| {
                UsageError(format!("--ublk {n}: the device id must be between 0 and 1048575"))
            })?),
        };
    if args.ublk_recover && id.is_none() {
        anyhow::bail!(UsageError("--ublk-recover needs the device id: --ublk ID --ublk-recover".into()));
    }
    let cfg = ublk::UblkConfig {
        id,
        queues: args.ublk_queues.unwrap_or(0),
        depth: args.ublk_depth.unwrap_or(ublk::UblkConfig::default().depth),
        threads: args.threads.max(1),
        recoverable: args.ublk_recoverable,
        recover: args.ublk_recover,
        ..ublk::UblkConfig::default()
    };
    ublk::validate(&cfg).map_err(|e| UsageError(format!("--ublk: {e}")))?;
    ublk::check_available().context("cannot serve --ublk")?;
    Ok(Listener(Endpoint::Ublk { cfg }))
}

/// Serves the assembled volume `vol` as export `claim.name` on `listener` (NBD; or as the
/// file `DIR/name` of a FUSE mount, or as `/dev/ublkbN`) until SIGINT or SIGTERM or
/// `sealdisk close NAME`, then flushes and returns: the one way out, for every kind of
/// volume. The control socket answers `status` (with the volume's real type, tables and
/// device), and acts on what the volume's kind allows: `refresh` and `resize` rebuild a
/// plain or LUKS stack on the storage `rebuild` keeps, `luksSuspend`/`luksResume` a LUKS
/// one, and `resize` grows a standalone integrity volume (`rebuild.regrow`). When the
/// volume's storage is on rotational media the export says so (`NBD_FLAG_ROTATIONAL`, the
/// ublk device's rotational attribute). `claim` was taken (the name checked free) before
/// the unlock.
pub fn serve(
    claim: control::Claim,
    vol: volume::Volume,
    rebuild: Rebuild,
    listener: Listener,
    args: &ServeArgs,
    read_only: bool,
) -> Result<()> {
    let rotational = vol.rotational;
    let name = claim.name.clone();
    let (live, gate) = Live::from_volume(&name, vol, rebuild);
    serve_live(claim, live, gate, rotational, listener, args, read_only)
}

fn serve_live(
    claim: control::Claim,
    live: Arc<Live>,
    gate: Arc<Gate>,
    rotational: bool,
    listener: Listener,
    args: &ServeArgs,
    read_only: bool,
) -> Result<()> {
    let name = claim.name.clone();
    // The unlock and the assembly ran deeper on this thread: wipe what they left on its
    // stack (key schedule temporaries) before it serves for the volume's lifetime.
    targets::scrub_stack();
    let device: Arc<dyn BlockDevice> = gate.clone();
    let (socket, tls, listen) = match listener.0 {
        Endpoint::Nbd { socket, tls, listen } => (socket, tls, listen),
        Endpoint::Fuse { dir } => return serve_fuse(claim, live, gate, &dir, args, read_only),
        #[cfg(feature = "ublk")]
        Endpoint::Ublk { cfg } => {
            let cfg = ublk::UblkConfig { read_only, rotational, ..cfg };
            return serve_ublk(claim, live, gate, cfg, args);
        }
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
    let stats = bound.stats();
    live.set_transport(Transport {
        kind: "nbd",
        address: bound.local_addr().to_string(),
        clients: Some(Box::new(move || stats.connections())),
        stop: Box::new({
            let handle = handle.clone();
            move || handle.shutdown()
        }),
        // Clients learn the size at connect (NBD cannot tell a connected client).
        resized: None,
    });
    let control = control::server::start(claim, live.clone())?;
    crate::hardening::serving(move |signals| {
        if let Some(sig) = signals.next() {
            log::info!("signal {sig}: shutting down");
            // Suspended: held requests cannot be served without the key; fail them.
            gate.close_held();
            handle.shutdown();
        }
    })?;
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
    crate::daemon::ready(args.pidfile.as_deref())?;
    let r = bound.serve().context("NBD server failed");
    crate::daemon::stopping();
    // Gone before `close` hears back: its caller may open the name again at once.
    drop(control);
    crate::daemon::remove_pidfile();
    live.finish(&r);
    r?;
    eprintln!("sealdisk: {name} flushed and closed");
    Ok(())
}

/// Mounts `device` as `dir/name` and serves it until SIGINT/SIGTERM or `close` (which
/// unmount; a user that still has the file open, such as a loop device, is served until it
/// closes it; a second signal stops at once) or an outside unmount, then flushes.
fn serve_fuse(
    claim: control::Claim,
    live: Arc<Live>,
    gate: Arc<Gate>,
    dir: &Path,
    args: &ServeArgs,
    read_only: bool,
) -> Result<()> {
    let name = claim.name.clone();
    let device: Arc<dyn BlockDevice> = gate.clone();
    let cfg = fuse::FuseConfig { name: name.to_owned(), threads: args.threads.max(1), read_only };
    let mounted =
        fuse::mount(dir, device.clone(), &cfg).with_context(|| format!("serving {name} with FUSE"))?;
    let mut unmounter = mounted.unmounter();
    let file = dir.join(&name);
    live.set_transport(Transport {
        kind: "fuse",
        address: file.display().to_string(),
        clients: None,
        stop: Box::new({
            let u = std::sync::Mutex::new(mounted.unmounter());
            move || u.lock().unwrap_or_else(std::sync::PoisonError::into_inner).unmount()
        }),
        resized: Some(Box::new({
            let n = mounted.size_notifier();
            move |_| n.size_changed().map_err(|e| format!("telling the kernel of the FUSE file's size: {e}"))
        })),
    });
    let control = control::server::start(claim, live.clone())?;
    {
        let (file, device, gate) = (file.clone(), device.clone(), gate.clone());
        crate::hardening::serving(move |signals| {
            if let Some(sig) = signals.next() {
                log::info!("signal {sig}: unmounting {}", file.display());
                gate.close_held();
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
                eprintln!("sealdisk: signal {sig} again: stopping while {} is still open", file.display());
                let code = match device.flush() {
                    Ok(()) => 128 + sig,
                    Err(e) => {
                        eprintln!("sealdisk: flush failed: {e}");
                        1
                    }
                };
                std::process::exit(code);
            }
        })?;
    }
    let g = device.geometry();
    eprintln!(
        "sealdisk: serving {name} ({} bytes, {}-byte blocks{}) as {}",
        g.size,
        g.logical_block,
        if read_only { ", read-only" } else { "" },
        file.display()
    );
    crate::daemon::ready(args.pidfile.as_deref())?;
    // Flushed also when the session ended with an error: what was written stays written.
    let ran = mounted.run().context("FUSE server failed");
    crate::daemon::stopping();
    let flushed = if gate.is_held() {
        // Suspended: the suspend flushed everything, and there is no key to flush with.
        Ok(())
    } else {
        device.flush().with_context(|| format!("flushing {name}"))
    };
    let r = ran.and(flushed);
    drop(control);
    crate::daemon::remove_pidfile();
    live.finish(&r);
    r?;
    eprintln!("sealdisk: {name} flushed and closed");
    Ok(())
}

#[cfg(feature = "ublk")]
/// Creates (or re-attaches to) the ublk device and serves it until SIGINT/SIGTERM, which
/// stop it (the kernel writes back what it caches for the device first); then flushes and
/// deletes it.
fn serve_ublk(
    claim: control::Claim,
    live: Arc<Live>,
    gate: Arc<Gate>,
    cfg: ublk::UblkConfig,
    args: &ServeArgs,
) -> Result<()> {
    let name = claim.name.clone();
    let device: Arc<dyn BlockDevice> = gate.clone();
    let g = device.geometry();
    let read_only = cfg.read_only;
    let server =
        ublk::Server::new(device.clone(), cfg).with_context(|| format!("serving {name} with ublk"))?;
    let stop = server.stop_handle();
    live.set_transport(Transport {
        kind: "ublk",
        address: server.block_path(),
        clients: None,
        stop: Box::new({
            let stop = stop.clone();
            move || stop.stop()
        }),
        resized: Some(Box::new({
            let h = server.size_handle();
            move |bytes| h.set_size(bytes).map_err(|e| e.to_string())
        })),
    });
    let control = control::server::start(claim, live.clone())?;
    {
        let gate = gate.clone();
        crate::hardening::serving(move |signals| {
            if let Some(sig) = signals.next() {
                log::info!("signal {sig}: stopping the ublk device");
                // Suspended: held requests cannot be served without the key; fail them.
                gate.close_held();
                stop.stop();
            }
        })?;
    }
    let (queues, recoverable) = (server.queues(), server.recoverable());
    let what = format!(
        "{name} ({} bytes, {}-byte blocks{})",
        g.size,
        g.logical_block,
        if read_only { ", read-only" } else { "" },
    );
    let extra = if recoverable { ", recoverable" } else { "" };
    let pidfile = args.pidfile.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let ran = server
        .run(move |path| {
            eprintln!("sealdisk: serving {what} as {path} ({queues} queues{extra})");
            let _ = ready_tx.send(crate::daemon::ready(pidfile.as_deref()).map_err(|e| format!("{e:#}")));
        })
        .with_context(|| format!("serving {name} with ublk"));
    crate::daemon::stopping();
    let flushed = if gate.is_held() {
        // Suspended: the suspend flushed everything, and there is no key to flush with.
        Ok(())
    } else {
        device.flush().with_context(|| format!("flushing {name}"))
    };
    let readied = match ready_rx.try_recv() {
        Ok(Err(e)) => Err(anyhow::anyhow!(e)),
        _ => Ok(()),
    };
    let r = ran.and(flushed).and(readied);
    drop(control);
    crate::daemon::remove_pidfile();
    live.finish(&r);
    r?;
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
