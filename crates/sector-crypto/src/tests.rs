//! Unit tests of crate internals; public-API tests live in `tests/`.

#[path = "../tests/common/vectors.rs"]
mod vectors;
pub(crate) use vectors::*;
