//! `sealdisk`: a cryptsetup-shaped CLI over the volume, nbd (and later bench) crates.
//!
//! Thin by design: each action parses its arguments, calls a library, and prints. Errors
//! print their whole cause chain, one level per line, and map to cryptsetup's exit codes.
#![forbid(unsafe_code)]

mod actions;
mod args;
mod control;
mod daemon;
mod errors;
mod hardening;
mod keys;
mod serve;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Userspace dm-crypt / dm-integrity / LUKS, served over NBD.
#[derive(Debug, Parser)]
#[command(name = "sealdisk", version, about, long_about = None)]
struct Cli {
    /// More logging (repeat for more); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Open a volume and serve it over NBD until SIGINT/SIGTERM.
    Open(Box<actions::open::OpenArgs>),
    /// Show the status of a running volume (cryptsetup's layout; exit 4 when inactive).
    Status(control::client::StatusArgs),
    /// Close a running volume: drain, flush, disconnect its clients, stop its server.
    #[command(visible_alias = "luksClose")]
    Close(control::client::CloseArgs),
    /// Change a running volume's --perf-* flags (and --crypt-mode) without stopping I/O.
    Refresh(control::client::RefreshArgs),
    /// Resize a running plain or LUKS volume (clients that connect afterwards see the size).
    Resize(control::client::ResizeArgs),
    /// Hold a running LUKS volume's I/O, flush it, and wipe its key from memory.
    #[command(name = "luksSuspend")]
    LuksSuspend(control::client::SuspendArgs),
    /// Unlock a suspended LUKS volume again (passphrase as for open) and release its I/O.
    #[command(name = "luksResume")]
    LuksResume(Box<control::client::ResumeArgs>),
    /// `open --type tcrypt`: a TrueCrypt/VeraCrypt volume, served over NBD.
    #[command(name = "tcryptOpen")]
    TcryptOpen(Box<actions::open::OpenArgs>),
    /// Print a TrueCrypt/VeraCrypt header (cryptsetup's layout).
    #[command(name = "tcryptDump")]
    TcryptDump(Box<actions::tcrypt::DumpArgs>),
    /// Open a FileVault2 volume read-only and serve it (cryptsetup's old syntax for
    /// `open --type fvault2`).
    #[command(name = "fvault2Open")]
    Fvault2Open(Box<actions::open::OpenArgs>),
    /// Print a FileVault2 (Core Storage) header (cryptsetup's layout).
    #[command(name = "fvault2Dump")]
    Fvault2Dump(actions::fvault2::DumpArgs),
    /// Format a device as LUKS1 or LUKS2.
    #[command(name = "luksFormat")]
    LuksFormat(Box<actions::luks_format::LuksFormatArgs>),
    /// Print a LUKS header (cryptsetup's layout).
    #[command(name = "luksDump")]
    LuksDump(actions::luks_header::DumpArgs),
    /// Print a BitLocker device's metadata (cryptsetup's layout).
    #[command(name = "bitlkDump")]
    BitlkDump(actions::bitlk::DumpArgs),
    /// `open --type bitlk`: open a BitLocker volume and serve it.
    #[command(name = "bitlkOpen")]
    BitlkOpen(Box<actions::open::OpenArgs>),
    /// Add a passphrase to a free keyslot.
    #[command(name = "luksAddKey")]
    LuksAddKey(Box<actions::luks_keyslot::AddKeyArgs>),
    /// Destroy the keyslot a passphrase opens.
    #[command(name = "luksRemoveKey")]
    LuksRemoveKey(actions::luks_keyslot::RemoveKeyArgs),
    /// Change a passphrase.
    #[command(name = "luksChangeKey")]
    LuksChangeKey(Box<actions::luks_keyslot::ChangeKeyArgs>),
    /// Destroy a keyslot by number.
    #[command(name = "luksKillSlot")]
    LuksKillSlot(actions::luks_keyslot::KillSlotArgs),
    /// Print or set the UUID of a LUKS device.
    #[command(name = "luksUUID")]
    LuksUuid(actions::luks_header::UuidArgs),
    /// Exit 0 if the device has a LUKS header, else 1.
    #[command(name = "isLuks")]
    IsLuks(actions::luks_header::IsLuksArgs),
    /// Say what a device holds (LUKS, dm-integrity, BitLocker, FileVault2), as blkid: exit 0
    /// when a format was recognised, 2 when nothing was.
    Probe(actions::probe::ProbeArgs),
    /// Save the LUKS header and keyslot areas to a file.
    #[command(name = "luksHeaderBackup")]
    LuksHeaderBackup(actions::luks_header::BackupArgs),
    /// Restore a saved LUKS header (validated first).
    #[command(name = "luksHeaderRestore")]
    LuksHeaderRestore(actions::luks_header::BackupArgs),
    /// Finish the data-area wipe of an interrupted `luksFormat --integrity` (from --from).
    #[command(name = "luksResumeWipe")]
    LuksResumeWipe(Box<actions::wipe::ResumeWipeArgs>),
    /// LUKS2 tokens: add (luks2-keyring), remove, import or export (JSON).
    Token(actions::luks_token::TokenArgs),
    /// Set LUKS2 header options: --label, --subsystem, --priority (with --key-slot).
    Config(actions::luks_token::ConfigArgs),
    /// Convert a LUKS header in place: --type luks1 or luks2.
    Convert(actions::luks_token::ConvertArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions(actions::docs::CompletionsArgs),
    /// Print the man page (roff) to stdout, or write one page per command to --out-dir.
    Man(actions::docs::ManArgs),
    /// Wipe every LUKS keyslot.
    Erase(actions::luks_keyslot::EraseArgs),
    /// LUKS2 reencryption (new volume key and/or cipher), offline, resumable, on-disk
    /// compatible with cryptsetup's.
    Reencrypt(Box<actions::reencrypt::ReencryptArgs>),
    /// Repair a LUKS header (a damaged LUKS2 copy, damaged LUKS1 keyslots), then recover a
    /// LUKS2 reencryption a crash interrupted mid-hotzone (cryptsetup `repair`).
    Repair(actions::repair::RepairArgs),
    /// Build-and-run check: a temporary plain volume, served over NBD, written and read
    /// back by a real NBD client, with a short summary.
    Demo(actions::demo::DemoArgs),
    /// dm-integrity volumes, integritysetup-shaped: format, open (serve over NBD), dump, status.
    Integrity(actions::integrity::IntegrityArgs),
    /// Measure: fio-style workloads on a temporary stack or an NBD URI, A/B comparisons,
    /// seed presets; with no arguments, the quick suite.
    Bench(Box<actions::bench::BenchArgs>),
    /// In-memory cipher, tag-hash and PBKDF2 speed, like `cryptsetup benchmark`.
    Benchmark(actions::benchmark::BenchmarkArgs),
    /// Upload a volume file into a new volume on object storage (s3://bucket/prefix?endpoint=…).
    Import(actions::objcopy::ImportArgs),
    /// Download a volume on object storage into a new (sparse) file.
    Export(actions::objcopy::ExportArgs),
}

/// cryptsetup's exit codes (src/utils_tools.c translate_errno).
pub mod exit {
    /// Wrong parameters.
    pub const BAD_ARGS: u8 = 1;
    /// No permission, or bad passphrase/key.
    pub const PERMISSION: u8 = 2;
    /// Device does not exist or access denied.
    pub const DEVICE: u8 = 4;
    /// Device (or listening socket) in use.
    pub const BUSY: u8 = 5;
    /// Unexpected failure.
    pub const FAILURE: u8 = 1;
}

fn main() -> ExitCode {
    // cryptsetup exits 1 for every command-line error (clap's own default is 2, which here
    // means a wrong passphrase); help and version are not errors.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::BAD_ARGS } else { 0 });
        }
    };
    // `--daemon`: this process only starts the server (the same command line, re-executed)
    // and waits until it serves.
    let daemon = match &cli.action {
        Action::Open(a) => a.serve.daemon,
        Action::Integrity(a) => a.daemon_requested(),
        _ => false,
    };
    if daemon && !daemon::is_child() {
        return match daemon::run_parent() {
            Ok(code) => code,
            Err(e) => {
                eprintln!("sealdisk: {e:#}");
                ExitCode::from(exit::FAILURE)
            }
        };
    }
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp_millis()
        .init();
    // Actions that read keys or passphrases run non-dumpable, and a signal ends their key
    // derivations at once. `bench`, `benchmark` and `demo` only make throwaway keys and keep
    // their own signal handling (and stay profilable).
    let handles_keys = !matches!(cli.action, Action::Bench(_) | Action::Benchmark(_) | Action::Demo(_));
    if handles_keys {
        if let Err(e) = hardening::install() {
            eprintln!("sealdisk: {e:#}");
            return ExitCode::from(exit::FAILURE);
        }
    }
    let result = match cli.action {
        Action::Open(a) => actions::open::run(*a),
        Action::Status(a) => control::client::status(a),
        Action::Close(a) => control::client::close(a),
        Action::Refresh(a) => control::client::refresh(a),
        Action::Resize(a) => control::client::resize(a),
        Action::LuksSuspend(a) => control::client::suspend(a),
        Action::LuksResume(a) => control::client::resume(*a),
        Action::TcryptOpen(mut a) => {
            a.kind = Some("tcrypt".into());
            actions::open::run(*a)
        }
        Action::TcryptDump(a) => actions::tcrypt::dump(*a),
        Action::Fvault2Open(mut a) => {
            a.kind = Some("fvault2".into());
            actions::open::run(*a)
        }
        Action::Fvault2Dump(a) => actions::fvault2::dump(a),
        Action::Demo(a) => actions::demo::run(a),
        Action::Integrity(a) => actions::integrity::run(a),
        Action::LuksFormat(a) => actions::luks_format::run(*a),
        Action::LuksDump(a) => actions::luks_header::dump(a),
        Action::BitlkDump(a) => actions::bitlk::dump(a),
        Action::BitlkOpen(a) => {
            actions::open::run(actions::open::OpenArgs { kind: Some("bitlk".into()), ..*a })
        }
        Action::LuksAddKey(a) => actions::luks_keyslot::add_key(*a),
        Action::LuksRemoveKey(a) => actions::luks_keyslot::remove_key(a),
        Action::LuksChangeKey(a) => actions::luks_keyslot::change_key(*a),
        Action::LuksKillSlot(a) => actions::luks_keyslot::kill_slot(a),
        Action::LuksUuid(a) => actions::luks_header::uuid(a),
        Action::IsLuks(a) => actions::luks_header::is_luks(a),
        Action::Probe(a) => actions::probe::run(a),
        Action::LuksHeaderBackup(a) => actions::luks_header::backup(a),
        Action::LuksHeaderRestore(a) => actions::luks_header::restore(a),
        Action::Erase(a) => actions::luks_keyslot::erase(a),
        Action::Reencrypt(a) => actions::reencrypt::reencrypt(*a),
        Action::Repair(a) => actions::repair::run(a),
        Action::LuksResumeWipe(a) => actions::wipe::resume(*a),
        Action::Token(a) => actions::luks_token::token(a),
        Action::Config(a) => actions::luks_token::config(a),
        Action::Convert(a) => actions::luks_token::convert(a),
        Action::Completions(a) => actions::docs::completions(a, Cli::command()),
        Action::Man(a) => actions::docs::man(a, Cli::command()),
        Action::Bench(a) => actions::bench::run(*a),
        Action::Benchmark(a) => actions::benchmark::run(a),
        Action::Import(a) => actions::objcopy::import(a),
        Action::Export(a) => actions::objcopy::export(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<actions::Quiet>().is_some() => ExitCode::from(errors::exit_code(&e)),
        Err(e) => {
            errors::report(&e);
            ExitCode::from(errors::exit_code(&e))
        }
    }
}
