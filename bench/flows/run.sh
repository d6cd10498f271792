#!/usr/bin/env bash
# What a flow's node transition costs a caller: the same load on two bots over the providers'
# stand-ins (answers after 550 ms), each session's first turn making the one tool call the
# stand-in model asks for, its later turns plain answers.
#
#   plain: the tool `lookup_order` is an ordinary tool; the model answers after its result.
#   flow:  `lookup_order` is the function that moves the flow from its first node to its second
#          (STRATEGY: append, reset or reset_with_summary), whose task the model then answers.
#
#   bench/flows/run.sh         # SESSIONS=20 TURNS=3 ROUNDS=2, results in bench/flows/results/
#
# v2v is the callers' (from the audio), over a quiet room's floor (-55 dBFS), on SmallWebRTC;
# the bot alone on one core, the callers and stand-ins on the other. The first turn is the
# transition (or the plain tool call), the others are inside a node.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SESSIONS=${SESSIONS:-20}
TURNS=${TURNS:-3}
ROUNDS=${ROUNDS:-2}
STRATEGY=${STRATEGY:-append}
SERVER_CORE=${SERVER_CORE:-0}
CLIENT_CORE=${CLIENT_CORE:-1}
PORT=${PORT:-7881}
STAND_INS_PORT=${STAND_INS_PORT:-9001}
OUT=${OUT:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}
VOXIDE=$ROOT/target/release/voxide
mkdir -p "$OUT"

BENCH=flows-bench
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

build_release
need_speech_tools
espeak-ng -v en-gb -s 165 -w "$OUT/raw.wav" "Where is my order, please?"
sox "$OUT/raw.wav" -r 16000 -c 1 -b 16 "$OUT/question.wav"
rm "$OUT/raw.wav"

taskset -c "$CLIENT_CORE" "$ROOT/target/release/examples/stand_in_providers" \
    --port "$STAND_INS_PORT" >"$OUT/stand_ins.log" 2>&1 &
pids+=($!)
export DEEPGRAM_API_KEY=local DEEPGRAM_URL=ws://127.0.0.1:$STAND_INS_PORT \
    CARTESIA_API_KEY=local CARTESIA_URL=ws://127.0.0.1:$STAND_INS_PORT \
    OPENAI_API_KEY=local OPENAI_BASE_URL=http://127.0.0.1:$STAND_INS_PORT/v1

tool="[[tool]]
name = \"lookup_order\"
description = \"Looks up the caller's latest order.\"
parameters = { type = \"object\", properties = {} }
url = \"http://127.0.0.1:$STAND_INS_PORT/tools/lookup_order\""
cat >"$OUT/plain.toml" <<TOML
name = "plain"
instructions = "You are a shop's voice assistant. Look up the caller's order when they call."
$tool
TOML
cat >"$OUT/flow.toml" <<TOML
name = "flow"
instructions = "You are a shop's voice assistant."
$tool

[[node]]
name = "identify"
respond_immediately = false   # the caller speaks first, as with the plain bot
task = "Look up the caller's order when they call."

[[node.function]]
name = "lookup_order"
transition_to = "help"

[[node]]
name = "help"
context_strategy = "$STRATEGY"
task = "Tell the caller where their order is and answer their questions about it."
TOML

run() {
    local bot=$1 round=$2
    local dir="$OUT/$bot-$round"
    RUST_LOG=error taskset -c "$SERVER_CORE" "$VOXIDE" serve --port "$PORT" --bot "$OUT/$bot.toml" \
        --max-sessions 1000 --sessions-per-minute-per-ip 0 \
        --stt deepgram --llm openai --tts cartesia >"$dir.log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    for _ in $(seq 120); do curl -s -o /dev/null "http://127.0.0.1:$PORT/readyz" && break; sleep 0.5; done
    taskset -c "$CLIENT_CORE" "$VOXIDE" loadtest --audio "$OUT/question.wav" --noise-dbfs -55 \
        --target "http://127.0.0.1:$PORT" --sessions 1 >/dev/null 2>&1 || true
    taskset -c "$CLIENT_CORE" "$VOXIDE" loadtest --audio "$OUT/question.wav" --noise-dbfs -55 \
        --target "http://127.0.0.1:$PORT" --sessions "$SESSIONS" --concurrency "$SESSIONS" \
        --turns "$TURNS" --ramp 4 --out "$dir" >/dev/null || true
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
    for bot in plain flow; do
        log "round $round, $bot: $SESSIONS sessions × $TURNS turns"
        run "$bot" "$round"
    done
done
python3 - "$OUT" "$STRATEGY" <<'PY'
import csv, glob, sys
out, strategy = sys.argv[1], sys.argv[2]
def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p * (len(values) - 1))))] if values else float("nan")
rows = []
for bot in ("plain", "flow"):
    first, later, failed = [], [], 0
    for path in sorted(glob.glob(f"{out}/{bot}-*/turns.csv")):
        for t in csv.DictReader(open(path)):
            if not t["v2v_ms"]:
                failed += 1
                continue
            (first if t["turn"] == "0" else later).append(float(t["v2v_ms"]))
    rows.append((bot, first, later, failed))
with open(f"{out}/results.md", "w") as f:
    f.write(f"strategy at the transition: {strategy}\n\n")
    f.write("| bot | first turn (tool call / transition) p50 / p95 | later turns (inside a node) p50 / p95 | turns | unanswered |\n|---|---|---|---|---|\n")
    for bot, first, later, failed in rows:
        f.write(f"| {bot} | {pct(first, .5):.0f} / {pct(first, .95):.0f} ms | {pct(later, .5):.0f} / {pct(later, .95):.0f} ms | {len(first) + len(later)} | {failed} |\n")
print(open(f"{out}/results.md").read())
PY
rm -f "$OUT/question.wav"
