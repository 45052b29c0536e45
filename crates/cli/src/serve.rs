//! Serving one device over NBD in the foreground until SIGINT/SIGTERM, then flushing.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use blockdev::BlockDevice;
use clap::{Args, ValueEnum};
use nbd::{Export, ListenAddr, Server, ServerConfig, TlsConfig};

use crate::actions::UsageError;

/// Where and how to serve.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where to listen: unix:PATH or tcp:HOST:PORT (TCP binds 127.0.0.1 unless told).
    /// Required, except for actions that serve nothing (`open --test-passphrase`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Worker threads per NBD connection (requests in flight per client).
    #[arg(long, default_value_t = ServerConfig::default().threads_per_connection)]
    pub threads: usize,
    /// Open the backing file with O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// Send buffer per Unix-socket connection in bytes (SO_SNDBUF, capped by the kernel at
    /// net.core.wmem_max; 0 = the kernel's default). Large reads leave in fewer pieces.
    #[arg(long, value_name = "BYTES", default_value_t = ServerConfig::default().unix_send_buffer)]
    pub send_buffer: usize,

    // TLS and who may connect (docs/security/tls.md).
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

/// Serves `device` as export `name` until SIGINT or SIGTERM, then flushes and returns.
pub fn serve(name: &str, device: Arc<dyn BlockDevice>, args: &ServeArgs, read_only: bool) -> Result<()> {
    let Some(listen) = args.listen.as_deref() else {
        anyhow::bail!(UsageError("--listen ADDR is required to serve a volume".into()));
    };
    let addr: ListenAddr = listen.parse().with_context(|| format!("invalid --listen {listen:?}"))?;
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
    let g = device.geometry();
    let export =
        Export { name: name.to_string(), description: format!("sealdisk {name}"), device, read_only };
    let config = ServerConfig {
        threads_per_connection: args.threads.max(1),
        unix_send_buffer: args.send_buffer,
        ..ServerConfig::default()
    };
    let server = match tls {
        Some(tls) => Server::new_with_tls(vec![export], config, tls),
        None => Server::new(vec![export], config),
    };
    let bound = server.bind(&addr).with_context(|| format!("listening on {listen}"))?;
    let handle = bound.shutdown_handle();
    let mut signals =
        signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
            .context("installing signal handlers")?;
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
