#!/bin/bash
# Guest half of the kernel NBD client filesystem test (crates/cli/tests/nbd_kernel.rs, run
# through /work/shared/oracle/kernel-run --kernel 6.12): ext4 on /dev/nbdX served by
# sealdisk from a virtio disk, for every stack in /kr/cases.txt.
#
# /kr/cases.txt, one line per stack: "name|/dev/vdX|connections|sealdisk arguments" (the
# arguments name the device and the export "name"; --listen is added here).
# /kr/a.tar, /kr/b.tar: the two halves of a source tree; /kr/all.sha, /kr/a.sha: their
# sha256sum lists (paths relative to the tar root).
#
# Per stack:
#   1. serve, nbd-client -unix (with -C N when connections > 1), mkfs.ext4, mount, unpack
#      both halves, sync, umount, e2fsck -fn, mount again and check every file;
#   2. crash: mount, unpack half A into c/ and sync, unpack copies of half B into c/bN
#      while the server is killed with SIGKILL, disconnect, umount what is left; restart
#      the server, connect a fresh nbd device, mount (ext4 replays its journal), umount,
#      e2fsck -fn, mount and check every file of half A (synced before the kill).
# Markers (one line each, parsed by the host): "RESULT <name> <step> ok|FAIL <detail>",
# "ROTATIONAL <name> <nbd flag> <vd flag>", "TIME <name> <seconds>", "KILLED <name>
# <midway|after>", "TIMEOUT ..." for a step that did not finish. Every step has a deadline
# (run_for); every device is disconnected on the way out; each mount has its own directory,
# so a mount left behind by a failed step cannot disturb the next.
set -uo pipefail
cd /kr
SD=/kr/sealdisk
modprobe nbd nbds_max=8 2>/dev/null || true
modprobe ext4 2>/dev/null || true
# Write back dirty pages and commit ext4's journal often, so that the server is busy
# writing when it is killed (not only holding everything in the guest's page cache).
echo 20 > /proc/sys/vm/dirty_writeback_centisecs
echo 50 > /proc/sys/vm/dirty_expire_centisecs

PID=
SOCK=
result() { echo "RESULT $1 $2 $3${4:+ $4}"; }

# run_for SECS CMD...: runs CMD (from PATH, never busybox's applet as `timeout` would pick)
# and waits at most SECS; a command still running then (stuck in the kernel, say) is left
# behind and the result is 124, so that no step can hang the script.
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

start_server() { # name args
    SOCK=/tmp/$1.sock
    rm -f "$SOCK" "$SOCK.lock"
    # shellcheck disable=SC2086 # the arguments are words on purpose
    $SD $2 --listen "unix:$SOCK" >>"/tmp/$1.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 600); do
        [ -S "$SOCK" ] && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server $1 did not start:"; tail -5 "/tmp/$1.log"
    return 1
}

stop_server() {
    [ -n "$PID" ] || return 0
    kill -TERM "$PID" 2>/dev/null
    for _ in $(seq 1 300); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
}

