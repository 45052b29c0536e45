#!/usr/bin/env bash
# Side-by-side benchmark of sealdisk against its NBD peers, with fio's libnbd engine.
#
# Variants (each a server on a unix socket, each over its own preallocated backing file):
#   nbdkit-null     nbdkit's null plugin: no storage, no encryption; what fio's client, the
#                   socket and nbdkit's request handling cost on their own
#   nbdkit-file     nbdkit's file plugin, no filter, no encryption (the unencrypted baseline)
#   nbdkit-luks     nbdkit's file plugin + luks filter, LUKS1 aes-xts-plain64, 512-bit key
#   qemu-nbd-luks   qemu-nbd's luks driver over the same kind of LUKS1 image
#   sealdisk-auto   sealdisk plain aes-xts-plain64, 512-bit key, 4096-byte sectors, default
#                   crypto placement (inline up to 64 KiB, larger requests split across cores)
#   sealdisk-pool   the same with --crypt-mode pool (every request handed to the crypto pool)
#   sealdisk-inline the same with --perf-no_read_workqueue --perf-no_write_workqueue
#   sealdisk-nocrypt sealdisk with cipher_null-ecb: the same server and engine, no AES (not
#                   in the default set); how much of a gap to nbdkit-file is the cipher's
#   sealdisk-base   sealdisk-auto run by another binary, $SEALDISK_BASE_BIN (not in the default
#                   set): a before/after comparison interleaved in one run
# TLS variants (not in the default set; VARIANTS="nbdkit-file-tls nbdkit-luks-tls sealdisk-tls"):
# the same servers with --tls=require and one x509 server certificate (made with the openssl
# CLI for the run), on TCP 127.0.0.1:$TLS_PORT, reached by fio as nbds://127.0.0.1:PORT/bench
# (fio's engine may not name files in a URI, so libnbd finds the CA in $HOME/.pki/libnbd/,
# with HOME set for the clients only)
#   nbdkit-file-tls  nbdkit-file with --tls=require
#   nbdkit-luks-tls  nbdkit-luks with --tls=require
#   sealdisk-tls     sealdisk-auto with --tls=require --tls-certificates
# Cipher variants (issue 11; not in the default set): sealdisk serving a LUKS2 volume it
# formatted (4096-byte sectors, PBKDF2 at 1000 iterations), one per cipher, each over its own
# backing file of SIZE + 16 MiB (the LUKS2 header):
#   sealdisk-luks2-aes         aes-xts-plain64, 512-bit key
#   sealdisk-luks2-serpent     serpent-xts-plain64, 512-bit key
#   sealdisk-luks2-twofish     twofish-xts-plain64, 512-bit key
#   sealdisk-luks2-adiantum12  xchacha12,aes-adiantum-plain64, 256-bit key
#   sealdisk-luks2-adiantum20  xchacha20,aes-adiantum-plain64, 256-bit key
#   ...-noaes                  the same volume served as on a CPU without AES instructions:
#                              $SEALDISK_SOFT_BIN (a build with RUSTFLAGS='--cfg aes_force_soft
#                              --cfg aes_backend="soft"': RustCrypto's software AES) with
#                              OPENSSL_ia32cap=$NOAES_IA32CAP (AWS-LC's AES-NI, PCLMUL, VAES,
#                              VPCLMULQDQ bits cleared)
# Every variant runs the same fio jobs in the same run; repetitions are interleaved
# (A B C A B C) and the report gives medians. Method and caveats: BENCHMARKING.md.
#
# Usage: scripts/bench-peers.sh            (knobs in the environment, see BENCHMARKING.md)
#   SIZE=1G RUNTIME=10 RAMP=2 REPS=1 CACHE=buffered|direct PAGECACHE=small|keep
#   VARIANTS="nbdkit-null nbdkit-file nbdkit-luks qemu-nbd-luks sealdisk-auto sealdisk-pool sealdisk-inline"
#   JOBS="seqwrite-1m seqread-1m randread-4k-qd1 randwrite-4k-qd1 randread-4k-qd32 randwrite-4k-qd32"
#   SEALDISK_BIN=path (skip the cargo build)  QEMU_AIO=threads|io_uring|native
#   SEALDISK_SOFT_BIN=path (the software-AES build, for the -noaes variants)
#   TLS_PORT=10899 (the TLS variants' TCP port on 127.0.0.1)
#   BENCH_DIR=target/bench-tmp (backing files)  OUT_DIR=target/bench-results/<stamp>
#   KEEP_TMP=1 (keep the backing files; reports, fio JSON and server logs always stay in OUT_DIR)
# Before every job the backing file is written back and, with PAGECACHE=small (the default),
# dropped from the page cache and read back in 4 KiB pages, so every variant starts each job
# on the same cache state (scripts/bench-lib/pagecache.py says why); PAGECACHE=keep leaves
# the cache as the server's own writes made it. With CACHE=direct the file is only dropped.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIB="$ROOT/scripts/bench-lib"
PROG=bench-peers
# shellcheck source=bench-lib/common.sh
source "$LIB/common.sh"
CMDLINE="$(printf '%q ' "$0" "$@")"

