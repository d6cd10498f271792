#!/usr/bin/env bash
# voxide's bot and pipecat 1.14's standard bot, side by side: the same provider stand-ins, the
# same recorded questions, the same `voxide loadtest`. For each bot it measures
#   1. the single-session voice-to-voice (p95 over TURNS turns, from the audio),
#   2. the capacity: the most sessions at once whose p95 v2v stays within 200 ms of (1),
#   3. at that load, the server's CPU (cores per session) and RSS (MB per session).
# The bot runs alone on core SERVER_CORE; the stand-ins and the load generator share CLIENT_CORE.
#
#   bench/pipecat-compare/run.sh                 # both bots, results in bench/pipecat-compare/results/
#   BOTS=voxide MAX=256 bench/pipecat-compare/run.sh
#   TURN=silence bench/pipecat-compare/run.sh    # turns end on 0.6 s of silence, no turn model
#   NOISE_DBFS=off bench/pipecat-compare/run.sh  # digital silence between the words (the lab)
#
# The callers are in a quiet room: brown noise at NOISE_DBFS (default -55) dBFS under the speech
# and in every gap, as a microphone sends.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-$ROOT/target/venv-pipecat}
BOTS=${BOTS:-voxide pipecat}
MAX=${MAX:-128}
TURNS=${TURNS:-4}
# The first wave's starts spread over about one turn's cycle, so callers' turns end at random
# moments, as independent callers' do, not all in the same second.
RAMP=${RAMP:-4}
# `smart` (both bots' default: Smart Turn v3 judges each pause) or `silence` (0.6 s of silence).
TURN=${TURN:-smart}
SERVER_CORE=${SERVER_CORE:-0}
CLIENT_CORE=${CLIENT_CORE:-1}
STAND_INS_PORT=${STAND_INS_PORT:-9000}
NOISE_DBFS=${NOISE_DBFS:--55}
OUT=${OUT:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}
VOXIDE=${VOXIDE:-$ROOT/target/release/voxide}  # VOXIDE=PATH: another build of it
mkdir -p "$OUT"

BENCH=pipecat-compare
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"

if [[ " $BOTS " == *" pipecat "* && ! -x "$VENV/bin/python" ]]; then
    log "installing pipecat 1.14 into $VENV (a minute or two)"
    python3.11 -m venv "$VENV"
    "$VENV/bin/pip" install --progress-bar on \
        'pipecat-ai[deepgram,cartesia,openai,anthropic,webrtc,runner,whisper]==1.14.0'
fi
build_release

make_questions "$OUT"
AUDIO=(--audio "$OUT/question1.wav" --audio "$OUT/question2.wav")
[ "$NOISE_DBFS" = off ] || AUDIO+=(--noise-dbfs "$NOISE_DBFS")
VOXIDE_TURN=()
if [ "$TURN" = silence ]; then
    VOXIDE_TURN=(--turn silence --turn-timeout-secs 0.6)
fi
export TURN

taskset -c "$CLIENT_CORE" "$ROOT/target/release/examples/stand_in_providers" \
    --port "$STAND_INS_PORT" >"$OUT/stand_ins.log" 2>&1 &
pids+=($!)
export DEEPGRAM_API_KEY=local DEEPGRAM_URL=ws://127.0.0.1:$STAND_INS_PORT \
    CARTESIA_API_KEY=local CARTESIA_URL=ws://127.0.0.1:$STAND_INS_PORT \
    OPENAI_API_KEY=local OPENAI_BASE_URL=http://127.0.0.1:$STAND_INS_PORT/v1 \
    STAND_INS=127.0.0.1:$STAND_INS_PORT

# The bot's server on its own core; prints its pid.
start_bot() {
    local bot=$1 port=$2
    case $bot in
    voxide)
        # Every session comes from one address here: no per-address limit on new sessions
        # (120 a minute by default), which the search's later steps would hit.
        RUST_LOG=error taskset -c "$SERVER_CORE" "$VOXIDE" serve --port "$port" \
            --max-sessions 1000 --sessions-per-minute-per-ip 0 \
            --stt deepgram --llm openai --tts cartesia "${VOXIDE_TURN[@]}" \
            >"$OUT/$bot.log" 2>&1 &
        ;;
    pipecat)
        (cd "$HERE" && exec taskset -c "$SERVER_CORE" "$VENV/bin/python" bot.py -t webrtc \
            --host 127.0.0.1 --port "$port") >"$OUT/$bot.log" 2>&1 &
        ;;
    esac
    echo $!
}

wait_http() {
    for _ in $(seq 120); do
        curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0
        sleep 0.5
    done
    log "no server on port $1"
    return 1
}

# utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

loadtest() {
    taskset -c "$CLIENT_CORE" "$VOXIDE" loadtest "${AUDIO[@]}" --turns "$TURNS" --ramp "$RAMP" "$@"
}

json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

