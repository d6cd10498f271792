//! The TTS stage: streamed LLM text in, speech out, on a streaming [`TtsEngine`].
//!
//! LLM text stops here. Each assistant turn gets one [`TtsContext`]: its text goes in as it comes
//! (a sentence at a time, a first clause alone so the bot starts sooner, or token by token to a
//! voice that buffers itself), and a background pump pushes the audio as 20 ms frames at the
//! output rate, each piece of text going on as a `TtsText` frame with its word timings just
//! before its audio. The assistant aggregator, after the output, records those words as they are
//! played. The turn's end waits for its last audio. An interruption drops the context (the voice
//! cancels it) and stops its pump: nothing it still makes is pushed.
//!
//! A guessed answer's first words ([`DataFrame::TtsGuess`], preemptive generation) are spoken
//! ahead in a context of their own with the audio held. When a response's first words are the
//! same, its pump plays the held speech and then the context of the rest; otherwise, or when the
//! user speaks again, the held speech is thrown away.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot, watch};

use super::WordTiming;
use super::stream::{EVENT_QUEUE, TextUnit, TtsEngine, TtsEvent, TtsInput};
use voxide_core::events::Event;
use voxide_core::frames::{
    AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, MetricsData, StartParams, SystemFrame,
    TtsText,
};
use voxide_core::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};
use voxide_core::text::{first_words_end, sentence_end};
use voxide_engines::audio::resample::StreamResampler;

/// Audio frames are cut to this length, so playback can stop within one of them.
const CHUNK_MS: u32 = 20;

/// The context of the turn being spoken.
struct Current {
    input: mpsc::Sender<TtsInput>,
    /// Fires when the pump has pushed everything the context made.
    finished: oneshot::Receiver<()>,
}

/// Speech of a guessed answer's first words, made before the answer was asked for.
struct Ahead {
    /// The words, as the response will send them.
    text: String,
    /// Their context, flushed once the speech is taken; dropped unflushed, the voice cancels it.
    input: mpsc::Sender<TtsInput>,
    /// Its speech, held; its usage is reported as it comes, used or not. Taken when played.
    events: Option<mpsc::Receiver<TtsEvent>>,
    /// Where a voice switch held in it is reported, should it be thrown away.
    pusher: FramePusher,
}

impl Drop for Ahead {
    /// Thrown away: a voice that switched while it was spoken is still news, as later turns
    /// start on the new voice and say nothing of it.
    fn drop(&mut self) {
        if let Some(events) = self.events.as_mut() {
            events.close();
            report_switches(&self.pusher, std::iter::from_fn(|| events.try_recv().ok()));
        }
    }
}

/// Turns LLM text into speech with a [`TtsEngine`].
pub struct TtsService {
    engine: Arc<dyn TtsEngine>,
    text: String,
    params: StartParams,
    current: Option<Current>,
    /// True once this response's first text went to the voice.
    speaking: bool,
    /// True between a response's start and end.
    responding: bool,
    ahead: Option<Ahead>,
    response_started: Option<Instant>,
    /// Bumped by each interruption: a pump of an older generation pushes nothing more.
    generation: watch::Sender<u64>,
}

impl TtsService {
    /// A stage speaking with `engine`.
    pub fn new(engine: Arc<dyn TtsEngine>) -> Self {
        Self {
            engine,
            text: String::new(),
            params: StartParams::default(),
            current: None,
            speaking: false,
            responding: false,
            ahead: None,
            response_started: None,
            generation: watch::Sender::new(0),
        }
    }

    /// Speaks guess `id`'s first words ahead, holding the audio.
    fn speak_ahead(&mut self, id: u64, text: String, cx: &mut FrameContext<'_>) {
        self.ahead = None;
        let context = self.engine.open();
        let (held, events) = mpsc::channel(EVENT_QUEUE);
        cx.spawn(hold(
            id,
            context.events,
            held,
            Usage {
                pusher: cx.pusher(),
                engine: self.engine.model().to_owned(),
                enabled: self.params.enable_usage_metrics,
            },
        ));
        if context.input.try_send(TtsInput::Text(text.clone())).is_ok() {
            self.ahead = Some(Ahead {
                text,
                input: context.input,
                events: Some(events),
                pusher: cx.pusher(),
            });
        }
    }

