#!/usr/bin/env python3
"""Runs the workspace's test binaries several at a time (scripts/test.sh calls it; docs/TESTING.md).

`cargo test` runs one test binary after another. Much of this suite waits rather than
computes (cryptsetup's key derivation, an S3 server starting, a child killed mid-run, a
FUSE mount), so on two cores three binaries at a time finish well before one after the other.
This builds every test target with the given cargo flags (`cargo test --no-run`, so it
builds exactly what `cargo test` would), then runs the binaries JOBS at a time, the known
slow ones first. Each binary runs in its package directory with cargo's environment and its
own TMPDIR, and its output is printed whole when it ends, with its time; the exit status is
1 if any binary failed, and the failures are listed again at the end.

    scripts/testrun.py [CARGO FLAGS...]              e.g. --workspace --all-targets
    TEST_JOBS=1 scripts/testrun.py ...               one binary at a time
    TEST_ONLY=gcs,s3_faults scripts/test.sh          only these test targets (built as the
                                                     suite builds them, so nothing else is)

scripts/kernel-tests.py uses the same build and runner for the kernel tests.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Slowest first (seconds on two loaded cores), for the order only: a long binary that starts
# last would leave one core idle at the end. A binary missing here runs after these.
SLOW = [
    "s3_faults", "s3", "encrypt_interop", "reencrypt_online", "tcrypt_cryptsetup_images",
    "s3_cli", "luks_encrypt_decrypt", "fault_soak", "tcrypt", "reencrypt_interop",
    "luks_reencrypt", "integrity_stacks", "bench_scripts", "tcrypt_golden", "bitlk_cli",
    "bench_fs", "luks_interop", "control_cli", "bench_cli",
]


class Binary:
    def __init__(self, name: str, kind: str, exe: str, manifest: Path):
        self.name, self.kind, self.exe, self.dir = name, kind, exe, manifest.parent

    @property
    def label(self) -> str:
        crate = self.dir.name
        return f"{crate}/{self.name}" if self.kind == "test" else f"{crate}/{self.kind}:{self.name}"


def build(cargo_flags: list) -> list:
    """Builds the test targets `cargo test CARGO_FLAGS` would run; returns them in cargo's order."""
    cmd = ["cargo", "test", *cargo_flags, "--no-run", "--message-format=json-render-diagnostics"]
    out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    binaries, seen = [], set()
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"] or msg["executable"] in seen:
            continue
        seen.add(msg["executable"])
        target = msg["target"]
        kind = "test" if "test" in target["kind"] else target["kind"][0]
        binaries.append(Binary(target["name"], kind, msg["executable"], Path(msg["manifest_path"])))
    return binaries


def run(binaries: list, jobs: int, args: list = (), title: str = "tests") -> int:
    """Runs each binary with ARGS, JOBS at a time; prints each output whole; 1 if any failed."""
    queue = list(binaries)
    jobs = max(1, min(jobs, len(binaries)))
    lock = threading.Lock()
    failed = []
    scratch = Path(tempfile.mkdtemp(prefix="sealdisk-tests-"))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                b = queue.pop(0)
            tmp = scratch / b.label.replace("/", "-").replace(":", "-")
            tmp.mkdir()
            # What cargo test sets that a test may read at run time, and a TMPDIR of its own.
            env = dict(os.environ, CARGO_MANIFEST_DIR=str(b.dir), TMPDIR=str(tmp))
            start = time.monotonic()
            p = subprocess.Popen([b.exe, *args], cwd=b.dir, env=env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            out = p.stdout.read()
            p.stdout.close()
            # wait4 for the child's own CPU time (and its children's): what a binary costs
            # the machine, beside how long it took.
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = code = os.waitstatus_to_exitcode(status)
            took = time.monotonic() - start
            cpu = usage.ru_utime + usage.ru_stime
            verdict = "ok" if code == 0 else f"FAILED (exit {code})"
            with lock:
                sys.stdout.write(f"==== {b.label}: {verdict} in {took:.1f} s (cpu {cpu:.1f} s)\n")
                sys.stdout.write(out.decode(errors="replace"))
                sys.stdout.flush()
                if code != 0:
                    failed.append(b.label)
            shutil.rmtree(tmp, ignore_errors=True)

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shutil.rmtree(scratch, ignore_errors=True)
    n = len(binaries)
    print(f"{title}: {n - len(failed)} of {n} test binaries passed in {time.monotonic() - start:.0f} s, "
          f"{jobs} at a time" + (f"; FAILED: {' '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def slow_first(binaries: list) -> list:
    rank = {name: i for i, name in enumerate(SLOW)}
    return sorted(binaries, key=lambda b: rank.get(b.name, len(SLOW)) if b.kind == "test" else len(SLOW))


def main() -> int:
    jobs = int(os.environ.get("TEST_JOBS", "3"))
    binaries = build(sys.argv[1:])
    only = [t for t in os.environ.get("TEST_ONLY", "").split(",") if t]
    if only:
        unknown = set(only) - {b.name for b in binaries}
        if unknown:
            print(f"testrun: no test target named {' '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        binaries = [b for b in binaries if b.name in only]
    return run(slow_first(binaries), jobs, title="test suite")


if __name__ == "__main__":
    sys.exit(main())
