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

The sealdisk binary the filesystem and ublk tests copy into the guest is the one this build
makes for the suite (target/debug/sealdisk: its dependencies, the crypto among them, are
built optimized, and the emulated guest kernel sets the pace), unless SEALDISK_RELEASE_BIN
names another.
"""

import os
import sys

import testrun

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
    wanted = sys.argv[1:] or TESTS
    unknown = [t for t in wanted if t not in TESTS]
    if unknown:
        print(f"kernel-tests: unknown test {' '.join(unknown)} (known: {' '.join(TESTS)})", file=sys.stderr)
        return 2
    jobs = int(os.environ.get("KERNEL_TESTS_JOBS", "2"))

    # scripts/test.sh's flags exactly: naming only these tests (--test) would resolve other
    # features (dev-dependencies of packages with no selected test) and rebuild the tree.
    built = {b.name: b for b in testrun.build(["--workspace", "--all-targets", *FEATURES]) if b.kind == "test"}
    missing = [t for t in wanted if t not in built]
    if missing:
        print(f"kernel-tests: cargo built no test binary for {' '.join(missing)}", file=sys.stderr)
        return 2
    return testrun.run([built[t] for t in wanted], jobs, ["--ignored"], title="kernel-tests")


if __name__ == "__main__":
    sys.exit(main())