    /// The speech made ahead for `text`, flushed, if these are the words it was made for.
    fn take_ahead(&mut self, text: &str) -> Option<mpsc::Receiver<TtsEvent>> {
        let mut ahead = self.ahead.take()?;
        if ahead.text.trim() != text.trim() {
            return None;
        }
        // A fresh context holds one text: its flush has room.
        ahead.input.try_send(TtsInput::Flush).ok()?;
        ahead.events.take()
    }

    /// Sends `text` to the turn's context, opening it (and its pump) first if needed. A first
    /// sentence that was spoken ahead is not sent: the pump plays the held speech first.
    fn say(&mut self, text: String, cx: &mut FrameContext<'_>) {
        if self.current.is_none() {
            let ahead = (!self.speaking).then(|| self.take_ahead(&text)).flatten();
            let spoken_ahead = ahead.is_some();
            self.open(ahead, cx);
            self.speaking = true;
            if spoken_ahead {
                return;
            }
        }
        self.speaking = true;
        self.send(TtsInput::Text(text), cx);
    }

    /// Opens the turn's context and its pump, which plays `ahead` (speech made ahead) first.
    fn open(&mut self, ahead: Option<mpsc::Receiver<TtsEvent>>, cx: &mut FrameContext<'_>) {
        let mut context = self.engine.open();
        if let Some(ahead) = ahead {
            let (events, chained) = mpsc::channel(EVENT_QUEUE);
            let rest = std::mem::replace(&mut context.events, chained);
            cx.spawn(chain(ahead, rest, events, self.engine.sample_rate()));
        }
        let (done, finished) = oneshot::channel();
        let pump = Pump {
            engine: self.engine.model().to_owned(),
            pusher: cx.pusher(),
            out: Rate::new(self.engine.sample_rate(), self.params.audio_out_sample_rate),
            metrics: self.params.enable_metrics,
            usage_metrics: self.params.enable_usage_metrics,
            asked: Instant::now(),
            generation: *self.generation.borrow(),
            current: self.generation.subscribe(),
            pushed_secs: 0.0,
            started: false,
        };
        cx.spawn(pump.run(context.events, done));
        self.current = Some(Current {
            input: context.input,
            finished,
        });
    }

    fn send(&self, input: TtsInput, cx: &mut FrameContext<'_>) {
        if let Some(current) = &self.current
            && let Err(mpsc::error::TrySendError::Full(input)) = current.input.try_send(input)
        {
            let sender = current.input.clone();
            cx.spawn(async move {
                let _ = sender.send(input).await;
                Ok(())
            });
        }
    }

    /// Flushes the turn's context; `then` goes out once its last audio did, in order.
    fn finish(&mut self, then: Vec<Frame>, cx: &mut FrameContext<'_>) {
        self.send(TtsInput::Flush, cx);
        let finished = self.current.take().map(|c| c.finished);
        let pusher = cx.pusher();
        cx.run(async move {
            if let Some(finished) = finished {
                // Closed without a word: the pump stopped (an error it reported).
                let _ = finished.await;
            }
            for frame in then {
                let _ = pusher.push(frame, Direction::Downstream).await;
            }
            Ok(())
        });
    }

    /// Drops the turn's context: its pump pushes nothing more, and the voice cancels it.
    fn cancel(&mut self) {
        self.generation.send_modify(|g| *g += 1);
        self.current = None;
        self.ahead = None;
        self.text.clear();
        self.speaking = false;
    }
}

