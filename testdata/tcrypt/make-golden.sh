#!/usr/bin/env bash
# Makes the TrueCrypt/VeraCrypt golden images of this directory (see README.md).
# Host: Debian 12, root, a free loop device, tcplay 1.1, /usr/bin/python3 with
# python3-cryptography, xz; the kernel oracle (kernel-run: Linux 6.1, cryptsetup 2.6.1).
#   1. tcplay makes the TrueCrypt volumes on loop devices (-w weak keys, -z no erase, so
#      the images compress), make-veracrypt.py the VeraCrypt ones.
#   2. In the guest, `cryptsetup open --type tcrypt` maps each one through dm-crypt and
#      writes pattern.bin's bytes to the volume's first and last 64 KiB; `dmsetup table
#      --showkeys` (every layer) and `cryptsetup tcryptDump` are kept as NAME.table/.dump.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
KR="${KERNEL_RUN:-/work/shared/oracle/kernel-run}"
work="$(mktemp -d)"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
cd "$work"
feed="$here/tcfeed.py"

tc() { # NAME SIZE PROMPT-ANSWERS... -- tcplay options
  local name=$1 size=$2; shift 2
  local answers=() ; while [ "$1" != -- ]; do answers+=("$1"); shift; done; shift
  truncate -s "$size" "$name.img"
  local dev; dev=$(losetup -f --show "$name.img")
  # tcplay sometimes fails to read an answer fed this way: try again.
  local try
  for try in 1 2 3 4 5; do
    python3 "$feed" "${answers[@]}" -- tcplay -c -d "$dev" -w -z "$@" >tcplay.out 2>&1 && break
    [ "$try" = 5 ] && { cat tcplay.out; losetup -d "$dev"; exit 1; }
  done
  losetup -d "$dev"
}
cp "$here/keyfile1" "$here/keyfile2" .
tc tc-aes-sha512 2M sealdisk-tc1 sealdisk-tc1 y -- -a SHA512 -b AES-256-XTS
tc tc-serpent-twofish-aes 2M sealdisk-tc2 sealdisk-tc2 y -- -a SHA512 -b SERPENT-256-XTS,TWOFISH-256-XTS,AES-256-XTS
# Header only: Debian's cryptsetup (OpenSSL 3 without the legacy provider) has no
# whirlpool, so the kernel cannot map it; sealdisk's unlock is checked against tcplay's header.
tc tc-whirlpool-aes-serpent 2M sealdisk-tc4 sealdisk-tc4 y -- -a whirlpool -b AES-256-XTS,SERPENT-256-XTS
tc tc-keyfile-twofish-aes-ripemd160 2M sealdisk-kf sealdisk-kf y -- -a RIPEMD160 -b TWOFISH-256-XTS,AES-256-XTS -k keyfile1 -k keyfile2
tc tc-hidden 4M sealdisk-outer sealdisk-outer sealdisk-hidden sealdisk-hidden 1M y -- -a SHA512 -b AES-256-XTS -g -x RIPEMD160 -y SERPENT-256-XTS,TWOFISH-256-XTS
mv="/usr/bin/python3 $here/make-veracrypt.py"
$mv vc-aes-sha512-pim.img 2097152 sealdisk-vc1 --pim 3
$mv vc-keyfile-hidden.img 4194304 sealdisk-vc2 --pim 1 --keyfile keyfile1 --hidden 1048576 sealdisk-vc2-hidden
$mv vc-system.img 3145728 sealdisk-vc3 --hash sha256 --pim 2 --system
python3 -c "import sys; sys.stdout.buffer.write(bytes(((i % 251) ^ (i // 4096)) & 255 for i in range(4 << 20)))" > pattern.bin

# name:disk:passphrase:cryptsetup options (commas for spaces)
cases="tc-aes-sha512:vda:sealdisk-tc1:--hash,sha512
tc-serpent-twofish-aes:vdb:sealdisk-tc2:--hash,sha512
tc-keyfile-twofish-aes-ripemd160:vdc:sealdisk-kf:--hash,ripemd160,-d,/kr/keyfile1,-d,/kr/keyfile2
tc-hidden:vdd:sealdisk-outer:--hash,sha512
tc-hidden.hidden:vdd:sealdisk-hidden:--hash,ripemd160,--tcrypt-hidden
vc-aes-sha512-pim:vde:sealdisk-vc1:--hash,sha512,--veracrypt-pim,3
vc-keyfile-hidden:vdf:sealdisk-vc2:--hash,sha512,--veracrypt-pim,1,-d,/kr/keyfile1
vc-keyfile-hidden.hidden:vdf:sealdisk-vc2-hidden:--hash,sha512,--veracrypt-pim,1,-d,/kr/keyfile1,--tcrypt-hidden
vc-system:vdg:sealdisk-vc3:--hash,sha256,--veracrypt-pim,2,--tcrypt-system"
cat > guest.sh <<'GUEST'
#!/bin/bash
while IFS=: read -r name disk pass opts <&3; do
  o=${opts//,/ }
  if ! printf %s "$pass" | cryptsetup open --type tcrypt $o /dev/$disk tc; then
    echo "FAILED: $name"; continue
  fi
  size=$(blockdev --getsize64 /dev/mapper/tc)
  dd if=/kr/pattern.bin of=/dev/mapper/tc bs=4096 count=16 conv=fsync status=none
  dd if=/kr/pattern.bin of=/dev/mapper/tc bs=4096 skip=$((size / 4096 - 16)) seek=$((size / 4096 - 16)) count=16 conv=fsync status=none
  echo "== $name.table"; dmsetup table --showkeys | grep '^tc' | sort
  cryptsetup close tc
  echo "== $name.dump"; printf %s "$pass" | cryptsetup tcryptDump $o /dev/$disk 2>&1
done 3<<< "$1"
GUEST
disks=()
for n in tc-aes-sha512 tc-serpent-twofish-aes tc-keyfile-twofish-aes-ripemd160 tc-hidden vc-aes-sha512-pim vc-keyfile-hidden vc-system; do
  disks+=(--disk "$n.img")
done
"$KR" --file pattern.bin --file keyfile1 --file keyfile2 "${disks[@]}" guest.sh "$cases" \
  > guest.out 2> kernel-run.err || { cat guest.out kernel-run.err; exit 1; }
cat guest.out
grep -q FAILED guest.out && exit 1
awk -v dir="$here" '/^== /{f=dir "/" $2; printf "" > f; next} f{print >> f}' guest.out
for n in tc-aes-sha512 tc-serpent-twofish-aes tc-keyfile-twofish-aes-ripemd160 tc-hidden vc-aes-sha512-pim vc-keyfile-hidden vc-system; do
  xz -9 -c "$n.img" > "$here/$n.img.xz"
done
xz -9 -c tc-whirlpool-aes-serpent.img > "$here/tc-whirlpool-aes-serpent.img.xz"
