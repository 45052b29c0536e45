#!/usr/bin/env bash
# ublk vs kernel NBD vs FUSE (+ loop): the peer table's fio jobs on the block device each
# transport gives, in ONE boot of the kernel oracle's Linux 6.12 guest (emulated: qemu, KVM
# when the host allows it). Figures from a guest are read only as ratios between transports
# in the same run.
#
# Each transport serves its own LUKS2 aes-xts-plain64 volume (512-bit key, 4096-byte
# sectors, made on the host by `sealdisk luksFormat`) from its own virtio disk; all three
# are served and attached at once, and every job runs on the three devices back to back
# (ublk, nbd, fuse; REPS rounds of that), so the transports are interleaved job by job:
#   ublk  sealdisk --ublk: /dev/ublkbN
#   nbd   sealdisk --listen unix:SOCK, nbd-client -unix SOCK /dev/nbd0 -b 4096 (one connection)
#   fuse  sealdisk --fuse DIR, losetup --direct-io=on -b 4096 on DIR/NAME: /dev/loopN
# fio: --ioengine=libaio --direct=1 on the device, the jobs of scripts/bench-peers.sh
# (seqwrite-1m and seqread-1m at QD8, random 4k at QD1 and QD32), after one full write.
#
# Usage: scripts/bench-transports.sh   (knobs in the environment)
#   SEALDISK_BIN=path  a release build with --features ublk (default target/release/sealdisk)
#   SIZE=256M (per volume) RUNTIME=5 RAMP=1 REPS=2 SMP=2 MEM=2G
#   JOBS="seqwrite-1m seqread-1m randread-4k-qd1 randwrite-4k-qd1 randread-4k-qd32 randwrite-4k-qd32"
#   KERNEL_RUN=/work/shared/oracle/kernel-run  OUT_DIR=target/bench-results/transports-<stamp>
# Prints a markdown table (MiB/s or IOPS per transport, and each ÷ nbd) and keeps the raw
# guest log in OUT_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIB="$ROOT/scripts/bench-lib"
PROG=bench-transports
# shellcheck source=bench-lib/common.sh
source "$LIB/common.sh"
CMDLINE="$(printf '%q ' "$0" "$@")"

case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "no arguments are taken; the knobs are environment variables (see --help)" ;;
esac

SIZE="${SIZE:-256M}"
RUNTIME="${RUNTIME:-5}"
RAMP="${RAMP:-1}"
REPS="${REPS:-2}"
SMP="${SMP:-2}"
MEM="${MEM:-2G}"
ALL_JOBS="seqwrite-1m seqread-1m randread-4k-qd1 randwrite-4k-qd1 randread-4k-qd32 randwrite-4k-qd32"
JOBS="$(echo "${JOBS:-$ALL_JOBS}" | tr ',' ' ')"
KERNEL_RUN="${KERNEL_RUN:-/work/shared/oracle/kernel-run}"
SEALDISK_BIN="${SEALDISK_BIN:-$ROOT/target/release/sealdisk}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench-results/transports-$STAMP}"
# shellcheck disable=SC2086
check_words job "$ALL_JOBS" $JOBS
SIZE_BYTES="$(size_bytes "$SIZE")" || exit 1
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive integer"
[[ "$RUNTIME" =~ ^[1-9][0-9]*$ ]] || die "RUNTIME must be a positive number of seconds"
[[ "$RAMP" =~ ^[0-9]+$ ]] || die "RAMP must be a number of seconds"
[[ -x "$KERNEL_RUN" ]] || die "no kernel oracle at $KERNEL_RUN (set KERNEL_RUN)"
[[ -x "$SEALDISK_BIN" ]] || die "SEALDISK_BIN=$SEALDISK_BIN is not an executable (cargo build --release -p sealdisk --features ublk)"
"$SEALDISK_BIN" open --help 2>/dev/null | grep -q -- '--ublk' ||
  die "$SEALDISK_BIN has no --ublk: build it with --features ublk"
FUSERMOUNT=""
for f in /usr/bin/fusermount3 /bin/fusermount3; do [[ -f "$f" ]] && FUSERMOUNT="$f" && break; done
[[ -n "$FUSERMOUNT" ]] || die "no fusermount3 on the host to copy into the guest (apt-get install fuse3)"

