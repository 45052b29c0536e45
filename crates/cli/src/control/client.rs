//! The client commands: `status`, `close` (`luksClose`), `refresh`, `luksSuspend`,
//! `luksResume`. Each connects to the volume's control socket, sends one request and prints
//! the answer with cryptsetup's wording and exit codes.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::proto::{self, Command, Refresh, Request, Response, Status, VERSION};
use crate::actions::luks::KeyArgs;
use crate::actions::open::CryptModeArg;
use crate::actions::{Quiet, UsageError};
use crate::exit;

/// `status NAME`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The volume's name (the NAME of `open`).
    pub name: String,
    /// Print the status as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `close NAME` / `luksClose NAME`.
#[derive(Debug, Args)]
pub struct CloseArgs {
    /// The volume's name.
    pub name: String,
    /// Accepted for cryptsetup compatibility (the running volume knows its type).
    #[arg(long = "type", short = 't', value_name = "TYPE")]
    pub kind: Option<String>,
}

/// `refresh NAME`: the placement flags, changed live.
#[derive(Debug, Args)]
pub struct RefreshArgs {
    /// The volume's name.
    pub name: String,
    /// Accepted for cryptsetup compatibility.
    #[arg(long = "type", short = 't', value_name = "TYPE")]
    pub kind: Option<String>,
    /// Keep each request's crypto on one pool thread.
    #[arg(long = "perf-same_cpu_crypt")]
    pub perf_same_cpu_crypt: bool,
    /// With pooled crypto, the pool thread that encrypts a write also submits it.
    #[arg(long = "perf-submit_from_crypt_cpus")]
    pub perf_submit_from_crypt_cpus: bool,
    /// Decrypt on the request's thread, not the crypto pool.
    #[arg(long = "perf-no_read_workqueue")]
    pub perf_no_read_workqueue: bool,
    /// Encrypt on the request's thread, not the crypto pool.
    #[arg(long = "perf-no_write_workqueue")]
    pub perf_no_write_workqueue: bool,
    /// Where crypto runs when no --perf-no_*_workqueue flag says inline (default: unchanged).
    #[arg(long, value_enum)]
    pub crypt_mode: Option<CryptModeArg>,
    /// Must match the running volume (discard support cannot change while clients are
    /// connected; given otherwise, refresh is refused).
    #[arg(long)]
    pub allow_discards: bool,
}

/// `resize NAME`: a running plain, LUKS or standalone integrity volume's size.
#[derive(Debug, Args)]
pub struct ResizeArgs {
    /// The volume's name.
    pub name: String,
    /// New size in 512-byte sectors (default: all the device has after the data offset).
    #[arg(long, short = 'b', value_name = "SECTORS")]
    pub size: Option<u64>,
    /// Accepted for cryptsetup compatibility; offline, `plain` for a plain image.
    #[arg(long = "type", short = 't', value_name = "TYPE")]
    pub kind: Option<String>,
    #[command(flatten)]
    pub offline: crate::actions::resize_offline::OfflineArgs,
}

/// `luksSuspend NAME`.
#[derive(Debug, Args)]
pub struct SuspendArgs {
    /// The volume's name.
    pub name: String,
}

/// `luksResume NAME`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The volume's name.
    pub name: String,
    #[command(flatten)]
    pub keys: KeyArgs,
}

/// A volume that is not running: cryptsetup's "inactive" (exit 4).
#[derive(Debug, thiserror::Error)]
#[error("Device {0} is not active.")]
pub struct Inactive(pub String);

/// The server's refusal, with the exit code it chose.
#[derive(Debug, thiserror::Error)]
#[error("{msg}")]
pub struct Refused {
    pub msg: String,
    pub code: u8,
}

/// Connects to the control socket of `name`; `None` when no server is running under it.
fn connect(name: &str) -> Result<Option<UnixStream>> {
    let path = super::find(name)?;
    match UnixStream::connect(&path) {
        Ok(s) => Ok(Some(s)),
        Err(e)
            if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) =>
        {
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("connecting to {}", path.display())),
    }
}

