//! A segment decoder (Whisper) as a streaming engine: the audio between the VAD's start and stop
//! is one utterance, decoded off the async workers.
//!
//! Each utterance begins with the [`Preroll`]'s audio from before the VAD confirmed speech, so
//! its first words are not lost. While the user speaks, the growing utterance is re-decoded
//! for interim transcripts: 0.2 s after the VAD's start, every quarter second until 1.2 s, then
//! every half second; at the finalize (the VAD's stop) the whole utterance is decoded for the
//! final one. Better: at the first silence after speech the utterance so far is decoded at once
//! and its words are settled ([`SttEvent::Settled`]: the turn may be guessed on them), and when
//! that silence becomes the VAD's stop, those words are the final ones, ready a stop delay
//! sooner; speech that resumes makes a new silence start and a new decode. One worker per stream runs the requests in order and skips interim ones that
//! a newer request made stale; an interim decode under way is given up between two tokens when
//! a pause's, a stop's or a window's request comes, so the words at a pause never wait for it.
//!
//! Whisper hears 30 s at most. A turn spoken without a pause longer than that is cut into
//! windows: when the utterance reaches [`MAX_WINDOW_SECS`], it is cut at the quietest 20 ms of
//! its last [`CUT_SEARCH_SECS`] (between words, as a rule), the window is decoded at once and its
//! words open every later transcript of the turn. The utterance held never grows past a window,
//! and nothing said is lost.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::SttError;
use super::preroll::Preroll;
use super::stream::{EVENT_QUEUE, INPUT_QUEUE, SttEngine, SttEvent, SttInput, SttStream};
use voxide_engines::audio::mel;

/// Something that transcribes one utterance of 16 kHz mono audio. Blocking: the stream calls it
/// off the async workers.
pub trait Transcriber: Send + Sync + 'static {
    /// The engine's name, for metrics.
    fn name(&self) -> &str;

    /// The words in `audio` (16 kHz, [-1, 1]).
    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError>;

    /// The words so far of an utterance still going on, for an interim transcript: as
    /// [`Transcriber::transcribe`], minus any pains taken over final words. Given up (`None`)
    /// once `wanted` says no: newer audio is waiting to be heard, and the words at a pause
    /// must not wait for a transcript nobody will read.
    fn transcribe_partial(
        &self,
        audio: &[f32],
        wanted: &dyn Fn() -> bool,
    ) -> Result<Option<String>, SttError> {
        if !wanted() {
            return Ok(None);
        }
        self.transcribe(audio).map(Some)
    }

    /// The words at a pause that may end the utterance: as [`Transcriber::transcribe`], pains
    /// and all, but given up (`None`) once `wanted` says no: the speech went on to a later
    /// pause, whose words are the ones waited for.
    fn transcribe_while(
        &self,
        audio: &[f32],
        wanted: &dyn Fn() -> bool,
    ) -> Result<Option<String>, SttError> {
        if !wanted() {
            return Ok(None);
        }
        self.transcribe(audio).map(Some)
    }
}

impl Transcriber for super::Whisper {
    fn name(&self) -> &str {
        "whisper"
    }

    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
        super::Whisper::transcribe(self, audio)
    }
}

impl Transcriber for super::PromptedWhisper {
    fn name(&self) -> &str {
        "whisper"
    }

    fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
        super::PromptedWhisper::transcribe(self, audio)
    }

    /// Without the second listen: the words of a request half said read as garbled.
    fn transcribe_partial(
        &self,
        audio: &[f32],
        wanted: &dyn Fn() -> bool,
    ) -> Result<Option<String>, SttError> {
        super::PromptedWhisper::transcribe_partial(self, audio, wanted)
    }

    fn transcribe_while(
        &self,
        audio: &[f32],
        wanted: &dyn Fn() -> bool,
    ) -> Result<Option<String>, SttError> {
        super::PromptedWhisper::transcribe_while(self, audio, wanted)
    }
}

