//! The `formats` crate's integration tests, one test binary (docs/TESTING.md): each module
//! below was a test binary of its own; the shared helpers are declared once, here.

mod fuzz_corpus;
mod fuzz_regressions;
mod hostile_headers;
mod integrity_golden;
mod integrity_journal;
mod integrity_superblock;
mod luks2_malformed;
mod luks_golden;
mod luks_props;
