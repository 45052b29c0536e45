//! Reading key material from key files or stdin — never from argv.
//!
//! cryptsetup semantics for plain mode: the key file's bytes *are* the key (no hashing);
//! `--keyfile-offset` skips bytes first, `--keyfile-size` limits how many are read, and the
//! file must hold at least the key size.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use anyhow::{bail, Context, Result};
use sector_crypto::VolumeKey;
use zeroize::Zeroizing;

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
    let mut buf = Zeroizing::new(vec![0u8; key_bytes]);
    let got = if src.path == "-" {
        let mut stdin = std::io::stdin().lock();
        skip(&mut stdin, src.offset).context("skipping --keyfile-offset bytes of stdin")?;
        read_full(&mut stdin, &mut buf).context("reading the key from stdin")?
    } else {
        let mut f = File::open(&src.path).with_context(|| format!("opening key file {}", src.path))?;
        f.seek(SeekFrom::Start(src.offset)).with_context(|| format!("seeking in key file {}", src.path))?;
        read_full(&mut f, &mut buf).with_context(|| format!("reading key file {}", src.path))?
    };
    if got < key_bytes {
        bail!(crate::actions::UsageError(format!(
            "cannot read {key_bytes} bytes of key from {} (only {got} available)",
            if src.path == "-" { "stdin" } else { &src.path }
        )));
    }
    Ok(VolumeKey::new(buf.to_vec()))
}

fn skip(r: &mut impl Read, n: u64) -> std::io::Result<()> {
    std::io::copy(&mut r.take(n), &mut std::io::sink()).map(|_| ())
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
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
}
