#!/usr/bin/env python3
"""The held-out set: spoken questions in voices voxide was never tuned on, through `voxide run`
with the embedded defaults (Silero, Smart Turn and the words, Whisper, SmolLM2, Piper), timed and
judged from what the bot did and said.

45 questions, 15 of them for a tool, each spoken once, dealt round-robin to four espeak-ng
voices (one session per voice, questions 7 s apart). No question or voice here was used to tune
routing, templates or turn ends: keep it that way (tune on `voxide bench tools` and
`scripts/turn_wait.py`). For each question:

- voice-to-voice: the last voiced 20 ms of the question in the input WAV to the first voiced
  20 ms of the bot's answer in the output WAV; the turn wait: to the bot's user_stopped_speaking;
- the tool it called (tool_call_started between this question and the next), judged against the
  expected tool and argument (a sum's value, a timer's seconds);
- whether the answer after a tool states its result faithfully: the result's value (or the
  timer's length, the clock's time) is in the bot's words, and every number the bot says is one
  of the result's or the question's.

    scripts/held_out.py [--bin target/release/voxide] [--label NAME] [--out target/held-out]
                        [--noise-dbfs -55 | --digital-silence]

The WAVs carry a quiet room's floor (brown noise at -55 dBFS) under the speech and between the
questions unless told otherwise.

Prints one JSON line of figures; the per-question rows go to OUT/LABEL.rows.jsonl.
"""

import argparse
import array
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from turn_wait import (RATE, noise_arguments, noise_dbfs, onsets, quantile, room_name,  # noqa: E402
                       speech, under, write_wav)

VOICES = ["en-gb-x-gbclan+m3", "en-us+f5", "en-gb-x-gbcwmd+m6", "en-gb+f2"]
GAP_S = 7.0

# (question, expected tool or None, expected argument: a sum's value or a timer's seconds)
QUESTIONS = [
    ("Could you tell me the time?", "get_current_time", None),
    ("What is the biggest animal in the sea?", None, None),
    ("What is eight times nine?", "calculate", 72),
    ("Who painted the Mona Lisa?", None, None),
    ("Start a timer for two minutes.", "set_timer", 120),
    ("How do I make a cup of tea?", None, None),
    ("Can you tell me a fun fact?", None, None),
    ("What is your name?", None, None),
    ("Cancel my timer.", "cancel_set_timer", None),
    ("I am feeling a bit tired today.", None, None),
    ("What is today's date?", "get_current_time", None),
    ("Where is the Eiffel Tower?", None, None),
    ("What is one hundred divided by four?", "calculate", 25),
    ("What do cats like to eat?", None, None),
    ("Why do leaves change colour in autumn?", None, None),
    ("Add twelve and thirty.", "calculate", 42),
    ("Tell me something about the ocean.", None, None),
    ("What is the opposite of hot?", None, None),
    ("What day is it today?", "get_current_time", None),
    ("How are you this evening?", None, None),
    ("What's fifteen plus twenty six?", "calculate", 41),
    ("Do you like dogs or cats?", None, None),
    ("What is a good movie to watch?", None, None),
    ("Thanks for your help.", None, None),
    ("What is the square root of sixty four?", "calculate", 8),
    ("Which planet is closest to the sun?", None, None),
    ("What language do they speak in Brazil?", None, None),
    ("Do you know what the time is?", "get_current_time", None),
    ("How many continents are there?", None, None),
    ("How much is forty minus eighteen?", "calculate", 22),
    ("I walked three miles this morning.", None, None),
    ("My flight leaves in two hours.", None, None),
    ("What a lovely day it is.", None, None),
    ("Can you sing a song?", None, None),
    ("What is the weather usually like in London?", None, None),
    ("Who invented the telephone?", None, None),
    ("What's the difference between a frog and a toad?", None, None),
    ("I have two brothers and one sister.", None, None),
    ("Good night, see you tomorrow.", None, None),
    ("How long does it take to boil an egg?", None, None),
    ("What time of year is best for skiing?", None, None),
    ("Is it too late to call my friend?", None, None),
    # Timers last: they would ring only after the session ends.
    ("Set a timer for five minutes.", "set_timer", 300),
    ("Remind me to check the oven in ten minutes.", "set_timer", 600),
    ("Set an alarm for fifteen minutes.", "set_timer", 900),
]


def build(voice, questions, path, dbfs=None):
    """One WAV of `questions` in `voice` (over a floor of `dbfs`); each item with its times in
    seconds."""
    samples = array.array("h", [0] * RATE)
    items = []
    for text, tool, value in questions:
        start = len(samples) / RATE
        samples.extend(speech(voice, text))
        items.append({"text": text, "tool": tool, "value": value, "voice": voice,
                      "start": start, "end": len(samples) / RATE})
        samples.extend(array.array("h", [0] * int(GAP_S * RATE)))
    write_wav(path, under(samples, dbfs))
    return items


