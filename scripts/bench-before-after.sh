#!/usr/bin/env bash
# In-process before/after of two sealdisk binaries on issue 16's goals: journal mode against
# direct mode (1M sequential, 4k random QD32), journaled AEAD against plain LUKS2, and plain
# crypt against raw (buffered and O_DIRECT backing). Per row the BEFORE binary runs one
# `bench --compare` (its variants interleaved), then the AFTER binary the same; the load
# average is printed before each. Reports go to $OUT_DIR, one file per row and binary.
#
#   BEFORE=path/to/old/sealdisk AFTER=target/release/sealdisk scripts/bench-before-after.sh
#
# Environment: BEFORE, AFTER (required), OUT_DIR (default target/bench-before-after),
# REPEAT (3), RUNTIME (3), SIZE (256M), DIR (where the temporary volumes go, default /tmp;
# it must take O_DIRECT).
set -euo pipefail
die() { echo "bench-before-after: $*" >&2; exit 1; }
[[ -x "${BEFORE:-}" ]] || die "BEFORE=path to the old sealdisk binary"
[[ -x "${AFTER:-}" ]] || die "AFTER=path to the new sealdisk binary"
OUT_DIR="${OUT_DIR:-target/bench-before-after}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "${DIR:-/tmp}"
compare=(bench --compare "--size=${SIZE:-256M}" "--runtime=${RUNTIME:-3}" --time_based
  "--repeat=${REPEAT:-3}" --no-progress)
load() { cut -d' ' -f1-3 /proc/loadavg; }
n=0
row() { # row NAME BENCH-ARGS...: the row with BEFORE, then with AFTER
  local name=$1 which bin out
  shift
  for which in before after; do
    bin=$BEFORE
    [[ $which == after ]] && bin=$AFTER
    n=$((n + 1))
    out="$OUT_DIR/$(printf %02d "$n")-$name-$which.txt"
    echo "== $name, $which ($(date -u +%T), load $(load))"
    "$bin" "${compare[@]}" "$@" >"$out" 2>&1 || die "$name ($which) failed: see $out"
    awk '/^point/ { p = 1 } p && !/^bench: done/' "$out"
  done
}
echo "start $(date -u +%T), load $(load)"
journal=(--variant J:stack=integrity,integrity-alg=crc32c
  --variant J64M:stack=integrity,integrity-alg=crc32c,journal-size=64M
  --variant D:stack=integrity,integrity-alg=crc32c,integrity-mode=D)
row journal-1m --direct=1 --rw=write --bs=1M --iodepth=8 "${journal[@]}"
row journal-4k --direct=1 --rw=randwrite --bs=4k --iodepth=32 "${journal[@]}"
row aead-1m --direct=1 --rw=write --bs=1M --iodepth=8 --variant plain:stack=luks2 \
  --variant hmacJ:stack=luks2-integrity \
  --variant gcmJ:stack=luks2-integrity,cipher=aes-gcm-random,key-size=256,luks-integrity=aead
for direct in 0 1; do
  for job in "read 1M 8" "write 1M 8" "randread 4k 32" "randwrite 4k 32"; do
    read -r rw bs qd <<<"$job"
    row "crypt-$rw-$bs-direct$direct" "--direct=$direct" "--rw=$rw" "--bs=$bs" "--iodepth=$qd" \
      --variant raw:stack=raw --variant crypt:stack=crypt
  done
done
if command -v openssl >/dev/null; then
  echo "SHA-256 of 4 KiB blocks on two cores (openssl speed, bytes/s in thousands):"
  openssl speed -multi 2 -seconds 2 -bytes 4096 -evp sha256 2>/dev/null | tail -1
fi
echo "end $(date -u +%T), load $(load)"
