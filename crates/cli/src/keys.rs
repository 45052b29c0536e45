//! Reading key material from key files, stdin or the terminal — never from argv — straight
//! into secret memory ([`SecretBuf`]: locked, kept out of core dumps, wiped on drop).
//!
//! Reads go through the file descriptor (not std's buffered stdin, whose buffer would keep a
//! copy), into buffers that are replaced, never reallocated in place, as they grow, so no
//! unwiped copy of a key is left on the heap. The terminal prompt is ours for the same
//! reason (echo off on /dev/tty, read byte by byte into secret memory, echo restored).
//!
//! cryptsetup semantics for plain mode: the key file's bytes *are* the key (no hashing);
//! `--keyfile-offset` skips bytes first, `--keyfile-size` limits how many are read, and the
//! file must hold at least the key size.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd};

use anyhow::{bail, Context, Result};
use sector_crypto::secure::SecretBuf;
use sector_crypto::VolumeKey;
use zeroize::Zeroize;

/// First buffer size of a growing secret read.
const FIRST_CHUNK: usize = 4096;

/// Reads from `fd` into secret memory until EOF, `limit` bytes, or (with `line`) a newline,
/// which is consumed but not stored. Reads one byte at a time in line mode, so nothing after
/// the newline is taken from a shared stdin.
pub fn read_secret(fd: BorrowedFd<'_>, limit: usize, line: bool) -> std::io::Result<SecretBuf> {
    let mut buf = SecretBuf::zeroed(limit.min(FIRST_CHUNK));
    let mut len = 0;
    while len < limit {
        if len == buf.len() {
            // Grow by replacement: the old pages are wiped when `buf` is dropped.
            let mut bigger = SecretBuf::zeroed(buf.len().saturating_mul(2).min(limit));
            bigger[..len].copy_from_slice(&buf[..len]);
            buf = bigger;
        }
        let want = if line { len + 1 } else { buf.len() };
        let n = match rustix::io::read(fd, &mut buf[len..want]) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            break;
        }
        if line && buf[len] == b'\n' {
            buf[len] = 0;
            break;
        }
        len += n;
    }
    buf.truncate(len);
    Ok(buf)
}

/// Reads and discards `n` bytes of `fd` (fewer at EOF).
fn skip(fd: BorrowedFd<'_>, mut n: u64) -> std::io::Result<()> {
    let mut scratch = [0u8; 4096];
    while n > 0 {
        let want = usize::try_from(n).unwrap_or(usize::MAX).min(scratch.len());
        match rustix::io::read(fd, &mut scratch[..want]) {
            Ok(0) => break,
            Ok(k) => n -= k as u64,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                scratch.zeroize();
                return Err(e.into());
            }
        }
    }
    scratch.zeroize();
    Ok(())
}

/// Reads at most `limit` bytes of key file `path` (`-`: stdin) after skipping `offset`.
pub fn read_key_file(path: &str, offset: u64, limit: usize) -> Result<SecretBuf> {
    if path == "-" {
        let stdin = rustix::stdio::stdin();
        skip(stdin, offset).context("skipping --keyfile-offset bytes of stdin")?;
        return read_secret(stdin, limit, false).context("reading the key from stdin");
    }
    let mut f = File::open(path).with_context(|| format!("opening key file {path}"))?;
    f.seek(SeekFrom::Start(offset)).with_context(|| format!("seeking in key file {path}"))?;
    read_secret(f.as_fd(), limit, false).with_context(|| format!("reading key file {path}"))
}

/// The terminal and its modes while a prompt has echo off, for [`restore_terminal`].
static ECHO_OFF: std::sync::Mutex<Option<(File, rustix::termios::Termios)>> = std::sync::Mutex::new(None);

/// Restores the terminal's modes when dropped (also on error paths).
struct EchoOff<'a> {
    tty: &'a File,
    saved: rustix::termios::Termios,
}

impl Drop for EchoOff<'_> {
    fn drop(&mut self) {
        let mut g = ECHO_OFF.lock().unwrap_or_else(|e| e.into_inner());
        let _ = rustix::termios::tcsetattr(self.tty, rustix::termios::OptionalActions::Flush, &self.saved);
        *g = None;
    }
}

