//! Probe, unlock, assemble.
#![forbid(unsafe_code)]
