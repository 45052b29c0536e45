//! `luksDump` text, byte for byte as cryptsetup 2.6–2.8 prints it (`LUKS_dump` in
//! `src/cryptsetup.c` for LUKS1; `LUKS2_hdr_dump` and the keyslot/digest/token dump
//! callbacks in `lib/luks2/` for LUKS2), so scripts that parse it keep working.

use std::fmt::Write as _;

use formats::luks1::{KeyslotState, Luks1Header};
use formats::luks2::{self, Luks2Header};
use sector_crypto::VolumeKey;

use super::{Luks, LuksHeader};

/// cryptsetup `crypt_log_hex`: bytes as `"%02x"` each followed by `sep`, a line break
/// (`brk`) after every `per_line` bytes when more follow.
fn hex_lines(out: &mut String, bytes: &[u8], per_line: usize, brk: &str) {
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 && i % per_line == 0 {
            out.push_str(brk);
        }
        let _ = write!(out, "{b:02x} ");
    }
}

/// The dump of `luks`; `device` is the name shown in the LUKS1 title line.
pub fn dump(luks: &Luks, device: &str) -> String {
    match &luks.header {
        LuksHeader::V1(h) => dump1(h, device),
        LuksHeader::V2(s) => dump2(&s.header),
    }
}

fn dump1(h: &Luks1Header, device: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "LUKS header information for {device}\n");
    let _ = writeln!(o, "Version:       \t1");
    let _ = writeln!(o, "Cipher name:   \t{}", h.cipher_name);
    let _ = writeln!(o, "Cipher mode:   \t{}", h.cipher_mode);
    let _ = writeln!(o, "Hash spec:     \t{}", h.hash_spec);
    let _ = writeln!(o, "Payload offset:\t{}", h.payload_offset);
    let _ = writeln!(o, "MK bits:       \t{}", h.key_bytes * 8);
    o.push_str("MK digest:     \t");
    hex_lines(&mut o, &h.mk_digest, 20, "");
    o.push('\n');
    o.push_str("MK salt:       \t");
    hex_lines(&mut o, &h.mk_digest_salt, 16, "\n               \t");
    o.push('\n');
    let _ = writeln!(o, "MK iterations: \t{}", h.mk_digest_iterations);
    let _ = writeln!(o, "UUID:          \t{}\n", h.uuid);
    for (i, ks) in h.keyslots.iter().enumerate() {
        if ks.state == KeyslotState::Enabled {
            let _ = writeln!(o, "Key Slot {i}: ENABLED");
            let _ = writeln!(o, "\tIterations:         \t{}", ks.iterations);
            o.push_str("\tSalt:               \t");
            hex_lines(&mut o, &ks.salt, 16, "\n\t                      \t");
            o.push('\n');
            let _ = writeln!(o, "\tKey material offset:\t{}", ks.key_material_offset);
            let _ = writeln!(o, "\tAF stripes:            \t{}", ks.stripes);
        } else {
            let _ = writeln!(o, "Key Slot {i}: DISABLED");
        }
    }
    o
}

