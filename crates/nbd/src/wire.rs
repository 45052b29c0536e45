//! The NBD wire format: magic numbers, option/command/reply codes and the few fixed-layout
//! messages the server reads and writes. Sans-IO: bytes in, structs out, and back.
//!
//! Reference: the NBD protocol, `doc/proto.md` in github.com/NetworkBlockDevice/nbd.
//! Every integer on the wire is big-endian.
//!
//! ```text
//! Handshake (server → client, fixed newstyle)        Option request (client → server)
//!   0  u64  NBDMAGIC                                   0  u64  IHAVEOPT
//!   8  u64  IHAVEOPT                                   8  u32  option
//!  16  u16  handshake flags                           12  u32  data length
//! Client flags (client → server)                      16  ...  data
//!   0  u32  client flags
//!
//! Option reply (server → client)                     Request (client → server)
//!   0  u64  OPT_REPLY_MAGIC                            0  u32  REQUEST_MAGIC
//!   8  u32  option                                     4  u16  command flags
//!  12  u32  reply type                                 6  u16  command type
//!  16  u32  data length                                8  u64  cookie
//!  20  ...  data                                      16  u64  offset
//!                                                     24  u32  length
//! Simple reply                                        28  ...  payload (WRITE only)
//!   0  u32  SIMPLE_REPLY_MAGIC
//!   4  u32  error                                    Structured reply chunk
//!   8  u64  cookie                                     0  u32  STRUCTURED_REPLY_MAGIC
//!  16  ...  data (READ without error)                  4  u16  flags
//!                                                      6  u16  type
//!                                                      8  u64  cookie
//!                                                     16  u32  payload length
//!                                                     20  ...  payload
//! ```

use thiserror::Error;

