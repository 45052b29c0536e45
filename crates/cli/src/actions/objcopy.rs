//! `sealdisk import FILE URI` and `sealdisk export URI FILE`: move a volume's bytes between
//! a local file (or block device) and object storage, unchanged (a LUKS volume stays a LUKS
//! volume that cryptsetup opens), skipping holes and zero runs on both sides.
//!
//! ```text
//!   import: FILE ─ allocation/zero check per object-sized chunk ─► ObjectDevice (new volume,
//!           size= from the file) ─ flush: every object uploaded ─► done
//!   export: ObjectDevice (read-only, no lease) ─ absent objects skipped ─► FILE (new, sparse)
//! ```
//! Chunks are copied by a few threads at once, so downloads and uploads overlap.

use std::io::IsTerminal;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use blockdev::{BlockDevice, ExtentFlags, WriteFlags};
use clap::Args;

/// `import FILE URI`.
#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// The local file or block device to upload.
    pub file: String,
    /// Where the new volume goes: `s3://bucket/prefix?endpoint=…` (its size is the file's;
    /// `object_size=` chooses the object size). The prefix must be empty.
    pub uri: String,
    /// Copy threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
}

/// `export URI FILE`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The volume on object storage (`s3://bucket/prefix?endpoint=…`).
    pub uri: String,
    /// The file to create (it must not exist); holes where the volume has no objects.
    pub file: String,
    /// Copy threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
}

fn bar(verb: &str, total: u64) -> Option<indicatif::ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{verb} {{bar:40}} {{bytes}}/{{total_bytes}} {{binary_bytes_per_sec}} ETA {{eta}}"
            ))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    })
}

/// Runs `copy(off, len)` over `[0, size)` in `chunk`-sized pieces on `threads` threads.
fn parallel(
    size: u64,
    chunk: u64,
    threads: usize,
    verb: &str,
    copy: impl Fn(u64, u64) -> Result<bool> + Sync,
) -> Result<u64> {
    let next = AtomicU64::new(0);
    let stored = AtomicU64::new(0);
    let pb = bar(verb, size);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads.clamp(1, 64))
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let off = next.fetch_add(chunk, Ordering::Relaxed);
                        if off >= size {
                            return Ok(());
                        }
                        let len = chunk.min(size - off);
                        if copy(off, len)? {
                            stored.fetch_add(len, Ordering::Relaxed);
                        }
                        let d = done.fetch_add(len, Ordering::Relaxed) + len;
                        if let Some(b) = &pb {
                            b.set_position(d);
                        }
                        if crate::hardening::stop_requested().is_some() {
                            bail!("interrupted");
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("a copy thread panicked"))??;
        }
        Ok(())
    })?;
    if let Some(b) = pb {
        b.finish_and_clear();
    }
    Ok(stored.load(Ordering::Relaxed))
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|x| *x == 0)
}

/// Whether `[off, off+len)` of `dev` is known to read as zeroes.
fn known_zero(dev: &dyn BlockDevice, off: u64, len: u64) -> bool {
    dev.allocation(off, len, 1)
        .map(|e| e.len() == 1 && e[0].len == len && e[0].flags.contains(ExtentFlags::ZERO))
        .unwrap_or(false)
}

fn with_size(uri: &str, size: u64) -> String {
    let sep = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{sep}size={size}")
}

/// `sealdisk import FILE URI`.
pub fn import(a: ImportArgs) -> Result<()> {
    let so =
        volume::StorageOptions { read_only: true, lock: blockdev::FileLock::Shared, ..Default::default() };
    let src = volume::storage::open(&a.file, &so).with_context(|| format!("opening {}", a.file))?;
    let size = src.size();
    let loc = objstore::Locator::parse(&a.uri)?;
    if let Some(s) = loc.size.filter(|s| *s != size) {
        bail!("{}: size={s} disagrees with {} ({size} bytes); leave size= out", loc.display(), a.file);
    }
    let uri = if loc.size.is_some() { a.uri.clone() } else { with_size(&a.uri, size) };
    let dst = objstore::open(&uri, objstore::OpenOptions { read_only: false, create: true })
        .with_context(|| format!("creating the volume {}", loc.display()))?;
    let dst = Arc::new(dst);
    let chunk = dst.object_size();
    let src_dev = Arc::clone(&src.device);
    let stored = parallel(size, chunk, a.threads, "Importing", |off, len| {
        if known_zero(&*src_dev, off, len) {
            return Ok(false);
        }
        let mut buf = vec![0u8; len as usize];
        src_dev.read_at(off, &mut buf).with_context(|| format!("reading {} at {off}", a.file))?;
        if is_zero(&buf) {
            return Ok(false);
        }
        dst.write_at(off, &buf, WriteFlags::empty())
            .with_context(|| format!("writing {} at {off}", loc.display()))?;
        Ok(true)
    })
    .with_context(|| format!("importing into {} (the partial volume is left there)", loc.display()))?;
    dst.flush().with_context(|| format!("uploading to {}", loc.display()))?;
    eprintln!("Imported {size} bytes into {} ({stored} bytes in objects, the rest zeroes).", loc.display());
    Ok(())
}

/// `sealdisk export URI FILE`.
pub fn export(a: ExportArgs) -> Result<()> {
    let loc = objstore::Locator::parse(&a.uri)?;
    let src = objstore::open(&a.uri, objstore::OpenOptions { read_only: true, create: false })
        .with_context(|| format!("opening {}", loc.display()))?;
    let size = src.geometry().size;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&a.file)
        .with_context(|| format!("creating {} (it must not exist)", a.file))?;
    f.set_len(size).with_context(|| format!("sizing {}", a.file))?;
    let stored = parallel(size, src.object_size(), a.threads, "Exporting", |off, len| {
        if known_zero(&src, off, len) {
            return Ok(false);
        }
        let mut buf = vec![0u8; len as usize];
        src.read_at(off, &mut buf).with_context(|| format!("reading {} at {off}", loc.display()))?;
        if is_zero(&buf) {
            return Ok(false);
        }
        f.write_all_at(&buf, off).with_context(|| format!("writing {} at {off}", a.file))?;
        Ok(true)
    })
    .with_context(|| format!("exporting to {} (the file is incomplete)", a.file))?;
    f.sync_all().with_context(|| format!("syncing {}", a.file))?;
    eprintln!("Exported {size} bytes from {} to {} ({stored} bytes of data).", loc.display(), a.file);
    Ok(())
}
