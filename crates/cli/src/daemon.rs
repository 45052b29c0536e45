//! `open --daemon`, `--pidfile`, and systemd's readiness protocol.
//!
//! `--daemon` re-executes the same command line as a child marked by [`CHILD_ENV`] (no
//! `fork` in a threaded process). The child keeps the terminal while it unlocks (it may
//! prompt), and once the volume is served it writes the pidfile, tells the parent through
//! its stdout pipe ([`READY_LINE`]), starts a new session and points its standard streams
//! at /dev/null. The parent passes the child's other stdout lines through (`--print-table`)
//! and exits 0 at the ready line, or with the child's exit code if the child ends first.
//! With `NOTIFY_SOCKET` set, `READY=1` and `STOPPING=1` are sent there (sd_notify(3)).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Mutex;

use anyhow::{Context, Result};

/// Marks the re-executed child.
pub const CHILD_ENV: &str = "SEALDISK_DAEMON_CHILD";

/// The line the child writes when it serves.
const READY_LINE: &str = "sealdisk-daemon-ready";

/// The pidfile to remove at exit.
static PIDFILE: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Whether this process is the `--daemon` child.
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// The `--daemon` parent: runs the child and waits for it to be ready. Returns the exit
/// code for this process.
pub fn run_parent() -> Result<ExitCode> {
    let exe = std::env::current_exe().context("finding the sealdisk executable")?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(CHILD_ENV, "1")
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the daemon")?;
    let Some(out) = child.stdout.take() else { anyhow::bail!("the daemon's stdout is missing") };
    let mut lines = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        let n = lines.read_line(&mut line).context("reading from the daemon")?;
        if n == 0 {
            break;
        }
        if line.trim_end() == READY_LINE {
            return Ok(ExitCode::SUCCESS);
        }
        print!("{line}");
        let _ = std::io::stdout().flush();
    }
    let status = child.wait().context("waiting for the daemon")?;
    // The child ended without serving: its code (0 for an action that serves nothing,
    // such as `open --test-passphrase`), or 1 when a signal ended it.
    Ok(ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)))
}

/// Writes `pid` to `path` (cryptsetup-style pidfiles: the number and a newline), replacing
/// what was there, and remembers it for [`remove_pidfile`].
pub fn write_pidfile(path: &Path) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{}\n", std::process::id()))
        .with_context(|| format!("writing pidfile {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing pidfile {}", path.display()))?;
    *PIDFILE.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(path.to_owned());
    Ok(())
}

/// Removes the pidfile written by [`write_pidfile`], if any.
pub fn remove_pidfile() {
    if let Some(p) = PIDFILE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
        let _ = std::fs::remove_file(p);
    }
}

/// Sends `state` to systemd's `NOTIFY_SOCKET`, if set (a path, or `@name` for the abstract
/// namespace). Errors are logged: readiness is advisory for a process that serves.
pub fn notify(state: &str) {
    let Some(sock) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let r = (|| -> std::io::Result<()> {
        let s = std::os::unix::net::UnixDatagram::unbound()?;
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(sock.as_os_str());
        if let Some(abs) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abs)?;
            s.send_to_addr(state.as_bytes(), &addr)?;
        } else {
            s.send_to(state.as_bytes(), &sock)?;
        }
        Ok(())
    })();
    if let Err(e) = r {
        log::warn!("NOTIFY_SOCKET: cannot send {state:?}: {e}");
    }
}

/// The volume is served: pidfile, systemd, and for the `--daemon` child the parent's
/// go-ahead, a new session, and standard streams on /dev/null.
pub fn ready(pidfile: Option<&Path>) -> Result<()> {
    if let Some(p) = pidfile {
        write_pidfile(p)?;
    }
    notify("READY=1");
    if is_child() {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{READY_LINE}").and_then(|()| out.flush()).context("telling the parent we serve")?;
        drop(out);
        if let Err(e) = rustix::process::setsid() {
            log::warn!("setsid: {e}");
        }
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .context("opening /dev/null")?;
        rustix::stdio::dup2_stdin(&null).context("detaching stdin")?;
        rustix::stdio::dup2_stdout(&null).context("detaching stdout")?;
        rustix::stdio::dup2_stderr(&null).context("detaching stderr")?;
    }
    Ok(())
}

/// Serving is ending.
pub fn stopping() {
    notify("STOPPING=1");
}