/// Turns terminal echo back on if a prompt turned it off: for a signal that ends the
/// process in the middle of a prompt (the signal thread calls it first).
pub fn restore_terminal() {
    let g = ECHO_OFF.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((tty, saved)) = g.as_ref() {
        let _ = rustix::termios::tcsetattr(tty, rustix::termios::OptionalActions::Flush, saved);
        let _ = std::io::Write::write_all(&mut &*tty, b"\n");
    }
}

/// Prints `text` on the controlling terminal and reads one line from it with echo off,
/// into secret memory (at most `limit` bytes; the newline is not kept).
pub fn prompt_tty(text: &str, limit: usize) -> Result<SecretBuf> {
    use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
    use std::io::Write;
    let tty =
        std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").context("opening /dev/tty")?;
    let saved = tcgetattr(&tty).context("reading the terminal's modes")?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    quiet.local_modes.insert(LocalModes::ECHONL);
    {
        let mut g = ECHO_OFF.lock().unwrap_or_else(|e| e.into_inner());
        tcsetattr(&tty, OptionalActions::Flush, &quiet).context("turning terminal echo off")?;
        *g = tty.try_clone().ok().map(|t| (t, saved.clone()));
    }
    let guard = EchoOff { tty: &tty, saved };
    (&tty).write_all(text.as_bytes()).context("writing the prompt")?;
    (&tty).flush().ok();
    let line = read_secret(tty.as_fd(), limit, true).context("reading the passphrase from the terminal")?;
    drop(guard);
    Ok(line)
}

/// Where a key comes from.
#[derive(Debug, Clone)]
pub struct KeySource {
    /// A path, or `-` for stdin.
    pub path: String,
    /// Bytes to skip first.
    pub offset: u64,
    /// Maximum bytes to read (`None`: exactly the key size).
    pub size: Option<usize>,
}

/// Reads exactly `key_bytes` bytes of key.
pub fn read_key(src: &KeySource, key_bytes: usize) -> Result<VolumeKey> {
    if let Some(limit) = src.size {
        if limit < key_bytes {
            bail!(crate::actions::UsageError(format!(
                "--keyfile-size {limit} is smaller than the key size ({key_bytes} bytes)"
            )));
        }
    }
    let buf = read_key_file(&src.path, src.offset, key_bytes)?;
    let got = buf.len();
    if got < key_bytes {
        bail!(crate::actions::UsageError(format!(
            "cannot read {key_bytes} bytes of key from {} (only {got} available)",
            if src.path == "-" { "stdin" } else { &src.path }
        )));
    }
    Ok(VolumeKey::from_secret(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_offset_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, (0u8..100).collect::<Vec<_>>()).unwrap();
        let src = KeySource { path: p.to_str().unwrap().into(), offset: 10, size: None };
        assert_eq!(read_key(&src, 32).unwrap().as_bytes(), &(10u8..42).collect::<Vec<_>>()[..]);
        let short = KeySource { offset: 80, ..src.clone() };
        let e = read_key(&short, 32).unwrap_err();
        assert!(e.to_string().contains("only 20 available"), "{e}");
        let small = KeySource { size: Some(16), ..src };
        assert!(read_key(&small, 32).is_err());
    }

    #[test]
    fn secret_reads_grow_stop_at_the_limit_and_at_a_newline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        let s = read_secret(f.as_fd(), 9000, false).unwrap();
        assert_eq!(&s[..], &data[..9000]);
        let s = read_secret(File::open(&p).unwrap().as_fd(), 1 << 20, false).unwrap();
        assert_eq!(&s[..], &data[..]);
        std::fs::write(&p, b"hunter2\nrest").unwrap();
        let f = File::open(&p).unwrap();
        let s = read_secret(f.as_fd(), 100, true).unwrap();
        assert_eq!(&s[..], b"hunter2");
        // Nothing past the newline was consumed.
        let rest = read_secret(f.as_fd(), 100, false).unwrap();
        assert_eq!(&rest[..], b"rest");
    }
}
