# Shared by the benchmark scripts (sourced, not run). Set PROG before sourcing.

die() { echo "$PROG: $*" >&2; exit 1; }
log() { echo "$PROG: $*" >&2; }

# size_bytes SIZE: prints SIZE (64M, 1G, 1GiB, 1GB: all binary) in bytes; dies unless it is a
# whole number of MiB of at least 16M.
size_bytes() {
  local iec="${1%B}" bytes
  iec="${iec%i}"
  bytes="$(numfmt --from=iec "$iec" 2>/dev/null)" || die "SIZE '$1' is not a size like 64M or 1G"
  (( bytes >= 16 * 1024 * 1024 && bytes % (1024 * 1024) == 0 )) ||
    die "SIZE must be a whole number of MiB, at least 16M"
  echo "$bytes"
}

# check_words KIND ALLOWED WORDS...: dies naming the first word not in ALLOWED.
check_words() {
  local kind="$1" allowed="$2" w
  shift 2
  for w in "$@"; do
    [[ " $allowed " == *" $w "* ]] || die "unknown $kind '$w' (known: $allowed)"
  done
}

# fio_job_args JOB: the fio options of one job of the peer and transport tables (the same for
# every variant).
fio_job_args() {
  case "$1" in
    seqwrite-1m)       echo "--rw=write --bs=1M --iodepth=8" ;;
    seqread-1m)        echo "--rw=read --bs=1M --iodepth=8" ;;
    randread-4k-qd1)   echo "--rw=randread --bs=4k --iodepth=1" ;;
    randwrite-4k-qd1)  echo "--rw=randwrite --bs=4k --iodepth=1" ;;
    randread-4k-qd32)  echo "--rw=randread --bs=4k --iodepth=32" ;;
    randwrite-4k-qd32) echo "--rw=randwrite --bs=4k --iodepth=32" ;;
  esac
}