SIZE="${SIZE:-1G}"
RUNTIME="${RUNTIME:-10}"
RAMP="${RAMP:-2}"
REPS="${REPS:-1}"
CACHE="${CACHE:-buffered}"
PAGECACHE="${PAGECACHE:-small}"
DEFAULT_VARIANTS="nbdkit-null nbdkit-file nbdkit-luks qemu-nbd-luks sealdisk-auto sealdisk-pool sealdisk-inline"
TLS_VARIANTS="nbdkit-file-tls nbdkit-luks-tls sealdisk-tls"
CIPHERS="aes serpent twofish adiantum12 adiantum20"
CIPHER_VARIANTS="$(for c in $CIPHERS; do printf 'sealdisk-luks2-%s sealdisk-luks2-%s-noaes ' "$c" "$c"; done)"
ALL_VARIANTS="$DEFAULT_VARIANTS sealdisk-nocrypt sealdisk-base $TLS_VARIANTS $CIPHER_VARIANTS"
NOAES_IA32CAP='~0x200000200000000:~0x60000000000'
cipher_of() { # cipher_of VARIANT: the LUKS2 cipher word of a cipher variant
  local c="${1#sealdisk-luks2-}"; echo "${c%-noaes}"
}
cipher_spec() { # cipher_spec WORD: --cipher and --key-size of luksFormat
  case "$1" in
    aes) echo "aes-xts-plain64 512" ;;
    serpent) echo "serpent-xts-plain64 512" ;;
    twofish) echo "twofish-xts-plain64 512" ;;
    adiantum12) echo "xchacha12,aes-adiantum-plain64 256" ;;
    adiantum20) echo "xchacha20,aes-adiantum-plain64 256" ;;
  esac
}
ALL_JOBS="seqwrite-1m seqread-1m randread-4k-qd1 randwrite-4k-qd1 randread-4k-qd32 randwrite-4k-qd32"
VARIANTS="$(echo "${VARIANTS:-$DEFAULT_VARIANTS}" | tr ',' ' ')"
JOBS="$(echo "${JOBS:-$ALL_JOBS}" | tr ',' ' ')"
BENCH_DIR="${BENCH_DIR:-$ROOT/target/bench-tmp}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT_DIR="${OUT_DIR:-$ROOT/target/bench-results/$STAMP}"
EXPORT=bench
PASSPHRASE=sealdisk-bench   # a benchmark secret; it only ever lives in a 0600 file
TLS_PORT="${TLS_PORT:-10899}"


# ---------------------------------------------------------------- arguments and knobs
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "no arguments are taken; the knobs are environment variables (see --help)" ;;
esac
# shellcheck disable=SC2086 # word lists
check_words variant "$ALL_VARIANTS" $VARIANTS
# shellcheck disable=SC2086
check_words job "$ALL_JOBS" $JOBS
[[ "$CACHE" == buffered || "$CACHE" == direct ]] || die "CACHE must be buffered or direct, not '$CACHE'"
[[ "$PAGECACHE" == small || "$PAGECACHE" == keep ]] || die "PAGECACHE must be small or keep, not '$PAGECACHE'"
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive integer"
[[ "$RUNTIME" =~ ^[1-9][0-9]*$ ]] || die "RUNTIME must be a positive number of seconds"
[[ "$RAMP" =~ ^[0-9]+$ ]] || die "RAMP must be a number of seconds"
SIZE_BYTES="$(size_bytes "$SIZE")" || exit 1
if [[ "$CACHE" == direct ]]; then QEMU_AIO="${QEMU_AIO:-native}"; else QEMU_AIO="${QEMU_AIO:-threads}"; fi

