#!/bin/bash
# Regenerates the dm-integrity golden images in this directory with the REAL Linux
# dm-integrity (Linux 6.1 via /work/shared/oracle/kernel-run), see README.md.
#
#   testdata/integrity/make-golden.sh        # boot 1: images, manifest.tsv, sweep.tsv, tables
#
# Two boots:
#   boot 1  formats and writes every case in CASES (one virtio disk each), and runs the
#           provided_data_sectors sweep (integritysetup format --no-wipe on loop devices of
#           odd sizes, then `integritysetup dump` + `dmsetup table` of the opened device).
#   boot 2  opens copies of the two "left open" images (journal not replayed, bitmap dirty)
#           so that the kernel replays them; the replayed copies are kept as *-replayed.img.
#
# Deterministic inputs (the Rust tests regenerate them the same way):
#   pattern X (X = A, B, C): logical 512-byte sector s of the mapped device holds 32
#   records of 16 bytes, record r = printf("%s%011d:%02d\n", X, s, r).
#   key32.bin = bytes 0x00..0x1f, key64.bin = bytes 0x00..0x3f (hmac keys).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
KR=${KERNEL_RUN:-/work/shared/oracle/kernel-run}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

pattern() { # letter sectors
    awk -v X="$1" -v N="$2" 'BEGIN { for (s = 0; s < N; s++) for (r = 0; r < 32; r++) printf("%s%011d:%02d\n", X, s, r) }'
}
pattern A 8192 > pattern-A
pattern B 8192 > pattern-B
pattern C 8192 > pattern-C
head -c 32 < <(for i in $(seq 0 63); do printf "\\x$(printf %02x "$i")"; done) > key32.bin
for i in $(seq 0 63); do printf "\\x$(printf %02x "$i")"; done > key64.bin
cp key32.bin key64.bin "$here/"

# name | size (bytes) | integritysetup format options | kind
# kind: full  = write pattern A over the whole device, close (clean image)
#       open-j = write A, close, reopen, write B and C ranges with fsync, leave OPEN
#       open-b = bitmap mode: write A over part, fsync, leave OPEN
CASES=$(cat <<'C'
crc32c-j-s512|1048576||full
crc32c-j-s4096|1048576|-s 4096|full
crc32c-j-s512-il8|1048576|--interleave-sectors 8|full
crc32c-j-s512-legacy|1048576|--integrity-legacy-padding|full
crc32c-j-s512-legacy-il8|1048576|--integrity-legacy-padding --interleave-sectors 8|full
crc32c-b-s512-il64|1048576|-B --interleave-sectors 64|full
crc32c-b-s4096|1048576|-B -s 4096|full
crc32c-t8-j-s512|1048576|-t 8|full
sha256-j-s512|1048576|-I sha256|full
sha256-j-s4096|1048576|-I sha256 -s 4096|full
sha256-t12-b-s512|1048576|-I sha256 -t 12 -B|full
sha256-j-s4096-legacy-il64|2097152|-I sha256 -s 4096 --integrity-legacy-padding --interleave-sectors 64|full
hmac-sha256-j-s512|1048576|-I hmac-sha256 --integrity-key-file /kr/key32.bin --integrity-key-size 32|full
hmac-sha256-b-s4096-il64|1048576|-I hmac-sha256 --integrity-key-file /kr/key32.bin --integrity-key-size 32 -B -s 4096 --interleave-sectors 64|full
hmac-sha512-j-s4096|1048576|-I hmac-sha512 --integrity-key-file /kr/key64.bin --integrity-key-size 64 -s 4096|full
crc32-j-s512|1048576|-I crc32|full
xxhash64-j-s512|1048576|-I xxhash64|full
sha1-j-s512|1048576|-I sha1|full
blake2b-256-j-s4096|1048576|-I blake2b-256 -s 4096|full
crc32c-j-s512-open|4194304|-j 1048576|open-j
C
)
# (20 disks is kernel-run's maximum; the bitmap "left open" case rides in boot 2's spare disk.)