/// `"NBDMAGIC"`, the first eight bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `"IHAVEOPT"`: newstyle negotiation; also prefixes every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server → client, u16) and client flags (client → server, u32).
pub mod handshake_flag {
    /// Server: fixed newstyle. Client (`NBD_FLAG_C_FIXED_NEWSTYLE`): understood.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// Server: may omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`. Client: please do.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Option codes (`NBD_OPT_*`).
pub mod opt {
    /// Select an export by name and enter transmission (no error reply possible).
    pub const EXPORT_NAME: u32 = 1;
    /// End negotiation.
    pub const ABORT: u32 = 2;
    /// List the exports.
    pub const LIST: u32 = 3;
    /// Upgrade to TLS (unsupported here).
    pub const STARTTLS: u32 = 5;
    /// Describe an export without selecting it.
    pub const INFO: u32 = 6;
    /// Describe an export and enter transmission.
    pub const GO: u32 = 7;
    /// Use structured replies in transmission.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts (`base:allocation` is the only one here).
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Select metadata contexts for `NBD_CMD_BLOCK_STATUS`.
    pub const SET_META_CONTEXT: u32 = 10;
    /// 64-bit request headers (unsupported here).
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types (`NBD_REP_*`).
pub mod rep {
    /// The option is done.
    pub const ACK: u32 = 1;
    /// One export in an `NBD_OPT_LIST` answer.
    pub const SERVER: u32 = 2;
    /// One piece of export information (`NBD_OPT_INFO`/`NBD_OPT_GO`).
    pub const INFO: u32 = 3;
    /// One metadata context (`NBD_OPT_LIST_META_CONTEXT`/`NBD_OPT_SET_META_CONTEXT`).
    pub const META_CONTEXT: u32 = 4;
    /// Bit set in every error reply type.
    pub const ERR_BIT: u32 = 1 << 31;
    /// The option is unknown to this server.
    pub const ERR_UNSUP: u32 = ERR_BIT | 1;
    /// Forbidden by server policy.
    pub const ERR_POLICY: u32 = ERR_BIT | 2;
    /// Syntactically or semantically invalid option.
    pub const ERR_INVALID: u32 = ERR_BIT | 3;
    /// Not supported on this platform.
    pub const ERR_PLATFORM: u32 = ERR_BIT | 4;
    /// TLS required first.
    pub const ERR_TLS_REQD: u32 = ERR_BIT | 5;
    /// The requested export does not exist.
    pub const ERR_UNKNOWN: u32 = ERR_BIT | 6;
    /// The server is shutting down.
    pub const ERR_SHUTDOWN: u32 = ERR_BIT | 7;
    /// The client must request block sizes.
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERR_BIT | 8;
    /// The option's data is too large.
    pub const ERR_TOO_BIG: u32 = ERR_BIT | 9;
}

/// Information types inside `NBD_REP_INFO` (`NBD_INFO_*`).
pub mod info {
    /// u64 size, u16 transmission flags. Always sent.
    pub const EXPORT: u16 = 0;
    /// The export's canonical name.
    pub const NAME: u16 = 1;
    /// A human-readable description.
    pub const DESCRIPTION: u16 = 2;
    /// u32 minimum, u32 preferred, u32 maximum block size.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags (u16), sent with the export size.
pub mod tflag {
    /// Always set: the other flags are meaningful.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// The export is read-only.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_FUA` is supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// The export is rotational media.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_CMD_TRIM` is supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_CMD_WRITE_ZEROES` is supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_CMD_FLAG_DF` is supported (structured replies only).
    pub const SEND_DF: u16 = 1 << 7;
    /// Several connections to this export see one consistent device.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Command types (`NBD_CMD_*`).
pub mod cmd {
    /// Read `length` bytes at `offset`.
    pub const READ: u16 = 0;
    /// Write the payload at `offset`.
    pub const WRITE: u16 = 1;
    /// Soft disconnect.
    pub const DISC: u16 = 2;
    /// Make completed writes durable.
    pub const FLUSH: u16 = 3;
    /// Discard a range.
    pub const TRIM: u16 = 4;
    /// Prefetch (unsupported here).
    pub const CACHE: u16 = 5;
    /// Zero a range without a payload.
    pub const WRITE_ZEROES: u16 = 6;
    /// Metadata query: the status of a range in each selected metadata context.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags (`NBD_CMD_FLAG_*`).
pub mod cmd_flag {
    /// Force unit access.
    pub const FUA: u16 = 1 << 0;
    /// `WRITE_ZEROES`: the range must stay allocated.
    pub const NO_HOLE: u16 = 1 << 1;
    /// `READ`: don't fragment the reply.
    pub const DF: u16 = 1 << 2;
    /// `BLOCK_STATUS`: one extent only.
    pub const REQ_ONE: u16 = 1 << 3;
    /// `WRITE_ZEROES`: fail fast unless cheap.
    pub const FAST_ZERO: u16 = 1 << 4;
    /// Extended headers: the length field is a payload length.
    pub const PAYLOAD_LEN: u16 = 1 << 5;
}

/// Structured reply chunk flags and types.
pub mod reply {
    /// Flag: the last chunk of this reply.
    pub const FLAG_DONE: u16 = 1 << 0;
    /// Type: no payload; used as the final chunk.
    pub const TYPE_NONE: u16 = 0;
    /// Type: u64 offset, then data.
    pub const TYPE_OFFSET_DATA: u16 = 1;
    /// Type: u64 offset, u32 hole length.
    pub const TYPE_OFFSET_HOLE: u16 = 2;
    /// Type: block status descriptors.
    pub const TYPE_BLOCK_STATUS: u16 = 5;
    /// Type: u32 error, u16 message length, message.
    pub const TYPE_ERROR: u16 = (1 << 15) | 1;
    /// Type: u32 error, u16 message length, message, u64 offset.
    pub const TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;
}

/// The one metadata context this server offers: allocation, with the `state` flags.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// Status flags of `base:allocation` (`NBD_STATE_*`).
pub mod state {
    /// The extent is not allocated in the storage: writing there may need space.
    pub const HOLE: u32 = 1 << 0;
    /// The extent reads as zeroes.
    pub const ZERO: u32 = 1 << 1;
}

/// The only error numbers NBD knows (`NBD_E*`).
pub mod errno {
    /// Operation not permitted (e.g. a write to a read-only export).
    pub const EPERM: u32 = 1;
    /// Input/output error.
    pub const EIO: u32 = 5;
    /// Cannot allocate memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument (misaligned, out of range reads, unknown command...).
    pub const EINVAL: u32 = 22;
    /// No space left (writes past the end).
    pub const ENOSPC: u32 = 28;
    /// Value too large (a read too large to send unfragmented).
    pub const EOVERFLOW: u32 = 75;
    /// Operation not supported.
    pub const ENOTSUP: u32 = 95;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// Maps a host errno (as from `BlockErrorKind::errno`) to the NBD error number.
///
/// NBD defines only eight values; everything else (including `EILSEQ`, which integrity
/// failures carry) becomes `NBD_EIO`.
pub fn nbd_errno(host: i32) -> u32 {
    match host {
        libc::EPERM | libc::EROFS | libc::EACCES => errno::EPERM,
        libc::ENOMEM => errno::ENOMEM,
        libc::EINVAL => errno::EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => errno::ENOSPC,
        libc::EOVERFLOW => errno::EOVERFLOW,
        libc::ENOTSUP => errno::ENOTSUP,
        libc::ESHUTDOWN => errno::ESHUTDOWN,
        _ => errno::EIO,
    }
}

/// A malformed message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WireError {
    /// A request did not start with `REQUEST_MAGIC`.
    #[error("bad request magic {0:#010x}")]
    BadRequestMagic(u32),
    /// An option did not start with `IHAVEOPT`.
    #[error("bad option magic {0:#018x}")]
    BadOptionMagic(u64),
    /// The option data ended before the named field.
    #[error("option data truncated at {0}")]
    Truncated(&'static str),
    /// The option data had bytes after its last field.
    #[error("option data has {0} trailing bytes")]
    TrailingBytes(usize),
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// The server's first message: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn encode_greeting(flags: u16) -> [u8; 18] {
    let mut b = [0u8; 18];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&flags.to_be_bytes());
    b
}

/// The fixed part of an option request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// `opt::*` code.
    pub option: u32,
    /// Length of the data that follows.
    pub length: u32,
}

impl OptionHeader {
    /// Encoded size.
    pub const SIZE: usize = 16;