wants() { [[ " $VARIANTS " == *" $1"* ]]; }   # wants nbdkit / qemu / sealdisk (prefix match)
wants_tls() { [[ " $VARIANTS " == *"-tls "* ]]; }
is_tls() { [[ "$1" == *-tls ]]; }

# ---------------------------------------------------------------- tools (installs nothing)
missing=()
need() { # need PACKAGE WHY COMMAND...
  local pkg="$1" why="$2"; shift 2
  if ! "$@" >/dev/null 2>&1; then missing+=("$pkg: $why"); fi
}
need fio "fio" command -v fio
need fio "fio's nbd ioengine (fio built with libnbd)" fio --enghelp=nbd
need libnbd-bin "nbdinfo" command -v nbdinfo
need python3 "python3 (parses fio's JSON)" command -v python3
need coreutils "numfmt, sync" command -v sync
if wants nbdkit; then
  need nbdkit "nbdkit" command -v nbdkit
  need nbdkit "nbdkit's file plugin" nbdkit file --dump-plugin
fi
if wants nbdkit-luks; then
  need nbdkit "nbdkit's luks filter (nbdkit >= 1.32)" nbdkit --filter=luks null --dump-plugin
fi
if wants nbdkit-luks || wants qemu; then
  need qemu-utils "qemu-img (creates the LUKS1 image)" command -v qemu-img
fi
if wants qemu; then
  need qemu-utils "qemu-nbd" command -v qemu-nbd
fi
if wants_tls; then
  need openssl "openssl (makes the TLS variants' certificates)" command -v openssl
fi
if wants sealdisk && [[ -z "${SEALDISK_BIN:-}" ]]; then
  need "rustup/cargo (not a Debian package here)" "cargo, to build sealdisk (or set SEALDISK_BIN)" command -v cargo
