#!/usr/bin/env python3
"""When pipecat 1.14's default turn strategy ends each turn of recorded WAVs.

Each WAV (16 kHz mono s16) is one session, all at once in one process, fed at real-time pace in
20 ms frames through a `BaseInputTransport` into the user aggregator with pipecat's defaults:
Silero VAD, the default start strategies and `TurnAnalyzerUserTurnStopStrategy` with
`LocalSmartTurnAnalyzerV3` (no STT here, so `wait_for_transcript=False`: the turn ends when the
model and its timeouts say, which is the least pipecat's default could wait). Prints one JSON
object: for each WAV, the seconds from its start at which a `UserStoppedSpeakingFrame` (the
turn's end) left the aggregator.

    python turn_wait.py A.wav [B.wav ...]

`scripts/turn_wait.py --pipecat PYTHON` runs it on its own WAVs and judges the times as it
judges voxide's.
"""

import asyncio
import json
import sys
import time
import wave

from loguru import logger
from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import EndFrame, InputAudioRawFrame, StartFrame, UserStoppedSpeakingFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.turns.user_stop import TurnAnalyzerUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

RATE = 16_000
FRAME = RATE // 50  # 20 ms
TAIL_S = 4.0


class WavInput(BaseInputTransport):
    """Plays a WAV's frames at real-time pace from `clock.t0`."""

    def __init__(self, frames, clock, **kwargs):
        super().__init__(TransportParams(audio_in_enabled=True, audio_in_sample_rate=RATE), **kwargs)
        self._frames = frames
        self._clock = clock
        self._feeder = None
        self.done = asyncio.Event()

    async def start(self, frame: StartFrame):
        await super().start(frame)
        await self.set_transport_ready(frame)
        if not self._feeder:
            self._feeder = self.create_task(self._feed())

    async def stop(self, frame: EndFrame):
        if self._feeder:
            await self.cancel_task(self._feeder)
            self._feeder = None
        await super().stop(frame)

    async def _feed(self):
        await self._clock.started.wait()
        silence = b"\0" * (FRAME * 2)
        tail = int(TAIL_S * 50)
        for i, audio in enumerate(self._frames + [silence] * tail):
            delay = self._clock.t0 + i * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.push_audio_frame(InputAudioRawFrame(audio=audio, sample_rate=RATE,
                                                           num_channels=1))
        self.done.set()


class TurnEnds(FrameProcessor):
    """Notes when each turn's end passes."""

    def __init__(self, clock, **kwargs):
        super().__init__(**kwargs)
        self._clock = clock
        self.ends = []

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if isinstance(frame, UserStoppedSpeakingFrame):
            self.ends.append(round(time.monotonic() - self._clock.t0, 3))
        if not isinstance(frame, InputAudioRawFrame):
            await self.push_frame(frame, direction)


class Clock:
    def __init__(self):
        self.started = asyncio.Event()
        self.t0 = 0.0


def frames_of(path):
    with wave.open(path) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (RATE, 1, 2):
            raise SystemExit(f"{path}: need 16 kHz mono 16-bit PCM")
        data = w.readframes(w.getnframes())
    step = FRAME * 2
    return [data[i:i + step] for i in range(0, len(data) - step + 1, step)]


async def main(paths):
    logger.remove()
    clock = Clock()
    sessions = []
    ready = asyncio.Event()
    started = []
    for path in paths:
        source = WavInput(frames_of(path), clock)
        strategies = UserTurnStrategies(stop=[TurnAnalyzerUserTurnStopStrategy(
            turn_analyzer=LocalSmartTurnAnalyzerV3(), wait_for_transcript=False)])
        pair = LLMContextAggregatorPair(LLMContext(), user_params=LLMUserAggregatorParams(
            vad_analyzer=SileroVADAnalyzer(), user_turn_strategies=strategies))
        ends = TurnEnds(clock)
        worker = PipelineWorker(Pipeline([source, pair.user(), ends]),
                                params=PipelineParams(audio_in_sample_rate=RATE),
                                enable_rtvi=False, idle_timeout_secs=None,
                                check_dangling_tasks=False)

        @worker.event_handler("on_pipeline_started")
        async def on_started(worker, frame):
            started.append(worker)
            if len(started) == len(paths):
                ready.set()

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        sessions.append((path, source, ends, worker, asyncio.create_task(runner.run())))
    await asyncio.wait_for(ready.wait(), timeout=120)
    clock.t0 = time.monotonic() + 0.05
    clock.started.set()
    await asyncio.gather(*(source.done.wait() for _, source, _, _, _ in sessions))
    for _, _, _, worker, _ in sessions:
        await worker.queue_frame(EndFrame())
    await asyncio.gather(*(task for *_, task in sessions))
    print(json.dumps({path: ends.ends for path, _, ends, _, _ in sessions}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