mkdir -p "$OUT_DIR"
WORK="$(mktemp -d /tmp/sealdisk-transports.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
( umask 077; printf '%s' sealdisk-bench > "$WORK/pass" )
for t in ublk nbd fuse; do
  rm -f "$WORK/$t.img"
  truncate -s "$(( SIZE_BYTES + 16 * 1024 * 1024 ))" "$WORK/$t.img"
  "$SEALDISK_BIN" luksFormat -q --type luks2 --cipher aes-xts-plain64 --key-size 512 --sector-size 4096 \
    --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$WORK/pass" "$WORK/$t.img" >/dev/null
done

{
  for j in $JOBS; do echo "$j $(fio_job_args "$j")"; done
} > "$WORK/jobs.txt"
FIO_COMMON="--ioengine=libaio --direct=1 --size=$SIZE_BYTES --numjobs=1 --norandommap --randrepeat=1 --time_based --runtime=$RUNTIME --ramp_time=$RAMP --output-format=terse --terse-version=3"
echo "$FIO_COMMON" > "$WORK/fio-common.txt"
echo "$REPS" > "$WORK/reps.txt"

cat > "$WORK/guest.sh" <<'EOF'
#!/bin/bash
# Guest half of scripts/bench-transports.sh. Markers: "FIO <transport> <job> <rep> <MiB/s>
# <IOPS>", "DEV <transport> <device>", "FAIL <what>".
set -uo pipefail
cd /kr
SD=/kr/sealdisk
export FUSERMOUNT_PATH=/kr/fusermount3
chmod 0755 "$FUSERMOUNT_PATH"
modprobe ublk_drv 2>/dev/null; modprobe nbd nbds_max=4 2>/dev/null; modprobe fuse 2>/dev/null; modprobe loop 2>/dev/null
command -v fio >/dev/null || { echo "FAIL no fio in the guest"; exit 1; }
PIDS=()
fail() { echo "FAIL $*"; for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; exit 1; }
wait_for() { # wait_for SECS TEST...
  local i; for ((i = 0; i < $1 * 10; i++)); do "${@:2}" && return 0; sleep 0.1; done; return 1
}
# ublk
$SD open --key-file /kr/pass /dev/vda tu --ublk >/tmp/ublk.log 2>&1 & PIDS+=($!)
found_ublk() { UBLK=$(sed -n 's/^sealdisk: serving .* as \(\/dev\/ublkb[0-9]*\) .*/\1/p' /tmp/ublk.log | tail -1); [ -n "$UBLK" ] && [ -b "$UBLK" ]; }
wait_for 60 found_ublk || { cat /tmp/ublk.log; fail "ublk server did not start"; }
echo "DEV ublk $UBLK"
# nbd
$SD open --key-file /kr/pass /dev/vdb tn --listen unix:/tmp/tn.sock >/tmp/nbd.log 2>&1 & PIDS+=($!)
wait_for 60 test -S /tmp/tn.sock || { cat /tmp/nbd.log; fail "nbd server did not start"; }
nbd-client -unix /tmp/tn.sock /dev/nbd0 -N tn -b 4096 >/dev/null 2>&1 || fail "nbd-client"
echo "DEV nbd /dev/nbd0"
# fuse
mkdir -p /run/tf
$SD open --key-file /kr/pass /dev/vdc tf --fuse /run/tf >/tmp/fuse.log 2>&1 & PIDS+=($!)
wait_for 60 test -f /run/tf/tf || { cat /tmp/fuse.log; fail "fuse server did not start"; }
LOOP=$(losetup -f --show --direct-io=on -b 4096 /run/tf/tf) || fail "losetup"
echo "DEV fuse $LOOP dio=$(cat /sys/block/${LOOP#/dev/}/loop/dio 2>/dev/null)"
declare -A DEVS=([ublk]=$UBLK [nbd]=/dev/nbd0 [fuse]=$LOOP)
read -r COMMON < /kr/fio-common.txt
read -r REPS < /kr/reps.txt
for t in ublk nbd fuse; do
  # shellcheck disable=SC2086
  fio --name=precondition --filename="${DEVS[$t]}" --ioengine=libaio --direct=1 --rw=write --bs=1M --iodepth=8 \
    --size=$(blockdev --getsize64 "${DEVS[$t]}") --end_fsync=1 --output-format=terse >/dev/null 2>&1 || fail "precondition $t"
