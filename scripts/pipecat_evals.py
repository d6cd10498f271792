#!/usr/bin/env python3
"""pipecat's own release scenarios against voxide, and a table of what passed and why not.

Runs under the eval harness's Python (scripts/pipecat_evals.sh sets it up). For every scenario
in PIPECAT_CHECKOUT/scripts/release-evals/scenarios (pipecat's files, read from the checkout,
never copied into voxide), it works out what the scenario needs: a voxide bot with its tools
(tests/evals/bots/), an LLM judge for its `eval:` criteria, the Kokoro voice for spoken user
turns, the Moonshine transcriber for the bot's spoken replies, vision, pipecat Flows, several
workers. A scenario whose needs are met runs with `pipecat eval run` against `voxide serve` and
that bot; any other is skipped, saying what it needs.

  --judge-url URL   an OpenAI-compatible endpoint for the judge (JUDGE_URL), with
                    --judge-model (JUDGE_MODEL); the scenarios' own judge files are pointed at
                    it in a copy, the scenarios themselves unchanged
  --no-judge        run the judged scenarios without their `eval:` criteria (a copy with those
                    lines removed): the events, texts and calls are still checked; the table says
                    "events only"
  --downloads       the harness may fetch its Kokoro voice and Moonshine model (Hugging Face)
  --llm SPEC        the bots' LLM (`voxide serve --llm`, e.g. `openai` with OPENAI_API_KEY set):
                    the embedded SmolLM2-135M is too small for most of pipecat's scenarios
  --only NAME,...   just these scenarios
"""

import argparse
import http.server
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOTS = ROOT / "tests/evals/bots"
PORT = 7980
TOOLS_PORT = 9040  # tests/evals/bots/pipecat/*.toml call their tools here

# Which voxide bot serves a scenario that calls these tools: the bot mirrors the pipecat example
# the scenario was written for.
BOT_TOOLS = {
    "pipecat/function_calling.toml": {
        "get_current_weather",
        "get_stock_price",
        "write_report",
        "cancel_write_report",
        "get_restaurant_recommendation",
    },
}
# Tools of pipecat examples voxide has no bot for, and what they need.
NEEDS_BY_TOOL = {
    "fetch_user_image": "vision (a camera image for the LLM)",
    "switch_llm": "switching LLMs mid-call",
    "summarize_conversation": "switching LLMs mid-call",
    "search_web_pages": "Keenable's web search service",
    "fetch_page_content": "Keenable's web search service",
    "transfer_to_reservation": "several workers with handoffs",
    "transfer_to_router": "several workers with handoffs",
    "record_favorite_color": "pipecat's hello-world worker bot",
}
FLOWS_TOOLS = {
    "choose_pizza", "complete_order", "get_delivery_estimate", "select_pizza_order",
    "choose_sushi", "select_sushi_order", "calculate_quote", "collect_age",
    "collect_marital_status", "end_quote", "update_coverage", "complete_intake",
    "confirm_information", "record_allergies", "record_conditions", "record_prescriptions",
    "record_visit_reasons", "verify_birthday", "check_availability", "collect_party_size",
    "end_conversation", "end_reservation",
}
# Scenarios whose need shows in their name rather than their tools.
NEEDS_BY_NAME = {
    "language_switch": "speaking other languages (the embedded voice is English)",
    "vision_describe": "vision (a camera image for the LLM)",
    "describe_image": "vision (a camera image for the LLM)",
    "filter_incomplete_turns": "pipecat's turn-completion markers in the LLM's text",
}
# Scenarios whose bot shows in their name: the tools they call are the bot's own to choose.
BOT_BY_NAME = {
    "mcp_memory": "pipecat/mcp_memory.toml",
}

# What pipecat's example handlers answer, and how long they take.
TOOL_ANSWERS = {
    "get_current_weather": (15.0, {"conditions": "nice", "temperature": "75"}),
    "get_stock_price": (20.0, {"price": "184.20", "currency": "USD"}),
    "write_report": (25.0, None),
    "get_restaurant_recommendation": (0.0, {"name": "The Golden Dragon"}),
}


