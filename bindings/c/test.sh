#!/usr/bin/env bash
# The C ABI's test: compiles tests/read_volume.c with gcc against include/sealdisk.h and
# runs it on a LUKS2 image cryptsetup made and on a BitLocker image of testdata/bitlk; then
# cryptsetup opens the keyslot the C program added. Needs cryptsetup, gcc and xz (.ci/run
# installs them).
#
#   bindings/c/test.sh                        builds libsealdisk.so first (cargo, dev profile)
#   SEALDISK_LIB_DIR=DIR bindings/c/test.sh   uses DIR/libsealdisk.so (and .a): what the
#                                             cargo test tests/capi/c_program.rs does, so the
#                                             test suite (scripts/test.sh) runs this script

set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
for tool in cryptsetup gcc xz; do
  command -v "$tool" >/dev/null || { echo "bindings/c/test.sh: $tool not found" >&2; exit 1; }
done

lib="${SEALDISK_LIB_DIR:-}"
if [ -z "$lib" ]; then
  cargo build -q -p sealdisk-capi
  lib="${CARGO_TARGET_DIR:-$root/target}/debug"
fi
test -f "$lib/libsealdisk.so" || { echo "bindings/c/test.sh: no $lib/libsealdisk.so" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
gcc -std=c11 -Wall -Wextra -Werror -O1 -I bindings/c/include bindings/c/tests/read_volume.c \
  -L "$lib" -lsealdisk -Wl,-rpath,"$lib" -o "$work/read_volume"
# The header also compiles as C++ and against the static library.
if command -v g++ >/dev/null && [ -f "$lib/libsealdisk.a" ]; then
  printf '#include "sealdisk.h"\nint main() { return sealdisk_version() == nullptr; }\n' >"$work/cxx.cc"
  g++ -std=c++17 -Wall -Werror -I bindings/c/include "$work/cxx.cc" "$lib/libsealdisk.a" -lm -ldl -lpthread \
    $(pkg-config --libs openssl 2>/dev/null || echo -lssl -lcrypto) -o "$work/cxx"
  "$work/cxx"
fi

pass='correct horse'
new_pass='battery staple'
truncate -s 32M "$work/luks2.img"
printf %s "$pass" | cryptsetup luksFormat --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
  --batch-mode --key-file - "$work/luks2.img"
xz -dc testdata/bitlk/aes-xts_128.img.xz >"$work/bitlk.img"

"$work/read_volume" "$work/luks2.img" "$pass" "$new_pass" "$work/bitlk.img" 'password12!@'

# cryptsetup reads what sealdisk wrote: the new keyslot opens the volume, the old one still does.
printf %s "$new_pass" | cryptsetup open --test-passphrase --key-file - --key-slot 3 "$work/luks2.img"
printf %s "$pass" | cryptsetup open --test-passphrase --key-file - "$work/luks2.img"
cryptsetup luksDump "$work/luks2.img" | grep -q '^  3: luks2'
if printf %s "wrong" | cryptsetup open --test-passphrase --key-file - "$work/luks2.img" 2>/dev/null; then
  echo "bindings/c/test.sh: cryptsetup accepted a wrong passphrase" >&2
  exit 1
fi
echo "bindings/c/test.sh: ok (cryptsetup opens keyslot 3 that libsealdisk added)"
