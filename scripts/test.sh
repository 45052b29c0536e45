#!/usr/bin/env bash
# The whole test suite: unit, property, golden-image, NBD and real-client interop tests.
# Tests that need a tool which is missing (qemu-io, nbdcopy, fio, cryptsetup) say so loudly
# and skip; .ci/run installs them all.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --workspace --all-targets "$@"
