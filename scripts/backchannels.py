#!/usr/bin/env python3
"""Backchannels and real interruptions over the bot's speech, measured from the audio.

The user asks for a long answer; while the bot speaks, they say either a short reaction that
must not stop it ("yeah", "mm hmm", "I see": 30 of them) or a real interruption that must
("wait", "stop", "no, I meant Paris", a new question: 30 of them). Each is placed at a seeded
random moment 2.0-4.0 s after the question ends (the bot answers within about a second), in one
of four espeak-ng voices voxide was never tuned on, over a quiet room's floor (brown noise at
-55 dBFS, `--digital-silence` for none; `--babble-snr DB` for a café instead: scripts/noise.py's
four espeak-ng talkers under the speech and between, DB under the speech's active level). One
WAV per voice goes through `voxide run` with the embedded defaults at real-time pace, once per
configuration of the barge-in flags.

For each utterance that starts while the bot is audible:
- a backchannel passes when the session reports no interruption within 3 s and the bot's audio
  has no gap of 250 ms or more that starts within 2 s of it while the session holds the bot
  (`bot_paused`) and after which the bot speaks again (the pauses between the bot's own
  sentences, often 250-500 ms, are no gap; nor is the answer's own end);
- an interruption passes when the session reports one within 3 s; its stop time runs from the
  utterance's first voiced 20 ms to the bot's last audible 20 ms before the silence it is in
  when the session interrupts it (a hold the bot played on from is no stop).

    scripts/backchannels.py [--bin target/release/voxide] [--out target/backchannels]
                            [--config NAME=FLAGS ...]
                            [--noise-dbfs -55 | --digital-silence | --babble-snr 10]
                            [--rejudge] [--tuning] [--stand-ins WORDS] [--pipecat PYTHON]

Prints one JSON line per configuration (default: voxide's defaults, `--backchannels true
--pause-at-onset false`, and pipecat-style `--interrupt-min-words 2 --resume-after-secs 1`).
`--config NAME=FLAGS` runs others. Tune nothing on this set: it is held out. `--tuning` builds
the set to tune on instead: half the phrases, drawn by another seed, in two other voices.
`--second` builds a second held-out set: every phrase, drawn by a third seed, in four voices no
other set uses. It judges a rule the first held-out set's transcripts suggested (a rule chosen
while looking at a set's transcripts was tuned on that set).

`--stand-ins WORDS` gives the bot the provider stand-ins' LLM and TTS (`--llm openai --tts
cartesia`; `stand_in_providers --long-answers WORDS`: every answer a story of WORDS words, a
quarter second of tone a word) behind the embedded Whisper, so that `--pipecat PYTHON` (a
Python with `pipecat-ai[whisper]` 1.14) can run pipecat's own pipeline on the same set with the
same services: faster-whisper on the same Whisper weights, the same stand-ins
(bench/pipecat-compare/backchannels.py), with its default interruptions and with
`MinWordsUserTurnStartStrategy(min_words=2)`. `--pipecat` implies `--stand-ins 30`.
"""

import argparse
import array
import json
import os
import random
import subprocess
import sys
import time
import wave

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from noise import babble, rms_dbfs  # noqa: E402
from turn_wait import (RATE, WINDOW, noise_arguments, noise_dbfs, quantile,  # noqa: E402
                       room_name, speech, under, voiced_windows, write_wav)

