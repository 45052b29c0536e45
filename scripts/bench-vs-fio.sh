#!/usr/bin/env bash
# Does `sealdisk bench` measure what fio measures? The same job, against the same server over
# the same transport, run alternately by fio (--ioengine=nbd, libnbd) and by sealdisk's own
# harness (`sealdisk bench --target nbd+unix://...`), repetitions interleaved (fio, harness,
# fio, harness, ...). Prints one row per job: each tool's median IOPS and the ratio
# harness ÷ fio (issue 5 asks for agreement within 15%).
#
# The server is `sealdisk open` (plain aes-xts-plain64, 512-bit key, 4096-byte sectors) on a
# unix socket over a preallocated file, written once before the jobs. Before every run the
# file's page cache is reset (scripts/bench-lib/pagecache.py), as in bench-peers.sh.
#
# Usage: scripts/bench-vs-fio.sh            (knobs in the environment)
#   SIZE=256M RUNTIME=4 RAMP=1 REPS=3
#   JOBS="randwrite-4k-qd1 randread-4k-qd1 read-1m-qd8 write-1m-qd8 randwrite-4k-qd32 randread-4k-qd32"
#   PIN=1          server on CPU 0, the client (fio or the harness) on CPU 1, so that neither
#                  client's own CPU cost slows the server it measures
#   BACKEND=direct the server opens its file with O_DIRECT (--direct): the disk, not the
#                  client, is the bottleneck, so both clients should see the same figure
#   NUMJOBS=N      N connections (fio numjobs / harness numjobs), iodepth per connection
#   SEALDISK_BIN=path (skip the cargo build)  OUT_DIR=target/bench-results/vs-fio-<stamp>
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIB="$ROOT/scripts/bench-lib"
PROG=bench-vs-fio
# shellcheck source=bench-lib/common.sh
source "$LIB/common.sh"
CMDLINE="$(printf '%q ' "$0" "$@")"
SIZE="${SIZE:-256M}"
RUNTIME="${RUNTIME:-4}"
RAMP="${RAMP:-1}"
REPS="${REPS:-3}"
PIN="${PIN:-0}"
BACKEND="${BACKEND:-buffered}"
NUMJOBS="${NUMJOBS:-1}"
ALL_JOBS="randwrite-4k-qd1 randread-4k-qd1 read-1m-qd8 write-1m-qd8 randwrite-4k-qd32 randread-4k-qd32"
JOBS="$(echo "${JOBS:-$ALL_JOBS}" | tr ',' ' ')"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench-results/vs-fio-$STAMP}"


case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "no arguments are taken; the knobs are environment variables (see --help)" ;;
esac
# shellcheck disable=SC2086 # a word list
check_words job "$ALL_JOBS" $JOBS
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive integer"
[[ "$NUMJOBS" =~ ^[1-9][0-9]*$ ]] || die "NUMJOBS must be a positive integer"
[[ "$PIN" == 0 || "$PIN" == 1 ]] || die "PIN must be 0 or 1"
[[ "$BACKEND" == buffered || "$BACKEND" == direct ]] || die "BACKEND must be buffered or direct"
SIZE_BYTES="$(size_bytes "$SIZE")" || exit 1
for tool in fio python3 nbdinfo taskset; do
  command -v "$tool" >/dev/null || die "missing $tool (Debian: fio, python3, libnbd-bin, util-linux)"
done
fio --enghelp=nbd >/dev/null 2>&1 || die "this fio has no nbd engine (Debian's fio has it)"
if (( PIN )) && (( $(nproc) < 2 )); then die "PIN=1 needs 2 CPUs"; fi

if [[ -z "${SEALDISK_BIN:-}" ]]; then
  log "building sealdisk (release)"
  (cd "$ROOT" && cargo build --release -p sealdisk) >&2 || die "cargo build failed"
  SEALDISK_BIN="$ROOT/target/release/sealdisk"
fi
[[ -x "$SEALDISK_BIN" ]] || die "SEALDISK_BIN=$SEALDISK_BIN is not an executable"

mkdir -p "$OUT_DIR"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sealdisk-vs-fio.XXXXXX")"
# The server's control socket (volume "vol") in a private runtime directory.
export SEALDISK_RUNTIME_DIR="$WORK/run"
SERVER_PID=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$SERVER_PID" ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