/// The longest audio decoded at once: Whisper's 30 s, less room for the pre-roll.
pub const MAX_WINDOW_SECS: f32 = 28.0;
/// How far back from a full window the cut looks for a quiet moment.
const CUT_SEARCH_SECS: f32 = 2.0;
/// Windows a turn keeps the words of (an hour of speech without a pause); past that, the
/// oldest go.
const MAX_WINDOWS: usize = 128;
/// New audio between two interim transcripts.
const INTERIM_SECS: f32 = 0.5;
/// Speech after the VAD's start before the first interim transcript: sooner than the rest, as
/// the first words decide whether speech over the bot interrupts it ("wait") or not ("yeah").
const FIRST_INTERIM_SECS: f32 = 0.2;
/// New audio between two interim transcripts while the utterance is young (its first
/// [`EARLY_SECS`]): a first reading too short to tell a reaction from a request ("1." for "one
/// moment", "8." for "hey, listen") is read again sooner than half a second later.
const EARLY_INTERIM_SECS: f32 = 0.25;
/// How long after the VAD's start interim transcripts come every [`EARLY_INTERIM_SECS`].
const EARLY_SECS: f32 = 1.2;
const RATE: usize = mel::SAMPLE_RATE as usize;

/// A [`Transcriber`] as an [`SttEngine`].
pub struct Segmented(Arc<dyn Transcriber>);

impl Segmented {
    /// The streaming engine over `transcriber`.
    pub fn shared(transcriber: Arc<dyn Transcriber>) -> Arc<dyn SttEngine> {
        Arc::new(Self(transcriber))
    }
}

impl SttEngine for Segmented {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn sample_rate(&self) -> u32 {
        mel::SAMPLE_RATE
    }

    fn start(&self) -> SttStream {
        let (input, inputs) = mpsc::channel(INPUT_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let urgent = Arc::new(AtomicU64::new(0));
        let worker = Worker {
            transcriber: self.0.clone(),
            events: events_tx,
            speculative: None,
            windows: VecDeque::new(),
            urgent: urgent.clone(),
            urgent_taken: 0,
        };
        tokio::spawn(worker.run(requests));
        tokio::spawn(Segmenter::new(requests_tx, urgent).run(inputs));
        SttStream { input, events }
    }
}

enum Request {
    /// A full window of a long utterance: its words open the utterance's transcripts.
    Window(Vec<i16>),
    /// The utterance so far, for an interim transcript.
    Interim(Vec<i16>),
    /// The utterance up to the silence that may end it, decoded at once: if that silence
    /// becomes the VAD's stop, these are the final words, ready a stop delay sooner. Given up
    /// once `wanted` is false: the speech went on to a later pause of the same utterance, so
    /// these words cannot be the final's (in a café the speech dips into a pause and out of it
    /// every few tenths of a second, and a later pause's words must not wait for these).
    Speculative {
        id: u64,
        audio: Vec<i16>,
        wanted: Arc<AtomicBool>,
    },
    /// The whole utterance, and the speculative decode that may already hold its words.
    Final {
        audio: Vec<i16>,
        speculative: Option<u64>,
    },
}

impl Request {
    /// Whether an interim decode under way is given up for this one: a pause's or a stop's
    /// words, or a full window's, are waited for; the next interim is not (a decode slower than
    /// [`INTERIM_SECS`] would otherwise never finish one).
    fn urgent(&self) -> bool {
        !matches!(self, Request::Interim(_))
    }

    /// Whether this request must still run when `newer` is queued behind it (a pending interim
    /// is pointless once a newer request exists).
    fn wanted_before(&self, newer: &Request) -> bool {
        match (self, newer) {
            (Request::Final { .. } | Request::Window(_), _) => true,
            (Request::Speculative { id, .. }, Request::Final { speculative, .. }) => {
                *speculative == Some(*id)
            }
            _ => false,
        }
    }
}

/// Cuts the audio into utterances at the VAD's verdicts.
struct Segmenter {
    /// The audio an utterance begins with.
    preroll: Preroll,
    utterance: Vec<i16>,
    speaking: bool,
    /// Audio since the VAD's start.
    heard: usize,
    /// New audio still to come before the next interim transcript.
    until_interim: usize,
    /// The speculative decode of the latest silence in this utterance, and whether it is still
    /// wanted.
    speculative: Option<(u64, Arc<AtomicBool>)>,
    next_speculative: u64,
    requests: mpsc::UnboundedSender<Request>,
    /// Requests sent so far that an interim decode must not delay, which the worker compares
    /// with those it has taken.
    urgent: Arc<AtomicU64>,
}

impl Segmenter {
    fn new(requests: mpsc::UnboundedSender<Request>, urgent: Arc<AtomicU64>) -> Self {
        Self {
            preroll: Preroll::new(mel::SAMPLE_RATE),
            utterance: Vec::new(),
            speaking: false,
            heard: 0,
            until_interim: 0,
            speculative: None,
            next_speculative: 0,
            requests,
            urgent,
        }
    }

