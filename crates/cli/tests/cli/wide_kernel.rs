//! sealdisk-written Adiantum and ESSIV-<hash> volumes against the real kernel (Linux 6.1
//! dm-crypt and its cryptsetup, under /work/shared/oracle/kernel-run, one boot): plain images
//! encrypted by sealdisk's sector cipher, and a LUKS2 Adiantum volume formatted and written
//! by sealdisk; the kernel maps each and must read back the pattern (sha256 compared).
//! HCTR2 is not here: Debian's kernels are built without it.
//!
//! Boots a kernel (~30 s under TCG): `cargo test -p sealdisk --test cli wide_kernel:: -- --ignored`.

use crate::common;

use blockdev::{BlockDevice, WriteFlags};
use common::{pattern, run as sealdisk, sha_hex, FAST_PBKDF2};
use sector_crypto::kdf::Passphrase;
use sector_crypto::{CipherSpec, SectorCipher, SectorParams, VolumeKey};
use volume::luks::OpenParams;

/// (name, cipher, key bytes, sector size, iv_offset).
const PLAIN: &[(&str, &str, usize, u32, u64)] = &[
    ("adiantum12-s512", "xchacha12,aes-adiantum-plain64", 32, 512, 0),
    ("adiantum20-capi-s4096", "capi:adiantum(xchacha20,aes)-plain64", 32, 4096, 16),
    ("essiv-md5", "aes-cbc-essiv:md5", 32, 512, 0),
    ("essiv-wp256", "aes-cbc-essiv:wp256", 16, 512, 3),
    ("essiv-streebog256", "aes-cbc-essiv:streebog256", 32, 512, 0),
];

#[test]
#[ignore = "boots Linux under qemu (kernel-run), ~30 s"]
fn sealdisk_adiantum_and_essiv_volumes_read_back_in_the_kernel() {
    let Some(kr) = common::kernel_run() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 * 1024, 0x57);
    let want = sha_hex(&data);
    let mut disks = Vec::new();
    let mut script = String::from("#!/bin/bash\nset -euo pipefail\nset -- $KR_DISKS\n");
    for &(name, spec, key_len, ss, ivoff) in PLAIN {
        let key: Vec<u8> = (0..key_len as u8).map(|b| b.wrapping_mul(37).wrapping_add(5)).collect();
        let c = SectorCipher::new(
            &spec.parse::<CipherSpec>().unwrap(),
            &VolumeKey::from_slice(&key),
            SectorParams { sector_size: ss, iv_offset: ivoff, iv_large_sectors: false },
        )
        .unwrap();
        let mut img = data.clone();
        c.encrypt(0, &mut img).unwrap();
        let p = dir.path().join(format!("{name}.img"));
        std::fs::write(&p, &img).unwrap();
        disks.push(p);
        let opt = if ss == 4096 { " 1 sector_size:4096" } else { "" };
        script.push_str(&format!(
            "dmsetup create w --table \"0 128 crypt {spec} {} {ivoff} $1 0{opt}\"; shift\n\
             echo \"SHA {name} $(head -c 65536 /dev/mapper/w | sha256sum | cut -d' ' -f1)\"\n\
             dmsetup remove w\n",
            hex::encode(&key)
        ));
    }
    // LUKS2 Adiantum, formatted and written by sealdisk.
    let luks = dir.path().join("luks2-adiantum.img");
    std::fs::File::create(&luks).unwrap().set_len(20 << 20).unwrap();
    let pass = dir.path().join("pass");
    std::fs::write(&pass, b"wide kernel").unwrap();
    let mut args = vec!["luksFormat", "-q", "--type", "luks2", "--cipher", "xchacha12,aes-adiantum-plain64"];
    args.extend(["--key-size", "256", "--hash", "sha3-256"]);
    args.extend_from_slice(FAST_PBKDF2);
    args.extend(["--key-file", pass.to_str().unwrap(), luks.to_str().unwrap()]);
    let out = sealdisk(&args);
    assert!(out.status.success(), "luksFormat: {}", String::from_utf8_lossy(&out.stderr));
    {
        let opened = volume::luks::open(
            &OpenParams::new(luks.to_str().unwrap()),
            &Passphrase::new(b"wide kernel".to_vec()),
        )
        .unwrap();
        opened.volume.device.write_at(0, &data, WriteFlags::empty()).unwrap();
        opened.volume.device.flush().unwrap();
    }
    disks.push(luks);
    script.push_str(
        "cryptsetup open --key-file /kr/pass $1 w\n\
         echo \"SHA luks2-adiantum $(head -c 65536 /dev/mapper/w | sha256sum | cut -d' ' -f1)\"\n\
         cryptsetup close w\n",
    );
    let sh = dir.path().join("wide.sh");
    std::fs::write(&sh, script).unwrap();
    let log = common::boot_kernel(&kr, &[pass], &disks, &sh);
    let shas = common::tagged_lines(&log, "SHA");
    for name in PLAIN.iter().map(|c| c.0).chain(["luks2-adiantum"]) {
        assert_eq!(shas.get(name), Some(&want), "{name}: the kernel read other data");
    }
}
