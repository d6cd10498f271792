#!/usr/bin/env python3
"""The held-out questions over WebRTC on a real network: `voxide serve` with the embedded
defaults, driven by `voxide loadtest --protocol webrtc`, once per network condition.

With `--protocol sip` one phone call asks every question in turn (PCMU over RTP, the caller's
packets impaired by the load tester; `sip-g722`: the same call in wideband G.722): SIP has no channel for the bot's transcripts, so the
WER is read from the server's recording of the call (`--record-dir`), every word the bot heard
against every word asked, in order.

The 45 held-out questions (scripts/held_out.py), dealt round-robin to its four espeak-ng voices,
one WAV each with its text beside it (`q.wav`, `q.txt`), so the load tester scores what the bot
transcribed (WER) as well as timing its answers from the audio (v2v). A quiet room's floor is
under the speech and in every gap unless told otherwise.

With `--bots voxide,pipecat` the two bots run side by side behind the same providers: the
stand-ins (`stand_in_providers --stt-whisper`, so Deepgram's finals are what the embedded
Whisper hears of the audio each bot's transport delivered), `voxide serve --stt deepgram --llm
openai --tts cartesia` and pipecat 1.14's standard bot (bench/pipecat-compare/bot.py, installed
by bench/pipecat-compare/run.sh into target/venv-pipecat): the same questions, the same
network, scored from each bot's RTVI transcripts.

Conditions (each a `voxide loadtest` flag set, `--condition NAME=FLAGS` to add or replace):
  clean       no impairment
  lossy       3 % random loss, 30 ms jitter
  bursty      10 % loss in bursts of 3 frames

    scripts/network.py [--bin target/release/voxide] [--out target/network] [--sessions 1]
                       [--condition NAME=FLAGS ...] [--conditions clean,lossy]
                       [--protocol webrtc|ws|sip|sip-g722|sip-opus] [--questions N]
                       [--bots voxide,pipecat]
                       [--noise-dbfs -55 | --digital-silence]

Prints one JSON line per condition (`heard`: the share of turns with at most a quarter of the
question's words wrong); each run's files stay under OUT/NAME/.
"""

import argparse
import csv
import glob
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from held_out import QUESTIONS, VOICES  # noqa: E402
from turn_wait import noise_arguments, noise_dbfs, speech, write_wav  # noqa: E402

CONDITIONS = {
    "clean": "",
    "lossy": "--loss 3 --jitter-ms 30",
    "bursty": "--loss 10 --burst-loss 3",
}


def build(out):
    """One WAV and its text per question, in the voices round-robin; the WAVs' paths."""
    os.makedirs(out, exist_ok=True)
    paths = []
    for i, (text, _, _) in enumerate(QUESTIONS):
        voice = VOICES[i % len(VOICES)]
        path = os.path.join(out, f"q{i:02d}.wav")
        if not os.path.exists(path):
            write_wav(path, speech(voice, text))
        with open(os.path.join(out, f"q{i:02d}.txt"), "w") as f:
            f.write(text + "\n")
        paths.append(path)
    return paths