fn dump2(h: &Luks2Header) -> String {
    let m = &h.metadata;
    let mut o = String::new();
    o.push_str("LUKS header information\n");
    let _ = writeln!(o, "Version:       \t2");
    let _ = writeln!(o, "Epoch:         \t{}", h.seqid);
    let _ = writeln!(o, "Metadata area: \t{} [bytes]", m.metadata_size());
    let _ = writeln!(o, "Keyslots area: \t{} [bytes]", m.config.keyslots_size);
    let or = |s: &str, none: &'static str| if s.is_empty() { none.to_owned() } else { s.to_owned() };
    let _ = writeln!(o, "UUID:          \t{}", or(&h.uuid, "(no UUID)"));
    let _ = writeln!(o, "Label:         \t{}", or(&h.label, "(no label)"));
    let _ = writeln!(o, "Subsystem:     \t{}", or(&h.subsystem, "(no subsystem)"));
    // Config.
    o.push_str("Flags:       \t");
    let flags = m.config.flags.clone().unwrap_or_default();
    for f in &flags {
        let _ = write!(o, "{f} ");
    }
    let reqs: Vec<String> =
        m.config.requirements.iter().flat_map(|r| r.mandatory.iter().flatten().cloned()).collect();
    o.push_str(if flags.is_empty() { "(no flags)" } else { "" });
    o.push('\n');
    if reqs.is_empty() {
        o.push('\n');
    } else {
        o.push_str("Requirements:\t");
        for r in &reqs {
            let _ = write!(o, "{r} ");
        }
        o.push_str("\n\n");
    }
    // Segments.
    o.push_str("Data segments:\n");
    for (id, s) in &m.segments {
        let _ = writeln!(o, "  {id}: {}", s.type_name);
        let _ = writeln!(o, "\toffset: {} [bytes]", s.offset);
        match s.size {
            luks2::SegmentSize::Dynamic => o.push_str("\tlength: (whole device)\n"),
            luks2::SegmentSize::Bytes(b) => {
                let _ = writeln!(o, "\tlength: {b} [bytes]");
            }
        }
        // cryptsetup 2.6 prints no cipher line for a segment without encryption (linear).
        if let Some(c) = &s.crypt {
            let _ = writeln!(o, "\tcipher: {}", c.encryption);
            let _ = writeln!(o, "\tsector: {} [bytes]", c.sector_size);
            if let Some(i) = &c.integrity {
                let _ = writeln!(o, "\tintegrity: {}", i.type_name);
                if let Some(k) = i.key_size {
                    let _ = writeln!(o, "\tintegrity key size: {} [bits]", k * 8);
                }
            }
        }
        if let Some(f) = s.flags.as_ref().filter(|f| !f.is_empty()) {
            let _ = writeln!(o, "\tflags : {}", f.join(", "));
        }
        o.push('\n');
    }
    // Keyslots.
    o.push_str("Keyslots:\n");
    // cryptsetup `LUKS2_keyslot_for_segment(.., CRYPT_ONE_SEGMENT)`: a keyslot whose digest
    // is the digest of no regular segment is unbound (during reencryption, the new key's).
    let regular_digests: Vec<u32> =
        m.segments.iter().filter(|(_, s)| !s.is_backup()).filter_map(|(&i, _)| m.segment_digest(i)).collect();
    for (id, k) in &m.keyslots {
        let unbound = m.keyslot_digest(*id).is_some_and(|d| !regular_digests.contains(&d));
        let _ = writeln!(o, "  {id}: {}{}", k.type_name, if unbound { " (unbound)" } else { "" });
        let _ = writeln!(o, "\tKey:        {} bits", k.key_size * 8);
        let prio = match k.priority.unwrap_or(1) {
            0 => "ignored",
            1 => "normal",
            2 => "preferred",
            _ => "invalid",
        };
        let _ = writeln!(o, "\tPriority:   {prio}");
        if k.is_luks2() {
            if let Some(e) = &k.area.encryption {
                let _ = writeln!(o, "\tCipher:     {e}");
            }
            if let Some(ks) = k.area.key_size {
                let _ = writeln!(o, "\tCipher key: {} bits", ks * 8);
            }
            if let Some(kdf) = &k.kdf {
                let other_salt: Option<Vec<u8>>;
                let _ = writeln!(o, "\tPBKDF:      {}", kdf.type_name());
                let salt = match kdf {
                    luks2::Kdf::Pbkdf2 { hash, iterations, salt } => {
                        let _ = writeln!(o, "\tHash:       {hash}");
                        let _ = writeln!(o, "\tIterations: {iterations}");
                        Some(salt)
                    }
                    luks2::Kdf::Argon2 { time, memory, cpus, salt, .. } => {
                        let _ = writeln!(o, "\tTime cost:  {time}");
                        let _ = writeln!(o, "\tMemory:     {memory}");
                        let _ = writeln!(o, "\tThreads:    {cpus}");
                        Some(salt)
                    }
                    // cryptsetup prints every non-pbkdf2 KDF as Argon2 (the legacy
                    // `argon2` name included): whatever time/memory/cpus/salt it has.
                    luks2::Kdf::Other(obj) => {
                        let num = |k: &str| obj.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                        let _ = writeln!(o, "\tTime cost:  {}", num("time"));
                        let _ = writeln!(o, "\tMemory:     {}", num("memory"));
                        let _ = writeln!(o, "\tThreads:    {}", num("cpus"));
                        other_salt = obj.get("salt").and_then(serde_json::Value::as_str).and_then(|b| {
                            use base64::Engine as _;
                            base64::engine::general_purpose::STANDARD.decode(b).ok()
                        });
                        other_salt.as_ref()
                    }
                };
                if let Some(salt) = salt {
                    o.push_str("\tSalt:       ");
                    hex_lines(&mut o, salt, 16, "\n\t            ");
                    o.push('\n');
                }
            }
            if let Some(af) = &k.af {
                let _ = writeln!(o, "\tAF stripes: {}", af.stripes);
                let _ = writeln!(o, "\tAF hash:    {}", af.hash);
            }
            let _ = writeln!(o, "\tArea offset:{} [bytes]", k.area.offset);
            let _ = writeln!(o, "\tArea length:{} [bytes]", k.area.size);
        } else if k.type_name == luks2::KEYSLOT_REENCRYPT {
            // cryptsetup `reenc_keyslot_dump`.
            let get = |o: &serde_json::Map<String, serde_json::Value>, f: &str| {
                o.get(f).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).unwrap_or_default()
            };
            let _ = writeln!(o, "\tMode:       {}", get(&k.extra, "mode"));
            let _ = writeln!(o, "\tDirection:  {}", get(&k.extra, "direction"));
            let _ = writeln!(o, "\tResilience: {}", k.area.type_name);
            if k.area.type_name == "checksum" {
                let _ = writeln!(o, "\tHash:       {}", get(&k.area.extra, "hash"));
                let _ = writeln!(o, "\tHash data:  {} [bytes]", get(&k.area.extra, "sector_size"));
            } else if k.area.type_name == "datashift" {
                let _ = writeln!(o, "\tShift size: {}[bytes]", get(&k.area.extra, "shift_size"));
            }
            let _ = writeln!(o, "\tArea offset:{} [bytes]", k.area.offset);
            let _ = writeln!(o, "\tArea length:{} [bytes]", k.area.size);
        }
        for (did, d) in &m.digests {
            if d.keyslots.contains(id) {
                let _ = writeln!(o, "\tDigest ID:  {did}");
            }
        }
    }
    // Tokens.
    o.push_str("Tokens:\n");
    for (id, t) in &m.tokens {
        let _ = writeln!(o, "  {id}: {}", t.type_name);
        if t.type_name == "luks2-keyring" {
            if let Some(d) = t.extra.get("key_description").and_then(|v| v.as_str()) {
                let _ = writeln!(o, "\tKey description: {d}");
            }
        }
        for k in &t.keyslots {
            let _ = writeln!(o, "\tKeyslot:    {k}");
        }
    }
    // Digests.
    o.push_str("Digests:\n");
    for (id, d) in &m.digests {
        let _ = writeln!(o, "  {id}: {}", d.type_name);
        if let Some(p) = &d.pbkdf2 {
            let _ = writeln!(o, "\tHash:       {}", p.hash);
            let _ = writeln!(o, "\tIterations: {}", p.iterations);
            o.push_str("\tSalt:       ");
            hex_lines(&mut o, &p.salt, 16, "\n\t            ");
            o.push('\n');
            o.push_str("\tDigest:     ");
            hex_lines(&mut o, &p.digest, 16, "\n\t            ");
            o.push('\n');
        }
    }
    o
}

