#!/usr/bin/env python3
"""The kernel interop tests (.ci/run runs them; docs/TESTING.md).

Each of these test binaries boots a Linux guest through the oracle (shared/oracle/kernel-run),
so they are #[ignore]d in scripts/test.sh. This builds them once with the suite's cargo flags
(so nothing the suite built is built again), then runs the binaries JOBS at a time with
--ignored, longest first: a guest spends much of its life booting and waiting on its disks,
so two guests on two cores finish sooner than one after the other. Each binary's output is
kept and printed whole when it ends, with its time; the exit status is 1 if any failed.

    scripts/kernel-tests.py [TEST...]      default: every kernel test
    KERNEL_TESTS_JOBS=1 scripts/kernel-tests.py     one at a time

The release binary the filesystem and ublk tests copy into the guest is built first
(`cargo build --release -p sealdisk --features ublk`) unless SEALDISK_RELEASE_BIN names one.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# Longest first (seconds on a quiet 2-core machine with KVM, for the order only).
TESTS = [
    "fs_kernel",
    "ciphers_kernel",
    "lifecycle_kernel",
    "ublk_kernel",
    "reencrypt_kernel",
    "integrity_journal_crypt",
    "integrity_kernel",
    "luks_integrity_kernel",
    "luks_kernel",
    "wide_kernel",
    "tcrypt_kernel",
    "fvault2_kernel",
    "bitlk_kernel",
]
FEATURES = ["--features", "sealdisk/ublk"]


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    wanted = sys.argv[1:] or TESTS
    unknown = [t for t in wanted if t not in TESTS]
    if unknown:
        print(f"kernel-tests: unknown test {' '.join(unknown)} (known: {' '.join(TESTS)})", file=sys.stderr)
        return 2
    jobs = int(os.environ.get("KERNEL_TESTS_JOBS", "2"))

    if "SEALDISK_RELEASE_BIN" not in os.environ and {"fs_kernel", "ublk_kernel"} & set(wanted):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "sealdisk", "--features", "ublk"], cwd=root, check=True)

    # scripts/test.sh's flags exactly: naming only these tests (--test) would resolve other
    # features (dev-dependencies of packages with no selected test) and rebuild the tree.
    build = ["cargo", "test", "--workspace", "--all-targets", *FEATURES, "--no-run",
             "--message-format=json-render-diagnostics"]
    out = subprocess.run(build, cwd=root, check=True, stdout=subprocess.PIPE, text=True).stdout
    binaries = {}
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        name = msg["target"]["name"]
        if name in wanted and "test" in msg["target"]["kind"]:
            binaries[name] = (msg["executable"], Path(msg["manifest_path"]).parent)
    missing = [t for t in wanted if t not in binaries]
    if missing:
        print(f"kernel-tests: cargo built no test binary for {' '.join(missing)}", file=sys.stderr)
        return 2

    queue = list(wanted)
    lock = threading.Lock()
    failed = []

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                name = queue.pop(0)
            exe, pkg = binaries[name]
            env = dict(os.environ, CARGO_MANIFEST_DIR=str(pkg))
            start = time.monotonic()
            r = subprocess.run([exe, "--ignored"], cwd=pkg, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            took = time.monotonic() - start
            verdict = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
            with lock:
                sys.stdout.write(f"==== {name}: {verdict} in {took:.0f} s\n")
                sys.stdout.write(r.stdout.decode(errors="replace"))
                sys.stdout.flush()
                if r.returncode != 0:
                    failed.append(name)

    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"kernel-tests: {len(wanted) - len(failed)} of {len(wanted)} passed in {time.monotonic() - start:.0f} s"
          + (f"; FAILED: {' '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
