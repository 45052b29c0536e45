//! Fixed-newstyle negotiation: greeting, client flags, then options until the client
//! selects an export (`NBD_OPT_GO` / `NBD_OPT_EXPORT_NAME`) or gives up.

use std::io::{self, BufReader, Read, Write};

use log::{debug, warn};

use crate::server::{ExportParams, Shared, READ_BUFFER};
use crate::stream::Stream;
use crate::tls::{self, Pump};
use crate::wire::{self, handshake_flag, info, opt, rep, InfoRequest, MetaContextRequest, OptionHeader};

/// The outcome of a successful negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Session {
    /// Index into `Shared::exports`.
    pub(crate) export: usize,
    /// `NBD_OPT_STRUCTURED_REPLY` was acknowledged.
    pub(crate) structured: bool,
    /// `base:allocation` was selected for this export: `NBD_CMD_BLOCK_STATUS` is allowed and
    /// answers with [`BASE_ALLOCATION_ID`].
    pub(crate) base_allocation: bool,
    /// The connection runs over TLS (its requests come through the pump's socket pair).
    pub(crate) tls: bool,
}

/// The context id of `base:allocation` in `NBD_REP_META_CONTEXT` and block status replies.
pub(crate) const BASE_ALLOCATION_ID: u32 = 1;

/// Option data the server reads and parses; names are at most 4 KiB by the spec, so this
/// leaves ample room.
const MAX_OPTION_DATA: u32 = 64 * 1024;
/// Larger option data than `MAX_OPTION_DATA` is read and dropped (answered with
/// `NBD_REP_ERR_TOO_BIG`) up to this size; beyond it the client is disconnected.
const MAX_OPTION_SKIP: u32 = 16 << 20;

