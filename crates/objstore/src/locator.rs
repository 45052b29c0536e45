//! Object-storage locators: `s3://bucket/prefix?endpoint=…&size=…`, parsed and checked
//! before anything is contacted.
//!
//! Credentials are never part of a locator: a locator shows up in argv, process listings,
//! table lines and logs. They come from the environment and the files the cloud tools read
//! (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, `AWS_PROFILE`,
//! `~/.aws/credentials` and `~/.aws/config` for S3; `GOOGLE_APPLICATION_CREDENTIALS` for GCS;
//! `AZURE_STORAGE_ACCOUNT`/`AZURE_STORAGE_KEY` for Azure Blob), read by OpenDAL's signers.

use std::fmt;

/// Which object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Amazon S3 and S3-compatible servers (MinIO, Ceph RGW, RustFS, moto, …).
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage.
    Azblob,
}

/// A parsed object-storage locator.
#[derive(Clone, PartialEq, Eq)]
pub struct Locator {
    /// The service (from the scheme: `s3`, `gs`/`gcs`, `azblob`).
    pub service: Service,
    /// The bucket (the container for Azure Blob).
    pub bucket: String,
    /// The key prefix the volume's objects live under, without leading or trailing `/`
    /// (empty: the bucket's root).
    pub prefix: String,
    /// `endpoint=`: the server's URL (an S3-compatible server; for S3 also from
    /// `AWS_ENDPOINT_URL`).
    pub endpoint: Option<String>,
    /// `region=` (S3; otherwise `AWS_REGION`/`AWS_DEFAULT_REGION`, else `us-east-1`).
    pub region: Option<String>,
    /// `size=`: create the volume with this size when the prefix is empty (and check it
    /// when the volume exists).
    pub size: Option<u64>,
    /// `object_size=`: bytes per object for a new volume (checked against an existing one).
    pub object_size: Option<u64>,
    /// `cache=`: the write-back cache's size limit in bytes.
    pub cache: Option<u64>,
    /// `concurrency=`: uploads and downloads in flight at once.
    pub concurrency: Option<usize>,
    /// `readahead=`: bytes a sequential reader's read-ahead downloads may have in flight.
    pub readahead: Option<u64>,
    /// `timeout=`: seconds one request may take before it fails.
    pub timeout: Option<u64>,
    /// `break_lease=1`: take the volume over from a writer that is gone (crashed) and
    /// left its lease behind.
    pub break_lease: bool,
    /// `virtual_host=1`: address the bucket as `bucket.endpoint` (S3).
    pub virtual_host: bool,
    /// `write_behind=0`: upload objects only when the cache is full or at a flush, not as soon
    /// as a writer has filled one (on by default).
    pub write_behind: bool,
}

impl fmt::Debug for Locator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display())
    }
}

/// A locator that does not parse, with what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object storage locator {locator:?}: {reason}")]
pub struct LocatorError {
    /// The locator as given, with its query cut (it may hold what it must not).
    pub locator: String,
    /// What is wrong.
    pub reason: String,
}

/// Whether `scheme` names an object store this crate serves.
pub fn is_object_scheme(scheme: &str) -> bool {
    service_of(scheme).is_some()
}

fn service_of(scheme: &str) -> Option<Service> {
    match scheme.to_ascii_lowercase().as_str() {
        "s3" => Some(Service::S3),
        "gs" | "gcs" => Some(Service::Gcs),
        "azblob" => Some(Service::Azblob),
        _ => None,
    }
}

/// Parses a size: bytes, or a number with `k`, `M`, `G`, `T` (powers of 1024, an optional
/// `i`/`iB`/`B` after the letter).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let shift = match unit.trim_end_matches("iB").trim_end_matches('B').trim_end_matches('i') {
        "" => 0,
        "k" | "K" => 10,
        "m" | "M" => 20,
        "g" | "G" => 30,
        "t" | "T" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

