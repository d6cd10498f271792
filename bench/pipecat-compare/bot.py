"""pipecat 1.14's standard voice bot, pointed at voxide's local provider stand-ins.

The same bot a pipecat user writes from the quickstart: SmallWebRTC in and out, Silero VAD and
pipecat's default turn strategy (Smart Turn v3) in the user aggregator, DeepgramSTTService,
OpenAILLMService and CartesiaTTSService. Only the providers' addresses differ: they point at
`cargo run --release --example stand_in_providers` (port 9000 unless STAND_INS says otherwise).

    python bot.py -t webrtc --port 7860     # served by pipecat's development runner

TURN=silence ends turns on 0.6 s of silence (`SpeechTimeoutUserTurnStopStrategy`) instead of
Smart Turn, to measure the framework without the turn model's cost.

`run.sh` in this folder starts it beside the stand-ins and loads it with `voxide loadtest`.
"""

import os
import sys

from loguru import logger

from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.runner.types import RunnerArguments, SmallWebRTCRunnerArguments
from pipecat.services.cartesia.tts import CartesiaTTSService
from pipecat.services.deepgram.stt import DeepgramSTTService
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
from pipecat.turns.user_stop import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

STAND_INS = os.getenv("STAND_INS", "127.0.0.1:9000")


def quiet_log():
    """Debug logging costs CPU in every session, and a load test measures the bot, not its log.

    pipecat's runner sets DEBUG when it starts, so this runs at each session's start.
    """
    logger.remove()
    logger.add(sys.stderr, level=os.getenv("LOG_LEVEL", "WARNING"))


async def bot(runner_args: RunnerArguments):
    quiet_log()
    assert isinstance(runner_args, SmallWebRTCRunnerArguments)
    transport = SmallWebRTCTransport(
        webrtc_connection=runner_args.webrtc_connection,
        params=TransportParams(audio_in_enabled=True, audio_out_enabled=True),
    )
    stt = DeepgramSTTService(api_key="local", base_url=f"ws://{STAND_INS}")
    llm = OpenAILLMService(api_key="local", base_url=f"http://{STAND_INS}/v1", model="gpt-4o-mini")
    tts = CartesiaTTSService(
        api_key="local",
        url=f"ws://{STAND_INS}/tts/websocket",
        voice_id="71a7ad14-091c-4e8e-a314-022ece01c121",
    )
    context = LLMContext(
        [{"role": "system", "content": "You are a helpful voice assistant. Answer briefly."}]
    )
    turn = {}
    if os.getenv("TURN") == "silence":
        turn["user_turn_strategies"] = UserTurnStrategies(
            stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.6)]
        )
    user_params = LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer(), **turn)
    aggregators = LLMContextAggregatorPair(context, user_params=user_params)
    pipeline = Pipeline(
        [
            transport.input(),
            stt,
            aggregators.user(),
            llm,
            tts,
            transport.output(),
            aggregators.assistant(),
        ]
    )
    worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True))

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(_transport, _client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


if __name__ == "__main__":
    from pipecat.runner.run import main

    main()
