//! Test machinery shared by every crate: conformance suite, model tests, fault devices.
