//! The speech state machine over model windows: QUIET → STARTING → SPEAKING → STOPPING → QUIET.
//!
//! A window counts as speech when the model's confidence and the smoothed loudness both pass
//! their thresholds. Speech must last `start_secs` to start a turn and silence `stop_secs` to end
//! one, so a click does not start a turn and a breath does not end it.
//!
//! Between windows, the loudness of each 10 ms piece can move the machine sooner
//! ([`VadAnalyzer::between_windows`]): a piece with no sound in it ends speech (its first
//! silence) without waiting for the window to fill, and a piece with a voice's loudness after
//! such a silence takes it back.
//!
//! "No sound" is relative to the room: the analyzer learns the noise floor from the pieces it
//! hears while nobody speaks ([`RoomFloor`]), so a quiet room's hiss ends speech as soon as
//! digital silence does, and a piece must rise clear of that hiss to take a silence back.
//!
//! Where other people talk around the speaker (a café), the model hears their talk as speech
//! too. A window must then stand out of the room's level ([`Background`]), and come near the
//! speaker's own level (`Speaker`): the speaker is nearer the microphone than the room, so the
//! room's talk seldom starts a turn and does not keep one open once the speaker has stopped.
//! Whether the room talks is the model's to say (`RoomTalk`): where it takes nothing heard
//! between turns for speech (a hum, a fan, a street), a loud room holds no onset back, and an
//! onset goes on through the dip between two syllables.
//!
//! Loudness cannot tell a speaker who talks on from the café: the room's level, read over the
//! last seconds, creeps up to the voice's, and the voice's quieter syllables fall under it. A
//! speaker encoder can (`Voiceprint`): enrolled from the loud part of the speaker's turns, it
//! says every quarter second whether the last second was the speaker's voice. While it was,
//! the room's level is not read, so the voice stays clear of it.

use std::sync::Arc;

use super::silero::{SileroState, SileroVad, window_size};
use crate::audio::resample::{ResampleError, StreamResampler};
use crate::models::ModelError;
use crate::speaker::{SpeakerEncoder, similarity};

/// Thresholds and delays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadParams {
    /// Model confidence a window needs to count as speech.
    pub confidence: f32,
    /// Seconds of speech before speaking starts.
    pub start_secs: f32,
    /// Seconds of silence before speaking stops.
    pub stop_secs: f32,
    /// Smoothed loudness (0 to 1) a window needs to count as speech.
    pub min_volume: f32,
}

impl Default for VadParams {
    fn default() -> Self {
        Self {
            confidence: 0.7,
            start_secs: 0.2,
            stop_secs: 0.2,
            min_volume: 0.6,
        }
    }
}

/// Where the speaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VadState {
    /// Silence.
    Quiet,
    /// Speech heard, not yet long enough.
    Starting,
    /// Speaking.
    Speaking,
    /// Silence heard while speaking, not yet long enough.
    Stopping,
}

/// A change of state worth telling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VadEvent {
    /// Speech heard in silence, not yet `start_secs` of it: a start may follow.
    Onset {
        /// It came near the speaker's level, as the speaker's own start does: always where the
        /// speaker is not told from the room by loudness. In a café, an onset under that level
        /// is most likely the room's talk, and starts a turn only if it goes on.
        near_speaker: bool,
    },
    /// An onset that was not `near_speaker` came near the speaker's level before its start.
    OnsetNearSpeaker,
    /// The onset fell quiet before `start_secs`: no start (a click, a cough).
    OnsetFaded,
    /// Speech lasted `start_secs`.
    Started,
    /// Still speaking: a tick every [`SPEAKING_TICK_SECS`] of speech after the start.
    Speaking,
    /// Silence lasted `stop_secs`.
    Stopped,
}

/// A change [`VadAnalyzer::between_windows`] saw in the loudness of 10 ms pieces, before the
/// model's window was whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuickChange {
    /// Speaking, then a piece with no sound in it: the first silence (`Stopping`).
    SilenceStarted,
    /// That silence was inside the speech: a piece with a voice's loudness came (`Speaking`).
    SpeechResumed,
}

/// Why analysis failed.
#[derive(Debug, thiserror::Error)]
pub enum VadError {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The input rate cannot be converted.
    #[error(transparent)]
    Resample(#[from] ResampleError),
}

/// Smoothing of falling loudness between windows (weight of the newest window). Rising loudness
/// is taken at once: a symmetric average needs ~5 windows (160 ms) to lift speech over
/// `min_volume`, and that wait would add to every start and every barge-in.
const VOLUME_RELEASE: f32 = 0.2;

/// Loudness under which a window has no sound in it (its RMS under about -80 dBFS, 3 units of
/// 16-bit audio): digital silence or dither, under all but the quietest microphones' noise
/// floor, and far under any voice.
const SOUNDLESS: f32 = 0.3;

/// Quiet 10 ms pieces heard before the room's floor counts (half a second): a session that
/// opens with speech learns nothing from its first words.
const FLOOR_PIECES: u32 = 50;

/// Weight of each quiet piece in the room's floor once it counts: a time constant of half a
/// second.
const FLOOR_WEIGHT: f32 = 0.02;

/// Weight of a quiet piece louder than the room: a time constant of 2.5 s, so a fan that
/// starts is learned within seconds, and the first 100 ms of a voice (heard before the model
/// is sure of it) barely move the floor.
const FLOOR_RISE_WEIGHT: f32 = 0.004;

/// The least a piece must rise over the floor's mean to be more than the room (6 dB).
const FLOOR_MARGIN: f32 = 0.06;

/// The loudest a piece can be and still be only the room (about -45 dBFS): over a louder floor
/// (a café, a street) a piece's loudness cannot tell the room from a voice, and the model's
/// windows decide alone.
const HUSH_CAP: f32 = 0.65;

/// Pieces heard, speech or not, before a provisional floor counts (0.3 s): a first question
/// said as the microphone opens ends before the room alone has been heard for
/// [`FLOOR_PIECES`].
const PROVISIONAL_PIECES: u32 = 30;

/// The share of all pieces heard under which the provisional floor lies: the gaps between a
/// voice's words and syllables, where only the room sounds.
const PROVISIONAL_SHARE: f32 = 0.1;

/// How far over the provisional floor a piece is more than the room (12 dB): the swing of a
/// 10 ms piece of room tone above its quieter tenth.
const PROVISIONAL_MARGIN: f32 = 0.12;

/// The room's noise floor, learned from the 10 ms pieces heard while nobody speaks (the mean
/// loudness and the mean distance from it). Until [`FLOOR_PIECES`] are heard, a provisional
/// floor stands in: the quieter tenth of every piece heard so far, speech or not, once
/// [`PROVISIONAL_PIECES`] are; before that, only digital silence and dither (under
/// [`SOUNDLESS`]) count as no sound.
#[derive(Debug, Clone, Copy)]
pub struct RoomFloor {
    mean: f32,
    spread: f32,
    heard: u32,
    /// Every piece heard until the floor is known, in 1 dB bins.
    all: [u32; LEVEL_BINS],
    all_heard: u32,
}

impl Default for RoomFloor {
    fn default() -> Self {
        Self {
            mean: 0.0,
            spread: 0.0,
            heard: 0,
            all: [0; LEVEL_BINS],
            all_heard: 0,
        }
    }
}

impl RoomFloor {
    /// Takes any piece, speech or not, for the provisional floor.
    fn hear_any(&mut self, level: f32) {
        if self.known() {
            return;
        }
        // Past u32::MAX pieces (over a year), the share stays what it was.
        if let Some(heard) = self.all_heard.checked_add(1) {
            self.all[bin(level)] += 1;
            self.all_heard = heard;
        }
    }

    /// The provisional floor: the loudness under which [`PROVISIONAL_SHARE`] of the pieces
    /// heard lie.
    fn provisional(&self) -> Option<f32> {
        if self.all_heard < PROVISIONAL_PIECES {
            return None;
        }
        Some(percentile(&self.all, self.all_heard, PROVISIONAL_SHARE))
    }

    /// Learns from a piece of `level` heard while nobody spoke.
    fn hear(&mut self, level: f32) {
        self.heard = self.heard.saturating_add(1);
        if self.heard == 1 {
            self.mean = level;
            return;
        }
        let weight = if self.known() && level > self.hush() {
            FLOOR_RISE_WEIGHT
        } else {
            (1.0 / self.heard as f32).max(FLOOR_WEIGHT)
        };
        let distance = (level - self.mean).abs();
        self.mean += weight * (level - self.mean);
        self.spread += weight * (distance - self.spread);
    }

    fn known(&self) -> bool {
        self.heard >= FLOOR_PIECES
    }

    /// The loudness under which a piece is only the room: three spreads over the floor's mean
    /// (a 10 ms piece of brown noise swings some 16 dB), at least [`FLOOR_MARGIN`], at most
    /// [`HUSH_CAP`].
    pub fn hush(&self) -> f32 {
        if !self.known() {
            return self.provisional().map_or(SOUNDLESS, |floor| {
                (floor + PROVISIONAL_MARGIN).clamp(SOUNDLESS, HUSH_CAP)
            });
        }
        (self.mean + (3.0 * self.spread).max(FLOOR_MARGIN)).clamp(SOUNDLESS, HUSH_CAP)
    }

    /// The loudness a piece needs to be a voice: `min_volume`, and clear of the room.
    fn voice(&self, min_volume: f32) -> f32 {
        min_volume.max(self.hush() + FLOOR_MARGIN)
    }
}

/// Loudness bins of a [`Levels`] histogram: 0.01 (1 dB) each, from 0 to 1.2.
const LEVEL_BINS: usize = 120;

/// The 1 dB bin a loudness falls in.
fn bin(level: f32) -> usize {
    ((level.max(0.0) * 100.0) as usize).min(LEVEL_BINS - 1)
}

/// The loudness under which `share` of the `heard` levels counted in 1 dB bins fall.
fn percentile(counts: &[u32; LEVEL_BINS], heard: u32, share: f32) -> f32 {
    let wanted = (heard as f32 * share).ceil() as u32;
    let mut seen = 0;
    for (bin, &count) in counts.iter().enumerate() {
        seen += count;
        if seen >= wanted {
            return bin as f32 / 100.0;
        }
    }
    0.0
}

/// The loudness of the last so many 10 ms pieces or model windows, in 1 dB bins: its
/// percentiles in constant time and memory.
#[derive(Debug, Clone)]
struct Levels {
    /// The last levels' bins, oldest first, as a ring.
    ring: Vec<u8>,
    next: usize,
    capacity: usize,
    counts: [u32; LEVEL_BINS],
}

impl Levels {
    fn new(capacity: usize) -> Self {
        Self {
            ring: Vec::with_capacity(capacity),
            next: 0,
            capacity,
            counts: [0; LEVEL_BINS],
        }
    }

