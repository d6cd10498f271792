//! What an RTVI client's messages do to its session: one implementation for the WebRTC data
//! channel and the WebSocket. [`crate::transports::rtvi`] reads the messages; this applies
//! them (typed text, audio, keypresses, the eval harness's messages) within the client's
//! limits. Twilio's keypresses come through it too.

use std::time::Instant;

use tokio::sync::watch;

use crate::context::{ContextHandle, Message};
use crate::events::{Event, ReportLevel};
use crate::frames::{AudioFrame, DataFrame, SystemFrame};
use crate::pipeline::SessionHandle;
use crate::transports::dtmf::KeypadEntry;
use crate::transports::pace::{Pace, TextPace, TooFast};
use crate::transports::rtvi::{self, ClientMessage, EvalMessage, SendText};

/// Why a client's messages end its session.
#[derive(Debug)]
pub(crate) enum Leave {
    /// `disconnect-bot`: the bot finishes what it is saying, then the session ends.
    Disconnect,
    /// `eval-cancel`: the session ends at once.
    Cancel,
    /// `raw-audio` faster than real time.
    TooFast(TooFast),
    /// The session is over.
    Ended,
}

/// One RTVI client's input side.
pub(crate) struct RtviInput {
    /// How fast `raw-audio` comes.
    pace: Pace,
    /// How fast the user types.
    typed: TextPace,
    /// The server takes the eval messages that change the bot (`--allow-evals`).
    evals: bool,
    /// The session answers in text.
    skip_tts: bool,
    /// The bot's conversation, whose instructions `eval-context` keeps.
    context: ContextHandle,
    /// What the client is told of function calls; `eval-configure` may raise it.
    report_level: watch::Sender<ReportLevel>,
    /// Keys pressed, until their entry ends.
    keypad: KeypadEntry,
}

impl RtviInput {
    /// The input side of a session on `context` that answers in text when `skip_tts`; `evals`
    /// lets the eval harness change the bot.
    pub(crate) fn new(
        context: ContextHandle,
        skip_tts: bool,
        evals: bool,
        report_level: ReportLevel,
    ) -> Self {
        Self {
            pace: Pace::default(),
            typed: TextPace::default(),
            evals,
            skip_tts,
            context,
            report_level: watch::Sender::new(report_level),
            keypad: KeypadEntry::default(),
        }
    }

    /// What the client is told of function calls now.
    pub(crate) fn report_level(&self) -> watch::Receiver<ReportLevel> {
        self.report_level.subscribe()
    }

    /// Applies one client message; returns the replies to send, or why the session ends.
    pub(crate) async fn apply(
        &mut self,
        message: ClientMessage,
        handle: &SessionHandle,
    ) -> Result<Vec<String>, Leave> {
        let mut replies = Vec::new();
        let queued = match message {
            ClientMessage::Ready(ready) => return Ok(ready),
            ClientMessage::Invalid(reply) => return Ok(vec![reply]),
            ClientMessage::Disconnect => return Err(Leave::Disconnect),
            ClientMessage::Text(text) => {
                if let Err(refused) = self.typed.take(&text.content, Instant::now()) {
                    tracing::debug!(%refused, "a typed message dropped");
                    return Ok(vec![rtvi::refused(text.id.as_deref(), refused.to_string())]);
                }
                if text.audio_response == self.skip_tts {
                    replies.push(rtvi::refused(
                        text.id.as_deref(),
                        format!(
                            "audio_response is {}, but this session answers {}: the URL's \
                             skip_tts, or the first message's eval-connect, decides for the whole \
                             session; the text is answered as the session does",
                            text.audio_response,
                            if self.skip_tts { "in text" } else { "aloud" }
                        ),
                    ));
                }
                self.send_text(text, handle).await
            }
            ClientMessage::Audio {
                samples,
                sample_rate,
            } => {
                self.pace
                    .take(samples.len(), sample_rate, Instant::now())
                    .map_err(Leave::TooFast)?;
                handle
                    .queue_live_audio(AudioFrame::new(samples, sample_rate, 1))
                    .await
            }
            ClientMessage::Dtmf(keys) => self.press(&keys, handle).await,
            ClientMessage::Eval(eval) => return self.eval(eval, handle).await,
        };
        queued.map_err(|_| Leave::Ended)?;
        Ok(replies)
    }

    /// Keys pressed on a keypad (RTVI `dtmf`, Twilio's `dtmf`): the first of an entry
    /// interrupts the bot; an entry that ends (at `#`, or at [`Self::keypad_deadline`]) reaches
    /// the conversation as pipecat's DTMF aggregator writes it, `DTMF: 12#`.
    pub(crate) async fn press(
        &mut self,
        keys: &str,
        handle: &SessionHandle,
    ) -> Result<(), crate::pipeline::SessionError> {
        for key in keys.chars() {
            let pressed = self.keypad.press(key, Instant::now());
            if pressed.first {
                handle.queue_frame(SystemFrame::Interruption).await?;
            }
            if let Some(entry) = pressed.entry {
                self.enter(entry, handle).await?;
            }
        }
        Ok(())
    }

