//! The TTS stage: streamed LLM text in, speech out, a sentence at a time.
//!
//! LLM text stops here: each complete sentence is synthesised as a job off the async workers, so
//! the first sentence plays while the model is still writing the next, and goes on as a `TtsText`
//! frame carrying its word timings, just before its audio. The assistant aggregator, after the
//! output, records those words as they are played. An interruption aborts the job and drops the
//! rest of the response.

use std::sync::Arc;
use std::time::Instant;

use super::{Speech, TtsEngine};
use crate::audio::resample::StreamResampler;
use crate::frames::{
    AudioFrame, ControlFrame, DataFrame, Frame, FrameBody, MetricsData, StartParams, SystemFrame,
    TtsText,
};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, FramePusher, ProcessorError};

/// Audio frames are cut to this length, so playback can stop within one of them.
const CHUNK_MS: u32 = 20;

/// Turns LLM text into speech with a [`TtsEngine`].
pub struct TtsService {
    engine: Arc<dyn TtsEngine>,
    text: String,
    params: StartParams,
    /// True once this response's first sentence went to synthesis.
    speaking: bool,
    response_started: Option<Instant>,
}

impl TtsService {
    /// A stage speaking with `engine`.
    pub fn new(engine: Arc<dyn TtsEngine>) -> Self {
        Self {
            engine,
            text: String::new(),
            params: StartParams::default(),
            speaking: false,
            response_started: None,
        }
    }

