#!/bin/bash
# Guest half of crates/cli/tests/cli/ciphers_kernel.rs (run through
# /work/shared/oracle/kernel-run): the kernel reads volumes sealdisk wrote.
#
# 1. Plain dm-crypt: /kr/plain.txt has one line per case,
#    "name|cipher|key hex|iv_offset|offset|sectors|sector_size|iv_large_sectors"; each case's
#    ciphertext lies on /dev/vda at <offset>. The kernel maps it with exactly that table and
#    prints "SHA <name> <sha256 of the plaintext it reads>" (or "REFUSED <name> ...").
# 2. LUKS1/LUKS2 with other ciphers: testdata/luks/sealdisk-to-kernel.sh (copied in as
#    /kr/sealdisk-to-kernel.sh) on the disks listed in /kr/cases.txt.
set -uo pipefail
cd /kr
echo "UNAME $(uname -r)"
while IFS='|' read -r name cipher key ivo off len ss ivl; do
    opts=() 
    [ "$ss" != 512 ] && opts+=("sector_size:$ss")
    [ "$ivl" = 1 ] && opts+=("iv_large_sectors")
    table="0 $len crypt $cipher $key $ivo /dev/vda $off"
    [ ${#opts[@]} -gt 0 ] && table+=" ${#opts[@]} ${opts[*]}"
    dmesg -c > /dev/null 2>&1 || true
    if dmsetup create p --table "$table" 2> /tmp/err; then
        echo "SHA $name $(sha256sum < /dev/mapper/p | cut -c1-64)"
        dmsetup remove p
    else
        echo "REFUSED $name $(tr '\n' ' ' < /tmp/err) $(dmesg | grep crypt | tr '\n' ' ')"
    fi
done < /kr/plain.txt
bash /kr/sealdisk-to-kernel.sh
