"""voxide's console page in front of pipecat's own SmallWebRTC bot, for `tests/browser.rs`.

The bot is pipecat 1.14's standard voice bot (`bench/pipecat-compare/bot.py`: Silero VAD and
Smart Turn, DeepgramSTTService, OpenAILLMService and CartesiaTTSService pointed at voxide's
provider stand-ins). This serves voxide's page at `/` and pipecat's own SmallWebRTC request
handler at `/api/offer`, the route the page posts its offer to, so the page talks to pipecat
exactly as it talks to voxide, with only what pipecat's RTVI messages carry.

    STAND_INS=127.0.0.1:9000 target/venv-evals/bin/python tests/pipecat_bot/serve.py --port 7861

Needs pipecat-ai[webrtc,deepgram,cartesia,openai,runner]==1.14.0 (`scripts/evals.sh
--setup-only` installs it into target/venv-evals).
"""

import argparse
import asyncio
import sys
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "pipecat-compare"))

from bot import bot  # noqa: E402  (pipecat's standard bot, shared with the benchmark)
from pipecat.runner.types import SmallWebRTCRunnerArguments  # noqa: E402
from pipecat.transports.smallwebrtc.request_handler import (  # noqa: E402
    SmallWebRTCRequest,
    SmallWebRTCRequestHandler,
)

app = FastAPI()
handler = SmallWebRTCRequestHandler()
sessions: set[asyncio.Task] = set()


@app.get("/")
async def page():
    return FileResponse(ROOT / "assets" / "web" / "index.html", media_type="text/html")


@app.get("/healthz")
async def healthz():
    return {"ok": True}


@app.post("/api/offer")
async def offer(request: Request):
    body = SmallWebRTCRequest.from_dict(await request.json())

    async def start(connection):
        args = SmallWebRTCRunnerArguments(webrtc_connection=connection)
        args.handle_sigint = False
        task = asyncio.create_task(bot(args))
        sessions.add(task)
        task.add_done_callback(sessions.discard)

    return JSONResponse(await handler.handle_web_request(body, start))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=7861)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