fi
if (( ${#missing[@]} )); then
  echo "bench-peers: missing tools; install the Debian packages named below:" >&2
  printf '  %s\n' "${missing[@]}" >&2
  pkgs="$(printf '%s\n' "${missing[@]}" | cut -d: -f1 | grep -v ' ' | sort -u | tr '\n' ' ')"
  [[ -n "$pkgs" ]] && echo "  e.g.: apt-get install $pkgs" >&2
  exit 2
fi

# ---------------------------------------------------------------- build sealdisk
if wants sealdisk; then
  if [[ -n "${SEALDISK_BIN:-}" ]]; then
    [[ -x "$SEALDISK_BIN" ]] || die "SEALDISK_BIN=$SEALDISK_BIN is not an executable"
  else
    log "building sealdisk (release)"
    (cd "$ROOT" && cargo build --release -p sealdisk) >&2 || die "cargo build --release -p sealdisk failed"
    target_dir="$(cd "$ROOT" && cargo metadata --no-deps --format-version 1 |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    SEALDISK_BIN="$target_dir/release/sealdisk"
  fi
  SEALDISK_BIN="$(cd "$(dirname "$SEALDISK_BIN")" && pwd)/$(basename "$SEALDISK_BIN")"
fi
if [[ " $VARIANTS " == *"-noaes "* ]]; then
  [[ -x "${SEALDISK_SOFT_BIN:-}" ]] ||
    die "the -noaes variants need SEALDISK_SOFT_BIN: RUSTFLAGS='--cfg aes_force_soft --cfg aes_backend=\"soft\"' CARGO_TARGET_DIR=/tmp/soft cargo build --release -p sealdisk"
fi
if wants sealdisk-base; then
  [[ -x "${SEALDISK_BASE_BIN:-}" ]] || die "variant sealdisk-base needs SEALDISK_BASE_BIN=path to another sealdisk binary"
fi

# ---------------------------------------------------------------- scratch space and cleanup
mkdir -p "$BENCH_DIR" "$OUT_DIR"
WORK="$(mktemp -d "$BENCH_DIR/run.XXXXXX")"
SOCKDIR="$(mktemp -d /tmp/sealdisk-bench.XXXXXX)"   # short path: sun_path is 108 bytes
# The servers' control sockets (named after $EXPORT) in a private runtime directory: runs in
# parallel, and the user's own running volumes, keep their names.
export SEALDISK_RUNTIME_DIR="$SOCKDIR/run"
SERVER_PID=""
FIO_PID=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$FIO_PID" ]]; then
    kill -TERM "$FIO_PID" 2>/dev/null || true
    wait "$FIO_PID" 2>/dev/null || true
  fi
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [[ "${KEEP_TMP:-0}" == 1 ]]; then
    log "kept $WORK"
  else
    rm -rf "$WORK"
  fi
  rm -rf "$SOCKDIR"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

PASSFILE="$WORK/passphrase"
KEYFILE="$WORK/sealdisk.key"
( umask 077; printf '%s' "$PASSPHRASE" > "$PASSFILE"; head -c 64 /dev/urandom > "$KEYFILE" )

preallocate() { # preallocate FILE BYTES: real blocks, no holes, nothing cached
  rm -f "$1"
  if ! fallocate -l "$2" "$1" 2>/dev/null; then
    dd if=/dev/zero of="$1" bs=1M count="$(( $2 / 1048576 ))" conv=fsync status=none
  fi
}

if wants_tls; then
  # A CA and a server certificate for 127.0.0.1/localhost in nbdkit's and sealdisk's layout;
  # the client directory holds only the CA (no client authentication: this measures the
  # encryption, not the handshake).
  PKI="$WORK/pki"
  mkdir -p "$PKI/server" "$PKI/home/.pki/libnbd"
  (
    cd "$PKI/server"
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 \
      -keyout ca-key.pem -out ca-cert.pem -subj /CN=bench-ca \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -keyout server-key.pem -out server.csr -subj /CN=localhost 2>/dev/null
    printf '%s\n' 'subjectAltName=DNS:localhost,IP:127.0.0.1' 'extendedKeyUsage=serverAuth' \
      'basicConstraints=critical,CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' >server.ext
    openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -days 7 \
      -extfile server.ext -out server-cert.pem 2>/dev/null
    rm -f ca-key.pem server.csr server.ext ca-cert.srl
    cp ca-cert.pem ../home/.pki/libnbd/
  ) || die "making the TLS certificates with openssl failed"
fi

log "creating backing files of $SIZE in $WORK"
if wants nbdkit-file; then preallocate "$WORK/raw.img" "$SIZE_BYTES"; fi
if [[ " $VARIANTS " =~ \ sealdisk-(auto|pool|inline|nocrypt|tls)\  ]]; then preallocate "$WORK/sealdisk.img" "$SIZE_BYTES"; fi
for c in $CIPHERS; do
  if wants "sealdisk-luks2-$c"; then
    read -r spec bits <<<"$(cipher_spec "$c")"
    preallocate "$WORK/luks2-$c.img" "$(( SIZE_BYTES + 16 * 1024 * 1024 ))"
    "$SEALDISK_BIN" luksFormat -q --type luks2 --cipher "$spec" --key-size "$bits" --sector-size 4096 \
      --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$PASSFILE" "$WORK/luks2-$c.img" >/dev/null ||
      die "luksFormat --cipher $spec failed"
  fi
done
if wants nbdkit-luks || wants qemu; then
  # LUKS1, aes-xts-plain64, 512-bit master key (aes-256 per XTS half), sha256, fast PBKDF.
  qemu-img create -q -f luks \
    --object "secret,id=sec0,file=$PASSFILE" \
    -o key-secret=sec0,cipher-alg=aes-256,cipher-mode=xts,ivgen-alg=plain64,hash-alg=sha256,iter-time=10,preallocation=falloc \
    "$WORK/luks1.img" "$SIZE_BYTES"
fi

# ---------------------------------------------------------------- servers
# server_cmd VARIANT SOCK: the exact server command line, one word per line.
server_cmd() {
  local v="$1" sock="$2" nbdkit_cache=default qemu_cache=writeback sealdisk_direct=()
  if [[ "$CACHE" == direct ]]; then nbdkit_cache=none; qemu_cache=none; sealdisk_direct=(--direct); fi
  local nbdkit_listen=(-U "$sock") sealdisk_listen=(--listen "unix:$sock")
  if is_tls "$v"; then
    nbdkit_listen=(-i 127.0.0.1 -p "$TLS_PORT" --tls=require "--tls-certificates=$PKI/server")
    sealdisk_listen=(--listen "tcp:127.0.0.1:$TLS_PORT" --tls=require --tls-certificates "$PKI/server")
  fi
  case "$v" in
    nbdkit-null)
      printf '%s\n' nbdkit --foreground --exit-with-parent -U "$sock" null "size=$SIZE_BYTES" ;;
    nbdkit-file|nbdkit-file-tls)
      printf '%s\n' nbdkit --foreground --exit-with-parent "${nbdkit_listen[@]}" \
        file "file=$WORK/raw.img" "cache=$nbdkit_cache" ;;
    nbdkit-luks|nbdkit-luks-tls)
      printf '%s\n' nbdkit --foreground --exit-with-parent "${nbdkit_listen[@]}" --filter=luks \
        file "file=$WORK/luks1.img" "cache=$nbdkit_cache" "passphrase=+$PASSFILE" ;;
    qemu-nbd-luks)
      printf '%s\n' qemu-nbd "--socket=$sock" "--export-name=$EXPORT" --persistent --shared=4 \
        --object "secret,id=sec0,file=$PASSFILE" \
        "--cache=$qemu_cache" "--aio=$QEMU_AIO" --discard=ignore --detect-zeroes=off \
        --image-opts "driver=luks,key-secret=sec0,file.driver=file,file.filename=$WORK/luks1.img" ;;
    sealdisk-nocrypt)
      printf '%s\n' "$SEALDISK_BIN" open --type plain --cipher cipher_null-ecb --key-size 0 \
        --key-file /dev/null --sector-size 4096 "${sealdisk_direct[@]}" \
        "$WORK/sealdisk.img" "$EXPORT" --listen "unix:$sock" ;;
    sealdisk-luks2-*-noaes)
      printf '%s\n' env "OPENSSL_ia32cap=$NOAES_IA32CAP" "$SEALDISK_SOFT_BIN" open --type luks2 \
        --key-file "$PASSFILE" "${sealdisk_direct[@]}" "$WORK/luks2-$(cipher_of "$v").img" "$EXPORT" --listen "unix:$sock" ;;
    sealdisk-luks2-*)
      printf '%s\n' "$SEALDISK_BIN" open --type luks2 --key-file "$PASSFILE" "${sealdisk_direct[@]}" \
        "$WORK/luks2-$(cipher_of "$v").img" "$EXPORT" --listen "unix:$sock" ;;
    sealdisk-auto|sealdisk-pool|sealdisk-inline|sealdisk-tls|sealdisk-base)
      local bin="$SEALDISK_BIN"
      [[ "$v" == sealdisk-base ]] && bin="$SEALDISK_BASE_BIN"
      printf '%s\n' "$bin" open --type plain --cipher aes-xts-plain64 --key-size 512 \
        --key-file "$KEYFILE" --sector-size 4096 "${sealdisk_direct[@]}"
      [[ "$v" == sealdisk-pool ]] && printf '%s\n' --crypt-mode pool
      [[ "$v" == sealdisk-inline ]] && printf '%s\n' --perf-no_read_workqueue --perf-no_write_workqueue
      printf '%s\n' "$WORK/sealdisk.img" "$EXPORT" "${sealdisk_listen[@]}" ;;
  esac
}

