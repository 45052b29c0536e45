//! What the LUKS actions share: passphrases (key file, stdin, terminal prompt), the
//! `yesDialog` confirmation, PBKDF options, opening the metadata device, exit codes.
//!
//! Passphrase sources, as cryptsetup reads them:
//!
//! | source                              | what is read                                        |
//! |-------------------------------------|-----------------------------------------------------|
//! | `--key-file FILE`                   | the file's bytes from `--keyfile-offset`, at most `--keyfile-size` (default: all, ≤ 8 MiB) |
//! | `--key-file -`                      | stdin the same way, to EOF, newlines included        |
//! | no key file, stdin is a terminal    | a prompt on /dev/tty with echo off, without the newline |
//! | no key file, stdin is not a terminal| stdin up to the first newline                        |
//!
//! Passphrases never come from argv.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};
use clap::Args;
use sector_crypto::kdf::{HashAlg, Passphrase};
use volume::luks::{KdfLimits, LuksError, PbkdfParams, PbkdfType};
use volume::{PassphraseSource, Storage, VolumeError};

use super::UsageError;

/// cryptsetup's default ceiling on key-file size (`DEFAULT_KEYFILE_SIZE_MAXKB`, 8 MiB).
const KEYFILE_MAX: usize = 8 << 20;

/// The user declined a confirmation (cryptsetup: -EPERM, exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("Operation aborted.")]
pub struct Aborted;

/// Passphrases given twice differ (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("Passphrases do not match.")]
pub struct Mismatch;

/// Where the (existing) passphrase comes from.
#[derive(Debug, Clone, Args)]
pub struct KeyArgs {
    /// Read the passphrase from FILE (`-` for stdin) instead of prompting.
    #[arg(long, short = 'd', value_name = "FILE")]
    pub key_file: Option<String>,
    /// Skip this many bytes of the key file.
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    pub keyfile_offset: u64,
    /// Read at most this many bytes of the key file.
    #[arg(long, short = 'l', value_name = "BYTES")]
    pub keyfile_size: Option<usize>,
    /// How often a passphrase typed on the terminal may be retried (0: without limit). A key
    /// file or a pipe gets one try.
    #[arg(long, short = 'T', default_value_t = DEFAULT_TRIES, value_name = "N")]
    pub tries: u32,
}

/// cryptsetup's default `--tries`.
pub const DEFAULT_TRIES: u32 = 3;

/// Bounds on the KDF costs an existing header may ask for (see SECURITY.md, "Hostile
/// images"). A header over a bound is refused before any derivation, with a message naming
/// the field, its value and the option below that lifts the bound.
#[derive(Debug, Clone, Args)]
pub struct KdfLimitArgs {
    /// Refuse keyslots and digests with more PBKDF2 iterations than N
    /// (default 268435456, 2^28).
    #[arg(long, value_name = "N")]
    pub max_pbkdf2_iterations: Option<u32>,
    /// Refuse Argon2 keyslots whose memory (KiB) × time cost exceeds this
    /// (default 134217728, e.g. 1 GiB × 128 passes).
    #[arg(long, value_name = "KIB_PASSES")]
    pub max_argon2_cost: Option<u64>,
    /// Lift every soft KDF bound: PBKDF2 iterations, Argon2 cost and lanes, and Argon2
    /// memory above half of RAM (Argon2 memory stays at most 4 GiB, as in cryptsetup).
    #[arg(long)]
    pub allow_expensive_kdf: bool,
}

impl KdfLimitArgs {
    /// The bounds these options ask for.
    pub fn limits(&self) -> KdfLimits {
        let mut l = if self.allow_expensive_kdf { KdfLimits::unbounded() } else { KdfLimits::default() };
        if let Some(n) = self.max_pbkdf2_iterations {
            l.max_pbkdf2_iterations = n;
        }
        if let Some(n) = self.max_argon2_cost {
            l.max_argon2_cost = n;
        }
        l
    }
}

/// PBKDF options for new keyslots (cryptsetup's names).
#[derive(Debug, Clone, Args)]
pub struct PbkdfArgs {
    /// PBKDF for new keyslots: pbkdf2, argon2i, argon2id (LUKS2 default argon2id).
    #[arg(long, value_name = "TYPE")]
    pub pbkdf: Option<String>,
    /// Hash for PBKDF2, the AF splitter and the volume key digest.
    #[arg(long = "hash", default_value = "sha256")]
    pub hash: String,
    /// PBKDF benchmark target, in milliseconds.
    #[arg(long, short = 'i', default_value_t = 2000, value_name = "MS")]
    pub iter_time: u64,
    /// Skip the benchmark: PBKDF2 iterations, or the Argon2 time cost.
    #[arg(long, value_name = "N")]
    pub pbkdf_force_iterations: Option<u32>,
    /// Argon2 memory in KiB (the maximum when benchmarking).
    #[arg(long, value_name = "KIB")]
    pub pbkdf_memory: Option<u32>,
    /// Argon2 parallel threads.
    #[arg(long, value_name = "N")]
    pub pbkdf_parallel: Option<u32>,
}

