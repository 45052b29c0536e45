//! TrueCrypt/VeraCrypt: `sealdisk tcryptDump DEVICE` and `open --type tcrypt` (alias
//! `tcryptOpen`), cryptsetup's options and output. The header search and the stack are
//! `volume::tcrypt`'s; this module parses, asks for the passphrase (and PIM) and prints.

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use clap::Args;
use formats::dm::CryptOptions;
use formats::tcrypt::{HeaderFlags, Magic, KEYFILE_MAX};
use sector_crypto::kdf::Passphrase;
use volume::tcrypt::{TcryptSpec, TcryptUnlocked};
use volume::{OpenOptions, PassphraseSource, VolumeError};

use super::luks::{confirm, prompt, SourceError};

use super::open::{masked, OpenArgs, OpenTarget};
use super::UsageError;
use crate::control::server::Rebuild;
use crate::serve::serve;

/// The TrueCrypt/VeraCrypt options shared by `open --type tcrypt` and `tcryptDump`.
#[derive(Debug, Args, Default)]
pub struct TcryptArgs {
    /// Also try VeraCrypt headers (the default; kept for cryptsetup compatibility).
    #[arg(long)]
    pub veracrypt: bool,
    /// Try TrueCrypt headers only.
    #[arg(long)]
    pub disable_veracrypt: bool,
    /// VeraCrypt Personal Iterations Multiplier.
    #[arg(long, value_name = "PIM")]
    pub veracrypt_pim: Option<u32>,
    /// Ask for the VeraCrypt PIM after the passphrase.
    #[arg(long)]
    pub veracrypt_query_pim: bool,
    /// Use the hidden volume's header.
    #[arg(long)]
    pub tcrypt_hidden: bool,
    /// System encryption: the header in sector 62 (a whole-disk image).
    #[arg(long)]
    pub tcrypt_system: bool,
    /// Use the backup header at the end of the device.
    #[arg(long)]
    pub tcrypt_backup: bool,
    /// Only try KDFs whose hash name contains this (sha512, whirlpool, ...).
    #[arg(long, value_name = "HASH")]
    pub hash: Option<String>,
}

impl TcryptArgs {
    /// cryptsetup's `verify_tcryptdump` checks.
    fn check(&self) -> Result<()> {
        if self.veracrypt && self.disable_veracrypt {
            bail!(UsageError("Options --veracrypt and --disable-veracrypt are mutually exclusive.".into()));
        }
        if self.veracrypt_pim.is_some() && self.disable_veracrypt {
            bail!(UsageError(
                "Option --veracrypt-pim is supported only for VeraCrypt compatible devices.".into()
            ));
        }
        if self.veracrypt_query_pim {
            if self.disable_veracrypt {
                bail!(UsageError(
                    "Option --veracrypt-query-pim is supported only for VeraCrypt compatible devices.".into()
                ));
            }
            if self.veracrypt_pim.is_some() {
                bail!(UsageError(
                    "The options --veracrypt-pim and --veracrypt-query-pim are mutually exclusive.".into()
                ));
            }
        }
        if self.veracrypt_pim == Some(0) {
            bail!(UsageError("Invalid PIM value: 0.".into()));
        }
        Ok(())
    }

    fn flags(&self) -> HeaderFlags {
        HeaderFlags { hidden: self.tcrypt_hidden, system: self.tcrypt_system, backup: self.tcrypt_backup }
    }
}

/// Passphrases for a TrueCrypt header, as cryptsetup's `tcrypt_load`: from the terminal
/// (retried `tries` times) or one from stdin; with `--veracrypt-query-pim` a PIM after each.
struct TcryptPassphrases {
    prompt: String,
    tries: u32,
    attempt: u32,
    query_pim: bool,
    pim: Option<u32>,
}

impl PassphraseSource for TcryptPassphrases {
    fn next_passphrase(&mut self) -> Result<Option<Passphrase>, VolumeError> {
        if self.tries != 0 && self.attempt >= self.tries {
            return Ok(None);
        }
        self.attempt += 1;
        let err = |e: anyhow::Error| VolumeError::Passphrase(Box::new(SourceError::new(e)));
        let p = read_passphrase(&self.prompt).map_err(err)?;
        if self.query_pim {
            let text = prompt("Enter VeraCrypt PIM: ").map_err(err)?;
            let pim = std::str::from_utf8(text.as_bytes())
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| err(UsageError("Invalid PIM value: parse error.".into()).into()))?;
            match u32::try_from(pim) {
                Ok(0) => return Err(err(UsageError("Invalid PIM value: 0.".into()).into())),
                Ok(v) => self.pim = Some(v),
                Err(_) => return Err(err(UsageError("Invalid PIM value: outside of range.".into()).into())),
            }
        }
        Ok(Some(p))
    }

    fn rejected(&mut self) {
        // The last rejection is the error the command ends with.
        if self.tries == 0 || self.attempt < self.tries {
            eprintln!("No device header detected with this passphrase.");
        }
    }
}