    /// Decodes and checks the magic.
    pub fn decode(b: &[u8; Self::SIZE]) -> Result<Self, WireError> {
        let magic = be64(b, 0);
        if magic != IHAVEOPT {
            return Err(WireError::BadOptionMagic(magic));
        }
        Ok(OptionHeader { option: be32(b, 8), length: be32(b, 12) })
    }

    /// Encodes (used by clients and tests).
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// Appends one option reply (header and data) to `out`.
///
/// `data` must be shorter than 4 GiB; the server only sends short replies.
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// The data of `NBD_OPT_INFO` / `NBD_OPT_GO`: an export name and the information requested.
///
/// ```text
///   0  u32      name length N
///   4  N bytes  name
/// 4+N  u16      number of requests R
/// 6+N  R × u16  information types
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    /// Export name (UTF-8 by the spec; compared as bytes).
    pub name: &'a [u8],
    /// Requested `info::*` types, in the client's order.
    pub requests: Vec<u16>,
}

impl<'a> InfoRequest<'a> {
    /// Parses the option data, which must be exactly as long as its fields say.
    pub fn decode(data: &'a [u8]) -> Result<Self, WireError> {
        let (name, rest) = split_name(data)?;
        if rest.len() < 2 {
            return Err(WireError::Truncated("number of information requests"));
        }
        let n = usize::from(be16(rest, 0));
        let rest = &rest[2..];
        if rest.len() < 2 * n {
            return Err(WireError::Truncated("information requests"));
        }
        if rest.len() > 2 * n {
            return Err(WireError::TrailingBytes(rest.len() - 2 * n));
        }
        let requests = rest.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
        Ok(InfoRequest { name, requests })
    }

