#!/usr/bin/env bash
# Builds the book (docs/) into target/book with mdBook, which it installs from crates.io into
# target/tools the first time (mdBook 0.5.4 needs Rust 1.88+), then checks every internal link of
# the book and of the README (scripts/check_links.py): a broken link, or one pointing outside the
# repository, fails the build, as does any warning of mdBook. Open target/book/index.html to read it.
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4
mdbook=target/tools/bin/mdbook
if [ ! -x "$mdbook" ] || [ "$("$mdbook" --version)" != "mdbook v$MDBOOK_VERSION" ]; then
  echo "docs: installing mdBook $MDBOOK_VERSION from crates.io into target/tools"
  cargo install mdbook --version "$MDBOOK_VERSION" --locked --root target/tools \
    --no-default-features --features search
fi
python3 scripts/check_links.py
# mdBook's warnings (an unclosed HTML tag, a missing include) fail the build too.
log=$("$mdbook" build docs --dest-dir "$PWD/target/book" 2>&1) || { echo "$log" >&2; exit 1; }
echo "$log"
if grep -q ' WARN ' <<<"$log"; then
  echo "docs: mdBook warned (above); the book must build cleanly" >&2
  exit 1
fi
echo "docs: the book is in target/book/index.html"
