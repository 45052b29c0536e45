#!/bin/bash
# Regenerates the dm-crypt golden images in this directory with the REAL Linux
# dm-crypt (one boot of /work/shared/oracle/kernel-run), see README.md.
#
#   testdata/dm-crypt/make-golden.sh            # rewrite images, cases.tsv, probes.tsv, kernel-run.log
#
# Layout: one scratch disk (/dev/vda in the guest) holds one region per case.
# For every case the guest creates
#   golden-src   = dm-linear over the case's region (byte-identical to <name>.img)
#   golden-crypt = the dm-crypt table recorded in cases.tsv, on top of golden-src
# writes the deterministic plaintext through golden-crypt with O_DIRECT + fsync,
# reads it back (cmp), and removes both devices.  The host then carves each region
# out of the scratch disk into <name>.img.  Probe rows (probes.tsv) are tables we
# expect or suspect the kernel to refuse; the kernel's answer is recorded, no image.
#
# Deterministic inputs (the Rust test regenerates them the same way):
#   plaintext = SHA256("sealdisk dm-crypt golden plaintext block 0")
#            || SHA256("sealdisk dm-crypt golden plaintext block 1") || ...
#   key(name, bits) = (SHA256("sealdisk dm-crypt golden key <name> 0")
#                   || SHA256("sealdisk dm-crypt golden key <name> 1"))[0 .. bits/8]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
KR=${KERNEL_RUN:-/work/shared/oracle/kernel-run}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

SRC=/dev/mapper/golden-src
PLAIN_LEN=262144          # longest payload (volume cases)

