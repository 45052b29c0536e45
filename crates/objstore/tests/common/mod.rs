//! Helpers the object-storage test files share.

use std::time::{Duration, Instant};

/// Waits (up to two minutes) until `d` has no write-behind upload queued or running.
pub fn settle(d: &objstore::ObjectDevice) {
    let t0 = Instant::now();
    while d.uploading() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(120), "write-behind never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
}