    async fn run(mut self, mut inputs: mpsc::Receiver<SttInput>) {
        while let Some(input) = inputs.recv().await {
            self.handle(input);
        }
    }

    fn send(&self, request: Request) {
        if request.urgent() {
            // Counted before it is sent: the worker never takes more than were counted.
            self.urgent.fetch_add(1, Ordering::AcqRel);
        }
        let _ = self.requests.send(request);
    }

    fn handle(&mut self, input: SttInput) {
        match input {
            SttInput::Audio(audio) => self.audio(&audio),
            SttInput::SpeechOnset { near_speaker } => self.preroll.onset(near_speaker),
            SttInput::OnsetNearSpeaker => self.preroll.came_near(),
            SttInput::OnsetFaded => self.preroll.faded(),
            SttInput::SpeechStarted => {
                self.speaking = true;
                self.heard = 0;
                self.speculative = None;
                self.until_interim = samples(FIRST_INTERIM_SECS);
                self.utterance = self.preroll.start();
            }
            SttInput::SilenceStarted if self.speaking => {
                self.next_speculative += 1;
                let wanted = Arc::new(AtomicBool::new(true));
                let earlier = self
                    .speculative
                    .replace((self.next_speculative, wanted.clone()));
                if let Some((_, earlier)) = earlier {
                    earlier.store(false, Ordering::Release);
                }
                self.until_interim = self.interim_gap();
                self.send(Request::Speculative {
                    id: self.next_speculative,
                    audio: self.utterance.clone(),
                    wanted,
                });
            }
            SttInput::SilenceStarted => {}
            SttInput::Finalize => {
                self.speaking = false;
                self.preroll.stopped();
                let audio = std::mem::take(&mut self.utterance);
                // Every stop follows a silence start, so the last speculative decode ends where
                // the speech did.
                let speculative = self.speculative.take().map(|(id, _)| id);
                self.send(Request::Final { audio, speculative });
            }
        }
    }

    /// Cuts a full window off the utterance, at its quietest 20 ms near the end, and sends it
    /// to be decoded.
    fn cut_window(&mut self) {
        const FRAME: usize = RATE / 50;
        let search = (CUT_SEARCH_SECS * RATE as f32) as usize;
        let from = self.utterance.len().saturating_sub(search);
        let quietest = self.utterance[from..]
            .chunks_exact(FRAME)
            .enumerate()
            .min_by_key(|(_, frame)| frame.iter().map(|s| i64::from(*s).pow(2)).sum::<i64>())
            .map_or(self.utterance.len(), |(i, _)| from + i * FRAME + FRAME / 2);
        let rest = self.utterance.split_off(quietest);
        let window = std::mem::replace(&mut self.utterance, rest);
        // A speculative decode covered audio now split in two: the stop decodes afresh.
        self.speculative = None;
        self.until_interim = self.interim_gap();
        self.send(Request::Window(window));
    }

    fn audio(&mut self, audio: &[i16]) {
        self.preroll.audio(audio);
        if self.speaking {
            self.utterance.extend_from_slice(audio);
            if self.utterance.len() as f32 >= MAX_WINDOW_SECS * RATE as f32 {
                self.cut_window();
            }
            self.heard += audio.len();
            self.until_interim = self.until_interim.saturating_sub(audio.len());
            if self.until_interim == 0 {
                self.until_interim = self.interim_gap();
                self.send(Request::Interim(self.utterance.clone()));
            }
        }
    }