    /// Encodes (used by clients and tests).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(6 + self.name.len() + 2 * self.requests.len());
        b.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        b.extend_from_slice(self.name);
        b.extend_from_slice(&(self.requests.len() as u16).to_be_bytes());
        for r in &self.requests {
            b.extend_from_slice(&r.to_be_bytes());
        }
        b
    }
}

/// Splits option data that starts with a u32-length-prefixed export name into the name and
/// what follows it.
fn split_name(data: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    if data.len() < 4 {
        return Err(WireError::Truncated("name length"));
    }
    let name_len = be32(data, 0) as usize;
    let rest = &data[4..];
    if rest.len() < name_len {
        return Err(WireError::Truncated("name"));
    }
    Ok(rest.split_at(name_len))
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`: an export name
/// and the queries.
///
/// ```text
///   0  u32      name length N
///   4  N bytes  name
/// 4+N  u32      number of queries Q
/// 8+N  Q ×      u32 query length L, then L bytes of query ("namespace:leaf")
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest<'a> {
    /// Export name (compared as bytes).
    pub name: &'a [u8],
    /// The queries, in the client's order.
    pub queries: Vec<&'a [u8]>,
}

impl<'a> MetaContextRequest<'a> {
    /// Parses the option data, which must be exactly as long as its fields say. The query
    /// count is checked against the bytes present before anything is allocated for it.
    pub fn decode(data: &'a [u8]) -> Result<Self, WireError> {
        let (name, rest) = split_name(data)?;
        if rest.len() < 4 {
            return Err(WireError::Truncated("number of queries"));
        }
        let n = be32(rest, 0) as usize;
        let mut rest = &rest[4..];
        // Each query takes at least its 4-byte length.
        if rest.len() / 4 < n {
            return Err(WireError::Truncated("queries"));
        }
        let mut queries = Vec::with_capacity(n);
        for _ in 0..n {
            if rest.len() < 4 {
                return Err(WireError::Truncated("query length"));
            }
            let len = be32(rest, 0) as usize;
            if rest.len() - 4 < len {
                return Err(WireError::Truncated("query"));
            }
            queries.push(&rest[4..4 + len]);
            rest = &rest[4 + len..];
        }
        if !rest.is_empty() {
            return Err(WireError::TrailingBytes(rest.len()));
        }
        Ok(MetaContextRequest { name, queries })
    }

    /// Encodes (used by clients and tests).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(8 + self.name.len());
        b.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        b.extend_from_slice(self.name);
        b.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for q in &self.queries {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q);
        }
        b
    }
}

/// `NBD_REP_META_CONTEXT` data: u32 context id, then the context's name.
pub fn encode_rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

/// Appends a complete final `NBD_REPLY_TYPE_BLOCK_STATUS` chunk to `out`: the context id,
/// then one (u32 length, u32 status flags) descriptor per entry of `extents`.
///
/// ```text
///   0  chunk header (flags DONE, type 5, length 4 + 8 × n)
///  20  u32  metadata context id
///  24  n × (u32 extent length, u32 status flags)
/// ```
pub fn encode_block_status_chunk(out: &mut Vec<u8>, cookie: u64, context_id: u32, extents: &[(u32, u32)]) {
    let length = 4 + 8 * extents.len() as u32;
    let hdr = ChunkHeader { flags: reply::FLAG_DONE, typ: reply::TYPE_BLOCK_STATUS, cookie, length };
    out.reserve(ChunkHeader::SIZE + length as usize);
    out.extend_from_slice(&hdr.encode());
    out.extend_from_slice(&context_id.to_be_bytes());
    for &(len, flags) in extents {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
}

/// `NBD_REP_INFO` data for `NBD_INFO_EXPORT`: type, u64 size, u16 transmission flags.
pub fn encode_info_export(size: u64, tflags: u16) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..2].copy_from_slice(&info::EXPORT.to_be_bytes());
    b[2..10].copy_from_slice(&size.to_be_bytes());
    b[10..12].copy_from_slice(&tflags.to_be_bytes());
    b
}

/// `NBD_REP_INFO` data for `NBD_INFO_BLOCK_SIZE`: type, u32 minimum, preferred, maximum.
pub fn encode_info_block_size(minimum: u32, preferred: u32, maximum: u32) -> [u8; 14] {
    let mut b = [0u8; 14];
    b[0..2].copy_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    b[2..6].copy_from_slice(&minimum.to_be_bytes());
    b[6..10].copy_from_slice(&preferred.to_be_bytes());
    b[10..14].copy_from_slice(&maximum.to_be_bytes());
    b
}