/// A passphrase from the terminal (echo off) or one line of stdin. Unlike a LUKS
/// passphrase it may be empty: a volume may be keyed by keyfiles alone.
fn read_passphrase(text: &str) -> Result<Passphrase> {
    let limit = formats::tcrypt::VC_POOL_LEN + 1;
    let mut line = if std::io::stdin().is_terminal() {
        crate::keys::prompt_tty(text, limit)?
    } else {
        crate::keys::read_secret(rustix::stdio::stdin(), limit, true)
            .context("reading the passphrase from stdin")?
    };
    while line.last() == Some(&b'\r') {
        line.truncate(line.len() - 1);
    }
    Ok(Passphrase::from_secret(line))
}

/// Reads the keyfiles' first MiB each (the rest never counts).
fn read_keyfiles(paths: &[String]) -> Result<Vec<Passphrase>> {
    paths
        .iter()
        .map(|p| {
            let buf = crate::keys::read_key_file(p, 0, KEYFILE_MAX).context("Failed to open key file.")?;
            Ok(Passphrase::from_secret(buf))
        })
        .collect()
}

/// Unlocks the header of `device` with the options of `t`.
fn unlock(
    device: &str,
    t: &TcryptArgs,
    keyfiles: &[String],
    cipher: Option<&str>,
    tries: u32,
    storage: &volume::Storage,
) -> Result<TcryptUnlocked> {
    let interactive = std::io::stdin().is_terminal();
    let mut src = TcryptPassphrases {
        prompt: format!("Enter passphrase for {device}: "),
        tries: if interactive { tries } else { 1 },
        attempt: 0,
        query_pim: t.veracrypt_query_pim,
        pim: None,
    };
    // With --veracrypt-query-pim the PIM comes with the passphrase: read both first.
    let first = if t.veracrypt_query_pim { src.next_passphrase()? } else { None };
    let pim = src.pim.or(t.veracrypt_pim);
    let mut one = first.map(Some);
    let mut replay = Replay { first: &mut one, rest: &mut src };
    let keyfiles = read_keyfiles(keyfiles)?;
    let spec = TcryptSpec {
        veracrypt: !t.disable_veracrypt,
        pim,
        flags: t.flags(),
        hash: t.hash.clone(),
        cipher: cipher.map(str::to_owned),
        ..TcryptSpec::default()
    };
    let mut keys = volume::Keys::passphrase(&mut replay).with_keyfiles(keyfiles);
    Ok(volume::tcrypt::unlock(&spec, &mut keys, storage)?)
}

/// A passphrase already read (with its PIM), then the source's own.
struct Replay<'a> {
    first: &'a mut Option<Option<Passphrase>>,
    rest: &'a mut TcryptPassphrases,
}

impl PassphraseSource for Replay<'_> {
    fn next_passphrase(&mut self) -> Result<Option<Passphrase>, VolumeError> {
        match self.first.take() {
            Some(p) => Ok(p),
            // A queried PIM is asked once: later tries keep it.
            None if self.rest.query_pim => Ok(None),
            None => self.rest.next_passphrase(),
        }
    }

    fn rejected(&mut self) {
        self.rest.rejected();
    }
}

/// Arguments of `sealdisk tcryptDump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// The device (or image) holding the header.
    pub device: String,
    /// Keyfile (repeatable; TrueCrypt's keyfile pool).
    #[arg(long, short = 'd', value_name = "FILE")]
    pub key_file: Vec<String>,
    /// Only try cipher chains whose name contains this.
    #[arg(long, short = 'c')]
    pub cipher: Option<String>,
    /// Print the volume key too (sensitive).
    #[arg(long, alias = "dump-master-key")]
    pub dump_volume_key: bool,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// How often a passphrase typed on the terminal may be retried.
    #[arg(long, short = 'T', default_value_t = super::luks::DEFAULT_TRIES, value_name = "N")]
    pub tries: u32,
    #[command(flatten)]
    pub tcrypt: TcryptArgs,
}