# The clients' environment: the TLS variants' clients find the CA under this HOME.
CLIENT_ENV=()
uri_of() { # uri_of VARIANT SOCK: the URI fio and nbdinfo use
  if is_tls "$1"; then
    echo "nbds://127.0.0.1:$TLS_PORT/$EXPORT"
  else
    echo "nbd+unix:///$EXPORT?socket=$2"
  fi
}

backing_of() { # the variant's backing file; nothing for nbdkit-null
  case "$1" in
    nbdkit-null) ;;
    nbdkit-file|nbdkit-file-tls) echo "$WORK/raw.img" ;;
    nbdkit-luks|nbdkit-luks-tls|qemu-nbd-luks) echo "$WORK/luks1.img" ;;
    sealdisk-luks2-*) echo "$WORK/luks2-$(cipher_of "$1").img" ;;
    sealdisk-*) echo "$WORK/sealdisk.img" ;;
  esac
}

start_server() { # start_server VARIANT SOCK LOG
  local v="$1" sock="$2" logf="$3" cmd=()
  mapfile -t cmd < <(server_cmd "$v" "$sock")
  rm -f "$sock"
  "${cmd[@]}" >"$logf" 2>&1 &
  SERVER_PID=$!
  local uri size=""
  uri="$(uri_of "$v" "$sock")"
  for _ in $(seq 300); do
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$logf" >&2; die "$v: server exited during start-up"; }
    if { is_tls "$v" || [[ -S "$sock" ]]; } && size="$(env "${CLIENT_ENV[@]}" nbdinfo --size "$uri" 2>/dev/null)"; then
      break
    fi
    sleep 0.1
  done
  [[ -n "$size" ]] || { cat "$logf" >&2; die "$v: no NBD handshake on $sock after 30 s"; }
  [[ "$size" == "$SIZE_BYTES" ]] || die "$v: export is $size bytes, expected $SIZE_BYTES"
}