    /// New audio before the next interim transcript: sooner while the utterance is young.
    fn interim_gap(&self) -> usize {
        if self.heard < samples(EARLY_SECS) {
            samples(EARLY_INTERIM_SECS)
        } else {
            samples(INTERIM_SECS)
        }
    }
}

/// Samples in `secs` of audio.
fn samples(secs: f32) -> usize {
    (secs * RATE as f32) as usize
}

/// Runs one stream's decodes in order.
struct Worker {
    transcriber: Arc<dyn Transcriber>,
    events: mpsc::Sender<SttEvent>,
    /// The last speculative decode: its id and words.
    speculative: Option<(u64, String)>,
    /// The words of the utterance's full windows so far.
    windows: VecDeque<String>,
    /// The urgent requests ([`Request::urgent`]) the segmenter has sent, and those taken here:
    /// while they differ, one waits behind the decode under way.
    urgent: Arc<AtomicU64>,
    urgent_taken: u64,
}

impl Worker {
    async fn run(mut self, mut requests: mpsc::UnboundedReceiver<Request>) {
        while let Some(mut request) = requests.recv().await {
            self.take(&request);
            // A newer request makes a pending interim one pointless.
            while let Ok(newer) = requests.try_recv() {
                self.take(&newer);
                if request.wanted_before(&newer) {
                    self.handle(request).await;
                }
                request = newer;
            }
            self.handle(request).await;
        }
    }

    fn take(&mut self, request: &Request) {
        if request.urgent() {
            self.urgent_taken += 1;
        }
    }

    async fn handle(&mut self, request: Request) {
        match request {
            Request::Window(audio) => {
                let text = self.decode(&audio).await.unwrap_or_default();
                if self.windows.len() == MAX_WINDOWS {
                    self.windows.pop_front();
                }
                self.windows.push_back(text);
            }
            Request::Interim(audio) => {
                if let Some(text) = self.decode_partial(&audio).await {
                    let text = self.after_windows(&text);
                    self.send(SttEvent::Interim(text)).await;
                }
            }
            Request::Speculative { id, audio, wanted } => {
                let Some(text) = self
                    .off_runtime(&audio, move |t, samples| {
                        t.transcribe_while(samples, &|| wanted.load(Ordering::Acquire))
                    })
                    .await
                    .flatten()
                else {
                    return;
                };
                // The final words if the silence becomes the stop: the turn may be guessed now.
                self.send(SttEvent::Settled(self.after_windows(&text)))
                    .await;
                self.speculative = Some((id, text));
            }
            Request::Final { audio, speculative } => {
                // The speech ended where the speculative decode was cut: its words are the
                // final ones, and they are ready already.
                let known = match (speculative, self.speculative.take()) {
                    (Some(id), Some((done, text))) if id == done => Some(text),
                    _ => None,
                };
                let text = match known {
                    Some(text) => text,
                    None => self.decode(&audio).await.unwrap_or_default(),
                };
                let text = self.after_windows(&text);
                self.windows.clear();
                // Owed for every finalize, words or not.
                self.send(SttEvent::Finalized(text)).await;
            }
        }
    }

