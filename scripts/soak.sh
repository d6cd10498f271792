#!/usr/bin/env bash
# A soak: `voxide serve` with the providers' stand-ins, driven by `voxide loadtest` at a steady
# concurrency for --minutes, its RSS, file descriptors, threads and live sessions sampled every
# second. The bot has an async HTTP tool (the stand-ins' `lookup_order`) that the stand-in model
# calls once a session. With --faults RATE the stand-ins fail on purpose at that rate (sockets
# dropped, first tokens late, requests and upgrades refused).
#
# Prints one JSON line: the RSS slope per hour after warm-up, descriptors and threads at the
# start and the end, sessions started/completed/failed, v2v p95 of the first and the last 10 % of
# the sessions (turns a fault struck apart) and its drift, the faults struck, each final answered once / lost / twice, and tool
# results finished / delivered / dropped. Exits 1 if a goal is missed (RSS within ±5 % after
# warm-up, nothing leaked, no failed session, p95 drift within 10 %, no turn lost or answered
# twice, no tool result dropped).
#
# The callers' microphones are in a quiet room: brown noise at -55 dBFS under the speech and in
# every gap (--noise-dbfs N to change it, --digital-silence for the lab's digital zero).
#
#   scripts/soak.sh [--minutes M] [--concurrency C] [--protocol ws|webrtc] [--faults RATE]
#                   [--noise-dbfs N | --digital-silence] [--release] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES=30
CONCURRENCY=50
PROTOCOL=ws
PROFILE=debug
FAULTS=0
NOISE=(--noise-dbfs -55)
OUT=target/soak
while (($#)); do
  case "$1" in
    --minutes) MINUTES="$2"; shift 2 ;;
    --concurrency) CONCURRENCY="$2"; shift 2 ;;
    --protocol) PROTOCOL="$2"; shift 2 ;;
    --faults) FAULTS="$2"; shift 2 ;;
    --noise-dbfs) NOISE=(--noise-dbfs "$2"); shift 2 ;;
    --digital-silence) NOISE=(); shift ;;
    --release) PROFILE=release; shift ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: scripts/soak.sh [--minutes M] [--concurrency C] [--protocol ws|webrtc] [--faults RATE] [--noise-dbfs N | --digital-silence] [--release] [--out DIR]" >&2; exit 2 ;;
  esac
done

echo "soak: building voxide and the provider stand-ins ($PROFILE)"
build_flags=(--locked --bin voxide --example stand_in_providers)
[ "$PROFILE" = release ] && build_flags+=(--release)
# scripts/test.sh builds every target once, with the tests' features, and says so: building
# again here would build the tree a second time with other features.
[ "${VOXIDE_BUILT:-}" = "$PROFILE" ] || cargo build -q "${build_flags[@]}"
BIN="target/$PROFILE/voxide"

rm -rf "$OUT"
mkdir -p "$OUT"
PORT=7960
STAND_IN_PORT=9010
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

"target/$PROFILE/examples/stand_in_providers" --port "$STAND_IN_PORT" --faults "$FAULTS" \
  >"$OUT/stand_ins.log" 2>&1 &
pids+=($!)
cat >"$OUT/soak.toml" <<TOML
name = "soak"
instructions = "You are a shop's voice assistant. Look up the caller's order when they call."
[[tool]]
name = "lookup_order"
description = "Looks up the caller's latest order."
parameters = { type = "object", properties = {} }
url = "http://127.0.0.1:$STAND_IN_PORT/tools/lookup_order"
cancel_on_interruption = false
TOML
DEEPGRAM_API_KEY=local DEEPGRAM_URL="ws://127.0.0.1:$STAND_IN_PORT" \
CARTESIA_API_KEY=local CARTESIA_URL="ws://127.0.0.1:$STAND_IN_PORT" \
OPENAI_API_KEY=local OPENAI_BASE_URL="http://127.0.0.1:$STAND_IN_PORT/v1" \
  "$BIN" serve --bot "$OUT/soak.toml" --port "$PORT" --node-id soak --max-sessions $((CONCURRENCY * 2)) \
    --sessions-per-minute-per-ip 0 --stt deepgram --llm openai --tts cartesia \
    >"$OUT/server.log" 2>&1 &
