#!/usr/bin/env python3
"""Turn wait measured from the audio, on voices voxide was never tuned on.

Each espeak-ng voice below speaks a held-out set: whole questions, and sentences with a 300-700 ms
pause in the middle. One WAV per voice goes through `voxide run` at real-time pace (Whisper,
Silero, Smart Turn: the embedded listening side; the answers come from the providers' stand-ins,
so the model's load is the listening side's alone). For each question the turn wait is the time
from the last voiced 20 ms of the question in the input WAV to the bot's `user_stopped_speaking`,
and the voice-to-voice time runs from there to the first voiced 20 ms of the bot's answer in the
output WAV; a paused sentence is cut when a turn ends inside its pause. Both configurations run on the same
WAVs: Smart Turn alone (`--turn-words false`) and Smart Turn weighed with the words.

    scripts/turn_wait.py [--bin target/release/voxide] [--out target/turn-wait] [--parallel 2]
                         [--pipecat target/venv-pipecat/bin/python]
                         [--noise-dbfs -55 | --digital-silence]
    scripts/turn_wait.py --wavs DIR

`--wavs DIR` only writes the set, one clean WAV per question or paused sentence with its text
beside it (`t00.wav`, `t00.txt`, ...): the set `voxide bench turns --transcribe` tunes a room's
turn ends on, keeping the 45 held-out questions (`scripts/noise.py`) for checking.

The WAVs carry a quiet room's floor (brown noise at -55 dBFS) under the speech and between the
questions unless told otherwise: a microphone never sends digital zero.

With --pipecat, pipecat 1.14's default turn strategy (Silero and Smart Turn v3 in its user
aggregator, bench/pipecat-compare/turn_wait.py) ends the turns of the same WAVs too, judged the
same way. Prints one JSON line with every configuration. Needs espeak-ng, sox and the models.
"""

import argparse
import array
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import wave
from concurrent.futures import ThreadPoolExecutor

VOICES = ["en-us+f3", "en-gb-scotland", "en-029+m2", "en-gb-x-rp+f4"]
QUESTIONS = [
    "What is the capital city of Italy?",
    "What is the square root of eighty one?",
    "How far away is the moon?",
    "Can you tell me what day of the week it is?",
    "What is seventeen times twenty three?",
    "Set a timer for ten minutes.",
    "Why is the sky blue?",
    "Who wrote the play Hamlet?",
    "What should I cook for dinner tonight?",
    "How many legs does a spider have?",
    "Remind me to call my sister in an hour.",
    "What time is it right now?",
]
# (first part, pause in ms, second part)
PAUSED = [
    ("I would like to book a table for", 500, "two people tonight."),
    ("Can you tell me the weather in", 400, "Paris tomorrow?"),
    ("My favourite colour is", 600, "dark green."),
    ("Please add three hundred and", 350, "fifty eight to twelve."),
    ("What I really want to know is", 700, "how tall the tower is."),
]
RATE = 16_000
GAP_S = 4.5
WINDOW = RATE // 50  # 20 ms


def speech(voice, text):
    """`text` in `voice`, 16 kHz mono samples, leading and trailing silence trimmed."""
    with tempfile.TemporaryDirectory() as tmp:
        raw, out = os.path.join(tmp, "raw.wav"), os.path.join(tmp, "out.wav")
        subprocess.run(["espeak-ng", "-v", voice, "-w", raw, text], check=True)
        subprocess.run(["sox", raw, "-r", str(RATE), "-c", "1", "-b", "16", out], check=True)
        with wave.open(out) as w:
            samples = array.array("h", w.readframes(w.getnframes()))
    voiced = voiced_windows(samples)
    if not voiced:
        return samples
    return samples[voiced[0] * WINDOW:(voiced[-1] + 1) * WINDOW]


