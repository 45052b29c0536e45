//! dm-crypt table lines, as `dmsetup table` prints them and the kernel parses them.
//!
//! ```text
//! <start> <len> crypt <cipher> <key> <iv_offset> <device> <offset> [<#opt> <opt>...]
//! ```
//!
//! * `start`, `len`, `iv_offset` and `offset` count 512-byte sectors.
//! * `key` is hex, or `-` for no key (`cipher_null`). Kernel keyring references
//!   (`:<size>:<type>:<desc>`) cannot exist in userspace and are refused.
//! * Optional parameters (kernel `crypt_ctr_optional`, at most 9): `allow_discards`,
//!   `same_cpu_crypt`, `submit_from_crypt_cpus`, `no_read_workqueue`, `no_write_workqueue`,
//!   `high_priority`, `sector_size:<bytes>`, `iv_large_sectors`, `integrity:<bytes>:<type>`,
//!   `integrity_key_size:<bytes>`. The integrity ones need a dm-integrity device below, which
//!   a crypt line cannot describe: they are refused here (LUKS2 authenticated encryption is
//!   assembled from the header instead, and prints `integrity:<n>:aead` in its table).
//!
//! The kernel's checks are reproduced: `iv_offset` and `len` must be multiples of
//! `sector_size / 512`; `sector_size` is a power of two in 512..=4096; the parameter count
//! must match; an unknown parameter is an error. Reference: drivers/md/dm-crypt.c
//! (`crypt_ctr`, `crypt_ctr_optional`) and Documentation/admin-guide/device-mapper/dm-crypt.rst.

use std::fmt;

use zeroize::Zeroizing;

use crate::limits;

/// Why a table line was refused. One variant per distinct malformation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableError {
    /// Fewer than the 8 mandatory fields.
    #[error("table line has {0} fields; a crypt line needs at least 8: <start> <len> crypt <cipher> <key> <iv_offset> <device> <offset>")]
    TooFewFields(usize),
    /// More than one line (multi-target tables).
    #[error("only single-target tables are supported (got {0} lines)")]
    MultipleTargets(usize),
    /// Target type other than `crypt`.
    #[error("target type {0:?} is not supported here (expected \"crypt\")")]
    WrongTarget(String),
    /// A number field did not parse.
    #[error("invalid {field}: {value:?} is not a number of 512-byte sectors")]
    BadNumber {
        /// Field name.
        field: &'static str,
        /// What was given.
        value: String,
    },
    /// `start` is not zero.
    #[error("target start must be 0 (got {0}); sealdisk serves one target per export")]
    NonZeroStart(u64),
    /// `len` is zero.
    #[error("target length must be positive")]
    ZeroLength,
    /// Key is not valid hex (odd length or non-hex digit). The key itself is never shown.
    #[error("the key is not a valid hex string ({0} characters)")]
    BadKey(usize),
    /// Kernel keyring key reference.
    #[error("kernel keyring keys (\":size:type:description\") are not available in userspace; give the key in hex")]
    KeyringKey,
    /// The optional parameter count is not a number or does not match.
    #[error("optional parameter count {count:?} does not match the {given} parameters given")]
    BadOptCount {
        /// The count field.
        count: String,
        /// Parameters actually present.
        given: usize,
    },
    /// More than the kernel's 9 optional parameters.
    #[error("too many optional parameters ({0}; the kernel accepts at most 9)")]
    TooManyOpts(usize),
    /// A key longer than [`limits::MAX_KEY_BYTES`]. The key itself is never shown.
    #[error("the key is {0} hex digits long; keys are at most {max} bytes", max = limits::MAX_KEY_BYTES)]
    KeyTooLong(usize),
    /// A sector count (or `offset + len`) whose byte value does not fit 64 bits
    /// ([`limits::DM_MAX_SECTORS`]).
    #[error("{field} {value} is too large: {field} × 512 bytes must fit 64 bits")]
    TooLarge {
        /// Field name.
        field: &'static str,
        /// The value.
        value: u64,
    },
    /// An unknown optional parameter.
    #[error("unknown optional parameter {0:?}")]
    UnknownOpt(String),
    /// A known optional parameter that this implementation cannot honour.
    #[error("optional parameter {0:?} is not supported yet: {1}")]
    UnsupportedOpt(String, &'static str),
    /// Bad `sector_size:` value.
    #[error("invalid sector_size {0:?}: must be a power of two from 512 to 4096")]
    BadSectorSize(String),
    /// `iv_offset` not a multiple of the sector size.
    #[error("iv_offset {iv_offset} is not a multiple of the sector size ({sector_size} bytes)")]
    MisalignedIvOffset {
        /// Given iv_offset.
        iv_offset: u64,
        /// Sector size in bytes.
        sector_size: u32,
    },
    /// `offset` not a multiple of the sector size.
    #[error("offset {offset} sectors is not a multiple of the sector size ({sector_size} bytes)")]
    MisalignedOffset {
        /// Given offset in 512-byte sectors.
        offset: u64,
        /// Sector size in bytes.
        sector_size: u32,
    },
    /// `len` not a multiple of the sector size.
    #[error("device length {len} sectors is not a multiple of the sector size ({sector_size} bytes)")]
    MisalignedLength {
        /// Given length in 512-byte sectors.
        len: u64,
        /// Sector size in bytes.
        sector_size: u32,
    },
}

