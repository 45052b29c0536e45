//! The `objstore` crate's integration tests, one test binary (docs/TESTING.md): each module
//! below was a test binary of its own; the shared helpers are declared once, here.

mod common;

mod azblob;
mod gcs;
mod s3;
mod s3_faults;
