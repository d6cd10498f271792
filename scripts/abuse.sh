#!/usr/bin/env bash
# Abusive clients beside well-behaved ones: `voxide serve` on the providers' stand-ins, a
# `voxide loadtest` of --sessions callers for --seconds alone, then the same load again while
# `examples/abusive_clients` runs beside it (audio at ten times real time, clients that never
# read, messages over the size limit, sessions opened and dropped in a loop), the server's RSS
# sampled every second throughout.
#
# Prints one JSON line: the callers' v2v p50/p95 alone and beside the abusers, the server's RSS
# in both phases, and what the server did to each kind of abuser. Exits 1 if a goal is missed:
# the callers' v2v within 10 % (p50 and p95), no failed caller, RSS bounded (peak under the
# abused phase within 25 % of the calm one's), every flooding or oversized client closed with a
# reason, the loop rate-limited, the deaf clients not listened to and closed.
#
# With --embedded the server runs the embedded defaults (Whisper, Smart Turn, SmolLM2, Piper)
# instead of the stand-ins: the abusers then compete with the models for the CPU, and a
# slowdown of the callers shows in their v2v.
#
# The callers' microphones are in a quiet room: brown noise at -55 dBFS under the speech and in
# every gap (--noise-dbfs N to change it, --digital-silence for the lab's digital zero).
#
#   scripts/abuse.sh [--sessions C] [--seconds S] [--fast N] [--deaf N] [--big N] [--churn N] [--embedded]
#                    [--noise-dbfs N | --digital-silence] [--release] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

SESSIONS=10
SECONDS_EACH=60
FAST=2 DEAF=2 BIG=1 CHURN=1
PROFILE=debug
EMBEDDED=0
OUT=target/abuse
NOISE=(--noise-dbfs -55)
while (($#)); do
  case "$1" in
    --sessions) SESSIONS="$2"; shift 2 ;;
    --seconds) SECONDS_EACH="$2"; shift 2 ;;
    --fast) FAST="$2"; shift 2 ;;
    --deaf) DEAF="$2"; shift 2 ;;
    --big) BIG="$2"; shift 2 ;;
    --churn) CHURN="$2"; shift 2 ;;
    --embedded) EMBEDDED=1; shift ;;
    --release) PROFILE=release; shift ;;
    --noise-dbfs) NOISE=(--noise-dbfs "$2"); shift 2 ;;
    --digital-silence) NOISE=(); shift ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: scripts/abuse.sh [--sessions C] [--seconds S] [--fast N] [--deaf N] [--big N] [--churn N] [--embedded] [--noise-dbfs N | --digital-silence] [--release] [--out DIR]" >&2; exit 2 ;;
  esac
done

echo "abuse: building voxide, the provider stand-ins and the abusive clients ($PROFILE)"
build_flags=(--locked --bin voxide --example stand_in_providers --example abusive_clients)
[ "$PROFILE" = release ] && build_flags+=(--release)
cargo build -q "${build_flags[@]}"
BIN="target/$PROFILE/voxide"

rm -rf "$OUT"
mkdir -p "$OUT"
PORT=7970
STAND_IN_PORT=9020
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

services=()
if ((EMBEDDED)); then
  scripts/setup.sh >/dev/null
else
  "target/$PROFILE/examples/stand_in_providers" --port "$STAND_IN_PORT" >"$OUT/stand_ins.log" 2>&1 &
  pids+=($!)
  export DEEPGRAM_API_KEY=local DEEPGRAM_URL="ws://127.0.0.1:$STAND_IN_PORT"
  export CARTESIA_API_KEY=local CARTESIA_URL="ws://127.0.0.1:$STAND_IN_PORT"
  export OPENAI_API_KEY=local OPENAI_BASE_URL="http://127.0.0.1:$STAND_IN_PORT/v1"
  services=(--stt deepgram --llm openai --tts cartesia)
fi
"$BIN" serve --port "$PORT" --node-id abuse --max-sessions $((SESSIONS * 2 + FAST + DEAF + BIG + CHURN + 4)) \
  --trust-forwarded-for "${services[@]}" >"$OUT/server.log" 2>&1 &
server=$!
pids+=($server)
for _ in $(seq 1 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/readyz")" = 200 ] && break
  sleep 0.2
done

python3 - "$server" >"$OUT/rss.jsonl" <<'PY' &
import json, os, sys, time
pid = sys.argv[1]
while os.path.exists(f"/proc/{pid}"):
    try:
        status = open(f"/proc/{pid}/status").read()
        rss_kb = int(next(l.split()[1] for l in status.splitlines() if l.startswith("VmRSS:")))
        print(json.dumps({"t": time.time(), "rss_mb": rss_kb / 1024}), flush=True)
    except (OSError, StopIteration, ValueError):
        pass
    time.sleep(1)
