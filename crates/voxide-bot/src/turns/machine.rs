//! The user-turn state machine, sans IO: what the stage has seen goes in with the time, what to
//! push comes out. It owns every piece of turn state (the VAD and the transcripts, the verdict
//! awaited from the turn model, the bot speaking, a held onset, an interruption waiting for
//! words, the turn's words and the answer owed) and one deadline; [`super::UserTurns`] only
//! drives it. The user aggregator commits what the machine hands on ([`Action::Answer`]).

use std::time::Duration;

use tokio::time::Instant;

use super::audio::TurnAudio;
use super::words::{self, Words};
use super::{BargeIn, TRANSCRIPT_TURN_TIMEOUT, VERDICT_WAIT};
use crate::audio::turn::TurnPrediction;
use crate::frames::{AudioFrame, ControlFrame, DataFrame, FrameBody, SystemFrame};

/// Silence after the VAD's stop that ends a turn the model called unfinished when its words
/// make a whole sentence or question: long enough for a pause inside a sentence (300–700 ms,
/// the VAD's own stop window before it) to end in more speech.
pub const FINISHED_WORDS_WAIT: Duration = Duration::from_millis(600);
/// Silence after the VAD's stop that ends a turn the model called finished when its words trail
/// off ("and", "the", "…") or may ("…the weather is?"): the user gets a moment to go on.
pub const TRAILING_WORDS_HOLD: Duration = Duration::from_secs(1);
/// Silence after the VAD's stop that ends a turn both the model and its words call finished,
/// when the answer is guessed ahead ([`Action::Guess`]): the answer is being worked out
/// meanwhile, so a user who was only pausing mid-sentence (300–700 ms, the VAD's 200 ms stop
/// window before it) can go on without being cut off. It lasts no longer than the answer takes
/// to make ([`FINISHED_TURN_MIN_HOLD`]), so it costs the caller nothing. Speech heard before it
/// runs out holds the turn until it is known to be speech or a click.
pub const FINISHED_TURN_HOLD: Duration = Duration::from_millis(450);
/// The least of [`FINISHED_TURN_HOLD`]: once the guessed answer's first words are spoken (held,
/// ready to play), the hold has nothing left to make and ends this long after the VAD's stop.
/// A pause inside a sentence still gets this much more silence than the stop window.
pub const FINISHED_TURN_MIN_HOLD: Duration = Duration::from_millis(250);
/// Silence after the VAD's stop that ends a turn the model called unfinished when its words may
/// be whole ("Do you know where the station is?", [`Words::Open`]): longer than a pause inside
/// a sentence, shorter than the wait on words that trail off.
pub const OPEN_WORDS_WAIT: Duration = Duration::from_secs(1);

/// How long the bot stays held after the onset it was held for fades: in a café an
/// interruption's first word fades and the next comes within this ("Let me | stop you there",
/// "Stop, | I need to go"), and a bot that played on between them would be heard to stop
/// twice.
pub const ONSET_FADE_GRACE: Duration = Duration::from_millis(200);

/// How a turn ends once the VAD hears silence, as the machine sees it (the model itself lives
/// with the driver).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StopRule {
    /// After this much silence.
    Silence(Duration),
    /// When the turn model says the turn is finished, or after `incomplete_timeout` of silence;
    /// the turn's words move that: an unfinished verdict on words that end a sentence waits
    /// [`FINISHED_WORDS_WAIT`], a finished verdict on words that trail off holds
    /// [`TRAILING_WORDS_HOLD`].
    Model {
        /// Silence after which an unfinished-sounding turn ends anyway.
        incomplete_timeout: Duration,
        /// Weigh the words (off: the verdict alone decides).
        words: bool,
    },
}

/// What the stage saw.
#[derive(Debug)]
pub enum Input<'a> {
    /// The session started; interruptions are allowed or not.
    Start {
        /// Whether the user may interrupt the bot.
        interruptions: bool,
    },
    /// The user's audio.
    Audio(&'a AudioFrame),
    /// The VAD heard what may be the start of speech; `near_speaker`: at the speaker's level,
    /// not a café's talk under it.
    Onset {
        /// As [`SystemFrame::VadSpeechOnset`]'s.
        near_speaker: bool,
    },
    /// An onset under the speaker's level came near it.
    OnsetNearSpeaker,
    /// That onset faded without becoming speech.
    OnsetFaded,
    /// An interruption from elsewhere (the session, a realtime LLM's own turn detection).
    Interruption,
    /// The VAD confirmed speech.
    VadStarted,
    /// The VAD heard the first silence after speech (its stop may follow).
    SilenceStarted,
    /// The VAD heard speech again before that silence became a stop.
    SpeechResumed,
    /// The VAD heard the silence after speech.
    VadStopped,
    /// The STT announced a final it will deliver.
    TranscriptionPending,
    /// The STT delivered an announced final.
    TranscriptionDone,
    /// The STT has all the words spoken before the first silence, ahead of the stop's final
    /// (which repeats them): these, since its last final.
    Settled(&'a str),
    /// The speech of guess `id`'s first words is made and held.
    GuessSpoken(u64),
    /// The bot started speaking.
    BotStarted,
    /// The bot stopped speaking.
    BotStopped,
    /// A transcript of the user's words.
    Transcript {
        /// Its text.
        text: &'a str,
        /// A final (not an interim).
        is_final: bool,
    },
    /// The turn model's verdict on the pause [`Action::Judge`] asked about; `Ok(None)`: the
    /// model skipped it.
    Verdict {
        /// The request's id.
        id: u64,
        /// The verdict.
        judged: Result<Option<TurnPrediction>, String>,
    },
    /// Time passed: whatever is due by now happens.
    Tick,
}

impl<'a> Input<'a> {
    /// The machine's view of a frame; `None` for frames it does not care about.
    pub fn of(body: &'a FrameBody) -> Option<Self> {
        Some(match body {
            FrameBody::System(SystemFrame::Start(start)) => Self::Start {
                interruptions: start.params.allow_interruptions,
            },
            FrameBody::System(SystemFrame::InputAudio(audio)) => Self::Audio(audio),
            FrameBody::System(SystemFrame::VadSpeechOnset { near_speaker }) => Self::Onset {
                near_speaker: *near_speaker,
            },
            FrameBody::System(SystemFrame::VadOnsetNearSpeaker) => Self::OnsetNearSpeaker,
            FrameBody::System(SystemFrame::VadOnsetFaded) => Self::OnsetFaded,
            FrameBody::System(SystemFrame::Interruption) => Self::Interruption,
            FrameBody::System(SystemFrame::VadUserStartedSpeaking) => Self::VadStarted,
            FrameBody::System(SystemFrame::VadSilenceStarted) => Self::SilenceStarted,
            FrameBody::System(SystemFrame::VadSpeechResumed) => Self::SpeechResumed,
            FrameBody::System(SystemFrame::VadUserStoppedSpeaking) => Self::VadStopped,
            FrameBody::System(SystemFrame::TranscriptionSettled(text)) => Self::Settled(text),
            FrameBody::System(SystemFrame::GuessSpoken(id)) => Self::GuessSpoken(*id),
            FrameBody::System(SystemFrame::TranscriptionPending) => Self::TranscriptionPending,
            FrameBody::Control(ControlFrame::TranscriptionDone) => Self::TranscriptionDone,
            FrameBody::System(SystemFrame::BotStartedSpeaking) => Self::BotStarted,
            FrameBody::System(SystemFrame::BotStoppedSpeaking) => Self::BotStopped,
            FrameBody::Data(DataFrame::Transcription(t)) => Self::Transcript {
                text: &t.text,
                is_final: true,
            },
            FrameBody::Data(DataFrame::InterimTranscription(t)) => Self::Transcript {
                text: &t.text,
                is_final: false,
            },
            _ => return None,
        })
    }
}

/// What the driver does, in order.
#[derive(Debug, Clone)]
pub enum Action {
    /// Pass the frame that was handled on, here in the order.
    Forward,
    /// Push this frame downstream.
    Push(SystemFrame),
    /// Interrupt the bot: an interruption upstream and downstream.
    Interrupt,
    /// The turn is over and all its transcripts are in: hand its words on to be answered
    /// ([`DataFrame::UserTurn`]), after the frame handled. Empty when the turn brought no words
    /// but cut off an answer the bot had not started: the LLM works it out again.
    Answer(String),
    /// The turn may be over: its words so far, all in, for the LLM to start on before the
    /// turn ends (preemptive generation). Given once per distinct words until the user speaks
    /// again, numbered for [`Input::GuessSpoken`].
    Guess {
        /// The guess's number.
        id: u64,
        /// The words.
        text: String,
    },
    /// Ask the turn model whether the turn is finished, from its audio; the answer comes back
    /// as [`Input::Verdict`] with this id. A request the machine no longer awaits
    /// ([`TurnMachine::awaits`]) may be skipped.
    Judge {
        /// The request's id.
        id: u64,
        /// The turn's audio at 16 kHz.
        audio: Vec<i16>,
    },
}

/// Speech over the bot that no words have confirmed as an interruption yet.
#[derive(Debug, Default, Clone, Copy)]
struct Unconfirmed {
    /// The bot's playback is paused for it.
    paused: bool,
    /// The turn it started has ended.
    turn_over: bool,
    /// Words in the turn's final transcripts so far.
    final_words: usize,
}

/// The words of a user turn, gathered from its final transcripts until it is handed on.
#[derive(Debug, Default)]
struct TurnWords {
    text: String,
    /// The turn has ended and waits for the finals the STT announced.
    ended: bool,
    /// It cut off an answer before the bot said any of it: handed on even without words.
    cut: bool,
}

/// The verdict awaited on the latest pause.
#[derive(Debug, Clone, Copy)]
struct Awaited {
    id: u64,
    /// Not back by then: the turn ends without it ([`VERDICT_WAIT`]).
    by: Instant,
}

/// Where the user's turn stands: what a phase needs lives in it, so ending a turn is leaving
/// the phase, and nothing of one turn is left over in the next.
#[derive(Debug)]
enum Phase {
    /// No turn is open.
    Idle,
    /// A user turn is open: the user speaks, or pauses.
    Open(OpenTurn),
}

/// An open user turn.
#[derive(Debug, Default)]
struct OpenTurn {
    /// It was started by a transcript, not the VAD: words keep it open.
    by_transcript: bool,
    /// When it ends (silence, or an unfinished-sounding pause running out).
    end: Option<Instant>,
    /// The pause being judged, on the turn model's rule.
    pause: Option<Pause>,
    /// Its latest interim transcript (finals are in [`TurnMachine::turn`]).
    interim: String,
    /// The words last guessed since the user last spoke.
    guess: Option<Guess>,
    /// The VAD heard the turn's first silence and no speech since, before its stop.
    quiet: bool,
    /// The VAD heard what may be the user going on in the turn's pause: its end waits until
    /// that becomes speech or fades.
    onset_in_pause: bool,
}

impl OpenTurn {
    /// When the verdict awaited on its pause is given up.
    fn verdict_by(&self) -> Option<Instant> {
        match self.pause.as_ref()?.judging {
            Judging::Asked(awaited) => Some(awaited.by),
            _ => None,
        }
    }
}

/// A pause after the VAD's stop, judged by the turn model or the words.
#[derive(Debug)]
struct Pause {
    /// The VAD's stop.
    at: Instant,
    judging: Judging,
}

/// How far a pause is judged.
#[derive(Debug)]
enum Judging {
    /// Its words are on their way and may settle it alone: the audio, kept for the model in
    /// case they leave the turn in doubt.
    Words(Vec<i16>),
    /// The model was asked.
    Asked(Awaited),
    /// The model skipped it: the pause ends at its deadline.
    Skipped,
    /// Finished, or not: the model's verdict, or the words' alone when they make a whole
    /// sentence and the answer is guessed ([`TurnMachine::judge_by_words`]).
    Judged(bool),
}

/// Words guessed as the turn's, for the LLM to start on.
#[derive(Debug)]
struct Guess {
    words: String,
    /// The answer's first words are spoken, held to play.
    spoken: bool,
}

/// The bot's audio held for a VAD onset over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnsetHold {
    /// Nothing is held for an onset.
    Off,
    /// Held for an onset that has neither started nor faded yet.
    Held,
    /// The onset faded: the bot plays on at this time unless another onset comes first
    /// ([`ONSET_FADE_GRACE`]).
    Fading(Instant),
}

