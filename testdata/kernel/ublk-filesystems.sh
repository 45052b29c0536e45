#!/bin/bash
# Guest half of the ublk test (crates/cli/tests/cli/ublk_kernel.rs, run through
# /work/shared/oracle/kernel-run --kernel 6.12): sealdisk serves each stack in
# /kr/cases.txt as /dev/ublkbN (`--ublk`) from a virtio disk.
#
# /kr/cases.txt, one line per stack: "name|sealdisk arguments" (the arguments name the
# device and the volume name; --ublk is added here). /kr/a.tar: a source tree; /kr/a.sha:
# its sha256sum list.
#
# Per stack:
#   1. serve; the device's queue limits match what sealdisk reports (block sizes, one hw
#      queue per CPU, write-back cache, rotational as the virtio disk);
#   2. mkfs.ext4, mount, unpack, sync, umount, e2fsck -fn; SIGTERM (the device goes away,
#      the server exits 0); serve again, mount, check every file, umount;
#   3. a short fio write+verify job on the raw device (direct I/O, queue depth 16).
# Then, on a plain volume over a sparse file in tmpfs: fstrim releases blocks of the file;
# read-only serving; SIGKILL of the server under fio load (I/O must fail, nothing may hang,
# and a new server may take the same id); user recovery (a mounted ext4 survives the
# server's SIGKILL and a `--ublk ID --ublk-recover` restart).
# Markers (parsed by the host): "RESULT <name> <step> ok|FAIL <detail>", "TIME <name>
# <seconds>", "TIMEOUT ..." for a step that did not finish. Every step has a deadline.
set -uo pipefail
cd /kr
SD=/kr/sealdisk
modprobe ublk_drv 2>/dev/null || true
modprobe ext4 2>/dev/null || true

PID=
DEV=
LOG=
T0=$(date +%s)
result() { echo "RESULT $1 $2 $3${4:+ $4}"; echo "AT $(( $(date +%s) - T0 ))s"; }

