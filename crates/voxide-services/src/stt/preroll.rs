//! The audio from before the VAD's start that an utterance begins with, sans-IO.
//!
//! The VAD confirms speech only after some of it: its start comes 0.2 s or more after the
//! voice, and over a room's noise a voice's first words may be onsets that fade before one
//! lasts long enough to be confirmed, 1.5 s after the voice began. [`Preroll`] keeps the last
//! [`MAX_SECS`] of audio and follows the VAD's onsets and fades, so that at the start it hands
//! over the audio from just before the first onset of those that led to it: the first words,
//! without the room's moment before them or the last utterance's end. Where the room talks, an
//! onset under the speaker's level is most likely the room's: the audio then begins just before
//! the first onset that came near the speaker's level, so that the talk the user's words
//! followed is not read as theirs.

use std::collections::VecDeque;

/// Audio kept from before the VAD confirmed speech, at least.
const MIN_SECS: f32 = 0.6;
/// Audio kept from before the VAD confirmed speech, at most.
pub(crate) const MAX_SECS: f32 = 2.0;
/// Audio kept from before the first onset of those that led to the start: the model is sure of
/// a voice a window or two after it begins.
const ONSET_LEAD_SECS: f32 = 0.3;
/// An onset that comes within this long of the last one's fade goes on from it: the same
/// words, a closure or a short pause in them having faded it. Longer, and in a café the talk
/// before a question comes with it.
const ONSET_GAP_SECS: f32 = 0.2;
/// The pre-roll may reach this far back past the last VAD stop: the VAD stops only after
/// `stop_secs` (0.2 s by default) without speech, so the end of that span is silence, while the
/// next speech may begin well before the VAD is sure of it.
const BEFORE_STOP_SECS: f32 = 0.15;

/// The last [`MAX_SECS`] of a stream's audio, and the VAD's onsets in it.
#[derive(Debug)]
pub(crate) struct Preroll {
    rate: usize,
    kept: VecDeque<i16>,
    /// Samples heard so far.
    heard: usize,
    /// Samples since the last VAD stop.
    since_stop: usize,
    /// Where the onsets on the way to the next start began (`heard` then), where the first of
    /// them near the speaker's level began or came near, and where the last of them faded.
    onset: Option<usize>,
    near: Option<usize>,
    faded: Option<usize>,
}

impl Preroll {
    /// An empty pre-roll of audio at `rate` samples a second.
    pub(crate) fn new(rate: u32) -> Self {
        let rate = rate as usize;
        Self {
            rate,
            kept: VecDeque::with_capacity(secs(rate, MAX_SECS)),
            heard: 0,
            since_stop: usize::MAX,
            onset: None,
            near: None,
            faded: None,
        }
    }

    /// The stream's next audio.
    pub(crate) fn audio(&mut self, audio: &[i16]) {
        self.heard += audio.len();
        self.since_stop = self.since_stop.saturating_add(audio.len());
        let cap = secs(self.rate, MAX_SECS);
        let excess = (self.kept.len() + audio.len()).saturating_sub(cap);
        self.kept.drain(..excess.min(self.kept.len()));
        self.kept.extend(&audio[audio.len().saturating_sub(cap)..]);
    }

    /// The VAD heard a voice begin (not yet confirmed), near the speaker's level or not (where
    /// the room does not talk, every onset is near).
    pub(crate) fn onset(&mut self, near_speaker: bool) {
        if self.recent_onset().is_none() {
            self.onset = Some(self.heard);
            self.near = None;
        }
        if near_speaker {
            self.came_near();
        }
        self.faded = None;
    }

    /// The voice the VAD heard begin under the speaker's level came near it.
    pub(crate) fn came_near(&mut self) {
        if self.near.is_none() {
            self.near = Some(self.heard);
        }
    }

    /// The voice the VAD heard begin faded before it was confirmed.
    pub(crate) fn faded(&mut self) {
        self.faded = Some(self.heard);
    }

    /// The VAD stopped: the speech it had confirmed is over.
    pub(crate) fn stopped(&mut self) {
        self.since_stop = 0;
    }

    /// The VAD started: the audio the utterance begins with. Reaches back to
    /// [`ONSET_LEAD_SECS`] before the first onset near the speaker's level of those that led
    /// here (the first of them if none was), at least [`MIN_SECS`] and at most [`MAX_SECS`], and
    /// never more than [`BEFORE_STOP_SECS`] past the last stop, so that speech that follows the
    /// last utterance closely loses neither its first syllable nor takes that utterance's last
    /// words with it.
    pub(crate) fn start(&mut self) -> Vec<i16> {
        let since_onset = self
            .recent_onset()
            .map(|first| self.near.unwrap_or(first))
            .map_or(0, |at| self.heard - at + secs(self.rate, ONSET_LEAD_SECS));
        (self.onset, self.near, self.faded) = (None, None, None);
        let reach = since_onset
            .clamp(secs(self.rate, MIN_SECS), secs(self.rate, MAX_SECS))
            .min(
                self.since_stop
                    .saturating_add(secs(self.rate, BEFORE_STOP_SECS)),
            );
        let skip = self.kept.len().saturating_sub(reach);
        self.kept.iter().skip(skip).copied().collect()
    }