port=7870
for bot in $BOTS; do
    port=$((port + 1))
    pid=$(start_bot "$bot" "$port")
    pids+=("$pid")
    wait_http "$port"
    target=http://127.0.0.1:$port
    log "$bot: one session, $TURNS turns"
    loadtest --target "$target" --sessions 1 --out "$OUT/$bot/single" >/dev/null || true
    single=$(json "$OUT/$bot/single/summary.json" "round(d['metrics']['v2v']['p95'])")
    warm_rss=$(rss_kb "$pid")
    slo=$((single + 200))
    log "$bot: single-session p95 v2v ${single} ms; capacity under p95(v2v)<${slo}ms"
    code=0
    loadtest --target "$target" --find-capacity "$MAX" --slo "p95(v2v)<${slo}ms" \
        --slo 'error_rate<1%' --out "$OUT/$bot/capacity" >/dev/null || code=$?
    capacity=$(json "$OUT/$bot/capacity/capacity.json" "d['capacity'] or 0")
    verdict=$(json "$OUT/$bot/capacity/capacity.json" "d['verdict']")
    log "$bot: capacity $capacity sessions at once ($verdict, exit $code)"
    if [ "$capacity" -gt 0 ]; then
        # The capacity's load once more on a fresh server (warmed by one session, so the
        # models are loaded), with its CPU and memory sampled: RSS per session is the peak
        # over the warm figure, which the search's larger steps would have inflated.
        kill "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
        pid=$(start_bot "$bot" "$port")
        pids+=("$pid")
        wait_http "$port"
        taskset -c "$CLIENT_CORE" "$VOXIDE" loadtest "${AUDIO[@]}" --target "$target" \
            --sessions 1 >/dev/null 2>&1 || true
        idle_rss=$(rss_kb "$pid")
        ticks0=$(cpu_ticks "$pid")
        t0=$(date +%s.%N)
        loadtest --target "$target" --sessions "$capacity" --concurrency "$capacity" \
            --out "$OUT/$bot/at-capacity" >/dev/null &
        lt=$!
        peak=$idle_rss
        while kill -0 "$lt" 2>/dev/null; do
            rss=$(rss_kb "$pid")
            [ "$rss" -gt "$peak" ] && peak=$rss
            sleep 0.2
        done
        wait "$lt" || true
        t1=$(date +%s.%N)
        ticks1=$(cpu_ticks "$pid")
    else
        idle_rss=$warm_rss peak=$warm_rss ticks0=0 ticks1=0 t0=0 t1=1
    fi
    python3 - "$OUT/$bot" "$bot" "$single" "$capacity" "$verdict" "$idle_rss" "$peak" \
        "$ticks0" "$ticks1" "$t0" "$t1" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
out, bot, single, cap, verdict, idle, peak, t0, t1, w0, w1, hz = sys.argv[1:]
cap = int(cap)
at = {}
try:
    at = json.load(open(f"{out}/at-capacity/summary.json"))["metrics"]["v2v"]
except (OSError, KeyError, TypeError):
    pass
cores = (int(t1) - int(t0)) / int(hz) / (float(w1) - float(w0))
row = {
    "bot": bot,
    "single_p95_v2v_ms": int(single),
    "capacity_per_core": cap,
    "search_verdict": verdict,
    "at_capacity_v2v_p50_ms": at.get("p50"),
    "at_capacity_v2v_p95_ms": at.get("p95"),
    "server_cores_busy": round(cores, 3),
    "cpu_per_session_pct": round(100 * cores / cap, 2) if cap else None,
    "warm_rss_mb": round(int(idle) / 1024, 1),
    "peak_rss_mb": round(int(peak) / 1024, 1),
    "rss_per_session_mb": round((int(peak) - int(idle)) / 1024 / cap, 2) if cap else None,
}
json.dump(row, open(f"{out}/result.json", "w"), indent=2)
print(json.dumps(row))
EOF
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
done

python3 - "$OUT" $BOTS <<'EOF' | tee "$OUT/results.md"
import json, sys
out, bots = sys.argv[1], sys.argv[2:]
rows = {b: json.load(open(f"{out}/{b}/result.json")) for b in bots}
print("| bot | p95 v2v, 1 session | sessions per core (p95 within +200 ms) | p50 / p95 v2v at that load | CPU per session | RSS per session | RSS after one session |")
print("|---|---|---|---|---|---|---|")
for b, r in rows.items():
    print(f"| {b} | {r['single_p95_v2v_ms']} ms | {r['capacity_per_core']} | "
          f"{r['at_capacity_v2v_p50_ms']:.0f} / {r['at_capacity_v2v_p95_ms']:.0f} ms | "
          f"{r['cpu_per_session_pct']} % of a core | {r['rss_per_session_mb']} MB | {r['warm_rss_mb']} MB |")
if "voxide" in rows and "pipecat" in rows and rows["pipecat"]["capacity_per_core"]:
    v, p = rows["voxide"], rows["pipecat"]
    print(f"\nvoxide / pipecat: {v['capacity_per_core'] / p['capacity_per_core']:.1f}x the sessions "
          f"per core within the latency bound, {p['cpu_per_session_pct'] / v['cpu_per_session_pct']:.1f}x "
          f"less CPU per session")
EOF
log "results in $OUT"
