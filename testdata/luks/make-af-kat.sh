#!/bin/sh
# Regenerates the AF splitter known-answer images used by
# crates/sector-crypto/tests/sector-crypto/luks_af_kat.rs. Needs cryptsetup (2.6 was used; no root).
# Each af-*.img is a cryptsetup-made LUKS1 image cut right after keyslot 0's key material
# (phdr, padding, the encrypted AF-split volume key); af-*.key is the volume key that
# `cryptsetup luksDump --dump-volume-key` prints for it. The passphrase is "sealdisk-af".
# The three cases cover the three ways diffuse() chunks a key: SHA-1 over a 32-byte key
# (20 + 12 bytes), SHA-512 over a 16-byte key (one truncated chunk), SHA-256 over a 64-byte
# key (two whole chunks).
set -eu
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'sealdisk-af' > "$tmp/pass"

mk() { # name hash cipher key-bits
  truncate -s 4M "$tmp/$1.img"
  cryptsetup luksFormat --type luks1 --batch-mode --key-file "$tmp/pass" --pbkdf-force-iterations 1000 \
    --hash "$2" --cipher "$3" --key-size "$4" "$tmp/$1.img"
  cryptsetup luksDump --dump-volume-key --batch-mode --key-file "$tmp/pass" "$tmp/$1.img" \
    | sed -n '/MK dump:/,$p' | sed 's/MK dump://' | tr -d ' \t\n' > "$1.key"
  echo >> "$1.key"
  # Keyslot 0 starts at sector 8; its material is ceil(key bytes * 4000 / 512) sectors.
  sectors=$(( ($4 / 8 * 4000 + 511) / 512 ))
  head -c $(( (8 + sectors) * 512 )) "$tmp/$1.img" > "$1.img"
}

mk af-sha1-cbc256 sha1 aes-cbc-essiv:sha256 256
mk af-sha512-cbc128 sha512 aes-cbc-essiv:sha256 128
mk af-sha256-xts512 sha256 aes-xts-plain64 512
