//! NBD server (fixed newstyle) over `Arc<dyn BlockDevice>`.
#![forbid(unsafe_code)]
