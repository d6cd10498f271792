#!/usr/bin/env python3
"""pipecat 1.14's interruption handling on one WAV of scripts/backchannels.py's set.

The WAV (16 kHz mono s16) is the user's microphone, fed at real-time pace in 20 ms frames
(`WavInput`, as `turn_wait.py` feeds it) through pipecat's standard voice pipeline:
`WhisperSTTService` (faster-whisper on the same Whisper tiny.en weights voxide embeds: the
files of `assets/models/whisper-tiny.en` and the vocabulary CTranslate2 wants beside them, a
folder scripts/backchannels.py makes), the user aggregator with Silero VAD and pipecat's default
start strategies (a user turn, and so an interruption, begins at the VAD's start or a
transcript), `OpenAILLMService` and `CartesiaTTSService` pointed at the
provider stand-ins (`stand_in_providers --long-answers N`). The bot's audio is written as a
sound card plays it: each chunk when the one before has played, so an interruption's silence
falls where a listener hears it. Writes the bot's audio as a WAV, and one JSON line per
`InterruptionFrame` that reached the output (`{"type": "interruption", "t_ms": ...}`, from the
WAV's start), as `voxide run --events` writes its own.

    python backchannels.py --stand-ins 127.0.0.1:9000 --whisper assets/models/whisper-tiny.en \\
        [--min-words N] IN.wav OUT.wav EVENTS.jsonl

Turns end on 0.6 s of silence (`SpeechTimeoutUserTurnStopStrategy`, as `TURN=silence bot.py`)
rather than pipecat's default Smart Turn stop: on these questions over a room's floor Smart Turn
v3 in pipecat judged most ends incomplete and held them for its 3 s, so the answer began after
the moment the set talks over it. What is measured here is the start of a turn over the bot.

`--min-words N` starts a user turn (and so interrupts the bot) only on N transcribed words,
pipecat's `MinWordsUserTurnStartStrategy`, instead of the default VAD and transcription
strategies. `scripts/backchannels.py --pipecat PYTHON` runs it on its set and judges the output
as it judges voxide's.
"""

import argparse
import array
import asyncio
import json
import time
import wave

from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EndFrame,
    InterruptionFrame,
    LLMFullResponseStartFrame,
    OutputAudioRawFrame,
    StartFrame,
    TranscriptionFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.cartesia.tts import CartesiaTTSService
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.whisper.stt import WhisperSTTService
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.turns.user_start import MinWordsUserTurnStartStrategy
from pipecat.turns.user_stop import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner
from turn_wait import Clock, WavInput, frames_of

# The Cartesia stand-in's audio rate.
OUT_RATE = 24_000


class SoundCard(BaseOutputTransport):
    """Plays the bot's audio on `clock`, one chunk at a time, into `self.samples`."""

    def __init__(self, clock, seconds, **kwargs):
        super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=OUT_RATE),
                         **kwargs)
        self._clock = clock
        self._playhead = 0.0
        self.samples = array.array("h", bytes(2 * int(seconds * OUT_RATE)))

    async def start(self, frame: StartFrame):
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        now = time.monotonic() - self._clock.t0
        # An idle card starts the chunk now; a busy one when the chunk before has played.
        start = max(self._playhead, now)
        chunk = array.array("h", frame.audio)
        at = int(start * OUT_RATE)
        end = min(len(self.samples), at + len(chunk))
        if at < end:
            self.samples[at:end] = chunk[:end - at]
        self._playhead = start + len(chunk) / OUT_RATE
        # The card holds one chunk: the next write waits until this one begins to play.
        if start > now:
            await asyncio.sleep(start - now)
        return True


# What a session's events are named, as voxide names its own.
EVENTS = {
    InterruptionFrame: "interruption",
    UserStartedSpeakingFrame: "user_started_speaking",
    UserStoppedSpeakingFrame: "user_stopped_speaking",
    LLMFullResponseStartFrame: "llm_started",
    BotStartedSpeakingFrame: "bot_started_speaking",
    BotStoppedSpeakingFrame: "bot_stopped_speaking",
}


class Events(FrameProcessor):
    """Notes each interruption on its way to the output, and the turns' milestones: what the
    user said where it was `heard` (before the user aggregator), the rest on the way out."""

    def __init__(self, clock, events, heard, **kwargs):
        super().__init__(**kwargs)
        self._clock = clock
        self._heard = heard
        self.events = events

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        kind = EVENTS.get(type(frame))
        heard = isinstance(frame, TranscriptionFrame) or kind == "user_started_speaking" \
            or kind == "user_stopped_speaking"
        if heard == self._heard and (kind or isinstance(frame, TranscriptionFrame)):
            event = {"type": kind or "user_transcription",
                     "t_ms": round((time.monotonic() - self._clock.t0) * 1000)}
            if isinstance(frame, TranscriptionFrame):
                event["text"] = frame.text
            self.events.append(event)
        await self.push_frame(frame, direction)


async def main(args):
    logger.remove()
    clock = Clock()
    frames = frames_of(args.input)
    source = WavInput(frames, clock)
    seconds = len(frames) / 50 + 10
    card = SoundCard(clock, seconds)
    events = []
    heard, notes = Events(clock, events, True), Events(clock, events, False)
    host = args.stand_ins
    stt = WhisperSTTService(device="cpu", settings=WhisperSTTService.Settings(model=args.whisper))
    llm = OpenAILLMService(api_key="local", base_url=f"http://{host}/v1",
                           settings=OpenAILLMService.Settings(
                               model="gpt-4o-mini", system_instruction="You are a storyteller."))
    tts = CartesiaTTSService(
        api_key="local", url=f"ws://{host}/tts/websocket", sample_rate=OUT_RATE,
        settings=CartesiaTTSService.Settings(voice="71a7ad14-091c-4e8e-a314-022ece01c121"))
    start = [MinWordsUserTurnStartStrategy(min_words=args.min_words)] if args.min_words else None
    strategies = UserTurnStrategies(
        start=start, stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=0.6)])
    pair = LLMContextAggregatorPair(
        LLMContext(),
        user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer(),
                                            user_turn_strategies=strategies))
    worker = PipelineWorker(
        Pipeline([source, stt, heard, pair.user(), llm, tts, notes, card, pair.assistant()]),
        params=PipelineParams(audio_in_sample_rate=16_000, audio_out_sample_rate=OUT_RATE),
        enable_rtvi=False, idle_timeout_secs=None, check_dangling_tasks=False)
    ready = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def on_started(worker, frame):
        ready.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(ready.wait(), timeout=120)
    clock.t0 = time.monotonic() + 0.05
    clock.started.set()
    await source.done.wait()
    await worker.queue_frame(EndFrame())
    await task
    with wave.open(args.output, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(OUT_RATE)
        w.writeframes(card.samples.tobytes())
    with open(args.events, "w") as f:
        for event in sorted(events, key=lambda e: e["t_ms"]):
            f.write(json.dumps(event) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stand-ins", required=True, help="HOST:PORT of stand_in_providers")
    parser.add_argument("--whisper", required=True,
                        help="the folder of a CTranslate2 Whisper model (model.bin and its files)")
    parser.add_argument("--min-words", type=int, default=0)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("events")
    asyncio.run(main(parser.parse_args()))
