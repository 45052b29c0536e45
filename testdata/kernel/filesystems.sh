#!/bin/bash
# Guest half of the kernel filesystem test (crates/cli/tests/cli/fs_kernel.rs, run through
# /work/shared/oracle/kernel-run --kernel 6.12): ext4 on a block device the guest kernel
# makes from a volume sealdisk serves from a virtio disk, for every case in /kr/cases.txt.
#
# /kr/cases.txt, one line per case:
#   "name|transport|/dev/vdX|connections|crash|sealdisk arguments"
# name is unique per case (the stack and the transport); transport is
#   unix  the kernel NBD client over a unix socket (nbd-client -unix, -C N when N > 1),
#   tcp   the kernel NBD client over TCP on 127.0.0.1 (-C N as well),
#   fuse  the FUSE file (sealdisk --fuse DIR, /kr/fusermount3) on a loop device (losetup);
# crash is 1 when the case also runs the crash part. The arguments name the device and the
# export; --listen or --fuse is added here.
# /kr/a.tar, /kr/b.tar: the two halves of a source tree; /kr/all.sha: the sha256sum list of
# both (paths relative to the tar root); /kr/crash.sha: half A's list plus half B's under b1/.
#
# Per case:
#   1. attach, mkfs.ext4, mount, unpack both halves, sync, umount, e2fsck -fn, mount again
#      and check every file;
#   2. crash (when asked): mount, unpack half A into c/ and sync; unpack copies of half B
#      into c/b1, c/b2, ...; once c/b1 is complete, fsync each of its files; a second into
#      the next copies, kill the server with SIGKILL; detach, unmount what is left; restart
#      the server, attach again, mount (ext4 replays its journal), umount, e2fsck -fn, mount
#      and check every file of half A and of c/b1 (all fsync'ed before the kill).
# Markers (one line each, parsed by the host): "RESULT <name> <step> ok|FAIL <detail>",
# "ROTATIONAL <name> <device flag> <vd flag>" (NBD only), "TIME <name> <seconds>",
# "KILLED <name> <midway|after> <files in c/ at the kill>", "FSYNCED <name> <files>",
# "TIMEOUT ..." for a step that did not finish. Every step has a deadline (run_for); every
# device is detached on the way out; each mount has its own directory, so a mount left
# behind by a failed step cannot disturb the next.
set -uo pipefail
cd /kr
SD=/kr/sealdisk
export FUSERMOUNT_PATH=/kr/fusermount3
chmod 0755 "$FUSERMOUNT_PATH" 2>/dev/null || true
modprobe nbd nbds_max=8 2>/dev/null || true
modprobe ext4 2>/dev/null || true
modprobe fuse 2>/dev/null || true
modprobe loop 2>/dev/null || true
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up 2>/dev/null || true
# Write back dirty pages and commit ext4's journal often, so that the server is busy
# writing when it is killed (not only holding everything in the guest's page cache).
echo 20 > /proc/sys/vm/dirty_writeback_centisecs
echo 50 > /proc/sys/vm/dirty_expire_centisecs

PID=
DEV=
PORT=10809
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

mounted() { grep -q " $1 " /proc/mounts; }

# TCP port $1 is listening (/proc/net/tcp: local address in hex, state 0A).
listening() { grep -qi ":$(printf '%04X' "$1") 00000000:0000 0A" /proc/net/tcp; }

start_server() { # name transport args
    local name=$1 transport=$2 where ready
    case $transport in
        unix) rm -f "/tmp/$name.sock" "/tmp/$name.sock.lock"; where=(--listen "unix:/tmp/$name.sock") ;;
        tcp) PORT=$((PORT + 1)); where=(--listen "tcp:127.0.0.1:$PORT") ;;
        fuse) mkdir -p "/run/f-$name"; where=(--fuse "/run/f-$name") ;;
    esac
    # shellcheck disable=SC2086 # the arguments are words on purpose
    $SD $3 "${where[@]}" >>"/tmp/$name.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 600); do
        case $transport in
            unix) [ -S "/tmp/$name.sock" ] && ready=1 ;;
            tcp) listening "$PORT" && ready=1 ;;
            fuse) mounted "/run/f-$name" && [ -f "/run/f-$name/${3##* }" ] && ready=1 ;;
        esac
        [ -n "${ready:-}" ] && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server $name did not start:"; tail -5 "/tmp/$name.log"
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