impl PbkdfArgs {
    /// The volume-level parameters.
    pub fn params(&self) -> Result<PbkdfParams> {
        let kind = match &self.pbkdf {
            Some(k) => Some(k.parse::<PbkdfType>().map_err(|e| UsageError(e.to_string()))?),
            None => None,
        };
        let hash: HashAlg = self.hash.parse().map_err(|e| UsageError(format!("--hash: {e}")))?;
        Ok(PbkdfParams {
            kind,
            hash,
            iter_time: std::time::Duration::from_millis(self.iter_time.max(1)),
            force_iterations: self.pbkdf_force_iterations,
            memory_kib: self.pbkdf_memory,
            parallel: self.pbkdf_parallel,
        })
    }
}

/// Reads a passphrase from a key file (or stdin for `-`), cryptsetup style.
pub fn read_keyfile(path: &str, offset: u64, size: Option<usize>) -> Result<Passphrase> {
    let limit = size.unwrap_or(KEYFILE_MAX);
    let mut buf = crate::keys::read_key_file(path, offset, limit.saturating_add(1))?;
    if size.is_none() && buf.len() > KEYFILE_MAX {
        bail!(UsageError(format!("key file {path} is larger than {KEYFILE_MAX} bytes")));
    }
    if let Some(s) = size {
        if buf.len() < s {
            bail!(UsageError(format!("cannot read {s} bytes from key file {path}")));
        }
        buf.truncate(s);
    }
    if buf.is_empty() {
        bail!(UsageError(format!("key file {path} is empty")));
    }
    Ok(Passphrase::from_secret(buf))
}

/// Prompts for a passphrase: on the terminal without echo, or one line of stdin (at most
/// [`KEYFILE_MAX`] bytes either way), read straight into secret memory.
pub fn prompt(text: &str) -> Result<Passphrase> {
    let mut line = if std::io::stdin().is_terminal() {
        crate::keys::prompt_tty(text, KEYFILE_MAX)?
    } else {
        crate::keys::read_secret(rustix::stdio::stdin(), KEYFILE_MAX, true)
            .context("reading the passphrase from stdin")?
    };
    while line.last() == Some(&b'\r') {
        line.truncate(line.len() - 1);
    }
    if line.is_empty() {
        bail!(UsageError("no passphrase given".into()));
    }
    Ok(Passphrase::from_secret(line))
}

/// The existing passphrase: `--key-file`, or a prompt.
pub fn passphrase(k: &KeyArgs, prompt_text: &str) -> Result<Passphrase> {
    match &k.key_file {
        Some(f) => read_keyfile(f, k.keyfile_offset, k.keyfile_size),
        None => prompt(prompt_text),
    }
}

/// Runs `unlock` with the existing passphrase (`--key-file`, or a prompt), as cryptsetup's
/// `--tries`: a passphrase typed on the terminal that opens no keyslot ("No key available
/// with this passphrase.") is asked for again, up to `k.tries` times in all (0: no limit).
/// A key file or a piped passphrase gets exactly one try. Other errors end at once.
pub fn with_passphrase<T>(
    k: &KeyArgs,
    prompt_text: &str,
    mut unlock: impl FnMut(&Passphrase) -> Result<T>,
) -> Result<T> {
    let interactive = k.key_file.is_none() && std::io::stdin().is_terminal();
    let tries = if interactive { k.tries } else { 1 };
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        let pass = passphrase(k, prompt_text)?;
        match unlock(&pass) {
            Err(e) if (tries == 0 || attempt < tries) && is_wrong_passphrase(&e) => {
                eprintln!("No key available with this passphrase.");
            }
            r => return r,
        }
    }
}

/// The passphrases of `volume::open` for a LUKS volume, with [`with_passphrase`]'s rules:
/// `--key-file` or a pipe once, a terminal up to `--tries` times, saying "No key available
/// with this passphrase." before each new prompt.
pub struct Passphrases<'a> {
    keys: &'a KeyArgs,
    prompt: String,
    tries: u32,
    attempt: u32,
}

impl<'a> Passphrases<'a> {
    /// Passphrases from `keys`, prompting with `prompt`.
    pub fn new(keys: &'a KeyArgs, prompt: String) -> Self {
        let interactive = keys.key_file.is_none() && std::io::stdin().is_terminal();
        Passphrases { keys, prompt, tries: if interactive { keys.tries } else { 1 }, attempt: 0 }
    }