/// Sends `cmd` (and `payload` after its line) and reads the response. `timeout` bounds the
/// wait for the answer (`None`: as long as it takes, for a close that flushes a lot).
fn call(name: &str, cmd: Command, payload: &[u8], timeout: Option<Duration>) -> Result<Response> {
    let Some(stream) = connect(name)? else {
        bail!(Inactive(name.to_owned()));
    };
    stream.set_read_timeout(timeout)?;
    let mut line = serde_json::to_vec(&Request { v: VERSION, cmd }).context("encoding the request")?;
    line.push(b'\n');
    (&stream).write_all(&line).context("sending the request")?;
    (&stream).write_all(payload).context("sending the passphrase")?;
    let mut reader = BufReader::new(&stream);
    let resp = proto::read_line(&mut reader).with_context(|| format!("reading {name}'s answer"))?;
    let resp: Response = serde_json::from_slice(&resp).context("decoding the answer")?;
    if !resp.ok {
        bail!(Refused {
            msg: resp.error.unwrap_or_else(|| "refused".into()),
            code: resp.code.unwrap_or(exit::FAILURE)
        });
    }
    Ok(resp)
}

/// Runs `status`.
pub fn status(a: StatusArgs) -> Result<()> {
    super::check_name(&a.name)?;
    let resp = match call(&a.name, Command::Status, &[], Some(Duration::from_secs(30))) {
        Err(e) if e.downcast_ref::<Inactive>().is_some() => {
            if a.json {
                println!("{}", serde_json::json!({ "name": a.name, "active": false }));
            } else {
                println!("{} is inactive.", a.name);
            }
            bail!(Quiet(exit::DEVICE));
        }
        r => r?,
    };
    let Some(s) = resp.status else { bail!("the server sent no status") };
    if a.json {
        let mut v = serde_json::to_value(&s).context("encoding the status")?;
        if let Some(o) = v.as_object_mut() {
            o.insert("active".into(), true.into());
        }
        println!("{v}");
    } else {
        print!("{}", render(&s));
    }
    Ok(())
}

/// `cryptsetup status`'s layout, then sealdisk's transport lines.
pub fn render(s: &Status) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} is active{}.",
        s.name,
        if s.clients.unwrap_or(0) > 0 { " and is in use" } else { "" }
    );
    let _ = writeln!(o, "  type:    {}", s.kind);
    if let Some(c) = &s.cipher {
        let _ = writeln!(o, "  cipher:  {c}");
    }
    if let Some(k) = s.keysize_bits {
        let _ = writeln!(o, "  keysize: {k} bits");
    }
    if let Some(l) = &s.key_location {
        let _ = writeln!(o, "  key location: {l}");
    }
    if let Some(i) = &s.integrity {
        let _ = writeln!(o, "  integrity: {i}");
    }
    if let Some(t) = s.integrity_tag_size {
        let _ = writeln!(o, "  integrity tag size: {t} bytes");
    }
    if let Some(j) = &s.journal {
        let _ = writeln!(o, "  journal: {j}");
    }
    let _ = writeln!(o, "  device:  {}", s.device);
    let _ = writeln!(o, "  sector size:  {}", s.sector_size);
    let _ = writeln!(o, "  offset:  {} sectors", s.offset);
    let _ = writeln!(o, "  size:    {} sectors", s.size);
    if s.skipped > 0 {
        let _ = writeln!(o, "  skipped: {} sectors", s.skipped);
    }
    let _ = writeln!(
        o,
        "  mode:    {}{}",
        if s.read_only { "readonly" } else { "read/write" },
        if s.suspended { " (suspended)" } else { "" }
    );
    if !s.flags.is_empty() {
        let _ = writeln!(o, "  flags:   {} ", s.flags.join(" "));
    }
    if let Some(m) = &s.crypt_mode {
        let _ = writeln!(o, "  crypt mode: {m}");
    }
    let _ = writeln!(o, "  transport: {}", s.transport);
    let _ = writeln!(o, "  address: {}", s.address);
    if let Some(c) = s.clients {
        let _ = writeln!(o, "  clients: {c}");
    }
    let _ = writeln!(o, "  pid:     {}", s.pid);
    if let Some(r) = &s.reencryption {
        let pct = if r.total == 0 { 100.0 } else { r.done as f64 * 100.0 / r.total as f64 };
        let _ = writeln!(
            o,
            "  reencryption: {} {pct:.1}% ({} of {} MiB, {:.1} MiB/s, ETA {:02}:{:02})",
            r.state,
            r.done >> 20,
            r.total >> 20,
            r.rate / f64::from(1 << 20),
            r.eta_secs / 60,
            r.eta_secs % 60
        );
        if let Some(e) = &r.error {
            let _ = writeln!(o, "  reencryption error: {e}");
        }
    }
    o
}

