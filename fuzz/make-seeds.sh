#!/usr/bin/env bash
# Rebuilds fuzz/seeds/<target>/ for the format targets from testdata/ (headers made by
# cryptsetup, superblocks and journals made by the kernel, table lines of the kernel golden
# set), cut to the bytes each decoder reads. The NBD seeds are made by
# `SEALDISK_WRITE_SEEDS=1 cargo test -p nbd --test nbd fuzz_corpus::`.
# No pipefail: `head -c` ends its producers early by design.
set -eu
cd "$(dirname "$0")/.."
S=fuzz/seeds
T=testdata

mkdir -p $S/luks1_header $S/luks2_header $S/dm_table $S/integrity_superblock \
    $S/integrity_journal $S/integrity_open

# LUKS1: the 1 KiB phdr files.
for f in $T/luks/luks1-*.hdr; do cp "$f" "$S/luks1_header/$(basename "$f" .hdr).bin"; done

# LUKS2: the whole headers with 16 KiB metadata, and their JSON areas alone up to the NUL
# that ends them. (json-area-argon2id-token.bin, a JSON area with an argon2id keyslot and a
# token, is kept as committed.)
for f in $T/luks/luks2-cbc-essiv.hdr $T/luks/luks2-pbkdf2-xts512.hdr; do
    cp "$f" "$S/luks2_header/$(basename "$f" .hdr).bin"
    tail -c +4097 "$f" | head -c 12288 | tr -d '\000' > "$S/luks2_header/json-$(basename "$f" .hdr).bin"
done

# dm table lines: the kernel golden cases (one line each, distinct option sets), and a few
# written by hand for the options and forms the golden set lacks.
awk -F'\t' '!/^#/ && $11 != "" { print $11 }' $T/dm-crypt/cases.tsv | sort -u -t' ' -k10 |
    head -n 12 | nl -nrz -w2 | while read -r n line; do printf '%s\n' "$line" > "$S/dm_table/kernel-$n.txt"; done
printf '0 8 crypt cipher_null-ecb - 0 /dev/x 0\n' > $S/dm_table/null-cipher.txt
printf '0 60647424 crypt capi:xts(aes)-plain64 %s 0 /path/to/dev 32768 3 allow_discards no_read_workqueue no_write_workqueue\n' \
    "$(printf '%064x' 0)" > $S/dm_table/capi-options.txt
printf '0 64 crypt aes-cbc-essiv:sha256 %s 8 /dev/x 0 5 sector_size:4096 iv_large_sectors same_cpu_crypt submit_from_crypt_cpus no_write_workqueue\n' \
    "$(printf '%032x' 7)" > $S/dm_table/essiv-all-options.txt

# dm-integrity superblock areas (4 KiB) of kernel-formatted images, one per distinct
# geometry; two also carry device parameters (28 bytes, see formats::fuzzing).
for name in crc32c-j-s512 crc32c-j-s4096 crc32c-b-s512-il64 hmac-sha256-b-s4096-il64 sha256-t12-b-s512 \
    crc32c-j-s512-legacy-il8 crc32c-j-s512-open; do
    xz -dc "$T/integrity/$name.img.xz" | head -c 4096 > "$S/integrity_superblock/$name.bin"
done
for name in crc32c-j-s512 hmac-sha256-b-s4096-il64; do
    { xz -dc "$T/integrity/$name.img.xz" | head -c 4096
      printf '\000\010\000\000\000\000\000\000\000\000\000\000\000\000\000\000\200\000\000\000\000\000\000\000\000\000\000\000'; } \
        > "$S/integrity_superblock/$name-dev2048.bin"
done

# A journal with committed entries, from the kernel image left open with its journal
# committed but not copied out (crc32c-j-s512-open: 11 sections of 88 KiB; section 7 holds
# 64 committed writes of sectors 0..63). Cut to one section: section 7 becomes section 0 of
# a 1-section journal (the commit ids carry their section's index, XORed in as
# le64(section << 32 ^ sector): re-XOR them), and the superblock says 1 section.
xz -dc $T/integrity/crc32c-j-s512-open.img.xz | python3 -c '
import struct, sys
img = sys.stdin.buffer.read()
sec = 176 * 512
s7 = bytearray(img[4096 + 7 * sec : 4096 + 8 * sec])
for j in range(176):
    off = j * 512 + 504
    (cid,) = struct.unpack_from("<Q", s7, off)
    struct.pack_into("<Q", s7, off, cid ^ (7 << 32))