    fn more(&self) -> bool {
        self.tries == 0 || self.attempt < self.tries
    }
}

/// A passphrase source's own failure (a key file that cannot be read, an empty prompt),
/// kept whole for the exit code.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct SourceError(anyhow::Error);

impl SourceError {
    /// Wraps a passphrase source's failure.
    pub fn new(e: anyhow::Error) -> Self {
        SourceError(e)
    }
}

impl PassphraseSource for Passphrases<'_> {
    fn next_passphrase(&mut self) -> Result<Option<Passphrase>, VolumeError> {
        if !self.more() {
            return Ok(None);
        }
        self.attempt = self.attempt.saturating_add(1);
        passphrase(self.keys, &self.prompt)
            .map(Some)
            .map_err(|e| VolumeError::Passphrase(Box::new(SourceError(e))))
    }

    fn rejected(&mut self) {
        if self.more() {
            eprintln!("No key available with this passphrase.");
        }
    }
}

/// The error inside a [`SourceError`] in `e`'s chain, if any: the CLI's own error, whose
/// chain decides the exit code.
pub fn source_error(e: &anyhow::Error) -> Option<&anyhow::Error> {
    e.chain().find_map(|c| c.downcast_ref::<SourceError>()).map(|s| &s.0)
}

/// Whether `e` is a wrong passphrase (cryptsetup's -EPERM from a keyslot search).
fn is_wrong_passphrase(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let l = match c.downcast_ref::<VolumeError>() {
            Some(VolumeError::Luks { source, .. }) => source,
            _ => match c.downcast_ref::<LuksError>() {
                Some(l) => l,
                None => return false,
            },
        };
        matches!(l, LuksError::WrongPassphrase)
    })
}

/// A new passphrase: from `file` if given, else prompted twice on a terminal (once from a
/// pipe), and the two must match.
pub fn new_passphrase(
    file: Option<&str>,
    offset: u64,
    size: Option<usize>,
    prompt_text: &str,
) -> Result<Passphrase> {
    if let Some(f) = file {
        return read_keyfile(f, offset, size);
    }
    let p = prompt(prompt_text)?;
    if std::io::stdin().is_terminal() {
        let again = prompt("Verify passphrase: ")?;
        if again != p {
            bail!(Mismatch);
        }
    }
    Ok(p)
}

/// cryptsetup's `yesDialog`: asks only when stdin is a terminal and not in batch mode.
pub fn confirm(msg: &str, batch: bool) -> Result<()> {
    if batch || !std::io::stdin().is_terminal() {
        return Ok(());
    }
    eprint!("\nWARNING!\n========\n{msg}\n\nAre you sure? (Type 'yes' in capital letters): ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).context("reading the answer")?;
    if answer.trim_end_matches(['\n', '\r']) != "YES" {
        bail!(Aborted);
    }
    Ok(())
}

/// Opens the metadata device (`--header` or the device itself) through
/// `volume::storage::open`. Read-write it is locked exclusively (`volume::OpenOptions::lock`):
/// a device another sealdisk serves or changes is refused ("in use", exit 5) before anything
/// is written. Read-only it is not locked, so headers of volumes in use can still be dumped,
/// as with cryptsetup.
pub fn open_meta(path: &str, read_only: bool) -> Result<Storage> {
    super::ensure_device(path)?;
    let opts = volume::OpenOptions { read_only, lock: !read_only, ..Default::default() };
    Ok(volume::storage::open(path, &opts.storage())?)
}

/// Wraps a LUKS error with the device path, for the error chain.
pub fn luks_err(path: &str) -> impl Fn(LuksError) -> anyhow::Error + '_ {
    move |source| VolumeError::Luks { path: path.to_owned(), source }.into()
}

pub use crate::errors::kind_code;

/// Parses a size with an optional k/m/g suffix (powers of 1024), as cryptsetup's
/// `--luks2-metadata-size 64k`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(mul)).ok_or_else(|| format!("invalid size {s:?}"))
}

/// cryptsetup's warnings (on stdout) about the keyslots area its luksFormat makes: `ks`
/// bytes, `asked` for.
pub fn keyslots_warnings(ks: u64, asked: Option<u64>) {
    // LUKS2_HDR_OFFSET_MAX less two 16 KiB metadata copies.
    if ks < 0x40_0000 - 0x8000 {
        println!(
            "WARNING: keyslots area ({ks} bytes) is very small, available LUKS2 keyslot count is very limited."
        );
    }
    if asked.is_some_and(|k| k != ks) {
        println!("WARNING: LUKS2 keyslots area size changed to {ks} bytes.");
    }
}