def voiced_windows(samples):
    peak = max((abs(s) for s in samples), default=0)
    floor = max(peak * 0.02, 100)
    windows = []
    for i in range(len(samples) // WINDOW):
        chunk = samples[i * WINDOW:(i + 1) * WINDOW]
        rms = (sum(s * s for s in chunk) / len(chunk)) ** 0.5
        if rms > floor:
            windows.append(i)
    return windows


def build(voice, path, dbfs=None):
    """One WAV of the whole set in `voice` (over a floor of `dbfs`); the items with their times
    in seconds."""
    samples = array.array("h", [0] * RATE)
    items = []
    silence = lambda s: array.array("h", [0] * int(s * RATE))
    for q in QUESTIONS:
        start = len(samples) / RATE
        samples.extend(speech(voice, q))
        items.append({"kind": "question", "text": q, "start": start, "end": len(samples) / RATE})
        samples.extend(silence(GAP_S))
    for first, pause_ms, second in PAUSED:
        start = len(samples) / RATE
        samples.extend(speech(voice, first))
        pause_from = len(samples) / RATE
        samples.extend(silence(pause_ms / 1000))
        pause_to = len(samples) / RATE
        samples.extend(speech(voice, second))
        items.append({"kind": "paused", "text": f"{first} ... {second}", "start": start,
                      "pause": [pause_from, pause_to], "end": len(samples) / RATE})
        samples.extend(silence(GAP_S))
    write_wav(path, under(samples, dbfs))
    return items


def under(samples, dbfs, seed=1):
    """`samples` with a room's floor under all of it: brown noise (leaky-integrated white noise,
    as `voxide loadtest --noise brown` sends) at an RMS of `dbfs`; `dbfs` None leaves digital
    silence between the words."""
    if dbfs is None:
        return samples
    rng = random.Random(seed)
    level, raw = 0.0, []
    for _ in range(len(samples)):
        level = 0.992 * level + 0.1 * rng.uniform(-1.0, 1.0)
        raw.append(level)
    rms = math.sqrt(sum(x * x for x in raw) / max(len(raw), 1)) or 1.0
    gain = 32768.0 * 10 ** (dbfs / 20) / rms
    return array.array("h", (max(-32768, min(32767, s + round(x * gain)))
                             for s, x in zip(samples, raw)))


def room_name(dbfs):
    return "digital silence" if dbfs is None else f"brown noise at {dbfs:g} dBFS"


def noise_arguments(parser):
    """--noise-dbfs (default -55: a quiet room) and --digital-silence."""
    parser.add_argument("--noise-dbfs", type=float, default=-55.0,
                        help="the room's floor under the speech and between the questions, "
                             "RMS dBFS (default -55, a quiet room)")
    parser.add_argument("--digital-silence", action="store_true",
                        help="no floor: digital zero between the words (the lab's figure)")


def noise_dbfs(args):
    return None if args.digital_silence else args.noise_dbfs


def write_wav(path, samples):
    """16 kHz mono 16-bit `samples` to `path`."""
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(samples.tobytes())


def run(args, voice, wav, words):
    name = f"{voice.replace('+', '_')}-{'words' if words else 'model'}"
    events_path = os.path.join(args.out, f"{name}.events.jsonl")
    env = dict(os.environ, OPENAI_API_KEY="local", CARTESIA_API_KEY="local",
               OPENAI_BASE_URL=f"http://127.0.0.1:{args.stand_in_port}/v1",
               CARTESIA_URL=f"ws://127.0.0.1:{args.stand_in_port}")
    subprocess.run([args.bin, "run", "--input", wav, "--output", os.path.join(args.out, f"{name}.out.wav"),
                    "--events", events_path, "--llm", "openai", "--tts", "cartesia",
                    "--turn", "smart", "--turn-words", "true" if words else "false",
                    "--max-tail-secs", "5"],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = [json.loads(l) for l in open(events_path) if l.strip()]
    stops = [e["t_ms"] / 1000 for e in events if e["type"] == "user_stopped_speaking"]
    return stops, onsets(os.path.join(args.out, f"{name}.out.wav"))


def onsets(path):
    """Times (s) where the bot's audio turns loud after quiet, in 20 ms windows."""
    with wave.open(path) as w:
        rate = w.getframerate()
        bot = array.array("h", w.readframes(w.getnframes()))
    window = rate // 50
    found, quiet = [], True
    for i in range(len(bot) // window):
        chunk = bot[i * window:(i + 1) * window]
        loud = (sum(x * x for x in chunk) / len(chunk)) ** 0.5 > 300
        if loud and quiet:
            found.append(i * window / rate)
        quiet = not loud
    return found


def judge(items, heard):
    stops, onsets = heard
    waits, v2v, cuts = [], [], []
    for item in items:
        after = [t for t in stops if item["start"] < t]
        if item["kind"] == "question":
            ended = [t for t in after if t >= item["end"]]
            if ended and ended[0] < item["end"] + GAP_S:
                waits.append((ended[0] - item["end"]) * 1000)
            answered = [t for t in onsets if item["end"] <= t < item["end"] + GAP_S]
            if answered:
                v2v.append((answered[0] - item["end"]) * 1000)
        else:
            lo, hi = item["pause"]
            cuts.append(any(lo <= t < hi + 0.3 for t in after))
    return waits, v2v, cuts


def quantile(values, q):
    values = sorted(values)
    return round(values[min(len(values) - 1, int(round(q * (len(values) - 1))))], 1) if values else None


def write_items(out):
    """Each question and paused sentence of every voice, clean, as its own WAV and text."""
    os.makedirs(out, exist_ok=True)
    items = [(q, None, None) for q in QUESTIONS] + PAUSED
    k = 0
    for voice in VOICES:
        for first, pause_ms, second in items:
            samples = speech(voice, first)
            text = first
            if second is not None:
                samples.extend(array.array("h", [0] * int(pause_ms / 1000 * RATE)))
                samples.extend(speech(voice, second))
                text = f"{first} {second}"
            write_wav(os.path.join(out, f"t{k:02d}.wav"), samples)
            with open(os.path.join(out, f"t{k:02d}.txt"), "w") as f:
                f.write(text + "\n")
            k += 1
    print(f"{k} WAVs in {out}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="target/release/voxide")
    parser.add_argument("--out", default="target/turn-wait")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--stand-in-port", type=int, default=9030)
    parser.add_argument("--pipecat", metavar="PYTHON",
                        help="also time pipecat 1.14's default turn strategy on the same WAVs, "
                             "with this Python (one that has pipecat-ai 1.14 installed)")
    parser.add_argument("--wavs", metavar="DIR",
                        help="write each question and paused sentence as a WAV with its text "
                             "to DIR, and stop")
    noise_arguments(parser)
    args = parser.parse_args()
    if args.wavs:
        return write_items(args.wavs)
    os.makedirs(args.out, exist_ok=True)
    stand_ins = subprocess.Popen(
        ["target/release/examples/stand_in_providers", "--port", str(args.stand_in_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sets = {}
        for voice in VOICES:
            wav = os.path.join(args.out, f"{voice.replace('+', '_')}.wav")
            sets[voice] = (wav, build(voice, wav, noise_dbfs(args)))
        jobs = [(voice, words) for words in (False, True) for voice in VOICES]
        with ThreadPoolExecutor(args.parallel) as pool:
            stops = dict(zip(jobs, pool.map(lambda j: run(args, j[0], sets[j[0]][0], j[1]), jobs)))
    finally:
        stand_ins.terminate()
    report = {}
    for words in (False, True):
        waits, v2v, cuts = [], [], []
        for voice in VOICES:
            w, v, c = judge(sets[voice][1], stops[(voice, words)])
            waits += w
            v2v += v
            cuts += c
        report["smart_turn_and_words" if words else "smart_turn_alone"] = {
            "questions": len(QUESTIONS) * len(VOICES), "turns_timed": len(waits),
            "turn_wait_ms": {"p50": quantile(waits, 0.5), "p90": quantile(waits, 0.9),
                             "max": quantile(waits, 1.0)},
            "waits_over_1500ms": sum(1 for w in waits if w > 1500),
            "answers_timed": len(v2v),
            "v2v_ms": {"p50": quantile(v2v, 0.5), "p90": quantile(v2v, 0.9), "max": quantile(v2v, 1.0)},
            "paused_sentences": len(cuts), "cut_in_the_pause": sum(cuts),
        }
    if args.pipecat:
        report["pipecat_smart_turn"] = pipecat_turn_wait(args.pipecat, sets)
    report["voices"] = VOICES
    report["room"] = room_name(noise_dbfs(args))
    print(json.dumps(report))


def pipecat_turn_wait(python, sets):
    """pipecat 1.14's default turn ends on the same WAVs, judged the same way (it has no answers
    here, so no voice-to-voice)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                          "pipecat-compare", "turn_wait.py")
    wavs = [sets[voice][0] for voice in VOICES]
    out = subprocess.run([python, script, *wavs], check=True, capture_output=True, text=True)
    ends = json.loads(out.stdout.strip().splitlines()[-1])
    waits, cuts = [], []
    for voice in VOICES:
        w, _, c = judge(sets[voice][1], (ends[sets[voice][0]], []))
        waits += w
        cuts += c
    return {
        "questions": len(QUESTIONS) * len(VOICES), "turns_timed": len(waits),
        "turn_wait_ms": {"p50": quantile(waits, 0.5), "p90": quantile(waits, 0.9),
                         "max": quantile(waits, 1.0)},
        "waits_over_1500ms": sum(1 for w in waits if w > 1500),
        "paused_sentences": len(cuts), "cut_in_the_pause": sum(cuts),
    }


if __name__ == "__main__":
    sys.exit(main())