    fn hear(&mut self, level: f32) {
        let bin = bin(level) as u8;
        if self.ring.len() < self.capacity {
            self.ring.push(bin);
        } else {
            self.counts[usize::from(self.ring[self.next])] -= 1;
            self.ring[self.next] = bin;
            self.next = (self.next + 1) % self.capacity;
        }
        self.counts[usize::from(bin)] += 1;
    }

    fn len(&self) -> usize {
        self.ring.len()
    }

    fn clear(&mut self) {
        self.ring.clear();
        self.next = 0;
        self.counts = [0; LEVEL_BINS];
    }

    /// The loudness under which `share` of the levels heard fall.
    fn percentile(&self, share: f32) -> f32 {
        percentile(&self.counts, self.ring.len() as u32, share)
    }
}

/// 10 ms pieces the background's level is read over (8 s).
const BACKGROUND_PIECES: usize = 800;

/// The share of the pieces quieter than the background's level: a low percentile, which a
/// speaker's own words barely move (speech has gaps between its syllables, a crowd's babble
/// has none), so a monologue does not raise it over the voice.
const BACKGROUND_PERCENTILE: f32 = 0.10;

/// How far over the background a window must be to be the user's speech (10 dB): a voice
/// near the microphone stands out of a café's babble by about that much, the babble itself
/// does not.
const BACKGROUND_MARGIN: f32 = 0.10;

/// The level of what goes on around the speaker: a low percentile of the last 8 s of 10 ms
/// pieces, whoever is speaking. Where that is louder than a quiet room (a café, a crowd),
/// a window has to stand [`BACKGROUND_MARGIN`] over it to be speech: the Silero model hears
/// other people's talk as speech too, and without this a turn in a café never ends.
#[derive(Debug, Clone)]
pub struct Background(Levels);

impl Default for Background {
    fn default() -> Self {
        Self(Levels::new(BACKGROUND_PIECES))
    }
}

impl Background {
    /// Takes one piece's loudness.
    pub fn hear(&mut self, level: f32) {
        self.0.hear(level);
    }

    /// The background's level: the loudness under which [`BACKGROUND_PERCENTILE`] of the
    /// pieces fall; 0 until a second has been heard.
    pub fn level(&self) -> f32 {
        if self.0.len() < 100 {
            return 0.0;
        }
        self.0.percentile(BACKGROUND_PERCENTILE)
    }

    /// Whether it has been heard long enough to tell a voice from it (3 s).
    fn settled(&self) -> bool {
        self.0.len() >= 300
    }

    /// The loudness a window needs to stand out of the background as speech.
    fn speech(&self) -> f32 {
        self.level() + BACKGROUND_MARGIN
    }
}

/// Windows heard while nobody speaks that the room's talk is judged over (8 s).
const ROOM_WINDOWS: usize = 250;

/// Such windows heard before the room is judged (1 s); until then it is taken to talk.
const ROOM_KNOWN: usize = 31;

/// The share of those windows the model must take for speech for the room to talk: it takes a
/// café's babble for speech in nearly all of them (97 % at SNR 20 dB, all at SNR 10), and a
/// steady noise (brown or pink, a fan, a street's hum) in none, however loud.
const ROOM_TALK_SHARE: f32 = 0.25;

/// Whether the room talks: whether the model takes what it hears while nobody speaks for
/// speech. Only then can a loud room pass for the speaker, and only then is the speaker told
/// from it by loudness ([`Speaker`]); over a steady noise, however loud, the model tells the
/// voice from the room on its own, and a voice's softer syllables must not fade its onset.
#[derive(Debug, Clone)]
struct RoomTalk {
    /// The last windows heard while nobody spoke, oldest first: whether the model took each
    /// for speech.
    windows: std::collections::VecDeque<bool>,
    speechlike: usize,
}

impl Default for RoomTalk {
    fn default() -> Self {
        Self {
            windows: std::collections::VecDeque::with_capacity(ROOM_WINDOWS),
            speechlike: 0,
        }
    }
}

impl RoomTalk {
    /// Takes a window heard while nobody spoke, `speechlike` if the model took it for speech.
    fn hear(&mut self, speechlike: bool) {
        if self.windows.len() == ROOM_WINDOWS && self.windows.pop_front() == Some(true) {
            self.speechlike -= 1;
        }
        self.windows.push_back(speechlike);
        self.speechlike += usize::from(speechlike);
    }

    fn talks(&self) -> bool {
        self.windows.len() < ROOM_KNOWN
            || self.speechlike as f32 >= ROOM_TALK_SHARE * self.windows.len() as f32
    }
}

/// What is known of the room around the speaker as a window is judged.
#[derive(Debug, Clone, Copy)]
struct Room {
    /// Whether it talks ([`RoomTalk`]).
    talks: bool,
    /// Its level ([`Background::level`]).
    background: f32,
}

/// Turns the speaker's level is read from: the loudest of the last six. The room's talk starts
/// turns of its own now and then, quieter than the speaker's, and the speaker's own turns keep
/// the level up; should the room start six in a row, the level falls to the room's, and the
/// speaker's next turn lifts it again.
const SPEAKER_TURNS: usize = 6;

/// Speech windows of a turn heard before its level counts (0.3 s).
const SPEAKER_KNOWN: usize = 10;

/// Speech windows a turn's level is read over at most: its last 32 s.
const TURN_WINDOWS: usize = 1_000;

/// The share of a turn's speech windows quieter than its level: the loud part of the voice, its
/// vowels.
const SPEAKER_PERCENTILE: f32 = 0.80;

/// How far under the speaker's level a window can be and still keep a turn open (6 dB): a near
/// voice's vowels come that loud every few hundred milliseconds, the talk behind it in a café
/// at SNR 20 dB never does.
const SPEAKER_RANGE: f32 = 0.06;

/// How far under the speaker's level a window can be and still start a turn (12 dB): a turn
/// missed is worse than a turn the room started.
const SPEAKER_ONSET_RANGE: f32 = 0.12;

/// How far under the speaker's level the loudest window of an onset can be and still start a
/// turn after `start_secs` (5 dB): a voice's first syllable comes that near its level, a
/// café's louder moments (its talk at SNR 10 dB) stay 6 dB or more under it.
const SPEAKER_START_RANGE: f32 = 0.05;

/// Seconds of speech an onset quieter than [`SPEAKER_START_RANGE`] needs before it starts a
/// turn: the room's louder moments last less, and a speaker who has stepped back from the
/// microphone is heard a quarter second later rather than not at all.
const SPEAKER_SLOW_START_SECS: f32 = 0.45;

/// Seconds a turn stays open without a window at the speaker's level: the held-out voices leave
/// at most 0.42 s between two, and a stop takes `stop_secs` more, so a gap under 0.5 s keeps
/// the turn whole.
const SPEAKER_HOLD_SECS: f32 = 0.3;

/// How near the background must come to the speaker's level for the speaker to be told from
/// the room by loudness (40 dB): over a quiet room the silence between words ends a turn on
/// its own, and a voice that drops for a moment loses nothing.
const SPEAKER_OVER_BACKGROUND: f32 = 0.40;

/// The speaker's own level: the loudest of the last turns' levels (each a high percentile of
/// the turn's speech windows), and how long ago a window came near it. Where talk goes on
/// behind the speaker (a café), the model hears that talk as speech too and the background's
/// margin lets its peaks through: turns would start on the room's talk and run on for seconds
/// after a question, and the transcript would take in the room's words. The speaker is nearer
/// the microphone than the room, so a turn starts only near the speaker's level and stays open
/// only while windows at that level keep coming.
#[derive(Debug, Clone)]
struct Speaker {
    /// The last turns' levels, oldest first.
    turns: std::collections::VecDeque<f32>,
    /// This turn's speech windows.
    turn: Levels,
    /// Windows since the last one at the speaker's level.
    since_voice: u32,
}

impl Default for Speaker {
    fn default() -> Self {
        Self {
            turns: std::collections::VecDeque::with_capacity(SPEAKER_TURNS),
            turn: Levels::new(TURN_WINDOWS),
            since_voice: 0,
        }
    }
}

impl Speaker {
    /// Takes a speech window's loudness.
    fn hear(&mut self, level: f32) {
        self.turn.hear(level);
    }

    /// This turn's level, once [`SPEAKER_KNOWN`] windows have been heard.
    fn turn_level(&self) -> Option<f32> {
        (self.turn.len() >= SPEAKER_KNOWN).then(|| self.turn.percentile(SPEAKER_PERCENTILE))
    }

    /// The speaker's level: the loudest of the last turns' and this one's.
    fn level(&self) -> Option<f32> {
        self.turns
            .iter()
            .copied()
            .chain(self.turn_level())
            .reduce(f32::max)
    }

    /// Whether a window of `level` comes near enough the speaker's level to start a turn at
    /// once: always where the speaker is not told from the room by loudness (a room that does
    /// not talk, or one at `background` far under the speaker).
    fn near(&self, level: f32, room: Room) -> bool {
        match self.level() {
            Some(speaker) if room.talks && speaker - room.background < SPEAKER_OVER_BACKGROUND => {
                level >= speaker - SPEAKER_START_RANGE
            }
            _ => true,
        }
    }

    /// The turn ended: its level joins the last turns' if it was `spoken` (not an onset that
    /// faded).
    fn end_turn(&mut self, spoken: bool) {
        if let Some(level) = self.turn_level().filter(|_| spoken) {
            if self.turns.len() == SPEAKER_TURNS {
                self.turns.pop_front();
            }
            self.turns.push_back(level);
        }
        self.turn.clear();
    }

