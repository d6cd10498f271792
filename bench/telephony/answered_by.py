#!/usr/bin/env python3
"""Who answered a call voxide placed, judged on callees it was never tuned on: SIPp answers each
call in PCMU with a person's greeting ("Hello?") or an answering machine's (a greeting, a beep of
its own pitch and length, or none), in the held-out set's four espeak-ng voices, over a quiet
room's noise floor. voxide (`serve --sip-listen`, the embedded defaults, the bakery's bot with a
greeting and a `[voicemail]` message) places the calls one at a time with `POST /calls`.

For each call: `GET /calls/{id}`'s `answered_by`; from the session's recording, what the bot said
(the greeting or the message) and when: a machine's message from the end of its beep (or of its
greeting where it has none), a person's greeting from the end of their "Hello?".

    bench/telephony/answered_by.py [--bin target/release/voxide] [--out DIR] [--noise-dbfs -55]
        [--people short|long|both] [--ask-llm]

`--people long` has the people answer at length, as at work ("Good afternoon, Northwind Bakery,
Sam speaking, how can I help you?"): longer than a person's greeting by the clock, so the timing
alone takes them for machines. `--ask-llm` gives the bot's `[voicemail]` `ask_llm = true`: the
bot's LLM reads the greetings only the timing judged.

Needs espeak-ng, sox and SIPp (`sip-tester`). Prints one JSON line; rows go to OUT/rows.jsonl.
"""

import argparse
import array
import json
import math
import os
import struct
import subprocess
import sys
import time
import urllib.request
import warnings
import wave

with warnings.catch_warnings():
    # Python 3.11's G.711 and resampler; 3.13 drops the module (then `pip install audioop-lts`).
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from held_out import VOICES  # noqa: E402
from turn_wait import noise_arguments, noise_dbfs, room_name, speech, under  # noqa: E402

RATE = 8_000
TOKEN = "answered-by"
GREETING = "Hello, this is the bakery calling about your cake."
MESSAGE = "This is the bakery. Your cake is ready."

# A person picks up: a short greeting, then they wait.
PEOPLE = ["Hello?", "Hello, Sam speaking.", "Yeah, hello?", "Hi, who's this?",
          "Hello, this is Maria.", "Good morning.", "Yes?", "Hello, Patel residence."]
# A person who answers at length, as at work: over two seconds, more than five words.
LONG_PEOPLE = ["Good afternoon, Northwind Bakery, Sam speaking, how can I help you?",
               "Hello, you're through to Maria in accounts, what can I do for you today?",
               "Hi, this is Dan Patel, I'm driving at the moment but go ahead, I can talk.",
               "Front desk, this is Jo, how may I direct your call?"]
# A machine: its greeting, its beep (Hz, ms; None: no beep).
MACHINES = [
    ("Hi, you've reached Sam. I can't take your call right now. Please leave a message after "
     "the tone.", (1000, 500)),
    ("The person you are calling is not available. Please record your message after the tone.",
     (850, 300)),
    ("Hello, this is Maria. Leave your name and number and I will get back to you.", (440, 800)),
    ("Hi, it's Dan. I'm out on the boat all week, so talk to you when I'm back on dry land.",
     (1400, 250)),
    ("You have reached the voicemail box of five five five, zero one zero zero.", (1000, 1000)),
    ("Hey, this is Jo. Sorry I missed you. Leave a message.", None),
    ("Thanks for calling the Patel family. We can't come to the phone right now.", (2000, 200)),
    ("Hello, you've reached the front desk. Our office is closed for the day.", None),
]

SCENARIO = os.path.join(ROOT, "assets/test/sipp/callee.xml")

BOT = f"""name = "bakery"
voice = "espeak"
greeting = "{GREETING}"
[voicemail]
message = "{MESSAGE}"
"""


def at_8k(samples16):
    return array.array("h", audioop.ratecv(samples16.tobytes(), 2, 1, 16_000, RATE, None)[0])


