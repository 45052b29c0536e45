#!/usr/bin/env python3
"""The kernel interop tests (.ci/run runs them; docs/TESTING.md).

Each of these tests boots a Linux guest through the oracle (shared/oracle/kernel-run), so
they are #[ignore]d in scripts/test.sh. They are modules of the cli crate's test binary
(crates/cli/tests/cli/<name>.rs). This runs them under cargo-nextest with the suite's cargo
flags (so nothing the suite built is built again) and its `kernel` profile
(.config/nextest.toml): `--run-ignored only`, two guests at a time, the longest first (a
guest spends much of its life booting and waiting on its disks, so two guests on two cores
finish sooner than one after the other), each test's output printed whole when it ends,
with its time. The exit status is nextest's: 0 when every test passed.

    scripts/kernel-tests.py [TEST...]      default: every kernel test (names as below)
    KERNEL_TESTS_JOBS=1 scripts/kernel-tests.py     one at a time

The sealdisk binary the filesystem and ublk tests copy into the guest is the one this build
makes for the suite (target/debug/sealdisk: its dependencies, the crypto among them, are
built optimized, and the emulated guest kernel sets the pace), unless SEALDISK_RELEASE_BIN
names another.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The kernel tests, by module of crates/cli/tests/cli/ (once each its own test binary). A new
# one goes here and, with its time, into the kernel profile's priorities in .config/nextest.toml.
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
# scripts/test.sh's flags exactly: other flags (naming only this test binary, other
# features) would resolve features differently and rebuild the tree.
CARGO_FLAGS = ["--workspace", "--all-targets", "--features", "sealdisk/ublk"]


def main() -> int:
    wanted = sys.argv[1:] or TESTS
    unknown = [t for t in wanted if t not in TESTS]
    if unknown:
        print(f"kernel-tests: unknown test {' '.join(unknown)} (known: {' '.join(TESTS)})", file=sys.stderr)
        return 2
    if subprocess.run(["cargo", "nextest", "--version"], capture_output=True).returncode != 0:
        print("kernel-tests: cargo-nextest is not installed: cargo install --locked cargo-nextest "
              "(.ci/run installs it)", file=sys.stderr)
        return 2
    jobs = os.environ.get("KERNEL_TESTS_JOBS", "2")
    # The #[ignore]d tests (--run-ignored only) of those modules of the cli test binary.
    filterset = f"binary_id(sealdisk::cli) & test(/^({'|'.join(wanted)})::/)"
    cmd = ["cargo", "nextest", "run", *CARGO_FLAGS, "--profile", "kernel", "--run-ignored", "only",
           "--test-threads", jobs, "-E", filterset]
    print("kernel-tests:", " ".join(cmd), flush=True)
    # A TMPDIR for the run, removed at its end, as scripts/test.sh does.
    tmp = tempfile.mkdtemp(prefix="sealdisk-kernel-tests.")
    try:
        return subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, TMPDIR=tmp)).returncode
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
