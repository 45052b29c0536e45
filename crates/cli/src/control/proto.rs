//! The control protocol, version 1: one JSON object per line each way, a request then its
//! response, then the server closes the connection. A request line is at most
//! [`MAX_LINE`] bytes. `resume` is the one request with a payload: `secret_len` raw bytes
//! (the passphrase, at most [`MAX_SECRET`]) follow its line, so the passphrase is read
//! straight into secret memory and never passes through the JSON parser.

use std::io::{BufRead, Read};

use serde::{Deserialize, Serialize};

/// The protocol version this build speaks.
pub const VERSION: u32 = 1;

/// The longest request or response line.
pub const MAX_LINE: usize = 64 << 10;

/// The longest passphrase (cryptsetup's key file limit).
pub const MAX_SECRET: usize = 8 << 20;

/// A request.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// [`VERSION`].
    pub v: u32,
    #[serde(flatten)]
    pub cmd: Command,
}

/// What a request asks.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// The volume's status.
    Status,
    /// Drain, flush, disconnect clients, exit.
    Close,
    /// Change the placement flags live.
    Refresh(Refresh),
    /// Hold I/O, flush, wipe the key.
    Suspend,
    /// Change the size (512-byte sectors; `None`: all the device has after the offset).
    Resize {
        /// New size in 512-byte sectors.
        size: Option<u64>,
        /// A standalone integrity volume: wipe the new area (zeroes with valid tags)
        /// instead of recalculating it (integritysetup's `resize --wipe`).
        #[serde(default)]
        wipe: bool,
    },
    /// Unlock with the passphrase that follows the line, release held I/O.
    Resume {
        /// Bytes of passphrase after the line.
        secret_len: usize,
    },
    /// Start (or resume) a LUKS2 reencryption of the served volume, online; the passphrase
    /// follows the line. Answered once it runs; `status` shows its progress.
    Reencrypt(Box<Reencrypt>),
}

/// `reencrypt`'s options (cryptsetup's names), sent to the server of an active volume.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reencrypt {
    /// Bytes of passphrase after the line.
    pub secret_len: usize,
    pub init_only: bool,
    pub resume_only: bool,
    pub cipher: Option<String>,
    pub key_bytes: Option<usize>,
    pub sector_size: Option<u32>,
    pub key_slot: Option<u32>,
    pub resilience: Option<String>,
    pub resilience_hash: String,
    pub hotzone_size: Option<u64>,
    /// New keyslot's KDF: `--pbkdf`, `--hash`, `--iter-time` (ms), forced iterations,
    /// memory (KiB), parallel lanes.
    pub pbkdf: Option<String>,
    pub hash: String,
    pub iter_time_ms: u64,
    pub pbkdf_force_iterations: Option<u32>,
    pub pbkdf_memory: Option<u32>,
    pub pbkdf_parallel: Option<u32>,
    /// `--decrypt --header NEW` of a volume whose header is on the device (the data-shift
    /// decryption): NEW's absolute path, a file that does not exist yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decrypt_header: Option<String>,
}

/// An online reencryption as `status` shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReencryptProgress {
    /// `running`, `finished`, `interrupted`, `failed`.
    pub state: String,
    /// Bytes rewritten (from the data offset), of `total`.
    pub done: u64,
    pub total: u64,
    /// Bytes per second since this run started, and the seconds left at that rate.
    pub rate: f64,
    pub eta_secs: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `refresh`'s new flags (they replace the running ones, as `cryptsetup refresh`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Refresh {
    pub same_cpu_crypt: bool,
    pub submit_from_crypt_cpus: bool,
    pub no_read_workqueue: bool,
    pub no_write_workqueue: bool,
    /// `auto`, `pool` or `inline`; `None` keeps the running one.
    pub crypt_mode: Option<String>,
    /// Asked for `--allow-discards` (refused: clients learned the capability at connect).
    pub allow_discards: bool,
}