VOICES = ["en-us+m4", "en-gb-x-rp+f3", "en-us+f4", "en-gb+m5"]
# The set to tune on: voices no held-out set uses.
TUNING_VOICES = ["en-us+m3", "en-gb-x-rp+f1"]
# The second held-out set: voices no other set, script or test uses.
SECOND_VOICES = ["en-gb-scotland+m1", "en-us-nyc+f1", "en-029+f4", "en-gb-x-gbcwmd+m2"]
QUESTIONS = [
    "Tell me a long story about a dragon who learns to bake bread.",
    "Describe the city of Rome in as much detail as you can.",
    "Explain how a steam engine works, step by step.",
    "Tell me everything you know about the history of tea.",
    "Describe a long walk through a forest in autumn.",
]
BACKCHANNELS = [
    "yeah", "mm hmm", "okay", "I see", "right", "uh huh", "sure", "got it", "oh", "wow",
    "really", "nice", "cool", "yes", "yep", "ah", "hmm", "alright", "exactly", "true",
    "of course", "oh okay", "I know", "makes sense", "oh wow", "no way", "ha ha", "interesting",
    "yeah yeah", "mm",
]
INTERRUPTIONS = [
    "Wait, stop.", "Hold on, what time is it?", "Stop.", "Wait a second.", "No, I meant Paris.",
    "Sorry, can you repeat that?", "Actually, tell me about cats instead.", "Stop talking please.",
    "Hang on a moment.", "What is seven times eight?", "No no no, that is wrong.",
    "Can I ask something else?", "Excuse me, one question.", "Please stop there.",
    "Hold on.", "Wait, what did you just say?", "That is enough, thank you.",
    "Set a timer for five minutes.", "Let me stop you there.", "Sorry to interrupt.",
    "Okay, but what about the weather?", "No, I asked about London.", "Hey, listen.",
    "One moment please.", "Can you speak more slowly?", "Never mind, forget it.",
    "Wait, go back.", "Is that really true?", "Stop, I need to go.", "Pause for a second.",
]
# Seconds after a question ends at which its utterance starts.
AT = (2.0, 4.0)
# Seconds from a question's end to the next question: room for an answer of MAX_TOKENS, and
# for the answer to an interruption after it.
ITEM_S = 15.0
MAX_TOKENS = "30"
# The bot's answers: long enough to be talked over.
BOT = """name = "storyteller"
instructions = "You are a storyteller. Answer every message with a long, detailed story of at least six sentences."
"""
DEFAULT_CONFIGS = {
    "voxide_default": [],
    "backchannels": ["--backchannels", "true", "--pause-at-onset", "false"],
    "min_words_2_resume_1s": ["--interrupt-min-words", "2", "--resume-after-secs", "1"],
}
# pipecat 1.14 on the same set: its defaults, and its minimum-words start strategy.
PIPECAT_CONFIGS = {
    "pipecat_default": [],
    "pipecat_min_words_2": ["--min-words", "2"],
}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECAT_SCRIPT = os.path.join(ROOT, "bench", "pipecat-compare", "backchannels.py")
WHISPER = os.path.join(ROOT, "assets", "models", "whisper-tiny.en")
STAND_IN_PORT = 9470


def build(voice, items, path, room, rng):
    """One WAV of `items` ((kind, text) pairs) in `voice`; each with its times in seconds."""
    samples = array.array("h", [0] * RATE)
    out = []
    for i, (kind, text) in enumerate(items):
        question = QUESTIONS[i % len(QUESTIONS)]
        samples.extend(speech(voice, question))
        end = len(samples) / RATE
        at = rng.uniform(*AT)
        samples.extend(array.array("h", [0] * int(at * RATE)))
        start = len(samples) / RATE
        samples.extend(speech(voice, text))
        out.append({"kind": kind, "text": text, "voice": voice, "question_end": end,
                    "start": start, "end": len(samples) / RATE})
        samples.extend(array.array("h", [0] * max(0, int((end + ITEM_S) * RATE) - len(samples))))
    write_wav(path, room(samples))
    return out


def room_of(args):
    """What the room adds to a WAV's samples: the floor, or the café's talk."""
    if args.babble_snr is None:
        return lambda samples: under(samples, noise_dbfs(args))
    talk = read_samples(babble(os.path.join(args.out, "babble.wav")))

    def cafe(samples):
        voiced = array.array("h")
        for k in voiced_windows(samples):
            voiced.extend(samples[k * WINDOW:(k + 1) * WINDOW])
        gain = 10 ** ((rms_dbfs(voiced) - args.babble_snr - rms_dbfs(talk)) / 20)
        return array.array("h", (max(-32768, min(32767, s + round(talk[i % len(talk)] * gain)))
                                 for i, s in enumerate(samples)))
    return cafe


def room_title(args):
    if args.babble_snr is None:
        return room_name(noise_dbfs(args))
    return f"café babble at SNR {args.babble_snr:g} dB"


def read_samples(path):
    with wave.open(path) as w:
        return array.array("h", w.readframes(w.getnframes()))


def voiced(path):
    """Per 20 ms of the bot's audio, whether it is audible."""
    with wave.open(path) as w:
        rate = w.getframerate()
        bot = array.array("h", w.readframes(w.getnframes()))
    window = rate // 50
    return [(sum(x * x for x in bot[i:i + window]) / window) ** 0.5 > 300
            for i in range(0, len(bot) - window + 1, window)]


