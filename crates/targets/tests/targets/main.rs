//! The `targets` crate's integration tests, one test binary (docs/TESTING.md): each module
//! below was a test binary of its own; the shared helpers are declared once, here.

mod integrity_common;

mod aead_crypt;
mod crypt_stacks;
mod fuzz_corpus;
mod integrity_bench;
mod integrity_crash;
mod integrity_engine;
mod integrity_golden;
mod integrity_grow;
mod integrity_journal_bg;
mod integrity_stacks;