    /// The words of the utterance's full windows, then `text`.
    fn after_windows(&self, text: &str) -> String {
        if self.windows.is_empty() {
            return text.to_owned();
        }
        self.windows
            .iter()
            .map(String::as_str)
            .chain([text])
            .map(str::trim)
            .filter(|words| !words.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }

    async fn send(&self, event: SttEvent) {
        let _ = self.events.send(event).await;
    }

    /// The words in `audio`, or `None` after reporting an error.
    async fn decode(&self, audio: &[i16]) -> Option<String> {
        self.off_runtime(audio, |t, samples| t.transcribe(samples))
            .await
    }

    /// The words so far in the `audio` of an utterance still going on; `None` when an urgent
    /// request came while they were being worked out (the decode is given up) or on an error.
    async fn decode_partial(&self, audio: &[i16]) -> Option<String> {
        let (urgent, taken) = (self.urgent.clone(), self.urgent_taken);
        self.off_runtime(audio, move |t, samples| {
            t.transcribe_partial(samples, &|| urgent.load(Ordering::Acquire) == taken)
        })
        .await
        .flatten()
    }

    /// `transcribe` on `audio`, off the async workers; `None` after reporting an error.
    async fn off_runtime<T: Default + Send + 'static>(
        &self,
        audio: &[i16],
        transcribe: impl FnOnce(&dyn Transcriber, &[f32]) -> Result<T, SttError> + Send + 'static,
    ) -> Option<T> {
        if audio.is_empty() {
            return Some(T::default());
        }
        let transcriber = self.transcriber.clone();
        let samples = voxide_engines::audio::wav::to_f32(audio);
        match tokio::task::spawn_blocking(move || transcribe(&*transcriber, &samples)).await {
            Ok(Ok(text)) => Some(text),
            Ok(Err(e)) => {
                self.send(SttEvent::Error(e.to_string())).await;
                None
            }
            Err(e) => {
                self.send(SttEvent::Error(format!("transcription stopped: {e}")))
                    .await;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A stream of `transcriber`'s, told that speech has started.
    async fn speaking(transcriber: Arc<dyn Transcriber>) -> SttStream {
        let stream = Segmented::shared(transcriber).start();
        stream
            .input
            .send(SttInput::SpeechStarted)
            .await
            .expect("open");
        stream
    }

    /// Hears how long each piece of audio is, and where its loud samples are.
    #[derive(Default)]
    struct Lengths(Mutex<Vec<usize>>);

    impl Transcriber for Lengths {
        fn name(&self) -> &str {
            "lengths"
        }

        fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
            self.0.lock().expect("lock").push(audio.len());
            let loud = audio.iter().filter(|s| s.abs() > 0.1).count();
            Ok(format!("[{loud}]"))
        }
    }

    /// What a stream of [`Lengths`] hears of `script`: each input in turn, audio written as
    /// seconds of loud (`Some(true)`) or quiet sound. The loud samples of the final.
    async fn final_of(script: &[Result<(bool, f32), SttInput>]) -> usize {
        let SttStream { input, mut events } =
            Segmented::shared(Arc::new(Lengths::default())).start();
        for step in script {
            let input_of = match step {
                Ok((loud, secs)) => {
                    SttInput::Audio(vec![if *loud { 10_000 } else { 0 }; samples(*secs)])
                }
                Err(cue) => cue.clone(),
            };
            input.send(input_of).await.expect("open");
        }
        loop {
            if let SttEvent::Finalized(text) = events.recv().await.expect("a final transcript") {
                return text.trim_matches(['[', ']']).parse().expect("a count");
            }
        }
    }

    #[tokio::test]
    async fn words_that_faded_as_onsets_before_the_start_are_heard_and_the_rooms_moment_before_them_is_not()
     {
        use SttInput::{OnsetFaded, SpeechStarted};
        const SPEECH_ONSET: SttInput = SttInput::SpeechOnset { near_speaker: true };
        let (loud, quiet) = (|secs| Ok((true, secs)), |secs| Ok((false, secs)));
        // Over a room's noise: two onsets fade inside the first words, the third starts the
        // turn, 1.3 s after the voice began.
        let voice = [
            quiet(3.0),
            Err(SPEECH_ONSET),
            loud(0.3),
            Err(OnsetFaded),
            quiet(0.1),
            Err(SPEECH_ONSET),
            loud(0.3),
            Err(OnsetFaded),
            quiet(0.15),
            Err(SPEECH_ONSET),
            loud(0.45),
            Err(SpeechStarted),
            loud(0.5),
            Err(SttInput::SilenceStarted),
            Err(SttInput::Finalize),
        ];
        assert_eq!(
            final_of(&voice).await,
            2 * samples(0.3) + samples(0.45) + samples(0.5),
            "every loud sample"
        );
        // The room's moment faded a second before the speaker's onset: not the same words.
        let room_then_voice = [
            quiet(3.0),
            Err(SPEECH_ONSET),
            loud(0.2),
            Err(OnsetFaded),
            quiet(1.0),
            Err(SPEECH_ONSET),
            loud(0.2),
            Err(SpeechStarted),
            loud(0.5),
            Err(SttInput::SilenceStarted),
            Err(SttInput::Finalize),
        ];
        assert_eq!(
            final_of(&room_then_voice).await,
            samples(0.7),
            "the voice alone"
        );
    }

    #[tokio::test]
    async fn seventy_seconds_without_a_pause_are_heard_whole_in_windows_whisper_can_take() {
        let heard = Arc::new(Lengths::default());
        let SttStream { input, mut events } = speaking(heard.clone()).await;
        // 70 s of "speech": loud, with a short quiet gap every 1.3 s, as between words.
        let mut loud = 0usize;
        for k in 0..3_500usize {
            let quiet = k % 65 == 64;
            let frame = vec![if quiet { 0 } else { 10_000i16 }; 320];
            loud += if quiet { 0 } else { 320 };
            input.send(SttInput::Audio(frame)).await.expect("open");
        }
        input.send(SttInput::SilenceStarted).await.expect("open");
        input.send(SttInput::Finalize).await.expect("open");
        let text = loop {
            match events.recv().await.expect("a final transcript") {
                SttEvent::Finalized(text) => break text,
                _ => continue,
            }
        };
        let lengths = heard.0.lock().expect("lock").clone();
        let longest = lengths.iter().max().copied().unwrap_or_default();
        assert!(
            longest as f32 <= 30.0 * RATE as f32,
            "a decode of {} s",
            longest as f32 / RATE as f32
        );
        let pieces: Vec<usize> = text
            .split_whitespace()
            .map(|p| p.trim_matches(['[', ']']).parse().expect("a count"))
            .collect();
        assert_eq!(pieces.len(), 3, "two full windows and the rest: {text}");
        assert_eq!(
            pieces.iter().sum::<usize>(),
            loud,
            "every loud sample heard once: {text}"
        );
    }

    /// Works out an interim transcript for as long as it is wanted (up to 10 s), saying when it
    /// starts, and a pause's words at once.
    #[derive(Default)]
    struct SlowInterims(tokio::sync::Notify);

    impl Transcriber for SlowInterims {
        fn name(&self) -> &str {
            "slow interims"
        }

        fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
            Ok(format!("{} samples", audio.len()))
        }

        fn transcribe_partial(
            &self,
            _audio: &[f32],
            wanted: &dyn Fn() -> bool,
        ) -> Result<Option<String>, SttError> {
            Ok(work_while(&self.0, wanted, "a late interim"))
        }
    }

    /// Says it has started, then works for as long as `wanted` says yes: given up (`None`), or
    /// after 10 s `late`.
    fn work_while(
        started: &tokio::sync::Notify,
        wanted: &dyn Fn() -> bool,
        late: &str,
    ) -> Option<String> {
        started.notify_one();
        let since = std::time::Instant::now();
        while wanted() {
            if since.elapsed() > std::time::Duration::from_secs(10) {
                return Some(late.into());
            }
            std::thread::yield_now();
        }
        None
    }

    #[tokio::test]
    async fn a_pause_does_not_wait_for_an_interim_transcript_under_way() {
        let slow = Arc::new(SlowInterims::default());
        let SttStream { input, mut events } = speaking(slow.clone()).await;
        // Half a second of speech asks for an interim transcript; the pause comes while it is
        // being worked out.
        input
            .send(SttInput::Audio(vec![1_000; RATE / 2]))
            .await
            .expect("audio");
        slow.0.notified().await;
        input.send(SttInput::SilenceStarted).await.expect("pause");
        let first = events.recv().await.expect("an event");
        let SttEvent::Settled(words) = first else {
            panic!("the pause's words waited for the interim: {first:?}");
        };
        assert_eq!(words, format!("{} samples", RATE / 2));
        input.send(SttInput::Finalize).await.expect("stop");
        let SttEvent::Finalized(words) = events.recv().await.expect("the final") else {
            panic!("no final");
        };
        assert_eq!(words, format!("{} samples", RATE / 2));
    }

    /// Works out the words of less than `SHORT` samples for as long as they are wanted (up to
    /// 10 s), saying when it starts; longer audio at once.
    #[derive(Default)]
    struct SlowShortPauses(tokio::sync::Notify);

    const SHORT: usize = RATE * 6 / 10;

    impl Transcriber for SlowShortPauses {
        fn name(&self) -> &str {
            "slow short pauses"
        }

        fn transcribe(&self, audio: &[f32]) -> Result<String, SttError> {
            let always = || true;
            Ok(self.transcribe_while(audio, &always)?.unwrap_or_default())
        }

        fn transcribe_while(
            &self,
            audio: &[f32],
            wanted: &dyn Fn() -> bool,
        ) -> Result<Option<String>, SttError> {
            if audio.len() < SHORT {
                return Ok(work_while(&self.0, wanted, "a late pause's words"));
            }
            Ok(Some(format!("{} samples", audio.len())))
        }
    }

    #[tokio::test]
    async fn a_pause_does_not_wait_for_the_words_of_an_earlier_one_under_way() {
        let slow = Arc::new(SlowShortPauses::default());
        let SttStream { input, mut events } = speaking(slow.clone()).await;
        // A pause after half a second of speech; the speech goes on to a second pause while the
        // first one's words are being worked out.
        input
            .send(SttInput::Audio(vec![1_000; RATE / 2]))
            .await
            .expect("audio");
        input.send(SttInput::SilenceStarted).await.expect("pause");
        slow.0.notified().await;
        input
            .send(SttInput::Audio(vec![1_000; RATE / 5]))
            .await
            .expect("audio");
        input.send(SttInput::SilenceStarted).await.expect("pause");
        let said = RATE / 2 + RATE / 5;
        let settled = loop {
            match events.recv().await.expect("an event") {
                SttEvent::Settled(words) => break words,
                SttEvent::Interim(_) => {}
                other => panic!("{other:?} before the pause's words"),
            }
        };
        assert_eq!(
            settled,
            format!("{said} samples"),
            "the second pause's words"
        );
        input.send(SttInput::Finalize).await.expect("stop");
        let SttEvent::Finalized(words) = events.recv().await.expect("the final") else {
            panic!("no final");
        };
        assert_eq!(words, format!("{said} samples"));
    }

    #[test]
    fn a_pause_gives_up_its_utterances_earlier_pauses_and_none_of_an_utterance_before() {
        let (requests, mut sent) = mpsc::unbounded_channel();
        let mut segmenter = Segmenter::new(requests, Arc::new(AtomicU64::new(0)));
        let mut pause = |segmenter: &mut Segmenter, speech: f32| {
            segmenter.handle(SttInput::Audio(vec![1_000; samples(speech)]));
            segmenter.handle(SttInput::SilenceStarted);
            std::iter::from_fn(|| sent.try_recv().ok())
                .find_map(|request| match request {
                    Request::Speculative { wanted, .. } => Some(wanted),
                    _ => None,
                })
                .expect("a pause asks for its words")
        };
        // Where decodes lag (a loaded machine, or audio fed faster than it is said), the
        // segmenter runs utterances ahead of them.
        segmenter.handle(SttInput::SpeechStarted);
        let first = pause(&mut segmenter, 0.5);
        let last = pause(&mut segmenter, 0.3);
        segmenter.handle(SttInput::Finalize);
        segmenter.handle(SttInput::SpeechStarted);
        let next = pause(&mut segmenter, 0.5);
        let next_last = pause(&mut segmenter, 0.3);
        let wanted = |w: &Arc<AtomicBool>| w.load(Ordering::Acquire);
        // The final of each utterance waits for its last pause's words.
        assert!(!wanted(&first) && wanted(&last));
        assert!(!wanted(&next) && wanted(&next_last));
    }

    #[tokio::test]
    async fn interim_transcripts_come_sooner_while_an_utterance_is_young() {
        let heard = Arc::new(Lengths::default());
        let SttStream { input, mut events } = speaking(heard.clone()).await;
        // Each interim reads the utterance as it stood when it was asked for: the first
        // FIRST_INTERIM_SECS of speech, then EARLY_INTERIM_SECS more each time until EARLY_SECS
        // have been heard, then INTERIM_SECS more each time. 10 ms pieces add up to each.
        let piece = RATE / 100;
        let first = samples(FIRST_INTERIM_SECS) / piece;
        let early = samples(EARLY_INTERIM_SECS) / piece;
        let then = samples(INTERIM_SECS) / piece;
        assert!(first < early && early < then);
        let mut schedule = vec![first];
        while schedule.iter().sum::<usize>() * piece < samples(EARLY_SECS) {
            schedule.push(early);
        }
        schedule.extend([then, then]);
        let mut said = 0;
        for pieces in schedule {
            for _ in 0..pieces {
                input
                    .send(SttInput::Audio(vec![10_000; piece]))
                    .await
                    .expect("audio");
            }
            said += pieces * piece;
            let words = format!("[{said}]");
            let event = tokio::time::timeout(std::time::Duration::from_secs(10), events.recv())
                .await
                .unwrap_or_else(|_| panic!("no interim of {words} samples"))
                .expect("open");
            assert!(
                matches!(&event, SttEvent::Interim(text) if *text == words),
                "{event:?} where the interim of {words} samples was due"
            );
        }
    }
}