impl OnsetHold {
    fn held(self) -> bool {
        self != Self::Off
    }
}

/// The user-turn machine. See the module docs.
pub struct TurnMachine {
    stop: StopRule,
    barge_in: BargeIn,
    interruptions: bool,
    /// The VAD hears speech (between its start and stop).
    vad_speaking: bool,
    /// Finals the STT announced and has not delivered yet.
    owed: usize,
    bot_speaking: bool,
    phase: Phase,
    /// The words of the turn to hand on (kept past the turn's end, for its owed finals).
    turn: TurnWords,
    /// The LLM was asked for an answer and the bot has not started speaking since.
    unspoken: bool,
    onset_hold: OnsetHold,
    unconfirmed: Option<Unconfirmed>,
    /// When a paused bot resumes if no words confirm the interruption.
    resume_at: Option<Instant>,
    verdicts_asked: u64,
    /// The user's recent audio, for the turn model.
    audio: TurnAudio,
    /// Guess the turn's words at each pause ([`Action::Guess`]).
    preemptive: bool,
    /// Guesses made, the last one's number.
    guesses: u64,
    actions: Vec<Action>,
}

impl TurnMachine {
    /// A machine ending turns by `stop`, letting speech over the bot interrupt it as
    /// `barge_in` says.
    pub fn new(stop: StopRule, barge_in: BargeIn) -> Self {
        Self {
            stop,
            barge_in,
            interruptions: true,
            vad_speaking: false,
            owed: 0,
            bot_speaking: false,
            phase: Phase::Idle,
            turn: TurnWords::default(),
            unspoken: false,
            onset_hold: OnsetHold::Off,
            unconfirmed: None,
            resume_at: None,
            verdicts_asked: 0,
            audio: TurnAudio::default(),
            preemptive: false,
            guesses: 0,
            actions: Vec::new(),
        }
    }

    /// Guesses the turn's words at each pause whose words are all in, so the LLM can start on
    /// them before the turn ends.
    pub fn set_preemptive(&mut self, on: bool) {
        self.preemptive = on;
    }

