//! Serving one device over NBD in the foreground until SIGINT/SIGTERM, then flushing.

use std::sync::Arc;

use anyhow::{Context, Result};
use blockdev::BlockDevice;
use clap::Args;
use nbd::{Export, ListenAddr, Server, ServerConfig};

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
}

/// Serves `device` as export `name` until SIGINT or SIGTERM, then flushes and returns.
pub fn serve(name: &str, device: Arc<dyn BlockDevice>, args: &ServeArgs, read_only: bool) -> Result<()> {
    let Some(listen) = args.listen.as_deref() else {
        anyhow::bail!(crate::actions::UsageError("--listen ADDR is required to serve a volume".into()));
    };
    let addr: ListenAddr = listen.parse().with_context(|| format!("invalid --listen {listen:?}"))?;
    let g = device.geometry();
    let export =
        Export { name: name.to_string(), description: format!("sealdisk {name}"), device, read_only };
    let config = ServerConfig {
        threads_per_connection: args.threads.max(1),
        unix_send_buffer: args.send_buffer,
        ..ServerConfig::default()
    };
    let server = Server::new(vec![export], config);
    let bound = server.bind(&addr).with_context(|| format!("listening on {listen}"))?;
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
        "sealdisk: serving {name} ({} bytes, {}-byte blocks{}) on {}",
        g.size,
        g.logical_block,
        if read_only { ", read-only" } else { "" },
        listen
    );
    bound.serve().context("NBD server failed")?;
    eprintln!("sealdisk: {name} flushed and closed");
    Ok(())
}
