//! `sealdisk open`: a LUKS volume (the default, as cryptsetup), plain dm-crypt (`--type
//! plain`, cryptsetup's options) or a dm table line, served over NBD.
//!
//! Everything cheap is checked before a key is derived: the options, the listening socket
//! (bound here, so an address in use fails at once), TLS credentials, that the device
//! exists and holds the header asked for, and the storage lock (`volume::OpenOptions::lock`).
//! The volume is assembled by `volume::open` (`Spec::Plain`, `Spec::Table`, `Spec::Luks`).

use anyhow::{bail, Context, Result};
use clap::Args;
use formats::dm::{CryptOptions, CryptTable};
use formats::limits::DM_MAX_TABLE_BYTES;
use volume::plain::PlainParams;
use volume::{Format, OpenOptions, Spec};

use super::UsageError;
use crate::control::server::Rebuild;
use crate::keys::{read_key, KeySource};
use crate::serve::{listen, serve, ServeArgs};

/// Arguments of `sealdisk open`.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  sealdisk open disk.img vol --listen unix:/tmp/vol.sock        # LUKS, prompts for the passphrase
  sealdisk open --type plain --cipher aes-xts-plain64 --key-size 512 --key-file key \\
      --sector-size 4096 disk.img vol --listen unix:/tmp/vol.sock
  dmsetup table --showkeys vol | sealdisk open --table-file - vol --listen tcp:127.0.0.1:10809")]