sha() { printf '%s' "$1" | sha256sum | cut -c1-64; }
keyhex() { # name bits
    local h
    h=$(sha "sealdisk dm-crypt golden key $1 0")$(sha "sealdisk dm-crypt golden key $1 1")
    printf '%s' "${h:0:$(($2 / 4))}"
}
tag_of() { # cipher -> file-name-safe tag
    local t=$1
    t=${t#aes-}; t=${t/capi:xts(aes)/capi-xts}; t=${t/cipher_null/null}; t=${t/:/-}
    printf '%s' "$t"
}

# ---------------------------------------------------------------- case list
PLAN=$work/plan.txt      # kind|name|base|region_sectors|table|cipher|key|bits|ivo|off|ss|ivl|paylen
: > "$PLAN"
next_base=2048           # 1 MiB in; regions 4 KiB aligned

add() { # kind cipher bits iv_offset offset sector_size ivl [payload_bytes] [name] [key_override]
    local kind=$1 cipher=$2 bits=$3 ivo=$4 off=$5 ss=$6 ivl=$7 pay=${8:-} name=${9:-} key=${10:-}
    if [ -z "$pay" ]; then
        if [ "$ss" -ge 4096 ]; then pay=16384; else pay=8192; fi
    fi
    if [ -z "$name" ]; then
        name="$(tag_of "$cipher")-k$bits-ss$ss"
        [ "$ivl" = 1 ] && name+="-ivl"
        [ "$ivo" != 0 ] && name+="-ivo$ivo"
        [ "$off" != 0 ] && name+="-off$off"
        [ "$kind" = volume ] && name="vol-$name"
    fi
    if [ -z "$key" ]; then
        if [ "$bits" = 0 ]; then key=-; else key=$(keyhex "$name" "$bits"); fi
    fi
    local paysec=$((pay / 512)) opts=() table
    [ "$ss" != 512 ] && opts+=("sector_size:$ss")
    [ "$ivl" = 1 ] && opts+=("iv_large_sectors")
    table="0 $paysec crypt $cipher $key $ivo $SRC $off"
    [ ${#opts[@]} -gt 0 ] && table+=" ${#opts[@]} ${opts[*]}"
    local region=$((off + paysec))
    echo "$kind|$name|$next_base|$region|$table|$cipher|$key|$bits|$ivo|$off|$ss|$ivl|$pay" >> "$PLAN"
    next_base=$(( (next_base + region + 7) / 8 * 8 ))
}

full() { # cipher bits : 512, then 1024/2048/4096 without and with iv_large_sectors
    add sector "$1" "$2" 0 0 512 0
    local ss
    for ss in 1024 2048 4096; do
        add sector "$1" "$2" 0 0 "$ss" 0
        add sector "$1" "$2" 0 0 "$ss" 1
    done
}
small() { # cipher bits : 512, 4096, 4096+iv_large_sectors
    add sector "$1" "$2" 0 0 512 0
    add sector "$1" "$2" 0 0 4096 0
    add sector "$1" "$2" 0 0 4096 1
}

BIG=72623859790382856            # 0x0102030405060708: every IV byte distinct
NEAR32=4294967288                # 2^32 - 8: 32-bit 'plain' IV wraps inside the payload
MAX64=18446744073709551608       # 2^64 - 8: iv_sector = sector + iv_offset wraps mod 2^64

# every IV generator x sector size
full  aes-xts-plain64 512
small aes-xts-plain64 256
add sector aes-xts-plain64 512 0 0 512 1            # iv_large_sectors with 512 (no-op)
full  aes-xts-plain 256
full  aes-xts-plain64be 256
full  aes-cbc-essiv:sha256 128
small aes-cbc-essiv:sha256 256
full  aes-cbc-plain64 256
full  aes-cbc-plain 128
for ss in 512 1024 2048 4096; do add sector aes-cbc-null 256 0 0 "$ss" 0; done
full  aes-cbc-eboiv 256
add sector aes-cbc-eboiv 128 0 0 512 0
add sector aes-cbc-eboiv 128 0 0 4096 1
add sector aes-ecb 256 0 0 512 0
add sector aes-ecb 256 0 0 4096 0
add sector cipher_null-ecb 0 0 0 512 0
add sector cipher_null-ecb 0 0 0 4096 0
small 'capi:xts(aes)-plain64' 512

# nonzero iv_offset
add sector aes-xts-plain64 512 8 0 512 0
add sector aes-xts-plain64 512 8 0 4096 0
add sector aes-xts-plain64 512 8 0 4096 1
add sector aes-cbc-plain64 256 8 0 4096 1
add sector aes-xts-plain64 512 $NEAR32 0 512 0
add sector aes-xts-plain64 512 $NEAR32 0 4096 1
add sector aes-xts-plain 256 $NEAR32 0 512 0
add sector aes-xts-plain 256 $NEAR32 0 4096 0
add sector aes-xts-plain 256 $NEAR32 0 4096 1
add sector aes-cbc-plain 128 $NEAR32 0 512 0
add sector aes-cbc-plain 128 $NEAR32 0 2048 0
add sector aes-xts-plain64 512 $BIG 0 512 0
add sector aes-xts-plain64be 256 $BIG 0 512 0
add sector aes-xts-plain64be 256 $BIG 0 4096 1
add sector aes-cbc-essiv:sha256 128 $BIG 0 512 0
add sector aes-cbc-eboiv 256 $BIG 0 512 0
add sector aes-cbc-eboiv 256 $BIG 0 4096 0      # iv_sector * 4096 wraps mod 2^64
add sector aes-cbc-eboiv 256 $BIG 0 4096 1
add sector aes-xts-plain64 512 $MAX64 0 512 0
add sector aes-cbc-plain64 256 $MAX64 0 4096 1
# nonzero offset (data start on the device); the kernel refuses an offset that is
# not a multiple of sector_size/512 (see the probe-off* rows)
add sector aes-xts-plain64 512 0 1 512 0
add sector aes-xts-plain64 512 0 24 4096 0
add sector aes-cbc-essiv:sha256 128 16 8 4096 1
add sector aes-cbc-eboiv 256 2 6 1024 0
add sector 'capi:xts(aes)-plain64' 512 0 8 4096 0

# whole volumes for the CryptTarget / CLI level
add volume aes-xts-plain64 512 0 8 4096 0 262144
add volume aes-xts-plain64 512 2048 8 512 0 131072

# probes: tables the kernel may refuse; recorded in probes.tsv, no image kept
probe() { add probe "$@"; }
probe aes-xts-plain64 512 1 0 4096 0 16384 probe-ivo1-ss4096
probe aes-xts-plain64 512 4 0 4096 1 16384 probe-ivo4-ss4096-ivl
probe aes-xts-plain64 512 4 0 1024 0 8192 probe-ivo4-ss1024
probe aes-xts-plain64 512 0 0 4096 0 4608 probe-len9-ss4096
probe aes-xts-plain64 512 0 3 4096 0 16384 probe-off3-ss4096
probe aes-cbc-eboiv 256 2 5 1024 0 8192 probe-off5-ss1024
probe aes-xts-plain64 512 0 0 8192 0 16384 probe-ss8192
probe aes-xts-plain64 512 0 0 256 0 8192 probe-ss256
probe aes-xts-plain64 512 0 0 1536 0 6144 probe-ss1536
probe aes-xts-plain64 128 0 0 512 0 8192 probe-xts-k128
probe aes-xts-plain64 384 0 0 512 0 8192 probe-xts-k384
probe aes-xts-plain64 512 0 0 512 0 8192 probe-xts-equal-halves \
    000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
probe aes-cbc-plain64 192 0 0 512 0 8192 probe-cbc-k192
probe aes-cbc-plain64 200 0 0 512 0 8192 probe-cbc-k200
probe cipher_null-ecb 256 0 0 512 0 8192 probe-null-with-key
probe aes-ecb-plain64 256 0 0 512 0 8192 probe-ecb-with-ivmode
probe aes-cbc 256 0 0 512 0 8192 probe-cbc-no-ivmode
probe aes 256 0 0 512 0 8192 probe-bare-aes
probe aes-cbc-essiv 256 0 0 512 0 8192 probe-essiv-no-hash
probe aes-cbc-essiv:nosuchhash 256 0 0 512 0 8192 probe-essiv-bad-hash
probe aes-xts-eboiv 512 0 0 512 0 8192 probe-xts-eboiv
probe aes-xts-null 512 0 0 512 0 8192 probe-xts-null
probe aes-cbc-plain64be 256 0 0 512 0 8192 probe-cbc-plain64be
probe aes-xts-essiv:sha256 512 0 0 512 0 8192 probe-xts-essiv
probe aes-cbc-nosuchiv 256 0 0 512 0 8192 probe-bad-ivmode
probe 'capi:cbc(aes)-essiv:sha256' 256 0 0 512 0 8192 probe-capi-cbc-essiv
probe 'capi:xts(aes)-plain64be' 512 0 0 512 0 8192 probe-capi-xts-plain64be
probe aes-xts-plain64 512 18446744073709551615 0 512 0 8192 probe-ivo-u64max
probe aes-xts-plain64 512 18446744073709551616 0 512 0 8192 probe-ivo-2p64

if [ -n "${DRY_RUN:-}" ]; then cat "$PLAN"; exit 0; fi   # DRY_RUN=1: print the plan only

disk_bytes=$(( (next_base * 512 + 1048575) / 1048576 * 1048576 ))
truncate -s "$disk_bytes" "$work/disk.img"

# ---------------------------------------------------------------- plaintext
python3 - "$work/plain.bin" "$PLAIN_LEN" <<'EOF'
import hashlib, sys
path, n = sys.argv[1], int(sys.argv[2])
out = b"".join(hashlib.sha256(b"sealdisk dm-crypt golden plaintext block %d" % i).digest()
               for i in range((n + 31) // 32))[:n]
open(path, "wb").write(out)
EOF

# ---------------------------------------------------------------- guest script
cat > "$work/guest.sh" <<'EOF'
#!/bin/bash
set -uo pipefail
echo "UNAME|$(uname -r)|$(uname -v)"
echo "DMVERSION|$(dmsetup version | tr '\n' ' ')"
echo "TARGET|$(dmsetup targets | grep -E '^(crypt|linear)' | tr '\n' ' ')"
fail=0
while IFS='|' read -r kind name base region table cipher key bits ivo off ss ivl pay; do
    dmesg -c > /dev/null 2>&1 || true
    if ! dmsetup create golden-src --table "0 $region linear /dev/vda $base" 2> /tmp/err; then
        echo "ERROR|$name|golden-src: $(tr '\n' ' ' < /tmp/err)"; fail=1; continue
    fi
    if dmsetup create golden-crypt --table "$table" 2> /tmp/err; then
        ktable=$(dmsetup table --showkeys golden-crypt)
        warn=$(dmesg | grep -E 'crypt|device-mapper' | tr '\n' ' ')
        if dd if=/kr/plain.bin of=/dev/mapper/golden-crypt bs="$pay" count=1 \
                oflag=direct conv=fsync status=none 2> /tmp/err &&
            cmp -n "$pay" /kr/plain.bin /dev/mapper/golden-crypt > /tmp/err 2>&1; then
            echo "OK|$name|$ktable|$warn"
        else
            echo "IOFAIL|$name|$(tr '\n' ' ' < /tmp/err)|$(dmesg | tail -n 3 | tr '\n' ' ')"
            [ "$kind" = probe ] || fail=1
        fi
        dmsetup remove golden-crypt || fail=1
    else
        echo "REFUSED|$name|$(tr '\n' ' ' < /tmp/err)|$(dmesg | grep -E 'crypt|device-mapper|table' | tr '\n' ' ')"
        [ "$kind" = probe ] || fail=1
    fi
    dmsetup remove golden-src || fail=1
done < /kr/plan.txt
sync
echo "DONE|$fail"
exit $fail
EOF

# ---------------------------------------------------------------- run (one boot)
echo "make-golden: $(wc -l < "$PLAN") cases, scratch disk $disk_bytes bytes" >&2
set +e
"$KR" --timeout 900 --file "$PLAN" --file "$work/plain.bin" --disk "$work/disk.img" \
    "$work/guest.sh" > "$work/out.txt" 2> "$work/kr-status.txt"
rc=$?
set -e
cp "$work/out.txt" "$here/kernel-run.log"
cat "$work/kr-status.txt" >&2
if [ $rc != 0 ]; then
    echo "make-golden: kernel-run failed with status $rc; guest output:" >&2
    grep -vE '^(OK|REFUSED)\|probe-' "$work/out.txt" | grep -vE '^OK\|' >&2 || true
    exit 1
fi

# ---------------------------------------------------------------- carve + manifest
rm -f "$here"/*.img
kver=$(awk -F'|' '$1=="UNAME"{print $2}' "$work/out.txt")
{
    printf '# generated by make-golden.sh on %s from Linux %s; columns: see README.md\n' \
        "$(date -u +%Y-%m-%d)" "$kver"
    printf '#file\tkind\tcipher\tkey_hex\tkey_bits\tiv_offset\toffset\tsector_size\tiv_large_sectors\tpayload_len\ttable\tsha256\n'
} > "$here/cases.tsv"
{
    printf '# generated by make-golden.sh on %s from Linux %s; columns: see README.md\n' \
        "$(date -u +%Y-%m-%d)" "$kver"
    printf '#name\tresult\ttable\tkernel_reply\tkernel_log\n'
} > "$here/probes.tsv"

while IFS='|' read -r kind name base region table cipher key bits ivo off ss ivl pay; do
    line=$(grep -F "|$name|" "$work/out.txt" | grep -E '^(OK|REFUSED|IOFAIL|ERROR)\|' | head -n 1)
    status=${line%%|*}
    if [ "$kind" = probe ]; then
        rest=${line#*|*|}
        a=${rest%%|*}
        b=$(printf '%s' "${rest#*|}" | sed -E 's/\[ *[0-9.]+\] //g; s/ +$//')
        case $status in
            OK) status=accepted ;;
            REFUSED) status=refused ;;
        esac
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$table" "${a% }" "$b" >> "$here/probes.tsv"
        continue
    fi
    [ "$status" = OK ] || { echo "make-golden: case $name: $line" >&2; exit 1; }
    dd if="$work/disk.img" of="$here/$name.img" bs=512 skip="$base" count="$region" status=none
    sum=$(sha256sum < "$here/$name.img" | cut -c1-64)
    printf '%s.img\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$name" "$kind" "$cipher" "$key" "$bits" "$ivo" "$off" "$ss" "$ivl" "$pay" "$table" "$sum" \
        >> "$here/cases.tsv"
done < "$PLAN"

{
    echo "# guest output of make-golden.sh (kernel-run), $(date -u +%Y-%m-%dT%H:%MZ)"
    cat "$work/out.txt"
    echo "# kernel-run status lines"
    cat "$work/kr-status.txt"
} > "$here/kernel-run.log"
echo "make-golden: wrote $(($(wc -l < "$here/cases.tsv") - 2)) images, $(($(wc -l < "$here/probes.tsv") - 2)) probes; $(du -sh "$here" | cut -f1) total" >&2