impl FrameProcessor for TtsService {
    fn name(&self) -> &str {
        "TtsService"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::System(SystemFrame::Start(start)) => {
                self.params = start.params.clone();
                self.engine.warm();
            }
            FrameBody::System(SystemFrame::Interruption) => self.cancel(),
            // The user goes on: the guess was not the turn.
            FrameBody::System(
                SystemFrame::VadUserStartedSpeaking | SystemFrame::VadSpeechResumed,
            ) => self.ahead = None,
            // A text session: the words go on unspoken, for the assistant aggregator to keep.
            FrameBody::Data(DataFrame::LlmText(_) | DataFrame::Text(_)) if self.params.skip_tts => {
            }
            FrameBody::Data(DataFrame::TtsGuess { .. }) if self.params.skip_tts => return Ok(()),
            FrameBody::Data(DataFrame::TtsGuess { id, text }) => {
                // Too late once a response is under way: it brings its own words.
                if !self.responding && self.engine.text_unit() == TextUnit::Sentence {
                    self.speak_ahead(*id, text.clone(), cx);
                }
                return Ok(());
            }
            FrameBody::Control(ControlFrame::LlmFullResponseStart) => {
                self.text.clear();
                self.speaking = false;
                self.responding = true;
                self.response_started = Some(Instant::now());
            }
            FrameBody::Data(DataFrame::LlmText(text)) if direction == Direction::Downstream => {
                if self.engine.text_unit() == TextUnit::Token {
                    self.say(text.clone(), cx);
                    return Ok(());
                }
                self.text.push_str(text);
                // The first words of a response go out at a clause boundary: the user hears the
                // bot start sooner, and later sentences are ready before they are needed.
                let end = if self.speaking {
                    sentence_end(&self.text)
                } else {
                    first_words_end(&self.text)
                };
                if let Some(end) = end {
                    let sentence: String = self.text.drain(..end).collect();
                    self.say(sentence, cx);
                }
                return Ok(());
            }
            // Text the app asks the bot to say, outside an LLM response.
            FrameBody::Data(DataFrame::Text(text)) if direction == Direction::Downstream => {
                if self.current.is_some() {
                    // Inside a response: said in its place, between the response's sentences.
                    self.say(text.clone(), cx);
                } else {
                    self.response_started = Some(Instant::now());
                    self.say(text.clone(), cx);
                    self.finish(vec![ControlFrame::TtsStopped.into()], cx);
                    self.speaking = false;
                }
                cx.push(frame, direction);
                return Ok(());
            }
            FrameBody::Control(ControlFrame::LlmFullResponseEnd) => {
                let rest = std::mem::take(&mut self.text);
                if !rest.trim().is_empty() {
                    self.say(rest, cx);
                }
                if self.speaking {
                    // The end of the response follows the last audio.
                    self.finish(vec![ControlFrame::TtsStopped.into(), frame], cx);
                } else {
                    cx.push(frame, direction);
                }
                self.speaking = false;
                self.responding = false;
                // Speech made ahead for this response and not used will not be.
                self.ahead = None;
                return Ok(());
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Pushes one context's speech.
struct Pump {
    engine: String,
    pusher: FramePusher,
    out: Rate,
    metrics: bool,
    usage_metrics: bool,
    /// When the context got its first text.
    asked: Instant,
    generation: u64,
    current: watch::Receiver<u64>,
    /// Seconds of the context's audio pushed so far.
    pushed_secs: f64,
    started: bool,
}

impl Pump {
    async fn run(
        mut self,
        mut events: mpsc::Receiver<TtsEvent>,
        done: oneshot::Sender<()>,
    ) -> Result<(), ProcessorError> {
        while let Some(event) = events.recv().await {
            let live = match event {
                TtsEvent::Words { text, words } => self.words(text, words).await,
                TtsEvent::Audio(samples) => self.audio(samples).await,
                TtsEvent::Characters(characters) => {
                    if self.usage_metrics {
                        let usage = tts_usage(&self.pusher, &self.engine, characters);
                        self.push(usage).await
                    } else {
                        true
                    }
                }
                TtsEvent::Done => {
                    let tail = self.out.finish();
                    if !self.push_audio(tail).await {
                        return Ok(());
                    }
                    break;
                }
                TtsEvent::Switched { from, to, reason } => {
                    self.pusher.emit(Event::TtsFallback { from, to, reason });
                    true
                }
                TtsEvent::Error(message) | TtsEvent::Failed(message) => {
                    if self.is_live() {
                        self.pusher.push_error(message).await;
                    }
                    break;
                }
            };
            if !live {
                return Ok(());
            }
        }
        let _ = done.send(());
        Ok(())
    }

    fn is_live(&self) -> bool {
        *self.current.borrow() == self.generation
    }

    /// Pushes `frame` downstream unless the turn was interrupted first; says whether it is live.
    async fn push(&mut self, frame: Frame) -> bool {
        if !self.is_live() {
            return false;
        }
        let generation = self.generation;
        let pusher = self.pusher.clone();
        tokio::select! {
            biased;
            _ = self.current.wait_for(|g| *g != generation) => false,
            _ = pusher.push(frame, Direction::Downstream) => true,
        }
    }

    async fn words(&mut self, text: String, words: Vec<WordTiming>) -> bool {
        if !self.begin().await {
            return false;
        }
        // Timings are from the context's start; the frame's are from the audio after it.
        let words: Vec<WordTiming> = words
            .into_iter()
            .map(|w| WordTiming {
                word: w.word,
                start_secs: w.start_secs - self.pushed_secs,
                end_secs: w.end_secs - self.pushed_secs,
            })
            .collect();
        let tts_text = TtsText {
            text,
            spoken: true,
            words: (!words.is_empty()).then(|| words.into()),
        };
        self.push(DataFrame::TtsText(tts_text).into()).await
    }

    /// The context's first speech: `TtsStarted`, and the time to it.
    async fn begin(&mut self) -> bool {
        if self.started {
            return true;
        }
        self.started = true;
        if !self.push(ControlFrame::TtsStarted.into()).await {
            return false;
        }
        if self.metrics {
            let ttfb = MetricsData::Ttfb {
                processor: self.pusher.name().to_owned(),
                model: Some(self.engine.clone()),
                seconds: self.asked.elapsed().as_secs_f64(),
            };
            return self.push(SystemFrame::Metrics(vec![ttfb]).into()).await;
        }
        true
    }

    async fn audio(&mut self, samples: Vec<i16>) -> bool {
        if !self.begin().await {
            return false;
        }
        self.pushed_secs += samples.len() as f64 / f64::from(self.out.from.max(1));
        let resampled = self.out.process(&samples);
        self.push_audio(resampled).await
    }

    /// Pushes audio at the output rate as 20 ms frames (a last shorter one for the rest).
    async fn push_audio(&mut self, samples: Vec<i16>) -> bool {
        let per_chunk = (self.out.to * CHUNK_MS / 1000).max(1) as usize;
        for chunk in samples.chunks(per_chunk) {
            let frame = AudioFrame::new(chunk.to_vec(), self.out.to, 1);
            if !self.push(DataFrame::OutputAudio(frame).into()).await {
                return false;
            }
        }
        true
    }
}

/// Where speech made ahead reports its usage.
struct Usage {
    pusher: FramePusher,
    engine: String,
    enabled: bool,
}

/// The usage report of `characters` spoken by `engine`.
fn tts_usage(pusher: &FramePusher, engine: &str, characters: u64) -> Frame {
    let usage = MetricsData::TtsUsage {
        processor: pusher.name().to_owned(),
        model: Some(engine.to_owned()),
        characters,
        cost_usd: crate::pricing::tts_cost(engine, characters),
    };
    SystemFrame::Metrics(vec![usage]).into()
}

/// Reports the voice switches among `events`, which nothing else will read.
fn report_switches(pusher: &FramePusher, events: impl Iterator<Item = TtsEvent>) {
    for event in events {
        if let TtsEvent::Switched { from, to, reason } = event {
            pusher.emit(Event::TtsFallback { from, to, reason });
        }
    }
}

/// Holds the events of guess `id`'s context spoken ahead in `held`, reporting its characters as
/// they come (they are paid for whether or not the speech is played) and its first audio
/// upstream ([`SystemFrame::GuessSpoken`]).
async fn hold(
    id: u64,
    mut events: mpsc::Receiver<TtsEvent>,
    held: mpsc::Sender<TtsEvent>,
    usage: Usage,
) -> Result<(), ProcessorError> {
    let mut spoken = false;
    while let Some(event) = events.recv().await {
        if let TtsEvent::Characters(characters) = event {
            if usage.enabled {
                let metrics = tts_usage(&usage.pusher, &usage.engine, characters);
                let _ = usage.pusher.push(metrics, Direction::Downstream).await;
            }
            continue;
        }
        if matches!(event, TtsEvent::Audio(_)) && !std::mem::replace(&mut spoken, true) {
            // The turn stage's hold on a finished turn has nothing more to wait for.
            let _ = usage
                .pusher
                .push(SystemFrame::GuessSpoken(id).into(), Direction::Upstream)
                .await;
        }
        if let Err(unsent) = held.send(event).await {
            // Thrown away: dropping the context cancels it. A voice that switched while it
            // spoke is still news: later turns start on the new voice and say nothing of it.
            events.close();
            let rest = std::iter::from_fn(|| events.try_recv().ok());
            report_switches(&usage.pusher, std::iter::once(unsent.0).chain(rest));
            return Ok(());
        }
    }
    Ok(())
}

/// Plays the speech made ahead (without its end), then the rest of the response's context, with
/// the rest's word timings moved past the speech before them.
async fn chain(
    mut ahead: mpsc::Receiver<TtsEvent>,
    mut rest: mpsc::Receiver<TtsEvent>,
    events: mpsc::Sender<TtsEvent>,
    sample_rate: u32,
) -> Result<(), ProcessorError> {
    let mut offset = 0.0;
    while let Some(event) = ahead.recv().await {
        match &event {
            TtsEvent::Done => break,
            TtsEvent::Audio(samples) => {
                offset += samples.len() as f64 / f64::from(sample_rate.max(1));
            }
            _ => {}
        }
        let failed = matches!(event, TtsEvent::Error(_) | TtsEvent::Failed(_));
        if events.send(event).await.is_err() || failed {
            return Ok(());
        }
    }
    while let Some(mut event) = rest.recv().await {
        if let TtsEvent::Words { words, .. } = &mut event {
            for word in words {
                word.start_secs += offset;
                word.end_secs += offset;
            }
        }
        if events.send(event).await.is_err() {
            break;
        }
    }
    Ok(())
}

/// One context's audio, from the voice's rate to the output's: one resampler for the whole
/// context, so its pieces join without a seam.
struct Rate {
    from: u32,
    to: u32,
    resampler: Option<StreamResampler>,
    /// The resampler's delay still to drop from the front.
    skip: usize,
    /// Samples taken in and given out, to cut the flushed tail to length.
    taken: usize,
    given: usize,
}

impl Rate {
    fn new(from: u32, to: u32) -> Self {
        let resampler = (from != to)
            .then(|| StreamResampler::new(from, to))
            .and_then(|r| {
                r.map_err(|e| tracing::warn!(error = %e, from, to, "no TTS resampler; audio passes as it is"))
                    .ok()
            });
        let skip = resampler.as_ref().map_or(0, StreamResampler::delay);
        // Without a resampler the audio passes as it is, at its own rate.
        let to = if resampler.is_some() { to } else { from };
        Self {
            from,
            to,
            resampler,
            skip,
            taken: 0,
            given: 0,
        }
    }

    fn process(&mut self, samples: &[i16]) -> Vec<i16> {
        let Some(resampler) = &mut self.resampler else {
            return samples.to_vec();
        };
        self.taken += samples.len();
        let mut out = resampler.process(samples);
        let skipped = self.skip.min(out.len());
        out.drain(..skipped);
        self.skip -= skipped;
        self.given += out.len();
        out
    }

    /// The resampler's tail, flushed with silence and cut to the length the input asks for.
    fn finish(&mut self) -> Vec<i16> {
        let Some(resampler) = &mut self.resampler else {
            return Vec::new();
        };
        let expected = self.taken * self.to as usize / self.from as usize;
        let mut out = resampler.process(&vec![0; self.from as usize / 25]);
        let skipped = self.skip.min(out.len());
        out.drain(..skipped);
        self.skip -= skipped;
        out.truncate(expected.saturating_sub(self.given));
        self.given += out.len();
        out
    }
}
