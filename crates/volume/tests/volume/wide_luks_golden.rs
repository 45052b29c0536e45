//! A LUKS2 volume with Adiantum (`xchacha12,aes-adiantum-plain64`) made by the real kernel's
//! cryptsetup (Linux 6.1, cryptsetup 2.6.1; `testdata/wide/make-golden.sh`): the keyslot
//! area and the data segment are both Adiantum. sealdisk opens it with the passphrase,
//! recovers the volume key given to cryptsetup and reads the pattern the kernel wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use blockdev::BlockDevice;
use sector_crypto::kdf::Passphrase;
use sha2::{Digest, Sha256};
use volume::luks::{self, OpenParams};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/wide")
}

#[test]
fn kernel_made_luks2_adiantum_opens_and_reads_the_kernels_data() {
    let name = "luks2-adiantum12";
    let out = match Command::new("xz").arg("-dc").arg(dir().join(format!("{name}.img.xz"))).output() {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => panic!("xz -dc {name}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("SKIPPED: cannot run xz ({e})");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("img");
    std::fs::write(&img, out).unwrap();
    let pattern = std::fs::read(dir().join("pattern.bin")).unwrap();
    let log = std::fs::read_to_string(dir().join("boot.log")).unwrap();
    let sha = log.lines().find_map(|l| l.strip_prefix(&format!("SHA {name} "))).unwrap();
    assert_eq!(sha, hex::encode(Sha256::digest(&pattern)), "the kernel read back something else");

    let pass = Passphrase::new(std::fs::read(dir().join("pass.txt")).unwrap());
    let opened = luks::open(&OpenParams::new(img.to_str().unwrap()), &pass).unwrap();
    assert_eq!(
        &opened.volume.crypt_table().unwrap().key[..],
        &std::fs::read(dir().join("key32.bin")).unwrap()[..]
    );
    assert!(opened.volume.crypt_table().unwrap().to_string().contains(" xchacha12,aes-adiantum-plain64 "));
    let mut back = vec![0u8; pattern.len()];
    opened.volume.device.read_at(0, &mut back).unwrap();
    assert!(back == pattern, "the kernel's pattern differs");
}
