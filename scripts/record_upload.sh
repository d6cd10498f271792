#!/usr/bin/env bash
# Recordings to S3-compatible storage, end to end: `voxide serve --record-url s3://…` against
# moto's S3 server (a local S3-compatible store, pinned below): one session's recording and
# transcript arrive in the bucket, signed as S3 wants; then the same with a bucket that cannot
# be reached: the call is answered all the same, the upload is counted as failed and the files
# stay in the folder.
#
#   scripts/record_upload.sh [--release] [--install-only]
#
# --install-only installs moto and stops (scripts/test.sh installs it while it builds).
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=debug
INSTALL_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --release) PROFILE=release ;;
        --install-only) INSTALL_ONLY=1 ;;
        *) echo "usage: scripts/record_upload.sh [--release] [--install-only]" >&2; exit 2 ;;
    esac
done
VENV=target/venv-moto
MOTO_PORT=${MOTO_PORT:-9050}
PORT=${PORT:-7975}
WORK=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
log() { printf '[record-upload] %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/moto_server" ]; then
    log "installing moto's S3 server into $VENV (a minute)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --progress-bar on --no-compile 'moto[server]==5.2.5' 'boto3==1.44.8'
fi
[ "$INSTALL_ONLY" = 1 ] && exit 0
# scripts/test.sh builds every target once and says so (see scripts/security.sh).
if [ "${VOXIDE_BUILT:-}" = "$PROFILE" ]; then
    :
elif [ "$PROFILE" = release ]; then
    cargo build --release --locked --bin voxide
else
    cargo build --locked --bin voxide
fi
VOXIDE=target/$PROFILE/voxide

"$VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" >"$WORK/moto.log" 2>&1 &
pids+=($!)
export AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local-secret AWS_REGION=us-east-1
s3() { AWS_ENDPOINT_URL=http://127.0.0.1:$MOTO_PORT "$VENV/bin/python" -c "$1"; }
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$MOTO_PORT/" && break; sleep 0.2; done
s3 'import boto3; boto3.client("s3").create_bucket(Bucket="voxide-test")'

serve() {
    RUST_LOG=warn "$VOXIDE" serve --port "$PORT" --voice espeak --sessions-per-minute-per-ip 0 "$@" \
        >>"$WORK/serve.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && return; sleep 0.2; done
    log "the server never became ready"; cat "$WORK/serve.log"; exit 1
}
call() {
    "$VOXIDE" loadtest --target "http://127.0.0.1:$PORT" --protocol ws \
        --audio assets/test/hello_16k.wav --sessions 1 --out "$WORK/call-$1" >/dev/null 2>"$WORK/call-$1.log"
    # The session has ended (and its files are done) once the node says it holds none.
    for _ in $(seq 150); do
        curl -s "http://127.0.0.1:$PORT/status" | grep -q '"sessions":0' && break
        sleep 0.2
    done
}
uploads() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v o="$1" '$1 == "voxide_recording_uploads_total{outcome=\"" o "\"}" {print $2}'; }
wait_uploads() {
    for _ in $(seq 100); do [ "$(uploads "$1")" = "$2" ] && return 0; sleep 0.2; done
    log "expected $2 uploads $1, saw $(uploads "$1")"; cat "$WORK/serve.log"; return 1
}

log "a recording into the bucket (no folder: the local copy goes once uploaded)"
AWS_ENDPOINT_URL=http://127.0.0.1:$MOTO_PORT serve --record-url s3://voxide-test/calls
call 1
wait_uploads uploaded 1
stem=$(s3 '
import boto3, json
s3 = boto3.client("s3")
keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="voxide-test", Prefix="calls/")["Contents"])
assert len(keys) == 2 and keys[0].endswith(".json") and keys[1].endswith(".wav"), keys
journal = json.loads(s3.get_object(Bucket="voxide-test", Key=keys[0])["Body"].read())
assert journal["audio"] == keys[1].split("/")[-1], journal["audio"]
assert any("weather" in " ".join(t["user_text"]) for t in journal["turns"]), journal["turns"]
wav = s3.get_object(Bucket="voxide-test", Key=keys[1])["Body"].read()
assert wav[:4] == b"RIFF" and len(wav) > 100_000, len(wav)
print("[record-upload] in the bucket:", keys, len(wav), "bytes of audio", file=__import__("sys").stderr)
print(keys[1].split("/")[-1][:-4])
')
staged=${TMPDIR:-/tmp}/voxide-recordings
if [ -e "$staged/$stem.wav" ] || [ -e "$staged/$stem.json" ]; then
    log "the uploaded files stayed in $staged"; exit 1
fi
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

log "a bucket that cannot be reached: the call goes on, the files stay"
mkdir -p "$WORK/kept"
AWS_ENDPOINT_URL=http://127.0.0.1:9 serve --record-dir "$WORK/kept" --record-url s3://voxide-test/calls
call 2
python3 - "$WORK/call-2/summary.json" <<'PY' || { log "the call was not answered"; cat "$WORK/serve.log"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
assert d["error_rate"] == 0 and d["metrics"]["v2v"]["n"] >= 1, d
PY
wait_uploads failed 1
[ "$(ls "$WORK/kept" | grep -c '\.wav$')" = 1 ] && [ "$(ls "$WORK/kept" | grep -c '\.json$')" = 1 ] \
    || { log "the files did not stay"; ls -la "$WORK/kept"; exit 1; }
log "ok"