/// Optional parameters of a crypt table line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CryptOptions {
    /// Pass discards to the device below.
    pub allow_discards: bool,
    /// Kernel: bound per-CPU workqueue. Here: crypto runs on the pool thread the request
    /// was handed to, without splitting a request across threads.
    pub same_cpu_crypt: bool,
    /// Kernel: don't offload writes to the single writer thread. Here: with pooled crypto,
    /// the pool thread that encrypted a write submits it (otherwise the request thread does).
    pub submit_from_crypt_cpus: bool,
    /// Decrypt on the request's thread instead of the crypto pool.
    pub no_read_workqueue: bool,
    /// Encrypt on the request's thread instead of the crypto pool.
    pub no_write_workqueue: bool,
    /// Kernel: high-priority workqueues. Accepted; sealdisk has no priorities.
    pub high_priority: bool,
    /// Encryption sector size in bytes (512 when absent).
    pub sector_size: Option<u32>,
    /// IVs count in `sector_size` units.
    pub iv_large_sectors: bool,
    /// `integrity:<bytes>:aead`: per-sector tag + IV bytes on the dm-integrity device below
    /// (authenticated encryption). Printed for an assembled LUKS2 AEAD volume; a table line
    /// with it is still refused by [`CryptTable::parse`] (the dm-integrity layer below is
    /// not described by a crypt line).
    pub integrity_aead: Option<u32>,
}

impl CryptOptions {
    /// These flags with those a LUKS2 header stores (`config.flags`, or a segment's
    /// `flags`: `allow-discards`, `same-cpu-crypt`, `submit-from-crypt-cpus`,
    /// `no-read-workqueue`, `no-write-workqueue`, `high_priority`) added; other names (and
    /// every other field) are left as they are.
    pub fn with_persistent<S: AsRef<str>>(&self, stored: &[S]) -> CryptOptions {
        let has = |f: &str| stored.iter().any(|x| x.as_ref() == f);
        CryptOptions {
            allow_discards: self.allow_discards || has("allow-discards"),
            same_cpu_crypt: self.same_cpu_crypt || has("same-cpu-crypt"),
            submit_from_crypt_cpus: self.submit_from_crypt_cpus || has("submit-from-crypt-cpus"),
            no_read_workqueue: self.no_read_workqueue || has("no-read-workqueue"),
            no_write_workqueue: self.no_write_workqueue || has("no-write-workqueue"),
            high_priority: self.high_priority || has("high_priority"),
            ..*self
        }
    }

