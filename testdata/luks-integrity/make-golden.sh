#!/bin/bash
# Regenerates the LUKS2 authenticated-encryption golden images in this directory with the
# REAL kernel (Linux 6.1, cryptsetup 2.6.1) via /work/shared/oracle/kernel-run. See README.md.
#
#   testdata/luks-integrity/make-golden.sh
#   ONLY=chacha20-poly1305-s512 testdata/luks-integrity/make-golden.sh   # just these cases
#
# ONLY (a space-separated list of case names) regenerates only those images, leaving the
# others' bytes alone; the guest transcript then goes to boot-<name>.log (kernel-run-<name>.log)
# instead of boot.log.
#
# Every case: a 4 MiB image, `cryptsetup luksFormat --type luks2 --integrity ...` with a fixed
# volume key (vk96.bin / vk32.bin = bytes 0..95 / 0..31), passphrase file pass.txt, PBKDF2
# with 1000 iterations, data offset 1024 sectors (512 KiB), --integrity-no-wipe (so the images
# compress: only what is written is random). Then open, print the dm tables, write pattern A
# over the first 256 KiB of the mapped device (dd bs=4096 conv=fsync), read it back, check
# that the first unwritten 4 KiB block fails to read (its tag is not valid), close, reopen,
# print the sha256 of the first 256 KiB, close, dump the header.
#
# Pattern A: logical 512-byte sector s holds 32 records of 16 bytes,
# record r = printf("A%011d:%02d\n", s, r) (the same as testdata/integrity).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
KR=${KERNEL_RUN:-/work/shared/oracle/kernel-run}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

awk 'BEGIN { for (s = 0; s < 8192; s++) for (r = 0; r < 32; r++) printf("A%011d:%02d\n", s, r) }' > pattern-A
for i in $(seq 0 95); do printf "\\x$(printf %02x "$i")"; done > vk96.bin
head -c 32 vk96.bin > vk32.bin
printf 'sealdisk-aead' > pass.txt
cp vk96.bin vk32.bin pass.txt "$here/"

# name | luksFormat options
CASES=$(cat <<'C'
hmac-sha256-xts-s512|--cipher aes-xts-plain64 --key-size 512 --integrity hmac-sha256 --sector-size 512 --volume-key-file /kr/vk96.bin --integrity-no-wipe
hmac-sha256-xts-s4096|--cipher aes-xts-plain64 --key-size 512 --integrity hmac-sha256 --sector-size 4096 --volume-key-file /kr/vk96.bin --integrity-no-wipe
aead-gcm-s512|--cipher aes-gcm-random --key-size 256 --integrity aead --sector-size 512 --volume-key-file /kr/vk32.bin --integrity-no-wipe
aead-gcm-s4096-nojournal|--cipher aes-gcm-random --key-size 256 --integrity aead --sector-size 4096 --integrity-no-journal --volume-key-file /kr/vk32.bin --integrity-no-wipe
chacha20-poly1305-s512|--cipher chacha20-random --key-size 256 --integrity poly1305 --sector-size 512 --volume-key-file /kr/vk32.bin --integrity-no-wipe
C
)

disks=()
: > cases.txt
n=0
while IFS='|' read -r name opts; do
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
        continue
    fi
    truncate -s 4M "$name.img"
    disks+=(--disk "$name.img")
    dev=/dev/vd$(printf "\\x$(printf %02x $((97 + n)))")
    printf '%s|%s|%s\n' "$name" "$dev" "$opts" >> cases.txt
    n=$((n + 1))
done <<< "$CASES"

cat > guest.sh <<'G'
#!/bin/bash
set -uo pipefail
cd /kr
while IFS='|' read -r name dev opts; do
    echo "### case $name"
    echo "CMD cryptsetup luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --hash sha256 --offset 1024 $opts --key-file /kr/pass.txt $dev"
    if ! cryptsetup luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
        --hash sha256 --offset 1024 $opts --key-file /kr/pass.txt "$dev" 2>&1; then
        echo "FORMAT-FAILED $name"
        continue
    fi
    if ! cryptsetup open --key-file /kr/pass.txt "$dev" v 2>&1; then
        echo "OPEN-FAILED $name"
        continue
    fi
    echo "TABLE $name $(dmsetup table v)"
    echo "DIFTABLE $name $(dmsetup table v_dif)"
    bytes=$(blockdev --getsize64 /dev/mapper/v)
    echo "SIZE $name $bytes"
    dd if=/kr/pattern-A of=/dev/mapper/v bs=4096 count=64 conv=fsync status=none 2>&1 || echo "WRITE-FAILED $name"
    if cmp -n 262144 /kr/pattern-A /dev/mapper/v >/dev/null 2>&1; then echo "READBACK $name ok"; else echo "READBACK $name MISMATCH"; fi
    if dd if=/dev/mapper/v of=/dev/null bs=4096 skip=64 count=1 iflag=direct status=none 2>/dev/null; then echo "UNWRITTEN $name readable"; else echo "UNWRITTEN $name EIO"; fi
    echo "STATUS $name $(dmsetup status v_dif)"
    cryptsetup close v
    if ! cryptsetup open --key-file /kr/pass.txt "$dev" v 2>&1; then
        echo "REOPEN-FAILED $name"
        continue
    fi
    echo "SHA $name $(head -c 262144 /dev/mapper/v | sha256sum | cut -c1-64)"
    echo "STATUS2 $name $(dmsetup status v_dif)"
    cryptsetup close v
    echo "DUMP $name"
    cryptsetup luksDump "$dev" | sed 's/^/  /'
done < /kr/cases.txt
echo "### done"
G

log=boot.log
runlog=kernel-run.log
if [ -n "${ONLY:-}" ]; then
    log=boot-${ONLY// /+}.log
    runlog=kernel-run-${ONLY// /+}.log
fi
"$KR" --timeout 1500 --file cases.txt --file pattern-A --file vk96.bin --file vk32.bin --file pass.txt \
    "${disks[@]}" guest.sh > boot.log 2> boot.err || { cat boot.err; cp boot.log "$here/$log"; exit 1; }
cp boot.log "$here/$log"
grep '^kernel-run' boot.err > "$here/$runlog" || true
while IFS='|' read -r name dev opts; do
    xz -9e -T1 -c "$name.img" > "$here/$name.img.xz"
done < cases.txt
echo done