impl Locator {
    /// Parses `s` (`scheme://bucket[/prefix][?key=value&…]`).
    pub fn parse(s: &str) -> Result<Locator, LocatorError> {
        let (head, query) = match s.split_once('?') {
            Some((h, q)) => (h, Some(q)),
            None => (s, None),
        };
        let err = |reason: String| LocatorError { locator: head.to_owned(), reason };
        let (scheme, rest) = head.split_once("://").ok_or_else(|| err("not a URI".into()))?;
        let service = service_of(scheme).ok_or_else(|| err(format!("unknown scheme {scheme}://")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(err("no bucket".into()));
        }
        if bucket.contains('@') {
            return Err(err("credentials are never taken from the locator (it shows in argv and process \
                 listings); set them in the environment or the cloud tools' files"
                .into()));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|c| c == "." || c == "..") {
            return Err(err("`.` and `..` are not allowed in the prefix".into()));
        }
        let mut l = Locator {
            service,
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            endpoint: None,
            region: None,
            size: None,
            object_size: None,
            cache: None,
            concurrency: None,
            readahead: None,
            timeout: None,
            break_lease: false,
            virtual_host: false,
            write_behind: true,
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v).ok_or_else(|| err(format!("{k}: bad percent-encoding")))?;
            let size = |what: &str| parse_size(&v).ok_or_else(|| err(format!("{what}={v:?} is not a size")));
            let flag = || match v.as_str() {
                "" | "1" | "true" | "yes" => Ok(true),
                "0" | "false" | "no" => Ok(false),
                _ => Err(err(format!("{k}={v:?}: expected 1 or 0"))),
            };
            let lk = k.to_ascii_lowercase();
            match lk.as_str() {
                "endpoint" => l.endpoint = Some(v.clone()),
                "region" => l.region = Some(v.clone()),
                "size" => l.size = Some(size("size")?),
                "object_size" => l.object_size = Some(size("object_size")?),
                "cache" => l.cache = Some(size("cache")?),
                "concurrency" => {
                    l.concurrency = Some(
                        v.parse()
                            .ok()
                            .filter(|n| (1..=256).contains(n))
                            .ok_or_else(|| err(format!("concurrency={v:?}: expected 1..=256")))?,
                    )
                }
                "readahead" => l.readahead = Some(size("readahead")?),
                "timeout" => {
                    l.timeout = Some(
                        v.parse()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| err(format!("timeout={v:?}: seconds")))?,
                    )
                }
                "break_lease" => l.break_lease = flag()?,
                "virtual_host" => l.virtual_host = flag()?,
                "write_behind" => l.write_behind = flag()?,
                _ if ["key", "secret", "token", "password", "credential", "signature"]
                    .iter()
                    .any(|w| lk.contains(w)) =>
                {
                    return Err(err(format!(
                        "{k}: credentials are never taken from the locator (it shows in argv and \
                         process listings); set them in the environment (AWS_ACCESS_KEY_ID, \
                         AWS_SECRET_ACCESS_KEY, AWS_PROFILE) or ~/.aws/credentials"
                    )))
                }
                _ => return Err(err(format!("unknown parameter {k:?}"))),
            }
        }
        if let Some(o) = l.object_size {
            if !o.is_power_of_two() || !(crate::MIN_OBJECT_SIZE..=crate::MAX_OBJECT_SIZE).contains(&o) {
                return Err(err(format!(
                    "object_size={o}: a power of two from {} KiB to {} MiB",
                    crate::MIN_OBJECT_SIZE >> 10,
                    crate::MAX_OBJECT_SIZE >> 20
                )));
            }
        }
        if let Some(sz) = l.size {
            if sz == 0 || sz % u64::from(crate::BLOCK) != 0 {
                return Err(err(format!("size={sz}: a nonzero multiple of {} bytes", crate::BLOCK)));
            }
        }
        if service == Service::Azblob && l.endpoint.is_none() {
            return Err(err("azblob:// needs endpoint=https://ACCOUNT.blob.core.windows.net".into()));
        }
        Ok(l)
    }

    /// The locator without its parameters (`s3://bucket/prefix`), for messages.
    pub fn display(&self) -> String {
        let scheme = match self.service {
            Service::S3 => "s3",
            Service::Gcs => "gs",
            Service::Azblob => "azblob",
        };
        if self.prefix.is_empty() {
            format!("{scheme}://{}", self.bucket)
        } else {
            format!("{scheme}://{}/{}", self.bucket, self.prefix)
        }
    }

    /// What identifies the volume (service, endpoint, bucket, prefix): two locators with the
    /// same identity name the same objects.
    pub fn identity(&self) -> String {
        format!("{}|{}|{:?}", self.display(), self.endpoint.as_deref().unwrap_or(""), self.region)
    }

    /// The key of `name` under the prefix.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let l =
            Locator::parse("s3://b/vols/one/?endpoint=http://127.0.0.1:9000&size=1G&object_size=4M").unwrap();
        assert_eq!((l.service, l.bucket.as_str(), l.prefix.as_str()), (Service::S3, "b", "vols/one"));
        assert_eq!(l.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!((l.size, l.object_size), (Some(1 << 30), Some(4 << 20)));
        assert_eq!(Locator::parse("s3://b/x?readahead=16M").unwrap().readahead, Some(16 << 20));
        assert!(Locator::parse("s3://b/x").unwrap().write_behind);
        assert!(!Locator::parse("s3://b/x?write_behind=0").unwrap().write_behind);
        assert_eq!(l.key("data/0"), "vols/one/data/0");
        assert_eq!(l.display(), "s3://b/vols/one");
        assert_eq!(Locator::parse("gs://b").unwrap().key("x"), "x");
        for bad in [
            "s3://",
            "s3:///x",
            "s3://b/x?secret_access_key=abc",
            "s3://b/x?access_key_id=abc",
            "s3://key:secret@b/x",
            "s3://b/x?size=1000",
            "s3://b/x?object_size=3M",
            "s3://b/x?nope=1",
            "s3://b/x?readahead=lots",
            "s3://b/../x",
            "azblob://c/x",
            "ftp://b/x",
        ] {
            let e = Locator::parse(bad).unwrap_err();
            assert!(!e.to_string().contains("abc"), "{e}");
        }
        assert_eq!(parse_size("4MiB"), Some(4 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
    }
}
