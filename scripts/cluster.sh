#!/usr/bin/env bash
# Three voxide nodes behind HAProxy on this machine, loaded through the proxy with recorded
# audio, drained, killed and guarded; prints one JSON summary (and exits 1 if a check failed).
#
#   scripts/cluster.sh [--sessions N] [--release] [--out DIR]
#
# The nodes (`voxide serve --node-id nK`) listen on 127.0.0.11–13, with the providers' local
# stand-ins (examples/stand_in_providers.rs: Deepgram, an OpenAI-compatible stream, Cartesia)
# so that models do not starve two cores; HAProxy (deploy/haproxy/haproxy.cfg) listens on
# 127.0.0.1:8080. Phases, each checked:
#   1. N sessions over WebRTC (half through /start, half a direct /api/offer whose trickled
#      PATCHes the nodes forward): split across the nodes, no PATCH answered 404, all complete.
#   2. n1 drained mid-run (POST /admin/drain): its calls complete, new sessions land on n2 and
#      n3 only, and n1 exits 0.
#   3. n2 killed (-9) mid-run, n1 back: n2's calls fail with a reason, the others complete, new
#      sessions succeed on the nodes left.
#   4. Without the token every guarded endpoint answers 401; with it, a session starts.
set -euo pipefail
cd "$(dirname "$0")/.."

SESSIONS=30
PROFILE=debug
OUT=target/cluster
while (($#)); do
  case "$1" in
    --sessions) SESSIONS="$2"; shift 2 ;;
    --release) PROFILE=release; shift ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: scripts/cluster.sh [--sessions N] [--release] [--out DIR]" >&2; exit 2 ;;
  esac
done
((SESSIONS >= 6)) || { echo "cluster: --sessions must be at least 6" >&2; exit 2; }

if ! command -v haproxy >/dev/null 2>&1; then
  echo "cluster: installing haproxy (apt)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq haproxy
fi

echo "cluster: building voxide and the provider stand-ins ($PROFILE)"
build_flags=(--locked --bin voxide --example stand_in_providers)
[ "$PROFILE" = release ] && build_flags+=(--release)
# scripts/test.sh builds every target once, with the tests' features, and says so: building
# again here would build the tree a second time with other features.
[ "${VOXIDE_BUILT:-}" = "$PROFILE" ] || cargo build -q "${build_flags[@]}"
BIN="target/$PROFILE/voxide"
STAND_INS="target/$PROFILE/examples/stand_in_providers"

rm -rf "$OUT"
mkdir -p "$OUT"
TOKEN="cluster-$RANDOM$RANDOM"
PORT=7860
AGENT_PORT=7870
LB=127.0.0.1:8080
STAND_IN_PORT=9000
AUDIO=assets/test/hello_16k.wav
PEERS="n1=http://127.0.0.11:$PORT,n2=http://127.0.0.12:$PORT,n3=http://127.0.0.13:$PORT"
declare -A PIDS

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

"$STAND_INS" --port "$STAND_IN_PORT" >"$OUT/stand_ins.log" 2>&1 &
PIDS[stand_ins]=$!

start_node() {
  local n=$1
  DEEPGRAM_API_KEY=local DEEPGRAM_URL="ws://127.0.0.1:$STAND_IN_PORT" \
  CARTESIA_API_KEY=local CARTESIA_URL="ws://127.0.0.1:$STAND_IN_PORT" \
  OPENAI_API_KEY=local OPENAI_BASE_URL="http://127.0.0.1:$STAND_IN_PORT/v1" \
  RUST_LOG="${RUST_LOG:-warn,voxide::server=info}" \
    "$BIN" serve --host "127.0.0.1$n" --port "$PORT" --node-id "n$n" --peers "$PEERS" \
      --agent-port "$AGENT_PORT" --auth-token "$TOKEN" --cluster-secret "cluster-$TOKEN" \
      --trust-forwarded-for \
      --sessions-per-minute-per-ip 100000 --max-sessions 24 --drain-timeout-secs 120 \
      --stt deepgram --llm openai --tts cartesia --turn silence \
      >>"$OUT/n$n.log" 2>&1 &
  PIDS[n$n]=$!
}

