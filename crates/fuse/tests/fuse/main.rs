//! The `fuse` crate's integration tests, one test binary (docs/TESTING.md): each module
//! below was a test binary of its own; the shared helpers are declared once, here.

mod mount;