server=$!
pids+=($server)
for _ in $(seq 1 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/readyz")" = 200 ] && break
  sleep 0.2
done

# One sample a second: RSS, descriptors (and of those, the sockets to the stand-ins: the HTTP
# clients' pools keep a connection idle for 90 s by design), threads, live sessions.
python3 - "$server" "$PORT" "$STAND_IN_PORT" >"$OUT/samples.jsonl" <<'PY' &
import json, os, sys, time, urllib.request
pid, port, provider_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.time()

def provider_inodes():
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == provider_port:
                inodes.add(fields[9])
    return inodes

while os.path.exists(f"/proc/{pid}"):
    try:
        status = open(f"/proc/{pid}/status").read()
        rss_kb = int(next(l.split()[1] for l in status.splitlines() if l.startswith("VmRSS:")))
        threads = int(next(l.split()[1] for l in status.splitlines() if l.startswith("Threads:")))
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        to_providers = provider_inodes()
        pooled = sum(1 for l in links if l.startswith("socket:[") and l[8:-1] in to_providers)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        active = next(int(l.split()[1]) for l in metrics.splitlines() if l.startswith("voxide_active_sessions "))
        print(json.dumps({"t": round(time.time() - start, 2), "rss_mb": rss_kb / 1024,
                          "fds": len(links), "provider_sockets": pooled, "threads": threads,
                          "active": active}), flush=True)
    except (OSError, StopIteration, ValueError):
        pass
    time.sleep(1)
PY
sampler=$!
pids+=($sampler)
sleep 3

echo "soak: $CONCURRENCY sessions at once for $MINUTES min over $PROTOCOL"
target="http://127.0.0.1:$PORT"
[ "$PROTOCOL" = webrtc ] && target="$target/api/offer"
"$BIN" loadtest --target "$target" --protocol "$PROTOCOL" --audio assets/test/hello_16k.wav \
  --concurrency "$CONCURRENCY" --duration $((MINUTES * 60)) --ramp 10 --turns 3 \
  --response-timeout 10 --max-pacing-lag-ms 1000 "${NOISE[@]}" --out "$OUT/load" >"$OUT/load.log" 2>&1 || true
# The sessions are gone, and the runtime's idle blocking threads (10 s keep-alive) too: what
# the server holds now is what it kept.
sleep 15
kill "$sampler" 2>/dev/null || true
curl -s "http://127.0.0.1:$STAND_IN_PORT/stand-in/stats" >"$OUT/stand_ins.json"

python3 - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
samples = [json.loads(l) for l in open(f"{out}/samples.jsonl") if l.strip()]
summary = json.load(open(f"{out}/load/summary.json"))
stand_ins = json.load(open(f"{out}/stand_ins.json"))
ledger = stand_ins["ledger"]
turns = list(csv.DictReader(open(f"{out}/load/turns.csv")))

def slope_per_hour(points):
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mx) * (v - my) for t, v in points) / var * 3600

loaded = [s for s in samples if s["active"] > 0]
warm = loaded[len(loaded) // 5:] if loaded else []
rss = [(s["t"], s["rss_mb"]) for s in warm]
mean_rss = sum(v for _, v in rss) / len(rss) if rss else 0.0
spread = max((abs(v - mean_rss) / mean_rss for _, v in rss), default=0.0) if mean_rss else 0.0

# The drift compares the first sessions with the last, each window whole sessions, so both hold
# the same mix of turns (a session's first turn, with its tool call, takes a model round trip
# more than the others): a tenth of the sessions, or more so that each window holds at least
# 200 turns (a quarter of the run at most). A p95 of fewer turns is their second-slowest, and
# one or two turns a fault struck (1 % of requests, each retried) would move it past 10 %.
#
# A turn a fault struck (its request refused or answered late, its STT or TTS socket dropped)
# takes the time the bot needs to make up for it: a retry, a reconnect. Those turns are kept out
# of the drift, which asks whether the bot slows down as it runs; their count and p95 are
# reported beside it. The stand-ins name the turns they struck; a turn whose finals come from
# another STT socket than the turn before it had its socket dropped or refused.
def p95(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))] if values else None
import re
struck_keys = set(ledger.get("struck_turns", []))
last_socket = {}
def struck(t):
    finals = re.findall(r"session (\S+) question (\d+)", t["transcript"])
    sockets = {s for s, _ in finals}
    before = last_socket.get(t["session"])
    if finals:
        last_socket[t["session"]] = finals[-1][0]
    return (any(f"session {s} question {q}" in struck_keys for s, q in finals)
            or len(sockets) > 1 or (before is not None and sockets and before not in sockets))
