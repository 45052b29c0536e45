//! Device-mapper targets as `BlockDevice` layers.
#![forbid(unsafe_code)]