    /// The LUKS2 persistent flag names of these flags, with `no-journal` (an authenticated
    /// volume's dm-integrity layer) when `no_journal`, in cryptsetup's order: what
    /// `open --persistent` stores.
    pub fn persistent_names(&self, no_journal: bool) -> Vec<&'static str> {
        [
            (self.allow_discards, "allow-discards"),
            (self.same_cpu_crypt, "same-cpu-crypt"),
            (self.submit_from_crypt_cpus, "submit-from-crypt-cpus"),
            (no_journal, "no-journal"),
            (self.no_read_workqueue, "no-read-workqueue"),
            (self.no_write_workqueue, "no-write-workqueue"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }

    /// The effective sector size.
    pub fn sector_size(&self) -> u32 {
        self.sector_size.unwrap_or(512)
    }

    fn words(&self) -> Vec<String> {
        let mut w = Vec::new();
        let flags = [
            (self.allow_discards, "allow_discards"),
            (self.same_cpu_crypt, "same_cpu_crypt"),
            (self.submit_from_crypt_cpus, "submit_from_crypt_cpus"),
            (self.no_read_workqueue, "no_read_workqueue"),
            (self.no_write_workqueue, "no_write_workqueue"),
            (self.high_priority, "high_priority"),
        ];
        w.extend(flags.iter().filter(|(on, _)| *on).map(|(_, name)| name.to_string()));
        if let Some(n) = self.integrity_aead {
            w.push(format!("integrity:{n}:aead"));
        }
        if let Some(s) = self.sector_size {
            w.push(format!("sector_size:{s}"));
        }
        if self.iv_large_sectors {
            w.push("iv_large_sectors".to_string());
        }
        w
    }
}

/// A parsed crypt table line. The key is wiped on drop and never printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct CryptTable {
    /// Target length in 512-byte sectors.
    pub len: u64,
    /// Cipher specification, verbatim (parsed by the crypto layer).
    pub cipher: String,
    /// Key bytes (empty for `-`).
    pub key: Zeroizing<Vec<u8>>,
    /// IV offset in 512-byte sectors.
    pub iv_offset: u64,
    /// Backing device path.
    pub device: String,
    /// Start of the ciphertext on the device, in 512-byte sectors.
    pub offset: u64,
    /// Optional parameters.
    pub options: CryptOptions,
}

impl fmt::Debug for CryptTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CryptTable")
            .field("len", &self.len)
            .field("cipher", &self.cipher)
            .field("key", &format_args!("<{} bytes redacted>", self.key.len()))
            .field("iv_offset", &self.iv_offset)
            .field("device", &self.device)
            .field("offset", &self.offset)
            .field("options", &self.options)
            .finish()
    }
}

fn parse_u64(field: &'static str, s: &str) -> Result<u64, TableError> {
    // The kernel uses sscanf("%llu%c"): decimal digits only, nothing after.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TableError::BadNumber { field, value: s.to_string() });
    }
    let v: u64 = s.parse().map_err(|_| TableError::BadNumber { field, value: s.to_string() })?;
    if v > limits::DM_MAX_SECTORS {
        return Err(TableError::TooLarge { field, value: v });
    }
    Ok(v)
}

fn parse_key(s: &str) -> Result<Zeroizing<Vec<u8>>, TableError> {
    if s == "-" {
        return Ok(Zeroizing::new(Vec::new()));
    }
    if s.starts_with(':') {
        return Err(TableError::KeyringKey);
    }
    if !s.len().is_multiple_of(2) {
        return Err(TableError::BadKey(s.len()));
    }
    if s.len() / 2 > limits::MAX_KEY_BYTES as usize {
        return Err(TableError::KeyTooLong(s.len()));
    }
    let mut key = Zeroizing::new(vec![0u8; s.len() / 2]);
    hex::decode_to_slice(s, &mut key[..]).map_err(|_| TableError::BadKey(s.len()))?;
    Ok(key)
}

