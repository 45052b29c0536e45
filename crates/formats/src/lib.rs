//! Sans-IO codecs: bytes in, structs out, and back.
#![forbid(unsafe_code)]