    /// Where the onsets on the way to a start began, unless the last faded too long ago.
    fn recent_onset(&self) -> Option<usize> {
        let gone = self
            .faded
            .is_some_and(|at| self.heard - at > secs(self.rate, ONSET_GAP_SECS));
        self.onset.filter(|_| !gone)
    }
}

/// Samples in `secs` of audio at `rate`.
fn secs(rate: usize, secs: f32) -> usize {
    (secs * rate as f32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 16_000;

    fn fed(preroll: &mut Preroll, secs: f32) {
        preroll.audio(&vec![1; (secs * RATE as f32) as usize]);
    }

    fn reach_secs(audio: &[i16]) -> f32 {
        audio.len() as f32 / RATE as f32
    }

    #[test]
    fn a_start_without_onsets_brings_the_shortest_preroll() {
        let mut preroll = Preroll::new(RATE);
        fed(&mut preroll, 5.0);
        assert_eq!(reach_secs(&preroll.start()), MIN_SECS);
    }

    #[test]
    fn a_chain_of_faded_onsets_reaches_back_to_its_first_with_a_lead() {
        let mut preroll = Preroll::new(RATE);
        fed(&mut preroll, 3.0);
        preroll.onset(true);
        fed(&mut preroll, 0.3);
        preroll.faded();
        fed(&mut preroll, 0.1);
        preroll.onset(true);
        fed(&mut preroll, 0.4);
        preroll.faded();
        fed(&mut preroll, 0.15);
        preroll.onset(true);
        fed(&mut preroll, 0.2);
        let reach = reach_secs(&preroll.start());
        assert!((reach - 1.45).abs() < 0.01, "{reach}");
    }

    #[test]
    fn an_onset_that_faded_long_before_the_start_is_the_rooms_not_the_speakers() {
        let mut preroll = Preroll::new(RATE);
        fed(&mut preroll, 3.0);
        preroll.onset(true);
        fed(&mut preroll, 0.3);
        preroll.faded();
        fed(&mut preroll, 0.5);
        preroll.onset(true);
        fed(&mut preroll, 0.5);
        let reach = reach_secs(&preroll.start());
        assert!((reach - 0.8).abs() < 0.01, "{reach}");
    }

    #[test]
    fn where_the_room_talks_the_words_begin_before_the_first_onset_near_the_speaker() {
        let mut preroll = Preroll::new(RATE);
        fed(&mut preroll, 3.0);
        // The room's talk under the speaker's level, then the speaker's first words 0.1 s after
        // it faded, soft at first: near 0.1 s in, started 0.4 s after that.
        preroll.onset(false);
        fed(&mut preroll, 0.6);
        preroll.faded();
        fed(&mut preroll, 0.1);
        preroll.onset(false);
        fed(&mut preroll, 0.1);
        preroll.came_near();
        fed(&mut preroll, 0.4);
        let reach = reach_secs(&preroll.start());
        assert!((reach - (ONSET_LEAD_SECS + 0.4)).abs() < 0.01, "{reach}");
        // Onsets none of which came near (a start the VAD waited for): from the first.
        preroll.stopped();
        fed(&mut preroll, 3.0);
        preroll.onset(false);
        fed(&mut preroll, 0.3);
        preroll.faded();
        fed(&mut preroll, 0.1);
        preroll.onset(false);
        fed(&mut preroll, 0.5);
        let reach = reach_secs(&preroll.start());
        assert!((reach - (ONSET_LEAD_SECS + 0.9)).abs() < 0.01, "{reach}");
    }

    #[test]
    fn the_preroll_never_reaches_further_than_its_cap() {
        let mut preroll = Preroll::new(RATE);
        fed(&mut preroll, 1.0);
        preroll.onset(true);
        fed(&mut preroll, 4.0);
        assert_eq!(reach_secs(&preroll.start()), MAX_SECS);
    }

    #[test]
    fn speech_soon_after_a_stop_does_not_take_the_last_utterances_words() {
        let mut preroll = Preroll::new(RATE);
        fed(&mut preroll, 3.0);
        preroll.stopped();
        fed(&mut preroll, 0.25);
        preroll.onset(true);
        fed(&mut preroll, 0.2);
        let reach = reach_secs(&preroll.start());
        assert!((reach - 0.6).abs() < 0.01, "{reach}");
        preroll.stopped();
        fed(&mut preroll, 0.1);
        preroll.onset(true);
        fed(&mut preroll, 0.2);
        let reach = reach_secs(&preroll.start());
        assert!((reach - 0.45).abs() < 0.01, "{reach}");
    }
}