    /// Follows a window of `level`; whether it is the speaker's speech, `heard` saying whether
    /// the model and the background take it for speech. Where the `room` talks and its level
    /// comes near the speaker's, an `onset` must come near the speaker's level, and a turn
    /// stays open only while a window at that level came within `hold` windows.
    fn claims(&mut self, heard: bool, level: f32, room: Room, onset: bool, hold: u32) -> bool {
        let Some(speaker) = self.level() else {
            return heard;
        };
        if onset || level >= speaker - SPEAKER_RANGE {
            self.since_voice = 0;
        } else {
            self.since_voice = self.since_voice.saturating_add(1);
        }
        if !heard || !room.talks || speaker - room.background >= SPEAKER_OVER_BACKGROUND {
            return heard;
        }
        if onset {
            level >= speaker - SPEAKER_ONSET_RANGE
        } else {
            self.since_voice <= hold
        }
    }
}

/// Seconds of the speaker's loud windows a voiceprint is enrolled from.
const ENROL_SECS: f32 = 2.0;

/// Enrolments a voiceprint is the mean of: the first, then each later one that is the
/// speaker's voice by the print so far. Each holds a little of the room's talk, a different
/// little each time, and the mean keeps the voice.
const ENROLMENTS: u32 = 6;

/// Seconds of audio each check of the voice reads: the last second.
const VOICE_STRETCH_SECS: f32 = 1.0;

/// Seconds between two checks of the voice.
const VOICE_CHECK_SECS: f32 = 0.25;

/// The cosine similarity to the voiceprint over which a stretch is the speaker's voice, at
/// least.
const VOICE_MATCH: f32 = 0.6;

/// Checks of the room alone (a second with nobody speaking) whose scores are kept.
const ROOM_CHECKS: usize = 16;

/// How far a stretch must score over the room's usual score (the 75th percentile of its
/// checks) to be the speaker's voice: where the talk comes within a few dB of the speaker
/// (a café at SNR 5 dB), the voiceprint holds some of it, and the room scores near the voice.
const VOICE_OVER_ROOM: f32 = 0.05;

/// What a [`VoiceJob`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VoicePurpose {
    /// The speaker's loud windows: the voiceprint.
    Enrol,
    /// The last second: is it the speaker? `room` when nobody spoke in it.
    Check { room: bool },
}

/// A speaker embedding the analyzer needs: CPU work (a few milliseconds) for the caller to run
/// where it may block ([`VoiceJob::run`]), then to hand back ([`VadAnalyzer::voice_heard`]).
pub struct VoiceJob {
    encoder: Arc<SpeakerEncoder>,
    audio: Vec<f32>,
    purpose: VoicePurpose,
}

impl VoiceJob {
    /// Embeds the audio.
    pub fn run(self) -> VoiceHeard {
        VoiceHeard {
            embedding: self.encoder.embed(&self.audio),
            purpose: self.purpose,
        }
    }
}

/// A [`VoiceJob`]'s embedding.
pub struct VoiceHeard {
    embedding: Vec<f32>,
    purpose: VoicePurpose,
}

/// The speaker's voice, where the room talks and its level comes near the speaker's: a
/// voiceprint enrolled from the loud windows of the speaker's turns (the vowels near the
/// speaker's level, where the room's talk is 10 dB or more under it) and refined by the later
/// ones that are the speaker's ([`ENROLMENTS`] in all), and whether the last
/// second, checked every quarter second, was that voice: near enough the print, and nearer
/// than the room alone usually comes.
struct Voiceprint {
    encoder: Arc<SpeakerEncoder>,
    /// The last [`VOICE_STRETCH_SECS`] of audio at 16 kHz, oldest first, as a ring.
    recent: Vec<f32>,
    next: usize,
    /// Samples in a check's stretch.
    stretch: usize,
    /// Loud windows of the speaker's, until there are [`ENROL_SECS`] of them, for each
    /// enrolment.
    enrolment: Vec<f32>,
    print: Option<Vec<f32>>,
    /// Enrolments heard, kept or not: no more than [`ENROLMENTS`].
    enrolments: u32,
    /// Enrolments the print is the mean of.
    kept: u32,
    /// A job handed out and not yet heard back.
    pending: bool,
    /// Windows since the last check.
    since_check: u32,
    check_windows: u32,
    /// Whether the last check heard the speaker.
    voice: bool,
    /// Windows in a row heard while nobody spoke.
    quiet_windows: u32,
    stretch_windows: u32,
    /// The last scores of the room alone, oldest first.
    room_scores: std::collections::VecDeque<f32>,
    /// Samples heard, for the traces.
    heard: u64,
}

impl Voiceprint {
    fn new(encoder: Arc<SpeakerEncoder>, window: usize) -> Self {
        let rate = 16_000.0;
        let stretch = (VOICE_STRETCH_SECS * rate) as usize;
        Self {
            encoder,
            recent: Vec::with_capacity(stretch),
            next: 0,
            stretch,
            enrolment: Vec::new(),
            print: None,
            enrolments: 0,
            kept: 0,
            pending: false,
            since_check: 0,
            check_windows: ((VOICE_CHECK_SECS * rate / window as f32).round() as u32).max(1),
            voice: false,
            quiet_windows: 0,
            stretch_windows: (stretch as f32 / window as f32).ceil() as u32,
            room_scores: std::collections::VecDeque::with_capacity(ROOM_CHECKS),
            heard: 0,
        }
    }

    /// Takes a window of audio; `loud` if it is the speaker's speech near the speaker's level,
    /// `quiet` if nobody speaks, `needed` if the room talks at near the speaker's level. Returns
    /// a job when an embedding is due.
    fn hear(&mut self, window: &[f32], loud: bool, quiet: bool, needed: bool) -> Option<VoiceJob> {
        let capacity = self.stretch;
        self.quiet_windows = if quiet { self.quiet_windows + 1 } else { 0 };
        self.heard += window.len() as u64;
        for &s in window {
            if self.recent.len() < capacity {
                self.recent.push(s);
            } else {
                self.recent[self.next] = s;
                self.next = (self.next + 1) % capacity;
            }
        }
        let enrolling = self.enrolments < ENROLMENTS;
        // Bounded: no more than the print needs, whether or not its job has come back.
        if loud && enrolling && (self.enrolment.len() as f32) < ENROL_SECS * 16_000.0 {
            self.enrolment.extend_from_slice(window);
        }
        if !needed {
            self.voice = false;
        }
        self.since_check = self.since_check.saturating_add(1);
        if self.pending {
            return None;
        }
        let job = |audio, purpose| VoiceJob {
            encoder: self.encoder.clone(),
            audio,
            purpose,
        };
        if enrolling && self.enrolment.len() as f32 >= ENROL_SECS * 16_000.0 {
            self.pending = true;
            return Some(job(
                std::mem::take(&mut self.enrolment),
                VoicePurpose::Enrol,
            ));
        }
        if needed
            && self.print.is_some()
            && self.since_check >= self.check_windows
            && self.recent.len() == capacity
        {
            self.since_check = 0;
            self.pending = true;
            let mut audio = Vec::with_capacity(capacity);
            audio.extend_from_slice(&self.recent[self.next..]);
            audio.extend_from_slice(&self.recent[..self.next]);
            let room = self.quiet_windows >= self.stretch_windows;
            return Some(job(audio, VoicePurpose::Check { room }));
        }
        None
    }

    fn heard(&mut self, heard: VoiceHeard) {
        self.pending = false;
        match heard.purpose {
            VoicePurpose::Enrol => {
                let at_secs = self.heard as f32 / 16_000.0;
                let threshold = self.threshold();
                match &mut self.print {
                    None => {
                        tracing::debug!(at_secs, "the speaker's voiceprint is enrolled");
                        self.print = Some(heard.embedding);
                        self.kept = 1;
                    }
                    Some(print) => {
                        let score = similarity(print, &heard.embedding);
                        let kept = score >= threshold;
                        tracing::debug!(at_secs, score, kept, "a later enrolment");
                        if kept {
                            let n = self.kept as f32;
                            for (p, e) in print.iter_mut().zip(&heard.embedding) {
                                *p = (*p * n + e) / (n + 1.0);
                            }
                            let norm = similarity(print, print).sqrt().max(f32::EPSILON);
                            print.iter_mut().for_each(|p| *p /= norm);
                            self.kept += 1;
                        }
                    }
                }
                self.enrolments += 1;
            }
            VoicePurpose::Check { room } => {
                let Some(print) = &self.print else { return };
                let score = similarity(print, &heard.embedding);
                self.voice = !room && score >= self.threshold();
                if room {
                    if self.room_scores.len() == ROOM_CHECKS {
                        self.room_scores.pop_front();
                    }
                    self.room_scores.push_back(score);
                }
                let at_secs = self.heard as f32 / 16_000.0;
                tracing::trace!(at_secs, score, room, voice = self.voice, "voice check");
            }
        }
    }

    /// The score a stretch needs to be the speaker's: [`VOICE_MATCH`], or
    /// [`VOICE_OVER_ROOM`] over the room's usual score where that is higher.
    fn threshold(&self) -> f32 {
        let mut scores: Vec<f32> = self.room_scores.iter().copied().collect();
        scores.sort_by(f32::total_cmp);
        let usual = scores.get(scores.len() * 3 / 4).copied().unwrap_or(0.0);
        VOICE_MATCH.max(usual + VOICE_OVER_ROOM)
    }
}

/// Windows without speech an onset goes on through (64 ms): the dip between two syllables,
/// which over a loud hum or a café's talk can fall under what counts as speech. Only the
/// windows of speech count towards the start; a third window without speech fades the onset.
/// Where the room talks, its louder moments would start turns this way; there see [`Dips`].
const ONSET_GAP_WINDOWS: u32 = 2;

/// Windows without speech an onset that came near the speaker's level goes on through once
/// where the room talks (256 ms): the pause after an interruption's first word ("Stop, | I need
/// to go"), which in a café fills with the room's talk under what counts as speech.
const RESTART_GAP_WINDOWS: u32 = 8;

/// What a dip (windows without speech inside an onset) does to an onset that came near the
/// speaker's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dips {
    /// The onset goes on through any dip of up to [`ONSET_GAP_WINDOWS`]: the room does not
    /// talk.
    Bridge,
    /// The onset goes on through one dip of up to [`RESTART_GAP_WINDOWS`], and its start is
    /// counted afresh after it: the room talks. The bot stays held between an interruption's
    /// first word and the next ("Let me | stop", "Stop, | I need to go"), and the room's
    /// louder moments, which come and go, add up to no turn.
    Restart,
    /// The first window without speech fades the onset: the room talks and the speaker's
    /// level is not known.
    Fade,
}

