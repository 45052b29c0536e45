//! Device-mapper targets as `BlockDevice` layers.
//!
//! ```text
//!        BlockDevice (what the NBD server serves)
//!              │
//!   CryptTarget<D>   decrypt after read / encrypt before write, per sector, dm-crypt IVs
//!              │
//!        D: BlockDevice (file, memory, slice, later IntegrityTarget)
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod crypt;

pub use crypt::{CryptConfig, CryptError, CryptMode, CryptTarget};
