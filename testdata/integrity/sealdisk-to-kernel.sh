#!/bin/bash
# Guest half of the sealdisk → kernel dm-integrity interop check (run by
# crates/cli/tests/cli/integrity_kernel.rs through /work/shared/oracle/kernel-run).
#
# /kr/cases.txt: one line per disk, "name|/dev/vdX|integritysetup open options".
# For each volume sealdisk formatted and wrote: open it with the kernel (a journal sealdisk
# left committed but not copied out is replayed here), print the sha256 of the whole mapped
# device and `dmsetup status` (mismatch count), then write /kr/pattern-K (64 KiB) at
# offset 128 KiB with fsync, print the status again, and close cleanly: the host then reads
# the kernel's write back with sealdisk.
set -uo pipefail
cd /kr
while IFS='|' read -r name dev opts; do
    echo "### $name"
    if ! integritysetup open $opts "$dev" g 2>&1; then
        echo "OPEN-FAILED $name"
        continue
    fi
    bytes=$(blockdev --getsize64 /dev/mapper/g)
    echo "TABLE $name $(dmsetup table g)"
    echo "SHA $name $(head -c "$bytes" /dev/mapper/g | sha256sum | cut -c1-64)"
    echo "STATUS $name $(dmsetup status g)"
    if dd if=/kr/pattern-K of=/dev/mapper/g bs=4096 seek=32 count=16 conv=fsync,notrunc status=none; then
        echo "WROTE $name"
    fi
    echo "STATUS2 $name $(dmsetup status g)"
    integritysetup close g
done < /kr/cases.txt
echo "### done"