/// Seconds of speech between two [`VadEvent::Speaking`] ticks.
pub const SPEAKING_TICK_SECS: f32 = 0.2;

/// One stream's VAD: resampling to the model's rate, the model's state and the state machine.
pub struct VadAnalyzer {
    params: VadParams,
    model: Arc<SileroVad>,
    model_state: SileroState,
    resampler: StreamResampler,
    buffer: Vec<f32>,
    window: usize,
    state: VadState,
    count: u32,
    /// While `Starting`: windows since the onset's last speech.
    onset_gap: u32,
    /// While `Starting`: the dips the onset went through.
    onset_dips: u32,
    /// While `Starting`: whether a window since the onset's last dip came near the speaker's
    /// level.
    near_since_dip: bool,
    /// While `Starting`: whether the onset has come near the speaker's level.
    onset_near: bool,
    start_windows: u32,
    stop_windows: u32,
    tick_windows: u32,
    /// Speaking windows since the start or the last tick.
    since_tick: u32,
    volume: f32,
    /// 10 ms at the model's rate.
    piece: usize,
    /// The samples of the 10 ms piece being filled, and the sum of their squares.
    piece_fill: (usize, f32),
    /// Whether the last whole piece had no sound in it.
    soundless_piece: bool,
    /// Whole pieces so far with a voice's loudness (`min_volume`) in them.
    loud_pieces: u64,
    /// While `Stopping` for audio with no sound in it: `loud_pieces` then. A piece at a voice's
    /// loudness since undoes that silence.
    soundless_stop: Option<u64>,
    /// The room's noise floor.
    floor: RoomFloor,
    /// The level of the talk and noise around the speaker.
    background: Background,
    /// The speaker's level over the turn.
    speaker: Speaker,
    /// Whether the room talks.
    room_talk: RoomTalk,
    /// [`SPEAKER_HOLD_SECS`] in windows.
    hold_windows: u32,
    /// [`SPEAKER_SLOW_START_SECS`] in windows.
    slow_start_windows: u32,
    /// The speaker's voice, where an encoder was given and the model runs at 16 kHz.
    voiceprint: Option<Voiceprint>,
    /// A job [`apply`](Self::apply) made, for [`voice_job`](Self::voice_job) to hand out.
    voice_job: Option<VoiceJob>,
}

impl VadAnalyzer {
    /// An analyzer for mono audio at `sample_rate` (resampled to 16 kHz for the model, or used
    /// as it is at 8 or 16 kHz).
    pub fn new(
        model: Arc<SileroVad>,
        sample_rate: u32,
        params: VadParams,
    ) -> Result<Self, VadError> {
        let model_rate = if sample_rate == 8_000 { 8_000 } else { 16_000 };
        let window = window_size(model_rate);
        let windows_for =
            |secs: f32| ((secs * model_rate as f32 / window as f32).round() as u32).max(1);
        Ok(Self {
            model_state: model.new_state(model_rate),
            model,
            resampler: StreamResampler::new(sample_rate, model_rate)?,
            buffer: Vec::with_capacity(window * 2),
            window,
            state: VadState::Quiet,
            count: 0,
            onset_gap: 0,
            onset_dips: 0,
            near_since_dip: false,
            onset_near: false,
            start_windows: windows_for(params.start_secs),
            stop_windows: windows_for(params.stop_secs),
            tick_windows: windows_for(SPEAKING_TICK_SECS),
            since_tick: 0,
            params,
            volume: 0.0,
            piece: model_rate as usize / 100,
            piece_fill: (0, 0.0),
            soundless_piece: false,
            loud_pieces: 0,
            soundless_stop: None,
            floor: RoomFloor::default(),
            background: Background::default(),
            speaker: Speaker::default(),
            room_talk: RoomTalk::default(),
            hold_windows: windows_for(SPEAKER_HOLD_SECS),
            slow_start_windows: windows_for(SPEAKER_SLOW_START_SECS),
            voiceprint: None,
            voice_job: None,
        })
    }

    /// Follows the speaker's voice with `encoder` where the room talks (at 16 kHz only; the
    /// encoder reads nothing else).
    pub fn with_voiceprint(mut self, encoder: Arc<SpeakerEncoder>) -> Self {
        if self.model_rate() == 16_000 {
            self.voiceprint = Some(Voiceprint::new(encoder, self.window));
        }
        self
    }

    /// The speaker embedding the last [`apply`](Self::apply) asked for, if any: run it (off the
    /// async workers) and hand it back to [`voice_heard`](Self::voice_heard). Until then no other
    /// is asked for, and the last verdict stands.
    pub fn voice_job(&mut self) -> Option<VoiceJob> {
        self.voice_job.take()
    }

    /// Takes an embedding a [`VoiceJob`] made.
    pub fn voice_heard(&mut self, heard: VoiceHeard) {
        if let Some(voiceprint) = &mut self.voiceprint {
            voiceprint.heard(heard);
        }
    }

    /// Whether the speaker's voice was heard in the last check.
    fn voice(&self) -> bool {
        self.voiceprint.as_ref().is_some_and(|v| v.voice)
    }

    /// The current state.
    pub fn state(&self) -> VadState {
        self.state
    }

    /// The room's noise floor as learned so far.
    pub fn floor(&self) -> RoomFloor {
        self.floor
    }

    /// Feeds audio; returns the changes it saw, in order. The quick changes between windows
    /// ([`between_windows`](Self::between_windows)) move the state but are not returned.
    pub fn analyze(&mut self, audio: &[i16]) -> Result<Vec<VadEvent>, VadError> {
        let mut events = Vec::new();
        for window in self.windows(audio) {
            let confidence = self.model.probability(&mut self.model_state, &window)?;
            events.extend(self.apply(confidence, &window));
            if let Some(job) = self.voice_job() {
                self.voice_heard(job.run());
            }
        }
        self.between_windows();
        Ok(events)
    }

    /// Feeds audio; returns the whole model windows it completed (at the model's rate), for a
    /// caller that runs the model itself (e.g. batched with other streams) and then calls
    /// [`apply`](Self::apply) with each window's confidence, in order.
    pub fn windows(&mut self, audio: &[i16]) -> Vec<Vec<f32>> {
        let resampled = self.resampler.process(audio);
        let start = self.buffer.len();
        self.buffer
            .extend(resampled.iter().map(|&s| f32::from(s) / 32768.0));
        self.follow_pieces(start);
        let windows: Vec<Vec<f32>> = self
            .buffer
            .chunks_exact(self.window)
            .map(<[f32]>::to_vec)
            .collect();
        self.buffer.drain(..windows.len() * self.window);
        windows
    }

    /// Follows the loudness of the 10 ms pieces in `self.buffer[start..]`.
    fn follow_pieces(&mut self, start: usize) {
        for &s in &self.buffer[start..] {
            self.piece_fill.0 += 1;
            self.piece_fill.1 += s * s;
            if self.piece_fill.0 == self.piece {
                let (n, power) = std::mem::take(&mut self.piece_fill);
                let level = loudness_of_power(power / n as f32);
                self.floor.hear_any(level);
                if self.state == VadState::Quiet {
                    self.floor.hear(level);
                }
                // The room's level is the room's: not read while the speaker's voice is heard.
                if !self.voice() {
                    self.background.hear(level);
                }
                self.soundless_piece = level < self.floor.hush();
                if level >= self.floor.voice(self.params.min_volume) {
                    self.loud_pieces += 1;
                }
            }
        }
    }

    /// What the 10 ms pieces fed since the last call say before the model's window is whole:
    ///
    /// - a piece with no sound in it while speaking is the first silence at once
    ///   ([`QuickChange::SilenceStarted`]). The window then counts as the stop's first silent one
    ///   if its end is soundless too (see [`apply`](Self::apply)): the stop comes up to one
    ///   window sooner than when that window counted as speech;
    /// - a piece with a voice's loudness after a silence that had no sound in it undoes that
    ///   silence ([`QuickChange::SpeechResumed`]): the soundless stretch was inside the speech
    ///   (a stop consonant's closure in synthetic speech is digital silence), and the words
    ///   after it belong to the same utterance, whatever the model makes of them.
    pub fn between_windows(&mut self) -> Option<QuickChange> {
        match self.state {
            VadState::Speaking if self.soundless_piece => {
                self.state = VadState::Stopping;
                self.count = 0;
                self.soundless_stop = Some(self.loud_pieces);
                Some(QuickChange::SilenceStarted)
            }
            VadState::Stopping
                if self
                    .soundless_stop
                    .is_some_and(|loud| self.loud_pieces > loud) =>
            {
                self.state = VadState::Speaking;
                self.soundless_stop = None;
                Some(QuickChange::SpeechResumed)
            }
            _ => None,
        }
    }

