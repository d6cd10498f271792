#!/usr/bin/env bash
# Fuzzes one target of `voxide::fuzz` with libFuzzer, coverage-guided, on the stable toolchain
# (the fuzz/ crate, built with SanitizerCoverage into target/fuzz).
#
#   scripts/fuzz.sh TARGET SECONDS [JOBS]     (scripts/fuzz.sh list: the targets)
#   scripts/fuzz.sh all SECONDS [PARALLEL]    every target in turn, PARALLEL at once
#
# The corpus grows in target/fuzz-corpus/TARGET (seeded from fuzz/seeds/TARGET); a crash,
# a hang over 10 s or one allocation over 64 MB leaves its input in target/fuzz-artifacts/TARGET/
# and exits non-zero. The last lines are libFuzzer's final stats (executions, time); `all`
# writes one JSON line per target to target/fuzz-report.jsonl. FUZZ_RUNS=N stops a target after
# N executions; FUZZ_MAX_LEN (default 4096 bytes) bounds an input.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-}
seconds=${2:-60}
jobs=${3:-1}
max_len=${FUZZ_MAX_LEN:-4096}
runs=()
[ -n "${FUZZ_RUNS:-}" ] && runs=(-runs="$FUZZ_RUNS")
if [ -z "$target" ] || [ "$target" = list ]; then
  ls fuzz/seeds
  [ -n "$target" ] && exit 0
  echo "usage: scripts/fuzz.sh TARGET SECONDS [JOBS]" >&2
  exit 2
fi
[ "$target" = all ] || [ -d "fuzz/seeds/$target" ] || { echo "fuzz: no target $target (scripts/fuzz.sh list)" >&2; exit 2; }
command -v c++ >/dev/null || { echo "fuzz: libFuzzer needs a C++ compiler (apt install g++)" >&2; exit 1; }

echo "fuzz: building (coverage-instrumented, release) into target/fuzz"
# An explicit --target keeps the instrumentation off build scripts and proc macros.
host=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
  cargo build -q --release --manifest-path fuzz/Cargo.toml --target-dir target/fuzz --target "$host"

fuzz_one() {
  local target=$1 seconds=$2 jobs=$3
  local corpus=target/fuzz-corpus/$target artifacts=target/fuzz-artifacts/$target/
  mkdir -p "$corpus" "$artifacts"
  echo "fuzz: $target for ${seconds}s (${jobs} job(s))"
  local parallel=()
  ((jobs > 1)) && parallel=(-jobs="$jobs" -workers="$jobs")
  VOXIDE_FUZZ_TARGET=$target "target/fuzz/$host/release/voxide-fuzz" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
    -print_final_stats=1 -artifact_prefix="$artifacts" "${runs[@]}" "${parallel[@]}" \
    "$corpus" "fuzz/seeds/$target"
}

if [ "$target" != all ]; then
  fuzz_one "$target" "$seconds" "$jobs"
  exit
fi

# Every target, `jobs` at once, one line of figures each.
report=target/fuzz-report.jsonl
: >"$report"
export -f fuzz_one
export host max_len
export FUZZ_RUNS_FLAG="${runs[*]:-}"
ls fuzz/seeds | xargs -P "$jobs" -I{} bash -c '
  runs=(); [ -n "$FUZZ_RUNS_FLAG" ] && runs=($FUZZ_RUNS_FLAG)
  log=target/fuzz-artifacts/{}.log
  mkdir -p target/fuzz-artifacts
  start=$(date +%s)
  if fuzz_one {} '"$seconds"' 1 >"$log" 2>&1; then result=ok; else result=failed; fi
  execs=$(sed -n "s/^stat::number_of_executed_units: *//p" "$log" | tail -1)
  rss=$(sed -n "s/^stat::peak_rss_mb: *//p" "$log" | tail -1)
  echo "{\"target\": \"{}\", \"executions\": ${execs:-0}, \"seconds\": $(( $(date +%s) - start )), \"peak_rss_mb\": ${rss:-0}, \"result\": \"$result\"}" | tee -a '"$report"'
'
! grep -q '"failed"' "$report"