/// `luksDump --dump-volume-key` (cryptsetup `luksDump_with_volume_key`). With
/// `key_file`, the key went to that file and is not printed. The text is built in one
/// allocation sized up front (never reallocated, so no stray copy of the key is freed
/// unwiped); the caller should wipe it (`Zeroizing`) after printing.
pub fn dump_volume_key(luks: &Luks, device: &str, vk: &VolumeKey, key_file: Option<&str>) -> String {
    let seg = luks.segment().ok();
    let cipher_len = seg.as_ref().map_or(0, |s| s.cipher.len());
    let mut o = String::with_capacity(
        512 + device.len() + luks.uuid().len() + cipher_len + key_file.map_or(0, str::len) + vk.len() * 4,
    );
    let (name, mode) = match seg.as_ref().map(|s| s.cipher.clone()) {
        Some(c) => match c.split_once('-') {
            Some((a, b)) => (a.to_owned(), b.to_owned()),
            None => (c, String::new()),
        },
        None => (String::new(), String::new()),
    };
    let _ = writeln!(o, "LUKS header information for {device}");
    let _ = writeln!(o, "Cipher name:   \t{name}");
    let _ = writeln!(o, "Cipher mode:   \t{mode}");
    let _ = writeln!(o, "Payload offset:\t{}", seg.map_or(0, |s| s.offset / 512));
    let _ = writeln!(o, "UUID:          \t{}", luks.uuid());
    let _ = writeln!(o, "MK bits:       \t{}", vk.len() * 8);
    if let Some(f) = key_file {
        let _ = writeln!(o, "Key stored to file {f}.");
        return o;
    }
    o.push_str("MK dump:\t");
    hex_lines(&mut o, vk.as_bytes(), 16, "\n\t\t");
    o.push('\n');
    o
}

