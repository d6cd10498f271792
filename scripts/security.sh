#!/usr/bin/env bash
# The three holes an attacker found first, probed against a live `voxide serve` on loopback:
# 1. the cluster forwarder asked (with `--peer-url`, the Kubernetes setup) for a `pc_id` that
#    names an address: no request may reach a listener on loopback;
# 2. `X-Voxide-Forwarded-By` forged by a client, with `--sessions-per-minute-per-ip 2`: six
#    `/start`s must not all be answered 200;
# 3. 300 `/start` calls of 256 KB each: the server's RSS must grow by less than 40 MB.
# Prints one JSON line with what each probe saw; exits 1 if a probe finds a hole.
#
#   scripts/security.sh [--release]
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=debug
[ "${1:-}" = "--release" ] && PROFILE=release
echo "security: building voxide ($PROFILE)"
build_flags=(--locked --bin voxide)
[ "$PROFILE" = release ] && build_flags+=(--release)
# scripts/test.sh builds every target once, with the tests' features, and says so: building
# again here would build the tree a second time with other features.
[ "${VOXIDE_BUILT:-}" = "$PROFILE" ] || cargo build -q "${build_flags[@]}"
BIN="target/$PROFILE/voxide"

OUT=target/security
rm -rf "$OUT"
mkdir -p "$OUT"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# The stand-in providers' keys: nothing here reaches them, and no model but the VAD's loads.
export DEEPGRAM_API_KEY=local CARTESIA_API_KEY=local OPENAI_API_KEY=local
export DEEPGRAM_URL=ws://127.0.0.1:9 CARTESIA_URL=ws://127.0.0.1:9 OPENAI_BASE_URL=http://127.0.0.1:9/v1
serve() {
  local port="$1"
  shift
  "$BIN" serve --port "$port" --stt deepgram --llm openai --tts cartesia "$@" \
    >"$OUT/server_$port.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" = 200 ] && return 0
    sleep 0.2
  done
  echo "security: the server on $port never became ready" >&2
  exit 1
}

# A loopback listener that counts every connection it gets.
python3 - "$OUT/tripwire.port" "$OUT/tripwire.hits" <<'PY' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
hits = 0
while True:
    conn, _ = s.accept()
    hits += 1
    open(sys.argv[2], "w").write(str(hits))
    conn.close()
PY
pids+=($!)
for _ in $(seq 1 50); do [ -s "$OUT/tripwire.port" ] && break; sleep 0.1; done
TRIP=$(cat "$OUT/tripwire.port")

echo "security: probes 1 and 2 (a node with --peer-url and 2 sessions a minute per address)"
serve 7991 --node-id n1 --peer-url 'http://{node}.voxide-nodes:7860' --sessions-per-minute-per-ip 2
forwarder=()
for pc_id in "localhost:$TRIP/leak?x=.y" "127.0.0.1:$TRIP/leak?x=.y" "[::1]:$TRIP/leak?x=.y"; do
  forwarder+=("$(curl -s -o /dev/null -w '%{http_code}' -X PATCH http://127.0.0.1:7991/api/offer \
    -H 'content-type: application/json' \
    -d "{\"pc_id\":\"$pc_id\",\"candidates\":[]}")")
done
sleep 1
TRIP_HITS=$(cat "$OUT/tripwire.hits" 2>/dev/null || echo 0)
forged_ok=0
for _ in 1 2 3 4 5 6; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST http://127.0.0.1:7991/start \
    -H 'x-voxide-forwarded-by: n2' -H 'content-type: application/json' -d '{}')
  [ "$code" = 200 ] && forged_ok=$((forged_ok + 1))
done

echo "security: probe 3 (300 /start calls of 256 KB, no rate limit)"
serve 7992 --sessions-per-minute-per-ip 0
SERVER=${pids[-1]}
python3 -c "print('{\"body\":{\"notes\":\"' + 'x' * (256 * 1024 - 40) + '\"}}')" >"$OUT/big.json"
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$SERVER/status"; }
sleep 2
before=$(rss)
codes=$(for _ in $(seq 1 300); do
  curl -s -o /dev/null -w '%{http_code}\n' -X POST http://127.0.0.1:7992/start \
    -H 'content-type: application/json' --data-binary @"$OUT/big.json"
done | sort | uniq -c | awk '{printf "%s\"%s\": %s", (NR>1?", ":""), $2, $1}')
sleep 1
after=$(rss)

python3 - "$TRIP_HITS" "${forwarder[*]}" "$forged_ok" "$before" "$after" "$codes" <<'PY'
import json, sys
hits, forwarder, forged_ok, before, after, codes = sys.argv[1:]
growth_mb = (int(after) - int(before)) / 1024
result = {
    "forwarder": {"answers": forwarder.split(), "loopback_requests": int(hits)},
    "forged_forwarded_header": {"starts_answered_200_of_6": int(forged_ok), "limit": 2},
    "big_starts": {"answers": json.loads("{" + codes + "}"), "rss_growth_mb": round(growth_mb, 1)},
}
goals = {
    "no_request_reaches_loopback": int(hits) == 0,
    "forged_header_counted": int(forged_ok) <= 2,
    "rss_growth_under_40_mb": growth_mb < 40,
}
result["goals"] = goals
result["pass"] = all(goals.values())
print(json.dumps(result))
sys.exit(0 if result["pass"] else 1)
PY