/// Runs the negotiation. `Ok(None)`: the client aborted, or broke the protocol and was
/// dropped (logged here); `Err`: the socket failed. After `NBD_OPT_STARTTLS`, `r` and `w`
/// are replaced by the plain end of the TLS pump, which is left in `tls`.
pub(crate) fn negotiate(
    r: &mut BufReader<Stream>,
    w: &mut Stream,
    shared: &Shared,
    peer: &str,
    tls: &mut Option<Pump>,
) -> io::Result<Option<Session>> {
    w.write_all(&wire::encode_greeting(handshake_flag::FIXED_NEWSTYLE | handshake_flag::NO_ZEROES))?;
    let mut b4 = [0u8; 4];
    r.read_exact(&mut b4)?;
    let client_flags = u32::from_be_bytes(b4);
    let known = u32::from(handshake_flag::FIXED_NEWSTYLE | handshake_flag::NO_ZEROES);
    if client_flags & !known != 0 {
        warn!("{peer}: unknown client flags {client_flags:#x}, disconnecting");
        return Ok(None);
    }
    if client_flags & u32::from(handshake_flag::FIXED_NEWSTYLE) == 0 {
        warn!("{peer}: client does not speak fixed newstyle, disconnecting");
        return Ok(None);
    }
    let no_zeroes = client_flags & u32::from(handshake_flag::NO_ZEROES) != 0;

    let mut structured = false;
    // The export for which the last NBD_OPT_SET_META_CONTEXT selected base:allocation.
    let mut meta: Option<usize> = None;
    let mut data = Vec::new();
    let mut out = Vec::new();
    loop {
        let mut hb = [0u8; OptionHeader::SIZE];
        r.read_exact(&mut hb)?;
        let hdr = match OptionHeader::decode(&hb) {
            Ok(h) => h,
            Err(e) => {
                warn!("{peer}: {e}, disconnecting");
                return Ok(None);
            }
        };
        out.clear();
        if hdr.length > MAX_OPTION_DATA {
            if hdr.length > MAX_OPTION_SKIP {
                warn!("{peer}: option {} with {} bytes of data, disconnecting", hdr.option, hdr.length);
                return Ok(None);
            }
            io::copy(&mut r.by_ref().take(u64::from(hdr.length)), &mut io::sink())?;
            error_reply(&mut out, hdr.option, rep::ERR_TOO_BIG, "option data too large");
            w.write_all(&out)?;
            continue;
        }
        data.resize(hdr.length as usize, 0);
        r.read_exact(&mut data)?;
        debug!("{peer}: option {} ({} bytes)", hdr.option, data.len());

        // --tls=require: nothing but STARTTLS and ABORT before TLS.
        if shared.tls.as_ref().is_some_and(|t| t.is_required())
            && tls.is_none()
            && hdr.option != opt::STARTTLS
            && hdr.option != opt::ABORT
        {
            if hdr.option == opt::EXPORT_NAME {
                warn!("{peer}: NBD_OPT_EXPORT_NAME without TLS, which is required; disconnecting");
                return Ok(None);
            }
            error_reply(&mut out, hdr.option, rep::ERR_TLS_REQD, "TLS is required");
            w.write_all(&out)?;
            continue;
        }

        match hdr.option {
            opt::EXPORT_NAME => {
                // No error reply exists for this option: an unknown name ends the connection.
                let Some(i) = shared.find_export(&data) else {
                    warn!("{peer}: unknown export {:?}, disconnecting", String::from_utf8_lossy(&data));
                    return Ok(None);
                };
                let p = ExportParams::new(&shared.exports[i], &shared.config);
                w.write_all(&wire::encode_export_name_reply(p.size, p.tflags(structured), no_zeroes))?;
                return Ok(Some(Session {
                    export: i,
                    structured,
                    base_allocation: meta == Some(i),
                    tls: tls.is_some(),
                }));
            }
            opt::ABORT => {
                wire::encode_option_reply(&mut out, hdr.option, rep::ACK, &[]);
                // The client may already have gone; its ACK is a courtesy.
                let _ = w.write_all(&out);
                return Ok(None);
            }
            opt::LIST => {
                if !data.is_empty() {
                    error_reply(&mut out, hdr.option, rep::ERR_INVALID, "NBD_OPT_LIST takes no data");
                } else {
                    for e in &shared.exports {
                        let d = wire::encode_rep_server(&e.name, &e.description);
                        wire::encode_option_reply(&mut out, hdr.option, rep::SERVER, &d);
                    }
                    wire::encode_option_reply(&mut out, hdr.option, rep::ACK, &[]);
                }
            }
            opt::STRUCTURED_REPLY => {
                if !data.is_empty() {
                    error_reply(
                        &mut out,
                        hdr.option,
                        rep::ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                } else {
                    structured = true;
                    wire::encode_option_reply(&mut out, hdr.option, rep::ACK, &[]);
                }
            }
            opt::INFO | opt::GO => match InfoRequest::decode(&data) {
                Err(e) => {
                    debug!("{peer}: bad NBD_OPT_INFO/GO data: {e}");
                    error_reply(&mut out, hdr.option, rep::ERR_INVALID, "malformed option data");
                }
                Ok(req) => match shared.find_export(req.name) {
                    None => error_reply(&mut out, hdr.option, rep::ERR_UNKNOWN, "no such export"),
                    Some(i) => {
                        info_replies(&mut out, hdr.option, shared, i, &req.requests, structured);
                        if hdr.option == opt::GO {
                            w.write_all(&out)?;
                            let base_allocation = meta == Some(i);
                            return Ok(Some(Session {
                                export: i,
                                structured,
                                base_allocation,
                                tls: tls.is_some(),
                            }));
                        }
                    }
                },
            },
            opt::STARTTLS => match &shared.tls {
                None => error_reply(&mut out, hdr.option, rep::ERR_UNSUP, "TLS is not enabled"),
                Some(_) if tls.is_some() => {
                    error_reply(&mut out, hdr.option, rep::ERR_INVALID, "TLS is already on")
                }
                Some(_) if !data.is_empty() => {
                    error_reply(&mut out, hdr.option, rep::ERR_INVALID, "NBD_OPT_STARTTLS takes no data")
                }
                Some(cfg) => {
                    if !r.buffer().is_empty() {
                        // The client must wait for the ACK before its ClientHello.
                        warn!("{peer}: data sent ahead of the STARTTLS reply, disconnecting");
                        return Ok(None);
                    }
                    wire::encode_option_reply(&mut out, hdr.option, rep::ACK, &[]);
                    w.write_all(&out)?;
                    let (pump, plain) =
                        match tls::start(cfg, r.get_ref(), peer, shared.config.unix_send_buffer) {
                            Ok(p) => p,
                            Err(e) => {
                                warn!("{peer}: {e}, disconnecting");
                                return Ok(None);
                            }
                        };
                    *tls = Some(pump);
                    *w = Stream::Unix(plain.try_clone()?);
                    *r = BufReader::with_capacity(READ_BUFFER, Stream::Unix(plain));
                    // The spec: options negotiated before TLS are forgotten.
                    structured = false;
                    meta = None;
                    continue;
                }
            },
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                let set = hdr.option == opt::SET_META_CONTEXT;
                if set {
                    // A SET replaces the selection even when it fails.
                    meta = None;
                }
                match meta_contexts(&data, shared, structured, set) {
                    Err((reply_type, message)) => error_reply(&mut out, hdr.option, reply_type, message),
                    Ok((export, base_allocation)) => {
                        if base_allocation {
                            // Ids in LIST replies are reserved (zero).
                            let id = if set { BASE_ALLOCATION_ID } else { 0 };
                            let d = wire::encode_rep_meta_context(id, wire::BASE_ALLOCATION);
                            wire::encode_option_reply(&mut out, hdr.option, rep::META_CONTEXT, &d);
                            if set {
                                meta = Some(export);
                            }
                        }
                        wire::encode_option_reply(&mut out, hdr.option, rep::ACK, &[]);
                    }
                }
            }
            // Extended headers and anything newer.
            _ => error_reply(&mut out, hdr.option, rep::ERR_UNSUP, "option not supported"),
        }
        w.write_all(&out)?;
    }
}

