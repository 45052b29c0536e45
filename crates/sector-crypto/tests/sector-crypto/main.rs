//! The `sector-crypto` crate's integration tests, one test binary (docs/TESTING.md): each module
//! below was a test binary of its own; the shared helpers are declared once, here.

#[path = "../common/mod.rs"]
mod common;

mod aead;
mod concurrency;
mod cross_check;
mod kernel_golden;
mod known_answers;
mod luks_af_kat;
mod spec;
mod wide_golden;
