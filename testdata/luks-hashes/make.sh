#!/bin/sh
# Regenerates the per-hash LUKS golden images used by crates/volume/tests/volume/luks_hashes_golden.rs.
# Needs cryptsetup (2.6.1, OpenSSL 3 backend, was used; no root, no device-mapper) and openssl.
#
# For every hash Debian's cryptsetup accepts, one LUKS1 image (hashes of at least 20 bytes)
# and one LUKS2 image: luksFormat --hash H --pbkdf pbkdf2 --pbkdf-force-iterations 1000 with
# the fixed volume key vk16.bin (aes-cbc-plain64, 128-bit key: the smallest keyslot), so the
# hash drives the keyslot PBKDF2, the AF splitter and the volume-key digest. After the data
# offset, 16 sectors of pattern.bin encrypted by `openssl enc` (AES-128-CBC, IV = le64(sector))
# with that key: reading it back proves the volume key was recovered through H.
# The passphrase is pass.txt. Output: luks1-<hash>.img.xz, luks2-<hash>.img.xz.
set -eu
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf 'sealdisk-hashes' > pass.txt
printf '000102030405060708090a0b0c0d0e0f' | xxd -r -p > vk16.bin
# 8 KiB pattern: 512-byte sector s holds 32 lines "H%011d:%02d\n".
s=0; : > pattern.bin
while [ $s -lt 16 ]; do r=0; while [ $r -lt 32 ]; do printf 'H%011d:%02d\n' $s $r >> pattern.bin; r=$((r+1)); done; s=$((s+1)); done

# The payload, sector by sector.
: > "$tmp/payload"
s=0
while [ $s -lt 16 ]; do
  iv=$(printf '%02x00000000000000' $s)0000000000000000
  dd if=pattern.bin bs=512 skip=$s count=1 status=none \
    | openssl enc -aes-128-cbc -nopad -K 000102030405060708090a0b0c0d0e0f -iv "$iv" >> "$tmp/payload"
  s=$((s+1))
done

mk() { # type hash
  img="$tmp/$1-$2.img"
  truncate -s 2M "$img"
  if [ "$1" = luks2 ]; then extra="--offset 512 --luks2-metadata-size 16k --luks2-keyslots-size 128k"; else extra=""; fi
  # shellcheck disable=SC2086
  cryptsetup luksFormat --type "$1" --batch-mode --key-file pass.txt --volume-key-file vk16.bin \
    --cipher aes-cbc-plain64 --key-size 128 --hash "$2" --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    $extra "$img"
  if [ "$1" = luks2 ]; then
    off=$(cryptsetup luksDump "$img" | sed -n '/Data segments/,/Keyslots/p' | awk '/offset:/ {print $2; exit}')
    off=$((off / 512))
  else
    off=$(cryptsetup luksDump "$img" | awk -F'\t' '/^Payload offset/ {print $2}')
  fi
  # luksFormat fills the unused keyslot areas with random bytes; nothing reads them, and
  # zeroes keep the images small. Keyslot 0's material is 125 sectors (16 bytes x 4000) at
  # sector 8 (LUKS1) or at 32 KiB (LUKS2, in a 64 KiB area).
  if [ "$1" = luks2 ]; then from=192; else from=133; fi
  dd if=/dev/zero of="$img" bs=512 seek="$from" count=$((off - from)) conv=notrunc status=none
  dd if="$tmp/payload" of="$img" bs=512 seek="$off" conv=notrunc status=none
  truncate -s $(( (off + 16) * 512 )) "$img"
  echo "$1 $2 offset=$off" >&2
  xz -9 -c "$img" > "$1-$2.img.xz"
}

for h in sha1 sha224 sha256 sha384 sha512 sha512-224 sha512-256 sha3-224 sha3-256 sha3-384 sha3-512 \
         ripemd160 whirlpool sm3 blake2b-512 blake2s-256; do
  mk luks1 "$h"
  mk luks2 "$h"
done
# Digests shorter than 20 bytes: LUKS2 only (cryptsetup refuses them for LUKS1).
for h in md5 md4; do
  mk luks2 "$h"
done
