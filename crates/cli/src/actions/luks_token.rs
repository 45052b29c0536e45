//! LUKS2 header maintenance: `token add|remove|import|export`, `config`, and what `open`
//! takes from it (`--token-only`, `--token-id`, `--unbound`, `--persistent`). cryptsetup
//! 2.6's option names, messages and exit codes; the header work is `volume::luks`'s.
//!
//! The one token type unlocked here is the one cryptsetup handles without a plugin,
//! `luks2-keyring`: the passphrase is a `user` key in the kernel keyring, found by its
//! description in the thread, process and session keyrings (cryptsetup's `request_key`).
//! Tokens of other types (systemd-tpm2, fido2, ...) are kept intact, imported and
//! exported, but never used to unlock.

use std::io::Read;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use formats::luks2::Token;
use linux_keyutils::{KeyRing, KeyRingIdentifier};
use sector_crypto::kdf::Passphrase;
use sector_crypto::secure::SecretBuf;
use volume::luks::{KeyslotPriority, Luks, LuksError};
use volume::{PassphraseSource, VolumeError};

use super::luks::{luks_err, open_meta, Passphrases};
use super::UsageError;

/// `token` actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TokenOp {
    /// Add a luks2-keyring token (`--key-description`).
    Add,
    /// Remove token `--token-id`.
    Remove,
    /// Import a token from JSON (`--json-file`, or stdin).
    Import,
    /// Print token `--token-id` as JSON.
    Export,
}

/// Arguments of `token add|remove|import|export DEVICE`.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The action.
    #[arg(value_enum)]
    pub op: TokenOp,
    /// The device.
    pub device: String,
    /// Token id (0..31): required by remove and export; add/import take the first free one
    /// without it.
    #[arg(long)]
    pub token_id: Option<u32>,
    /// Assign the token to this keyslot (add: default every keyslot; import: added to the
    /// JSON's keyslots).
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// import: the token's JSON (default stdin).
    #[arg(long, value_name = "FILE")]
    pub json_file: Option<String>,
    /// add: the description of the kernel keyring key holding the passphrase.
    #[arg(long, value_name = "DESCRIPTION")]
    pub key_description: Option<String>,
    /// add/import: replace the token --token-id if it exists.
    #[arg(long)]
    pub token_replace: bool,
    /// Detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
}

/// The token JSON cryptsetup reads at most (`LUKS2_MAX_TOKEN_JSON`... bounded by the JSON
/// area: 4 MiB).
const TOKEN_JSON_MAX: u64 = 4 << 20;

/// Runs `token`.
pub fn token(a: TokenArgs) -> Result<()> {
    let path = a.header.as_deref().unwrap_or(&a.device).to_owned();
    let need_id = || -> Result<u32> {
        a.token_id.ok_or_else(|| {
            UsageError("Action requires specific token. Use --token-id parameter.".into()).into()
        })
    };
    match a.op {
        TokenOp::Export => {
            let id = need_id()?;
            let meta = open_meta(&path, true)?;
            let luks = load2(&meta, &path, false)?;
            print!("{}", luks.token_export(id).map_err(luks_err(&path))?);
            Ok(())
        }
        TokenOp::Remove => {
            let id = need_id()?;
            let meta = open_meta(&path, false)?;
            let mut luks = load2(&meta, &path, true)?;
            luks.token_remove(&*meta.device, id).map_err(luks_err(&path))?;
            log::info!("Token {id} removed.");
            Ok(())
        }
        TokenOp::Add => {
            let Some(desc) = a.key_description.as_deref() else {
                bail!(UsageError("--key-description parameter is mandatory for token add action.".into()));
            };
            let meta = open_meta(&path, false)?;
            let mut luks = load2(&meta, &path, true)?;
            let slots = match a.key_slot {
                Some(s) => vec![s],
                None => luks.active_keyslots(),
            };
            let id = luks
                .token_add(&*meta.device, a.token_id, Token::keyring(desc, slots), a.token_replace)
                .map_err(luks_err(&path))?;
            log::info!("Token {id} created.");
            Ok(())
        }
        TokenOp::Import => {
            let text = read_json(a.json_file.as_deref())?;
            let mut tok = Token::from_json(&text)
                .map_err(|e| anyhow::Error::new(UsageError(format!("{e}"))))
                .context("Failed to import token from file.")?;
            let meta = open_meta(&path, false)?;
            let mut luks = load2(&meta, &path, true)?;
            if let Some(s) = a.key_slot {
                tok.keyslots.push(s);
            }
            let id =
                luks.token_add(&*meta.device, a.token_id, tok, a.token_replace).map_err(luks_err(&path))?;
            log::info!("Token {id} created.");
            Ok(())
        }
    }
}