IMG="$WORK/vol.img"
SOCK="$WORK/s.sock"
URI="nbd+unix:///vol?socket=$SOCK"
( umask 077; head -c 64 /dev/urandom > "$WORK/key" )
fallocate -l "$SIZE_BYTES" "$IMG" 2>/dev/null || truncate -s "$SIZE_BYTES" "$IMG"

server_pin=(); client_pin=()
if (( PIN )); then server_pin=(taskset -c 0); client_pin=(taskset -c 1); fi
direct=(); [[ "$BACKEND" == direct ]] && direct=(--direct)
"${server_pin[@]}" "$SEALDISK_BIN" open --type plain --cipher aes-xts-plain64 --key-size 512 \
  --key-file "$WORK/key" --sector-size 4096 "${direct[@]}" "$IMG" vol --listen "unix:$SOCK" \
  >"$OUT_DIR/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 300); do
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$OUT_DIR/server.log" >&2; die "server exited"; }
  [[ -S "$SOCK" ]] && nbdinfo --size "$URI" >/dev/null 2>&1 && break
  sleep 0.1
done

job_args() { # fio/harness options of one job (the same spelling works for both)
  case "$1" in
    randwrite-4k-qd1)  echo "--rw=randwrite --bs=4k --iodepth=1" ;;
    randread-4k-qd1)   echo "--rw=randread --bs=4k --iodepth=1" ;;
    read-1m-qd8)       echo "--rw=read --bs=1M --iodepth=8" ;;
    write-1m-qd8)      echo "--rw=write --bs=1M --iodepth=8" ;;
    randwrite-4k-qd32) echo "--rw=randwrite --bs=4k --iodepth=32" ;;
    randread-4k-qd32)  echo "--rw=randread --bs=4k --iodepth=32" ;;
  esac
}
COMMON=(--size="$SIZE_BYTES" --numjobs="$NUMJOBS" --runtime="$RUNTIME" --ramp_time="$RAMP" --time_based)

reset_cache() {
  if [[ "$BACKEND" == direct ]]; then python3 "$LIB/pagecache.py" drop "$IMG"
  else python3 "$LIB/pagecache.py" small "$IMG"; fi
}

log "writing the volume once through the server"
fio --name=precondition --ioengine=nbd --uri="$URI" --size="$SIZE_BYTES" --rw=write --bs=1M \
  --iodepth=8 --end_fsync=1 --output="$OUT_DIR/precondition.txt" >/dev/null

{
  echo "command=$CMDLINE"
  echo "env=SIZE=$SIZE RUNTIME=$RUNTIME RAMP=$RAMP REPS=$REPS PIN=$PIN BACKEND=$BACKEND NUMJOBS=$NUMJOBS"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit=$(cd "$ROOT" && git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "fio=$(fio --version)"
  echo "fio_cmd=fio --ioengine=nbd --group_reporting --norandommap --randrepeat=1 ${COMMON[*]} <job> --uri=URI"
  echo "harness_cmd=sealdisk bench --target=URI --output-format=json ${COMMON[*]} <job>"
} >"$OUT_DIR/meta.txt"

for j in $JOBS; do
  for rep in $(seq "$REPS"); do
    # shellcheck disable=SC2046 # job_args is a list of options
    {
      reset_cache
      "${client_pin[@]}" fio --name="$j" --ioengine=nbd --group_reporting --norandommap --randrepeat=1 \
        "${COMMON[@]}" $(job_args "$j") --uri="$URI" --output-format=json \
        --output="$OUT_DIR/$j.fio.$rep.json" >/dev/null
      reset_cache
      "${client_pin[@]}" "$SEALDISK_BIN" bench --target="$URI" --output-format=json --no-progress \
        "${COMMON[@]}" $(job_args "$j") >"$OUT_DIR/$j.harness.$rep.json"
    }
    log "$j rep $rep: $(python3 "$LIB/vs_fio.py" --one "$OUT_DIR" "$j" "$rep")"
  done
done
echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT_DIR/meta.txt"
python3 "$LIB/vs_fio.py" "$OUT_DIR" $JOBS | tee "$OUT_DIR/report.md"
