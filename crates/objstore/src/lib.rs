//! A sealdisk [`BlockDevice`] on object storage (S3 and S3-compatible servers, GCS, Azure
//! Blob) through OpenDAL.
//!
//! ```text
//!   BlockDevice (sync, &self, many threads)
//!        │ read_at / write_at / flush
//!        ▼
//!   ObjectDevice ── per-object slots (write-back cache, size limit, LRU)
//!        │ block_on: a small tokio runtime the process's devices share
//!        ▼
//!   OpenDAL Operator ──HTTP──► bucket/prefix/
//!                                  sealdisk-volume.json   manifest: size, object size
//!                                  sealdisk-lease.json    the one writer's lease
//!                                  data/0000000000000000  object 0 (absent: zeroes)
//!                                  data/0000000000000001  …
//! ```
//!
//! * The volume's bytes are split into fixed-size objects ([`DEFAULT_OBJECT_SIZE`] unless the
//!   locator's `object_size=` says otherwise when the volume is created). An absent object
//!   reads as zeroes; an object that becomes all zeroes is deleted instead of uploaded.
//! * Writes land in a local write-back cache (memory, `cache=` bytes, [`DEFAULT_CACHE`]);
//!   an object that writes have covered whole is uploaded at once in the background
//!   (write-behind, `concurrency=` at a time; `write_behind=0` turns it off); when the cache is
//!   full, the least recently used clean objects are dropped, and dirty ones are uploaded
//!   first. `flush` returns only when every object dirty at its start is uploaded
//!   (uploads run `concurrency=` at once), and latches a failure ([`WritebackLatch`]).
//! * A sequential reader is read ahead: the next objects are downloaded in order in the
//!   background, at most `concurrency=` of them and at most `readahead=` bytes
//!   ([`DEFAULT_READAHEAD`]) at once, and a read copies its part of an object out as it arrives.
//! * One writer per volume: a writer creates the lease object with a conditional write
//!   (`If-None-Match: *`), refuses to open when it exists (`Busy`, naming the holder), checks
//!   before every upload (flush or cache eviction) that the lease is still its own, stops
//!   writing for good when it is not, and deletes it when dropped. A crashed writer's lease is
//!   taken over with `break_lease=1`.
//! * Everything is validated before anything is written: a prefix that holds objects but no
//!   manifest, a manifest that does not parse, a data object with a foreign name or the wrong
//!   size are refused at open.
//!
//! Async stays inside this crate: the devices of a process share one two-thread tokio runtime
//! (started by the first open) and block on it; callers see only the synchronous
//! [`BlockDevice`] trait.
#![warn(missing_docs)]

mod device;
mod locator;

pub use device::{install_transport, open, ObjectDevice, OpenOptions};
pub use locator::{is_object_scheme, parse_size, Locator, LocatorError, Service};
pub use opendal;

/// The logical block size the device reports.
pub const BLOCK: u32 = 512;
/// Bytes per object of a new volume unless `object_size=` is given (measured: see
/// docs/ARCHITECTURE.md, "Object storage").
pub const DEFAULT_OBJECT_SIZE: u64 = 4 << 20;
/// The smallest object size accepted.
pub const MIN_OBJECT_SIZE: u64 = 64 << 10;
/// The largest object size accepted.
pub const MAX_OBJECT_SIZE: u64 = 256 << 20;
/// The write-back cache's default size limit.
pub const DEFAULT_CACHE: u64 = 256 << 20;
/// Requests in flight at once by default.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// Bytes a sequential reader's read-ahead may have in flight by default (`readahead=`): at
/// most `concurrency` downloads and at most this many bytes of them, but always one (measured:
/// BENCHMARKS.md, "Object storage reads, eighth pass").
pub const DEFAULT_READAHEAD: u64 = 32 << 20;
/// The manifest's object name (under the prefix).
pub const MANIFEST: &str = "sealdisk-volume.json";
/// The lease's object name (under the prefix).
pub const LEASE: &str = "sealdisk-lease.json";
/// The folder of the data objects (under the prefix).
pub const DATA: &str = "data/";
