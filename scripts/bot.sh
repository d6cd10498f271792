#!/usr/bin/env bash
# Sets up the machine and runs the bot on the embedded defaults.
#
# The voice stack (VAD, STT, LLM, TTS) and the transports are not built yet: until they are,
# this runs the runtime demo, a session that shows frames flowing and its event stream.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo run --release --example session_demo "$@"