    /// When a keypad entry in progress ends by itself.
    pub(crate) fn keypad_deadline(&self) -> Option<Instant> {
        self.keypad.deadline()
    }

    /// Ends the keypad entry in progress if its time is up.
    pub(crate) async fn keypad_due(
        &mut self,
        handle: &SessionHandle,
    ) -> Result<(), crate::pipeline::SessionError> {
        match self.keypad.due(Instant::now()) {
            Some(entry) => self.enter(entry, handle).await,
            None => Ok(()),
        }
    }

    /// A keypad entry: a final transcript of the user's, and their turn, answered; at most
    /// as often as a person types (each entry asks the LLM).
    async fn enter(
        &mut self,
        entry: String,
        handle: &SessionHandle,
    ) -> Result<(), crate::pipeline::SessionError> {
        if let Err(refused) = self.typed.take(&entry, Instant::now()) {
            tracing::debug!(%refused, "a keypad entry dropped");
            return Ok(());
        }
        handle.emit(Event::UserTranscription {
            text: entry.clone(),
            is_final: true,
        });
        handle
            .queue_frame(DataFrame::LlmMessagesAppend {
                messages: vec![Message::user(entry)],
                run_llm: true,
            })
            .await
    }

    /// `send-text`: with `run_immediately`, the bot is interrupted and answers at once;
    /// without, the words join the conversation for the next answer.
    async fn send_text(
        &mut self,
        text: SendText,
        handle: &SessionHandle,
    ) -> Result<(), crate::pipeline::SessionError> {
        if text.run_immediately {
            handle.queue_frame(SystemFrame::Interruption).await?;
        }
        handle
            .queue_frame(DataFrame::LlmMessagesAppend {
                messages: vec![Message::user(text.content)],
                run_llm: text.run_immediately,
            })
            .await
    }

    async fn eval(
        &mut self,
        eval: EvalMessage,
        handle: &SessionHandle,
    ) -> Result<Vec<String>, Leave> {
        let refused = |what: &str| {
            Ok(vec![rtvi::refused(
                None,
                format!(
                    "{what} changes the bot: this server does not take it (voxide serve --allow-evals)"
                ),
            )])
        };
        match eval {
            EvalMessage::Connect(flags) if flags.skip_tts != self.skip_tts => {
                Ok(vec![rtvi::refused(
                    None,
                    format!(
                        "eval-connect asks for skip_tts {}, but the session started with {}: send \
                     eval-connect first, or put skip_tts in the URL",
                        flags.skip_tts, self.skip_tts
                    ),
                )])
            }
            EvalMessage::Connect(_) => Ok(Vec::new()),
            EvalMessage::Configure { .. } if !self.evals => refused("eval-configure"),
            EvalMessage::Configure { report_level } => {
                if let Some(level) = report_level {
                    self.report_level.send_replace(level);
                }
                Ok(Vec::new())
            }
            EvalMessage::Context(_) if !self.evals => refused("eval-context"),
            EvalMessage::Context(messages) => {
                let messages = with_instructions(&self.context.lock().messages, messages);
                handle
                    .queue_frame(DataFrame::LlmMessagesUpdate {
                        messages,
                        run_llm: false,
                    })
                    .await
                    .map_err(|_| Leave::Ended)?;
                Ok(Vec::new())
            }
            EvalMessage::Cancel => Err(Leave::Cancel),
        }
    }
}

/// `messages`, after the bot's own instructions when they bring none of their own: a scenario
/// sets the conversation so far, not who the bot is.
fn with_instructions(current: &[Message], messages: Vec<Message>) -> Vec<Message> {
    let instructs = |m: &Message| matches!(m, Message::System(_) | Message::Developer(_));
    if messages.iter().any(instructs) {
        return messages;
    }
    current
        .iter()
        .take_while(|m| instructs(m))
        .cloned()
        .chain(messages)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scenarios_context_keeps_the_bots_instructions_unless_it_brings_its_own() {
        let bot = [Message::system("You are a bot."), Message::user("hi")];
        let scenario = vec![
            Message::user("My name is Alex."),
            Message::assistant("Hi Alex."),
        ];
        let set = with_instructions(&bot, scenario.clone());
        assert_eq!(set.len(), 3);
        assert_eq!(set[0].text(), Some("You are a bot."));
        assert_eq!(set[1].text(), Some("My name is Alex."));
        let own = vec![Message::system("You are a pirate."), Message::user("Ahoy")];
        assert_eq!(with_instructions(&bot, own.clone()), own);
    }
}