sb = bytearray(img[:4096])
struct.pack_into("<I", sb, 12, 1)
# The 8-byte head of integrity_journal: tag 4, 512-byte blocks, no MAC, mode J, 1 section,
# 2048 provided sectors.
open(sys.argv[1], "wb").write(bytes([4, 0, 2, 1]) + struct.pack("<I", 2048) + bytes(s7))
open(sys.argv[2], "wb").write(bytes(sb) + bytes(s7))
' $S/integrity_journal/kernel-open-section7.bin $S/integrity_open/crc32c-j-s512-open-1section.bin

# The bitmap-mode image left open (DIRTY_BITMAP set), cut after its one-section journal area,
# opened in mode B (byte 4095 = 1).
xz -dc $T/integrity/crc32c-b-s512-open.img.xz | head -c 94208 |
    python3 -c 'import sys; b=bytearray(sys.stdin.buffer.read()); b[4095]=1; sys.stdout.buffer.write(b)' \
    > $S/integrity_open/crc32c-b-s512-open-mode-b.bin

# TrueCrypt/VeraCrypt: decrypted headers (as a KDF and cipher trial leaves them) followed by
# a little-endian device size: a TrueCrypt 7 header, a VeraCrypt hidden-volume header, a
# version-3 one (no header CRC) and a system-encryption header.
mkdir -p $S/tcrypt_header
python3 - "$S/tcrypt_header" <<'PY'
import struct, sys, zlib
def hdr(magic, version, hidden, volume, mk, flags, sector, size):
    b = bytearray(448)
    b[0:4] = magic
    struct.pack_into('>HH', b, 4, version, 0x0700)
    b[192:448] = bytes((i * 7 + 3) & 255 for i in range(256))
    struct.pack_into('>I', b, 8, zlib.crc32(bytes(b[192:448])))
    struct.pack_into('>QQQQII', b, 28, hidden, volume, mk, volume, flags, sector)
    if version > 3:
        struct.pack_into('>I', b, 188, zlib.crc32(bytes(b[0:188])))
    return bytes(b) + struct.pack('<Q', size)
out = sys.argv[1]
for name, h in [
    ('truecrypt7', hdr(b'TRUE', 5, 0, 1835008, 131072, 0, 512, 2097152)),
    ('veracrypt-hidden', hdr(b'VERA', 5, 1048576, 1048576, 2883584, 0, 512, 4194304)),
    ('truecrypt-v3', hdr(b'TRUE', 3, 0, 1048576, 0, 0, 0, 2097152)),
    ('veracrypt-system', hdr(b'VERA', 5, 0, 2097152, 1048576, 1, 512, 3145728)),
]:
    open(f'{out}/{name}.bin', 'wb').write(h)
PY
# FileVault2: cryptsetup's image (testdata/fvault2), its metadata decrypted (needs AES-XTS,
# so the test that checks the image writes them).
SEALDISK_WRITE_SEEDS=1 cargo test -q -p volume --test volume fvault2_golden::fuzz_seeds
# BitLocker (Windows-made images, testdata/bitlk): sector 0, the first FVE metadata block
# cut to 4 KiB (it holds every entry), and a .BEK startup key file.
mkdir -p $S/bitlk_metadata
for n in aes-xts_128 recovery_password startup_key aes_128_diffuser; do
    xz -dc $T/bitlk/$n.img.xz | head -c 512 > "$S/bitlk_metadata/vh-$n.bin"
    off=$(od -An -tu8 -j176 -N8 "$S/bitlk_metadata/vh-$n.bin" | tr -d ' ')
    xz -dc $T/bitlk/$n.img.xz | tail -c +$((off + 1)) | head -c 4096 > "$S/bitlk_metadata/meta-$n.bin"
done
cp $T/bitlk/startup_key.bek "$S/bitlk_metadata/startup_key.bek.bin"