    /// When the machine next wants an [`Input::Tick`].
    pub fn next_deadline(&self) -> Option<Instant> {
        let (end, verdict) = match &self.phase {
            Phase::Open(turn) => (turn.end.filter(|_| !turn.onset_in_pause), turn.verdict_by()),
            Phase::Idle => (None, None),
        };
        let played_on = match self.onset_hold {
            OnsetHold::Fading(at) => Some(at),
            OnsetHold::Off | OnsetHold::Held => None,
        };
        [end, self.resume_at, verdict, played_on]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether the verdict `id` is still wanted.
    pub fn awaits(&self, id: u64) -> bool {
        let Phase::Open(turn) = &self.phase else {
            return false;
        };
        matches!(turn.pause, Some(Pause { judging: Judging::Asked(a), .. }) if a.id == id)
    }

    /// A user turn is open.
    pub fn in_turn(&self) -> bool {
        matches!(self.phase, Phase::Open(_))
    }

    /// The open turn, if any.
    fn open(&mut self) -> Option<&mut OpenTurn> {
        match &mut self.phase {
            Phase::Open(turn) => Some(turn),
            Phase::Idle => None,
        }
    }

    /// Takes `input`, seen at `now`; returns what to do, in order.
    pub fn handle(&mut self, input: Input<'_>, now: Instant) -> Vec<Action> {
        match input {
            Input::Start { interruptions } => {
                self.interruptions = interruptions;
                self.forward();
            }
            Input::Audio(audio) => {
                self.audio.keep(audio);
                self.forward();
            }
            Input::Onset { near_speaker } => {
                self.on_onset(near_speaker);
                self.audio.onset();
                let vad_speaking = self.vad_speaking;
                if let Some(turn) = self.open() {
                    turn.onset_in_pause = !vad_speaking;
                }
                self.forward();
            }
            Input::OnsetNearSpeaker => {
                self.on_onset(true);
                self.forward();
            }
            Input::OnsetFaded => {
                if self.onset_hold == OnsetHold::Held {
                    self.onset_hold = OnsetHold::Fading(now + ONSET_FADE_GRACE);
                }
                if let Some(turn) = self.open() {
                    turn.onset_in_pause = false;
                }
                self.forward();
                self.on_tick(now);
            }
            Input::Interruption => {
                // It released the hold as it cut the bot off, and dropped the answer in the
                // making.
                self.onset_hold = OnsetHold::Off;
                self.answer_cut();
                self.forward();
            }
            Input::VadStarted => {
                self.vad_speaking = true;
                if let Some(turn) = self.open() {
                    turn.onset_in_pause = false;
                }
                self.forward();
                self.on_speech_started();
            }
            Input::SilenceStarted => {
                let vad_speaking = self.vad_speaking;
                if let Some(turn) = self.open() {
                    turn.quiet = vad_speaking;
                }
                self.forward();
            }
            Input::SpeechResumed => {
                // The LLM and the voice throw away a guess made in the silence.
                if let Some(turn) = self.open() {
                    turn.quiet = false;
                    turn.guess = None;
                }
                self.forward();
            }
            Input::VadStopped => {
                self.vad_speaking = false;
                if let Some(turn) = self.open() {
                    turn.quiet = false;
                }
                self.forward();
                self.on_pause(now);
            }
            Input::TranscriptionPending => {
                self.owed += 1;
                self.forward();
            }
            Input::TranscriptionDone => {
                self.owed = self.owed.saturating_sub(1);
                self.forward();
                self.hand_on();
                self.reconsider(now);
                self.guess();
            }
            Input::BotStarted => {
                self.bot_speaking = true;
                self.unspoken = false;
                self.forward();
            }
            Input::BotStopped => {
                self.bot_speaking = false;
                // The bot finished on its own: what the user says now is a plain turn.
                if self.unconfirmed.is_some_and(|u| !u.paused) {
                    self.unconfirmed = None;
                }
                self.forward();
            }
            Input::Transcript { text, is_final } => {
                self.on_transcript(text, is_final, now);
                self.reconsider(now);
                self.guess();
            }
            Input::Settled(text) => {
                self.forward();
                self.guess_settled(text);
            }
            Input::GuessSpoken(id) => {
                // Addressed here: it goes no further.
                let latest = id == self.guesses;
                if let Some(guess) = self.open().and_then(|turn| turn.guess.as_mut())
                    && latest
                {
                    guess.spoken = true;
                    self.reconsider(now);
                }
            }
            Input::Verdict { id, judged } => self.on_verdict(id, judged, now),
            Input::Tick => self.on_tick(now),
        }
        std::mem::take(&mut self.actions)
    }

    fn forward(&mut self) {
        self.actions.push(Action::Forward);
    }

    fn push(&mut self, frame: SystemFrame) {
        self.actions.push(Action::Push(frame));
    }

    /// An interruption: an answer the bot had not started is gone, and the turn that cut it
    /// off asks for it again.
    fn answer_cut(&mut self) {
        if std::mem::take(&mut self.unspoken) {
            self.turn.cut = true;
        }
    }

    /// Hands the ended turn's words on once its announced finals are in. A remark over the bot
    /// that no words have confirmed as an interruption is not a turn to answer.
    fn hand_on(&mut self) {
        if self.in_turn() || !self.turn.ended || self.owed > 0 {
            return;
        }
        if self.unconfirmed.is_some() {
            // Held until words confirm it as an interruption, or the next turn takes it in.
            return;
        }
        let turn = std::mem::take(&mut self.turn);
        if turn.text.is_empty() && !turn.cut {
            return;
        }
        if turn.text.is_empty() {
            tracing::debug!("a turn without words cut off the answer: the LLM runs again");
        }
        self.unspoken = true;
        self.actions.push(Action::Answer(turn.text));
    }

    /// At a pause whose words are all in, while the turn is still open, hands its words on as
    /// a guess (once per distinct words): if the turn ends with them, the answer has a head
    /// start; if the user goes on, the guess is thrown away.
    fn guess(&mut self) {
        let ready = self.preemptive
            && self.in_turn()
            && !self.vad_speaking
            && self.owed == 0
            && self.unconfirmed.is_none()
            && !self.turn.text.is_empty();
        if ready {
            self.offer_guess(self.turn.text.clone());
        }
    }

    /// In the silence before the VAD's stop, once the STT has all the words spoken before it:
    /// the guess starts there rather than at the stop. Should the user go on, it is dropped.
    fn guess_settled(&mut self, settled: &str) {
        let quiet = matches!(&self.phase, Phase::Open(turn) if turn.quiet);
        let ready = self.preemptive
            && quiet
            && self.owed == 0
            && self.unconfirmed.is_none()
            && !settled.trim().is_empty();
        if ready {
            let mut words = self.turn.text.clone();
            if !words.is_empty() {
                words.push(' ');
            }
            words.push_str(settled.trim());
            self.offer_guess(words);
        }
    }

    /// Guesses `words` in the open turn, unless they are the words guessed already.
    fn offer_guess(&mut self, words: String) {
        let Phase::Open(turn) = &mut self.phase else {
            return;
        };
        if turn.guess.as_ref().is_some_and(|g| g.words == words) {
            return;
        }
        self.guesses += 1;
        turn.guess = Some(Guess {
            words: words.clone(),
            spoken: false,
        });
        self.actions.push(Action::Guess {
            id: self.guesses,
            text: words,
        });
    }

    /// The answer to the turn's words as they stand is guessed and its first words spoken.
    fn answer_ready(&self) -> bool {
        matches!(&self.phase, Phase::Open(OpenTurn { guess: Some(g), .. })
            if g.spoken && g.words == self.turn.text)
    }

    /// A final transcript's words belong to the turn.
    fn keep_words(&mut self, text: &str) {
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        if !self.turn.text.is_empty() {
            self.turn.text.push(' ');
        }
        self.turn.text.push_str(text);
    }

    /// Speech may be starting over the bot: hold its audio until the VAD decides, unless the
    /// onset is under the speaker's level (a café's talk, which makes onsets all the time); one
    /// that comes near it later holds the bot then. One within the last onset's grace keeps
    /// the bot held.
    fn on_onset(&mut self, near_speaker: bool) {
        let hold = self.barge_in.pause_at_onset
            && near_speaker
            && self.bot_speaking
            && self.interruptions
            && self.onset_hold != OnsetHold::Held
            && !self.in_turn()
            && !self.unconfirmed.is_some_and(|u| u.paused);
        if hold {
            if self.onset_hold == OnsetHold::Off {
                self.push(SystemFrame::PausePlayback);
            }
            self.onset_hold = OnsetHold::Held;
        }
    }

    /// The VAD confirmed speech: a turn starts, or the open one goes on past its pause.
    fn on_speech_started(&mut self) {
        let mut held = std::mem::replace(&mut self.onset_hold, OnsetHold::Off).held();
        if let Some(turn) = self.open() {
            // The LLM and the voice throw away the guess as the user goes on, and the pause
            // being judged was not the end.
            *turn = OpenTurn {
                interim: std::mem::take(&mut turn.interim),
                ..OpenTurn::default()
            };
        } else {
            self.phase = Phase::Open(OpenTurn::default());
            self.audio.start_turn();
            self.push(SystemFrame::UserStartedSpeaking);
            if self.bot_speaking && self.interruptions {
                held = self.barge_in_started(held);
            } else {
                // A turn over silence is a plain turn, whatever came before it.
                self.unconfirmed = None;
                if self.unspoken && self.interruptions {
                    // The user went on: the answer being worked out is to half of what they
                    // meant. Should this turn bring no words (a cough, a door), it is worked
                    // out again, so noise never costs the user the answer to their question.
                    self.answer_cut();
                    self.actions.push(Action::Interrupt);
                }
            }
        }
        if held {
            self.push(SystemFrame::ResumePlayback);
        }
    }

    /// The user started talking over the bot: interrupt now, or wait for words (paused).
    /// `held`: the bot is already paused for the onset. Returns whether it still needs
    /// resuming (the policy lets the bot talk on while words are awaited).
    fn barge_in_started(&mut self, held: bool) -> bool {
        if !self.barge_in.waits() {
            // The interruption releases any pause as it drops the bot's audio.
            self.actions.push(Action::Interrupt);
            return false;
        }
        let pause = self.barge_in.resume_after.is_some();
        let was_paused = self.unconfirmed.is_some_and(|u| u.paused);
        self.unconfirmed = Some(Unconfirmed {
            paused: was_paused || pause,
            ..Unconfirmed::default()
        });
        self.resume_at = None;
        if pause && !was_paused && !held {
            self.push(SystemFrame::PausePlayback);
        }
        held && !pause
    }

    /// The VAD heard silence: the turn ends after a while, or sooner if the model says so.
    fn on_pause(&mut self, now: Instant) {
        let (stop, preemptive, owed) = (self.stop, self.preemptive, self.owed);
        let Phase::Open(turn) = &mut self.phase else {
            return;
        };
        match stop {
            StopRule::Silence(silence) => turn.end = Some(now + silence),
            StopRule::Model {
                incomplete_timeout,
                words,
            } => {
                // The turn ends by this time whatever the model says, or however long it
                // takes to say it (sessions share it, so under load it queues).
                turn.end = Some(now + incomplete_timeout);
                let audio = self.audio.turn();
                if words && preemptive && owed > 0 {
                    // The pause's words are on their way, and they may settle it alone.
                    turn.pause = Some(Pause {
                        at: now,
                        judging: Judging::Words(audio),
                    });
                } else {
                    turn.pause = Some(Pause {
                        at: now,
                        judging: Judging::Skipped,
                    });
                    self.ask_model(audio, now);
                }
            }
        }
    }

    /// Asks the turn model about the open turn's pause, from its audio.
    fn ask_model(&mut self, audio: Vec<i16>, now: Instant) {
        self.verdicts_asked += 1;
        let id = self.verdicts_asked;
        if let Some(pause) = self.open().and_then(|turn| turn.pause.as_mut()) {
            pause.judging = Judging::Asked(Awaited {
                id,
                by: now + VERDICT_WAIT,
            });
        }
        self.actions.push(Action::Judge { id, audio });
    }

    /// Once the pause's words are in: words that make a whole sentence settle a pause whose
    /// answer is guessed, since the model could only move its end between
    /// [`FINISHED_TURN_HOLD`] and [`FINISHED_WORDS_WAIT`], and the hold already lets a user who
    /// was pausing go on. Words in doubt go to the model, with the pause's audio.
    fn judge_by_words(&mut self, now: Instant) {
        if self.owed > 0 || self.vad_speaking {
            return;
        }
        let heard = self.heard();
        let Some(pause) = self.open().and_then(|turn| turn.pause.as_mut()) else {
            return;
        };
        let Judging::Words(_) = pause.judging else {
            return;
        };
        if words::judge(&heard) == Words::Finished {
            tracing::debug!("whole words: the turn model is not asked");
            pause.judging = Judging::Judged(true);
        } else if let Judging::Words(audio) =
            std::mem::replace(&mut pause.judging, Judging::Skipped)
        {
            self.ask_model(audio, now);
        }
    }

    /// The open turn's words so far: its finals, then its latest interim.
    fn heard(&self) -> String {
        let mut heard = self.turn.text.clone();
        heard.push(' ');
        if let Phase::Open(turn) = &self.phase {
            heard.push_str(&turn.interim);
        }
        heard
    }

    fn on_transcript(&mut self, text: &str, is_final: bool, now: Instant) {
        if let Some(turn) = self.open() {
            if is_final {
                turn.interim.clear();
            } else {
                text.clone_into(&mut turn.interim);
            }
        }
        if self.missed_speech(text) {
            self.forward();
            if is_final {
                self.keep_words(text);
            }
            self.unconfirmed = None;
            if let Some(turn) = self.open() {
                turn.by_transcript = true;
                turn.end = Some(now + TRANSCRIPT_TURN_TIMEOUT);
            }
            return;
        }
        let (vad_speaking, owed) = (self.vad_speaking, self.owed);
        if let Some(turn) = self.open()
            && !vad_speaking
            && owed == 0
            && turn.by_transcript
        {
            // Words keep a turn the VAD did not hear open.
            turn.end = Some(now + TRANSCRIPT_TURN_TIMEOUT);
        }
        // Words outside any turn and not owed to one (a remark over the bot the VAD did not
        // hear) are no turn's.
        let turns = self.in_turn() || self.turn.ended || self.owed > 0;
        let Some(unconfirmed) = self.unconfirmed else {
            self.forward();
            if is_final && turns {
                self.keep_words(text);
                self.hand_on();
            }
            return;
        };
        let words = self.barge_in.words_in(text);
        let heard = unconfirmed.final_words + words;
        if is_final && let Some(u) = self.unconfirmed.as_mut() {
            u.final_words += words;
        }
        if heard >= self.barge_in.words_needed() {
            self.unconfirmed = None;
            self.resume_at = None;
            tracing::debug!(words = heard, "barge-in confirmed");
            self.onset_hold = OnsetHold::Off;
            self.actions.push(Action::Interrupt);
            self.forward();
            if is_final {
                self.keep_words(text);
                self.hand_on();
            }
        } else if unconfirmed.turn_over {
            // Too short to interrupt: while the bot talks on, the remark is not a turn.
            tracing::debug!(text, "remark over the bot dropped");
        } else {
            self.forward();
            if is_final {
                self.keep_words(text);
                self.hand_on();
            }
        }
    }

    /// A transcript of speech the VAD did not hear, outside any turn: opens a turn, ahead of
    /// the transcript so the aggregator keeps its words for it; returns whether it did.
    fn missed_speech(&mut self, text: &str) -> bool {
        let words = word_count(text);
        // Words of a barge-in still waiting for them belong to that barge-in.
        if words == 0
            || self.vad_speaking
            || self.owed > 0
            || self.in_turn()
            || self.unconfirmed.is_some()
        {
            return false;
        }
        if self.bot_speaking
            && self.interruptions
            && self.barge_in.waits()
            && self.barge_in.words_in(text) < self.barge_in.words_needed()
        {
            // A remark over the bot, as for speech the VAD heard.
            return false;
        }
        tracing::debug!(
            text,
            "transcript without VAD speech: the user's turn starts"
        );
        self.phase = Phase::Open(OpenTurn::default());
        self.push(SystemFrame::UserStartedSpeaking);
        if self.interruptions && (self.bot_speaking || self.unspoken) {
            self.onset_hold = OnsetHold::Off;
            self.answer_cut();
            self.actions.push(Action::Interrupt);
        }
        true
    }

    fn on_verdict(
        &mut self,
        id: u64,
        judged: Result<Option<TurnPrediction>, String>,
        now: Instant,
    ) {
        if !self.awaits(id) {
            // The user spoke again while the model worked (the pause was not the end, whatever
            // it says), or the turn has ended already.
            return;
        }
        let judging = match &judged {
            // Skipped: the user spoke again before the model was free.
            Ok(None) | Err(_) => Judging::Skipped,
            Ok(Some(p)) => {
                tracing::debug!(
                    probability = p.probability,
                    complete = p.complete,
                    "verdict"
                );
                Judging::Judged(p.complete)
            }
        };
        if let Some(pause) = self.open().and_then(|turn| turn.pause.as_mut()) {
            pause.judging = judging;
        }
        match judged {
            Ok(None) => {}
            Ok(Some(_)) => self.reconsider(now),
            Err(e) => {
                tracing::warn!(error = %e, "turn model failed; ending the turn");
                self.end_turn(now);
            }
        }
    }

    fn on_tick(&mut self, now: Instant) {
        let mut end = false;
        if let Some(turn) = self.open() {
            if turn.verdict_by().is_some_and(|by| by <= now) {
                tracing::debug!("no verdict in time: the turn ends on its silence");
                turn.end = Some(now);
            }
            end = turn.end.is_some_and(|d| d <= now) && !turn.onset_in_pause;
        }
        if end {
            self.end_turn(now);
        }
        if let OnsetHold::Fading(at) = self.onset_hold
            && at <= now
        {
            self.onset_hold = OnsetHold::Off;
            tracing::debug!("the onset faded: the bot plays on");
            self.push(SystemFrame::ResumePlayback);
        }
        if self.resume_at.is_some_and(|r| r <= now) {
            self.resume_at = None;
            // A paused bot whose interruption no words confirmed plays on.
            if let Some(unconfirmed) = self.unconfirmed.as_mut()
                && unconfirmed.paused
            {
                unconfirmed.paused = false;
                tracing::debug!("false interruption: the bot resumes");
                self.push(SystemFrame::ResumePlayback);
            }
        }
    }

    /// Weighs the model's verdict on the pause with the turn's words, once both are in (the
    /// words are in when the STT owes no final: until then a finished verdict waits for them,
    /// since the turn cannot be answered without them), and sets when the turn ends, or ends it.
    fn reconsider(&mut self, now: Instant) {
        self.judge_by_words(now);
        let StopRule::Model {
            incomplete_timeout,
            words,
        } = self.stop
        else {
            return;
        };
        let Phase::Open(OpenTurn {
            pause:
                Some(Pause {
                    at: paused,
                    judging: Judging::Judged(finished),
                }),
            ..
        }) = self.phase
        else {
            return;
        };
        if self.vad_speaking {
            return;
        }
        if words && self.owed > 0 {
            // The pause's words are on their way: decide when they are in (the turn could not
            // be answered before anyway), or at the deadline set at the pause.
            return;
        }
        let words = words.then(|| words::judge(&self.heard()));
        let wait = match (finished, words) {
            (true, Some(Words::Trailing | Words::Open)) => TRAILING_WORDS_HOLD,
            (true, Some(_)) if self.preemptive && self.answer_ready() => FINISHED_TURN_MIN_HOLD,
            (true, Some(_)) if self.preemptive => FINISHED_TURN_HOLD,
            (true, _) => Duration::ZERO,
            (false, Some(Words::Finished)) => FINISHED_WORDS_WAIT,
            (false, Some(Words::Open)) => OPEN_WORDS_WAIT,
            (false, _) => incomplete_timeout,
        };
        let due = paused + wait.min(incomplete_timeout);
        let Some(turn) = self.open() else {
            return;
        };
        if due <= now && !turn.onset_in_pause {
            self.end_turn(now);
        } else {
            turn.end = Some(due);
        }
    }

    /// Leaves the open turn: what it held goes with it (a verdict still to come is too late),
    /// and its words are handed on once their finals are in.
    fn end_turn(&mut self, now: Instant) {
        self.phase = Phase::Idle;
        self.audio.end_turn();
        self.turn.ended = true;
        if let Some(unconfirmed) = self.unconfirmed.as_mut() {
            unconfirmed.turn_over = true;
            if unconfirmed.paused
                && let Some(after) = self.barge_in.resume_after
            {
                self.resume_at = Some(now + after);
            }
        }
        self.push(SystemFrame::UserStoppedSpeaking);
        self.hand_on();
    }
}

/// Words in a transcript, punctuation aside.
pub(super) fn word_count(text: &str) -> usize {
    text.split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INCOMPLETE: Duration = Duration::from_secs(3);

    fn model_machine() -> TurnMachine {
        words_machine(true)
    }

    /// A machine on the turn model, weighing the words or not.
    fn words_machine(words: bool) -> TurnMachine {
        TurnMachine::new(
            StopRule::Model {
                incomplete_timeout: INCOMPLETE,
                words,
            },
            BargeIn::default(),
        )
    }

    /// The frames pushed, by name, and the verdicts asked for.
    fn pushed(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Push(frame) => {
                    Some(crate::frames::Frame::from(frame.clone()).name().to_owned())
                }
                Action::Interrupt => Some("interruption".to_owned()),
                Action::Judge { id, .. } => Some(format!("judge {id}")),
                Action::Answer(text) => Some(format!("answer: {text}")),
                Action::Guess { text, .. } => Some(format!("guess: {text}")),
                Action::Forward => None,
            })
            .collect()
    }

    fn verdict(id: u64, complete: bool) -> Input<'static> {
        Input::Verdict {
            id,
            judged: Ok(Some(TurnPrediction {
                complete,
                probability: if complete { 0.9 } else { 0.1 },
            })),
        }
    }

    #[test]
    fn a_pause_the_model_calls_finished_ends_the_turn_when_the_verdict_lands() {
        let mut m = model_machine();
        let t0 = Instant::now();
        assert_eq!(
            pushed(&m.handle(Input::VadStarted, t0)),
            ["user_started_speaking"]
        );
        let pause = t0 + Duration::from_millis(800);
        assert_eq!(pushed(&m.handle(Input::VadStopped, pause)), ["judge 1"]);
        assert_eq!(m.next_deadline(), Some(pause + VERDICT_WAIT));
        let done = m.handle(verdict(1, true), pause + Duration::from_millis(70));
        assert_eq!(pushed(&done), ["user_stopped_speaking"]);
        assert_eq!(m.next_deadline(), None);
        assert!(!m.in_turn());
    }

    #[test]
    fn an_unfinished_verdict_waits_for_more_speech_up_to_the_timeout() {
        let mut m = model_machine();
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        m.handle(Input::VadStopped, t0);
        assert!(pushed(&m.handle(verdict(1, false), t0 + Duration::from_millis(70))).is_empty());
        assert_eq!(m.next_deadline(), Some(t0 + INCOMPLETE));
        assert!(
            pushed(&m.handle(Input::Tick, t0 + INCOMPLETE - Duration::from_millis(1))).is_empty()
        );
        assert_eq!(
            pushed(&m.handle(Input::Tick, t0 + INCOMPLETE)),
            ["user_stopped_speaking"]
        );
    }

    fn final_words(text: &str) -> Input<'_> {
        Input::Transcript {
            text,
            is_final: true,
        }
    }

    /// A turn spoken from `t0`, paused at `pause` with a final owed, judged by the model.
    fn judged_pause(m: &mut TurnMachine, t0: Instant, pause: Instant, complete: bool) {
        m.handle(Input::VadStarted, t0);
        m.handle(Input::TranscriptionPending, pause);
        m.handle(Input::VadStopped, pause);
        m.handle(verdict(1, complete), pause + Duration::from_millis(60));
    }

    /// A turn spoken from `t0` by a machine guessing answers, paused at `pause` with a final
    /// owed: nothing is asked of the model before the words are in.
    fn guessed_pause(m: &mut TurnMachine, t0: Instant, pause: Instant) {
        m.set_preemptive(true);
        m.handle(Input::VadStarted, t0);
        m.handle(Input::TranscriptionPending, pause);
        assert!(pushed(&m.handle(Input::VadStopped, pause)).is_empty());
    }

    #[test]
    fn a_pause_whose_words_are_in_guesses_the_turn_before_it_ends() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        guessed_pause(&mut m, t0, pause);
        let heard = pause + Duration::from_millis(200);
        assert!(pushed(&m.handle(final_words("What time is it?"), heard)).is_empty());
        assert_eq!(
            pushed(&m.handle(Input::TranscriptionDone, heard)),
            ["guess: What time is it?"],
            "the words are in, the turn is open"
        );
        assert!(m.in_turn());
        assert_eq!(
            pushed(&m.handle(Input::Tick, pause + FINISHED_TURN_HOLD)),
            ["user_stopped_speaking", "answer: What time is it?"],
            "the turn ends with the words guessed"
        );
    }

    #[test]
    fn words_in_doubt_ask_the_model_with_the_audio_of_the_pause() {
        let mut m = model_machine();
        m.set_preemptive(true);
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(1);
        m.handle(Input::VadStarted, t0);
        m.handle(
            Input::Audio(&AudioFrame::new(vec![1; 16_000], 16_000, 1)),
            pause,
        );
        m.handle(Input::TranscriptionPending, pause);
        assert!(pushed(&m.handle(Input::VadStopped, pause)).is_empty());
        // Silence goes on while the words are made; the model does not hear it.
        let heard = pause + Duration::from_millis(300);
        m.handle(
            Input::Audio(&AudioFrame::new(vec![0; 4_800], 16_000, 1)),
            heard,
        );
        m.handle(final_words("I would like to book a table for"), heard);
        let asked: Vec<Vec<i16>> = m
            .handle(Input::TranscriptionDone, heard)
            .into_iter()
            .filter_map(|a| match a {
                Action::Judge { audio, .. } => Some(audio),
                _ => None,
            })
            .collect();
        assert_eq!(asked, [vec![1; 16_000]], "the turn up to its pause");
        // It calls the pause unfinished, and the words trail off: the timeout decides.
        assert!(pushed(&m.handle(verdict(1, false), heard + Duration::from_millis(60))).is_empty());
        assert_eq!(m.next_deadline(), Some(pause + INCOMPLETE));
    }

    #[test]
    fn a_user_who_goes_on_gets_a_new_guess_with_all_their_words() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(1);
        guessed_pause(&mut m, t0, pause);
        m.handle(final_words("I would like"), pause);
        assert_eq!(
            pushed(&m.handle(Input::TranscriptionDone, pause)),
            ["judge 1", "guess: I would like"],
            "words that trail off go to the model"
        );
        let again = pause + Duration::from_millis(500);
        assert!(pushed(&m.handle(Input::VadStarted, again)).is_empty());
        let second = again + Duration::from_secs(1);
        m.handle(Input::TranscriptionPending, second);
        m.handle(Input::VadStopped, second);
        m.handle(final_words("a table for two."), second);
        assert_eq!(
            pushed(&m.handle(Input::TranscriptionDone, second)),
            ["guess: I would like a table for two."]
        );
    }

    #[test]
    fn without_preemption_nothing_is_guessed() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        judged_pause(&mut m, t0, pause, false);
        m.handle(final_words("What time is it?"), pause);
        assert!(pushed(&m.handle(Input::TranscriptionDone, pause)).is_empty());
    }

    #[test]
    fn an_unfinished_verdict_on_a_whole_question_ends_the_turn_soon_after_the_pause() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        judged_pause(&mut m, t0, pause, false);
        assert_eq!(
            m.next_deadline(),
            Some(pause + INCOMPLETE),
            "the words are owed"
        );
        let heard = pause + Duration::from_millis(300);
        m.handle(final_words("What is the capital city of Italy?"), heard);
        assert!(pushed(&m.handle(Input::TranscriptionDone, heard)).is_empty());
        assert_eq!(m.next_deadline(), Some(pause + FINISHED_WORDS_WAIT));
        assert_eq!(
            pushed(&m.handle(Input::Tick, pause + FINISHED_WORDS_WAIT)),
            [
                "user_stopped_speaking",
                "answer: What is the capital city of Italy?"
            ]
        );
    }

    #[test]
    fn with_the_words_off_the_verdict_alone_decides() {
        let mut m = words_machine(false);
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        judged_pause(&mut m, t0, pause, false);
        let heard = pause + Duration::from_millis(300);
        m.handle(final_words("What is the capital city of Italy?"), heard);
        m.handle(Input::TranscriptionDone, heard);
        assert_eq!(m.next_deadline(), Some(pause + INCOMPLETE));
    }

    #[test]
    fn words_that_arrive_after_the_short_wait_end_the_turn_at_once() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        judged_pause(&mut m, t0, pause, false);
        let late = pause + FINISHED_WORDS_WAIT + Duration::from_millis(100);
        m.handle(final_words("Set a timer for five minutes."), late);
        assert_eq!(
            pushed(&m.handle(Input::TranscriptionDone, late)),
            [
                "user_stopped_speaking",
                "answer: Set a timer for five minutes."
            ]
        );
    }

    #[test]
    fn an_unfinished_verdict_on_words_that_trail_off_waits_the_whole_timeout() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        judged_pause(&mut m, t0, pause, false);
        let heard = pause + Duration::from_millis(300);
        m.handle(final_words("I want to book a table for"), heard);
        m.handle(Input::TranscriptionDone, heard);
        assert_eq!(m.next_deadline(), Some(pause + INCOMPLETE));
        // The user goes on within the pause: the turn is theirs still.
        m.handle(Input::VadStarted, pause + Duration::from_millis(700));
        assert!(m.in_turn());
        assert_eq!(m.next_deadline(), None);
    }

    #[test]
    fn an_unfinished_verdict_on_words_that_may_be_whole_waits_a_second_not_the_timeout() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        judged_pause(&mut m, t0, pause, false);
        let heard = pause + Duration::from_millis(300);
        m.handle(final_words("Do you know where the station is?"), heard);
        m.handle(Input::TranscriptionDone, heard);
        assert_eq!(m.next_deadline(), Some(pause + OPEN_WORDS_WAIT));
        assert_eq!(
            pushed(&m.handle(Input::Tick, pause + OPEN_WORDS_WAIT)),
            [
                "user_stopped_speaking",
                "answer: Do you know where the station is?"
            ]
        );
    }

    #[test]
    fn a_finished_verdict_on_words_that_trail_off_holds_the_turn_a_moment() {
        let mut m = model_machine();
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        m.handle(
            final_words("Tell me about cats and"),
            t0 + Duration::from_secs(1),
        );
        let pause = t0 + Duration::from_secs(2);
        m.handle(Input::VadStopped, pause);
        assert!(pushed(&m.handle(verdict(1, true), pause + Duration::from_millis(60))).is_empty());
        assert_eq!(m.next_deadline(), Some(pause + TRAILING_WORDS_HOLD));
        assert_eq!(
            pushed(&m.handle(Input::Tick, pause + TRAILING_WORDS_HOLD)),
            ["user_stopped_speaking", "answer: Tell me about cats and"]
        );
    }

    #[test]
    fn a_finished_verdict_waits_for_the_owed_final_and_holds_a_moment_if_it_trails_off() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        judged_pause(&mut m, t0, pause, true);
        assert!(m.in_turn(), "the words decide");
        let heard = pause + Duration::from_millis(300);
        m.handle(final_words("I would like to book a table for"), heard);
        assert!(pushed(&m.handle(Input::TranscriptionDone, heard)).is_empty());
        assert_eq!(m.next_deadline(), Some(pause + TRAILING_WORDS_HOLD));
        // The user goes on: one turn.
        m.handle(Input::VadStarted, pause + Duration::from_millis(500));
        assert!(m.in_turn());
    }

    #[test]
    fn a_finished_verdict_on_a_whole_sentence_ends_the_turn_as_its_final_lands() {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        judged_pause(&mut m, t0, pause, true);
        let heard = pause + Duration::from_millis(300);
        m.handle(final_words("Who wrote the play Hamlet?"), heard);
        assert_eq!(
            pushed(&m.handle(Input::TranscriptionDone, heard)),
            [
                "user_stopped_speaking",
                "answer: Who wrote the play Hamlet?"
            ]
        );
    }

    /// A machine guessing answers, in a pause whose `words` are whole, the words in 100 ms
    /// after the VAD's stop; the pause's start and what the words' arrival pushed.
    fn held_turn(words: &str) -> (TurnMachine, Instant, Vec<String>) {
        let mut m = model_machine();
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        guessed_pause(&mut m, t0, pause);
        let heard = pause + Duration::from_millis(100);
        m.handle(final_words(words), heard);
        let done = pushed(&m.handle(Input::TranscriptionDone, heard));
        (m, pause, done)
    }

    #[test]
    fn a_finished_turn_whose_answer_is_guessed_ends_after_a_hold_the_answer_is_made_in() {
        let (mut m, pause, done) = held_turn("Who wrote the play Hamlet?");
        assert_eq!(
            done,
            ["guess: Who wrote the play Hamlet?"],
            "the answer starts at once, and the model is not asked"
        );
        assert_eq!(m.next_deadline(), Some(pause + FINISHED_TURN_HOLD));
        assert_eq!(
            pushed(&m.handle(Input::Tick, pause + FINISHED_TURN_HOLD)),
            [
                "user_stopped_speaking",
                "answer: Who wrote the play Hamlet?"
            ]
        );
    }

    #[test]
    fn a_user_who_goes_on_within_the_hold_is_not_cut_off() {
        let (mut m, pause, _) = held_turn("My favourite colour is blue.");
        // The user goes on 300 ms into the hold; the VAD hears an onset at once and confirms
        // it as speech 200 ms later, after the hold has run out.
        let onset = pause + Duration::from_millis(300);
        m.handle(Input::Onset { near_speaker: true }, onset);
        assert_eq!(m.next_deadline(), None, "the hold waits for the onset");
        assert!(pushed(&m.handle(Input::Tick, pause + FINISHED_TURN_HOLD)).is_empty());
        m.handle(Input::VadStarted, onset + Duration::from_millis(200));
        assert!(m.in_turn(), "one turn");
    }

    #[test]
    fn a_finished_turn_ends_once_its_guessed_answer_is_spoken_but_not_before_the_least_hold() {
        let (mut m, pause, _) = held_turn("Who wrote the play Hamlet?");
        assert!(
            pushed(&m.handle(Input::GuessSpoken(1), pause + Duration::from_millis(150))).is_empty()
        );
        assert_eq!(m.next_deadline(), Some(pause + FINISHED_TURN_MIN_HOLD));
        assert_eq!(
            pushed(&m.handle(Input::Tick, pause + FINISHED_TURN_MIN_HOLD)),
            [
                "user_stopped_speaking",
                "answer: Who wrote the play Hamlet?"
            ]
        );

        let (mut m, pause, _) = held_turn("Who wrote the play Hamlet?");
        assert_eq!(
            pushed(&m.handle(Input::GuessSpoken(1), pause + Duration::from_millis(350))),
            [
                "user_stopped_speaking",
                "answer: Who wrote the play Hamlet?"
            ],
            "an answer ready after the least hold is not held back"
        );
    }

    #[test]
    fn speech_of_another_guess_does_not_shorten_the_hold() {
        let (mut m, pause, _) = held_turn("Who wrote the play Hamlet?");
        assert!(
            pushed(&m.handle(Input::GuessSpoken(2), pause + Duration::from_millis(350))).is_empty()
        );
        assert_eq!(m.next_deadline(), Some(pause + FINISHED_TURN_HOLD));
    }

    #[test]
    fn words_settled_before_the_stop_start_the_guess_in_the_silence() {
        let mut m = model_machine();
        m.set_preemptive(true);
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        let silence = t0 + Duration::from_secs(1);
        m.handle(Input::SilenceStarted, silence);
        let settled = silence + Duration::from_millis(150);
        assert_eq!(
            pushed(&m.handle(Input::Settled("What time is it?"), settled)),
            ["guess: What time is it?"]
        );
        // The stop's final repeats the words: nothing new to guess.
        let pause = silence + Duration::from_millis(200);
        m.handle(Input::TranscriptionPending, pause);
        m.handle(Input::VadStopped, pause);
        m.handle(final_words("What time is it?"), pause);
        assert!(pushed(&m.handle(Input::TranscriptionDone, pause)).is_empty());
        assert_eq!(m.next_deadline(), Some(pause + FINISHED_TURN_HOLD));
        assert_eq!(
            pushed(&m.handle(Input::GuessSpoken(1), settled + Duration::from_millis(400))),
            ["user_stopped_speaking", "answer: What time is it?"],
            "the answer made in the silence plays as soon as it is spoken"
        );
    }

    #[test]
    fn speech_that_resumes_before_the_stop_drops_the_settled_guess() {
        let mut m = model_machine();
        m.set_preemptive(true);
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        let silence = t0 + Duration::from_secs(1);
        m.handle(Input::SilenceStarted, silence);
        m.handle(Input::SpeechResumed, silence + Duration::from_millis(100));
        assert!(
            pushed(&m.handle(
                Input::Settled("Book a table"),
                silence + Duration::from_millis(150)
            ))
            .is_empty(),
            "the user went on: the words are not all in"
        );
        let again = silence + Duration::from_secs(1);
        m.handle(Input::SilenceStarted, again);
        assert_eq!(
            pushed(&m.handle(
                Input::Settled("Book a table for two."),
                again + Duration::from_millis(150)
            )),
            ["guess: Book a table for two."]
        );
        m.handle(Input::SpeechResumed, again + Duration::from_millis(180));
        // Spoken after the user went on: that guess is gone.
        let pause = again + Duration::from_secs(1);
        m.handle(Input::TranscriptionPending, pause);
        m.handle(Input::VadStopped, pause);
        m.handle(final_words("Book a table for two."), pause);
        assert_eq!(
            pushed(&m.handle(Input::TranscriptionDone, pause)),
            ["guess: Book a table for two."],
            "guessed again at the stop"
        );
        assert!(pushed(&m.handle(Input::GuessSpoken(1), pause)).is_empty());
        assert_eq!(m.next_deadline(), Some(pause + FINISHED_TURN_HOLD));
    }

    #[test]
    fn an_onset_that_fades_in_the_hold_ends_the_turn_if_the_hold_is_over() {
        let (mut m, pause, _) = held_turn("Who wrote the play Hamlet?");
        m.handle(
            Input::Onset { near_speaker: true },
            pause + Duration::from_millis(400),
        );
        let faded = pause + FINISHED_TURN_HOLD + Duration::from_millis(50);
        assert_eq!(
            pushed(&m.handle(Input::OnsetFaded, faded)),
            [
                "user_stopped_speaking",
                "answer: Who wrote the play Hamlet?"
            ],
            "a click does not hold the turn past it"
        );
    }

    #[test]
    fn with_the_words_off_a_finished_verdict_ends_the_turn_at_once() {
        let mut m = words_machine(false);
        let t0 = Instant::now();
        let pause = t0 + Duration::from_secs(2);
        m.handle(Input::VadStarted, t0);
        m.handle(Input::TranscriptionPending, pause);
        m.handle(Input::VadStopped, pause);
        assert_eq!(
            pushed(&m.handle(verdict(1, true), pause + Duration::from_millis(60))),
            ["user_stopped_speaking"]
        );
    }

    #[test]
    fn a_verdict_on_a_pause_the_user_spoke_past_is_ignored_and_no_longer_awaited() {
        let mut m = model_machine();
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        m.handle(Input::VadStopped, t0);
        assert!(m.awaits(1));
        m.handle(Input::VadStarted, t0 + Duration::from_millis(300));
        assert!(!m.awaits(1), "the model may skip it");
        assert!(pushed(&m.handle(verdict(1, true), t0 + Duration::from_millis(350))).is_empty());
        assert!(m.in_turn());
        // The next pause is judged afresh.
        assert_eq!(
            pushed(&m.handle(Input::VadStopped, t0 + Duration::from_secs(1))),
            ["judge 2"]
        );
    }

    #[test]
    fn a_verdict_that_does_not_come_in_time_ends_the_turn_on_its_silence() {
        let mut m = model_machine();
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        m.handle(Input::VadStopped, t0);
        assert_eq!(
            pushed(&m.handle(Input::Tick, t0 + VERDICT_WAIT)),
            ["user_stopped_speaking"]
        );
        // Too late now.
        assert!(pushed(&m.handle(verdict(1, true), t0 + VERDICT_WAIT * 2)).is_empty());
    }

    #[test]
    fn a_failed_model_ends_the_turn_rather_than_holding_it() {
        let mut m = model_machine();
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        m.handle(Input::VadStopped, t0);
        let failed = Input::Verdict {
            id: 1,
            judged: Err("the model is gone".into()),
        };
        assert_eq!(pushed(&m.handle(failed, t0)), ["user_stopped_speaking"]);
    }

    #[test]
    fn a_silence_outside_a_turn_asks_the_model_nothing() {
        let mut m = model_machine();
        assert!(pushed(&m.handle(Input::VadStopped, Instant::now())).is_empty());
        assert_eq!(m.next_deadline(), None);
    }

    #[test]
    fn a_remark_over_the_bot_is_dropped_before_the_transcript_goes_on() {
        let barge_in = BargeIn {
            min_words: 3,
            ..BargeIn::default()
        };
        let mut m = TurnMachine::new(StopRule::Silence(Duration::from_millis(300)), barge_in);
        let t0 = Instant::now();
        m.handle(Input::BotStarted, t0);
        m.handle(Input::VadStarted, t0);
        m.handle(Input::VadStopped, t0);
        m.handle(Input::Tick, t0 + Duration::from_millis(300));
        let late = Input::Transcript {
            text: "Yeah.",
            is_final: true,
        };
        let actions = m.handle(late, t0 + Duration::from_millis(400));
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::Forward | Action::Answer(_))),
            "{actions:?}"
        );
    }

    /// A machine with backchannels on, the bot speaking from `t0`.
    fn talking_bot_hearing_reactions(t0: Instant) -> TurnMachine {
        let barge_in = BargeIn {
            backchannels: true,
            pause_at_onset: false,
            ..BargeIn::default()
        };
        let mut m = TurnMachine::new(StopRule::Silence(SILENCE), barge_in);
        m.handle(Input::BotStarted, t0);
        m
    }

    /// A short remark over the bot from `at`, written as `interim` then `last`: what it did.
    fn remark(m: &mut TurnMachine, at: Instant, interim: &str, last: &str) -> Vec<Action> {
        let mut actions = m.handle(Input::VadStarted, at);
        let interim = Input::Transcript {
            text: interim,
            is_final: false,
        };
        actions.extend(m.handle(interim, at + Duration::from_millis(300)));
        actions.extend(m.handle(Input::VadStopped, at + Duration::from_millis(500)));
        actions.extend(m.handle(final_(last), at + Duration::from_millis(600)));
        actions.extend(m.handle(Input::Tick, at + Duration::from_millis(900)));
        actions
    }

    /// `text` as an interim transcript at `at`: whether it interrupted the bot.
    fn interim_interrupts(m: &mut TurnMachine, at: Instant, text: &str) -> bool {
        let interim = Input::Transcript {
            text,
            is_final: false,
        };
        m.handle(interim, at)
            .iter()
            .any(|a| matches!(a, Action::Interrupt))
    }

    fn talked_on(actions: &[Action]) -> bool {
        !actions
            .iter()
            .any(|a| matches!(a, Action::Interrupt | Action::Answer(_)))
    }

    #[test]
    fn reactions_over_the_bot_let_it_talk_on_and_a_word_that_is_not_one_stops_it() {
        let t0 = Instant::now();
        let mut m = talking_bot_hearing_reactions(t0);
        // "Mm-hmm", heard and transcribed: the bot talks on, and no turn is answered.
        let actions = remark(&mut m, t0, "Mm-hmm", "Mm-hmm.");
        assert!(talked_on(&actions), "{actions:?}");
        // "Wait, stop": its first interim word stops the bot.
        let t1 = t0 + Duration::from_secs(2);
        m.handle(Input::VadStarted, t1);
        assert!(interim_interrupts(
            &mut m,
            t1 + Duration::from_millis(300),
            "Wait"
        ));
    }

    #[test]
    fn a_lone_word_over_the_bot_waits_for_the_next_and_alone_is_taken_as_a_reaction() {
        let t0 = Instant::now();
        let mut m = talking_bot_hearing_reactions(t0);
        // "I see", heard as "I": the bot talks on, and no turn is answered.
        let actions = remark(&mut m, t0, "I", "I.");
        assert!(talked_on(&actions), "{actions:?}");
        // "Tell me about cats": its first word waits, its next ones stop the bot.
        let t1 = t0 + Duration::from_secs(2);
        m.handle(Input::VadStarted, t1);
        assert!(!interim_interrupts(
            &mut m,
            t1 + Duration::from_millis(300),
            "Tell"
        ));
        assert!(interim_interrupts(
            &mut m,
            t1 + Duration::from_millis(800),
            "Tell me about"
        ));
    }

    #[test]
    fn without_backchannels_a_reaction_counts_as_a_word() {
        let barge_in = BargeIn {
            min_words: 1,
            pause_at_onset: false,
            ..BargeIn::default()
        };
        let mut m = TurnMachine::new(StopRule::Silence(SILENCE), barge_in);
        let t0 = Instant::now();
        m.handle(Input::BotStarted, t0);
        m.handle(Input::VadStarted, t0);
        let interim = Input::Transcript {
            text: "Yeah",
            is_final: false,
        };
        let actions = m.handle(interim, t0 + Duration::from_millis(300));
        assert!(
            actions.iter().any(|a| matches!(a, Action::Interrupt)),
            "{actions:?}"
        );
    }

    fn silence_machine() -> TurnMachine {
        TurnMachine::new(StopRule::Silence(SILENCE), BargeIn::default())
    }

    const SILENCE: Duration = Duration::from_millis(300);

    fn final_(text: &str) -> Input<'_> {
        Input::Transcript {
            text,
            is_final: true,
        }
    }

    /// A turn of speech from `at`: started, stopped, ended by its silence. Returns what the
    /// turn's end pushed.
    fn spoken_turn(m: &mut TurnMachine, at: Instant, words: Option<&str>) -> Vec<String> {
        m.handle(Input::VadStarted, at);
        if let Some(words) = words {
            m.handle(final_(words), at);
        }
        m.handle(Input::VadStopped, at);
        pushed(&m.handle(Input::Tick, at + SILENCE))
    }

    #[test]
    fn a_turn_that_ends_before_its_last_transcript_is_handed_on_with_it() {
        let mut m = silence_machine();
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        m.handle(final_("What is the weather like in,"), t0);
        m.handle(Input::TranscriptionPending, t0);
        m.handle(Input::VadStopped, t0);
        assert_eq!(
            pushed(&m.handle(Input::Tick, t0 + SILENCE)),
            ["user_stopped_speaking"],
            "the turn waits for the final the STT announced"
        );
        let late = t0 + SILENCE * 2;
        assert!(pushed(&m.handle(final_("Paris?"), late)).is_empty());
        assert_eq!(
            pushed(&m.handle(Input::TranscriptionDone, late)),
            ["answer: What is the weather like in, Paris?"]
        );
    }

    #[test]
    fn a_final_with_no_words_does_not_hold_the_turn() {
        let mut m = silence_machine();
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        m.handle(final_("Hello."), t0);
        m.handle(Input::TranscriptionPending, t0);
        m.handle(Input::VadStopped, t0);
        m.handle(Input::Tick, t0 + SILENCE);
        // The last decode found no words: only the done marker comes.
        assert_eq!(
            pushed(&m.handle(Input::TranscriptionDone, t0 + SILENCE)),
            ["answer: Hello."]
        );
    }

    #[test]
    fn speech_before_the_turn_is_handed_on_joins_it() {
        let mut m = silence_machine();
        let t0 = Instant::now();
        m.handle(Input::VadStarted, t0);
        m.handle(final_("Book a table"), t0);
        m.handle(Input::TranscriptionPending, t0);
        m.handle(Input::VadStopped, t0);
        m.handle(Input::Tick, t0 + SILENCE);
        // The user goes on while the STT still works: nothing was asked, nothing to interrupt.
        let on = t0 + SILENCE * 2;
        assert_eq!(
            pushed(&m.handle(Input::VadStarted, on)),
            ["user_started_speaking"]
        );
        m.handle(final_("for two."), on);
        m.handle(Input::TranscriptionDone, on);
        m.handle(Input::VadStopped, on);
        assert_eq!(
            pushed(&m.handle(Input::Tick, on + SILENCE)),
            ["user_stopped_speaking", "answer: Book a table for two."]
        );
    }

    #[test]
    fn a_cough_that_cut_off_the_answer_in_the_making_asks_for_it_again() {
        let mut m = silence_machine();
        let t0 = Instant::now();
        assert_eq!(
            spoken_turn(&mut m, t0, Some("What time is it?")),
            ["user_stopped_speaking", "answer: What time is it?"]
        );
        let cough = t0 + SILENCE * 2;
        assert_eq!(
            pushed(&m.handle(Input::VadStarted, cough)),
            ["user_started_speaking", "interruption"]
        );
        m.handle(Input::VadStopped, cough);
        assert_eq!(
            pushed(&m.handle(Input::Tick, cough + SILENCE)),
            ["user_stopped_speaking", "answer: "]
        );
    }

    #[test]
    fn a_cough_over_an_answer_the_bot_had_begun_to_speak_asks_for_nothing() {
        let mut m = silence_machine();
        let t0 = Instant::now();
        spoken_turn(&mut m, t0, Some("What time is it?"));
        m.handle(Input::BotStarted, t0 + SILENCE * 2);
        assert_eq!(
            spoken_turn(&mut m, t0 + SILENCE * 3, None),
            ["user_stopped_speaking"]
        );
    }

    #[test]
    fn a_cough_after_an_interruption_from_elsewhere_asks_for_the_answer_again() {
        let mut m = silence_machine();
        let t0 = Instant::now();
        spoken_turn(&mut m, t0, Some("What time is it?"));
        m.handle(Input::Interruption, t0 + SILENCE * 2);
        assert_eq!(
            spoken_turn(&mut m, t0 + SILENCE * 3, None),
            ["user_stopped_speaking", "answer: "]
        );
    }

    #[test]
    fn a_turn_without_words_and_nothing_cut_off_hands_on_nothing() {
        let mut m = silence_machine();
        assert_eq!(
            spoken_turn(&mut m, Instant::now(), None),
            ["user_stopped_speaking"]
        );
    }

    #[test]
    fn a_transcript_after_its_turn_with_nothing_announced_is_a_turn_of_its_own() {
        let mut m = silence_machine();
        let t0 = Instant::now();
        spoken_turn(&mut m, t0, None);
        let late = t0 + SILENCE * 2;
        assert_eq!(
            pushed(&m.handle(final_("Bye."), late)),
            ["user_started_speaking"]
        );
        assert_eq!(
            pushed(&m.handle(Input::Tick, late + TRANSCRIPT_TURN_TIMEOUT)),
            ["user_stopped_speaking", "answer: Bye."]
        );
    }
}
