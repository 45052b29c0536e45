//! The C ABI's tests, one binary (as every crate's): the header is cbindgen's, and a C
//! program built against libsealdisk.so reads volumes cryptsetup and Windows made.
mod c_program;
mod header;
