#!/usr/bin/env bash
# voxide's scenarios under pipecat's own eval harness (`pipecat eval run`, pipecat-ai[evals]
# 1.14, unchanged), over RTVI on /ws: tests/evals/embedded/*.yaml against the embedded defaults
# (tests/evals/bots/assistant.toml), tests/evals/stand_ins/*.yaml against the providers'
# stand-ins (tests/evals/bots/stand_ins.toml). Text and recorded-audio turns; no judge is needed
# (the scenarios assert on events, text, function calls). Exits non-zero if any scenario fails.
#
#   scripts/evals.sh [--release] [--set embedded|stand_ins|all] [--out DIR] [--setup-only]
#                    [--install-only]
#
# --setup-only installs the harness (target/venv-evals) and builds voxide, and stops there
# (scripts/pipecat_evals.sh uses it); --install-only stops before the build (scripts/test.sh
# installs the harness while it builds).
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=debug
SET=all
OUT=target/evals
SETUP_ONLY=0
INSTALL_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --release) PROFILE=release; shift ;;
    --set) SET="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --setup-only) SETUP_ONLY=1; shift ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    *) echo "usage: scripts/evals.sh [--release] [--set embedded|stand_ins|all] [--out DIR] [--setup-only] [--install-only]" >&2; exit 2 ;;
  esac
done

PIPECAT_VERSION=1.14.0
VENV=target/venv-evals
# The harness, and what pipecat's own SmallWebRTC bot needs (tests/pipecat_bot/serve.py, for
# the console's test against it in tests/browser.rs).
EXTRAS="evals,webrtc,deepgram,cartesia,openai,runner"
if ! { "$VENV/bin/pipecat" --version 2>/dev/null | grep -q "$PIPECAT_VERSION" &&
  "$VENV/bin/python" -c "import aiortc, fastapi, uvicorn, pipecat.services.deepgram.stt, pipecat.services.cartesia.tts, pipecat.services.openai.llm" 2>/dev/null; }; then
  echo "evals: installing pipecat-ai[$EXTRAS]==$PIPECAT_VERSION into $VENV (pip, about 1 GB; a few minutes the first time)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  # No bytecode: 12,000 files compiled took CPU from the build this runs beside in CI.
  "$VENV/bin/pip" install --disable-pip-version-check --progress-bar off -q --no-compile \
    "pipecat-ai[$EXTRAS]==$PIPECAT_VERSION"
fi
[ "$INSTALL_ONLY" = 1 ] && exit 0

echo "evals: building voxide and the provider stand-ins ($PROFILE)"
build_flags=(--locked --bin voxide --example stand_in_providers)
[ "$PROFILE" = release ] && build_flags+=(--release)
# scripts/test.sh builds every target once, with the tests' features, and says so: building
# again here would build the tree a second time with other features.
[ "${VOXIDE_BUILT:-}" = "$PROFILE" ] || cargo build -q "${build_flags[@]}"
BIN="target/$PROFILE/voxide"
[ "$SETUP_ONLY" = 1 ] && exit 0

rm -rf "$OUT"
mkdir -p "$OUT"
PORT=7970
STAND_IN_PORT=9030 # tests/evals/bots/stand_ins.toml's tool calls it here
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_ready() {
  for _ in $(seq 1 900); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/readyz")" = 200 ] && return 0
    sleep 0.2
  done
  echo "evals: the server never became ready; see $OUT/$1.server.log" >&2
  return 1
}

failed=0
# One set: its server, then every scenario of the set in one harness run.
run_set() {
  local name=$1 bot=$2
  shift 2
  "$@" "$BIN" serve --bot "$bot" --port "$PORT" --node-id evals --allow-evals \
    --sessions-per-minute-per-ip 0 >"$OUT/$name.server.log" 2>&1 &
  local server=$!
  pids+=($server)
  wait_ready "$name"
  echo "evals: $name: pipecat eval run tests/evals/$name/*.yaml"
  local rc=0
  (cd "tests/evals/$name" && "../../../$VENV/bin/pipecat" eval run ./*.yaml \
    --bot-url "ws://127.0.0.1:$PORT/ws" --timeout 60 --logs-dir "../../../$OUT/$name") \
    >"$OUT/$name.txt" 2>&1 || rc=$?
  grep -v -e '^\s*$' -e DeprecationWarning -e 'EvalScenarioFile.load' "$OUT/$name.txt" || true
  if [ "$rc" != 0 ]; then
    echo "evals: $name: FAILED (logs in $OUT/$name/)" >&2
    failed=1
  fi
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}

if [ "$SET" = embedded ] || [ "$SET" = all ]; then
  run_set embedded tests/evals/bots/assistant.toml env
fi
if [ "$SET" = stand_ins ] || [ "$SET" = all ]; then
  "target/$PROFILE/examples/stand_in_providers" --port "$STAND_IN_PORT" >"$OUT/stand_ins.log" 2>&1 &
  pids+=($!)
  run_set stand_ins tests/evals/bots/stand_ins.toml env \
    DEEPGRAM_API_KEY=local DEEPGRAM_URL="ws://127.0.0.1:$STAND_IN_PORT" \
    CARTESIA_API_KEY=local CARTESIA_URL="ws://127.0.0.1:$STAND_IN_PORT" \
    OPENAI_API_KEY=local OPENAI_BASE_URL="http://127.0.0.1:$STAND_IN_PORT/v1"
fi
exit $failed
