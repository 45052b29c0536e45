#!/bin/bash
# Guest half of the sealdisk → kernel LUKS interop check (run by
# crates/cli/tests/cli/luks_kernel.rs through /work/shared/oracle/kernel-run).
#
# /kr/cases.txt: one line per disk, "name|/dev/vdX|passphrase file". For each volume sealdisk
# formatted and wrote: `cryptsetup open` it with the kernel's dm-crypt, print the table
# (key masked), the size and the sha256 of the first 2 MiB, then write /kr/pattern-K
# (1 MiB) at offset 2 MiB with fsync and close: the host reads that back with sealdisk.
# Finally the kernel adds a keyslot (/kr/pass2) so the host checks sealdisk opens it.
set -uo pipefail
cd /kr
while IFS='|' read -r name dev pass; do
    echo "### $name"
    if ! cryptsetup open --key-file "$pass" "$dev" v 2>&1; then
        echo "OPEN-FAILED $name"
        continue
    fi
    echo "TABLE $name $(dmsetup table v)"
    echo "SIZE $name $(blockdev --getsize64 /dev/mapper/v)"
    echo "SHA $name $(head -c 2097152 /dev/mapper/v | sha256sum | cut -c1-64)"
    if dd if=/kr/pattern-K of=/dev/mapper/v bs=1M seek=2 count=1 conv=fsync,notrunc status=none; then
        echo "WROTE $name"
    fi
    cryptsetup close v
    if cryptsetup luksAddKey --batch-mode --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
        --key-file "$pass" "$dev" /kr/pass2 2>&1; then
        echo "ADDED $name"
    fi
done < /kr/cases.txt
echo "### done"