by_session = {}
struck_v2v = []
for t in sorted(turns, key=lambda t: (t["session"], int(t["turn"]))):
    hit = struck(t)
    if t["v2v_ms"] and hit:
        struck_v2v.append(float(t["v2v_ms"]))
    elif t["v2v_ms"]:
        by_session.setdefault(t["session"], []).append((float(t["speech_end_ms"]), float(t["v2v_ms"])))
sessions_in_order = sorted(by_session.values(), key=lambda ts: min(at for at, _ in ts))
if sessions_in_order:
    window = max(1, len(sessions_in_order) // 10)
    mean_turns = sum(len(s) for s in sessions_in_order) / len(sessions_in_order)
    window = max(window, int(200 / mean_turns) + 1)
    window = min(window, max(1, len(sessions_in_order) // 4))
    first = p95([v for s in sessions_in_order[:window] for _, v in s])
    last = p95([v for s in sessions_in_order[-window:] for _, v in s])
else:
    window = 0
    first = last = None
drift = (last - first) / first if first and last else None
idle_before, idle_after = samples[0], samples[-1]
result = {
    "minutes": summary["wall_s"] / 60,
    "room": summary.get("room"),
    "sessions": summary["sessions"],
    "turns": summary["turns"],
    "errors": summary["errors"],
    "rss_mb": {"start": idle_before["rss_mb"], "warm_mean": mean_rss, "end": idle_after["rss_mb"],
               "slope_mb_per_hour_after_warmup": slope_per_hour(rss), "max_deviation": spread},
    "fds": {"start": idle_before["fds"], "end": idle_after["fds"],
            "pooled_provider_sockets_at_end": idle_after["provider_sockets"]},
    "threads": {"start": idle_before["threads"], "end": idle_after["threads"]},
    "active_at_end": idle_after["active"],
    "v2v_p95_ms": {"window_sessions": window, "first_sessions": first, "last_sessions": last,
                   "drift": drift, "struck_turns": len(struck_v2v),
                   "struck_turns_p95": p95(struck_v2v)},
    "faults": stand_ins["faults"],
    "finals": {k: ledger.get(k) for k in ("finals", "answered_once", "lost", "answered_twice",
                                          "guesses_thrown_away", "follow_ups", "twice_examples")},
    "tool_results": {"calls": ledger["tool_calls"], "finished": ledger["tools_finished"],
                     "delivered": ledger["tools_delivered"], "dropped": ledger["tools_dropped"]},
}
goals = {
    "rss_flat": spread <= 0.05,
    "no_leaked_fds": idle_after["fds"] - idle_after["provider_sockets"]
                     <= idle_before["fds"] - idle_before["provider_sockets"],
    "no_leaked_threads": idle_after["threads"] <= idle_before["threads"],
    "no_live_sessions_left": idle_after["active"] == 0,
    "no_failed_session": summary["sessions"]["failed"] == 0,
    "p95_drift_within_10pct": drift is not None and abs(drift) <= 0.10,
    "no_turn_lost": ledger["lost"] == 0,
    "no_turn_answered_twice": ledger["answered_twice"] == 0,
    "a_tool_call_every_session": ledger["tool_calls"] >= summary["sessions"]["completed"],
    "no_tool_result_dropped": ledger["tools_dropped"] == 0 and ledger["tools_finished"] > 0,
}
result["goals"] = goals
result["pass"] = all(goals.values())
print(json.dumps(result))
sys.exit(0 if result["pass"] else 1)
PY