def judge(item, audible, events, item_end):
    """The item's verdict, or None when the bot was not audible as it began."""
    at = int(item["start"] * 50)
    if not any(audible[max(0, at - 5):at + 1]):
        return None
    def when(kind, secs):
        return next((e["t_ms"] / 1000 for e in events if e["type"] == kind
                     and item["start"] - 0.1 <= e["t_ms"] / 1000 < item["start"] + secs), None)
    def within(kind, secs):
        return when(kind, secs) is not None
    interruption = when("interruption", 3.0)
    interrupted = interruption is not None
    held = within("bot_paused", 2.0)
    # The first run of 250 ms or more of silence from the utterance on.
    gap_start, run, resumed = None, 0, False
    for i in range(at, min(len(audible), int(item_end * 50))):
        if not audible[i]:
            run += 1
            if run == 13 and gap_start is None:
                gap_start = i - 12
        else:
            if gap_start is not None:
                resumed = True
                break
            run = 0
    row = dict(item, interrupted=interrupted)
    if item["kind"] == "backchannel":
        gap = (held and gap_start is not None and gap_start / 50 < item["start"] + 2.0
               and resumed)
        row["pass"] = not interrupted and not gap
        row["gap"] = gap
    else:
        row["pass"] = interrupted
        if interrupted:
            row["stop_ms"] = round((stopped_at(audible, interruption) / 50 - item["start"]) * 1000)
    return row


def stopped_at(audible, interruption):
    """The 20 ms piece after the bot's last audible one before the silence it is in when the
    session interrupts it: if the session held it first, where the hold began."""
    i = min(int(interruption * 50), len(audible))
    if i < len(audible) and audible[i]:
        # Still playing out: the first silence of 250 ms from here.
        while i < len(audible) and any(audible[i:i + 13]):
            i += 1
        return i
    while i > 0 and not audible[i - 1]:
        i -= 1
    return i


def command(args, name, flags, wav, out_wav, events_path):
    """The command that plays `wav` to configuration `name` and records what it answers."""
    if name in PIPECAT_CONFIGS:
        return [args.pipecat, PIPECAT_SCRIPT, "--stand-ins", f"127.0.0.1:{STAND_IN_PORT}",
                "--whisper", ct2_whisper(args.out), *flags, wav, out_wav, events_path]
    providers = ["--llm", "openai", "--tts", "cartesia"] if args.stand_ins else []
    return [args.bin, "run", "--input", wav, "--output", out_wav, "--events", events_path,
            "--bot", os.path.join(args.out, "bot.toml"), "--max-tail-secs", "5",
            "--max-tokens", MAX_TOKENS, *providers, *flags]