    /// Synthesises `sentence` as this frame's job; `then` goes out after its audio, in order.
    fn speak(&mut self, sentence: String, then: Vec<Frame>, cx: &mut FrameContext<'_>) {
        let first = !self.speaking;
        self.speaking = true;
        let job = Synthesis {
            engine: self.engine.clone(),
            out_rate: self.params.audio_out_sample_rate,
            pusher: cx.pusher(),
            metrics: self.params.enable_metrics,
            usage_metrics: self.params.enable_usage_metrics,
            started: self.response_started.filter(|_| first),
        };
        cx.run(job.run(sentence, first, then));
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
            FrameBody::System(SystemFrame::Start(start)) => self.params = start.params.clone(),
            FrameBody::System(SystemFrame::Interruption) => {
                self.text.clear();
                self.speaking = false;
            }
            FrameBody::Control(ControlFrame::LlmFullResponseStart) => {
                self.text.clear();
                self.speaking = false;
                self.response_started = Some(Instant::now());
            }
            FrameBody::Data(DataFrame::LlmText(text)) if direction == Direction::Downstream => {
                self.text.push_str(text);
                // The first words of a response go out at a clause boundary: the user hears the
                // bot start sooner, and later sentences are ready before they are needed.
                let end = sentence_end(&self.text)
                    .or_else(|| (!self.speaking).then(|| clause_end(&self.text)).flatten());
                if let Some(end) = end {
                    let sentence: String = self.text.drain(..end).collect();
                    self.speak(sentence, Vec::new(), cx);
                }
                return Ok(());
            }
            // Text the app asks the bot to say, outside an LLM response.
            FrameBody::Data(DataFrame::Text(text)) if direction == Direction::Downstream => {
                let text = text.clone();
                self.speaking = false;
                self.response_started = Some(Instant::now());
                self.speak(text, vec![ControlFrame::TtsStopped.into()], cx);
                cx.push(frame, direction);
                return Ok(());
            }
            FrameBody::Control(ControlFrame::LlmFullResponseEnd) => {
                let rest = std::mem::take(&mut self.text);
                if rest.trim().is_empty() {
                    if self.speaking {
                        cx.push_downstream(ControlFrame::TtsStopped);
                    }
                    cx.push(frame, direction);
                } else {
                    // The end of the response follows the last sentence's audio.
                    self.speak(rest, vec![ControlFrame::TtsStopped.into(), frame], cx);
                }
                self.speaking = false;
                return Ok(());
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// The byte index just past the first complete sentence: `.`, `!` or `?` (or a newline)
/// followed by whitespace, with at least a few characters before it.
fn sentence_end(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_is_space = chars.peek().is_some_and(|(_, n)| n.is_whitespace());
        let ends = matches!(c, '.' | '!' | '?') && next_is_space || c == '\n';
        if ends && text[..i].trim().chars().count() >= 3 {
            return Some(i + c.len_utf8());
        }
    }
    None
}

/// Characters a first clause needs before it is spoken on its own.
const MIN_CLAUSE_CHARS: usize = 24;

/// The byte index just past the first clause (`,` `;` `:` followed by whitespace) that has at
/// least [`MIN_CLAUSE_CHARS`] before it.
fn clause_end(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_is_space = chars.peek().is_some_and(|(_, n)| n.is_whitespace());
        if matches!(c, ',' | ';' | ':')
            && next_is_space
            && text[..i].trim().chars().count() >= MIN_CLAUSE_CHARS
        {
            return Some(i + c.len_utf8());
        }
    }
    None
}

/// One sentence's synthesis, pushed as 20 ms audio frames at the output rate.
struct Synthesis {
    engine: Arc<dyn TtsEngine>,
    out_rate: u32,
    pusher: FramePusher,
    metrics: bool,
    usage_metrics: bool,
    started: Option<Instant>,
}

impl Synthesis {
    async fn run(
        self,
        sentence: String,
        first: bool,
        then: Vec<Frame>,
    ) -> Result<(), ProcessorError> {
        let down = Direction::Downstream;
        let text = sentence.trim().to_owned();
        if !text.is_empty() {
            let engine = self.engine.clone();
            let to_speak = text.clone();
            let speech = tokio::task::spawn_blocking(move || engine.synthesize(&to_speak))
                .await
                .map_err(|e| ProcessorError::new(format!("speech synthesis stopped: {e}")))?
                .map_err(|e| ProcessorError::new(e.to_string()))?;
            if first {
                let _ = self
                    .pusher
                    .push(ControlFrame::TtsStarted.into(), down)
                    .await;
                if let (true, Some(started)) = (self.metrics, self.started) {
                    let ttfb = MetricsData::Ttfb {
                        processor: self.pusher.name().to_owned(),
                        model: Some(self.engine.name().to_owned()),
                        seconds: started.elapsed().as_secs_f64(),
                    };
                    let _ = self
                        .pusher
                        .push(SystemFrame::Metrics(vec![ttfb]).into(), down)
                        .await;
                }
            }
            let tts_text = TtsText {
                text: text.clone(),
                spoken: true,
                words: (!speech.words.is_empty()).then(|| speech.words.clone().into()),
            };
            let _ = self
                .pusher
                .push(DataFrame::TtsText(tts_text).into(), down)
                .await;
            for chunk in chunks(&speech, self.out_rate)? {
                let _ = self
                    .pusher
                    .push(DataFrame::OutputAudio(chunk).into(), down)
                    .await;
            }
            if self.usage_metrics {
                let usage = MetricsData::TtsUsage {
                    processor: self.pusher.name().to_owned(),
                    characters: text.chars().count() as u64,
                };
                let _ = self
                    .pusher
                    .push(SystemFrame::Metrics(vec![usage]).into(), down)
                    .await;
            }
        }
        for frame in then {
            let _ = self.pusher.push(frame, down).await;
        }
        Ok(())
    }
}

/// The speech at `rate`, cut into 20 ms frames.
fn chunks(speech: &Speech, rate: u32) -> Result<Vec<AudioFrame>, ProcessorError> {
    let samples = if speech.sample_rate == rate {
        speech.samples.clone()
    } else {
        let mut resampler = StreamResampler::new(speech.sample_rate, rate)
            .map_err(|e| ProcessorError::new(e.to_string()))?;
        let delay = resampler.delay();
        let expected = speech.samples.len() * rate as usize / speech.sample_rate as usize;
        let mut out = resampler.process(&speech.samples);
        // Flush the resampler's tail with silence, then drop its delay.
        out.extend(resampler.process(&vec![0; speech.sample_rate as usize / 25]));
        out.into_iter().skip(delay).take(expected).collect()
    };
    let per_chunk = (rate * CHUNK_MS / 1000) as usize;
    Ok(samples
        .chunks(per_chunk.max(1))
        .map(|c| AudioFrame::new(c.to_vec(), rate, 1))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_end_at_punctuation_followed_by_space() {
        assert_eq!(sentence_end("Hello there. How"), Some(12));
        assert_eq!(sentence_end("It costs 3.5 euros"), None);
        assert_eq!(sentence_end("Hi. "), None, "too short to say alone");
        assert_eq!(sentence_end("Sure!\nNext"), Some(5));
        assert_eq!(sentence_end("Wait"), None);
    }

    #[test]
    fn a_first_clause_ends_at_a_comma_once_it_is_long_enough() {
        assert_eq!(clause_end("Sure, I can"), None, "too short to say alone");
        let text = "The weather in Paris is mild, with a breeze";
        assert_eq!(clause_end(text), Some(29));
        assert_eq!(clause_end("It costs 1,500 euros in total today"), None);
    }
}