def heard_share(out):
    """The share of turns whose transcript has at most a quarter of the question's words
    wrong: the turns whose question the bot heard."""
    with open(os.path.join(out, "turns.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["reference_words"] and r["word_errors"]]
    heard = sum(1 for r in rows if int(r["word_errors"]) * 4 <= int(r["reference_words"]))
    return round(heard / len(rows), 3) if rows else None


def words(text):
    """The words of `text`, lowercase, without punctuation: as voxide's `text::word_list`."""
    return [w for w in ("".join(c for c in word if c.isalnum()).lower()
                        for word in text.split()) if w]


def word_edits(a, b):
    """The fewest words replaced, added or removed that turn `a` into `b`."""
    row = list(range(len(b) + 1))
    for i, wa in enumerate(a):
        diagonal, row[0] = row[0], i + 1
        for j, wb in enumerate(b):
            replaced = diagonal + (wa != wb)
            diagonal = row[j + 1]
            row[j + 1] = min(replaced, row[j] + 1, row[j + 1] + 1)
    return row[len(b)]


def recorded_wer(records, wavs):
    """The WER of everything the recorded call's user said against the questions it asked."""
    reports = sorted(glob.glob(os.path.join(records, "*.json")))
    if len(reports) != 1:
        return None
    with open(reports[0]) as f:
        report = json.load(f)
    heard = [t for turn in report.get("turns", []) for t in turn.get("user_text", [])
             if not t.lower().startswith("dtmf")]
    asked = []
    for wav in wavs:
        with open(wav[:-len(".wav")] + ".txt") as f:
            asked += words(f.read())
    return round(word_edits(asked, words(" ".join(heard))) / len(asked) * 100, 1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary, port, log, flags=()):
    server = subprocess.Popen([binary, "serve", "--port", str(port), "--max-sessions", "8",
                               *flags], stdout=log, stderr=subprocess.STDOUT)
    return ready(server, f"http://127.0.0.1:{port}/readyz", log)


def ready(server, url, log):
    """`server` once `url` answers 200 (a server without /readyz: its page)."""
    for _ in range(600):
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        if server.poll() is not None:
            sys.exit(f"the server exited: see {log.name}")
        time.sleep(0.5)
    server.kill()
    sys.exit("the server did not become ready")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECAT_PYTHON = os.path.join(ROOT, "target", "venv-pipecat", "bin", "python")


def side_by_side(args, bots, conditions, wavs, room):
    """Each of `bots` behind the same hearing stand-ins, every condition in turn."""
    stand_in_port = free_port()
    providers = os.path.join(os.path.dirname(args.bin), "examples", "stand_in_providers")
    if not os.path.exists(providers):
        sys.exit(f"no {providers}: cargo build --release --example stand_in_providers")
    if "pipecat" in bots and not os.path.exists(PIPECAT_PYTHON):
        sys.exit("no pipecat: bench/pipecat-compare/run.sh installs it into target/venv-pipecat")
    at = f"127.0.0.1:{stand_in_port}"
    env = dict(os.environ, DEEPGRAM_API_KEY="local", DEEPGRAM_URL=f"ws://{at}",
               CARTESIA_API_KEY="local", CARTESIA_URL=f"ws://{at}", OPENAI_API_KEY="local",
               OPENAI_BASE_URL=f"http://{at}/v1", STAND_INS=at, RUST_LOG="warn")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "stand-ins.log"), "w") as log:
        stand_ins = subprocess.Popen([providers, "--port", str(stand_in_port), "--stt-whisper"],
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            ready(stand_ins, f"http://{at}/stand-in/stats", log)
            for bot in bots:
                port = free_port()
                with open(os.path.join(args.out, f"{bot}.log"), "w") as bot_log:
                    if bot == "voxide":
                        server = subprocess.Popen(
                            [args.bin, "serve", "--port", str(port), "--stt", "deepgram",
                             "--llm", "openai", "--tts", "cartesia"],
                            stdout=bot_log, stderr=subprocess.STDOUT, env=env)
                        ready(server, f"http://127.0.0.1:{port}/readyz", bot_log)
                    else:
                        server = subprocess.Popen(
                            [PIPECAT_PYTHON, "bot.py", "-t", "webrtc", "--host", "127.0.0.1",
                             "--port", str(port)],
                            cwd=os.path.join(ROOT, "bench", "pipecat-compare"),
                            stdout=bot_log, stderr=subprocess.STDOUT, env=env)
                        ready(server, f"http://127.0.0.1:{port}/", bot_log)
                    try:
                        for name, flags in conditions.items():
                            out = os.path.join(args.out, bot, name)
                            figures = run(args.bin, f"http://127.0.0.1:{port}", wavs, out,
                                          args.sessions, room + shlex.split(flags))
                            print(json.dumps({"bot": bot, "condition": name, **figures}),
                                  flush=True)
                    finally:
                        server.terminate()
                        server.wait()
        finally:
            stand_ins.terminate()
            stand_ins.wait()


def run(binary, target, wavs, out, sessions, flags, protocol="webrtc"):
    """One `voxide loadtest` of the questions with `flags`; its figures."""
    turns = -(-len(wavs) // sessions)
    command = [binary, "loadtest", "--target", target,
               "--protocol", protocol, "--sessions", str(sessions),
               "--concurrency", str(sessions), "--turns", str(turns),
               "--think-ms", "1000", "--ramp", "0", "--seed", "1",
               "--max-pacing-lag-ms", "1000", "--out", out]
    command += [arg for wav in wavs for arg in ("--audio", wav)]
    command += flags
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    v2v = summary["metrics"].get("v2v") or {}
    return {
        "network": summary["network"], "room": summary["room"],
        "turns": summary["turns"], "answered": v2v.get("n"),
        "failed_sessions": summary["sessions"]["failed"],
        "errors": summary["errors"],
        "wer": summary["wer"] and round(summary["wer"] * 100, 1),
        "heard": heard_share(out),
        "v2v_p50": v2v.get("p50") and round(v2v["p50"]),
        "v2v_p95": v2v.get("p95") and round(v2v["p95"]),
        "to_bot": summary.get("network_seen", {}).get("to_bot"),
        "to_caller": summary.get("network_seen", {}).get("to_caller"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default="target/release/voxide")
    parser.add_argument("--out", default="target/network")
    parser.add_argument("--sessions", type=int, default=1,
                        help="callers at once; the questions are shared out among them")
    parser.add_argument("--condition", action="append", default=[],
                        help="NAME=FLAGS: a network condition as loadtest flags")
    parser.add_argument("--conditions", help="the ones to run, comma-separated (default: all)")
    parser.add_argument("--protocol", default="webrtc",
                        help="webrtc, ws, sip, sip-g722 or sip-opus")
    parser.add_argument("--questions", type=int, help="only the first N questions")
    parser.add_argument("--bots", help="voxide,pipecat: side by side behind the stand-ins")
    noise_arguments(parser)
    args = parser.parse_args()
    conditions = dict(CONDITIONS)
    for item in args.condition:
        name, _, flags = item.partition("=")
        conditions[name] = flags
    if args.conditions:
        conditions = {name: conditions[name] for name in args.conditions.split(",")}
    dbfs = noise_dbfs(args)
    room = [] if dbfs is None else ["--noise-dbfs", str(dbfs)]
    wavs = build(os.path.join(args.out, "questions"))[:args.questions]
    if args.bots:
        side_by_side(args, args.bots.split(","), conditions, wavs, room)
        return
    if args.protocol in ("sip", "sip-g722", "sip-opus"):
        # One call a condition, its own recording.
        for name, flags in conditions.items():
            out = os.path.join(args.out, name)
            records = os.path.join(out, "records")
            os.makedirs(records, exist_ok=True)
            port, sip = free_port(), free_port()
            with open(os.path.join(out, "server.log"), "w") as log:
                server = serve(args.bin, port, log, ["--sip-listen", f"127.0.0.1:{sip}",
                                                     "--record-dir", records])
                try:
                    figures = run(args.bin, f"sip:agent@127.0.0.1:{sip}", wavs, out, 1,
                                  room + shlex.split(flags), args.protocol)
                    # The report is written as the call ends.
                    for _ in range(100):
                        if glob.glob(os.path.join(records, "*.json")):
                            break
                        time.sleep(0.1)
                finally:
                    server.terminate()
                    server.wait()
            figures["wer"] = recorded_wer(records, wavs)
            print(json.dumps({"condition": name, **figures}), flush=True)
        return
    port = free_port()
    with open(os.path.join(args.out, "server.log"), "w") as log:
        server = serve(args.bin, port, log)
        try:
            for name, flags in conditions.items():
                out = os.path.join(args.out, name)
                figures = run(args.bin, f"http://127.0.0.1:{port}", wavs, out, args.sessions,
                              room + shlex.split(flags), args.protocol)
                print(json.dumps({"condition": name, **figures}), flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
