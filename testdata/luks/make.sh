#!/bin/sh
# Regenerates the golden LUKS headers used by crates/formats/tests/formats/luks_golden.rs.
# Needs cryptsetup (2.6 was used: no root or device-mapper needed for luksFormat on files).
# Each *.hdr is the metadata prefix of a cryptsetup-made image (LUKS1: the 1024-byte phdr;
# LUKS2: both metadata copies, 2 x hdr_size bytes); each *.dump is `cryptsetup luksDump`
# of the full image, which the test parses and compares field by field.
set -eu
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'sealdisk-golden' > "$tmp/key"
printf 'sealdisk-golden-2' > "$tmp/key2"
fast="--pbkdf-force-iterations 1000 --batch-mode --key-file $tmp/key"

mk() { # name size
  rm -f "$tmp/$1.img"; truncate -s "$2" "$tmp/$1.img"
}
save() { # name bytes
  head -c "$2" "$tmp/$1.img" > "$1.hdr"
  cryptsetup luksDump "$tmp/$1.img" | sed "s|$tmp/||" > "$1.dump"
}

# LUKS2, PBKDF2, aes-xts-plain64 512-bit key, 512-byte sectors, label and subsystem.
mk luks2-pbkdf2-xts512 20M
cryptsetup luksFormat --type luks2 --pbkdf pbkdf2 $fast --cipher aes-xts-plain64 --key-size 512 \
  --sector-size 512 --label golden-label --subsystem golden-sub \
  --uuid 6b2f4a52-0c5e-4d36-9a36-1f3d5f3e0a01 "$tmp/luks2-pbkdf2-xts512.img"
save luks2-pbkdf2-xts512 32768

# LUKS2, Argon2id keyslot 0 + PBKDF2-sha512 keyslot 3, 4096-byte sectors, 64 KiB metadata,
# a token and a keyslot priority.
mk luks2-argon2id-4k-64k 20M
cryptsetup luksFormat --type luks2 --pbkdf argon2id --pbkdf-force-iterations 4 --pbkdf-memory 32 \
  --pbkdf-parallel 1 --batch-mode --key-file "$tmp/key" --sector-size 4096 \
  --luks2-metadata-size 64k --luks2-keyslots-size 1m --offset 8192 \
  --uuid 6b2f4a52-0c5e-4d36-9a36-1f3d5f3e0a02 "$tmp/luks2-argon2id-4k-64k.img"
cryptsetup luksAddKey --pbkdf pbkdf2 --hash sha512 --pbkdf-force-iterations 1000 --key-slot 3 \
  --key-file "$tmp/key" --new-keyfile "$tmp/key2" "$tmp/luks2-argon2id-4k-64k.img"
printf '{"type":"sealdisk-test","keyslots":["3"],"opaque":{"nested":[1,2,3]},"blob":"AAEC"}' > "$tmp/tok.json"
cryptsetup token import --json-file "$tmp/tok.json" --token-id 5 "$tmp/luks2-argon2id-4k-64k.img"
cryptsetup config --priority prefer --key-slot 3 "$tmp/luks2-argon2id-4k-64k.img"
save luks2-argon2id-4k-64k 131072

# LUKS2, aes-cbc-essiv:sha256 256-bit key, PBKDF2.
mk luks2-cbc-essiv 20M
cryptsetup luksFormat --type luks2 --pbkdf pbkdf2 $fast --cipher aes-cbc-essiv:sha256 --key-size 256 \
  --uuid 6b2f4a52-0c5e-4d36-9a36-1f3d5f3e0a03 "$tmp/luks2-cbc-essiv.img"
save luks2-cbc-essiv 32768

# LUKS1, aes-xts-plain64 512-bit key, sha256, keyslots 0 and 2.
mk luks1-xts512 4M
cryptsetup luksFormat --type luks1 $fast --cipher aes-xts-plain64 --key-size 512 --hash sha256 \
  --uuid 6b2f4a52-0c5e-4d36-9a36-1f3d5f3e0a04 "$tmp/luks1-xts512.img"
cryptsetup luksAddKey --pbkdf-force-iterations 1000 --key-slot 2 --key-file "$tmp/key" \
  --new-keyfile "$tmp/key2" "$tmp/luks1-xts512.img"
save luks1-xts512 1024

# LUKS1, aes-cbc-essiv:sha256 256-bit key, sha1.
mk luks1-cbc-essiv-sha1 4M
cryptsetup luksFormat --type luks1 $fast --cipher aes-cbc-essiv:sha256 --key-size 256 --hash sha1 \
  --uuid 6b2f4a52-0c5e-4d36-9a36-1f3d5f3e0a05 "$tmp/luks1-cbc-essiv-sha1.img"
save luks1-cbc-essiv-sha1 1024