def numbers(text):
    return {float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", str(text))}


def duration_numbers(seconds):
    return {float(seconds // 3600), float(seconds // 60 % 60), float(seconds % 60), float(seconds)}


def faithful(call, result, said, question):
    """Whether `said` (the bot's words after the call) states `result` truly."""
    if not said.strip():
        return False
    spoken = numbers(said)
    args = call.get("arguments") or {}
    if call["name"] == "calculate":
        value = (result or {}).get("result")
        allowed = numbers(args.get("expression", "")) | numbers(question) | numbers(value)
        return value is not None and float(value) in spoken and spoken <= allowed
    if call["name"] == "get_current_time":
        time = (result or {}).get("time", "")
        allowed = numbers(time.replace(":", " ")) | numbers((result or {}).get("date", ""))
        return bool(time) and time in said and spoken <= allowed
    if call["name"] == "set_timer":
        allowed = duration_numbers(int(args.get("seconds", 0))) | numbers(question)
        return bool(spoken) and spoken <= allowed
    return True


def run(args, voice, wav, items):
    name = f"{args.label}-{voice.replace('+', '_')}"
    events_path = os.path.join(args.out, f"{name}.events.jsonl")
    out_wav = os.path.join(args.out, f"{name}.out.wav")
    subprocess.run([args.bin, "run", "--input", wav, "--output", out_wav, "--events", events_path,
                    "--max-tail-secs", "10"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = [json.loads(line) for line in open(events_path) if line.strip()]
    heard = onsets(out_wav)
    rows = []
    for i, item in enumerate(items):
        lo = item["start"]
        hi = items[i + 1]["start"] if i + 1 < len(items) else float("inf")
        window = [e for e in events if lo <= e["t_ms"] / 1000 < hi]
        calls = [e for e in window if e["type"] == "tool_call_started"]
        stops = [e["t_ms"] / 1000 for e in window if e["type"] == "user_stopped_speaking"
                 and e["t_ms"] / 1000 >= item["end"]]
        answered = [t for t in heard if item["end"] <= t < hi]
        row = dict(item)
        row["heard"] = " ".join(e["text"] for e in window
                                if e["type"] == "user_transcription" and e["final"])
        row["called"] = [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
        row["said"] = " ".join(e["text"] for e in window if e["type"] == "bot_text")
        row["turn_wait_ms"] = round((stops[0] - item["end"]) * 1000, 1) if stops else None
        row["v2v_ms"] = round((answered[0] - item["end"]) * 1000, 1) if answered else None
        row["faithful"] = None
        result = None
        if calls:
            call = calls[0]
            results = [e for e in window if e["type"] == "tool_call_result"
                       and e["tool_call_id"] == call["tool_call_id"]]
            result = results[0]["result"] if results else None
            row["result"] = result
            after = results[0]["t_ms"] if results else call["t_ms"]
            said = " ".join(e["text"] for e in window
                            if e["type"] == "bot_text" and e["t_ms"] >= after)
            row["faithful"] = faithful(call, result if isinstance(result, dict) else None,
                                       said, item["text"])
        row["tool_right"] = judge_tool(item, calls, result)
        rows.append(row)
    return rows


def judge_tool(item, calls, result):
    """The expected tool, first; a sum judged by the calculator's own answer, a timer by its
    seconds."""
    names = [c["name"] for c in calls]
    if item["tool"] is None:
        return not names
    if names[:1] != [item["tool"]]:
        return False
    args = calls[0].get("arguments") or {}
    if item["tool"] == "calculate":
        value = result.get("result") if isinstance(result, dict) else None
        return value is not None and float(value) == item["value"]
    if item["tool"] == "set_timer":
        return args.get("seconds") == item["value"]
    return True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="target/release/voxide")
    parser.add_argument("--label", default="voxide")
    parser.add_argument("--out", default="target/held-out")
    noise_arguments(parser)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for v, voice in enumerate(VOICES):
        questions = QUESTIONS[v::len(VOICES)]
        wav = os.path.join(args.out, f"{voice.replace('+', '_')}.wav")
        rows += run(args, voice, wav, build(voice, questions, wav, noise_dbfs(args)))
    with open(os.path.join(args.out, f"{args.label}.rows.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tools = [r for r in rows if r["tool"]]
    chat = [r for r in rows if not r["tool"]]
    after_tool = [r for r in rows if r["faithful"] is not None]
    v2v = [r["v2v_ms"] for r in rows if r["v2v_ms"] is not None]
    waits = [r["turn_wait_ms"] for r in rows if r["turn_wait_ms"] is not None]
    print(json.dumps({
        "label": args.label, "questions": len(rows), "voices": VOICES,
        "room": room_name(noise_dbfs(args)),
        "v2v_ms": {"p50": quantile(v2v, 0.5), "p90": quantile(v2v, 0.9), "max": quantile(v2v, 1.0),
                   "answered": len(v2v)},
        "turn_wait_ms": {"p50": quantile(waits, 0.5), "p90": quantile(waits, 0.9),
                         "max": quantile(waits, 1.0)},
        "tool_questions": len(tools), "tools_right": sum(r["tool_right"] for r in tools),
        "no_tool_questions": len(chat), "false_calls": sum(not r["tool_right"] for r in chat),
        "answers_after_a_tool": len(after_tool),
        "faithful": sum(bool(r["faithful"]) for r in after_tool),
    }))


if __name__ == "__main__":
    sys.exit(main())
