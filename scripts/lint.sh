#!/usr/bin/env bash
# clippy with warnings as errors, twice: the default features, then every feature on (`torch`, which
# needs the libtorch that `scripts/setup.sh --torch` installs, and the test-only `fault-injection`);
# then the crates' documentation (`cargo doc`), whose warnings (a broken link) are errors too.
# CI runs it in the fresh root after the test command (scripts/check-fresh.sh --then).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo clippy --workspace --all-targets -- -D warnings
source scripts/torch-env.sh
cargo clippy --workspace --all-targets --features mesh-node/torch,mesh-node/fault-injection -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --features mesh-node/torch