wait_ready() {
  local n=$1
  for _ in $(seq 1 600); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1$n:$PORT/readyz")" = 200 ]; then
      return 0
    fi
    sleep 0.2
  done
  echo "cluster: node n$n never became ready (see $OUT/n$n.log)" >&2
  exit 1
}

for n in 1 2 3; do start_node "$n"; done
for n in 1 2 3; do wait_ready "$n"; done

VOXIDE_LB_BIND=$LB VOXIDE_AGENT_PORT=$AGENT_PORT VOXIDE_N1="127.0.0.11:$PORT" \
  VOXIDE_N2="127.0.0.12:$PORT" VOXIDE_N3="127.0.0.13:$PORT" \
  haproxy -db -f deploy/haproxy/haproxy.cfg >"$OUT/haproxy.log" 2>&1 &
PIDS[haproxy]=$!
# HAProxy has checked every node once the proxy answers for all three.
sleep 3

# loadtest NAME PROTOCOL SESSIONS TURNS [HOST:PORT]: through the proxy (or straight to a
# node), results under $OUT/NAME.
loadtest() {
  local name=$1 protocol=$2 sessions=$3 turns=$4 entry=${5:-$LB}
  local target="http://$entry"
  [ "$protocol" = webrtc-start ] && target="http://$entry/start"
  [ "$protocol" = webrtc ] && target="http://$entry/api/offer"
  "$BIN" loadtest --target "$target" --protocol "$protocol" --audio "$AUDIO" \
    --sessions "$sessions" --concurrency "$sessions" --turns "$turns" --ramp "$RAMP" \
    --auth-token "$TOKEN" --max-pacing-lag-ms 1000 --response-timeout 10 --out "$OUT/$name" \
    >"$OUT/$name.log" 2>&1 || true
}

# New sessions arrive over time, as callers do: the agent check (every 500 ms) reports each
# node's load before the balancer picks the next one.
RAMP=$(python3 -c "print(max(2.0, $SESSIONS * 0.2))")

node_sessions() { curl -s "http://127.0.0.1$1:$PORT/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sessions"])'; }

echo "cluster: 1. $SESSIONS sessions through the proxy"
half=$((SESSIONS / 2))
loadtest start webrtc-start "$half" 1 &
l1=$!
loadtest offer webrtc $((SESSIONS - half)) 1 &
l2=$!
wait $l1 $l2

# calls_up PHASE N: long calls through the proxy ($PHASE_live) and one straight to node N
# ($PHASE_held, so that it surely holds one); returns once N holds a call. Sets $live, $held.
calls_up() {
  local phase=$1 n=$2
  loadtest "${phase}_live" webrtc-start "$third" 3 &
  live=$!
  loadtest "${phase}_held" webrtc-start 1 3 "127.0.0.1$n:$PORT" &
  held=$!
  for _ in $(seq 1 100); do
    [ "$(node_sessions "$n")" -gt 0 ] && break
    sleep 0.2
  done
  sleep 1
}

third=$((SESSIONS / 3))
echo "cluster: 2. draining n1 mid-run"
calls_up drain 1
n1_live_at_drain=$(node_sessions 1)
drain_status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
  "http://127.0.0.11:$PORT/admin/drain")
# HAProxy's checks see the drain within a second or two.
sleep 3
loadtest drain_new webrtc-start "$third" 1
wait $live $held
n1_exit=0
wait "${PIDS[n1]}" || n1_exit=$?
unset 'PIDS[n1]'

echo "cluster: 3. killing n2 mid-run"
start_node 1
wait_ready 1
sleep 3
calls_up kill 2
n2_live_at_kill=$(node_sessions 2)
kill -9 "${PIDS[n2]}"
wait "${PIDS[n2]}" 2>/dev/null || true
unset 'PIDS[n2]'
wait $live $held
sleep 3
loadtest kill_new webrtc-start "$third" 1