def ct2_whisper(out):
    """The embedded Whisper as faster-whisper loads it: the same files, and the vocabulary
    CTranslate2 wants beside them (the tokenizer's tokens, then Whisper's 1,501 timestamps)."""
    folder = os.path.join(out, "whisper-ct2")
    os.makedirs(folder, exist_ok=True)
    for name in ("model.bin", "config.json", "tokenizer.json"):
        link = os.path.join(folder, name)
        if not os.path.exists(link):
            os.symlink(os.path.join(WHISPER, name), link)
    with open(os.path.join(WHISPER, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    ids = dict(tokenizer["model"]["vocab"])
    ids.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])})
    tokens = [""] * (max(ids.values()) + 1)
    for token, i in ids.items():
        tokens[i] = token
    tokens += [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    with open(os.path.join(folder, "vocabulary.json"), "w") as f:
        json.dump(tokens, f)
    return folder


def run(args, name, flags, voice, wav, items):
    label = f"{name}-{voice.replace('+', '_')}"
    events_path = os.path.join(args.out, f"{label}.events.jsonl")
    out_wav = os.path.join(args.out, f"{label}.out.wav")
    if not args.rejudge:
        env = dict(os.environ)
        if args.stand_ins:
            env.update(OPENAI_API_KEY="local", CARTESIA_API_KEY="local",
                       OPENAI_BASE_URL=f"http://127.0.0.1:{STAND_IN_PORT}/v1",
                       CARTESIA_URL=f"ws://127.0.0.1:{STAND_IN_PORT}")
        subprocess.run(command(args, name, flags, wav, out_wav, events_path), env=env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = [json.loads(line) for line in open(events_path) if line.strip()]
    audible = voiced(out_wav)
    rows = []
    for i, item in enumerate(items):
        item_end = items[i + 1]["question_end"] - 1.0 if i + 1 < len(items) else len(audible) / 50
        row = judge(item, audible, events, item_end)
        if row is not None:
            rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="target/release/voxide")
    parser.add_argument("--out", default="target/backchannels")
    parser.add_argument("--config", action="append", default=[],
                        help="NAME=FLAGS: a configuration of `voxide run` flags to measure")
    parser.add_argument("--rejudge", action="store_true",
                        help="judge the outputs an earlier run left in --out again, without running")
    parser.add_argument("--tuning", action="store_true",
                        help="the set to tune on (two other voices, another seed), not the held-out one")
    parser.add_argument("--second", action="store_true",
                        help="the second held-out set (four more voices, a third seed)")
    parser.add_argument("--stand-ins", type=int, metavar="WORDS",
                        help="the provider stand-ins' LLM and TTS, answering WORDS words")
    parser.add_argument("--pipecat", metavar="PYTHON",
                        help="also run pipecat 1.14's pipeline on the set, with this Python")
    noise_arguments(parser)
    parser.add_argument("--babble-snr", type=float, metavar="DB",
                        help="a café instead of the floor: four talkers DB under the speech")
    args = parser.parse_args()
    if args.pipecat and not args.stand_ins:
        args.stand_ins = 30
    if args.pipecat and subprocess.run([args.pipecat, "-c", "import faster_whisper"],
                                       capture_output=True).returncode != 0:
        sys.exit(f"{args.pipecat} has no faster-whisper: "
                 f"{args.pipecat} -m pip install 'pipecat-ai[whisper]==1.14.0'")
    voices = TUNING_VOICES if args.tuning else SECOND_VOICES if args.second else VOICES
    configs = dict(DEFAULT_CONFIGS)
    if args.config:
        configs = {c.split("=", 1)[0]: c.split("=", 1)[1].split() for c in args.config}
    if args.pipecat:
        configs.update(PIPECAT_CONFIGS)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bot.toml"), "w") as f:
        f.write(BOT)
    rng = random.Random(51 if args.tuning else 52 if args.second else 50)
    items = [("backchannel", t) for t in BACKCHANNELS] + [("interruption", t) for t in INTERRUPTIONS]
    rng.shuffle(items)
    if args.tuning:
        items = items[::2]
    sets = {}
    for v, voice in enumerate(voices):
        wav = os.path.join(args.out, f"{voice.replace('+', '_')}.wav")
        sets[voice] = (wav, build(voice, items[v::len(voices)], wav, room_of(args), rng))
    stand_ins = None
    if args.stand_ins and not args.rejudge:
        stand_ins = subprocess.Popen(
            [os.path.join(ROOT, "target", "release", "examples", "stand_in_providers"),
             "--port", str(STAND_IN_PORT), "--long-answers", str(args.stand_ins)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    try:
        for name, flags in configs.items():
            report(args, name, flags, voices, sets)
    finally:
        if stand_ins:
            stand_ins.terminate()


def report(args, name, flags, voices, sets):
    """Runs configuration `name` on every voice's WAV and prints its line."""
    rows = []
    for voice, (wav, voice_items) in sets.items():
        rows += run(args, name, flags, voice, wav, voice_items)
    with open(os.path.join(args.out, f"{name}.rows.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    backs = [r for r in rows if r["kind"] == "backchannel"]
    stops = [r for r in rows if r["kind"] == "interruption"]
    stop_ms = [r["stop_ms"] for r in stops if "stop_ms" in r]
    print(json.dumps({
        "config": name, "flags": " ".join(flags), "room": room_title(args),
        "voices": voices,
        "backchannels": {"measured": len(backs), "talked_on": sum(r["pass"] for r in backs),
                         "interrupted": sum(r["interrupted"] for r in backs),
                         "gap_250ms": sum(r["gap"] for r in backs)},
        "interruptions": {"measured": len(stops), "stopped": sum(r["pass"] for r in stops),
                          "stop_ms": {"p50": quantile(stop_ms, 0.5),
                                      "p95": quantile(stop_ms, 0.95),
                                      "max": quantile(stop_ms, 1.0)}},
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