done
while read -r job args; do
  for rep in $(seq "$REPS"); do
    for t in ublk nbd fuse; do
      # terse v3: field 7 read bw KiB/s, 8 read IOPS; 48 write bw KiB/s, 49 write IOPS.
      # shellcheck disable=SC2086
      line=$(fio --name="$job" --filename="${DEVS[$t]}" $COMMON $args 2>/dev/null | tail -1) || fail "fio $job $t"
      echo "$line" | awk -F';' -v t="$t" -v j="$job" -v r="$rep" \
        '{ bw = $7 + $48; io = $8 + $49; printf "FIO %s %s %s %.1f %.0f\n", t, j, r, bw / 1024, io }'
    done
  done
done < /kr/jobs.txt
losetup -d "$LOOP"; nbd-client -d /dev/nbd0 >/dev/null 2>&1
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${PIDS[@]}"; do wait "$p"; done
echo "DONE"
EOF
chmod +x "$WORK/guest.sh"

{
  echo "command=$CMDLINE"
  echo "env=SIZE=$SIZE RUNTIME=$RUNTIME RAMP=$RAMP REPS=$REPS SMP=$SMP MEM=$MEM"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host_nproc=$(nproc)"
  echo "loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit=$(cd "$ROOT" && git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "fio=$FIO_COMMON <job options>"
  echo "sealdisk=$SEALDISK_BIN"
} > "$OUT_DIR/meta.txt"
log "booting the 6.12 guest ($KERNEL_RUN --kernel 6.12); this takes minutes"
"$KERNEL_RUN" --kernel 6.12 --smp "$SMP" --mem "$MEM" --timeout 3000 \
  --disk "$WORK/ublk.img" --disk "$WORK/nbd.img" --disk "$WORK/fuse.img" \
  --file "$SEALDISK_BIN" --file "$FUSERMOUNT" --file "$WORK/pass" --file "$WORK/jobs.txt" \
  --file "$WORK/fio-common.txt" --file "$WORK/reps.txt" "$WORK/guest.sh" > "$OUT_DIR/guest.log" 2>"$OUT_DIR/kernel-run.err" ||
  { cat "$OUT_DIR/guest.log" "$OUT_DIR/kernel-run.err" >&2; die "the guest run failed"; }
echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT_DIR/meta.txt"
grep -q '^DONE' "$OUT_DIR/guest.log" || { cat "$OUT_DIR/guest.log" >&2; die "the guest did not finish"; }
grep '^DEV ' "$OUT_DIR/guest.log" >> "$OUT_DIR/meta.txt"
cat "$OUT_DIR/meta.txt" >&2

python3 - "$OUT_DIR/guest.log" <<'EOF' | tee "$OUT_DIR/report.md"
import statistics, sys
rows = {}
order = []
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 6 and p[0] == "FIO":
        _, t, job, _rep, mib, iops = p
        if job not in order:
            order.append(job)
        rows.setdefault(job, {}).setdefault(t, []).append((float(mib), float(iops)))
print("| job (emulated guest: ratios only) | ublk | nbd (unix) | fuse + loop | ublk ÷ nbd | fuse ÷ nbd |")
print("|---|---:|---:|---:|---:|---:|")
for job in order:
    seq = job.startswith("seq")
    val = {t: statistics.median(v[0] if seq else v[1] for v in rows[job].get(t, [(0, 0)])) for t in ("ublk", "nbd", "fuse")}
    unit = "MiB/s" if seq else "IOPS"
    cell = lambda x: f"{x:,.0f} {unit}"
    ratio = lambda x: f"{x / val['nbd']:.2f}×" if val["nbd"] else "—"
    print(f"| {job} | {cell(val['ublk'])} | {cell(val['nbd'])} | {cell(val['fuse'])} | {ratio(val['ublk'])} | {ratio(val['fuse'])} |")
EOF
log "guest log and meta: $OUT_DIR"