impl CryptTable {
    /// Parses one table line (surrounding whitespace and a trailing newline are ignored).
    pub fn parse(text: &str) -> Result<Self, TableError> {
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        if lines.len() > 1 {
            return Err(TableError::MultipleTargets(lines.len()));
        }
        let f: Vec<&str> = lines.first().map(|l| l.split_ascii_whitespace().collect()).unwrap_or_default();
        if f.len() < 8 {
            return Err(TableError::TooFewFields(f.len()));
        }
        let start = parse_u64("start", f[0])?;
        if start != 0 {
            return Err(TableError::NonZeroStart(start));
        }
        let len = parse_u64("length", f[1])?;
        if len == 0 {
            return Err(TableError::ZeroLength);
        }
        if f[2] != "crypt" {
            return Err(TableError::WrongTarget(f[2].to_string()));
        }
        let cipher = f[3].to_string();
        let key = parse_key(f[4])?;
        let iv_offset = parse_u64("iv_offset", f[5])?;
        let device = f[6].to_string();
        let offset = parse_u64("offset", f[7])?;
        if offset.checked_add(len).is_none_or(|end| end > limits::DM_MAX_SECTORS) {
            return Err(TableError::TooLarge { field: "offset + length", value: offset.saturating_add(len) });
        }
        let options = Self::parse_options(&f[8..])?;
        let table = CryptTable { len, cipher, key, iv_offset, device, offset, options };
        table.validate()?;
        Ok(table)
    }

    /// The kernel's consistency checks, for tables built in code rather than parsed:
    /// positive length, `sector_size` a power of two in 512..=4096, and `iv_offset` and
    /// `len` multiples of the sector size.
    pub fn validate(&self) -> Result<(), TableError> {
        if self.len == 0 {
            return Err(TableError::ZeroLength);
        }
        let ss = self.options.sector_size();
        if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
            return Err(TableError::BadSectorSize(ss.to_string()));
        }
        let per = u64::from(ss / 512);
        if !self.iv_offset.is_multiple_of(per) {
            return Err(TableError::MisalignedIvOffset { iv_offset: self.iv_offset, sector_size: ss });
        }
        if !self.len.is_multiple_of(per) {
            return Err(TableError::MisalignedLength { len: self.len, sector_size: ss });
        }
        // Not dm-crypt's own check but device-mapper's: the target's logical block is the
        // sector size, and its start on the device below must be aligned to it.
        if !self.offset.is_multiple_of(per) {
            return Err(TableError::MisalignedOffset { offset: self.offset, sector_size: ss });
        }
        Ok(())
    }

    fn parse_options(rest: &[&str]) -> Result<CryptOptions, TableError> {
        let mut o = CryptOptions::default();
        let Some((count, opts)) = rest.split_first() else {
            return Ok(o);
        };
        let n: usize = count
            .parse()
            .map_err(|_| TableError::BadOptCount { count: count.to_string(), given: opts.len() })?;
        if n != opts.len() {
            return Err(TableError::BadOptCount { count: count.to_string(), given: opts.len() });
        }
        if n > limits::DM_MAX_OPTIONAL_PARAMS {
            return Err(TableError::TooManyOpts(n));
        }
        for &opt in opts {
            match opt {
                "allow_discards" => o.allow_discards = true,
                "same_cpu_crypt" => o.same_cpu_crypt = true,
                "submit_from_crypt_cpus" => o.submit_from_crypt_cpus = true,
                "no_read_workqueue" => o.no_read_workqueue = true,
                "no_write_workqueue" => o.no_write_workqueue = true,
                "high_priority" => o.high_priority = true,
                "iv_large_sectors" => o.iv_large_sectors = true,
                _ => {
                    if let Some(v) = opt.strip_prefix("sector_size:") {
                        let s: u32 = v.parse().map_err(|_| TableError::BadSectorSize(v.to_string()))?;
                        if !(512..=4096).contains(&s) || !s.is_power_of_two() {
                            return Err(TableError::BadSectorSize(v.to_string()));
                        }
                        o.sector_size = Some(s);
                    } else if opt.starts_with("integrity:") || opt.starts_with("integrity_key_size:") {
                        return Err(TableError::UnsupportedOpt(
                            opt.to_string(),
                            "authenticated encryption needs a dm-integrity layer below, which a crypt table line cannot describe (open the LUKS2 volume instead)",
                        ));
                    } else {
                        return Err(TableError::UnknownOpt(opt.to_string()));
                    }
                }
            }
        }
        Ok(o)
    }
}

