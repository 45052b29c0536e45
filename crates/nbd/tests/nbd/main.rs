//! The `nbd` crate's integration tests, one test binary (docs/TESTING.md): each module
//! below was a test binary of its own; the shared helpers are declared once, here.

mod common;

mod block_status;
mod fuzz_corpus;
mod hostile;
mod interop;
mod protocol;
mod tls;