# run_for SECS CMD...: runs CMD and waits at most SECS; a command still running then
# (stuck in the kernel, say) is left behind and the result is 124.
run_for() {
    local secs=$1; shift
    "$@" &
    local pid=$! i
    for ((i = 0; i < secs * 10; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; return; fi
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    echo "TIMEOUT after ${secs}s: $*"
    return 124
}

# start_server NAME ARGS...: serves in the background; DEV is the block device it reports.
start_server() {
    local name=$1; shift
    LOG=/tmp/$name.log
    : >"$LOG"
    "$SD" "$@" >>"$LOG" 2>&1 &
    PID=$!
    DEV=
    for _ in $(seq 1 300); do
        DEV=$(sed -n 's/^sealdisk: serving .* as \(\/dev\/ublkb[0-9]*\) .*/\1/p' "$LOG" | tail -1)
        if [ -n "$DEV" ]; then
            for _ in $(seq 1 50); do [ -b "$DEV" ] && return 0; sleep 0.1; done
            echo "server $name reported $DEV but it does not exist"; return 1
        fi
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server $name did not start:"; tail -5 "$LOG"
    return 1
}

# stop_server: SIGTERM, then waits (bounded); 0 if it exited 0.
stop_server() {
    [ -n "$PID" ] || return 0
    kill -TERM "$PID" 2>/dev/null
    local rc=124
    for _ in $(seq 1 300); do
        if ! kill -0 "$PID" 2>/dev/null; then wait "$PID"; rc=$?; break; fi
        sleep 0.1
    done
    [ $rc = 124 ] && { kill -KILL "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
    PID=
    return $rc
}

sysq() { cat "/sys/block/${DEV#/dev/}/queue/$1" 2>/dev/null; }

unmount() { grep -q " $1 " /proc/mounts || return 0; run_for 60 umount "$1"; }

verify() { # name step dir
    local out rc bad
    out=$(cd "$3" && run_for 120 sha256sum -c /kr/a.sha 2>&1)
    rc=$?
    bad=$(echo "$out" | grep -v ': OK$' | head -5)
    if [ $rc -eq 0 ] && [ -z "$bad" ]; then result "$1" "$2" ok "$(wc -l < /kr/a.sha)"; else result "$1" "$2" FAIL "$bad"; fi
}

fio_verify() { # name dev
    local out rc
    out=$(run_for 120 fio --name=v --filename="$2" --direct=1 --ioengine=libaio --iodepth=16 \
        --rw=randwrite --bs=4k --size=4M --verify=crc32c --do_verify=1 --verify_fatal=1 \
        --randrepeat=0 --output-format=terse 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then result "$1" fio ok; else result "$1" fio FAIL "rc $rc"; echo "$out" | tail -5; fi
}

run_case() { # name args
    local name=$1 args=$2 t0 m=/mnt/$1 blocks lbs pbs queues vd rot
    t0=$(date +%s)
    # shellcheck disable=SC2086 # the arguments are words on purpose
    if ! start_server "$name" $args --ublk; then result "$name" serve FAIL; return; fi
    result "$name" serve ok "$DEV"
    # 1. The queue limits: what the stack says, one hw queue per CPU, a volatile cache.
    blocks=$(sed -n 's/.*bytes, \([0-9]*\)-byte blocks.*/\1/p' "$LOG" | tail -1)
    lbs=$(sysq logical_block_size); pbs=$(sysq physical_block_size)
    queues=$(ls -d /sys/block/"${DEV#/dev/}"/mq/* 2>/dev/null | wc -l)
    vd=$(echo "$args" | grep -o '/dev/vd[a-z]' | head -1)
    rot=$(cat "/sys/block/${vd#/dev/}/queue/rotational" 2>/dev/null || echo 0)
    if [ "$lbs" = "$blocks" ] && [ "$pbs" -ge "$lbs" ] && [ "$queues" = "$(nproc)" ] \
        && [ "$(sysq write_cache)" = "write back" ] && [ "$(sysq rotational)" = "$rot" ]; then
        result "$name" limits ok "$lbs $pbs $queues"
    else
        result "$name" limits FAIL "blocks $blocks lbs $lbs pbs $pbs queues $queues/$(nproc) cache '$(sysq write_cache)' rot $(sysq rotational)/$rot"
    fi

    # 2. A filesystem, checked, and read back by a second server.
    mkdir -p "$m"
    if run_for 120 mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$DEV" >/tmp/mkfs.out 2>&1 \
        && run_for 60 mount -t ext4 "$DEV" "$m"; then
        run_for 120 tar -xf /kr/a.tar -C "$m" && run_for 120 sync && result "$name" unpack ok || result "$name" unpack FAIL
        unmount "$m"
        local out rc
        out=$(run_for 120 e2fsck -fn "$DEV" 2>&1); rc=$?
        if [ $rc -eq 0 ]; then result "$name" fsck ok; else result "$name" fsck FAIL "e2fsck exit $rc"; echo "$out" | tail -10; fi
    else
        result "$name" mkfs FAIL; tail -5 /tmp/mkfs.out
    fi
    local old=$DEV
    if stop_server; then result "$name" stop ok; else result "$name" stop FAIL "exit $?"; tail -5 "$LOG"; fi
    [ -e "$old" ] && result "$name" stop FAIL "$old still exists"
    # shellcheck disable=SC2086
    if start_server "$name" $args --ublk && run_for 60 mount -t ext4 "$DEV" "$m"; then
        verify "$name" verify "$m"
        unmount "$m"
    else
        result "$name" verify FAIL "restart or mount"
    fi
    # 3. The raw device under a verifying fio job.
    fio_verify "$name" "$DEV"
    stop_server || result "$name" stop FAIL "second stop"
    echo "TIME $name $(( $(date +%s) - t0 ))"
}

# The cases come on fd 3, so that nothing in a case can read them from stdin.
while IFS='|' read -r -u 3 name args; do
    [ -n "$name" ] || continue
    echo "### $name"
    run_case "$name" "$args" </dev/null
done 3</kr/cases.txt

# --- A plain volume over a sparse file in tmpfs (which punches holes).
echo "### sparse"
t0=$(date +%s)
mkdir -p /sparse && mount -t tmpfs -o size=200M tmpfs /sparse
truncate -s 96M /sparse/p.img
PLAIN=(open -M plain -c aes-xts-plain64 -s 512 --key-file /kr/plain.key)
alloc() { stat -c %b /sparse/p.img; }
if start_server sparse "${PLAIN[@]}" --allow-discards /sparse/p.img sparse --ublk; then
    [ "$(sysq discard_max_bytes)" != 0 ] && result sparse discard-limit ok "$(sysq discard_max_bytes)" \
        || result sparse discard-limit FAIL "discard_max_bytes 0"
    mkdir -p /mnt/sparse
    if run_for 60 mkfs.ext4 -q -F -E nodiscard "$DEV" && run_for 60 mount -t ext4 "$DEV" /mnt/sparse; then
        run_for 60 dd if=/dev/urandom of=/mnt/sparse/f bs=1M count=40 status=none
        run_for 60 sync
        before=$(alloc)
        rm /mnt/sparse/f; run_for 60 sync
        run_for 60 fstrim /mnt/sparse
        run_for 60 sync
        after=$(alloc)
        # 40 MiB were written; at least 30 MiB (61440 512-byte blocks) must come back.
        if [ $((before - after)) -ge 61440 ]; then result sparse fstrim ok "$before $after"
        else result sparse fstrim FAIL "allocated blocks $before -> $after"; fi
        unmount /mnt/sparse
    else
        result sparse fstrim FAIL "mkfs or mount"
    fi
    stop_server || result sparse stop FAIL
else
    result sparse discard-limit FAIL "serve"
fi

# --- Read-only: the device says so and refuses writes.
if start_server ro "${PLAIN[@]}" --readonly /sparse/p.img ro --ublk; then
    if [ "$(cat "/sys/block/${DEV#/dev/}/ro")" = 1 ] \
        && ! run_for 30 dd if=/dev/zero of="$DEV" bs=4k count=1 oflag=direct status=none 2>/dev/null \
        && run_for 30 dd if="$DEV" of=/dev/null bs=4k count=16 iflag=direct status=none; then
        result ro readonly ok
    else
        result ro readonly FAIL "ro=$(cat "/sys/block/${DEV#/dev/}/ro")"
    fi
    stop_server
else
    result ro readonly FAIL serve
fi

# --- SIGKILL under load: I/O fails (or the device goes away) in bounded time, no hang,
# and the id can be served again.
if start_server kill "${PLAIN[@]}" /sparse/p.img kill --ublk 7; then
    fio --name=load --filename="$DEV" --direct=1 --ioengine=libaio --iodepth=32 --rw=randrw \
        --bs=16k --size=64M --time_based --runtime=60 --output=/dev/null >/dev/null 2>&1 &
    fiopid=$!
    sleep 2
    kill -KILL "$PID"; wait "$PID" 2>/dev/null; PID=
    k0=$(date +%s)
    # fio must end by itself (its I/O failing) well before its 60 s run.
    for _ in $(seq 1 300); do kill -0 "$fiopid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$fiopid" 2>/dev/null; then
        result kill io-fails FAIL "fio still running 30 s after the kill"
        kill -KILL "$fiopid" 2>/dev/null
    elif run_for 20 dd if=/dev/ublkb7 of=/dev/null bs=4k count=1 iflag=direct status=none 2>/dev/null; then
        result kill io-fails FAIL "a read after the kill succeeded"
    else
        result kill io-fails ok "$(( $(date +%s) - k0 ))s"
    fi
    wait "$fiopid" 2>/dev/null
    if start_server kill2 "${PLAIN[@]}" /sparse/p.img kill --ublk 7 && [ "$DEV" = /dev/ublkb7 ] \
        && run_for 20 dd if="$DEV" of=/dev/null bs=4k count=16 iflag=direct status=none; then
        result kill reuse-id ok
    else
        result kill reuse-id FAIL "$(tail -3 /tmp/kill2.log)"
    fi
    stop_server
else
    result kill io-fails FAIL serve
fi

# --- User recovery: a mounted ext4 survives SIGKILL and a --ublk-recover restart.
if start_server rec "${PLAIN[@]}" /sparse/p.img rec --ublk 9 --ublk-recoverable; then
    mkdir -p /mnt/rec
    if run_for 60 mkfs.ext4 -q -F "$DEV" && run_for 60 mount -t ext4 "$DEV" /mnt/rec; then
        run_for 60 tar -xf /kr/a.tar -C /mnt/rec && run_for 60 sync
        kill -KILL "$PID"; wait "$PID" 2>/dev/null; PID=
        sleep 1
        if start_server rec2 "${PLAIN[@]}" /sparse/p.img rec --ublk 9 --ublk-recover && [ "$DEV" = /dev/ublkb9 ]; then
            verify rec recovered-read /mnt/rec
            run_for 60 sh -c 'echo after > /mnt/rec/after && sync' && [ "$(cat /mnt/rec/after)" = after ] \
                && result rec recovered-write ok || result rec recovered-write FAIL
            unmount /mnt/rec
            out=$(run_for 60 e2fsck -fn "$DEV" 2>&1) && result rec fsck ok || { result rec fsck FAIL; echo "$out" | tail -5; }
        else
            result rec recovered-read FAIL "recover: $(tail -3 /tmp/rec2.log)"
            unmount /mnt/rec
        fi
        stop_server
    else
        result rec recovered-read FAIL "mkfs or mount"
        stop_server
    fi
else
    result rec recovered-read FAIL serve
fi
echo "TIME extras $(( $(date +%s) - t0 ))"
echo "### done"