/// `luksDump --dump-json-metadata`: the LUKS2 JSON in json-c's pretty layout, without a
/// final newline, as cryptsetup prints it. `None` for LUKS1.
///
/// cryptsetup prints the JSON as parsed from disk, members in their on-disk order (json-c
/// keeps insertion order: a header cryptsetup changed may list token 4 before token 2).
/// So the JSON area of the copy that was loaded (the one whose seqid is the header's) is
/// read again from `meta` and printed in its own order; if neither copy can be read back
/// as it was loaded, the decoded metadata is printed in cryptsetup's canonical order.
pub fn dump_json_metadata(luks: &Luks, meta: &dyn blockdev::BlockDevice) -> Option<String> {
    let LuksHeader::V2(s) = &luks.header else { return None };
    let h = &s.header;
    let raw = [0, h.hdr_size].into_iter().find_map(|off| {
        let bin = super::io::read_bytes(meta, off, 24, "LUKS2 header").ok()?;
        let hdr_size = u64::from_be_bytes(bin[8..16].try_into().ok()?);
        let seqid = u64::from_be_bytes(bin[16..24].try_into().ok()?);
        if hdr_size != h.hdr_size || seqid != h.seqid {
            return None;
        }
        let len = usize::try_from(hdr_size.checked_sub(formats::luks2::BINARY_HEADER_SIZE)?).ok()?;
        let area =
            super::io::read_bytes(meta, off + formats::luks2::BINARY_HEADER_SIZE, len, "LUKS2 JSON area")
                .ok()?;
        let end = area.iter().position(|&b| b == 0)?;
        let v: serde_json::Value = serde_json::from_slice(&area[..end]).ok()?;
        // Only what decodes to the loaded metadata (a concurrent rewrite would not).
        (formats::luks2::Luks2Metadata::from_value(v.clone(), len as u64).ok()? == h.metadata).then_some(v)
    });
    Some(match raw {
        Some(v) => formats::luks2::json_c_pretty(&v),
        None => h.metadata.to_json_pretty(),
    })
}

/// `luksDump --unbound --key-slot N` (cryptsetup `luksDump_with_unbound_key`): the unbound
/// key of keyslot `slot`. Built in one allocation sized up front; wipe it after printing.
pub fn dump_unbound_key(luks: &Luks, device: &str, slot: u32, key: &VolumeKey) -> String {
    let mut o = String::with_capacity(256 + device.len() + luks.uuid().len() + key.len() * 4);
    let _ = writeln!(o, "LUKS header information for {device}");
    let _ = writeln!(o, "UUID:    \t{}", luks.uuid());
    let _ = writeln!(o, "Keyslot: \t{slot}");
    let _ = writeln!(o, "Key bits:\t{}", key.len() * 8);
    o.push_str("Unbound Key:\t");
    hex_lines(&mut o, key.as_bytes(), 16, "\n\t\t");
    o.push('\n');
    o
}
