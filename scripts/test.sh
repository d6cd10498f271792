#!/usr/bin/env bash
# Sets up the machine and runs every check CI runs: format, lints, unit, behaviour and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says when it starts, so CI's output shows where its time goes.
step() { echo "test: [${SECONDS} s] $*"; }

scripts/setup.sh --test

# pipecat's eval harness and moto come from PyPI while the build below holds the CPU (they wait
# on the network and the disk): scripts/evals.sh, scripts/record_upload.sh and the browser tests
# find them in place. At the lowest priority: they take only what the build leaves idle.
mkdir -p target
(nice -n 19 scripts/evals.sh --install-only && nice -n 19 scripts/record_upload.sh --install-only) \
  >target/python-installs.log 2>&1 &
installs=$!

step "cargo fmt --check"
cargo fmt --check

step "the layers (no module cycle, voxide-core free of engines and networks)"
scripts/layers.py

step "the docs (links, the README's length, the book builds)"
scripts/docs_check.py

# Every target once, with the tests' features (tokio's test-util): the scripts below reuse
# these binaries rather than build the tree again with the features of a plain build.
# Clippy lints voxide's own crates in the same build: its driver wraps rustc for the workspace's
# members only (what `cargo clippy -- -D warnings` runs, there in check mode), so the
# dependencies are compiled once instead of once more for a check. Every cargo command below
# keeps the wrapper, so none of them builds voxide again.
if driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver); then
  export RUSTC_WORKSPACE_WRAPPER="$driver"
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
  step "cargo build (every target, linted by clippy)"
else
  step "cargo clippy (no clippy-driver to build with)"
  cargo clippy --workspace --all-targets --locked -- -D warnings
  step "cargo build (every target)"
fi
cargo build --workspace --all-targets --locked
export VOXIDE_BUILT=debug

step "the Python tools installed beside the build"
if ! wait "$installs"; then
  cat target/python-installs.log
  echo "test: installing pipecat's eval harness or moto failed" >&2
  exit 1
fi

step "doc tests"
cargo test --workspace --doc --locked

step "deployment files"
scripts/deploy_check.sh

step "the security probes against a live server (scripts/security.sh)"
scripts/security.sh

step "three nodes behind HAProxy (scripts/cluster.sh, small)"
scripts/cluster.sh --sessions 6

step "a 2-minute soak on the stand-ins, its goals enforced (scripts/soak.sh)"
scripts/soak.sh --minutes 2 --concurrency 6

step "voxide's scenarios under pipecat's own eval harness (scripts/evals.sh)"
scripts/evals.sh

step "recordings uploaded to S3-compatible storage (scripts/record_upload.sh)"
scripts/record_upload.sh

# Last, so its summary is the closing line.
step "unit, behaviour and example tests"
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --all-targets --locked --no-fail-fast
else
  cargo test --workspace --all-targets --locked --no-fail-fast
fi