connected() { [ "$(cat "/sys/block/${1#/dev/}/size" 2>/dev/null || echo 0)" != 0 ]; }

connect() { # name nbd connections
    local copt=()
    [ "$3" -gt 1 ] && copt=(-C "$3")
    run_for 120 nbd-client -unix "$SOCK" "$2" -N "$1" -b 4096 "${copt[@]}" >/dev/null 2>&1 || return 1
    for _ in $(seq 1 100); do
        connected "$2" && return 0
        sleep 0.1
    done
    return 1
}

disconnect() { # nbd
    run_for 60 nbd-client -d "$1" >/dev/null 2>&1 || echo "disconnect of $1 failed"
}

mnt() { # nbd dir [options]
    mkdir -p "$2"
    run_for 120 mount -t ext4 ${3:+-o "$3"} "$1" "$2"
}

unmount() { # dir
    grep -q " $1 " /proc/mounts || return 0
    run_for 120 umount "$1"
}

fsck_clean() { # name step nbd
    local out rc
    out=$(run_for 300 e2fsck -fn "$3" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then result "$1" "$2" ok; else result "$1" "$2" FAIL "e2fsck exit $rc"; echo "$out" | tail -20; fi
}

verify() { # name step list dir
    local n out rc bad
    n=$(wc -l < "$3")
    out=$(cd "$4" && run_for 300 sha256sum -c "$3" 2>&1)
    rc=$?
    bad=$(echo "$out" | grep -v ': OK$' | head -5)
    if [ $rc -eq 0 ] && [ -z "$bad" ]; then result "$1" "$2" ok "$n"; else result "$1" "$2" FAIL "$bad"; fi
}

run_case() { # name vd conns args
    local name=$1 vd=$2 conns=$3 args=$4 t0 m1=/mnt/$1-1 m2=/mnt/$1-2 m3=/mnt/$1-3
    t0=$(date +%s)
    for n in /dev/nbd0 /dev/nbd1; do connected "$n" && disconnect "$n"; done
    start_server "$name" "$args" || { result "$name" serve FAIL; return; }
    if ! connect "$name" /dev/nbd0 "$conns"; then result "$name" connect FAIL; stop_server; return; fi
    result "$name" connect ok "$conns"
    echo "ROTATIONAL $name $(cat /sys/block/nbd0/queue/rotational) $(cat "/sys/block/${vd#/dev/}/queue/rotational")"

    # 1. Make, fill, check.
    if run_for 300 mkfs.ext4 -q -F -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 /dev/nbd0 >/tmp/mkfs.out 2>&1 \
        && mnt /dev/nbd0 "$m1"; then
        run_for 300 tar -xf /kr/a.tar -C "$m1" && run_for 300 tar -xf /kr/b.tar -C "$m1" \
            && run_for 300 sync && result "$name" unpack ok || result "$name" unpack FAIL
        unmount "$m1"
        fsck_clean "$name" fsck /dev/nbd0
        if mnt /dev/nbd0 "$m1"; then
            verify "$name" verify /kr/all.sha "$m1"
            unmount "$m1"
        else
            result "$name" verify FAIL "remount"
        fi
    else
        result "$name" mkfs FAIL
        tail -5 /tmp/mkfs.out
    fi

    # 2. Crash: SIGKILL while copies of half B are unpacked, after half A was synced.
    if mnt /dev/nbd0 "$m2" commit=1; then
        mkdir -p "$m2/c"
        run_for 300 tar -xf /kr/a.tar -C "$m2/c" && run_for 300 sync && result "$name" synced ok || result "$name" synced FAIL
        (for i in 1 2 3 4 5 6 7 8; do mkdir -p "$m2/c/b$i" && tar -xf /kr/b.tar -C "$m2/c/b$i" || exit 1; done) 2>/dev/null &
        local tarpid=$!
        # Kill once part of half B is in (100 of its files exist), a second later: the
        # unpack goes on, write-back every 0.2 s and ext4 commits every second keep the
        # server writing.
        local want=$(( $(wc -l < /kr/a.sha) + 100 ))
        for _ in $(seq 1 400); do
            [ "$(find "$m2/c" -type f 2>/dev/null | wc -l)" -ge "$want" ] && break
            sleep 0.05
        done
        sleep 1
        if kill -0 "$tarpid" 2>/dev/null; then echo "KILLED $name midway"; else echo "KILLED $name after"; fi
        kill -KILL "$PID"
        wait "$PID" 2>/dev/null
        PID=
        for _ in $(seq 1 1200); do kill -0 "$tarpid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$tarpid" 2>/dev/null
        # The kernel fails what is in flight and everything after (no hang):
        # detach, unmount what is left.
        disconnect /dev/nbd0
        unmount "$m2" || result "$name" umount-after-kill FAIL
    else
        result "$name" synced FAIL "mount"
    fi
    stop_server
    if start_server "$name" "$args" && connect "$name" /dev/nbd1 "$conns"; then
        if mnt /dev/nbd1 "$m3"; then
            unmount "$m3"
            fsck_clean "$name" crash-fsck /dev/nbd1
            if mnt /dev/nbd1 "$m3"; then
                verify "$name" crash-verify /kr/a.sha "$m3/c"
                unmount "$m3"
            else
                result "$name" crash-verify FAIL "remount"
            fi
        else
            result "$name" crash-fsck FAIL "mount after the kill"
        fi
        disconnect /dev/nbd1
    else
        result "$name" crash-fsck FAIL "restart"
    fi
    stop_server
    echo "TIME $name $(( $(date +%s) - t0 ))"
}

# NBD_FLAG_ROTATIONAL is off where the storage is not rotational: a file in guest RAM.
truncate -s 16M /tmp/flat.img
if start_server flat "open -M plain -c aes-xts-plain64 -s 512 --key-file /kr/plain.key /tmp/flat.img flat" \
    && connect flat /dev/nbd2 1; then
    echo "ROTATIONAL flat $(cat /sys/block/nbd2/queue/rotational) 0"
    disconnect /dev/nbd2
fi
stop_server

# The cases come on fd 3, so that nothing in a case can read them from stdin.
while IFS='|' read -r -u 3 name vd conns args; do
    [ -n "$name" ] || continue
    echo "### $name"
    run_case "$name" "$vd" "$conns" "$args" </dev/null
done 3</kr/cases.txt
echo "### done"
