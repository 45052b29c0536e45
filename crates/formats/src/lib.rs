//! Sans-IO codecs: bytes in, structs out, and back.
//!
//! * [`bitlk`]: BitLocker volume header, FVE metadata and .BEK startup key files.
//! * [`dm`]: device-mapper table lines (`dmsetup table` format) for the crypt target.
//! * [`tcrypt`]: TrueCrypt/VeraCrypt headers: the KDF and cipher-chain tables, keyfile pool, layout.
//! * [`fvault2`]: FileVault2 (Core Storage) volume header and metadata, read-only.
//! * [`limits`]: every bound on a size, count or cost read from an untrusted image, in one place.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bitlk;
pub mod dm;
#[doc(hidden)]
pub mod fuzzing;
pub mod fvault2;
pub mod integrity;
pub mod limits;
pub mod luks1;
pub mod luks2;
pub mod tcrypt;