fn read_json(file: Option<&str>) -> Result<String> {
    let mut text = String::new();
    let res = match file {
        Some(f) => std::fs::File::open(f)
            .with_context(|| format!("reading {f}"))?
            .take(TOKEN_JSON_MAX)
            .read_to_string(&mut text),
        None => std::io::stdin().lock().take(TOKEN_JSON_MAX).read_to_string(&mut text),
    };
    res.map_err(|e| UsageError(format!("Failed to import token from file: {e}")))?;
    Ok(text)
}

/// Loads a LUKS2 header: LUKS1 has no tokens or config (cryptsetup refuses with this).
fn load2(meta: &volume::Storage, path: &str, repair: bool) -> Result<Luks> {
    let luks = Luks::load(&*meta.device, repair).map_err(luks_err(path))?;
    if luks.version() != volume::luks::LuksVersion::V2 {
        bail!(UsageError(format!("Device {path} is not a valid LUKS2 device.")));
    }
    Ok(luks)
}

/// Arguments of `config DEVICE`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Set the LUKS2 label (empty: none).
    #[arg(long)]
    pub label: Option<String>,
    /// Set the LUKS2 subsystem (empty: none).
    #[arg(long)]
    pub subsystem: Option<String>,
    /// Keyslot priority: ignore, normal or prefer (needs --key-slot).
    #[arg(long)]
    pub priority: Option<String>,
    /// The keyslot of --priority.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// Detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// The device.
    pub device: String,
}

/// Runs `config`: label, subsystem and keyslot priority in one header rewrite each.
pub fn config(a: ConfigArgs) -> Result<()> {
    let path = a.header.as_deref().unwrap_or(&a.device).to_owned();
    if a.priority.is_none() && a.label.is_none() && a.subsystem.is_none() {
        bail!(UsageError("Option --priority, --label or --subsystem is missing.".into()));
    }
    let priority = match &a.priority {
        Some(p) => {
            let p: KeyslotPriority =
                p.parse().map_err(|e: LuksError| UsageError(crate::errors::message(&e)))?;
            let Some(slot) = a.key_slot else {
                bail!(UsageError("Keyslot specification is required.".into()));
            };
            Some((slot, p))
        }
        None => None,
    };
    let meta = open_meta(&path, false)?;
    let mut luks = load2(&meta, &path, true)?;
    if let Some((slot, p)) = priority {
        luks.set_priority(&*meta.device, slot, p).map_err(luks_err(&path))?;
    }
    if a.label.is_some() || a.subsystem.is_some() {
        luks.set_label(&*meta.device, a.label.as_deref(), a.subsystem.as_deref()).map_err(luks_err(&path))?;
    }
    Ok(())
}

/// `open`'s token, unbound and persistent options.
#[derive(Debug, Clone, Args)]
pub struct OpenTokenArgs {
    /// LUKS2: unlock only through tokens (luks2-keyring), never ask for a passphrase.
    #[arg(long)]
    pub token_only: bool,
    /// LUKS2: unlock through this token only.
    #[arg(long)]
    pub token_id: Option<u32>,
    /// LUKS2: unlock through tokens of this type only (sealdisk has `luks2-keyring`).
    #[arg(long, value_name = "TYPE")]
    pub token_type: Option<String>,
    /// LUKS2, with --test-passphrase: also accept keyslots holding an unbound key.
    #[arg(long)]
    pub unbound: bool,
    /// LUKS2: store the activation flags given (--allow-discards, --perf-*) in the header
    /// as its persistent flags, replacing the old ones.
    #[arg(long)]
    pub persistent: bool,
}

impl OpenTokenArgs {
    /// Whether tokens are tried before a passphrase: always unless a key file is given,
    /// and always with --token-only / --token-id / --token-type (cryptsetup 2.6).
    pub fn try_tokens(&self, key_file_given: bool) -> bool {
        self.token_only || self.token_id.is_some() || self.token_type.is_some() || !key_file_given
    }
}

/// Reads a `user` key by description from the thread, process and session keyrings, as
/// cryptsetup's `request_key` does, into secret memory. `None` when there is none.
pub fn keyring_passphrase(description: &str) -> Option<Passphrase> {
    for ring in [KeyRingIdentifier::Thread, KeyRingIdentifier::Process, KeyRingIdentifier::Session] {
        let Ok(r) = KeyRing::from_special_id(ring, false) else { continue };
        let Ok(key) = r.search(description) else { continue };
        // A user key holds at most 32767 bytes.
        let mut buf = SecretBuf::zeroed(32767);
        let n = {
            let mut slice: &mut [u8] = &mut buf[..];
            match key.read(&mut slice) {
                Ok(n) => n,
                Err(e) => {
                    log::debug!("reading keyring key {description:?}: {e:?}");
                    continue;
                }
            }
        };
        buf.truncate(n.min(32767));
        if n == 0 {
            continue;
        }
        return Some(Passphrase::from_secret(buf));
    }
    None
}

