//! The `volume` crate's integration tests, one test binary (docs/TESTING.md): each module
//! below was a test binary of its own; the shared helpers are declared once, here.

mod assemble;
mod bitlk_golden;
mod fvault2_golden;
mod hostile_images;
mod luks2_integrity_golden;
mod luks_convert_crash;
mod luks_crash;
mod luks_derive_first;
mod luks_dump;
mod luks_encrypt_decrypt;
mod luks_hashes_golden;
mod luks_ops;
mod luks_reencrypt;
mod secret_debug;
mod tcrypt_cryptsetup_images;
mod tcrypt_golden;
mod wide_luks_golden;
