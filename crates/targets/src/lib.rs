//! Device-mapper targets as `BlockDevice` layers.
//!
//! ```text
//!        BlockDevice (what the NBD server serves)
//!              │
//!   CryptTarget<D>   decrypt after read / encrypt before write, per sector, dm-crypt IVs
//!              │     (AeadCryptTarget<D: TaggedDevice>: AEAD, a tag + IV tuple per sector)
//!              │
//!        D: BlockDevice (file, memory, slice, IntegrityTarget)
//!              │
//!   IntegrityTarget<D>  tags per block (internal hash or TaggedDevice), journal / bitmap /
//!              │        direct modes, kernel on-disk format (formats::integrity)
//!        D: BlockDevice
//! ```
//!
//! Where the per-request crypto and tag hashing run (inline, split across the request thread
//! and a shared pool while a core is free, or always pooled) is decided by one engine for
//! all three (`placement.rs`): [`Placement`], which `CryptMode` and `integrity::HashMode` are.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod crypt;
mod crypt_aead;
#[doc(hidden)]
pub mod fuzzing;
pub mod integrity;
mod placement;

pub use crypt::{CryptConfig, CryptError, CryptMode, CryptTarget};
pub use crypt_aead::AeadCryptTarget;
pub use integrity::{IntegrityConfig, IntegrityError, IntegrityStatus, IntegrityTarget, TaggedDevice};
pub use placement::{scrub_crypto_stacks, scrub_stack, Placement};
