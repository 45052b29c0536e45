//! Sans-IO codecs: bytes in, structs out, and back.
//!
//! * [`dm`]: device-mapper table lines (`dmsetup table` format) for the crypt target.
//! * [`limits`]: every bound on a size, count or cost read from an untrusted image, in one place.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod dm;
#[doc(hidden)]
pub mod fuzzing;
pub mod integrity;
pub mod limits;
pub mod luks1;
pub mod luks2;