PY
pids+=($!)

load() {
  "$BIN" loadtest --target "http://127.0.0.1:$PORT" --protocol ws --audio assets/test/hello_16k.wav \
    --concurrency "$SESSIONS" --duration "$SECONDS_EACH" --ramp 5 --turns 3 \
    --response-timeout 10 --max-pacing-lag-ms 1000 "${NOISE[@]}" --out "$OUT/$1" >"$OUT/$1.log" 2>&1 || true
}

echo "abuse: $SESSIONS callers for $SECONDS_EACH s, alone"
calm_from=$(python3 -c 'import time; print(time.time())')
load calm
echo "abuse: the same callers beside $FAST fast, $DEAF deaf, $BIG oversized and $CHURN looping clients"
abused_from=$(python3 -c 'import time; print(time.time())')
"target/$PROFILE/examples/abusive_clients" --target "127.0.0.1:$PORT" \
  --audio assets/test/hello_16k.wav --seconds "$SECONDS_EACH" \
  --fast "$FAST" --deaf "$DEAF" --big "$BIG" --churn "$CHURN" >"$OUT/abusers.json" 2>"$OUT/abusers.log" &
abusers=$!
load abused
wait "$abusers" || true
abused_to=$(python3 -c 'import time; print(time.time())')
curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt"

python3 - "$OUT" "$calm_from" "$abused_from" "$abused_to" <<'PY'
import csv, json, sys
out, calm_from, abused_from, abused_to = sys.argv[1], *map(float, sys.argv[2:])
rss = [json.loads(l) for l in open(f"{out}/rss.jsonl") if l.strip()]

def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else None

def phase(name):
    summary = json.load(open(f"{out}/{name}/summary.json"))
    v2v = [float(t["v2v_ms"]) for t in csv.DictReader(open(f"{out}/{name}/turns.csv")) if t["v2v_ms"]]
    return {"sessions": summary["sessions"], "turns": summary["turns"], "errors": summary["errors"],
            "v2v_p50_ms": quantile(v2v, 0.5), "v2v_p95_ms": quantile(v2v, 0.95)}

calm, abused = phase("calm"), phase("abused")
def peak(lo, hi):
    return max((s["rss_mb"] for s in rss if lo <= s["t"] <= hi), default=None)

calm["rss_peak_mb"] = peak(calm_from, abused_from)
abused["rss_peak_mb"] = peak(abused_from, abused_to)
abusers = json.load(open(f"{out}/abusers.json"))
def counter(name):
    return sum(float(l.split()[1]) for l in open(f"{out}/metrics.txt") if l.startswith(name))
dropped = counter("voxide_audio_dropped_total")
server = {"closed_too_fast": counter("voxide_sessions_too_fast_total "),
          "closed_not_reading": counter("voxide_sessions_not_reading_total "),
          "unheard_audio_frames": counter("voxide_unheard_audio_frames_total ")}

def within(a, b, share):
    return a is not None and b is not None and abs(b - a) <= share * a

goals = {
    "v2v_p50_within_10pct": within(calm["v2v_p50_ms"], abused["v2v_p50_ms"], 0.10),
    "v2v_p95_within_10pct": within(calm["v2v_p95_ms"], abused["v2v_p95_ms"], 0.10),
    "no_failed_caller": calm["sessions"]["failed"] == 0 and abused["sessions"]["failed"] == 0,
    "rss_bounded": within(calm["rss_peak_mb"], abused["rss_peak_mb"], 0.25),
    "flooders_closed_with_a_reason": abusers["fast"]["clients"] == 0
        or (abusers["fast"]["closed_by_server"] > 0
            and abusers["fast"]["told_why"] == abusers["fast"]["closed_by_server"]),
    "oversized_closed": abusers["big"]["clients"] == 0
        or (abusers["big"]["closed_by_server"] > 0 and abusers["big"]["still_open"] == 0),
    "loop_rate_limited": abusers["churn"]["clients"] == 0 or abusers["churn"]["rate_limited"] > 0,
    "deaf_not_listened_to": abusers["deaf"]["clients"] == 0
        or (server["closed_not_reading"] > 0 and server["unheard_audio_frames"] > 0),
}
result = {"calm": calm, "abused": abused, "abusers": abusers,
          "audio_dropped_for_slow_readers": dropped, "server": server, "goals": goals, "pass": all(goals.values())}
print(json.dumps(result))
sys.exit(0 if result["pass"] else 1)
PY