disks=()
: > cases.txt
n=0
while IFS='|' read -r name size opts kind; do
    truncate -s "$size" "$name.img"
    disks+=(--disk "$name.img")
    dev=/dev/vd$(printf "\\x$(printf %02x $((97 + n)))")
    printf '%s|%s|%s|%s\n' "$name" "$dev" "$opts" "$kind" >> cases.txt
    n=$((n + 1))
done <<< "$CASES"

cat > guest1.sh <<'G'
#!/bin/bash
set -uo pipefail
cd /kr
ks() { # opts -> open options (key + mode options that open needs again)
    local o=() a=($1) i=0
    while [ $i -lt ${#a[@]} ]; do
        case "${a[$i]}" in
            -I|--integrity-key-file|--integrity-key-size) o+=("${a[$i]}" "${a[$((i+1))]}"); i=$((i+2)); continue;;
            -B) o+=(-B);;
        esac
        i=$((i+1))
    done
    echo "${o[@]}"
}
while IFS='|' read -r name dev opts kind; do
    echo "### case $name"
    echo "CMD integritysetup format --batch-mode $opts $dev"
    integritysetup format --batch-mode $opts $dev 2>&1 | sed 's/^/  /' || echo "FORMAT-FAILED $name"
    oo=$(ks "$opts")
    integritysetup open $oo $dev g || { echo "OPEN-FAILED $name"; continue; }
    bytes=$(blockdev --getsize64 /dev/mapper/g)
    echo "TABLE $name $(dmsetup table g)"
    dd if=/kr/pattern-A of=/dev/mapper/g bs=4096 count=$((bytes / 4096)) conv=fsync status=none 2>&1 || echo "WRITE-FAILED $name"
    if cmp -n "$bytes" /kr/pattern-A /dev/mapper/g >/dev/null 2>&1; then echo "READBACK $name ok"; else echo "READBACK $name MISMATCH $(cmp -n "$bytes" /kr/pattern-A /dev/mapper/g 2>&1 | head -1)"; fi
    echo "STATUS $name $(dmsetup status g)"
    integritysetup close g
    if [ "$kind" = open-j ]; then
        integritysetup open $oo $dev g || { echo "OPEN2-FAILED $name"; continue; }
        # commit 1: pattern B on sectors [0,64) ; commit 2: pattern C on sectors [32,96) ;
        # commit 3: pattern B on sectors [4000,4100) (crosses nothing special, near the end)
        dd if=/kr/pattern-B of=/dev/mapper/g bs=512 skip=0 seek=0 count=64 conv=fsync,notrunc status=none
        dd if=/kr/pattern-C of=/dev/mapper/g bs=512 skip=32 seek=32 count=64 conv=fsync,notrunc status=none
        dd if=/kr/pattern-B of=/dev/mapper/g bs=512 skip=4000 seek=4000 count=100 conv=fsync,notrunc status=none
        echo "EXPECT $name $(head -c "$bytes" /dev/mapper/g | sha256sum | cut -c1-64)"
        echo "STATUS2 $name $(dmsetup status g)"
        echo "LEFT-OPEN $name"
        continue
    fi
    integritysetup open $oo $dev g || { echo "REOPEN-FAILED $name"; continue; }
    if cmp -n "$bytes" /kr/pattern-A /dev/mapper/g >/dev/null 2>&1; then echo "REREAD $name ok"; else echo "REREAD $name MISMATCH $(cmp -n "$bytes" /kr/pattern-A /dev/mapper/g 2>&1 | head -1)"; fi
    echo "SHA $name $(head -c "$bytes" /dev/mapper/g 2>/dev/null | sha256sum | cut -c1-64)"
    echo "STATUS3 $name $(dmsetup status g)"
    integritysetup close g
done < /kr/cases.txt