/// `NBD_REP_INFO` data carrying a string (`NBD_INFO_NAME`, `NBD_INFO_DESCRIPTION`).
pub fn encode_info_string(info_type: u16, s: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + s.len());
    b.extend_from_slice(&info_type.to_be_bytes());
    b.extend_from_slice(s.as_bytes());
    b
}

/// `NBD_REP_SERVER` data: u32 name length, name, then the description.
pub fn encode_rep_server(name: &str, description: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len() + description.len());
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(description.as_bytes());
    b
}

/// The reply to `NBD_OPT_EXPORT_NAME`: u64 size, u16 flags, and 124 zero bytes unless
/// both sides agreed on `NO_ZEROES`.
pub fn encode_export_name_reply(size: u64, tflags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(134);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&tflags.to_be_bytes());
    if !no_zeroes {
        b.resize(b.len() + 124, 0);
    }
    b
}

/// A transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// `cmd_flag::*` bits.
    pub flags: u16,
    /// `cmd::*` type.
    pub typ: u16,
    /// Opaque value echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length (of the payload, for `WRITE`).
    pub length: u32,
}

impl Request {
    /// Encoded size.
    pub const SIZE: usize = 28;

    /// Decodes and checks the magic.
    pub fn decode(b: &[u8; Self::SIZE]) -> Result<Self, WireError> {
        let magic = be32(b, 0);
        if magic != REQUEST_MAGIC {
            return Err(WireError::BadRequestMagic(magic));
        }
        Ok(Request {
            flags: be16(b, 4),
            typ: be16(b, 6),
            cookie: be64(b, 8),
            offset: be64(b, 16),
            length: be32(b, 24),
        })
    }

    /// Encodes (used by clients and tests).
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.typ.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply header (any data follows it).
pub fn encode_simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// `reply::FLAG_*` bits.
    pub flags: u16,
    /// `reply::TYPE_*`.
    pub typ: u16,
    /// The request's cookie.
    pub cookie: u64,
    /// Payload length.
    pub length: u32,
}

impl ChunkHeader {
    /// Encoded size.
    pub const SIZE: usize = 20;

    /// Encodes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.typ.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..20].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decodes (used by clients and tests); `None` on a bad magic.
    pub fn decode(b: &[u8; Self::SIZE]) -> Option<Self> {
        (be32(b, 0) == STRUCTURED_REPLY_MAGIC).then(|| ChunkHeader {
            flags: be16(b, 4),
            typ: be16(b, 6),
            cookie: be64(b, 8),
            length: be32(b, 16),
        })
    }
}