/// Asks the server of `name` to reencrypt its volume online with `pass`.
pub fn reencrypt(name: &str, req: proto::Reencrypt, pass: &[u8]) -> Result<()> {
    super::check_name(name)?;
    let req = proto::Reencrypt { secret_len: pass.len(), ..req };
    call(name, Command::Reencrypt(Box::new(req)), pass, Some(Duration::from_secs(600)))?;
    Ok(())
}

/// The status of the server of `name`.
pub fn status_of(name: &str) -> Result<Status> {
    let resp = call(name, Command::Status, &[], Some(Duration::from_secs(30)))?;
    resp.status.context("the server sent no status")
}

/// The name of the running volume served from `device` (same file once symlinks are
/// resolved), looked up among the control sockets of the runtime directory.
pub fn serving(device: &str) -> Option<String> {
    let want = std::fs::canonicalize(device).ok()?;
    let dir = super::runtime_dir();
    super::check_dir(&dir).ok()?;
    for e in std::fs::read_dir(&dir).ok()?.flatten() {
        let file = e.file_name();
        let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".ctl")) else { continue };
        if let Ok(st) = status_of(name) {
            if std::fs::canonicalize(&st.device).is_ok_and(|d| d == want) {
                return Some(name.to_owned());
            }
        }
    }
    None
}

/// Runs `close`.
pub fn close(a: CloseArgs) -> Result<()> {
    super::check_name(&a.name)?;
    call(&a.name, Command::Close, &[], None)?;
    Ok(())
}

/// Runs `refresh`.
pub fn refresh(a: RefreshArgs) -> Result<()> {
    super::check_name(&a.name)?;
    let r = Refresh {
        same_cpu_crypt: a.perf_same_cpu_crypt,
        submit_from_crypt_cpus: a.perf_submit_from_crypt_cpus,
        no_read_workqueue: a.perf_no_read_workqueue,
        no_write_workqueue: a.perf_no_write_workqueue,
        crypt_mode: a.crypt_mode.map(|m| volume::CryptMode::from(m).to_string()),
        allow_discards: a.allow_discards,
    };
    call(&a.name, Command::Refresh(r), &[], Some(Duration::from_secs(60)))?;
    Ok(())
}

/// Runs `resize`. Clients that connect afterwards see the new size (NBD has no way to tell
/// a connected client).
pub fn resize(a: ResizeArgs) -> Result<()> {
    // An image path (not a running volume's name): grow it offline.
    if crate::actions::resize_offline::is_offline(&a.name)
        && (a.name.contains('/') || connect(&a.name)?.is_none())
    {
        return crate::actions::resize_offline::resize(&a.name, a.size, a.kind.as_deref(), &a.offline);
    }
    super::check_name(&a.name)?;
    let size = match (a.size, a.offline.device_size) {
        (Some(_), Some(_)) => bail!(UsageError("--size and --device-size are mutually exclusive".into())),
        (s, None) => s,
        (None, Some(b)) => Some(crate::actions::resize_offline::device_size_sectors(b)?),
    };
    call(&a.name, Command::Resize { size, wipe: a.offline.wipe }, &[], Some(Duration::from_secs(600)))?;
    Ok(())
}

/// Runs `luksSuspend`.
pub fn suspend(a: SuspendArgs) -> Result<()> {
    super::check_name(&a.name)?;
    call(&a.name, Command::Suspend, &[], None)?;
    Ok(())
}

/// Runs `luksResume`: reads the passphrase (`--key-file`, or the prompt) here, and sends
/// it to the server, which tries it against the header's keyslots.
pub fn resume(a: ResumeArgs) -> Result<()> {
    super::check_name(&a.name)?;
    // Fail early, before asking for a passphrase, when nothing runs under the name.
    if connect(&a.name)?.is_none() {
        bail!(Inactive(a.name.clone()));
    }
    let pass = crate::actions::luks::passphrase(&a.keys, &format!("Enter passphrase for {}: ", a.name))?;
    let len = pass.as_bytes().len();
    if len > proto::MAX_SECRET {
        bail!(UsageError(format!("the passphrase is longer than {} bytes", proto::MAX_SECRET)));
    }
    call(&a.name, Command::Resume { secret_len: len }, pass.as_bytes(), None)?;
    Ok(())
}
