#!/bin/bash
# Regenerates the dm-crypt golden images in this directory with the REAL Linux
# dm-crypt (one boot of /work/shared/oracle/kernel-run), see README.md.
#
#   testdata/dm-crypt-ciphers/make-golden.sh    # rewrite images, cases.tsv, probes.tsv, kernel-run.log
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
#                   || SHA256("sealdisk dm-crypt golden key <name> 1") || ...)[0 .. bits/8]
# Images are stored xz-compressed (<name>.img.xz); cases.tsv names the raw image and its
# SHA-256.  A planned case the kernel refuses is recorded in probes.tsv instead.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
KR=${KERNEL_RUN:-/work/shared/oracle/kernel-run}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

SRC=/dev/mapper/golden-src
PLAIN_LEN=262144          # longest payload (volume cases)

sha() { printf '%s' "$1" | sha256sum | cut -c1-64; }
keyhex() { # name bits: SHA256("... <name> 0") || SHA256("... <name> 1") || ..., cut to bits
    local h='' i=0
    while [ $((${#h} * 4)) -lt "$2" ]; do
        h+=$(sha "sealdisk dm-crypt golden key $1 $i"); i=$((i + 1))
    done
    printf '%s' "${h:0:$(($2 / 4))}"
}
tag_of() { # cipher -> file-name-safe tag
    printf '%s' "$1" | tr ':(),' '----' 
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

# Cipher x chain mode x IV generator space of dm-crypt beyond AES (one boot).
# 16-byte-block ciphers: every chain mode the kernel has templates for.
for c in serpent twofish camellia cast6; do
    add sector "$c-xts-plain64" 512 0 0 512 0
    add sector "$c-xts-plain64" 256 0 0 4096 1
    add sector "$c-cbc-essiv:sha256" 256 0 0 512 0
    add sector "$c-cbc-plain64" 128 0 0 512 0
    add sector "$c-lrw-benbi" 384 0 0 512 0
    add sector "$c-ecb" 256 0 0 512 0
    add sector "$c-ctr-plain64" 256 0 0 512 0
    add sector "$c-pcbc-plain64" 256 0 0 512 0
done
add sector sm4-xts-plain64 256 0 0 512 0
add sector sm4-cbc-plain64 128 0 0 512 0
add sector sm4-cbc-plain64 128 0 0 4096 0
add sector sm4-lrw-benbi 256 0 0 512 0
add sector sm4-ecb 128 0 0 512 0
add sector sm4-ctr-plain64 128 0 0 512 0
add sector sm4-pcbc-plain64 128 0 0 512 0
# AES: modes and key sizes the AES cases in ../dm-crypt do not cover
add sector aes-xts-plain64 384 0 0 512 0
add sector aes-xts-plain64 384 $BIG 0 4096 1
add sector aes-cbc-plain64 192 0 0 512 0
add sector aes-ecb 128 0 0 512 0
add sector aes-lrw-benbi 384 0 0 512 0
add sector aes-lrw-benbi 256 $BIG 0 4096 1
add sector aes-lrw-plain64 320 0 0 512 0
add sector aes-lrw-null 256 0 0 512 0
add sector aes-ctr-plain64 256 0 0 512 0
add sector aes-ctr-plain64 128 $BIG 0 4096 1
add sector aes-ctr-benbi 256 0 0 512 0
add sector aes-pcbc-plain64 256 0 0 512 0
add sector aes-pcbc-essiv:sha256 128 0 0 4096 0
add sector aes-xts-benbi 512 0 0 512 0
# 8-byte-block ciphers (64-bit IVs): cbc, ecb, ctr, pcbc
add sector cast5-cbc-plain64 128 0 0 512 0
add sector cast5-cbc-plain 128 $NEAR32 0 512 0
add sector cast5-cbc-plain64be 128 $BIG 0 512 0
add sector cast5-cbc-benbi 128 $BIG 0 512 0
add sector cast5-cbc-null 128 0 0 512 0
add sector cast5-cbc-plain64 128 0 0 4096 1
add sector cast5-ecb 128 0 0 512 0
add sector cast5-ctr-plain64 128 0 0 512 0
add sector cast5-pcbc-plain64 128 0 0 512 0
add sector blowfish-cbc-plain64 256 0 0 512 0
add sector blowfish-cbc-plain64 448 $BIG 0 4096 0
add sector blowfish-cbc-plain64 128 0 0 512 0
add sector blowfish-cbc-essiv:sha256 256 $BIG 0 512 0
add sector blowfish-cbc-benbi 256 0 0 512 0
add sector blowfish-ecb 256 0 0 512 0
add sector blowfish-ctr-plain64 256 0 0 512 0
add sector blowfish-pcbc-plain64 256 0 0 512 0
add sector des3_ede-cbc-plain64 192 0 0 512 0
add sector des3_ede-cbc-plain64 192 $BIG 0 4096 1
add sector des3_ede-cbc-benbi 192 0 0 512 0
add sector des3_ede-cbc-plain64be 192 0 0 512 0
add sector des3_ede-ecb 192 0 0 512 0
add sector des3_ede-ctr-plain64 192 0 0 512 0
add sector des3_ede-pcbc-plain64 192 0 0 512 0
# other IV generators over other ciphers
add sector serpent-xts-plain64be 512 $BIG 0 512 0
add sector serpent-xts-plain 256 $NEAR32 0 512 0
add sector twofish-cbc-benbi 256 $BIG 0 512 0
add sector twofish-xts-null 512 0 0 512 0
add sector camellia-cbc-plain 256 0 0 512 0
add sector serpent-cbc-eboiv 256 0 0 4096 1
add sector serpent-xts-eboiv 512 $BIG 0 4096 1
add sector twofish-xts-essiv:sha256 512 0 0 512 0
add sector cast5-cbc-eboiv 128 0 0 4096 1
add sector 'capi:xts(serpent)-plain64' 512 0 0 512 0
add sector 'capi:cbc(twofish)-essiv:sha256' 256 0 0 512 0
add sector 'capi:lrw(aes)-benbi' 384 0 0 512 0
add sector 'capi:ctr(camellia)-plain64' 256 0 0 512 0
add sector 'capi:pcbc(cast5)-plain64' 128 0 0 512 0
add sector 'capi:ecb(blowfish)' 256 0 0 512 0
# multi-key (keycount): key = keycount subkeys; sector s uses subkey (s + iv_offset) & (keycount-1)
add sector aes:4-cbc-plain64 1024 0 0 512 0
add sector serpent:2-xts-plain64 1024 8 0 512 0
add sector twofish:2-cbc-essiv:sha256 512 0 0 4096 0
# lmk (loop-AES): v2 without seed (key = keycount keys), v3 with seed (keycount + 1 keys)
add sector aes-cbc-lmk 256 0 0 512 0
add sector aes-cbc-lmk 128 $BIG 0 512 0
add sector aes:64-cbc-lmk 8192 0 0 512 0
add sector aes:64-cbc-lmk 8320 0 0 512 0
add sector aes:64-cbc-lmk 16640 2 0 512 0
add sector serpent:64-cbc-lmk 16384 0 0 512 0
add sector blowfish-cbc-lmk 256 0 0 512 0
add sector aes-xts-lmk 512 0 0 512 0
# tcw (TrueCrypt): key = cipher key || IV seed (iv_size) || whitening (16)
add sector aes-cbc-tcw 512 0 0 512 0
add sector aes-cbc-tcw 384 $BIG 0 512 0
add sector serpent-cbc-tcw 512 0 0 512 0
add sector twofish-cbc-tcw 512 0 0 512 0
add sector blowfish-cbc-tcw 384 0 0 512 0
add sector cast5-cbc-tcw 320 0 0 512 0
add sector des3_ede-cbc-tcw 384 0 0 512 0
add sector aes:4-cbc-tcw 1280 0 0 512 0

# probes: tables the kernel may refuse; recorded in probes.tsv, no image kept
probe() { add probe "$@"; }
probe blowfish-xts-plain64 512 0 0 512 0 8192 probe-blowfish-xts
probe cast5-xts-plain64 256 0 0 512 0 8192 probe-cast5-xts
probe des3_ede-lrw-benbi 320 0 0 512 0 8192 probe-des3-lrw
probe cast5-lrw-benbi 256 0 0 512 0 8192 probe-cast5-lrw
probe cast5-cbc-essiv:sha256 128 0 0 512 0 8192 probe-cast5-essiv-sha256
probe des3_ede-cbc-essiv:sha256 192 0 0 512 0 8192 probe-des3-essiv-sha256
probe sm4-cbc-essiv:sha256 128 0 0 512 0 8192 probe-sm4-essiv-sha256
probe des3_ede-cbc-plain64 128 0 0 512 0 8192 probe-des3-k128
probe cast5-cbc-plain64 40 0 0 512 0 8192 probe-cast5-k40
probe cast5-cbc-plain64 256 0 0 512 0 8192 probe-cast5-k256
probe cast6-cbc-plain64 160 0 0 512 0 8192 probe-cast6-k160
probe serpent-cbc-plain64 64 0 0 512 0 8192 probe-serpent-k64
probe serpent-xts-plain64 384 0 0 512 0 8192 probe-serpent-xts-k384
probe blowfish-cbc-plain64 32 0 0 512 0 8192 probe-blowfish-k32
probe blowfish-cbc-plain64 512 0 0 512 0 8192 probe-blowfish-k512
probe sm4-cbc-plain64 256 0 0 512 0 8192 probe-sm4-k256
probe camellia-cbc-plain64 200 0 0 512 0 8192 probe-camellia-k200
probe aes-lrw-benbi 256 0 0 512 0 8192 probe-aes-lrw-k256
probe aes-lrw-benbi 128 0 0 512 0 8192 probe-aes-lrw-k128
probe aes-cbc-lmk 256 0 0 4096 0 16384 probe-lmk-ss4096
probe aes-cbc-tcw 512 0 0 4096 0 16384 probe-tcw-ss4096
probe aes-cbc-tcw 256 0 0 512 0 8192 probe-tcw-k256
probe aes-ctr-eboiv 256 0 0 512 0 8192 probe-ctr-eboiv
probe aes-ecb-lmk 256 0 0 512 0 8192 probe-ecb-lmk
probe aes-ecb-tcw 512 0 0 512 0 8192 probe-ecb-tcw
probe aes:3-cbc-plain64 768 0 0 512 0 8192 probe-keycount3
probe aes:2-cbc-plain64 384 0 0 512 0 8192 probe-keycount2-k384
probe aes:0-cbc-plain64 256 0 0 512 0 8192 probe-keycount0
probe nosuchcipher-cbc-plain64 256 0 0 512 0 8192 probe-unknown-cipher
probe aes-nosuchmode-plain64 256 0 0 512 0 8192 probe-unknown-mode
probe 'capi:nosuchmode(aes)-plain64' 256 0 0 512 0 8192 probe-capi-unknown-mode
probe aes-ctr 256 0 0 512 0 8192 probe-ctr-no-iv
probe aes-cbc-random 256 0 0 512 0 8192 probe-random-no-integrity
probe aes-cbc-elephant 256 0 0 512 0 8192 probe-elephant-cbc
probe aes-cbc-benbi:x 256 0 0 512 0 8192 probe-benbi-opts
probe cipher_null-cbc-null 0 0 0 512 0 8192 probe-null-cbc

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
            : # a refused or failing case is recorded, not fatal
        fi
        dmsetup remove golden-crypt || fail=1
    else
        echo "REFUSED|$name|$(tr '\n' ' ' < /tmp/err)|$(dmesg | grep -E 'crypt|device-mapper|table' | tr '\n' ' ')"
        : # a refused or failing case is recorded, not fatal
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
rm -f "$here"/*.img "$here"/*.img.xz
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
    if [ "$status" != OK ]; then
        echo "make-golden: case $name not accepted, recorded as a probe: $line" >&2
        rest=${line#*|*|}
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" "planned-case-$status" "$table" "${rest%%|*}" \
            "$(printf '%s' "${rest#*|}" | sed -E 's/\[ *[0-9.]+\] //g; s/ +$//')" >> "$here/probes.tsv"
        continue
    fi
    dd if="$work/disk.img" of="$here/$name.img" bs=512 skip="$base" count="$region" status=none
    sum=$(sha256sum < "$here/$name.img" | cut -c1-64)
    xz -9e -f "$here/$name.img"
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
