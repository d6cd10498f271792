#!/usr/bin/env bash
# pipecat's own release scenarios (scripts/release-evals/scenarios in a checkout of pipecat's
# repository; read there, never copied into voxide) against voxide's bots, with pipecat's eval
# harness, and a table: scenario, passed / failed / skipped, and what a skipped one needs.
#
#   scripts/pipecat_evals.sh PIPECAT_CHECKOUT [--judge-url URL --judge-model M | --no-judge]
#                            [--downloads] [--only NAME,...]
#
# JUDGE_URL (an OpenAI-compatible endpoint) and JUDGE_MODEL may come from the environment.
# See scripts/pipecat_evals.py for what each flag does.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: scripts/pipecat_evals.sh PIPECAT_CHECKOUT [--judge-url URL | --no-judge] [--downloads] [--only NAME,...]" >&2
  exit 2
fi
scripts/evals.sh --release --setup-only
exec target/venv-evals/bin/python scripts/pipecat_evals.py "$@" --voxide target/release/voxide
