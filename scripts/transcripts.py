#!/usr/bin/env python3
"""Transcripts you can trust: the bot's recogniser over the held-out questions in every room,
counting the finals it makes up, the ones that repeat themselves and the words it leaves out;
and a 40 s monologue, which must lose no words.

`voxide bench turns --transcribe` runs the VAD and the embedded Whisper exactly as a session
does (no network, no LLM): a minute or so a room. The rooms:

  silence      digital silence
  brown-60     brown noise at -60 dBFS       brown-50, brown-40, pink-50 likewise
  babble-20    café babble at SNR 20 dB      babble-10, babble-5 likewise
  under-10     the café at SNR 10 dB only while each question's voice lasts, digital silence
               around it: what the café's masking alone costs, with no talk before or after a
               question for its turn to take in (under-20, under-5 likewise)

The questions are the 45 held-out ones in their four voices (scripts/network.py builds them);
the babble is scripts/noise.py's four espeak-ng talkers. The monologue is one held-out voice
reading 40 s of plans, twice: as espeak-ng paces it (a pause between sentences, so the VAD cuts
it into utterances) and run on (the sentences 0.1 s apart: one utterance, longer than the 30 s
Whisper hears at once). Each is scored against the same sentences asked one by one.

    scripts/transcripts.py [--bin target/release/voxide] [--out target/transcripts]
                           [--rooms silence,brown-50,babble-10] [--no-monologue] [--tuning]

`--tuning` hears the set to tune on instead: `scripts/turn_wait.py --wavs`'s questions (other
voices, other questions) and a monologue of other plans in one of their voices, so a change is
chosen on it and checked on the held-out set.

Prints one JSON line per room and set: `made_up` (finals of the room's own turns where the
room is noise: words nobody said), `room_finals` (the same where the room is talk),
`repeated` (questions heard repeating themselves), `left_out` (words said that no final has).
"""

import argparse
import array
import contextlib
import glob
import json
import os
import subprocess
import sys
import wave

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from held_out import VOICES  # noqa: E402
from network import build  # noqa: E402
from noise import active_level, babble, rms_dbfs  # noqa: E402
from turn_wait import RATE, WINDOW, speech, voiced_windows, write_items, write_wav  # noqa: E402
from turn_wait import VOICES as TUNING_VOICES  # noqa: E402

ROOMS = {
    "silence": ("brown", "--noise-dbfs", -120),
    "brown-60": ("brown", "--noise-dbfs", -60),
    "brown-50": ("brown", "--noise-dbfs", -50),
    "brown-40": ("brown", "--noise-dbfs", -40),
    "pink-50": ("pink", "--noise-dbfs", -50),
    "babble-20": ("BABBLE", "--snr", 20),
    "babble-10": ("BABBLE", "--snr", 10),
    "babble-5": ("BABBLE", "--snr", 5),
    "under-20": ("UNDER", "--snr", 20),
    "under-10": ("UNDER", "--snr", 10),
    "under-5": ("UNDER", "--snr", 5),
}
MONOLOGUE_VOICE = VOICES[1]
MONOLOGUE = [
    "So here is what I am planning for the summer.",
    "In the first week of July we fly to Lisbon and stay with my sister for five days.",
    "Then we take the train north to Porto, because my father wants to see the old bridge "
    "and drink port by the river.",
    "After that we rent a small car and drive along the coast to Santiago.",
    "My daughter wants to walk the last part of the pilgrims' way, about one hundred "
    "kilometres, so we will need good shoes and light bags.",
    "On the way back we would like two quiet days by the sea, somewhere with a beach that "
    "is not too crowded and a good place to eat fish.",
    "The whole trip is three weeks, and we have a budget of four thousand euros.",
    "Nobody in the family speaks Portuguese or Spanish, except a few words for ordering coffee.",
    "Can you help me plan the days and tell me what I have forgotten?",
]
# The monologue to tune on: a voice of the tuning set, other plans.
TUNING_MONOLOGUE_VOICE = TUNING_VOICES[0]
TUNING_MONOLOGUE = [
    "Let me tell you about the garden we are building behind the house.",
    "Last spring we pulled out the old hedge and laid down a path of grey stones.",
    "Along the fence there will be tomatoes, beans and three rows of potatoes, because my son "
    "eats nothing else.",
    "In the corner by the shed we want a small pond with a bench beside it.",
    "My mother says the soil is too heavy, so we are mixing in sand and compost every weekend.",
    "We also ordered two apple trees and a pear tree from a nursery near the river.",
    "The plan is to finish the beds before the end of April and plant in May.",
    "We have about six hundred pounds to spend, and the stones took half of it.",
    "Could you suggest some flowers that bring bees and do well in shade?",
]
RUN_ON_GAP = int(0.1 * RATE)


