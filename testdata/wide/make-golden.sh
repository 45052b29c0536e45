#!/bin/bash
# Regenerates the kernel-made Adiantum and ESSIV golden images used by
# crates/sector-crypto/tests/sector-crypto/wide_golden.rs and crates/volume/tests/volume/wide_luks_golden.rs.
# One boot of the real kernel (Linux 6.1 dm-crypt, cryptsetup 2.6.1) through
# /work/shared/oracle/kernel-run (or $KERNEL_RUN): for each case the kernel maps the image
# with dm-crypt, writes pattern.bin (64 KiB) through it and prints the sha256 it reads back.
#
#   plain-essiv-*: aes-cbc-essiv:<hash> (kernel hash names) for the ESSIV hashes beyond sha256
#            (not sm3: the Debian 6.1 cloud kernel is built without it).
#   plain-*: bare dm-crypt tables, `0 128 crypt <cipher> <key> <iv_offset> /dev/vdX 0 [1 sector_size:4096]`
#            over 64 KiB images; the key is key32.bin (key16.bin for the AES-128 HCTR2 case).
#   luks2-*: cryptsetup luksFormat --type luks2 --cipher <cipher> --volume-key-file key32.bin
#            --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --offset 512 (passphrase pass.txt);
#            cryptsetup open, then the pattern at the start of the data segment.
# The transcript goes to boot.log ("SHA <name> <hex>" lines); images to <name>.img.xz.
set -euo pipefail
cd "$(dirname "$0")"
KR=${KERNEL_RUN:-/work/shared/oracle/kernel-run}
# No HCTR2 here: Debian builds its kernels (6.1 cloud and 6.12 alike) without
# CONFIG_CRYPTO_HCTR2, so dm-crypt cannot allocate hctr2(aes) ("reload ioctl failed: No such
# file or directory"); HCTR2 is checked against its authors' vectors instead.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f' | xxd -r -p > key32.bin
head -c 16 key32.bin > key16.bin
printf 'sealdisk-wide' > pass.txt
# 64 KiB: 512-byte sector s holds 32 lines "W%011d:%02d\n".
awk 'BEGIN { for (s = 0; s < 128; s++) for (r = 0; r < 32; r++) printf "W%011d:%02d\n", s, r }' > pattern.bin

# name | cipher | key file | sector size | iv_offset
CASES="plain-adiantum12-s512|xchacha12,aes-adiantum-plain64|key32.bin|512|0
plain-adiantum20-s512-ivoff|xchacha20,aes-adiantum-plain64|key32.bin|512|1000
plain-adiantum12-capi-s4096|capi:adiantum(xchacha12,aes)-plain64|key32.bin|4096|0
plain-essiv-md5|aes-cbc-essiv:md5|key32.bin|512|0
plain-essiv-sha3-256|aes-cbc-essiv:sha3-256|key32.bin|512|0
plain-essiv-md4|aes-cbc-essiv:md4|key16.bin|512|0
plain-essiv-blake2b-256|aes-cbc-essiv:blake2b-256|key32.bin|512|0
plain-essiv-streebog256|aes-cbc-essiv:streebog256|key32.bin|512|0
plain-essiv-wp256|aes-cbc-essiv:wp256|key32.bin|512|0"
LUKS="luks2-adiantum12|xchacha12,aes-adiantum-plain64"

disks=()
echo "$CASES" > "$tmp/cases"
echo "$LUKS" > "$tmp/luks"
while IFS='|' read -r name _; do truncate -s 64K "$tmp/$name.img"; disks+=(--disk "$tmp/$name.img"); done <<< "$CASES"
while IFS='|' read -r name _; do truncate -s 320K "$tmp/$name.img"; disks+=(--disk "$tmp/$name.img"); done <<< "$LUKS"

cat > "$tmp/guest.sh" <<'GUEST'
#!/bin/bash
set -euo pipefail
cd /kr
set -- $KR_DISKS
while IFS='|' read -r name cipher keyf ss ivoff; do
  dev=$1; shift
  key=$(xxd -p -c 64 "$keyf")
  opt=""; [ "$ss" = 4096 ] && opt=" 1 sector_size:4096"
  dmsetup create w --table "0 128 crypt $cipher $key $ivoff $dev 0$opt"
  echo "TABLE $name $(dmsetup table --showkeys w)"
  dd if=pattern.bin of=/dev/mapper/w bs=4096 oflag=direct status=none
  sync
  echo "SHA $name $(head -c 65536 /dev/mapper/w | sha256sum | cut -d' ' -f1)"
  dmsetup remove w
done < cases
while IFS='|' read -r name cipher; do
  dev=$1; shift
  cryptsetup luksFormat --type luks2 --batch-mode --cipher "$cipher" --key-size 256 \
    --volume-key-file key32.bin --key-file pass.txt --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --offset 512 --luks2-metadata-size 16k --luks2-keyslots-size 128k "$dev" 2>&1 | grep -v WARNING || true
  cryptsetup open --key-file pass.txt "$dev" w
  echo "TABLE $name $(dmsetup table --showkeys w)"
  dd if=pattern.bin of=/dev/mapper/w bs=4096 oflag=direct status=none
  sync
  echo "SHA $name $(head -c 65536 /dev/mapper/w | sha256sum | cut -d' ' -f1)"
  cryptsetup close w
done < luks
GUEST
"$KR" --file key32.bin --file key16.bin --file pass.txt --file pattern.bin --file "$tmp/cases" --file "$tmp/luks" \
  "${disks[@]}" "$tmp/guest.sh" > boot.log 2> kernel-run.log
cat boot.log
while IFS='|' read -r name _; do xz -9 -c "$tmp/$name.img" > "$name.img.xz"; done <<< "$CASES"
while IFS='|' read -r name _; do xz -9 -c "$tmp/$name.img" > "$name.img.xz"; done <<< "$LUKS"