stop_server() { # stop_server VARIANT LOG: SIGTERM, then wait up to 20 s
  local v="$1" logf="$2" rc=0
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 200); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    log "WARNING: $v did not exit 20 s after SIGTERM; killing it"
    echo "$v needed SIGKILL" >>"$OUT_DIR/problems.txt"
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  wait "$SERVER_PID" 2>/dev/null || rc=$?
  SERVER_PID=""
  # 143 (died of SIGTERM) is a clean stop for the peers; sealdisk must catch SIGTERM, flush,
  # say so and exit 0.
  local ok=0
  case "$v" in
    sealdisk-*) (( rc == 0 )) && grep -q 'flushed and closed' "$logf" && ok=1 ;;
    *) (( rc == 0 || rc == 143 )) && ok=1 ;;
  esac
  if (( ! ok )); then
    log "WARNING: $v did not stop cleanly on SIGTERM: status $rc (log: $logf)"
    echo "$v did not stop cleanly on SIGTERM: status $rc (log: $logf)" >>"$OUT_DIR/problems.txt"
  fi
}

proc_cpu_ticks() { # utime+stime of all threads of a process, in clock ticks
  # Fields after "(comm)": state is 1st, utime 12th, stime 13th.
  local t
  t="$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12 + $13 }')" || true
  echo "${t:-0}"
}

# ---------------------------------------------------------------- page cache
reset_pagecache() { # reset_pagecache FILE
  if [[ "$CACHE" == direct ]]; then
    python3 "$LIB/pagecache.py" drop "$1"
  elif [[ "$PAGECACHE" == small ]]; then
    python3 "$LIB/pagecache.py" small "$1"
  else
    sync "$1"
  fi
}
pagecache_desc() {
  if [[ "$CACHE" == direct ]]; then echo "backing file written back and dropped (pagecache.py drop)"
  elif [[ "$PAGECACHE" == small ]]; then echo "backing file written back, dropped, read back in 4 KiB pages (pagecache.py small)"
  else echo "backing file written back (sync), cache left as the server made it"; fi
}

# ---------------------------------------------------------------- fio jobs
FIO_COMMON=(--ioengine=nbd --size="$SIZE_BYTES" --numjobs=1 --norandommap --randrepeat=1
            --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --output-format=json)

run_fio() { # run_fio NAME URI JSON LOG [fio options...]
  local name="$1" uri="$2" json="$3" logf="$4"; shift 4
  # --uri is an option of the nbd engine, so it must follow --ioengine. fio runs in the
  # background so that a SIGTERM to this script is handled at once, not after the job.
  local rc=0
  env "${CLIENT_ENV[@]}" fio --name="$name" --output="$json" "$@" --uri="$uri" >"$logf" 2>&1 &
  FIO_PID=$!
  wait "$FIO_PID" || rc=$?
  FIO_PID=""
  if (( rc != 0 )); then
    cat "$logf" >&2
    die "fio job $name failed against $uri (status $rc)"
  fi
}