echo "cluster: 4. the token"
: >"$OUT/unauthorized.txt"
for request in "POST /start" "POST /api/offer" "PATCH /api/offer" "POST /sessions/n1.x/api/offer" \
  "GET /ws" "GET /ws/twilio" "POST /admin/drain"; do
  set -- $request
  code=$(curl -s -o /dev/null -w '%{http_code}' -X "$1" -H 'Content-Type: application/json' \
    -d '{}' "http://$LB$2")
  echo "$1 $2 $code" >>"$OUT/unauthorized.txt"
done
with_token=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
  "http://$LB/start")

status=0
python3 - "$OUT" "$SESSIONS" "$n1_live_at_drain" "$drain_status" "$n1_exit" \
  "$n2_live_at_kill" "$with_token" <<'PY' || status=$?
import json, sys
out, sessions, n1_live, drain_status, n1_exit, n2_live, with_token = sys.argv[1:]
unauthorized = {}
with open(f"{out}/unauthorized.txt") as f:
    for line in f:
        method, path, code = line.split()
        unauthorized[f"{method} {path}"] = int(code)

def run(name):
    with open(f"{out}/{name}/summary.json") as f:
        s = json.load(f)
    return {
        "sessions": s["sessions"],
        "nodes": s["nodes"],
        "errors": s["errors"],
        "trickle": s["trickle"],
        "v2v_p50_ms": (s["metrics"].get("v2v") or {}).get("p50"),
    }

runs = {name: run(name) for name in ["start", "offer", "drain_live", "drain_held", "drain_new", "kill_live", "kill_held", "kill_new"]}
checks = {}
split = {}
for name in ["start", "offer"]:
    for node, n in runs[name]["nodes"].items():
        split[node] = split.get(node, 0) + n
sessions = int(sessions)
fair = sessions / 3
checks["1_split_even"] = len(split) == 3 and all(abs(n - fair) <= max(3, fair * 0.3) for n in split.values())
checks["1_no_patch_404"] = all("404" not in map(str, r["trickle"]["refused"]) for r in runs.values())
checks["1_all_complete"] = all(runs[n]["sessions"]["completed"] == runs[n]["sessions"]["started"] for n in ["start", "offer"])
def complete(name):
    return runs[name]["sessions"]["completed"] == runs[name]["sessions"]["started"]

checks["2_drained_calls_complete"] = complete("drain_live") and complete("drain_held") and int(n1_live) > 0
checks["2_new_sessions_avoid_n1"] = "n1" not in runs["drain_new"]["nodes"] and complete("drain_new")
checks["2_n1_exit_0"] = drain_status == "202" and n1_exit == "0"
kill_live = runs["kill_live"]
on_n2 = kill_live["nodes"].get("n2", 0)
held = runs["kill_held"]
checks["3_only_n2_calls_fail"] = (
    int(n2_live) > 0
    and held["sessions"]["failed"] == 1
    and len(held["errors"]) > 0
    and kill_live["sessions"]["failed"] <= on_n2
    and kill_live["sessions"]["completed"] >= kill_live["sessions"]["started"] - on_n2
)
checks["3_new_sessions_succeed"] = "n2" not in runs["kill_new"]["nodes"] and complete("kill_new")
checks["4_401_without_token"] = all(code == 401 for code in unauthorized.values())
checks["4_ok_with_token"] = with_token == "200"
summary = {
    "sessions": sessions,
    "split": split,
    "n1_live_at_drain": int(n1_live),
    "n1_exit": int(n1_exit),
    "n2_live_at_kill": int(n2_live),
    "unauthorized": unauthorized,
    "with_token": int(with_token),
    "runs": runs,
    "checks": checks,
    "pass": all(checks.values()),
}
print(json.dumps(summary))
sys.exit(0 if summary["pass"] else 1)
PY
if ((status != 0)); then
  # What the balancer saw: each request's node and every health and agent state change.
  echo "cluster: a check failed; HAProxy's log ($OUT/haproxy.log):" >&2
  head -n 100 "$OUT/haproxy.log" >&2
fi
exit "$status"