    /// Advances the state machine by one window whose speech confidence is `confidence`.
    pub fn apply(&mut self, confidence: f32, window: &[f32]) -> Option<VadEvent> {
        let level = loudness(window);
        self.volume = if level >= self.volume {
            level
        } else {
            VOLUME_RELEASE * level + (1.0 - VOLUME_RELEASE) * self.volume
        };
        // A window with no sound in it (nothing over the room's floor) holds no speech, whatever
        // the model's state still says (Silero's confidence can lag the voice's end by two
        // windows). Nor, once speaking, does one whose last 10 ms have none: the voice ended in
        // it. (Before the start, such a window is only a closure inside the first words, not an
        // onset fading.)
        let tail = &window[window.len().saturating_sub(self.piece)..];
        let ending = matches!(self.state, VadState::Speaking | VadState::Stopping);
        let hush = self.floor.hush();
        let sound = level >= hush && !(ending && loudness(tail) < hush);
        if self.state == VadState::Quiet {
            self.room_talk.hear(confidence >= self.params.confidence);
        }
        let room = Room {
            talks: self.room_talk.talks(),
            background: self.background.level(),
        };
        let onset = matches!(self.state, VadState::Quiet | VadState::Starting);
        let heard = sound
            && confidence >= self.params.confidence
            && self.volume >= self.params.min_volume
            && ((onset && !room.talks) || level >= self.background.speech());
        let speech = self
            .speaker
            .claims(heard, level, room, onset, self.hold_windows);
        if speech {
            self.speaker.hear(level);
        }
        if let Some(voiceprint) = &mut self.voiceprint {
            let speaker = self.speaker.level();
            // Only what stands clear of a known background: a café's talk can start the first
            // turn, and its louder moments come near that turn's level.
            let loud = speech
                && self.state == VadState::Speaking
                && self.background.settled()
                && level >= self.background.speech()
                && speaker.is_some_and(|speaker| level >= speaker - SPEAKER_RANGE);
            let needed = room.talks
                && speaker
                    .is_some_and(|speaker| speaker - room.background < SPEAKER_OVER_BACKGROUND);
            // An onset is not yet a turn: where the room talks it is mostly the room's.
            let quiet = matches!(self.state, VadState::Quiet | VadState::Starting);
            if let Some(job) = voiceprint.hear(window, loud, quiet, needed) {
                self.voice_job = Some(job);
            }
        }
        let was_speaking = self.state == VadState::Speaking;
        // Only an onset asks how near the speaker's level it comes.
        let near = speech && self.speaker.near(level, room);
        let dips = match (room.talks, self.speaker.level()) {
            (false, _) => Dips::Bridge,
            (true, Some(_)) => Dips::Restart,
            (true, None) => Dips::Fade,
        };
        let event = self.step(speech, near, dips);
        match event {
            Some(VadEvent::Stopped) => self.speaker.end_turn(true),
            Some(VadEvent::OnsetFaded) => self.speaker.end_turn(false),
            _ => {}
        }
        if self.state != VadState::Stopping {
            self.soundless_stop = None;
        } else if was_speaking && !sound {
            // As soundless as a quick first silence, and as undone by a voice coming back.
            self.soundless_stop = Some(self.loud_pieces);
        }
        event
    }

    /// The model's rate (the windows' rate).
    pub fn model_rate(&self) -> u32 {
        if self.window == window_size(8_000) {
            8_000
        } else {
            16_000
        }
    }

    /// Forces silence (the audio stopped arriving mid-speech); returns the stop, or the faded
    /// onset, that this makes.
    pub fn force_stop(&mut self) -> Option<VadEvent> {
        let event = match self.state {
            VadState::Speaking | VadState::Stopping => Some(VadEvent::Stopped),
            VadState::Starting => Some(VadEvent::OnsetFaded),
            VadState::Quiet => None,
        };
        self.speaker.end_turn(event == Some(VadEvent::Stopped));
        self.state = VadState::Quiet;
        self.count = 0;
        self.onset_gap = 0;
        self.buffer.clear();
        self.piece_fill = (0, 0.0);
        self.soundless_piece = false;
        self.soundless_stop = None;
        self.model_state.reset();
        event
    }

    /// Moves the state machine on by a window that is `speech` or not, and `near` the
    /// speaker's level or not. An onset reaching `start_windows` starts a turn if a window
    /// since its last dip came near, and otherwise only at `slow_start_windows`; one that
    /// comes near only after its first window says so then. An onset that came near goes on
    /// through a dip as `dips` says.
    fn step(&mut self, speech: bool, near: bool, dips: Dips) -> Option<VadEvent> {
        use VadState::*;
        self.state = match (self.state, speech) {
            (Quiet, true) => {
                self.count = 1;
                self.onset_gap = 0;
                self.onset_dips = 0;
                self.onset_near = near;
                self.near_since_dip = near;
                Starting
            }
            (Starting, true) => {
                self.count += 1;
                if self.onset_gap > 0 {
                    self.onset_dips += 1;
                    self.near_since_dip = false;
                    if dips == Dips::Restart {
                        self.count = 1;
                    }
                }
                self.onset_gap = 0;
                self.near_since_dip |= near;
                Starting
            }
            (Stopping, false) => {
                self.count += 1;
                Stopping
            }
            (Starting, false)
                if self.onset_near
                    && match dips {
                        Dips::Bridge => self.onset_gap < ONSET_GAP_WINDOWS,
                        Dips::Restart => {
                            self.onset_dips == 0 && self.onset_gap < RESTART_GAP_WINDOWS
                        }
                        Dips::Fade => false,
                    } =>
            {
                self.onset_gap += 1;
                Starting
            }
            (Starting, false) => {
                self.state = Quiet;
                return Some(VadEvent::OnsetFaded);
            }
            (Speaking, false) => {
                self.count = 1;
                Stopping
            }
            (Stopping, true) => Speaking,
            (state, _) => state,
        };
        match self.state {
            Starting
                if self.count >= self.start_windows
                    && (self.near_since_dip || self.count >= self.slow_start_windows) =>
            {
                self.state = Speaking;
                self.since_tick = 0;
                Some(VadEvent::Started)
            }
            Speaking => {
                self.since_tick += 1;
                (self.since_tick >= self.tick_windows).then(|| {
                    self.since_tick = 0;
                    VadEvent::Speaking
                })
            }
            Stopping if self.count >= self.stop_windows => {
                self.state = Quiet;
                Some(VadEvent::Stopped)
            }
            // An onset counted afresh after a dip goes on: it is no new onset.
            Starting if self.count == 1 && self.onset_dips == 0 => {
                Some(VadEvent::Onset { near_speaker: near })
            }
            Starting if near && !self.onset_near => {
                self.onset_near = true;
                Some(VadEvent::OnsetNearSpeaker)
            }
            _ => None,
        }
    }
}

/// Loudness from 0 (-20 dB) to 1 (+80 dB), in dB of the window's RMS in 16-bit units: the scale
/// pipecat's thresholds are written for, without the K-weighting (close enough for speech).
fn loudness(window: &[f32]) -> f32 {
    loudness_of_power(window.iter().map(|s| s * s).sum::<f32>() / window.len().max(1) as f32)
}