/// cryptsetup's `tcryptDump` text (`TCRYPT_dump`).
pub fn dump_text(u: &TcryptUnlocked, device: &str) -> String {
    let h = &u.header;
    let who = if h.magic == Magic::TrueCrypt { "TCRYPT" } else { "VERACRYPT" };
    format!(
        "{who} header information for {device}\n\
         Version:       \t{}\n\
         Driver req.:\t{:x}.{:x}\n\
         Sector size:\t{}\n\
         MK offset:\t{}\n\
         PBKDF2 hash:\t{}\n\
         Cipher chain:\t{}\n\
         Cipher mode:\t{}\n\
         MK bits:       \t{}\n",
        h.version,
        h.version_tc >> 8,
        h.version_tc & 0xff,
        h.sector_size,
        h.mk_offset,
        u.kdf.hash,
        u.chain.name,
        u.chain.mode.name(),
        u.chain.key_size * 8
    )
}

/// Runs `sealdisk tcryptDump`.
pub fn dump(a: DumpArgs) -> Result<()> {
    a.tcrypt.check()?;
    super::ensure_device(&a.device)?;
    let opts = OpenOptions { read_only: true, lock: true, ..OpenOptions::default() };
    let storage = volume::storage::open(&a.device, &opts.storage())?;
    let u = unlock(&a.device, &a.tcrypt, &a.key_file, a.cipher.as_deref(), a.tries, &storage)?;
    if !a.dump_volume_key {
        print!("{}", dump_text(&u, &a.device));
        return Ok(());
    }
    confirm(
        "Header dump with volume key is sensitive information\n\
         which allows access to encrypted partition without passphrase.\n\
         This dump should be always stored encrypted on safe place.",
        a.batch_mode,
    )?;
    let vk = u.volume_key().context("volume key")?;
    let offset = volume::tcrypt::layout(&u, storage.size()).map(|l| l.offset).unwrap_or(0);
    let mut hex = zeroize::Zeroizing::new(String::new());
    for (i, b) in vk.as_bytes().iter().enumerate() {
        if i > 0 {
            hex.push_str(if i % 16 == 0 { "\n\t\t" } else { " " });
        }
        hex.push_str(&format!("{b:02x}"));
    }
    print!(
        "TCRYPT header information for {}\nCipher chain:  \t{}\nCipher mode:   \t{}\nPayload offset:\t{offset}\nMK bits:       \t{}\nMK dump:\t{}\n",
        a.device,
        u.chain.name,
        u.chain.mode.name(),
        vk.len() * 8,
        hex.as_str()
    );
    Ok(())
}

/// Runs `open --type tcrypt` (and `tcryptOpen`).
pub fn open(a: &OpenArgs, opts: &OpenOptions) -> Result<()> {
    a.tcrypt.check()?;
    if a.tcrypt.tcrypt_hidden && a.allow_discards {
        bail!(UsageError("Option --tcrypt-hidden cannot be combined with --allow-discards.".into()));
    }
    let OpenTarget { device, name, listener } = a.target()?;
    let storage = volume::storage::open(&device, &opts.storage())?;
    let cipher = a.cipher.as_deref();
    let u = unlock(&device, &a.tcrypt, &a.key_file, cipher, a.tries, &storage)?;
    let Some(listener) = listener else {
        return Ok(());
    };
    let options = CryptOptions {
        allow_discards: a.allow_discards,
        same_cpu_crypt: a.perf_same_cpu_crypt,
        submit_from_crypt_cpus: a.perf_submit_from_crypt_cpus,
        no_read_workqueue: a.perf_no_read_workqueue,
        no_write_workqueue: a.perf_no_write_workqueue,
        ..CryptOptions::default()
    };
    let vol = volume::tcrypt::assemble(&u, storage.clone(), options, opts)
        .with_context(|| format!("opening {device} as TCRYPT"))?;
    if a.print_table {
        for t in vol.layers.iter().filter_map(|l| match l {
            volume::LayerTable::Crypt(t) => Some(t),
            _ => None,
        }) {
            if a.showkeys {
                println!("{t}");
            } else {
                println!("{}", masked(t));
            }
        }
    }
    let claim = crate::control::claim(&name.unwrap_or_default())?;
    serve(claim, vol, Rebuild::on(storage, *opts), listener, &a.serve, a.readonly)
}