# attach name transport connections nbd export: sets DEV to the block device.
attach() {
    local name=$1 transport=$2 conns=$3 nbd=$4 export=$5 copt=()
    [ "$conns" -gt 1 ] && copt=(-C "$conns")
    case $transport in
        unix) run_for 120 nbd-client -unix "/tmp/$name.sock" "$nbd" -N "$export" -b 4096 "${copt[@]}" >/dev/null 2>&1 || return 1
              DEV=$nbd ;;
        tcp) run_for 120 nbd-client 127.0.0.1 "$PORT" "$nbd" -N "$export" -b 4096 "${copt[@]}" >/dev/null 2>&1 || return 1
             DEV=$nbd ;;
        fuse) DEV=$(run_for 60 losetup -f --show "/run/f-$name/$export") || return 1 ;;
    esac
    for _ in $(seq 1 100); do
        connected "$DEV" && return 0
        sleep 0.1
    done
    return 1
}

detach() { # transport dev
    case $1 in
        fuse) run_for 60 losetup -d "$2" || echo "losetup -d $2 failed" ;;
        *) run_for 60 nbd-client -d "$2" >/dev/null 2>&1 || echo "disconnect of $2 failed" ;;
    esac
}

mnt() { # dev dir [options]
    mkdir -p "$2"
    run_for 120 mount -t ext4 ${3:+-o "$3"} "$1" "$2"
}

unmount() { # dir
    mounted "$1" || return 0
    run_for 120 umount "$1"
}