/// Re-emits the line as `dmsetup table --showkeys` would, key in hex.
impl fmt::Display for CryptTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The hex key in one exactly-sized, wiped buffer (no growing String left behind).
        let mut hex_key = Zeroizing::new(vec![0u8; self.key.len() * 2]);
        hex::encode_to_slice(&self.key[..], &mut hex_key[..]).map_err(|_| fmt::Error)?;
        let key =
            if self.key.is_empty() { "-" } else { std::str::from_utf8(&hex_key).map_err(|_| fmt::Error)? };
        write!(
            f,
            "0 {} crypt {} {} {} {} {}",
            self.len, self.cipher, key, self.iv_offset, self.device, self.offset
        )?;
        let words = self.options.words();
        if !words.is_empty() {
            write!(f, " {} {}", words.len(), words.join(" "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn persistent_flags_round_trip_in_cryptsetups_order() {
        let o = CryptOptions { allow_discards: true, no_write_workqueue: true, ..CryptOptions::default() };
        let names = o.persistent_names(true);
        assert_eq!(names, ["allow-discards", "no-journal", "no-write-workqueue"]);
        let back =
            CryptOptions { sector_size: Some(4096), ..CryptOptions::default() }.with_persistent(&names);
        assert_eq!(back, CryptOptions { sector_size: Some(4096), ..o });
        let none: [&str; 1] = ["unknown-flag"];
        assert_eq!(CryptOptions::default().with_persistent(&none), CryptOptions::default());
    }

    #[test]
    fn parse_issue_example_round_trips() {
        let line = format!(
            "0 60647424 crypt aes-xts-plain64 {KEY} 0 /path/to/dev 32768 3 allow_discards no_read_workqueue no_write_workqueue"
        );
        let t = CryptTable::parse(&line).unwrap();
        assert_eq!(t.len, 60647424);
        assert_eq!(t.cipher, "aes-xts-plain64");
        assert_eq!(t.key.len(), 32);
        assert_eq!(t.offset, 32768);
        assert!(t.options.allow_discards && t.options.no_read_workqueue && t.options.no_write_workqueue);
        assert!(!t.options.same_cpu_crypt);
        assert_eq!(t.to_string(), line);
        assert_eq!(CryptTable::parse(&t.to_string()).unwrap(), t);
    }

    #[test]
    fn integrity_aead_prints_as_the_kernel_does_but_is_not_parsed() {
        let t = CryptTable {
            len: 6672,
            cipher: "capi:gcm(aes)-random".into(),
            key: Zeroizing::new(vec![0; 32]),
            iv_offset: 0,
            device: "/dev/x".into(),
            offset: 0,
            options: CryptOptions {
                integrity_aead: Some(28),
                sector_size: Some(4096),
                ..CryptOptions::default()
            },
        };
        let line = t.to_string();
        assert!(line.ends_with(" /dev/x 0 2 integrity:28:aead sector_size:4096"), "{line}");
        assert!(matches!(CryptTable::parse(&line), Err(TableError::UnsupportedOpt(..))));
    }

    #[test]
    fn parse_sector_size_and_large_ivs() {
        let t = CryptTable::parse(&format!(
            "0 64 crypt aes-xts-plain64 {KEY} 8 /dev/x 0 2 sector_size:4096 iv_large_sectors\n"
        ))
        .unwrap();
        assert_eq!(t.options.sector_size(), 4096);
        assert!(t.options.iv_large_sectors);
        assert_eq!(t.iv_offset, 8);
    }

    #[test]
    fn parse_null_key() {
        let t = CryptTable::parse("0 8 crypt cipher_null-ecb - 0 /dev/x 0").unwrap();
        assert!(t.key.is_empty());
        assert!(t.to_string().contains(" - 0 /dev/x 0"));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let t = CryptTable::parse(&format!("0 8 crypt aes-xts-plain64 {KEY} 0 /dev/x 0")).unwrap();
        let d = format!("{t:?}");
        assert!(!d.contains("0001020304"), "{d}");
        assert!(d.contains("redacted"));
    }

    #[test]
    fn malformed_lines_are_refused_precisely() {
        type Expect = fn(&TableError) -> bool;
        let cases: &[(&str, Expect)] = &[
            ("0 8 crypt aes-xts-plain64", |e| matches!(e, TableError::TooFewFields(4))),
            ("0 8 linear /dev/x 0 a b c", |e| matches!(e, TableError::WrongTarget(_))),
            ("8 8 crypt c 00 0 /dev/x 0", |e| matches!(e, TableError::NonZeroStart(8))),
            ("0 0 crypt c 00 0 /dev/x 0", |e| matches!(e, TableError::ZeroLength)),
            ("0 -8 crypt c 00 0 /dev/x 0", |e| matches!(e, TableError::BadNumber { field: "length", .. })),
            ("0 8 crypt c 0 0 /dev/x 0", |e| matches!(e, TableError::BadKey(1))),
            ("0 8 crypt c zz 0 /dev/x 0", |e| matches!(e, TableError::BadKey(2))),
            ("0 8 crypt c :32:logon:k 0 /dev/x 0", |e| matches!(e, TableError::KeyringKey)),
            ("0 8 crypt c 00 1x /dev/x 0", |e| matches!(e, TableError::BadNumber { field: "iv_offset", .. })),
            ("0 8 crypt c 00 0 /dev/x 99999999999999999999", |e| {
                matches!(e, TableError::BadNumber { field: "offset", .. })
            }),
            ("0 8 crypt c 00 0 /dev/x 0 2 allow_discards", |e| matches!(e, TableError::BadOptCount { .. })),
            ("0 8 crypt c 00 0 /dev/x 0 x", |e| matches!(e, TableError::BadOptCount { .. })),
            ("0 8 crypt c 00 0 /dev/x 0 1 fast", |e| matches!(e, TableError::UnknownOpt(_))),
            ("0 8 crypt c 00 0 /dev/x 0 1 sector_size:1000", |e| matches!(e, TableError::BadSectorSize(_))),
            ("0 8 crypt c 00 0 /dev/x 0 1 sector_size:8192", |e| matches!(e, TableError::BadSectorSize(_))),
            ("0 8 crypt c 00 4 /dev/x 0 1 sector_size:4096", |e| {
                matches!(e, TableError::MisalignedIvOffset { iv_offset: 4, sector_size: 4096 })
            }),
            ("0 12 crypt c 00 0 /dev/x 0 1 sector_size:4096", |e| {
                matches!(e, TableError::MisalignedLength { len: 12, .. })
            }),
            ("0 8 crypt c 00 0 /dev/x 3 1 sector_size:4096", |e| {
                matches!(e, TableError::MisalignedOffset { offset: 3, sector_size: 4096 })
            }),
            ("0 8 crypt c 00 0 /dev/x 0 1 integrity:28:aead", |e| matches!(e, TableError::UnsupportedOpt(..))),
            ("0 8 crypt c 00 0 /dev/x 0\n0 8 crypt c 00 0 /dev/x 0", |e| {
                matches!(e, TableError::MultipleTargets(2))
            }),
            (
                "0 8 crypt c 00 0 /dev/x 0 10 allow_discards allow_discards allow_discards allow_discards allow_discards allow_discards allow_discards allow_discards allow_discards allow_discards",
                |e| matches!(e, TableError::TooManyOpts(10)),
            ),
        ];
        for (line, ok) in cases {
            let err = CryptTable::parse(line).expect_err(line);
            assert!(ok(&err), "{line}: unexpected {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn bad_key_error_does_not_echo_the_key() {
        let err = CryptTable::parse("0 8 crypt c 0123456789abcdeZ 0 /dev/x 0").unwrap_err();
        assert!(!err.to_string().contains("0123456789"));
    }
}
