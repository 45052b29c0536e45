#!/usr/bin/env bash
# Builds the book (docs/book, mdBook) into target/book and checks that every relative link in
# README.md, docs/*.md, docs/decisions and the book resolves to a file (scripts/doccheck.py).
# mdBook is not packaged by Debian or PyPI: when the pinned version is missing it is installed
# from crates.io with `cargo install` (HTML and search only), unless BOOK_INSTALL=0, which
# checks the links and skips the build.
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4

python3 scripts/doccheck.py

if [ "$(mdbook --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
  if [ "${BOOK_INSTALL:-1}" = 0 ]; then
    echo "book: SKIPPED the build: mdbook $MDBOOK_VERSION is not installed (BOOK_INSTALL=0)"
    exit 0
  fi
  echo "book: installing mdbook $MDBOOK_VERSION (cargo install)"
  start=$SECONDS
  cargo install -q mdbook --locked --version "$MDBOOK_VERSION" --no-default-features --features search
  echo "book: mdbook installed in $((SECONDS - start)) s"
fi
mdbook build docs/book
echo "book: built target/book/index.html"
