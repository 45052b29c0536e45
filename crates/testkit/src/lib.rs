//! Test machinery shared by every crate: the conformance suite, model-based property tests,
//! and devices that crash, fail or trace on purpose.
//!
//! ```text
//!   conformance::run_all(|| make_stack())        the BlockDevice contract, case by case
//!   model::run(|| make_stack(), config)          random op sequences vs a Vec<u8> model
//!
//!   stack under test
//!      └─ TraceDevice   records calls (layer order and arguments)
//!      └─ FaultDevice   fails the n-th op, or ops touching a range, with Io
//!      └─ CrashDevice   live + durable images; power loss at the n-th flush
//! ```
//!
//! This is a normal library (not `cfg(test)`): other crates take it as a dev-dependency and
//! run the same suites over their own stacks.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conformance;
mod crash;
pub mod emulators;
mod fault;
pub mod integrity_golden;
pub mod model;
pub mod pattern;
pub mod s3server;
mod trace;

pub use crash::CrashDevice;
pub use fault::{Fault, FaultDevice, OpKinds};
pub use trace::{Call, TraceDevice, TraceEntry, TraceLog};
