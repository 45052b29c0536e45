#!/bin/bash
# Guest half of the journal_crypt interop check, one boot (run by
# crates/cli/tests/cli/integrity_journal_crypt.rs through /work/shared/oracle/kernel-run).
#
# /kr/jc-cases.txt: "kind|name|/dev/vdX|integritysetup options" per disk.
#   sealdisk: a volume sealdisk formatted and wrote, journal committed but not copied out.
#             The kernel opens it (replaying the encrypted journal), prints the sha256 of the
#             mapped device and `dmsetup status` (mismatch count), closes it.
#   kernel:   the kernel formats the disk with the options, writes /kr/pattern-A (64 KiB)
#             at offset 64 KiB with fsync (journal committed, not yet copied out: the
#             watermark is not reached and commit_time is long), prints the sha256 of the
#             mapped device and leaves it OPEN: the image keeps the un-replayed, encrypted
#             journal for sealdisk to replay.
set -uo pipefail
cd /kr
n=0
while IFS='|' read -r kind name dev opts; do
    echo "### $kind $name"
    n=$((n + 1))
    if [ "$kind" = sealdisk ]; then
        if ! integritysetup open $opts "$dev" s$n 2>&1; then echo "OPEN-FAILED $name"; continue; fi
        bytes=$(blockdev --getsize64 /dev/mapper/s$n)
        echo "SHA $name $(head -c "$bytes" /dev/mapper/s$n | sha256sum | cut -c1-64)"
        echo "STATUS $name $(dmsetup status s$n)"
        integritysetup close s$n
    else
        integritysetup format --batch-mode -j 262144 $opts "$dev" 2>&1 || { echo "FORMAT-FAILED $name"; continue; }
        integritysetup open --journal-commit-time 600000 $opts "$dev" k$n 2>&1 || { echo "OPEN-FAILED $name"; continue; }
        dd if=/kr/pattern-A of=/dev/mapper/k$n bs=4096 seek=16 conv=fsync,notrunc status=none
        bytes=$(blockdev --getsize64 /dev/mapper/k$n)
        echo "SHA $name $(head -c "$bytes" /dev/mapper/k$n | sha256sum | cut -c1-64)"
        echo "STATUS $name $(dmsetup status k$n)"
        echo "LEFT-OPEN $name"
    fi
done < /kr/jc-cases.txt
echo "### done"