def monologue(out, voice, sentences_said):
    """The monologue as espeak-ng paces it, run on, and sentence by sentence: the WAV lists."""
    os.makedirs(out, exist_ok=True)
    paced = os.path.join(out, "monologue.wav")
    run_on = os.path.join(out, "monologue-run-on.wav")
    text = " ".join(sentences_said)
    if not os.path.exists(paced):
        write_wav(paced, speech(voice, text))
    sentences = []
    for i, sentence in enumerate(sentences_said):
        path = os.path.join(out, f"s{i}.wav")
        if not os.path.exists(path):
            write_wav(path, speech(voice, sentence))
        with open(path[:-4] + ".txt", "w") as f:
            f.write(sentence + "\n")
        sentences.append(path)
    if not os.path.exists(run_on):
        joined = array.array("h")
        for path in sentences:
            if joined:
                joined.extend([0] * RUN_ON_GAP)
            joined.extend(read(path))
        write_wav(run_on, joined)
    for path in (paced, run_on):
        with open(path[:-4] + ".txt", "w") as f:
            f.write(text + "\n")
    return {"monologue": [paced], "run-on": [run_on], "sentences": sentences}


def read(path):
    with wave.open(path) as w:
        return array.array("h", w.readframes(w.getnframes()))


def under(wavs, noise_file, snr, folder):
    """Copies of `wavs` in `folder` with the café mixed in from each one's first voiced 20 ms to
    its last, `snr` dB under their active speech level, and nothing around the voice."""
    os.makedirs(folder, exist_ok=True)
    noise = read(noise_file)
    gain = 10 ** ((active_level(wavs) - snr - rms_dbfs(noise)) / 20)
    at = 0
    mixed_wavs = []
    for path in wavs:
        samples = read(path)
        voiced = voiced_windows(samples)
        for i in range(voiced[0] * WINDOW, (voiced[-1] + 1) * WINDOW):
            mixed = samples[i] + gain * noise[at % len(noise)]
            samples[i] = max(-32768, min(32767, round(mixed)))
            at += 1
        mixed_path = os.path.join(folder, os.path.basename(path))
        write_wav(mixed_path, samples)
        with open(path[:-4] + ".txt") as said, open(mixed_path[:-4] + ".txt", "w") as f:
            f.write(said.read())
        mixed_wavs.append(mixed_path)
    return mixed_wavs


def turns(binary, wavs, room, noise_file):
    noise, flag, level = ROOMS[room]
    if noise == "UNDER":
        folder = os.path.join(os.path.dirname(noise_file), room, os.path.basename(
            os.path.dirname(wavs[0])))
        wavs = under(wavs, noise_file, level, folder)
        noise, flag, level = ROOMS["silence"]
    command = [binary, "bench", "turns", "--transcribe",
               "--noise", noise_file if noise == "BABBLE" else noise, flag, str(level)]
    for wav in wavs:
        command += ["--audio", wav]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def seconds(wavs):
    return round(sum(len(read(w)) for w in wavs) / RATE, 1)


def summary(room, name, report, wavs):
    words = report["words"]
    talk = ROOMS[room][0] in ("BABBLE", "UNDER")
    line = {
        "room": room,
        "set": name,
        "questions": report["questions"],
        "speech_secs": seconds(wavs),
        "wer_pct": words["wer_pct"],
        "left_out": words["left_out"],
        "said": words["said"],
        "repeated": words["repeated"],
        "made_up": [] if talk else words["room_finals"],
        "room_finals": words["room_finals"] if talk else [],
        "missed": report["missed"],
    }
    line["repeats"] = [h["heard"] for h in words["heard"] if h["repeated"]]
    if name not in ("held-out", "tuning"):
        line["heard"] = [h["heard"] for h in words["heard"]]
    return line


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default="target/release/voxide")
    parser.add_argument("--out", default="target/transcripts")
    parser.add_argument("--rooms", default=",".join(r for r in ROOMS if ROOMS[r][0] != "UNDER"))
    parser.add_argument("--no-monologue", action="store_true")
    parser.add_argument("--tuning", action="store_true",
                        help="the set to tune on, not the held-out one")
    args = parser.parse_args()
    rooms = args.rooms.split(",")
    unknown = [r for r in rooms if r not in ROOMS]
    if unknown:
        sys.exit(f"transcripts: unknown rooms {unknown}; known: {', '.join(ROOMS)}")
    os.makedirs(args.out, exist_ok=True)
    if args.tuning:
        folder = os.path.join(args.out, "tuning-questions")
        if not os.path.exists(folder):
            with contextlib.redirect_stdout(sys.stderr):
                write_items(folder)
        sets = {"tuning": sorted(glob.glob(os.path.join(folder, "t*.wav")))}
        speaker = (TUNING_MONOLOGUE_VOICE, TUNING_MONOLOGUE)
    else:
        sets = {"held-out": build(os.path.join(args.out, "questions"))}
        speaker = (MONOLOGUE_VOICE, MONOLOGUE)
    if not args.no_monologue:
        prefix = "tuning-" if args.tuning else ""
        spoken = monologue(os.path.join(args.out, f"{prefix}monologue"), *speaker)
        sets.update({prefix + name: wavs for name, wavs in spoken.items()})
    noise_file = babble(os.path.join(args.out, "babble.wav"))
    for room in rooms:
        for name, wavs in sets.items():
            report = turns(args.bin, wavs, room, noise_file)
            with open(os.path.join(args.out, f"{room}-{name}.json"), "w") as f:
                json.dump(report, f, indent=1)
            print(json.dumps(summary(room, name, report, wavs)), flush=True)


if __name__ == "__main__":
    main()