class Tools(http.server.BaseHTTPRequestHandler):
    """The mock of pipecat's example tools: voxide's HTTP tools call it."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        name = self.path.strip("/")
        length = min(int(self.headers.get("content-length") or 0), 1 << 20)
        body = json.loads(self.rfile.read(length) or b"{}")
        if name not in TOOL_ANSWERS:
            self.send_error(404)
            return
        delay, answer = TOOL_ANSWERS[name]
        if answer is None:
            topic = body.get("arguments", {}).get("topic", "the topic")
            answer = {"report": f"A 5000-word report on {topic}."}
        time.sleep(delay)
        data = json.dumps(answer).encode()
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the call was cancelled or timed out

    def log_message(self, *_):
        pass


class ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def scenario_needs(path: Path, judge: str, downloads: bool) -> tuple[str | None, list[str]]:
    """The bot that serves the scenario at `path`, and what it needs that is missing."""
    from pipecat.evals.scenario import EvalScenarioFile
    from pipecat.evals.simulation import EvalSimulationScenario

    needs: list[str] = []
    tools: set[str] = set()
    for scenario in EvalScenarioFile.load(path):
        if isinstance(scenario, EvalSimulationScenario):
            needs.append("an LLM-played caller (a simulation)")
            continue
        judged = response = images = 0
        for turn in scenario.turns:
            images += bool(getattr(turn, "image", None))
            for expectation in turn.expect or []:
                judged += bool(getattr(expectation, "eval", None))
                response += expectation.event == "response"
                for call in getattr(expectation, "calls", None) or []:
                    tools.add(call.name or "")
        if judged and judge == "none":
            needs.append("an LLM judge (--judge-url)")
        if scenario.user_speech and not downloads:
            needs.append("the Kokoro voice for spoken user turns (--downloads)")
        if scenario.bot_audio and response and not downloads:
            needs.append("the Moonshine transcriber for the bot's speech (--downloads)")
        if images:
            needs.append("vision (a camera image for the LLM)")
    stem = path.stem
    for prefix, need in NEEDS_BY_NAME.items():
        if stem.startswith(prefix):
            needs.append(need)
    if tools & FLOWS_TOOLS:
        needs.append("pipecat Flows (#55)")
    needs += sorted({NEEDS_BY_TOOL[t] for t in tools if t in NEEDS_BY_TOOL})
    bot = BOT_BY_NAME.get(stem, "assistant.toml")
    if stem not in BOT_BY_NAME and tools - {""}:
        served = [b for b, names in BOT_TOOLS.items() if tools <= names]
        if served:
            bot = served[0]
        elif not needs:
            needs.append(f"a bot with the tools {sorted(tools)}")
    return bot, list(dict.fromkeys(needs))


def prepared_copy(checkout: Path, out: Path, judge: str, judge_url: str, model: str) -> Path:
    """pipecat's scenarios copied under `out`: judge files pointed at the judge, or `eval:`
    lines dropped for --no-judge. The checkout is never written to."""
    source = checkout / "scripts/release-evals/scenarios"
    if not source.is_dir():
        sys.exit(f"pipecat_evals: no scenarios in {source}: is {checkout} pipecat's repository?")
    copy = out / "scenarios"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    if judge == "url":
        for name in ("judge_text.yaml", "judge_audio.yaml"):
            path = copy / name
            if path.exists():
                text = re.sub(r"(?m)^  service: .*$", "  service: ollama", path.read_text())
                text = re.sub(r"(?m)^  model: .*$", f"  model: {model}", text)
                text = text.replace("  service: ollama", f"  service: ollama\n  endpoint: {judge_url}", 1)
                path.write_text(text)
    if judge == "none-events":
        for path in copy.glob("*.yaml"):
            path.write_text(re.sub(r'(?m)^\s*eval: ".*"\n', "", path.read_text()))
    return copy


def wait_ready(port: int, timeout: float = 180.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def run_scenario(voxide: list[str], bot: Path, scenario: Path, logs: Path, pipecat: str) -> tuple[str, str]:
    """Runs one scenario against a fresh server of `bot`: ("passed" | "failed", detail)."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{scenario.stem}.server.log", "w") as server_log:
        server = subprocess.Popen(
            [voxide[0], "serve", "--bot", str(bot), "--port", str(PORT), "--node-id", "pipecat-evals",
             "--allow-evals", "--sessions-per-minute-per-ip", "0", *voxide[1:]],
            stdout=server_log, stderr=subprocess.STDOUT,
        )
    try:
        if not wait_ready(PORT):
            return "failed", "the server never became ready"
        result = subprocess.run(
            [pipecat, "eval", "run", scenario.name, "--bot-url", f"ws://127.0.0.1:{PORT}/ws",
             "--timeout", "90", "--logs-dir", str(logs)],
            cwd=scenario.parent, capture_output=True, text=True,
        )
        failures = [l.strip() for l in result.stdout.splitlines() if l.strip().startswith("•")]
        detail = "; ".join(f.lstrip("• ") for f in failures)[:300]
        return ("passed", "") if result.returncode == 0 else ("failed", detail or "see the logs")
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--voxide", default=str(ROOT / "target/release/voxide"))
    parser.add_argument("--judge-url", default=os.environ.get("JUDGE_URL"))
    parser.add_argument("--judge-model", default=os.environ.get("JUDGE_MODEL", "gemma4:12b"))
    parser.add_argument("--no-judge", action="store_true")
    parser.add_argument("--downloads", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--llm", default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "target/pipecat-evals")
    args = parser.parse_args()

    judge = "url" if args.judge_url else ("none-events" if args.no_judge else "none")
    args.out.mkdir(parents=True, exist_ok=True)
    copy = prepared_copy(args.checkout.resolve(), args.out, judge, args.judge_url or "", args.judge_model)
    pipecat = str(Path(sys.executable).parent / "pipecat")
    only = {n for n in args.only.split(",") if n}

    tools = ThreadingServer(("127.0.0.1", TOOLS_PORT), Tools)
    threading.Thread(target=tools.serve_forever, daemon=True).start()

    rows = []
    for path in sorted(copy.glob("*.yaml")):
        if only and path.stem not in only:
            continue
        try:
            bot, needs = scenario_needs(path, "none" if judge == "none" else "given", args.downloads)
        except ValueError:
            continue  # an included fragment (judge_text.yaml, user_audio.yaml), not a scenario
        if needs:
            rows.append((path.stem, "skipped", "needs " + "; ".join(needs)))
            print(f"pipecat_evals: {path.stem}: skipped (needs {'; '.join(needs)})", flush=True)
            continue
        print(f"pipecat_evals: {path.stem}: running against {bot}", flush=True)
        voxide = [args.voxide] + (["--llm", args.llm] if args.llm else [])
        outcome, detail = run_scenario(voxide, BOTS / bot, path, args.out / "logs", pipecat)
        if outcome == "passed" and judge == "none-events":
            outcome = "passed (events only: no judge)"
        llm = f", LLM {args.llm}" if args.llm else ", the embedded LLM"
        rows.append((path.stem, outcome, f"bot {bot}{llm}" + (f"; {detail}" if detail else "")))
        print(f"pipecat_evals: {path.stem}: {outcome} {detail}", flush=True)
    tools.shutdown()

    table = ["| scenario | result | bot, or what it needs |", "|---|---|---|"]
    table += [f"| {name} | {outcome} | {why} |" for name, outcome, why in rows]
    (args.out / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    counts = {k: sum(1 for _, o, _ in rows if o.startswith(k)) for k in ("passed", "failed", "skipped")}
    print(f"pipecat_evals: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped; the table is in {args.out / 'table.md'}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