# ---------------------------------------------------------------- the run
{
  echo "command=$CMDLINE"
  echo "env=SIZE=$SIZE RUNTIME=$RUNTIME RAMP=$RAMP REPS=$REPS CACHE=$CACHE PAGECACHE=$PAGECACHE QEMU_AIO=$QEMU_AIO"
  echo "variants=$VARIANTS"
  echo "jobs=$JOBS"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nproc=$(nproc)"
  echo "cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "cpu_flags_aes=$(grep -m1 -ow -e aes -e vaes /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "mem=$(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "kernel=$(uname -srm)"
  echo "fs=$(findmnt -n -o FSTYPE,SOURCE -T "$WORK" 2>/dev/null | tr -s ' ')"
  echo "loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "git=$(cd "$ROOT" && git describe --always --dirty --tags 2>/dev/null || echo unknown)"
  echo "commit=$(cd "$ROOT" && git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "fio=$(fio --version)"
  echo "libnbd=$(nbdinfo --version 2>/dev/null | tail -1)"
  if wants nbdkit; then echo "nbdkit=$(nbdkit --version)"; fi
  if wants nbdkit-luks || wants qemu; then echo "qemu=$(qemu-img --version | head -1)"; fi
  if wants sealdisk-base; then echo "sealdisk-base=$SEALDISK_BASE_BIN"; fi
  if wants sealdisk; then echo "sealdisk=$SEALDISK_BIN ($("$SEALDISK_BIN" --version 2>/dev/null || echo 'no --version'))"; fi
  if [[ " $VARIANTS " == *"-noaes "* ]]; then echo "sealdisk_soft=$SEALDISK_SOFT_BIN, OPENSSL_ia32cap=$NOAES_IA32CAP"; fi
  for v in $VARIANTS; do
    echo "server.$v=$(server_cmd "$v" "$SOCKDIR/$v.sock" | tr '\n' ' ' | sed 's/ $//')"
  done
  for j in $JOBS; do
    echo "job.$j=fio ${FIO_COMMON[*]} $(fio_job_args "$j") --uri=nbd+unix:///$EXPORT?socket=SOCK (TLS variants: --uri=$(uri_of x-tls SOCK))"
  done
  echo "pagecache=before every job: $(pagecache_desc)"
  echo "precondition=fio --ioengine=nbd --rw=write --bs=1M --iodepth=8 --size=$SIZE_BYTES --end_fsync=1 (once per server start)"
} >"$OUT_DIR/meta.txt"

total=$(( REPS * $(wc -w <<<"$VARIANTS") ))
n=0
for rep in $(seq "$REPS"); do
  for v in $VARIANTS; do
    n=$(( n + 1 ))
    dir="$OUT_DIR/raw/rep$rep/$v"
    mkdir -p "$dir"
    sock="$SOCKDIR/$v.sock"
    uri="$(uri_of "$v" "$sock")"
    CLIENT_ENV=()
    if is_tls "$v"; then CLIENT_ENV=("HOME=$PKI/home"); fi
    img="$(backing_of "$v")"
    log "[$n/$total] rep $rep: $v"
    start_server "$v" "$sock" "$dir/server.log"
    # Precondition: write the whole export once, so every read hits real ciphertext/data and
    # every variant starts from the same state (file fully written, flushed, in the page cache).
    run_fio precondition "$uri" "$dir/precondition.json" "$dir/precondition.log" \
      --ioengine=nbd --size="$SIZE_BYTES" --rw=write --bs=1M --iodepth=8 --end_fsync=1 --output-format=json
    for j in $JOBS; do
      # No dirty pages from the previous job are written back during this one, and every
      # variant starts the job on the same page-cache state.
      [[ -n "$img" ]] && reset_pagecache "$img"
      t0=$(proc_cpu_ticks "$SERVER_PID"); s0=$(date +%s.%N)
      # shellcheck disable=SC2046 # fio_job_args is a list of options
      run_fio "$j" "$uri" "$dir/$j.json" "$dir/$j.log" "${FIO_COMMON[@]}" $(fio_job_args "$j")
      t1=$(proc_cpu_ticks "$SERVER_PID"); s1=$(date +%s.%N)
      echo "$t0 $t1 $s0 $s1 $(getconf CLK_TCK)" >"$dir/$j.cpu"
      log "    $j: $(python3 "$LIB/report.py" --one "$dir/$j.json")"
    done
    stop_server "$v" "$dir/server.log"
  done
done
echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT_DIR/meta.txt"

python3 "$LIB/report.py" "$OUT_DIR" | tee "$OUT_DIR/report.md"
log "raw fio JSON and server logs: $OUT_DIR"
