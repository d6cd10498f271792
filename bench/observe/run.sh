#!/usr/bin/env bash
# What recording and tracing cost: the same load on voxide with and without
# `--record-dir` and `--otlp-endpoint`, in turns (off, on, off, on), the bot alone on one core.
#
#   bench/observe/run.sh                    # SESSIONS=40 TURNS=4, results in bench/observe/results/
#
# The bot is pipecat-compare's (`--stt deepgram --llm openai --tts cartesia` on the local
# stand-ins, which answer after 550 ms); the callers are in a quiet room (brown noise at
# -55 dBFS) and reach it over SmallWebRTC. The collector is a local OTLP/HTTP endpoint that
# takes every export (Python's http.server on the client core). For each run: the server's CPU
# time over the load (cores busy ÷ sessions) and the callers' v2v from the audio.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SESSIONS=${SESSIONS:-40}
TURNS=${TURNS:-4}
ROUNDS=${ROUNDS:-2}
SERVER_CORE=${SERVER_CORE:-0}
CLIENT_CORE=${CLIENT_CORE:-1}
STAND_INS_PORT=${STAND_INS_PORT:-9000}
COLLECTOR_PORT=${COLLECTOR_PORT:-4318}
OUT=${OUT:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}
VOXIDE=$ROOT/target/release/voxide
mkdir -p "$OUT"

BENCH=observe-bench
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

build_release
need_speech_tools
text=("" "What time is it?" "What is the weather like in Paris today?")
for i in 1 2; do
    espeak-ng -v en-gb -s 165 -w "$OUT/raw$i.wav" "${text[$i]}"
    sox "$OUT/raw$i.wav" -r 16000 -c 1 -b 16 "$OUT/question$i.wav"
    rm "$OUT/raw$i.wav"
done
AUDIO=(--audio "$OUT/question1.wav" --audio "$OUT/question2.wav" --noise-dbfs -55)

taskset -c "$CLIENT_CORE" "$ROOT/target/release/examples/stand_in_providers" \
    --port "$STAND_INS_PORT" >"$OUT/stand_ins.log" 2>&1 &
pids+=($!)
export DEEPGRAM_API_KEY=local DEEPGRAM_URL=ws://127.0.0.1:$STAND_INS_PORT \
    CARTESIA_API_KEY=local CARTESIA_URL=ws://127.0.0.1:$STAND_INS_PORT \
    OPENAI_API_KEY=local OPENAI_BASE_URL=http://127.0.0.1:$STAND_INS_PORT/v1

# The collector: takes every export, counts the bytes.
taskset -c "$CLIENT_CORE" python3 - "$COLLECTOR_PORT" "$OUT/collector.log" <<'PY' &
import http.server, sys
port, log = int(sys.argv[1]), sys.argv[2]
class Collector(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with open(log, "a") as f:
            f.write(f"{len(body)}\n")
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Collector).serve_forever()
PY
pids+=($!)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run() {
    local mode=$1 round=$2 port=7880 extra=()
    local dir="$OUT/$mode-$round"
    if [ "$mode" = on ]; then
        rm -rf "$OUT/recordings" && mkdir -p "$OUT/recordings"
        extra=(--record-dir "$OUT/recordings" --otlp-endpoint "http://127.0.0.1:$COLLECTOR_PORT")
    fi
    RUST_LOG=error taskset -c "$SERVER_CORE" "$VOXIDE" serve --port "$port" \
        --max-sessions 1000 --sessions-per-minute-per-ip 0 \
        --stt deepgram --llm openai --tts cartesia "${extra[@]}" >"$dir.log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    for _ in $(seq 120); do curl -s -o /dev/null "http://127.0.0.1:$port/readyz" && break; sleep 0.5; done
    # Warm: the models loaded, the first session's costs paid.
    taskset -c "$CLIENT_CORE" "$VOXIDE" loadtest "${AUDIO[@]}" --target "http://127.0.0.1:$port" \
        --sessions 1 >/dev/null 2>&1 || true
    local ticks0 t0 ticks1 t1
    ticks0=$(cpu_ticks "$pid"); t0=$(date +%s.%N)
    taskset -c "$CLIENT_CORE" "$VOXIDE" loadtest "${AUDIO[@]}" --target "http://127.0.0.1:$port" \
        --sessions "$SESSIONS" --concurrency "$SESSIONS" --turns "$TURNS" --ramp 4 \
        --out "$dir" >/dev/null || true
    # Until the server has ended every session (and, when on, finished its files).
    for _ in $(seq 150); do
        curl -s "http://127.0.0.1:$port/status" | grep -q '"sessions":0' && break
        sleep 0.2
    done
    ticks1=$(cpu_ticks "$pid"); t1=$(date +%s.%N)
    curl -s "http://127.0.0.1:$port/metrics" >"$dir.metrics"
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$OUT/recordings"
    python3 - "$dir" "$mode" "$SESSIONS" "$ticks0" "$ticks1" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY'
import json, sys
d, mode, n, k0, k1, t0, t1, hz = sys.argv[1:]
v2v = json.load(open(f"{d}/summary.json"))["metrics"]["v2v"]
busy = (int(k1) - int(k0)) / int(hz) / (float(t1) - float(t0))
json.dump({"mode": mode, "sessions": int(n), "server_cores_busy": round(busy, 4),
           "cpu_per_session_pct": round(100 * busy / int(n), 3),
           "v2v_p50_ms": round(v2v["p50"]), "v2v_p95_ms": round(v2v["p95"]),
           "turns": v2v.get("n")}, open(f"{d}.json", "w"))
print(open(f"{d}.json").read())
PY
}

for round in $(seq "$ROUNDS"); do
    for mode in off on; do
        log "round $round, recording and tracing $mode: $SESSIONS sessions × $TURNS turns"
        run "$mode" "$round"
    done
done
python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
rows = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/*-[0-9].json"))]
with open(f"{out}/results.md", "w") as f:
    f.write("| run | cores busy | CPU per session | v2v p50 / p95 |\n|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r['mode']} | {r['server_cores_busy']:.3f} | {r['cpu_per_session_pct']:.2f} % | {r['v2v_p50_ms']} / {r['v2v_p95_ms']} ms |\n")
print(open(f"{out}/results.md").read())
PY
rm -f "$OUT"/question*.wav