pub struct OpenArgs {
    /// Device type: luks (LUKS1 or LUKS2), luks1, luks2, plain (dm-crypt without a header),
    /// tcrypt (TrueCrypt/VeraCrypt), bitlk (BitLocker) or fvault2 (FileVault2). Without it,
    /// the device is probed (LUKS first, as blkid) and opened as what is found;
    /// `--table-file` needs none.
    #[arg(long = "type", short = 'M')]
    pub kind: Option<String>,
    /// LUKS: detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// LUKS: only try this keyslot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// LUKS: check the passphrase and exit without serving (DEVICE only).
    #[arg(long)]
    pub test_passphrase: bool,
    #[command(flatten)]
    pub kdf_limits: super::luks::KdfLimitArgs,
    /// Read a dm-crypt table line from FILE (`-` for stdin) instead of plain options.
    #[arg(long, value_name = "FILE")]
    pub table_file: Option<String>,
    /// Cipher specification (plain: default aes-cbc-essiv:sha256; tcrypt: only try
    /// chains whose name contains it).
    #[arg(long, short = 'c')]
    pub cipher: Option<String>,
    /// Key size in bits.
    #[arg(long, short = 's', default_value_t = 256)]
    pub key_size: usize,
    /// Read the key from FILE (`-` for stdin); tcrypt: a keyfile, repeatable.
    #[arg(long, short = 'd', value_name = "FILE")]
    pub key_file: Vec<String>,
    /// Skip this many bytes of the key file.
    #[arg(long, default_value_t = 0)]
    pub keyfile_offset: u64,
    /// Read at most this many bytes of the key file.
    #[arg(long, short = 'l')]
    pub keyfile_size: Option<usize>,
    /// Encryption sector size in bytes (512, 1024, 2048, 4096).
    #[arg(long, default_value_t = 512)]
    pub sector_size: u32,
    /// Start of the ciphertext on the device, in 512-byte sectors.
    #[arg(long, short = 'o', default_value_t = 0)]
    pub offset: u64,
    /// IV offset, in 512-byte sectors.
    #[arg(long, short = 'p', default_value_t = 0)]
    pub skip: u64,
    /// Size of the volume in 512-byte sectors (default: to the end of the device).
    #[arg(long, short = 'b')]
    pub size: Option<u64>,
    /// IVs count in --sector-size units instead of 512-byte sectors.
    #[arg(long)]
    pub iv_large_sectors: bool,
    /// Pass discards (NBD TRIM) to the device: punches holes in a backing file.
    #[arg(long)]
    pub allow_discards: bool,
    /// LUKS2 authenticated encryption: run the dm-integrity layer without its journal
    /// (mode D: faster writes, a crash may leave a sector whose tag does not match).
    #[arg(long)]
    pub integrity_no_journal: bool,
    /// LUKS2 authenticated encryption: the dm-integrity journal is copied out when this full,
    /// in percent (integritysetup's option; default 50, the kernel's).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub journal_watermark: Option<u32>,
    /// LUKS2 authenticated encryption: uncommitted dm-integrity journal entries are committed
    /// after this many ms (integritysetup's option; default 10000, the kernel's; 0: only on
    /// flush and FUA).
    #[arg(long, value_name = "MS")]
    pub journal_commit_time: Option<u64>,
    #[command(flatten)]
    pub perf: crate::args::PerfArgs,
    /// Where crypto runs when no --perf-no_*_workqueue flag says inline: `auto` (inline up
    /// to 64 KiB, larger requests split across cores), `pool` (always handed to the crypto
    /// pool, like dm-crypt's kcryptd), `inline` (always on the request's thread).
    #[arg(long, value_enum, default_value = "auto")]
    pub crypt_mode: CryptModeArg,
    /// Serve read-only (the device is locked shared: other read-only openers may serve it
    /// too, a writer may not).
    #[arg(long, short = 'r')]
    pub readonly: bool,
    /// Plain (and --table-file) only: lock the device shared even read-write, so several
    /// servers may map non-overlapping --offset/--size parts of it (cryptsetup's --shared).
    #[arg(long)]
    pub shared: bool,
    /// LUKS: how often a passphrase typed on the terminal may be retried (0: no limit).
    #[arg(long, short = 'T', default_value_t = super::luks::DEFAULT_TRIES, value_name = "N")]
    pub tries: u32,
    /// Print the table line of the opened volume (key masked unless --showkeys).
    #[arg(long)]
    pub print_table: bool,
    /// With --print-table: show the key.
    #[arg(long)]
    pub showkeys: bool,
    #[command(flatten)]
    pub tcrypt: super::tcrypt::TcryptArgs,
    #[command(flatten)]
    pub lifecycle: super::luks_token::OpenTokenArgs,
    /// DEVICE NAME; only DEVICE with --test-passphrase, only NAME with --table-file.
    #[arg(value_name = "DEVICE NAME", required = true, num_args = 1..=2)]
    pub positional: Vec<String>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `--crypt-mode` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CryptModeArg {
    /// Inline up to 64 KiB, split larger requests across cores.
    Auto,
    /// Always hand requests to the crypto pool (dm-crypt's workqueue behaviour).
    Pool,
    /// Always on the request's thread.
    Inline,
}

impl From<CryptModeArg> for volume::CryptMode {
    fn from(m: CryptModeArg) -> Self {
        match m {
            CryptModeArg::Auto => volume::CryptMode::Auto,
            CryptModeArg::Pool => volume::CryptMode::Pool,
            CryptModeArg::Inline => volume::CryptMode::Inline,
        }
    }
}

/// What `open --type` names (or the probe found): parsed once, so no branch of `open`
/// compares strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceType {
    /// `luks` (either version), `luks1`, `luks2`.
    Luks(Option<volume::luks::LuksVersion>),
    /// `plain`: dm-crypt without a header.
    Plain,
    /// `tcrypt`: TrueCrypt/VeraCrypt.
    Tcrypt,
    /// `bitlk`: BitLocker.
    Bitlk,
    /// `fvault2`: FileVault2.
    Fvault2,
}

impl std::str::FromStr for DeviceType {
    type Err = UsageError;

    fn from_str(s: &str) -> Result<Self, UsageError> {
        use volume::luks::LuksVersion;
        Ok(match s {
            "luks" => DeviceType::Luks(None),
            "luks1" => DeviceType::Luks(Some(LuksVersion::V1)),
            "luks2" => DeviceType::Luks(Some(LuksVersion::V2)),
            "plain" => DeviceType::Plain,
            "tcrypt" => DeviceType::Tcrypt,
            "bitlk" => DeviceType::Bitlk,
            "fvault2" => DeviceType::Fvault2,
            _ => {
                return Err(UsageError(format!(
                    "device type {s:?} is not supported (supported: luks, luks1, luks2, plain, tcrypt, bitlk, fvault2, or --table-file)"
                )))
            }
        })
    }
}

