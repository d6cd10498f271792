#!/usr/bin/env bash
# Sets up the machine and runs the bot on the embedded defaults: `voxide serve` on
# http://127.0.0.1:7860/ (open it and talk). Extra arguments go to `voxide serve`, e.g.
# `scripts/bot.sh --port 8080 --voice espeak`. For a recorded question instead:
# `target/release/voxide run --input assets/test/hello_16k.wav --output answer.wav`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
echo "bot: building voxide (release)"
cargo build --release --locked
exec target/release/voxide serve "$@"