def tone(hz, ms):
    return array.array("h", (int(9_000 * math.sin(2 * math.pi * hz * n / RATE))
                             for n in range(RATE * ms // 1000)))


def pcap(samples, path):
    """PCMU RTP, 20 ms a packet, in a libpcap file as SIPp's play_pcap_audio replays it."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    pcm = samples.tobytes()
    for i in range(0, len(samples) // 160):
        payload = audioop.lin2ulaw(pcm[i * 320:(i + 1) * 320], 2)
        rtp = struct.pack("!BBHII", 0x80, 0, i & 0xFFFF, i * 160, 0x51515151) + payload
        udp = struct.pack("!HHHH", 6000, 6000, 8 + len(rtp), 0) + rtp
        ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                                   bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1])))
        total = sum(struct.unpack("!10H", bytes(ip)))
        total = (total & 0xFFFF) + (total >> 16)
        ip[10:12] = struct.pack("!H", ~total & 0xFFFF)
        frame = bytes(12) + b"\x08\x00" + bytes(ip) + udp
        micros = i * 20_000
        out += struct.pack("<IIII", micros // 1_000_000, micros % 1_000_000, len(frame),
                           len(frame)) + frame
    with open(path, "wb") as f:
        f.write(out)


def request(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as answer:
        return json.load(answer)


def loud_runs(samples, rate, threshold=1000):
    """(start, end) seconds of each stretch louder than `threshold`, 20 ms windows."""
    window, runs, start = rate // 50, [], None
    for i in range(0, len(samples) - window + 1, window):
        loud = max(abs(s) for s in samples[i:i + window]) > threshold
        if loud and start is None:
            start = i / rate
        if not loud and start is not None:
            runs.append((start, i / rate))
            start = None
    if start is not None:
        runs.append((start, len(samples) / rate))
    return runs


def recording(records, session):
    """The session's report, its recording's rate, and the callee's and the bot's audio."""
    for _ in range(100):
        found = [f for f in os.listdir(records) if f.endswith(".json")
                 and json.load(open(os.path.join(records, f))).get("session") == session]
        if found:
            report = json.load(open(os.path.join(records, found[0])))
            with wave.open(os.path.join(records, report["audio"])) as w:
                rate = w.getframerate()
                both = array.array("h", w.readframes(w.getnframes()))
            return report, rate, both[0::2], both[1::2]
        time.sleep(0.1)
    raise SystemExit(f"no recording of {session} in {records}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(ROOT, "target/release/voxide"))
    parser.add_argument("--out", default=os.path.join(ROOT, "target/answered-by"))
    parser.add_argument("--port", type=int, default=7895)
    parser.add_argument("--sip-port", type=int, default=5097)
    parser.add_argument("--people", choices=["short", "long", "both"], default="short")
    parser.add_argument("--ask-llm", action="store_true")
    noise_arguments(parser)
    args = parser.parse_args()
    dbfs = noise_dbfs(args)
    os.makedirs(args.out, exist_ok=True)
    records = os.path.join(args.out, "records")
    os.makedirs(records, exist_ok=True)
    bot = os.path.join(args.out, "bakery.toml")
    with open(bot, "w") as f:
        f.write(BOT + ("ask_llm = true\n" if args.ask_llm else ""))
    server = subprocess.Popen(
        [args.bin, "serve", "--host", "127.0.0.1", "--port", str(args.port),
         "--auth-token", TOKEN, "--sip-listen", f"127.0.0.1:{args.sip_port}",
         "--sip-allow", "127.0.0.1/32", "--record-dir", records, "--bot", bot],
        stdout=open(os.path.join(args.out, "server.log"), "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{args.port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(base + "/readyz", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    people = {"short": PEOPLE, "long": LONG_PEOPLE, "both": PEOPLE + LONG_PEOPLE}[args.people]
    cases = [("human", text, None) for text in people] + \
        [("machine", text, beep) for text, beep in MACHINES]
    rows = []
    try:
        for n, (truth, text, beep) in enumerate(cases):
            voice = VOICES[n % len(VOICES)]
            said = at_8k(speech(voice, text))
            audio = array.array("h", [0] * (RATE // 2)) + said
            if beep:
                audio += array.array("h", [0] * (RATE * 3 // 10)) + tone(*beep)
            heard_until = len(audio) / RATE
            audio += array.array("h", [0] * RATE * 16)
            audio = under(audio, dbfs, seed=n + 1) if dbfs is not None else audio
            work = os.path.join(args.out, f"callee{n}")
            os.makedirs(work, exist_ok=True)
            pcap(audio, os.path.join(work, "callee.pcap"))
            callee_port = 5200 + n
            sipp = subprocess.Popen(
                ["sipp", "-sf", SCENARIO, "-i", "127.0.0.1", "-mi", "127.0.0.1",
                 "-p", str(callee_port), "-mp", str(26_000 + 4 * n), "-m", "1",
                 "-timeout", "60", "-nostdin"],
                cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            placed = request("POST", base + "/calls",
                             {"to": f"sip:callee@127.0.0.1:{callee_port}", "time_limit_s": 14})
            session = placed["session_id"]
            sipp.wait(timeout=70)
            for _ in range(100):
                call = request("GET", f"{base}/calls/{session}")
                if call["state"] in ("ended", "failed"):
                    break
                time.sleep(0.1)
            report, rate, callee, bot_audio = recording(records, session)
            bot_said = [t for turn in report.get("turns", []) for t in turn.get("bot_text", [])]
            callee_runs = loud_runs(callee, rate)
            bot_runs = loud_runs(bot_audio, rate)
            # The callee's last sound: a person's "Hello?", a machine's beep or greeting.
            callee_end = callee_runs[-1][1] if callee_runs else None
            first_word = bot_runs[0][0] if bot_runs else None
            rows.append({
                "truth": truth, "voice": voice, "text": text, "beep": beep,
                "answered_by": call.get("answered_by"),
                "because": call.get("answered_because"),
                "ended": call.get("reason"),
                "greeted": any("calling about your cake" in t for t in bot_said),
                "left_message": any("cake is ready" in t for t in bot_said),
                "spoke_over_callee": first_word is not None and callee_end is not None
                and first_word < callee_end - 0.1,
                "first_word_after_callee_ms": None if first_word is None or callee_end is None
                else round((first_word - callee_end) * 1000),
                "callee_heard_s": round(heard_until, 2),
            })
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        server.terminate()
        server.wait()
    with open(os.path.join(args.out, "rows.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")

    def share(rows, test):
        return f"{sum(1 for r in rows if test(r))}/{len(rows)}"

    def quantile(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    people = [r for r in rows if r["truth"] == "human"]
    machines = [r for r in rows if r["truth"] == "machine"]
    greet_ms = [r["first_word_after_callee_ms"] for r in people if r["greeted"]]
    message_ms = [r["first_word_after_callee_ms"] for r in machines if r["left_message"]]
    print(json.dumps({
        "room": room_name(dbfs), "people": args.people, "ask_llm": args.ask_llm,
        "people_told_human": share(people, lambda r: r["answered_by"] in ("human", "unknown")),
        "people_greeted": share(people, lambda r: r["greeted"] and not r["left_message"]),
        "machines_told_machine": share(machines, lambda r: r["answered_by"] == "machine"),
        "machines_got_message": share(machines, lambda r: r["left_message"] and not r["greeted"]),
        "spoke_over_a_machine": share(machines, lambda r: r["spoke_over_callee"]),
        "greeting_after_hello_ms_p50_p90": [quantile(greet_ms, 0.5), quantile(greet_ms, 0.9)],
        "message_after_beep_or_greeting_ms_p50_p90": [quantile(message_ms, 0.5),
                                                      quantile(message_ms, 0.9)],
    }))


if __name__ == "__main__":
    main()
