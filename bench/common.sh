# What the benchmark scripts share, sourced after each sets ROOT and BENCH (its log prefix):
# a log line, the background processes killed on exit (add each pid to `pids`), the release
# build of voxide and the provider stand-ins, and the check for the speech tools.

log() { printf '[%s] %s\n' "$BENCH" "$*" >&2; }
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

build_release() {
    log "building voxide and the stand-ins (release)"
    (cd "$ROOT" && cargo build --release --locked --bin voxide --example stand_in_providers)
}

need_speech_tools() {
    command -v espeak-ng >/dev/null && command -v sox >/dev/null || {
        log "needs espeak-ng and sox: apt-get install -y espeak-ng sox"
        exit 2
    }
}
