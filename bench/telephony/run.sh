#!/usr/bin/env bash
# A phone caller over SIP beside a WebRTC caller: the same bot on the provider stand-ins, the
# same recorded questions over a quiet room's noise floor, the same `voxide loadtest`, v2v
# timed from the audio (the end of the caller's speech to the bot's first sound). Then CALLS SIP
# calls at once with the bot on one core.
#
#   bench/telephony/run.sh                  # results in bench/telephony/results/<time>/
#   CALLS=50 TURNS=2 bench/telephony/run.sh
#   NOISE_DBFS=off bench/telephony/run.sh   # digital silence between the words (the lab)
#   IMPAIR="--loss 2 --jitter-ms 30" bench/telephony/run.sh   # a lossy, jittery network
#   SIP_PROTOCOL=sip-g722 bench/telephony/run.sh   # wideband phones: G.722 both ways
#   SERVER=/path/to/old/voxide bench/telephony/run.sh # another build serves (a bisection);
#                                                     # this tree's load tester still calls
#
# Prints one JSON line: p50/p95 v2v of one WebRTC caller, of one SIP caller, their difference,
# and of CALLS SIP calls at once (with the network each ran over and the server's CPU seconds).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CALLS=${CALLS:-100}
TURNS=${TURNS:-8}
SERVER_CORE=${SERVER_CORE:-0}
CLIENT_CORE=${CLIENT_CORE:-1}
STAND_INS_PORT=${STAND_INS_PORT:-9100}
HTTP_PORT=${HTTP_PORT:-7890}
SIP_PORT=${SIP_PORT:-5094}
NOISE_DBFS=${NOISE_DBFS:--55}
SIP_PROTOCOL=${SIP_PROTOCOL:-sip}
OUT=${OUT:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"

BENCH=telephony
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
build_release
VOXIDE=$ROOT/target/release/voxide
SERVER=${SERVER:-$VOXIDE}
make_questions "$OUT"
AUDIO=(--audio "$OUT/question1.wav" --audio "$OUT/question2.wav")
[ "$NOISE_DBFS" = off ] || AUDIO+=(--noise-dbfs "$NOISE_DBFS")

taskset -c "$CLIENT_CORE" "$ROOT/target/release/examples/stand_in_providers" \
    --port "$STAND_INS_PORT" >"$OUT/stand_ins.log" 2>&1 &
pids+=($!)
DEEPGRAM_API_KEY=local DEEPGRAM_URL=ws://127.0.0.1:$STAND_INS_PORT \
CARTESIA_API_KEY=local CARTESIA_URL=ws://127.0.0.1:$STAND_INS_PORT \
OPENAI_API_KEY=local OPENAI_BASE_URL=http://127.0.0.1:$STAND_INS_PORT/v1 \
    taskset -c "$SERVER_CORE" "$SERVER" serve --port "$HTTP_PORT" --stt deepgram --llm openai \
    --tts cartesia --max-sessions $((CALLS * 2)) --sessions-per-minute-per-ip 0 \
    --sip-listen "127.0.0.1:$SIP_PORT" --sip-rtp-ports 30000-30999 >"$OUT/server.log" 2>&1 &
pids+=($!)
server=$!
for _ in $(seq 1 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$HTTP_PORT/readyz")" = 200 ] && break
    sleep 0.2
done

# The server's CPU time so far, in clock ticks (user + system, from /proc).
server_ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
# One run of the load tester: protocol, target, sessions at once, turns, name. The server's
# CPU seconds over the run go to $OUT/$name.cpu_s.
load() {
    local protocol=$1 target=$2 concurrency=$3 turns=$4 name=$5 before
    log "$name: $concurrency $protocol caller(s), $turns turns each"
    before=$(server_ticks)
    taskset -c "$CLIENT_CORE" "$VOXIDE" loadtest --protocol "$protocol" --target "$target" \
        "${AUDIO[@]}" --sessions "$concurrency" --concurrency "$concurrency" --turns "$turns" \
        --ramp 4 --response-timeout 10 ${IMPAIR:-} --out "$OUT/$name" >"$OUT/$name.log" 2>&1 || true
    echo "$(( $(server_ticks) - before ))" "$(getconf CLK_TCK)" \
        | awk '{printf "%.1f\n", $1 / $2}' >"$OUT/$name.cpu_s"
}
load webrtc "http://127.0.0.1:$HTTP_PORT" 1 "$TURNS" webrtc-one
load "$SIP_PROTOCOL" "sip:agent@127.0.0.1:$SIP_PORT" 1 "$TURNS" sip-one
load "$SIP_PROTOCOL" "sip:agent@127.0.0.1:$SIP_PORT" "$CALLS" 2 sip-many

python3 - "$OUT" "$CALLS" "$SIP_PROTOCOL" <<'PY'
import json, sys
out, calls, protocol = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def figures(name):
    s = json.load(open(f"{out}/{name}/summary.json"))
    v = s["metrics"].get("v2v") or {}
    return {"p50": v.get("p50"), "p95": v.get("p95"), "n": v.get("n"),
            "failed": s["sessions"]["failed"], "room": s.get("room"),
            "network": s.get("network"),
            "server_cpu_s": float(open(f"{out}/{name}.cpu_s").read())}
one_webrtc, one_sip, many = figures("webrtc-one"), figures("sip-one"), figures("sip-many")
result = {"sip_protocol": protocol, "webrtc_one": one_webrtc, "sip_one": one_sip,
          "sip_minus_webrtc_p50_ms": (one_sip["p50"] or 0) - (one_webrtc["p50"] or 0),
          "sip_minus_webrtc_p95_ms": (one_sip["p95"] or 0) - (one_webrtc["p95"] or 0),
          f"sip_{calls}_at_once": many,
          "many_minus_one_p95_ms": (many["p95"] or 0) - (one_sip["p95"] or 0)}
print(json.dumps(result))
PY
