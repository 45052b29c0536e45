//! LUKS2 volumes on the GCS and Azure Blob emulators through the binary (issue 15): made by
//! `sealdisk luksFormat` on `gs://` / `azblob://`, written over NBD, exported, and decrypted by
//! cryptsetup; a file cryptsetup encrypted, imported and read by sealdisk on the store
//! (`common::luks2_object_store_round_trip`; the same check runs on moto in s3_cli.rs).
//! Opt-in like the objstore crate's gcs.rs and azblob.rs (`#[ignore]`; docs/TESTING.md):
//! `cargo test -p sealdisk --test cli emulators_cli:: -- --ignored`. Each skips loudly when its
//! emulator, cryptsetup or qemu-io is missing.

use crate::common;

use testkit::emulators::{Azurite, GcsEmulator, AZURITE_ACCOUNT, AZURITE_KEY};

#[test]
#[ignore = "opt-in: needs gcp-storage-emulator (pip), docs/TESTING.md"]
fn luks2_round_trip_on_the_gcs_emulator() {
    let dir = tempfile::tempdir().unwrap();
    let Some(g) = GcsEmulator::start(dir.path()) else { return };
    // The binary reaches the emulator as Google's tools do, unsigned.
    std::env::set_var("STORAGE_EMULATOR_HOST", g.host());
    common::luks2_object_store_round_trip(dir.path(), &|name| format!("gs://vols/{name}?timeout=60"));
}

#[test]
#[ignore = "opt-in: needs Azurite (npm install -g azurite), docs/TESTING.md"]
fn luks2_round_trip_on_azurite() {
    let dir = tempfile::tempdir().unwrap();
    let Some(a) = Azurite::start(dir.path()) else { return };
    a.create_container("vols");
    std::env::set_var("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT);
    std::env::set_var("AZURE_STORAGE_KEY", AZURITE_KEY);
    let e = a.endpoint();
    common::luks2_object_store_round_trip(dir.path(), &|name| format!("azblob://vols/{name}?endpoint={e}"));
}
