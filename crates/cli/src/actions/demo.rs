//! `sealdisk demo`, one of the README's first commands: a temporary volume served to a real NBD client.
//!
//! Makes a temporary plain volume (aes-xts-plain64, 512-bit random key, 4096-byte sectors,
//! a 1 MiB payload offset), serves it over a unix socket in-process, has a real NBD client
//! (nbdcopy, else qemu-io) write random data and read it back, then checks the backing file
//! holds ciphertext that decrypts to the data. No root, no setup.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use blockdev::BlockDevice;
use clap::Args;
use formats::dm::{CryptOptions, CryptTable};
use nbd::{Export, ListenAddr, Server, ServerConfig};
use rand::RngCore;
use volume::OpenOptions;
use zeroize::Zeroizing;

/// Arguments of `sealdisk demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Payload size in MiB.
    #[arg(long, default_value_t = 256)]
    pub size_mib: u64,
    /// Keep the temporary directory (prints its path).
    #[arg(long)]
    pub keep: bool,
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

fn mibps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64().max(1e-9)
}

/// Runs the demo.
pub fn run(a: DemoArgs) -> Result<()> {
    ensure!(a.size_mib > 0 && a.size_mib <= 64 * 1024, "--size-mib must be between 1 and 65536");
    let dir = tempfile::Builder::new().prefix("sealdisk-demo-").tempdir().context("creating a temp dir")?;
    let size = a.size_mib << 20;
    let offset_sectors = 2048u64; // 1 MiB, like a LUKS header area
    let backing = dir.path().join("backing.img");
    std::fs::File::create(&backing)
        .and_then(|f| f.set_len(size + offset_sectors * 512))
        .context("creating the backing file")?;

    let mut key = Zeroizing::new(vec![0u8; 64]);
    rand::rng().fill_bytes(&mut key);
    let table = CryptTable {
        len: size / 512,
        cipher: "aes-xts-plain64".into(),
        key,
        iv_offset: 0,
        device: backing.to_str().context("temp path is not UTF-8")?.to_string(),
        offset: offset_sectors,
        options: CryptOptions { sector_size: Some(4096), ..CryptOptions::default() },
    };
    let vol = volume::open_crypt_table(&table, &OpenOptions::default())?;
    let mut masked = table.clone();
    masked.key.iter_mut().for_each(|b| *b = 0);
    println!("volume : {masked}");

    let sock = dir.path().join("nbd.sock");
    let server = Server::new(
        vec![Export {
            name: "demo".into(),
            description: "sealdisk demo".into(),
            device: Arc::clone(&vol.device),
            read_only: false,
            rotational: false,
        }],
        ServerConfig::default(),
    );
    let bound = server.bind(&ListenAddr::Unix(sock.clone())).context("binding the demo socket")?;
    let handle = bound.shutdown_handle();
    let thread = std::thread::spawn(move || bound.serve());
    let uri = format!("nbd+unix:///demo?socket={}", sock.display());
    println!("served : {uri}");

    let result = exercise(dir.path(), &uri, size, &vol.device, &table);
    handle.shutdown();
    let served = thread.join().map_err(|_| anyhow::anyhow!("server thread panicked"))?;
    served.context("NBD server")?;
    if a.keep {
        let kept = dir.keep();
        println!("kept   : {}", kept.display());
    }
    result
}

fn exercise(dir: &Path, uri: &str, size: u64, dev: &Arc<dyn BlockDevice>, table: &CryptTable) -> Result<()> {
    let src = dir.join("source.bin");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&src)?);
        let mut buf = vec![0u8; 1 << 20];
        for _ in 0..size >> 20 {
            rand::rng().fill_bytes(&mut buf);
            f.write_all(&buf)?;
        }
        f.flush()?;
    }
    let (client, write_t, read_t) = if have("nbdcopy") {
        let out = dir.join("readback.bin");
        let t0 = Instant::now();
        run_tool(Command::new("nbdcopy").arg(&src).arg(uri))?;
        let w = t0.elapsed();
        let t0 = Instant::now();
        run_tool(Command::new("nbdcopy").arg(uri).arg(&out))?;
        let r = t0.elapsed();
        ensure!(files_equal(&src, &out)?, "data read back through NBD differs from what was written");
        ("nbdcopy", w, r)
    } else if have("qemu-io") {
        let t0 = Instant::now();
        let cmd = format!("write -P 0x5a 0 {size}");
        run_tool(Command::new("qemu-io").args(["-f", "raw", "-c", &cmd, uri]))?;
        let w = t0.elapsed();
        let t0 = Instant::now();
        let cmd = format!("read -P 0x5a 0 {size}");
        run_tool(Command::new("qemu-io").args(["-f", "raw", "-c", &cmd, uri]))?;
        let r = t0.elapsed();
        std::fs::write(&src, vec![0x5au8; size as usize])?;
        ("qemu-io", w, r)
    } else {
        bail!("no NBD client found: install libnbd-bin (nbdcopy) or qemu-utils (qemu-io)");
    };

    // The backing file must hold ciphertext, and an independently keyed cipher must decrypt it.
    let backing = std::fs::read(&table.device).context("reading the backing file")?;
    let payload = &backing[(table.offset * 512) as usize..];
    let plain = std::fs::read(&src)?;
    let same = payload.chunks(4096).zip(plain.chunks(4096)).filter(|(a, b)| a == b).count();
    ensure!(same == 0, "{same} blocks of the backing file hold plaintext");
    let mut check = payload[..1 << 20].to_vec();
    let spec: sector_crypto::CipherSpec = table.cipher.parse()?;
    let cipher = sector_crypto::SectorCipher::new(
        &spec,
        &sector_crypto::VolumeKey::new(table.key.to_vec()),
        sector_crypto::SectorParams { sector_size: 4096, iv_offset: 0, iv_large_sectors: false },
    )?;
    cipher.decrypt(0, &mut check)?;
    ensure!(check == plain[..1 << 20], "backing ciphertext does not decrypt to the data");
    let g = dev.geometry();

    println!("client : {client}");
    println!("write  : {} MiB in {:.2?} ({:.0} MiB/s)", size >> 20, write_t, mibps(size, write_t));
    println!("read   : {} MiB in {:.2?} ({:.0} MiB/s)", size >> 20, read_t, mibps(size, read_t));
    println!(
        "check  : read-back identical; backing file holds ciphertext only ({} blocks of {} bytes); decrypts independently",
        g.size / u64::from(g.logical_block),
        g.logical_block
    );
    println!("result : OK");
    Ok(())
}

fn run_tool(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn files_equal(a: &Path, b: &Path) -> Result<bool> {
    let (x, y) = (std::fs::read(a)?, std::fs::read(b)?);
    Ok(x.len() <= y.len() && x[..] == y[..x.len()])
}