/// One token's try at `open`: its id, the passphrase its key holds, and the keyslots it
/// may open, in order.
pub struct TokenTry {
    pub id: u32,
    pub passphrase: Passphrase,
    pub keyslots: Vec<u32>,
}

/// What the `luks2-keyring` tokens of `luks` offer `open` (one token with `token_id`; only
/// those of type `token_type`), as cryptsetup 2.6.1 tries them (`LUKS2_token_unlock_key`):
/// a token asked for by id tries every keyslot it names, in its order; otherwise every
/// token tries the keyslots it names of priority `prefer`, then every token those of
/// priority `normal` (never `ignore`). A token naming no such keyslot is not tried.
/// Tokens of other types are skipped. Also returns the first token tried whose key is
/// missing from the keyring.
pub fn token_passphrases(
    luks: &Luks,
    token_id: Option<u32>,
    token_type: Option<&str>,
) -> Result<(Vec<TokenTry>, Option<u32>)> {
    let tokens = luks.tokens();
    let priority = |slot: u32| match &luks.header {
        volume::luks::LuksHeader::V2(s) => {
            s.header.metadata.keyslots.get(&slot).map_or(1, |k| k.priority.unwrap_or(1))
        }
        volume::luks::LuksHeader::V1(_) => 1,
    };
    let mut keys = Vec::new();
    let mut missing = None;
    for (id, t) in &tokens {
        if token_id.is_some_and(|want| want != *id) || token_type.is_some_and(|want| want != t.type_name) {
            continue;
        }
        let Some(desc) = t.key_description() else {
            log::info!("Token {id} of type {} needs a plugin sealdisk does not have.", t.type_name);
            continue;
        };
        match keyring_passphrase(desc) {
            Some(p) => keys.push((*id, p, t.keyslots.clone())),
            None => {
                log::info!("Token {id}: no key {desc:?} in the kernel keyring.");
                missing = missing.or(Some(*id));
            }
        }
    }
    let mut out = Vec::new();
    if token_id.is_some() {
        for (id, passphrase, keyslots) in keys {
            if !keyslots.is_empty() {
                out.push(TokenTry { id, passphrase, keyslots });
            }
        }
    } else {
        for want in [2, 1] {
            for (id, passphrase, keyslots) in &keys {
                let slots: Vec<u32> = keyslots.iter().copied().filter(|&k| priority(k) == want).collect();
                if !slots.is_empty() {
                    out.push(TokenTry { id: *id, passphrase: passphrase.clone(), keyslots: slots });
                }
            }
        }
    }
    Ok((out, missing))
}

/// A passphrase source for `open`: the keyring tokens' passphrases first (each for its own
/// keyslots only), then (unless `--token-only`) the usual key file or prompt.
pub struct TokenFirst<'a> {
    tokens: std::vec::IntoIter<TokenTry>,
    current: Option<(u32, Vec<u32>)>,
    /// The passphrase source after the tokens; `None` with --token-only.
    pub fallback: Option<Passphrases<'a>>,
    /// The last token that failed.
    pub failed: Option<u32>,
}

impl<'a> TokenFirst<'a> {
    /// Tokens' passphrases, then `fallback`.
    pub fn new(tokens: Vec<TokenTry>, fallback: Option<Passphrases<'a>>) -> Self {
        TokenFirst { tokens: tokens.into_iter(), current: None, fallback, failed: None }
    }
}

impl PassphraseSource for TokenFirst<'_> {
    fn next_passphrase(&mut self) -> Result<Option<Passphrase>, VolumeError> {
        if let Some(t) = self.tokens.next() {
            self.current = Some((t.id, t.keyslots));
            return Ok(Some(t.passphrase));
        }
        self.current = None;
        match &mut self.fallback {
            Some(f) => f.next_passphrase(),
            None => Ok(None),
        }
    }

    fn rejected(&mut self) {
        match &self.current {
            Some((id, _)) => {
                eprintln!("Token {id} cannot unlock assigned keyslot(s) (wrong keyslot passphrase).");
                self.failed = Some(*id);
            }
            None => {
                if let Some(f) = &mut self.fallback {
                    f.rejected();
                }
            }
        }
    }

    fn keyslots(&self) -> Option<Vec<u32>> {
        self.current.as_ref().map(|(_, k)| k.clone())
    }
}

