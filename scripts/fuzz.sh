#!/usr/bin/env bash
# Fuzzes one target of `voxide::fuzz` with libFuzzer, coverage-guided, on the stable toolchain
# (the fuzz/ crate, built with SanitizerCoverage into target/fuzz).
#
#   scripts/fuzz.sh TARGET SECONDS [JOBS]     (scripts/fuzz.sh list: the targets)
#
# The corpus grows in target/fuzz-corpus/TARGET (seeded from fuzz/seeds/TARGET); a crash,
# a hang over 10 s or one allocation over 64 MB leaves its input in target/fuzz-artifacts/TARGET/
# and exits non-zero. The last lines are libFuzzer's final stats (executions, time).
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-}
seconds=${2:-60}
jobs=${3:-1}
if [ -z "$target" ] || [ "$target" = list ]; then
  ls fuzz/seeds
  [ -n "$target" ] && exit 0
  echo "usage: scripts/fuzz.sh TARGET SECONDS [JOBS]" >&2
  exit 2
fi
[ -d "fuzz/seeds/$target" ] || { echo "fuzz: no target $target (scripts/fuzz.sh list)" >&2; exit 2; }
command -v c++ >/dev/null || { echo "fuzz: libFuzzer needs a C++ compiler (apt install g++)" >&2; exit 1; }

echo "fuzz: building (coverage-instrumented, release) into target/fuzz"
# An explicit --target keeps the instrumentation off build scripts and proc macros.
host=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
  cargo build -q --release --manifest-path fuzz/Cargo.toml --target-dir target/fuzz --target "$host"

corpus=target/fuzz-corpus/$target
artifacts=target/fuzz-artifacts/$target/
mkdir -p "$corpus" "$artifacts"
echo "fuzz: $target for ${seconds}s (${jobs} job(s))"
parallel=()
((jobs > 1)) && parallel=(-jobs="$jobs" -workers="$jobs")
VOXIDE_FUZZ_TARGET=$target "target/fuzz/$host/release/voxide-fuzz" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$artifacts" "${parallel[@]}" \
  "$corpus" "fuzz/seeds/$target"
