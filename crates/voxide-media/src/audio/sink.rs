//! Where the bot's audio is played.

use super::echo::EchoReference;
use crate::frames::PhoneAction;

/// Where played audio goes: a WebRTC track, a socket, a speaker, a file.
pub trait AudioSink: Send + 'static {
    /// Takes one chunk of mono audio, at the moment it should be heard.
    fn write(&mut self, samples: &[i16], sample_rate: u32);

    /// Drops audio handed over but not yet heard (an interruption); most sinks hold none.
    fn clear(&mut self) {}

    /// Asks the sink to record into `reference` what its device plays, when it plays it,
    /// silence included: the truest echo reference there is. A sink that cannot returns false,
    /// and what is written to it is recorded instead.
    fn record_playback(&mut self, reference: &EchoReference) -> bool {
        let _ = reference;
        false
    }

    /// Carries out `action` on the phone line behind the sink, after what was written before
    /// it; a sink with no phone line returns false.
    fn phone(&mut self, action: &PhoneAction) -> bool {
        let _ = action;
        false
    }
}

impl AudioSink for Box<dyn AudioSink> {
    fn write(&mut self, samples: &[i16], sample_rate: u32) {
        (**self).write(samples, sample_rate);
    }

    fn clear(&mut self) {
        (**self).clear();
    }

    fn record_playback(&mut self, reference: &EchoReference) -> bool {
        (**self).record_playback(reference)
    }

    fn phone(&mut self, action: &PhoneAction) -> bool {
        (**self).phone(action)
    }
}