/// [`loudness`] of audio whose mean square is `power`.
fn loudness_of_power(power: f32) -> f32 {
    let db = 10.0 * (power * 32768.0 * 32768.0).max(1e-10).log10() - 0.691;
    ((db + 20.0) / 100.0).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An onset where the speaker is not told from the room by loudness.
    const ONSET: VadEvent = VadEvent::Onset { near_speaker: true };
    /// An onset under the speaker's level, in a café.
    const ROOM_ONSET: VadEvent = VadEvent::Onset {
        near_speaker: false,
    };

    #[test]
    fn the_background_is_a_crowds_level_and_not_the_speakers_own() {
        let mut crowd = Background::default();
        assert_eq!(crowd.level(), 0.0, "nothing heard yet");
        // Babble: a steady 0.78 to 0.84, no gaps.
        for i in 0..1_000 {
            crowd.hear(0.78 + (i % 7) as f32 * 0.01);
        }
        assert!((0.77..0.80).contains(&crowd.level()), "{}", crowd.level());
        assert!(crowd.speech() > 0.84, "the crowd's own talk is not speech");
        // One speaker talking on for 8 s in a quiet room: a fifth of the pieces are the gaps
        // between syllables, down at the room's floor.
        let mut monologue = Background::default();
        for i in 0..1_000 {
            monologue.hear(if i % 5 == 0 { 0.5 } else { 0.9 });
        }
        assert!(monologue.level() <= 0.51, "{}", monologue.level());
        assert!(monologue.speech() < 0.9, "the speaker stays speech");
    }

    /// Windows of `amplitudes` (one 32 ms window each, a tone at that amplitude), each judged
    /// by the model with full confidence, as a model that hears every voice as speech does;
    /// the events, with the window each came in.
    fn heard_as_speech(vad: &mut VadAnalyzer, amplitudes: &[f32]) -> Vec<(usize, VadEvent)> {
        let windows: Vec<(f32, f32)> = amplitudes.iter().map(|&a| (a, 1.0)).collect();
        judged(vad, &windows)
    }

    /// A café's talk: louder moments (`peak`, one window in `every`) over a low murmur.
    fn cafe(windows: usize, peak: f32, every: usize) -> Vec<f32> {
        (0..windows)
            .map(|i| if i % every == 0 { peak } else { 150.0 })
            .collect()
    }

    #[test]
    fn the_rooms_talk_does_not_keep_a_turn_open_after_the_speaker_stops() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        // The room alone for a second: its peaks (10 dB under the speaker, 16 dB over the
        // murmur) never last long enough to start a turn.
        let room = heard_as_speech(&mut vad, &cafe(31, 1_000.0, 3));
        assert!(
            !room.iter().any(|(_, e)| *e == VadEvent::Started),
            "{room:?}"
        );
        // The speaker, near the microphone, for a second: one turn.
        let events = heard_as_speech(&mut vad, &[3_000.0; 31]);
        assert!(
            events.iter().any(|(_, e)| *e == VadEvent::Started),
            "{events:?}"
        );
        // The room again: its peaks come every 64 ms, each over the background and taken for
        // speech by the model. They keep the turn open only for the hold, then it stops.
        let events = heard_as_speech(&mut vad, &cafe(62, 1_000.0, 2));
        let stopped = events
            .iter()
            .find(|(_, e)| *e == VadEvent::Stopped)
            .map(|(i, _)| (*i as f32 + 1.0) * 0.032);
        assert!(
            stopped.is_some_and(|secs| secs <= SPEAKER_HOLD_SECS + 0.25),
            "{events:?}"
        );
        assert_eq!(vad.state(), VadState::Quiet);
    }

    #[test]
    fn in_a_cafe_a_moment_under_the_speakers_level_starts_no_turn_and_a_voice_held_there_does() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        heard_as_speech(&mut vad, &cafe(31, 150.0, 1));
        heard_as_speech(&mut vad, &[3_000.0; 31]);
        heard_as_speech(&mut vad, &cafe(31, 150.0, 1));
        let started = |events: &[(usize, VadEvent)]| {
            events
                .iter()
                .find(|(_, e)| *e == VadEvent::Started)
                .map(|(i, _)| *i)
        };
        // A louder moment of the room, 7 dB under the speaker, for 0.3 s: near enough the
        // speaker's level to be an onset, not to start a turn.
        let mut moment = vec![1_300.0; 9];
        moment.extend([150.0; 31]);
        let events = heard_as_speech(&mut vad, &moment);
        assert_eq!(started(&events), None, "{events:?}");
        assert_eq!(
            events.first(),
            Some(&(0, ROOM_ONSET)),
            "an onset under the speaker's level is most likely the room's"
        );
        assert!(events.contains(&(9, VadEvent::OnsetFaded)), "{events:?}");
        // A voice at that level for longer (the speaker stepped back): a turn, a quarter
        // second later than at the speaker's level.
        let mut voice = vec![1_300.0; 20];
        voice.extend([150.0; 31]);
        let events = heard_as_speech(&mut vad, &voice);
        let slow = vad.slow_start_windows as usize - 1;
        assert_eq!(started(&events), Some(slow), "{events:?}");
        // At the speaker's level, a turn after `start_secs` as ever.
        let mut voice = vec![3_000.0; 20];
        voice.extend([150.0; 31]);
        let events = heard_as_speech(&mut vad, &voice);
        assert_eq!(events.first(), Some(&(0, ONSET)), "{events:?}");
        assert_eq!(
            started(&events),
            Some(vad.start_windows as usize - 1),
            "{events:?}"
        );
        // A voice that begins under that level and comes to it: near it from its second window.
        let mut voice = vec![1_300.0];
        voice.extend([3_000.0; 19]);
        voice.extend([150.0; 31]);
        let events = heard_as_speech(&mut vad, &voice);
        assert_eq!(
            events[..2],
            [(0, ROOM_ONSET), (1, VadEvent::OnsetNearSpeaker)],
            "{events:?}"
        );
        assert_eq!(
            started(&events),
            Some(vad.start_windows as usize - 1),
            "{events:?}"
        );
    }

    #[test]
    fn in_a_cafe_an_onset_at_the_speakers_level_is_held_through_one_dip_and_counted_afresh_after_it()
     {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        heard_as_speech(&mut vad, &cafe(31, 150.0, 1));
        heard_as_speech(&mut vad, &[3_000.0; 31]);
        heard_as_speech(&mut vad, &cafe(31, 150.0, 1));
        // The speaker, with a pause of a quarter second down to the murmur after the first
        // word: one onset, with no fade to release the bot, and a turn once the voice after
        // the dip has lasted `start_secs` (the café's louder moments come and go, and must not
        // add up to a turn across their dips).
        let dip = 7;
        let start = vad.start_windows as usize;
        let events = heard_as_speech(&mut vad, &two_words(3_000.0, 3, dip, 10));
        assert_eq!(
            events.iter().take(2).copied().collect::<Vec<_>>(),
            [(0, ONSET), (3 + dip + start - 1, VadEvent::Started)],
            "{events:?}"
        );
        // A second dip fades it.
        let events = heard_as_speech(&mut vad, &two_words(3_000.0, 3, dip, 2));
        assert_eq!(events, [(0, ONSET), (3 + dip + 2, VadEvent::OnsetFaded)]);
        // So does a pause longer than a quarter second.
        let mut voice = vec![3_000.0; 3];
        voice.extend(vec![150.0; 31]);
        let events = heard_as_speech(&mut vad, &voice);
        assert_eq!(events, [(0, ONSET), (3 + 8, VadEvent::OnsetFaded)]);
        // A louder moment of the room, 7 dB under the speaker, with the same dip: it fades at
        // the dip's first window, and what follows is an onset of its own.
        let events = heard_as_speech(&mut vad, &two_words(1_300.0, 3, dip, 3));
        assert_eq!(
            events,
            [
                (0, ROOM_ONSET),
                (3, VadEvent::OnsetFaded),
                (3 + dip, ROOM_ONSET),
                (6 + dip, VadEvent::OnsetFaded)
            ],
        );
    }

    /// Windows at `level`: a first word of `first`, a dip of `dip` down to the café's murmur,
    /// a second word of `second`, then a second of the murmur.
    fn two_words(level: f32, first: usize, dip: usize, second: usize) -> Vec<f32> {
        let mut windows = vec![level; first];
        windows.extend(vec![150.0; dip]);
        windows.extend(vec![level; second]);
        windows.extend([150.0; 31]);
        windows
    }

    #[test]
    fn the_rooms_talk_starts_no_turn_once_the_speaker_is_known() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        // A stretch of the room's talk as loud as a voice for a third of a second at a time,
        // 14 dB under the speaker, over a murmur 12 dB under it.
        let talk: Vec<f32> = (0..64)
            .map(|i| if i % 16 < 10 { 600.0 } else { 150.0 })
            .collect();
        let before = heard_as_speech(&mut vad, &talk);
        assert!(
            before.iter().any(|(_, e)| *e == VadEvent::Started),
            "before the speaker is heard the room's talk is taken for speech: {before:?}"
        );
        let mut vad = VadAnalyzer::new(
            SileroVad::shared().expect("the VAD model"),
            16_000,
            VadParams::default(),
        )
        .expect("16 kHz");
        heard_as_speech(&mut vad, &cafe(31, 150.0, 1));
        heard_as_speech(&mut vad, &[3_000.0; 31]);
        heard_as_speech(&mut vad, &cafe(31, 150.0, 1));
        assert_eq!(vad.state(), VadState::Quiet);
        let after = heard_as_speech(&mut vad, &talk);
        assert!(
            !after.iter().any(|(_, e)| *e == VadEvent::Started),
            "{after:?}"
        );
        // The speaker still starts turns, a little softer than before too.
        let events = heard_as_speech(&mut vad, &[1_500.0; 31]);
        assert!(
            events.iter().any(|(_, e)| *e == VadEvent::Started),
            "{events:?}"
        );
    }

    /// The test question (one voice) over other talk, `under` dB under it.
    fn over_talk(speaker: &[i16], talk: &[i16], under: f32) -> Vec<i16> {
        let gain = 10f32.powf(-under / 20.0);
        speaker
            .iter()
            .zip(talk.iter().cycle())
            .map(|(&s, &t)| (f32::from(s) + f32::from(t) * gain).clamp(-32_768.0, 32_767.0) as i16)
            .collect()
    }

    /// A test clip, mono.
    fn test_audio(name: &str) -> Vec<i16> {
        let path = format!("{}/../../assets/test/{name}", env!("CARGO_MANIFEST_DIR"));
        crate::audio::wav::read(&path)
            .expect("test audio")
            .to_mono()
    }

    /// 16-bit samples as the encoder reads them.
    fn floats(audio: &[i16]) -> Vec<f32> {
        audio.iter().map(|&s| f32::from(s) / 32_768.0).collect()
    }

    /// A café's talk: three talkers a third of a clip apart, without a gap.
    fn cafe_talk() -> Vec<i16> {
        let clip = test_audio("frog_and_toad_16k.wav");
        (0..clip.len())
            .map(|i| {
                (0..3)
                    .map(|k| i32::from(clip[(i + k * clip.len() / 3) % clip.len()]))
                    .sum::<i32>()
                    .clamp(-32_768, 32_767) as i16
            })
            .collect()
    }

    #[test]
    fn later_enrolments_bring_the_print_nearer_the_speaker_and_leave_the_rooms_talk_out() {
        let encoder = SpeakerEncoder::shared().expect("the encoder loads; run scripts/setup.sh");
        let speaker = test_audio("hello_16k.wav");
        let talk = cafe_talk();
        let alone = encoder.embed(&floats(&speaker));
        let mut voiceprint = Voiceprint::new(encoder, 512);
        // Every window is the speaker's loud speech, over talk 5 dB under it, each saying
        // over another stretch of the talk.
        let mut first = None;
        let mut said = 0;
        while voiceprint.enrolments < ENROLMENTS {
            let offset = said * talk.len() / 7;
            let over = over_talk(&speaker, &talk[offset..], 5.0);
            said += 1;
            for window in floats(&over).chunks_exact(512) {
                if let Some(job) = voiceprint.hear(window, true, false, false) {
                    voiceprint.heard(job.run());
                }
                if first.is_none() {
                    first = voiceprint.print.clone();
                }
            }
        }
        let first = first.expect("enrolled");
        let last = voiceprint.print.clone().expect("enrolled");
        let (first_score, last_score) = (similarity(&first, &alone), similarity(&last, &alone));
        assert!(
            last_score > first_score,
            "the speaker alone scores {first_score} against the first print, {last_score} against the last"
        );
        // Enrolments are bounded, and what comes after them changes nothing.
        for window in floats(&talk).chunks_exact(512) {
            assert!(voiceprint.hear(window, true, false, false).is_none());
        }
        assert!(voiceprint.print == Some(last), "the print changed");
    }

    #[test]
    fn a_later_enrolment_of_the_rooms_talk_is_not_folded_into_the_print() {
        let encoder = SpeakerEncoder::shared().expect("the encoder loads; run scripts/setup.sh");
        let mut voiceprint = Voiceprint::new(encoder, 512);
        let hear = |voiceprint: &mut Voiceprint, audio: &[i16]| {
            for window in floats(audio).chunks_exact(512) {
                if let Some(job) = voiceprint.hear(window, true, false, false) {
                    voiceprint.heard(job.run());
                }
            }
        };
        // Just over the 2 s of the first enrolment.
        hear(&mut voiceprint, &test_audio("hello_16k.wav")[..33_000]);
        assert_eq!(voiceprint.enrolments, 1);
        let print = voiceprint.print.clone().expect("enrolled");
        // 2.5 s of the café's talk alone, taken for the speaker's loud speech.
        let talk: Vec<i16> = cafe_talk().into_iter().cycle().take(40_000).collect();
        hear(&mut voiceprint, &talk);
        assert_eq!((voiceprint.enrolments, voiceprint.kept), (2, 1));
        assert!(
            voiceprint.print == Some(print),
            "the room's talk was folded into the print"
        );
    }

    #[test]
    fn in_a_cafe_a_speaker_who_talks_on_leaves_the_rooms_level_where_the_room_put_it() {
        let speaker = test_audio("hello_16k.wav");
        let talk = cafe_talk();
        // 4 s of the room alone, then the speaker three times over without a pause.
        let mut stream = over_talk(&vec![0; 64_000], &talk, 10.0);
        let said: Vec<i16> = speaker
            .iter()
            .copied()
            .cycle()
            .take(3 * speaker.len())
            .collect();
        stream.extend(over_talk(&said, &talk, 10.0));
        let level_after = |vad: &mut VadAnalyzer| {
            for piece in stream.chunks(160) {
                vad.analyze(piece).expect("analysis");
            }
            vad.background.level()
        };
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut by_level =
            VadAnalyzer::new(model.clone(), 16_000, VadParams::default()).expect("16 kHz");
        let mut by_voice = VadAnalyzer::new(model, 16_000, VadParams::default())
            .expect("16 kHz")
            .with_voiceprint(
                SpeakerEncoder::shared().expect("the encoder loads; run scripts/setup.sh"),
            );
        let mut room = VadAnalyzer::new(
            SileroVad::shared().expect("model"),
            16_000,
            VadParams::default(),
        )
        .expect("16 kHz");
        for piece in over_talk(&vec![0; 64_000], &talk, 10.0).chunks(160) {
            room.analyze(piece).expect("analysis");
        }
        let room = room.background.level();
        let (by_level, by_voice) = (level_after(&mut by_level), level_after(&mut by_voice));
        // Levels in whole dB (a bin is 1 dB). Read by loudness alone, the room's level creeps
        // up under the voice that fills it (3 dB here); with the voiceprint it stays within 1.
        let db = |level: f32| (level * 100.0).round() as i32;
        let (room, by_level, by_voice) = (db(room), db(by_level), db(by_voice));
        assert!(by_level - room >= 3, "room {room}, by level {by_level}");
        assert!(by_voice - room <= 1, "room {room}, by voice {by_voice}");
    }

    /// Windows of `(amplitude, confidence)`: a tone at that amplitude, judged by the model with
    /// that confidence; the events, with the window each came in.
    fn judged(vad: &mut VadAnalyzer, windows: &[(f32, f32)]) -> Vec<(usize, VadEvent)> {
        let audio: Vec<i16> = windows.iter().flat_map(|&(a, _)| tone(512, a)).collect();
        vad.windows(&audio)
            .iter()
            .zip(windows)
            .enumerate()
            .filter_map(|(i, (w, &(_, confidence)))| vad.apply(confidence, w).map(|e| (i, e)))
            .collect()
    }

    /// A question over a loud room (a hum at 300, about -40 dBFS, 20 dB under the speaker):
    /// syllables at the speaker's level with a dip 14 dB under it (and under the room's
    /// background margin) after every third window.
    fn syllables() -> Vec<f32> {
        (0..24)
            .map(|i| if i % 4 == 3 { 600.0 } else { 3_000.0 })
            .collect()
    }

    /// An analyzer that has heard two seconds of the `room` (each window judged `room_speech`
    /// by the model), then one turn of the speaker at 3000, then the room again until it
    /// stopped.
    fn after_one_turn(room_speech: f32) -> VadAnalyzer {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        judged(&mut vad, &[(300.0, room_speech); 62]);
        let turn = judged(&mut vad, &[(3_000.0, 1.0); 31]);
        assert!(
            turn.iter().any(|(_, e)| *e == VadEvent::Started),
            "{turn:?}"
        );
        judged(&mut vad, &[(300.0, room_speech); 31]);
        assert_eq!(vad.state(), VadState::Quiet);
        vad
    }

    #[test]
    fn over_a_steady_noise_a_voices_soft_syllables_do_not_hold_back_its_start() {
        // A hum the model never takes for speech: however loud, it is no one talking, and the
        // question starts its turn after `start_secs`, as over silence.
        let mut vad = after_one_turn(0.0);
        let question: Vec<(f32, f32)> = syllables().into_iter().map(|a| (a, 1.0)).collect();
        let events = judged(&mut vad, &question);
        assert_eq!(
            events
                .iter()
                .map(|(i, e)| (*i, *e))
                .take(2)
                .collect::<Vec<_>>(),
            [
                (0, ONSET),
                (vad.start_windows as usize - 1, VadEvent::Started)
            ],
            "{events:?}"
        );
        // The same room where the model takes it for speech (talk): the dips fall to the
        // room's level. The onset, at the speaker's level, is held through the first dip and
        // counted afresh after it; it fades at the second. Three windows between two dips are
        // too short a stretch of the café to start a turn, and too short a voice.
        let mut vad = after_one_turn(1.0);
        let events = judged(&mut vad, &question);
        assert_eq!(
            events[..2],
            [(0, ONSET), (7, VadEvent::OnsetFaded)],
            "{events:?}"
        );
        assert!(
            !events.iter().any(|(_, e)| *e == VadEvent::Started),
            "{events:?}"
        );
    }

    #[test]
    fn over_a_steady_noise_an_onset_goes_on_through_the_gap_between_two_syllables() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        judged(&mut vad, &[(300.0, 0.0); 62]);
        // Three windows of voice, two of the room, then the voice again: the gap is inside
        // the onset, and only the voice's windows count towards the start.
        let mut windows = vec![(3_000.0, 1.0); 3];
        windows.extend([(300.0, 0.0); ONSET_GAP_WINDOWS as usize]);
        windows.extend([(3_000.0, 1.0); 10]);
        let events = judged(&mut vad, &windows);
        let gap = ONSET_GAP_WINDOWS as usize;
        assert_eq!(
            events
                .iter()
                .filter(|(_, e)| *e != VadEvent::Speaking)
                .copied()
                .collect::<Vec<_>>(),
            [
                (0, ONSET),
                (vad.start_windows as usize - 1 + gap, VadEvent::Started)
            ],
        );
        // One window more of the room fades the onset: a click and a cough stay short.
        judged(&mut vad, &[(300.0, 0.0); 31]);
        let mut windows = vec![(3_000.0, 1.0); 3];
        windows.extend([(300.0, 0.0); ONSET_GAP_WINDOWS as usize + 1]);
        let events = judged(&mut vad, &windows);
        assert_eq!(events, [(0, ONSET), (3 + gap, VadEvent::OnsetFaded)]);
    }

    #[test]
    fn a_room_talks_when_the_model_takes_what_it_hears_there_for_speech() {
        let mut room = RoomTalk::default();
        assert!(
            room.talks(),
            "unknown, a room is taken to talk, as a café would"
        );
        for _ in 0..ROOM_WINDOWS {
            room.hear(false);
        }
        assert!(!room.talks(), "a hum");
        // A café's talk: the model takes nearly every window for speech.
        for i in 0..ROOM_WINDOWS / 2 {
            room.hear(i % 10 != 0);
        }
        assert!(room.talks());
        // A user's onsets now and then in a quiet room are not the room talking.
        for i in 0..ROOM_WINDOWS {
            room.hear(i % 20 == 0);
        }
        assert!(!room.talks());
    }

    #[test]
    fn over_a_quiet_room_a_soft_passage_stays_inside_the_turn() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        // A second of a quiet room (-70 dBFS), then the voice.
        let mut voice = vec![10.0; 31];
        voice.extend([3_000.0; 31]);
        // Half a second 16 dB under the voice: nothing in the room comes near the speaker, so
        // only the model and the silence decide.
        voice.extend([500.0; 16]);
        voice.extend([3_000.0; 31]);
        let events = heard_as_speech(&mut vad, &voice);
        assert_eq!(
            events
                .iter()
                .map(|(_, e)| *e)
                .filter(|e| *e != VadEvent::Speaking)
                .collect::<Vec<_>>(),
            [ONSET, VadEvent::Started],
            "{events:?}"
        );
    }

    #[test]
    fn a_window_without_sound_is_silence_whatever_the_model_says() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        let speech: Vec<f32> = (0..512).map(|i| ((i as f32) * 0.3).sin() * 0.1).collect();
        let mut events = Vec::new();
        for _ in 0..10 {
            events.extend(vad.apply(1.0, &speech));
        }
        assert_eq!(vad.state(), VadState::Speaking, "{events:?}");
        // The model is still sure, and the loudness smoothed over windows is still high.
        assert_eq!(vad.apply(1.0, &[0.0; 512]), None);
        assert_eq!(vad.state(), VadState::Stopping);
        let quiet: Vec<f32> = (0..512)
            .map(|i| ((i as f32) * 1.7).sin() * 0.0003)
            .collect();
        assert!(loudness(&quiet) > SOUNDLESS, "a noise floor is sound");
    }

    /// An analyzer at 16 kHz that has been speaking for ten windows of a loud tone, each judged
    /// by the model with full confidence.
    fn speaking() -> VadAnalyzer {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        for window in vad.windows(&tone(512 * 10, 3000.0)) {
            vad.apply(1.0, &window);
        }
        assert_eq!(vad.state(), VadState::Speaking);
        vad
    }

    fn tone(samples: usize, amplitude: f32) -> Vec<i16> {
        (0..samples)
            .map(|i| ((i as f32) * 0.3).sin() * amplitude)
            .map(|s| s as i16)
            .collect()
    }

    #[test]
    fn ten_soundless_milliseconds_are_the_first_silence_before_the_window_is_whole() {
        let mut vad = speaking();
        // The voice ends 100 samples into the next window; the rest of what comes is soundless.
        let mut audio = tone(100, 3000.0);
        audio.extend([0; 60 + 80]);
        assert!(vad.windows(&audio).is_empty());
        assert_eq!(
            vad.between_windows(),
            None,
            "the piece the voice ended in has sound, the next is not whole"
        );
        assert!(vad.windows(&[0; 80]).is_empty());
        assert_eq!(
            vad.between_windows(),
            Some(QuickChange::SilenceStarted),
            "a whole soundless piece"
        );
        assert_eq!(vad.state(), VadState::Stopping);
        // The window the voice ended in is the stop's first silent one: no resumption, and the
        // stop comes `stop_windows` windows after the quick first silence.
        let windows = vad.windows(&[0; 512 * 6]);
        let events: Vec<_> = windows.iter().map(|w| vad.apply(1.0, w)).collect();
        assert_eq!(vad.between_windows(), None);
        let stop_windows = 6; // 0.2 s of 32 ms windows, rounded
        assert_eq!(
            events[stop_windows - 1],
            Some(VadEvent::Stopped),
            "{events:?}"
        );
        assert!(
            events[..stop_windows - 1].iter().all(Option::is_none),
            "{events:?}"
        );
    }

    #[test]
    fn a_voice_after_a_soundless_first_silence_resumes_the_speech_whatever_the_model_says() {
        let mut vad = speaking();
        // A stop consonant's closure in synthetic speech, then the word goes on.
        vad.windows(&[0; 160]);
        assert_eq!(vad.between_windows(), Some(QuickChange::SilenceStarted));
        assert!(vad.windows(&tone(160, 3000.0)).is_empty());
        assert_eq!(vad.between_windows(), Some(QuickChange::SpeechResumed));
        assert_eq!(vad.state(), VadState::Speaking);
        // The model, still unsure of the short word, does not end the speech at once.
        let windows = vad.windows(&tone(192, 3000.0));
        assert_eq!(windows.len(), 1);
        assert_eq!(vad.apply(0.1, &windows[0]), None);
        assert_eq!(vad.state(), VadState::Stopping);
        assert_eq!(
            vad.between_windows(),
            None,
            "a silence the model heard is undone by the model alone"
        );
    }

    #[test]
    fn a_window_ending_in_no_sound_is_a_silence_that_a_voice_undoes() {
        let mut vad = speaking();
        // The closure falls at the window's end, and the next chunk starts the next window.
        let mut audio = tone(512 - 160, 3000.0);
        audio.extend([0; 160]);
        audio.extend(tone(160, 3000.0));
        let windows = vad.windows(&audio);
        assert_eq!(windows.len(), 1);
        assert_eq!(vad.apply(1.0, &windows[0]), None);
        assert_eq!(vad.state(), VadState::Stopping);
        vad.windows(&tone(160, 3000.0));
        assert_eq!(vad.between_windows(), Some(QuickChange::SpeechResumed));
    }

    #[test]
    fn a_window_ending_in_no_sound_before_the_start_does_not_fade_the_onset() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        let mut closing = tone(512 - 160, 3000.0);
        closing.extend([0; 160]);
        let mut events = Vec::new();
        for window in vad.windows(&tone(512, 3000.0)) {
            events.extend(vad.apply(1.0, &window));
        }
        for window in vad.windows(&closing) {
            events.extend(vad.apply(1.0, &window));
        }
        assert_eq!(events, [ONSET]);
        assert_eq!(vad.state(), VadState::Starting);
    }

    #[test]
    fn sound_under_a_voices_loudness_does_not_undo_a_soundless_first_silence() {
        let mut vad = speaking();
        vad.windows(&[0; 160]);
        assert_eq!(vad.between_windows(), Some(QuickChange::SilenceStarted));
        // About -73 dBFS: a noise floor, not a voice; the stop comes on time.
        let windows = vad.windows(&tone(512 * 6 - 160, 10.0));
        assert_eq!(vad.between_windows(), None);
        let events: Vec<_> = windows.iter().map(|w| vad.apply(0.0, w)).collect();
        assert_eq!(events.last(), Some(&Some(VadEvent::Stopped)), "{events:?}");
    }

    #[test]
    fn before_a_third_of_a_second_is_heard_a_noise_floor_never_ends_speech_before_the_model_does() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        // Eight windows of a voice: speaking, 256 ms heard.
        for window in vad.windows(&tone(512 * 8, 3000.0)) {
            vad.apply(1.0, &window);
        }
        assert_eq!(vad.state(), VadState::Speaking);
        // About -73 dBFS: quiet, but sound, and too little has been heard to say what the room
        // is.
        vad.windows(&tone(320, 10.0));
        assert_eq!(vad.between_windows(), None);
        assert_eq!(vad.state(), VadState::Speaking);
    }

    #[test]
    fn once_a_third_of_a_second_is_heard_sound_far_under_its_quieter_tenth_is_no_sound() {
        let mut vad = speaking();
        // About -73 dBFS after 320 ms of a voice at -21 dBFS: under the room such a voice could
        // be in (the provisional floor, capped at about -45 dBFS).
        vad.windows(&tone(480, 10.0));
        assert_eq!(vad.between_windows(), Some(QuickChange::SilenceStarted));
        // About -35 dBFS: over what can be only the room.
        let mut vad = speaking();
        vad.windows(&tone(480, 750.0));
        assert_eq!(vad.between_windows(), None);
    }

    #[test]
    fn loudness_scale_puts_speech_above_and_hiss_below_the_default_threshold() {
        let speech: Vec<f32> = (0..512).map(|i| ((i as f32) * 0.3).sin() * 0.1).collect();
        let hiss: Vec<f32> = (0..512).map(|i| ((i as f32) * 1.7).sin() * 0.001).collect();
        assert!(loudness(&speech) > 0.6, "{}", loudness(&speech));
        assert!(loudness(&hiss) < 0.6, "{}", loudness(&hiss));
        assert_eq!(loudness(&[0.0; 512]), 0.0);
    }

    /// Seeded brown noise (leaky-integrated white noise) at an RMS of `dbfs`.
    fn brown(samples: usize, dbfs: f32, seed: u64) -> Vec<i16> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut level = 0.0f32;
        let raw: Vec<f32> = (0..samples)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let white = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                level = 0.992 * level + 0.1 * white;
                level
            })
            .collect();
        let rms = (raw.iter().map(|x| x * x).sum::<f32>() / samples as f32).sqrt();
        let gain = 32_768.0 * 10f32.powf(dbfs / 20.0) / rms;
        raw.iter().map(|x| (x * gain) as i16).collect()
    }

    /// `file` of `assets/test` after `lead` samples, then 2 s more, over a brown `floor` in
    /// dBFS if any; and where its voice ends.
    fn question_in(file: &str, lead: usize, floor: Option<f32>) -> (Vec<i16>, usize) {
        let path = format!("{}/../../assets/test/{file}", env!("CARGO_MANIFEST_DIR"));
        let wav = crate::audio::wav::read(std::path::Path::new(&path)).expect("the test voice");
        let mut audio = vec![0i16; lead];
        audio.extend(wav.to_mono());
        // Where the voice ends: the last 10 ms piece over -45 dBFS.
        let end = audio
            .chunks(160)
            .rposition(|p| {
                p.iter().map(|s| f32::from(*s).powi(2)).sum::<f32>() / 160.0 > 180.0 * 180.0
            })
            .map_or(0, |i| (i + 1) * 160);
        audio.extend(vec![0i16; 32_000]);
        if let Some(dbfs) = floor {
            let room = brown(audio.len(), dbfs, 3);
            for (s, n) in audio.iter_mut().zip(room) {
                *s = s.saturating_add(n);
            }
        }
        (audio, end)
    }

    /// Feeds `audio` 10 ms at a time; the ms after `end` at which the last first silence came
    /// (the state became `Stopping` for good) and at which speech stopped, and every event.
    fn ending(audio: &[i16], end: usize) -> (f32, f32, Vec<VadEvent>) {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        let (mut silence, mut stop, mut events) = (f32::NAN, f32::NAN, Vec::new());
        for (i, piece) in audio.chunks(160).enumerate() {
            let was = vad.state();
            let heard = vad.analyze(piece).expect("analysis");
            let at = ((i + 1) * 160) as f32 / 16.0 - end as f32 / 16.0;
            if vad.state() == VadState::Stopping && was == VadState::Speaking {
                silence = at;
            }
            if heard.contains(&VadEvent::Stopped) {
                stop = at;
            }
            events.extend(heard);
        }
        (silence, stop, events)
    }

    #[test]
    fn a_quiet_rooms_floor_ends_speech_as_soon_as_digital_silence_does() {
        let (clean, end) = question_in("hello_16k.wav", 16_000, None);
        let (silent_first, silent_stop, silent_events) = ending(&clean, end);
        let (noisy, _) = question_in("hello_16k.wav", 16_000, Some(-55.0));
        let (room_first, room_stop, room_events) = ending(&noisy, end);
        assert_eq!(
            silent_events
                .iter()
                .filter(|e| **e == VadEvent::Started)
                .count(),
            room_events
                .iter()
                .filter(|e| **e == VadEvent::Started)
                .count(),
            "the same speech is heard: {silent_events:?} / {room_events:?}"
        );
        // Without the floor, the first silence waited for the model's window (10 → 30 ms), and
        // over the stand-ins each turn's answer came 100 ms later.
        assert!(
            room_first == silent_first && room_stop <= silent_stop,
            "first silence {silent_first} → {room_first} ms, stop {silent_stop} → {room_stop} ms"
        );
    }

    #[test]
    fn a_question_said_as_the_microphone_opens_ends_as_soon_as_over_digital_silence() {
        // 10 ms of the room before the voice: too little to learn the floor from alone, but the
        // gaps inside the words are the room too.
        let (clean, end) = question_in("frog_and_toad_16k.wav", 160, None);
        let (silent_first, silent_stop, _) = ending(&clean, end);
        let (noisy, _) = question_in("frog_and_toad_16k.wav", 160, Some(-55.0));
        let (room_first, room_stop, _) = ending(&noisy, end);
        // Without the provisional floor: first silence 20 → 50 ms, stop 180 → 210 ms.
        assert!(
            room_first <= silent_first && room_stop <= silent_stop,
            "first silence {silent_first} → {room_first} ms, stop {silent_stop} → {room_stop} ms"
        );
    }

    #[test]
    fn the_room_is_learned_while_nobody_speaks_and_its_swings_are_not_a_voice() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        assert_eq!(
            vad.floor().hush(),
            SOUNDLESS,
            "nothing heard: only digital silence"
        );
        let room = brown(16_000 * 2, -55.0, 5);
        let mut events = Vec::new();
        for piece in room.chunks(320) {
            events.extend(vad.analyze(piece).expect("analysis"));
        }
        assert!(events.is_empty(), "a room is not speech: {events:?}");
        // The floor sits near -55 dBFS, and every 10 ms of it is under the hush.
        let hush = vad.floor().hush();
        assert!(hush > SOUNDLESS && hush < HUSH_CAP, "{hush}");
        let under = room[16_000..]
            .chunks(160)
            .filter(|p| {
                let power = p
                    .iter()
                    .map(|s| (f32::from(*s) / 32768.0).powi(2))
                    .sum::<f32>();
                loudness_of_power(power / 160.0) < hush
            })
            .count();
        assert!(under >= 95, "{under} of 100 pieces under the hush");
    }

    #[test]
    fn a_fan_that_starts_is_learned_and_does_not_start_speech() {
        let model = SileroVad::shared().expect("the VAD model loads; run scripts/setup.sh");
        let mut vad = VadAnalyzer::new(model, 16_000, VadParams::default()).expect("16 kHz");
        let mut audio = brown(16_000 * 2, -60.0, 7);
        audio.extend(brown(16_000 * 4, -45.0, 8));
        let mut events = Vec::new();
        for piece in audio.chunks(320) {
            events.extend(vad.analyze(piece).expect("analysis"));
        }
        assert!(!events.contains(&VadEvent::Started), "{events:?}");
        assert!(
            vad.floor().hush() > loudness_of_power(10f32.powf(-5.0)),
            "the louder room is learned"
        );
    }
}