/// The token tries `open` makes on `meta` first: none for LUKS1 (or a header that does not
/// load: the open itself reports that). With --token-only and nothing to try: a token
/// whose key is missing fails as a wrong passphrase (exit 2), else "No usable token is
/// available." (exit 1).
pub fn open_tokens(meta: &volume::Storage, lc: &OpenTokenArgs) -> Result<Vec<TokenTry>> {
    let luks = match Luks::load(&*meta.device, false) {
        Ok(l) if l.version() == volume::luks::LuksVersion::V2 => l,
        _ if lc.token_only || lc.token_id.is_some() || lc.token_type.is_some() => {
            bail!(UsageError(no_usable(lc)))
        }
        _ => return Ok(Vec::new()),
    };
    let (found, missing) = token_passphrases(&luks, lc.token_id, lc.token_type.as_deref())?;
    if found.is_empty() && lc.token_only {
        // cryptsetup 2.6: a keyring token that was tried (the id and type asked for)
        // whose key is missing fails as a wrong passphrase (exit 2); no token with a
        // keyslot to try is a parameter error (exit 1).
        if let Some(id) = missing {
            match (lc.token_id, &lc.token_type) {
                (None, Some(t)) => {
                    eprintln!(
                        "Token (type {t}) cannot unlock assigned keyslot(s) (wrong keyslot passphrase)."
                    )
                }
                _ => eprintln!("Token {id} cannot unlock assigned keyslot(s) (wrong keyslot passphrase)."),
            }
            return Err(luks_err(&meta.name)(LuksError::WrongPassphrase));
        }
        bail!(UsageError(no_usable(lc)));
    }
    Ok(found)
}

/// cryptsetup's message when no token can be tried (tools_token_error_msg): it names the
/// type asked for, unless a token id was given.
fn no_usable(lc: &OpenTokenArgs) -> String {
    match (&lc.token_type, lc.token_id) {
        (Some(t), None) => format!("No usable token (type {t}) is available."),
        _ => "No usable token is available.".into(),
    }
}

/// `open --unbound --test-passphrase [--key-slot N]`: the passphrase is tried on every
/// LUKS2 keyslot, bound or unbound (or keyslot N), and checked against its own digest.
pub fn test_unbound(
    a: &super::open::OpenArgs,
    meta: &volume::Storage,
    keys: &super::luks::KeyArgs,
) -> Result<()> {
    if !a.test_passphrase {
        bail!(UsageError("Option --unbound is allowed only with --test-passphrase.".into()));
    }
    let path = meta.name.clone();
    let luks = load2(meta, &path, false)?;
    let (slot, _key) = super::luks::with_passphrase(keys, &format!("Enter passphrase for {path}: "), |p| {
        luks.unlock_any_keyslot(&*meta.device, p, a.key_slot, &a.kdf_limits.limits()).map_err(luks_err(&path))
    })?;
    log::info!("Key slot {slot} unlocked.");
    Ok(())
}

/// The persistent flag names (LUKS2 `config.flags`) of `open`'s activation options.
pub fn persistent_flags(f: &formats::dm::CryptOptions, no_journal: bool) -> Vec<&'static str> {
    f.persistent_names(no_journal)
}

/// Writes `flags` as the LUKS2 header's persistent flags on `meta` (already opened and
/// locked by this `open`). LUKS1 has none: refused as cryptsetup does.
pub fn store_persistent(meta: &volume::Storage, flags: &[&str]) -> Result<()> {
    let path = meta.name.clone();
    let mut luks =
        load2(meta, &path, true).context("Persistent flags can be stored only in LUKS2 headers")?;
    luks.set_persistent_flags(&*meta.device, flags).map_err(luks_err(&path))?;
    Ok(())
}

/// Arguments of `convert DEVICE --type luks1|luks2`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The format to convert to: luks1 or luks2.
    #[arg(long = "type", short = 'M', required = true)]
    pub kind: String,
    /// Detached header file.
    #[arg(long, value_name = "FILE")]
    pub header: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long = "batch-mode", short = 'q')]
    pub batch_mode: bool,
    /// The device.
    pub device: String,
}

/// Runs `convert`: the header changes format in place (volume::luks, convert.rs); the
/// device is locked exclusively, so a served volume is refused (exit 5).
pub fn convert(a: ConvertArgs) -> Result<()> {
    let to = match a.kind.as_str() {
        "luks1" => volume::luks::LuksVersion::V1,
        "luks2" => volume::luks::LuksVersion::V2,
        _ => bail!(UsageError("Invalid LUKS type, only luks1 and luks2 are supported.".into())),
    };
    let path = a.header.as_deref().unwrap_or(&a.device).to_owned();
    let meta = open_meta(&path, false)?;
    let mut luks = Luks::load(&*meta.device, true).map_err(luks_err(&path))?;
    if luks.version() == to {
        bail!(UsageError(format!("Device is already {} type.", a.kind.to_uppercase())));
    }
    super::luks::confirm(
        &format!("This operation will convert {path} to {} format.\n", a.kind.to_uppercase()),
        a.batch_mode,
    )?;
    luks.convert(&*meta.device, to).map_err(luks_err(&path))?;
    Ok(())
}