fsck_clean() { # name step dev
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

run_case() { # name transport vd conns crash args
    local name=$1 transport=$2 vd=$3 conns=$4 crash=$5 args=$6 t0 m1=/mnt/$1-1 m2=/mnt/$1-2 m3=/mnt/$1-3
    local export=${args##* }
    t0=$(date +%s)
    for n in /dev/nbd0 /dev/nbd1; do connected "$n" && detach unix "$n"; done
    start_server "$name" "$transport" "$args" || { result "$name" serve FAIL; return; }
    if ! attach "$name" "$transport" "$conns" /dev/nbd0 "$export"; then
        result "$name" connect FAIL; stop_server; return
    fi
    result "$name" connect ok "$conns"
    local dev=$DEV
    [ "$transport" = fuse ] || echo "ROTATIONAL $name $(cat "/sys/block/${dev#/dev/}/queue/rotational") $(cat "/sys/block/${vd#/dev/}/queue/rotational")"

    # 1. Make, fill, check.
    if run_for 300 mkfs.ext4 -q -F -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 "$dev" >/tmp/mkfs.out 2>&1 \
        && mnt "$dev" "$m1"; then
        run_for 300 tar -xf /kr/a.tar -C "$m1" && run_for 300 tar -xf /kr/b.tar -C "$m1" \
            && run_for 300 sync && result "$name" unpack ok || result "$name" unpack FAIL
        unmount "$m1"
        fsck_clean "$name" fsck "$dev"
        if mnt "$dev" "$m1"; then
            verify "$name" verify /kr/all.sha "$m1"
            unmount "$m1"
        else
            result "$name" verify FAIL "remount"
        fi
    else
        result "$name" mkfs FAIL
        tail -5 /tmp/mkfs.out
    fi
    if [ "$crash" != 1 ]; then
        detach "$transport" "$dev"
        stop_server
        echo "TIME $name $(( $(date +%s) - t0 ))"
        return
    fi

    # 2. Crash: SIGKILL while copies of half B are unpacked, after half A was synced and
    # the first copy of half B fsync'ed file by file.
    if mnt "$dev" "$m2" commit=1; then
        mkdir -p "$m2/c"
        run_for 300 tar -xf /kr/a.tar -C "$m2/c" && run_for 300 sync && result "$name" synced ok || result "$name" synced FAIL
        # 20 copies (about 36 MiB of the 64 MiB volume): far more than can be unpacked
        # between the fsync and the kill.
        # SIGTERM stops the loop and its current tar (see below).
        (
            child=
            trap 'kill -KILL "$child" 2>/dev/null; exit 1' TERM
            for i in $(seq 1 20); do
                mkdir -p "$m2/c/b$i" || exit 1
                tar -xf /kr/b.tar -C "$m2/c/b$i" & child=$!
                wait "$child" || exit 1
            done
        ) 2>/dev/null &
        local tarpid=$!
        # c/b2 appears once c/b1 is complete: fsync each file of c/b1 (coreutils sync FILE...
        # is fsync per file), then kill half a second later while the unpack goes on
        # (write-back every 0.2 s and ext4 commits every second keep the server writing).
        for _ in $(seq 1 1200); do
            [ -d "$m2/c/b2" ] && break
            kill -0 "$tarpid" 2>/dev/null || break
            sleep 0.05
        done
        if (cd "$m2/c" && run_for 120 find b1 -type f -exec sync -- {} +); then
            echo "FSYNCED $name $(cd "$m2/c" && find b1 -type f | wc -l)"
        else
            result "$name" fsync FAIL
        fi
        sleep 0.5
        local state=after
        kill -0 "$tarpid" 2>/dev/null && state=midway
        echo "KILLED $name $state $(find "$m2/c" -type f 2>/dev/null | wc -l)"
        kill -KILL "$PID"
        wait "$PID" 2>/dev/null
        PID=
        # Stop the unpack now: left running, it would keep filling the page cache with
        # writes that can never be written back, and be throttled for minutes.
        kill -TERM "$tarpid" 2>/dev/null
        for _ in $(seq 1 300); do kill -0 "$tarpid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$tarpid" 2>/dev/null
        # The kernel fails what is in flight and everything after (no hang): detach, unmount
        # what is left. A loop device over a FUSE file whose server died fails I/O with
        # ENOTCONN; fusermount3 (auto_unmount) takes the FUSE mount away.
        if [ "$transport" = fuse ]; then
            unmount "$m2" || result "$name" umount-after-kill FAIL
            detach fuse "$dev"
            for _ in $(seq 1 50); do mounted "/run/f-$name" || break; sleep 0.1; done
            # fusermount3 -z normally did it; a dead FUSE mount left behind is lazily
            # unmounted by hand (and said), so that the restart finds DIR empty.
            if mounted "/run/f-$name"; then echo "NOTE $name: FUSE mount left after the kill"; umount -l "/run/f-$name"; fi
        else
            detach "$transport" "$dev"
            unmount "$m2" || result "$name" umount-after-kill FAIL
        fi
    else
        result "$name" synced FAIL "mount"
        detach "$transport" "$dev"
    fi
    stop_server
    if start_server "$name" "$transport" "$args" && attach "$name" "$transport" "$conns" /dev/nbd1 "$export"; then
        dev=$DEV
        if mnt "$dev" "$m3"; then
            unmount "$m3"
            fsck_clean "$name" crash-fsck "$dev"
            if mnt "$dev" "$m3"; then
                verify "$name" crash-verify /kr/crash.sha "$m3/c"
                unmount "$m3"
            else
                result "$name" crash-verify FAIL "remount"
            fi
        else
            result "$name" crash-fsck FAIL "mount after the kill"
        fi
        detach "$transport" "$dev"
    else
        result "$name" crash-fsck FAIL "restart"
    fi
    stop_server
    echo "TIME $name $(( $(date +%s) - t0 ))"
}

# NBD_FLAG_ROTATIONAL is off where the storage is not rotational: a file in guest RAM.
truncate -s 16M /tmp/flat.img
if start_server flat unix "open -M plain -c aes-xts-plain64 -s 512 --key-file /kr/plain.key /tmp/flat.img flat" \
    && attach flat unix 1 /dev/nbd2 flat; then
    echo "ROTATIONAL flat $(cat /sys/block/nbd2/queue/rotational) 0"
    detach unix /dev/nbd2
fi
stop_server

# The cases come on fd 3, so that nothing in a case can read them from stdin.
while IFS='|' read -r -u 3 name transport vd conns crash args; do
    [ -n "$name" ] || continue
    echo "### $name"
    run_case "$name" "$transport" "$vd" "$conns" "$crash" "$args" </dev/null
done 3</kr/cases.txt
echo "### done"
