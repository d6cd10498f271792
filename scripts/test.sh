#!/usr/bin/env bash
# Sets up the machine and runs every check CI runs: format, lints, unit, behaviour and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --test

echo "test: cargo fmt --check"
cargo fmt --check

echo "test: cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "test: the layers (no module cycle, voxide-core free of engines and networks)"
scripts/layers.py

echo "test: the docs (links, the README's length, the book builds)"
scripts/docs_check.py

echo "test: doc tests"
cargo test --workspace --doc --locked

echo "test: deployment files"
scripts/deploy_check.sh

echo "test: the security probes against a live server (scripts/security.sh)"
scripts/security.sh

echo "test: three nodes behind HAProxy (scripts/cluster.sh, small)"
scripts/cluster.sh --sessions 6

echo "test: a 2-minute soak on the stand-ins, its goals enforced (scripts/soak.sh)"
scripts/soak.sh --minutes 2 --concurrency 6

echo "test: voxide's scenarios under pipecat's own eval harness (scripts/evals.sh)"
scripts/evals.sh

echo "test: recordings uploaded to S3-compatible storage (scripts/record_upload.sh)"
scripts/record_upload.sh

# Last, so its summary is the closing line.
echo "test: unit, behaviour and example tests"
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --all-targets --locked --no-fail-fast
else
  cargo test --workspace --all-targets --locked --no-fail-fast
fi