/// Runs `sealdisk open`.
pub fn run(a: OpenArgs) -> Result<()> {
    let plain = a.table_file.is_some() || a.kind.as_deref() == Some("plain");
    if a.shared && !plain {
        bail!(UsageError("Option --shared is allowed only for open of plain device.".into()));
    }
    let opts = OpenOptions {
        read_only: a.readonly,
        direct: a.serve.direct,
        crypt_mode: a.crypt_mode.into(),
        lock: true,
        shared: a.shared,
    };
    let (spec, device, name, listener) = match &a.table_file {
        Some(file) => {
            let [name] = a.positional.as_slice() else {
                bail!(UsageError("with --table-file give only the export NAME".into()));
            };
            let table = read_table(file)?;
            let listener = listen(&a.serve)?;
            crate::control::ensure_free(name)?;
            super::ensure_device(&table.device)?;
            (Spec::Table(table.clone()), table.device.clone(), name.clone(), listener)
        }
        None => {
            let kind = match a.kind.as_deref() {
                Some(k) => k.parse::<DeviceType>()?,
                None => probed_type(&a)?,
            };
            // TrueCrypt takes several keyfiles; every other type one key file, and only an
            // authenticated LUKS2 volume the journal options (checked in this order, as
            // cryptsetup does).
            if kind == DeviceType::Tcrypt {
                return super::tcrypt::open(&a, &opts);
            }
            if a.key_file.len() > 1 {
                bail!(UsageError("Only one --key-file argument is allowed.".into()));
            }
            if let DeviceType::Luks(version) = kind {
                return super::luks_open::run(&a, version, &opts);
            }
            if a.journal_watermark.is_some() || a.journal_commit_time.is_some() {
                bail!(UsageError(
                    "--journal-watermark and --journal-commit-time apply to LUKS2 volumes with --integrity only".into()
                ));
            }
            match kind {
                DeviceType::Fvault2 => return super::fvault2::open(&a, &opts),
                DeviceType::Bitlk => return super::bitlk::open(&a, &opts),
                DeviceType::Plain | DeviceType::Tcrypt | DeviceType::Luks(_) => {}
            }
            let [device, name] = a.positional.as_slice() else {
                bail!(UsageError("plain mode needs DEVICE and NAME".into()));
            };
            plain_usage(&a)?;
            let listener = listen(&a.serve)?;
            crate::control::ensure_free(name)?;
            super::ensure_device(device)?;
            (Spec::Plain(plain_params(&a)?), device.clone(), name.clone(), listener)
        }
    };
    let storage = volume::storage::open(&device, &opts.storage())
        .with_context(|| format!("opening {device} as dm-crypt"))?;
    let opened = volume::open_storage(storage.clone(), spec, volume::Keys::none(), &opts)
        .with_context(|| format!("opening {device} as dm-crypt"))?;
    if let (true, Some(table)) = (a.print_table, opened.crypt_table()) {
        // Straight to stdout: no String copy of the key.
        if a.showkeys {
            println!("{table}");
        } else {
            println!("{}", masked(table));
        }
    }
    let claim = crate::control::claim(&name)?;
    serve(claim, opened, Rebuild::on(storage, opts), listener, &a.serve, a.readonly)
}

/// What every `open` of a volume with a passphrase does before its unlock: DEVICE and NAME
/// (or `--test-passphrase DEVICE`), the listening socket (so an address in use is reported
/// before a slow key derivation), the name checked free, the device checked.
pub(super) struct OpenTarget {
    pub device: String,
    /// `None` with `--test-passphrase`.
    pub name: Option<String>,
    /// `None` with `--test-passphrase`: unlock only, serve nothing.
    pub listener: Option<crate::serve::Listener>,
}

impl OpenArgs {
    /// See [`OpenTarget`].
    pub(super) fn target(&self) -> Result<OpenTarget> {
        let (device, name) = match (self.positional.as_slice(), self.test_passphrase) {
            ([d], true) => (d.clone(), None),
            ([d, n], _) => (d.clone(), Some(n.clone())),
            _ => bail!(UsageError("open needs DEVICE and NAME (or --test-passphrase DEVICE)".into())),
        };
        let listener = match self.test_passphrase {
            true => None,
            false => Some(crate::serve::listen(&self.serve)?),
        };
        if let (Some(n), Some(_)) = (&name, &listener) {
            crate::control::ensure_free(n)?;
        }
        super::ensure_device(&device)?;
        Ok(OpenTarget { device, name, listener })
    }

