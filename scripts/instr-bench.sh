#!/usr/bin/env bash
# Instruction-count benchmarks of the hot paths, checked against a committed baseline.
#
# Each case of the `instr-bench` binary (crates/instr/src/main.rs: one 4 KiB
# XTS sector, one AEAD sector, one integrity tag, one NBD request read+decoded+answered,
# one journal commit) runs under valgrind's callgrind twice, with N1 and N2 iterations; the
# instructions of one operation are (I(N2) - I(N1)) / (N2 - N1), so setup cost cancels. The
# count does not depend on the machine's load: a change that adds work shows up here even
# on a noisy machine, where a stopwatch would not see it. Wall-clock figures are in
# BENCHMARKS.md.
#
# Fails (exit 1) when a case needs more than TOLERANCE percent more instructions than its
# baseline (scripts/instr-baseline.txt), and prints old vs new for every case. A case that
# got cheaper by more than TOLERANCE passes with a note: take a new baseline then.
#
# Usage: scripts/instr-bench.sh [--update] [CASE...]
#   --update       write the counts measured as the new baseline (commit it with the change
#                  that explains it)
#   TOLERANCE=3    allowed growth, in percent
#   INSTR_BENCH_BIN=path  use this binary instead of building it (.ci/run's build:
#                  `cargo build --profile ci -p instr`, the release profile without LTO)
#   BASELINE=path  baseline file (default scripts/instr-baseline.txt)
# The counts depend on the compiler, the `ci` profile and valgrind's CPU model (AWS-LC
# picks its AES code by CPUID): after a toolchain or valgrind upgrade, take a new baseline.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASELINE="${BASELINE:-$ROOT/scripts/instr-baseline.txt}"
TOLERANCE="${TOLERANCE:-3}"
update=0
cases=()
for a in "$@"; do
  case "$a" in
    --update) update=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "instr-bench: unknown option $a" >&2; exit 2 ;;
    *) cases+=("$a") ;;
  esac
done
[[ "$TOLERANCE" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "instr-bench: TOLERANCE must be a number of percent" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "instr-bench: valgrind not found (Debian package valgrind)" >&2; exit 2; }

if [[ -z "${INSTR_BENCH_BIN:-}" ]]; then
  # Exactly .ci/run's build (the same features resolved), so a baseline taken here holds there.
  (cd "$ROOT" && cargo build --profile ci -q -p instr)
  target_dir="$(cd "$ROOT" && cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  INSTR_BENCH_BIN="$target_dir/ci/instr-bench"
fi
[[ -x "$INSTR_BENCH_BIN" ]] || { echo "instr-bench: $INSTR_BENCH_BIN is not an executable" >&2; exit 2; }
if (( ${#cases[@]} == 0 )); then
  mapfile -t cases < <("$INSTR_BENCH_BIN" --list)
fi

# Iterations per case (N1; N2 = 2 × N1) and which threads count: "all", or "main" for the
# NBD cases, whose client threads (in the same process) read replies in however many
# pieces the scheduler gives them.
iters() { case "$1" in journal-*) echo 16 ;; nbd-*) echo 100 ;; *) echo 200 ;; esac; }
scope() { case "$1" in nbd-*) echo main ;; *) echo all ;; esac; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/instr-bench.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# instructions CASE N: the instructions counted by callgrind for `instr-bench CASE N`.
instructions() {
  local case="$1" n="$2" out="$WORK/$1-$2"
  if ! valgrind --tool=callgrind --separate-threads=yes --dump-instr=no --compress-strings=no \
      --callgrind-out-file="$out" "$INSTR_BENCH_BIN" "$case" "$n" >"$out.log" 2>&1; then
    echo "instr-bench: $case $n failed under valgrind:" >&2
    tail -20 "$out.log" >&2
    exit 2
  fi
  local files
  if [[ "$(scope "$case")" == main ]]; then files="$out-01"; else files="$(ls "$out"-[0-9]*)"; fi
  # The thread pools' own code (rayon's scheduler, crossbeam's queues, yielding) is not
  # counted: how often an idle worker spins or steals before it sleeps depends on when the
  # threads get scheduled, not on the work (callgrind serializes threads, so this differs
  # from run to run). The jobs the pools run are counted, in their own functions. Each
  # thread's total, less the self cost of those functions (a cost line right after `calls=`
  # is a call's inclusive cost, not the caller's own).
  # shellcheck disable=SC2086 # a list of files
  awk '
    FNR == 1 { fn = ""; skip = 0 }
    /^(summary|totals):/ { if (!seen[FILENAME]++) s += $2; next }
    /^fn=/ { fn = substr($0, 4); next }
    /^calls=/ { skip = 1; next }
    /^[0-9+*-]/ {
      if (skip) { skip = 0; next }
      if (fn ~ /rayon_core::|crossbeam_deque::|crossbeam_epoch::|crossbeam_utils::|sched_yield|yield_now/) pool += $2
    }
    END { printf "%d\n", s - pool }' $files
}

declare -A base=()
if [[ -f "$BASELINE" ]]; then
  while read -r c v _; do
    [[ -z "$c" || "$c" == \#* ]] && continue
    base[$c]="$v"
  done <"$BASELINE"
fi

declare -A now=()
fail=0
printf '%-22s %14s %14s %9s\n' case baseline now change
for c in "${cases[@]}"; do
  n1="$(iters "$c")"
  n2=$((2 * n1))
  i1="$(instructions "$c" "$n1")"
  i2="$(instructions "$c" "$n2")"
  per=$(( (i2 - i1 + (n2 - n1) / 2) / (n2 - n1) ))
  now[$c]="$per"
  old="${base[$c]:-}"
  if [[ -z "$old" ]]; then
    printf '%-22s %14s %14d %9s\n' "$c" "-" "$per" "new"
    [[ "$update" == 1 ]] || fail=1
    continue
  fi
  verdict="$(awk -v o="$old" -v n="$per" -v t="$TOLERANCE" 'BEGIN {
    d = (n - o) * 100 / o
    v = (d > t) ? "REGRESSION" : (d < -t) ? "improved" : "ok"
    printf "%+.1f%% %s", d, v }')"
  printf '%-22s %14d %14d %9s  %s\n' "$c" "$old" "$per" "${verdict% *}" "${verdict#* }"
  [[ "$verdict" == *REGRESSION ]] && fail=1
done

if [[ "$update" == 1 ]]; then
  {
    echo "# Instructions per operation, from scripts/instr-bench.sh --update (callgrind,"
    echo "# ci profile). $(rustc --version 2>/dev/null || echo rustc ?), $(valgrind --version)."
    for c in "${cases[@]}"; do echo "$c ${now[$c]}"; done
    # Cases not measured this time keep their baseline.
    for c in "${!base[@]}"; do [[ -n "${now[$c]:-}" ]] || echo "$c ${base[$c]}"; done
  } >"$BASELINE.new"
  mv "$BASELINE.new" "$BASELINE"
  echo "instr-bench: baseline written to $BASELINE"
  exit 0
fi
if [[ "$fail" == 1 ]]; then
  echo "instr-bench: FAILED: a case needs more than ${TOLERANCE}% more instructions than $BASELINE" \
    "(or has no baseline). If the extra work is intended, run scripts/instr-bench.sh --update and" \
    "commit the baseline with the change." >&2
  exit 1
fi
echo "instr-bench: every case within ${TOLERANCE}% of the baseline"