/// A response.
#[derive(Debug, Serialize, Deserialize)]
pub struct Response {
    /// [`VERSION`].
    pub v: u32,
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The exit code the client should end with when not `ok` (cryptsetup's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u8>,
    /// `status`'s answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

impl Response {
    /// Success without data.
    pub fn ok() -> Self {
        Response { v: VERSION, ok: true, error: None, code: None, status: None }
    }

    /// A failure with cryptsetup's exit `code`.
    pub fn err(code: u8, msg: impl Into<String>) -> Self {
        Response { v: VERSION, ok: false, error: Some(msg.into()), code: Some(code), status: None }
    }
}

/// A running volume as `status` shows it (cryptsetup's fields, then sealdisk's transport).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Status {
    pub name: String,
    /// `LUKS1`, `LUKS2`, `PLAIN`, `INTEGRITY`, `n/a`.
    #[serde(rename = "type")]
    pub kind: String,
    pub cipher: Option<String>,
    pub keysize_bits: Option<u32>,
    /// Where the key is: `dm-crypt` (in the crypt layer's memory), `none` while suspended.
    pub key_location: Option<String>,
    /// Authenticated encryption: the integrity algorithm and tag size.
    pub integrity: Option<String>,
    pub integrity_tag_size: Option<u32>,
    /// dm-integrity journal: `journal`, `bitmap`, `direct` (no journal), `recovery`.
    pub journal: Option<String>,
    pub device: String,
    pub sector_size: u32,
    /// 512-byte sectors.
    pub offset: u64,
    pub size: u64,
    pub skipped: u64,
    pub read_only: bool,
    pub suspended: bool,
    pub flags: Vec<String>,
    /// Where placement puts crypto when no flag says inline: `auto`, `pool`, `inline`.
    pub crypt_mode: Option<String>,
    /// `nbd`, `fuse`.
    pub transport: String,
    /// The NBD address, or the FUSE file.
    pub address: String,
    /// Connected NBD clients.
    pub clients: Option<usize>,
    pub pid: u32,
    /// The online reencryption this server ran or runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reencryption: Option<ReencryptProgress>,
}

/// Why a line could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("the line is longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("the connection closed before a full line")]
    Eof,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads one line (without its newline) of at most [`MAX_LINE`] bytes.
pub fn read_line(r: &mut impl BufRead) -> Result<Vec<u8>, LineError> {
    let mut line = Vec::new();
    let n = r.take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line)?;
    if line.last() == Some(&b'\n') {
        line.pop();
        return Ok(line);
    }
    if n > MAX_LINE {
        return Err(LineError::TooLong);
    }
    Err(LineError::Eof)
}

/// Parses a request line; the error is the reply's text.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    let req: Request = serde_json::from_slice(line).map_err(|e| format!("bad request: {e}"))?;
    if req.v != VERSION {
        return Err(format!("protocol version {} is not supported (this server speaks {VERSION})", req.v));
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let r = parse_request(br#"{"v":1,"cmd":"resume","secret_len":5}"#).unwrap();
        assert!(matches!(r.cmd, Command::Resume { secret_len: 5 }));
        let line = serde_json::to_vec(&Request { v: 1, cmd: Command::Status }).unwrap();
        assert!(matches!(parse_request(&line).unwrap().cmd, Command::Status));
        for bad in
            [&b"garbage"[..], br#"{"v":2,"cmd":"status"}"#, br#"{"v":1,"cmd":"format"}"#, b"", b"\xff\xfe"]
        {
            assert!(parse_request(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn lines_are_bounded() {
        let long = vec![b'x'; MAX_LINE + 10];
        assert!(matches!(read_line(&mut &long[..]), Err(LineError::TooLong)));
        assert!(matches!(read_line(&mut &b"abc"[..]), Err(LineError::Eof)));
        assert_eq!(read_line(&mut &b"abc\nrest"[..]).unwrap(), b"abc");
    }
}
