#!/bin/bash
# Guest half of the sealdisk → kernel LUKS2 authenticated-encryption check (run by
# crates/cli/tests/cli/luks_integrity_kernel.rs through /work/shared/oracle/kernel-run).
#
# /kr/cases.txt: one line per disk, "name|/dev/vdX|wiped(yes/no)". For each volume sealdisk
# formatted (luksFormat --integrity ...) and wrote (2 MiB at offset 0): `cryptsetup open` it
# with the kernel's dm-crypt + dm-integrity, print both tables, the size, the sha256 of the
# first 2 MiB and, for wiped volumes, of the whole device (zeroes sealdisk wrote at format
# must carry valid tags), then write /kr/pattern-K (1 MiB) at offset 2 MiB with fsync and
# close: the host reads that back with sealdisk.
set -uo pipefail
cd /kr
while IFS='|' read -r name dev wiped; do
    echo "### $name"
    if ! cryptsetup open --key-file /kr/pass "$dev" v 2>&1; then
        echo "OPEN-FAILED $name"
        continue
    fi
    echo "TABLE $name $(dmsetup table v)"
    echo "DIFTABLE $name $(dmsetup table v_dif)"
    bytes=$(blockdev --getsize64 /dev/mapper/v)
    echo "SIZE $name $bytes"
    echo "SHA $name $(head -c 2097152 /dev/mapper/v | sha256sum | cut -c1-64)"
    if [ "$wiped" = yes ]; then
        echo "SHAALL $name $(head -c "$bytes" /dev/mapper/v | sha256sum | cut -c1-64)"
    fi
    if dd if=/kr/pattern-K of=/dev/mapper/v bs=1M seek=2 count=1 conv=fsync,notrunc status=none; then
        echo "WROTE $name"
    fi
    echo "STATUS $name $(dmsetup status v_dif)"
    cryptsetup close v
done < /kr/cases.txt
echo "### done"
