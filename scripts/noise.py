#!/usr/bin/env python3
"""The held-out questions in a noisy room: `voxide serve` with the embedded defaults, with and
without noise suppression, driven by `voxide loadtest` once per room.

The 45 held-out questions in its four voices (scripts/network.py builds them, each WAV with
its text), scored by what the bot transcribed (WER) and timed from the audio (v2v). The rooms:

  quiet        brown noise at -55 dBFS (a quiet room)
  babble-20    café babble at SNR 20 dB
  babble-10    café babble at SNR 10 dB
  babble-5     café babble at SNR 5 dB

The babble is four espeak-ng voices none of the test sets uses, each reading its own text,
mixed (BABBLE.wav, made once); with `--babble piper` it is the load tester's own
`--noise babble` (four talkers made by the embedded Piper voice) instead. Its level is set from
the questions' active speech level, so SNR is speech over noise while both sound. Each room runs against the bot without and with
`--denoise rnnoise`.

    scripts/noise.py [--bin target/release/voxide] [--out target/noise] [--rooms quiet,babble-10]
                     [--denoise off,rnnoise] [--babble espeak|piper]
                     [--protocol ws]

Prints one JSON line per room and denoiser, with the p50 from the end of each question's voice to
its turn's end and to its last words; each run's files stay under OUT/DENOISE/ROOM/.
"""

import argparse
import array
import csv
import json
import math
import os
import statistics
import sys
import wave

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from network import build, free_port, run, serve  # noqa: E402
from turn_wait import RATE, speech, voiced_windows, write_wav, WINDOW  # noqa: E402

BABBLE_VOICES = ["en-us+m4", "en-gb+f4", "en-us+f2", "en-gb-x-rp+m7"]
BABBLE_TEXTS = [
    "The train to the coast was late again this morning, so we had coffee on the platform "
    "and talked about the garden, the new neighbours and the price of everything.",
    "She told me the meeting moved to Thursday, which is fine, but nobody booked a room and "
    "the projector still does not work, so we will see what happens.",
    "I think the soup needs more salt, and maybe some pepper, but the bread is perfect and "
    "the children loved the little cakes with the cream on top.",
    "We walked along the river for an hour, past the old mill and the bridge, and then it "
    "started to rain and we ran back laughing all the way home.",
]
ROOMS = {
    "quiet": None,
    "babble-20": 20,
    "babble-10": 10,
    "babble-5": 5,
}


def babble(path):
    """Four voices talking at once, each its own text, from offsets; 16 kHz mono."""
    if os.path.exists(path):
        return path
    streams = [speech(voice, text) for voice, text in zip(BABBLE_VOICES, BABBLE_TEXTS)]
    length = max(len(s) for s in streams)
    mixed = [0.0] * length
    for i, stream in enumerate(streams):
        offset = i * RATE // 3
        for j, sample in enumerate(stream):
            mixed[(j + offset) % length] += sample
    peak = max(abs(x) for x in mixed) or 1.0
    write_wav(path, array.array("h", (int(x * 20_000 / peak) for x in mixed)))
    return path


def rms_dbfs(samples):
    power = sum(s * s for s in samples) / max(len(samples), 1)
    return 10 * math.log10(max(power, 1e-9) / 32768.0 ** 2)


def active_level(wavs):
    """The questions' active speech level (RMS over their voiced 20 ms windows), dBFS."""
    voiced = array.array("h")
    for path in wavs:
        with wave.open(path) as w:
            samples = array.array("h", w.readframes(w.getnframes()))
        for k in voiced_windows(samples):
            voiced.extend(samples[k * WINDOW:(k + 1) * WINDOW])
    return rms_dbfs(voiced)


def after_the_voice(out):
    """From the end of each question's voice (the clean WAV's) to the turn's end
    (`user_stopped_speaking`) and to its last transcript before the bot's answer, p50 in ms:
    where a room's v2v goes before the answer is made."""
    with open(os.path.join(out, "timeline.jsonl")) as f:
        server = [e for e in map(json.loads, f) if e["event"] == "server"]
    with open(os.path.join(out, "turns.csv")) as f:
        turns = [t for t in csv.DictReader(f) if t["onset_ms"]]
    ends, words = [], []
    for turn in turns:
        voice_end, onset = float(turn["speech_end_ms"]), float(turn["onset_ms"])
        between = [e for e in server if voice_end - 100 <= e["t_ms"] <= onset]
        for kind, into in (("user_stopped_speaking", ends), ("user_transcription", words)):
            times = [e["t_ms"] for e in between if e["type"] == kind]
            if times:
                into.append(times[-1] - voice_end)
    return {"turn_end_p50": round(statistics.median(ends)) if ends else None,
            "last_words_p50": round(statistics.median(words)) if words else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default="target/release/voxide")
    parser.add_argument("--out", default="target/noise")
    parser.add_argument("--rooms", default=",".join(ROOMS))
    parser.add_argument("--denoise", default="off,rnnoise")
    parser.add_argument("--protocol", default="ws")
    parser.add_argument("--babble", default="espeak", choices=["espeak", "piper"],
                        help="espeak: the four espeak-ng voices' WAV built here; piper: "
                             "the load tester's own `--noise babble`")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    wavs = build(os.path.join(args.out, "questions"))
    noise = babble(os.path.join(args.out, "babble.wav"))
    speech_dbfs = active_level(wavs)
    for denoise in args.denoise.split(","):
        port = free_port()
        with open(os.path.join(args.out, f"server-{denoise}.log"), "w") as log:
            server = serve(args.bin, port, log, ["--denoise", denoise])
            try:
                for room in args.rooms.split(","):
                    snr = ROOMS[room]
                    if snr is None:
                        flags = ["--noise-dbfs", "-55"]
                    else:
                        source = noise if args.babble == "espeak" else "babble"
                        flags = ["--noise", source, "--noise-dbfs", f"{speech_dbfs - snr:.1f}"]
                    out = os.path.join(args.out, denoise, room if args.babble == "espeak" or snr is None else f"{room}-piper")
                    figures = run(args.bin, f"http://127.0.0.1:{port}", wavs, out, 1, flags,
                                  args.protocol)
                    print(json.dumps({**figures, **after_the_voice(out), "room": room,
                                      "denoise": denoise, "babble": args.babble,
                                      "speech_dbfs": round(speech_dbfs, 1)}), flush=True)
            finally:
                server.terminate()
                server.wait()


if __name__ == "__main__":
    main()
