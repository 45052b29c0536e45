//! Helpers the object-storage test files share.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The AWS credential environment is per process, and s3.rs and s3_faults.rs set it (one
/// test sets a wrong secret): a test that sets or relies on it holds this. Under nextest each
/// test is a process of its own; under plain `cargo test` they share one.
pub static AWS_ENV: Mutex<()> = Mutex::new(());

/// Waits (up to two minutes) until `d` has no write-behind upload queued or running.
pub fn settle(d: &objstore::ObjectDevice) {
    let t0 = Instant::now();
    while d.uploading() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(120), "write-behind never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
}