    /// The passphrase source: one `--key-file` (tcrypt's keyfiles are not passphrases), its
    /// offset and size, `--tries`.
    pub(super) fn key_args(&self) -> super::luks::KeyArgs {
        super::luks::KeyArgs {
            key_file: self.key_file.first().cloned(),
            keyfile_offset: self.keyfile_offset,
            keyfile_size: self.keyfile_size,
            tries: self.tries,
        }
    }
}

/// cryptsetup's default plain-mode cipher.
const PLAIN_CIPHER: &str = "aes-cbc-essiv:sha256";

/// `open` without `--type`: what the probe finds on DEVICE (`volume::probe`, LUKS first as
/// blkid). A device with no signature is taken as LUKS, whose refusal explains plain
/// dm-crypt; formats that `open` does not serve say which command does.
fn probed_type(a: &OpenArgs) -> Result<DeviceType> {
    let Some(device) = a.positional.first() else {
        bail!(UsageError("open needs DEVICE and NAME".into()));
    };
    let storage = super::luks::open_meta(device, true)?;
    let found = volume::probe(&storage).with_context(|| format!("probing {device}"))?;
    log::info!("{device}: {} found.", found.name());
    Ok(match found {
        Format::Integrity => bail!(UsageError(format!(
            "Device {device} holds a dm-integrity superblock: open it with `sealdisk integrity open {device} NAME --listen ADDR`."
        ))),
        Format::Bitlk => DeviceType::Bitlk,
        Format::Fvault2 => DeviceType::Fvault2,
        _ => DeviceType::Luks(None),
    })
}

/// The plain-mode option checks that need no file.
fn plain_usage(a: &OpenArgs) -> Result<()> {
    // The library's rule; crate::errors words it with the option's name.
    volume::luks::key_bytes(a.key_size)?;
    if a.key_file.is_empty() {
        bail!(UsageError(
            "plain mode needs --key-file FILE (or - for stdin); keys are never taken from arguments".into()
        ));
    }
    Ok(())
}

fn plain_params(a: &OpenArgs) -> Result<PlainParams> {
    let key_bytes = volume::luks::key_bytes(a.key_size)?;
    let Some(key_file) = a.key_file.first() else {
        bail!(UsageError(
            "plain mode needs --key-file FILE (or - for stdin); keys are never taken from arguments".into()
        ));
    };
    let cipher = a.cipher.as_deref().unwrap_or(PLAIN_CIPHER);
    let no_key = cipher.starts_with("cipher_null");
    let key = if no_key {
        sector_crypto::VolumeKey::new(Vec::new())
    } else {
        let src = KeySource { path: key_file.clone(), offset: a.keyfile_offset, size: a.keyfile_size };
        read_key(&src, key_bytes)?
    };
    let options = CryptOptions {
        sector_size: (a.sector_size != 512).then_some(a.sector_size),
        iv_large_sectors: a.iv_large_sectors,
        ..a.perf.crypt_options(a.allow_discards)
    };
    Ok(PlainParams { cipher: cipher.to_owned(), key, offset: a.offset, skip: a.skip, size: a.size, options })
}

/// The longest table file read (`formats::limits`): a crypt line is a few hundred bytes
/// (a 512-bit key is 128 hex digits, a path at most 4096 bytes); `/dev/zero` is refused.
const TABLE_MAX: usize = DM_MAX_TABLE_BYTES as usize;

/// Reads a table line (it holds the key in hex) into secret memory and parses it in place:
/// no copy of the line is left behind.
pub(super) fn read_table(file: &str) -> Result<CryptTable> {
    let text = crate::keys::read_key_file(file, 0, TABLE_MAX + 1)
        .with_context(|| format!("reading table file {file}"))?;
    if text.len() > TABLE_MAX {
        bail!(UsageError(format!("table file {file} is longer than {TABLE_MAX} bytes")));
    }
    let line =
        std::str::from_utf8(&text).map_err(|_| UsageError(format!("table file {file} is not UTF-8 text")))?;
    CryptTable::parse(line).map_err(volume::VolumeError::Table).context("parsing the table line")
}

/// The table line with the key replaced by zeroes, as `dmsetup table` without --showkeys.
pub(super) fn masked(t: &CryptTable) -> String {
    let mut m = t.clone();
    m.key.iter_mut().for_each(|b| *b = 0);
    m.to_string()
}