/// Longest message the server puts in an error chunk.
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// Appends a complete `NBD_REPLY_TYPE_ERROR` chunk with the DONE flag to `out`. The
/// message is cut to `MAX_ERROR_MESSAGE` bytes at a character boundary.
pub fn encode_error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let mut end = message.len().min(MAX_ERROR_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let msg = &message.as_bytes()[..end];
    let hdr =
        ChunkHeader { flags: reply::FLAG_DONE, typ: reply::TYPE_ERROR, cookie, length: 6 + msg.len() as u32 };
    out.extend_from_slice(&hdr.encode());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

/// The header of a final `NBD_REPLY_TYPE_OFFSET_DATA` chunk (chunk header and offset) for
/// `data_len` bytes of data, which follow it. `data_len` must be at most `u32::MAX - 8`.
pub fn encode_offset_data_header(cookie: u64, offset: u64, data_len: u32) -> [u8; 28] {
    let hdr =
        ChunkHeader { flags: reply::FLAG_DONE, typ: reply::TYPE_OFFSET_DATA, cookie, length: data_len + 8 };
    let mut b = [0u8; 28];
    b[..20].copy_from_slice(&hdr.encode());
    b[20..28].copy_from_slice(&offset.to_be_bytes());
    b
}

/// A final `NBD_REPLY_TYPE_NONE` chunk: success without data.
pub fn encode_none_chunk(cookie: u64) -> [u8; 20] {
    ChunkHeader { flags: reply::FLAG_DONE, typ: reply::TYPE_NONE, cookie, length: 0 }.encode()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_matches_spec_bytes() {
        let g = encode_greeting(handshake_flag::FIXED_NEWSTYLE | handshake_flag::NO_ZEROES);
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..], &[0, 3]);
    }

    #[test]
    fn request_decodes_known_bytes() {
        let bytes: [u8; 28] = [
            0x25, 0x60, 0x95, 0x13, // magic
            0x00, 0x01, // FUA
            0x00, 0x01, // WRITE
            1, 2, 3, 4, 5, 6, 7, 8, // cookie
            0, 0, 0, 0, 0, 0, 0x10, 0x00, // offset 4096
            0, 0, 0x02, 0x00, // length 512
        ];
        let r = Request::decode(&bytes).unwrap();
        assert_eq!(
            r,
            Request {
                flags: cmd_flag::FUA,
                typ: cmd::WRITE,
                cookie: 0x0102_0304_0506_0708,
                offset: 4096,
                length: 512
            }
        );
        assert_eq!(r.encode(), bytes);
    }

    #[test]
    fn request_with_bad_magic_is_rejected() {
        let mut b = Request { flags: 0, typ: 0, cookie: 1, offset: 0, length: 0 }.encode();
        b[0] ^= 0xff;
        assert!(matches!(Request::decode(&b), Err(WireError::BadRequestMagic(_))));
    }

    #[test]
    fn option_header_round_trips_and_checks_magic() {
        let h = OptionHeader { option: opt::GO, length: 77 };
        let b = h.encode();
        assert_eq!(&b[..8], b"IHAVEOPT");
        assert_eq!(OptionHeader::decode(&b).unwrap(), h);
        let mut bad = b;
        bad[7] = 0;
        assert!(matches!(OptionHeader::decode(&bad), Err(WireError::BadOptionMagic(_))));
    }

    #[test]
    fn info_request_decodes_and_rejects_malformations() {
        let data = [0, 0, 0, 3, b'a', b'b', b'c', 0, 2, 0, 3, 0, 1];
        let r = InfoRequest::decode(&data).unwrap();
        assert_eq!(r.name, b"abc");
        assert_eq!(r.requests, vec![info::BLOCK_SIZE, info::NAME]);
        assert_eq!(r.encode(), data);

        assert_eq!(InfoRequest::decode(&data[..2]), Err(WireError::Truncated("name length")));
        assert_eq!(InfoRequest::decode(&[0, 0, 0, 9, b'a']), Err(WireError::Truncated("name")));
        assert_eq!(
            InfoRequest::decode(&[0, 0, 0, 0]),
            Err(WireError::Truncated("number of information requests"))
        );
        assert_eq!(
            InfoRequest::decode(&[0, 0, 0, 0, 0, 2, 0, 1]),
            Err(WireError::Truncated("information requests"))
        );
        assert_eq!(InfoRequest::decode(&[0, 0, 0, 0, 0, 0, 9]), Err(WireError::TrailingBytes(1)));
        // A name length near u32::MAX must not overflow anything.
        assert_eq!(InfoRequest::decode(&[0xff, 0xff, 0xff, 0xff, 0, 0]), Err(WireError::Truncated("name")));
    }

    #[test]
    fn meta_context_request_decodes_and_rejects_malformations() {
        let data = [
            0, 0, 0, 1, b'd', // name "d"
            0, 0, 0, 2, // two queries
            0, 0, 0, 5, b'b', b'a', b's', b'e', b':', // "base:"
            0, 0, 0, 0, // ""
        ];
        let r = MetaContextRequest::decode(&data).unwrap();
        assert_eq!(r.name, b"d");
        assert_eq!(r.queries, vec![&b"base:"[..], &b""[..]]);
        assert_eq!(r.encode(), data);

        let d = MetaContextRequest::decode;
        assert_eq!(d(&[0, 0]), Err(WireError::Truncated("name length")));
        assert_eq!(d(&[0, 0, 0, 2, b'a']), Err(WireError::Truncated("name")));
        assert_eq!(d(&[0, 0, 0, 0, 0, 0]), Err(WireError::Truncated("number of queries")));
        // A huge count with few bytes is refused before anything is allocated for it.
        assert_eq!(
            d(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]),
            Err(WireError::Truncated("queries"))
        );
        assert_eq!(d(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, b'x']), Err(WireError::Truncated("query")));
        assert_eq!(d(&[0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]), Err(WireError::Truncated("query")));
        assert_eq!(d(&[0, 0, 0, 0, 0, 0, 0, 0, 7]), Err(WireError::TrailingBytes(1)));
    }

    #[test]
    fn block_status_chunk_layout() {
        let mut out = Vec::new();
        encode_block_status_chunk(&mut out, 5, 1, &[(4096, state::HOLE | state::ZERO), (512, 0)]);
        let h = ChunkHeader::decode(out[..20].try_into().unwrap()).unwrap();
        assert_eq!(
            h,
            ChunkHeader { flags: reply::FLAG_DONE, typ: reply::TYPE_BLOCK_STATUS, cookie: 5, length: 20 }
        );
        assert_eq!(&out[20..], &[0, 0, 0, 1, 0, 0, 0x10, 0, 0, 0, 0, 3, 0, 0, 2, 0, 0, 0, 0, 0]);
        assert_eq!(encode_rep_meta_context(1, "base:allocation")[..5], [0, 0, 0, 1, b'b']);
    }

    #[test]
    fn option_reply_layout() {
        let mut out = Vec::new();
        encode_option_reply(&mut out, opt::INFO, rep::INFO, &encode_info_export(1 << 20, 0x0143));
        assert_eq!(&out[..8], &[0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9]);
        assert_eq!(&out[8..12], &[0, 0, 0, 6]);
        assert_eq!(&out[12..16], &[0, 0, 0, 3]);
        assert_eq!(&out[16..20], &[0, 0, 0, 12]);
        assert_eq!(&out[20..22], &[0, 0]);
        assert_eq!(&out[22..30], &[0, 0, 0, 0, 0, 0x10, 0, 0]);
        assert_eq!(&out[30..32], &[0x01, 0x43]);
    }

    #[test]
    fn block_size_info_layout() {
        let b = encode_info_block_size(512, 4096, 32 << 20);
        assert_eq!(b, [0, 3, 0, 0, 2, 0, 0, 0, 0x10, 0, 0x02, 0, 0, 0]);
    }

    #[test]
    fn export_name_reply_honours_no_zeroes() {
        assert_eq!(encode_export_name_reply(4096, 1, false).len(), 8 + 2 + 124);
        let b = encode_export_name_reply(4096, 1, true);
        assert_eq!(b, [0, 0, 0, 0, 0, 0, 0x10, 0, 0, 1]);
    }

    #[test]
    fn rep_server_layout() {
        assert_eq!(encode_rep_server("ab", "d"), [0, 0, 0, 2, b'a', b'b', b'd']);
    }

    #[test]
    fn simple_reply_layout() {
        let b = encode_simple_reply(0x1122_3344_5566_7788, errno::EIO);
        assert_eq!(b, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
    }

    #[test]
    fn structured_chunks_layout() {
        let b = encode_offset_data_header(7, 4096, 512);
        let h = ChunkHeader::decode(b[..20].try_into().unwrap()).unwrap();
        assert_eq!(
            h,
            ChunkHeader { flags: reply::FLAG_DONE, typ: reply::TYPE_OFFSET_DATA, cookie: 7, length: 520 }
        );
        assert_eq!(&b[20..], &4096u64.to_be_bytes());

        let n = encode_none_chunk(9);
        assert_eq!(&n[..8], &[0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 0]);
        assert_eq!(&n[16..], &[0, 0, 0, 0]);

        let mut e = Vec::new();
        encode_error_chunk(&mut e, 3, errno::EIO, "bad");
        let h = ChunkHeader::decode(e[..20].try_into().unwrap()).unwrap();
        assert_eq!(h.typ, 0x8001);
        assert_eq!(h.length, 9);
        assert_eq!(&e[20..], &[0, 0, 0, 5, 0, 3, b'b', b'a', b'd']);
    }

    #[test]
    fn error_message_is_cut_at_a_char_boundary() {
        let long = "é".repeat(MAX_ERROR_MESSAGE); // 2 bytes per char
        let mut e = Vec::new();
        encode_error_chunk(&mut e, 1, errno::EIO, &long);
        let msg_len = usize::from(u16::from_be_bytes([e[24], e[25]]));
        assert!(msg_len <= MAX_ERROR_MESSAGE);
        assert!(std::str::from_utf8(&e[26..]).is_ok());
        assert_eq!(e.len(), 26 + msg_len);
    }

    #[test]
    fn host_errnos_map_to_the_eight_nbd_errors() {
        assert_eq!(nbd_errno(libc::EPERM), errno::EPERM);
        assert_eq!(nbd_errno(libc::EROFS), errno::EPERM);
        assert_eq!(nbd_errno(libc::EIO), errno::EIO);
        assert_eq!(nbd_errno(libc::EILSEQ), errno::EIO);
        assert_eq!(nbd_errno(libc::EINVAL), errno::EINVAL);
        assert_eq!(nbd_errno(libc::ENOSPC), errno::ENOSPC);
        assert_eq!(nbd_errno(libc::EDQUOT), errno::ENOSPC);
        assert_eq!(nbd_errno(libc::EOVERFLOW), errno::EOVERFLOW);
        assert_eq!(nbd_errno(libc::EOPNOTSUPP), errno::ENOTSUP);
        assert_eq!(nbd_errno(libc::ENOMEM), errno::ENOMEM);
        assert_eq!(nbd_errno(libc::ESHUTDOWN), errno::ESHUTDOWN);
        assert_eq!(nbd_errno(libc::EBADF), errno::EIO);
    }

    #[test]
    fn block_error_kinds_map_as_the_architecture_says() {
        use blockdev::BlockErrorKind as K;
        assert_eq!(nbd_errno(K::IntegrityMismatch { sector: 3 }.errno()), errno::EIO);
        assert_eq!(nbd_errno(K::ReadOnly.errno()), errno::EPERM);
        assert_eq!(nbd_errno(K::OutOfRange.errno()), errno::EINVAL);
        assert_eq!(nbd_errno(K::NoSpace.errno()), errno::ENOSPC);
        assert_eq!(nbd_errno(K::Poisoned.errno()), errno::EIO);
    }
}

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn request_round_trips(flags: u16, typ: u16, cookie: u64, offset: u64, length: u32) {
            let r = Request { flags, typ, cookie, offset, length };
            prop_assert_eq!(Request::decode(&r.encode()), Ok(r));
        }

        #[test]
        fn option_header_round_trips(option: u32, length: u32) {
            let h = OptionHeader { option, length };
            prop_assert_eq!(OptionHeader::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn info_request_round_trips(name in proptest::collection::vec(any::<u8>(), 0..64),
                                    requests in proptest::collection::vec(any::<u16>(), 0..16)) {
            let r = InfoRequest { name: &name, requests };
            let bytes = r.encode();
            prop_assert_eq!(InfoRequest::decode(&bytes), Ok(r));
        }

        /// Whatever the bytes, decoding returns; and whatever it accepts re-encodes to them.
        #[test]
        fn info_request_decode_is_total_and_exact(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(r) = InfoRequest::decode(&data) {
                prop_assert_eq!(r.encode(), data);
            }
        }

        /// Whatever the bytes, decoding returns; and whatever it accepts re-encodes to them.
        #[test]
        fn meta_context_request_decode_is_total_and_exact(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(r) = MetaContextRequest::decode(&data) {
                prop_assert_eq!(r.encode(), data);
            }
        }

        #[test]
        fn chunk_header_round_trips(flags: u16, typ: u16, cookie: u64, length: u32) {
            let h = ChunkHeader { flags, typ, cookie, length };
            prop_assert_eq!(ChunkHeader::decode(&h.encode()), Some(h));
        }
    }
}