/// Answers `NBD_OPT_LIST_META_CONTEXT` (`set` false) or `NBD_OPT_SET_META_CONTEXT`: the
/// export the data names and whether `base:allocation` is listed/selected, or the error
/// reply. The spec's rules: both need structured replies first; LIST without queries lists
/// everything, and `base:` is a wildcard for LIST but selects nothing in SET; queries of other
/// namespaces, and unknown leaves of `base:`, are ignored; a query without a colon is invalid.
fn meta_contexts(
    data: &[u8],
    shared: &Shared,
    structured: bool,
    set: bool,
) -> Result<(usize, bool), (u32, &'static str)> {
    if !structured {
        return Err((rep::ERR_INVALID, "metadata contexts need structured replies first"));
    }
    let req = MetaContextRequest::decode(data).map_err(|_| (rep::ERR_INVALID, "malformed option data"))?;
    let export = shared.find_export(req.name).ok_or((rep::ERR_UNKNOWN, "no such export"))?;
    let mut base_allocation = !set && req.queries.is_empty();
    for q in &req.queries {
        if !q.contains(&b':') {
            return Err((rep::ERR_INVALID, "a metadata context query must be namespace:leaf"));
        }
        base_allocation |= *q == wire::BASE_ALLOCATION.as_bytes() || (!set && *q == b"base:");
    }
    Ok((export, base_allocation))
}

fn error_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, message: &str) {
    wire::encode_option_reply(out, option, reply_type, message.as_bytes());
}

/// The `NBD_REP_INFO` replies for export `i` and the final ACK. `NBD_INFO_EXPORT` and
/// `NBD_INFO_BLOCK_SIZE` are always sent: the device's alignment is enforced whether or not
/// the client asked for it.
fn info_replies(
    out: &mut Vec<u8>,
    option: u32,
    shared: &Shared,
    i: usize,
    requests: &[u16],
    structured: bool,
) {
    let export = &shared.exports[i];
    let p = ExportParams::new(export, &shared.config);
    wire::encode_option_reply(
        out,
        option,
        rep::INFO,
        &wire::encode_info_export(p.size, p.tflags(structured)),
    );
    if requests.contains(&info::NAME) {
        wire::encode_option_reply(
            out,
            option,
            rep::INFO,
            &wire::encode_info_string(info::NAME, &export.name),
        );
    }
    if requests.contains(&info::DESCRIPTION) && !export.description.is_empty() {
        let d = wire::encode_info_string(info::DESCRIPTION, &export.description);
        wire::encode_option_reply(out, option, rep::INFO, &d);
    }
    let bs = wire::encode_info_block_size(p.min_block, p.preferred_block, p.max_request);
    wire::encode_option_reply(out, option, rep::INFO, &bs);
    wire::encode_option_reply(out, option, rep::ACK, &[]);
}