# provided_data_sectors sweep on loop devices (integritysetup format --no-wipe, dump, table)
echo "### sweep"
i=0
for sectors in 64 100 128 255 256 400 511 1000 1031 2047 4096 4097 8191 12345 65539 300001; do
  for opts in "" "-s 4096" "--integrity-legacy-padding" "--interleave-sectors 8" "-I sha256 -s 4096 --integrity-legacy-padding --interleave-sectors 64" "-j 65536 -t 1" "-B"; do
    f=/tmp/sweep$i.img; i=$((i+1))
    rm -f $f; truncate -s $((sectors * 512)) $f
    lo=$(losetup -f --show $f)
    if integritysetup format --batch-mode --no-wipe $opts $lo >/dev/null 2>&1; then
        d=$(integritysetup dump $lo 2>/dev/null | tr '\n' ' ')
        oo=$(ks "$opts")
        if integritysetup open $oo $lo s >/dev/null 2>&1; then t=$(dmsetup table s); integritysetup close s; else t=OPEN-FAILED; fi
        echo "SWEEP|$sectors|$opts|$d|$t"
    else
        echo "SWEEP|$sectors|$opts|FORMAT-FAILED|"
    fi
    losetup -d $lo; rm -f $f
  done
done
echo "### done"
G

echo "kernel-run boot 1: ${#disks[@]} args" >&2
"$KR" --timeout 1200 --file cases.txt --file pattern-A --file pattern-B --file pattern-C \
    --file key32.bin --file key64.bin "${disks[@]}" guest1.sh > boot1.log 2> boot1.err || { cat boot1.err; exit 1; }
cp boot1.log "$here/boot1.log"
grep '^kernel-run' boot1.err > "$here/kernel-run.log" || true

# ---------------------------------------------------------------- boot 2
# The journal image left open is kept as is; a copy is opened (replayed) by the kernel.
cp crc32c-j-s512-open.img crc32c-j-s512-open-replayed.img
truncate -s 2097152 crc32c-b-s512-open.img
cat > guest2.sh <<'G'
#!/bin/bash
set -uo pipefail
# /dev/vda: copy of the journal image left open -> kernel replays the journal on open
integritysetup dump /dev/vda | sed 's/^/DUMP-BEFORE /'
integritysetup open /dev/vda g
bytes=$(blockdev --getsize64 /dev/mapper/g)
echo "REPLAYED crc32c-j-s512-open $(head -c "$bytes" /dev/mapper/g | sha256sum | cut -c1-64)"
echo "STATUS crc32c-j-s512-open $(dmsetup status g)"
integritysetup close g
# /dev/vdb: bitmap mode left open (DIRTY_BITMAP set in the superblock)
integritysetup format --batch-mode -B /dev/vdb 2>&1 | sed 's/^/  /'
integritysetup open -B /dev/vdb g
echo "TABLE crc32c-b-s512-open $(dmsetup table g)"
bytes=$(blockdev --getsize64 /dev/mapper/g)
dd if=/kr/pattern-A of=/dev/mapper/g bs=4096 count=$((bytes / 8192)) conv=fsync status=none
echo "EXPECT crc32c-b-s512-open $(head -c "$bytes" /dev/mapper/g | sha256sum | cut -c1-64)"
echo "LEFT-OPEN crc32c-b-s512-open"
G
"$KR" --timeout 600 --file pattern-A --disk crc32c-j-s512-open-replayed.img --disk crc32c-b-s512-open.img \
    guest2.sh > boot2.log 2> boot2.err || { cat boot2.err; exit 1; }
cp boot2.log "$here/boot2.log"
grep '^kernel-run' boot2.err >> "$here/kernel-run.log" || true

# ---------------------------------------------------------------- host side
{
    printf 'name\tsize\tformat_options\tkind\tdump\n'
    while IFS='|' read -r name dev opts kind; do
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$(stat -c %s "$name.img")" "$opts" "$kind" "$name.dump"
    done < cases.txt
    printf '%s\t%s\t%s\t%s\t%s\n' crc32c-j-s512-open-replayed 4194304 "-j 1048576" replayed crc32c-j-s512-open-replayed.dump
    printf '%s\t%s\t%s\t%s\t%s\n' crc32c-b-s512-open 2097152 "-B" open-b crc32c-b-s512-open.dump
} > "$here/manifest.tsv"
grep '^SWEEP|' boot1.log | sed 's/^SWEEP|//' | tr '|' '\t' > "$here/sweep.tsv"
for img in *.img; do
    base=${img%.img}
    integritysetup dump "$img" > "$here/$base.dump" 2>&1 || true
    xz -9e -T1 -c "$img" > "$here/$img.xz"
done
uname_line=$(grep -m1 'booting' "$here/kernel-run.log" || true)
echo "done: $uname_line"
