#!/bin/bash
# Guest half of crates/cli/tests/cli/tcrypt_kernel.rs. /kr/cases.txt has one line per volume:
#   NAME|DEVICE|PASSPHRASE|cryptsetup options (commas for spaces)|OFFSET|LENGTH
# For each, cryptsetup maps it through dm-crypt and prints "SHA NAME <sha256>" of the
# LENGTH bytes at OFFSET of the mapped volume (what sealdisk wrote there), and
# "DUMP NAME <line>" for each line of `cryptsetup tcryptDump`.
while IFS='|' read -r name dev pass opts off len <&3; do
  o=${opts//,/ }
  if ! printf %s "$pass" | cryptsetup open --type tcrypt $o "$dev" tc; then
    echo "FAILED $name"; continue
  fi
  echo "SHA $name $(dd if=/dev/mapper/tc bs=4096 skip=$((off / 4096)) count=$((len / 4096)) status=none | sha256sum | cut -d' ' -f1)"
  cryptsetup close tc
done 3< /kr/cases.txt
