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

# The two recorded questions the latency benchmarks ask, in $1/question1.wav and question2.wav
# (espeak-ng, 16 kHz mono): both are ones Smart Turn v3 rates finished, so a bot answers at its
# first pause and the figures measure the bots rather than the turn model's fallback.
make_questions() {
    local out=$1 i
    local text=("" "What time is it?" "What is the weather like in Paris today?")
    need_speech_tools
    for i in 1 2; do
        espeak-ng -v en-gb -s 165 -w "$out/raw$i.wav" "${text[$i]}"
        sox "$out/raw$i.wav" -r 16000 -c 1 -b 16 "$out/question$i.wav"
        rm "$out/raw$i.wav"
    done
}
