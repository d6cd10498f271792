//! The assistant side: what the bot said, its tool calls and their results.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Map;

use crate::context::IN_PROGRESS;
use crate::context::async_tool_messages::{
    build_cancelled_message, build_final_result_message, build_intermediate_result_message,
    build_started_message, encode_result,
};
use crate::context::{
    AssistantMessage, AssistantMeta, Content, ContentBlock, ContextHandle, Message, StopReason,
    ToolCall, ToolMessage,
};
use crate::frames::{
    ControlFrame, DataFrame, Frame, FrameBody, FunctionCallResult, LlmResponseSummary,
    OnContextUpdated, ResultKind, SystemFrame, WordTiming,
};
use crate::pipeline::{Direction, FrameContext, FrameProcessor, ProcessorError};

/// Records the bot's responses, tool calls and results in the context, and asks the LLM to run
/// again when results call for it: per the result's `run_llm`, else once the whole batch has
/// settled. It never runs the LLM while the user speaks, the bot speaks or a response is still
/// streaming: the run waits and happens then, so a result is never lost.
///
/// Behind a TTS and an output, it records what the listener heard: the TTS's sentences as their
/// audio plays, and on an interruption only the words whose audio had (mostly) played. Without
/// a TTS it records the LLM's text.
///
/// The context keeps the model's order. A response that calls tools is one assistant message
/// with the words said before the calls, then the calls: words whose audio plays after the call
/// was announced (the voice is still speaking them) join that message, not a new one behind
/// the results. Async-tool messages that come while a response is under way wait for its end,
/// so they follow the bot's words and the next request ends on them, never on the assistant.
pub struct AssistantAggregator {
    context: ContextHandle,
    /// Text of the current response not yet written to the context.
    text: String,
    /// The sentence being played, with its word timings.
    playing: Option<Playing>,
    /// The current response as blocks, for the metadata of its last message.
    blocks: Vec<ContentBlock>,
    /// The current response's summary, once the service sent it.
    summary: Option<LlmResponseSummary>,
    /// Provider and model of the last summary, for responses cut short before theirs.
    last_model: (String, String),
    in_response: bool,
    user_speaking: bool,
    bot_speaking: bool,
    run_pending: bool,
    /// Sync calls of each batch that have not settled.
    unsettled: HashMap<u64, usize>,
    /// Batches of this response made only of async calls: the model answers once it ends.
    async_only: HashSet<u64>,
    /// The id of the current response's first tool call: its message carries the response's
    /// words.
    response_call: Option<String>,
    /// Async-tool messages that came during the current response, for after it.
    held: Vec<(Message, Option<OnContextUpdated>)>,
}

impl AssistantAggregator {
    /// An aggregator writing to `context`.
    pub fn new(context: ContextHandle) -> Self {
        Self {
            context,
            text: String::new(),
            playing: None,
            blocks: Vec::new(),
            summary: None,
            last_model: (String::new(), String::new()),
            in_response: false,
            user_speaking: false,
            bot_speaking: false,
            run_pending: false,
            unsettled: HashMap::new(),
            async_only: HashSet::new(),
            response_call: None,
            held: Vec::new(),
        }
    }

    /// Adds words of the current response.
    fn add_text(&mut self, text: &str) {
        self.text.push_str(text);
        match self.blocks.last_mut() {
            Some(ContentBlock::Text(t)) => t.push_str(text),
            _ => self.blocks.push(ContentBlock::Text(text.to_owned())),
        }
    }

    /// Adds a sentence the listener heard, or the part of it they heard.
    fn add_heard(&mut self, heard: &str) {
        if heard.is_empty() {
            return;
        }
        let text = if self.text.is_empty() || self.text.ends_with(char::is_whitespace) {
            heard.to_owned()
        } else {
            format!(" {heard}")
        };
        self.add_text(&text);
    }

    /// The sentence being played was heard to its end.
    fn finish_playing(&mut self) {
        if let Some(playing) = self.playing.take() {
            self.add_heard(playing.text.trim());
        }
    }

    /// Writes the pending text: into the message of the response's calls when it has some,
    /// else as an assistant message of its own.
    fn commit_text(&mut self) {
        self.finish_playing();
        let text = std::mem::take(&mut self.text);
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        let mut context = self.context.lock();
        let calls_message = self.response_call.as_ref().and_then(|id| {
            context.messages.iter_mut().rev().find_map(|m| match m {
                Message::Assistant(a) if a.tool_calls.iter().flatten().any(|c| &c.id == id) => {
                    Some(a)
                }
                _ => None,
            })
        });
        match calls_message {
            Some(message) => {
                let said = match message.content.take().flatten() {
                    Some(before) if !before.joined_text().trim().is_empty() => {
                        format!("{} {text}", before.joined_text().trim_end())
                    }
                    _ => text.to_owned(),
                };
                message.content = Some(Some(Content::Text(said)));
            }
            None => context.messages.push(Message::assistant(text)),
        }
    }

    /// Ends the current response: writes its text and attaches its metadata to its last message.
    fn finish_response(&mut self, interrupted: bool) {
        self.commit_text();
        let blocks = std::mem::take(&mut self.blocks);
        let mut summary = self.summary.take();
        let provider_messages = summary
            .as_mut()
            .map(|s| std::mem::take(&mut s.provider_messages))
            .unwrap_or_default();
        let wrote_something = blocks.iter().any(|b| match b {
            ContentBlock::Text(t) => !t.trim().is_empty(),
            _ => true,
        });
        if !wrote_something {
            return;
        }
        let meta = match summary {
            Some(s) => {
                self.last_model = (s.provider.clone(), s.model.clone());
                AssistantMeta {
                    blocks: with_thinking(blocks, s.thinking),
                    provider: s.provider,
                    model: s.model,
                    usage: s.usage,
                    cost_usd: s.cost_usd,
                    stop_reason: if interrupted {
                        StopReason::Aborted
                    } else {
                        s.stop_reason
                    },
                    timestamp: std::time::SystemTime::now(),
                }
            }
            None => AssistantMeta {
                blocks,
                provider: self.last_model.0.clone(),
                model: self.last_model.1.clone(),
                usage: Default::default(),
                cost_usd: None,
                stop_reason: if interrupted {
                    StopReason::Aborted
                } else {
                    StopReason::Stop
                },
                timestamp: std::time::SystemTime::now(),
            },
        };
        // The response's last message is the latest assistant message that carries one of its
        // blocks: its text (just written) or its last tool call.
        let last_call = meta.blocks.iter().rev().find_map(|b| match b {
            ContentBlock::ToolCall(call) => Some(call.id.clone()),
            _ => None,
        });
        self.response_call = None;
        let mut context = self.context.lock();
        let target = context.messages.iter_mut().rev().find_map(|m| match m {
            Message::Assistant(a) => {
                let has_call = a
                    .tool_calls
                    .as_ref()
                    .is_some_and(|calls| calls.iter().any(|c| Some(&c.id) == last_call.as_ref()));
                (has_call || last_call.is_none() && a.tool_calls.is_none()).then_some(a)
            }
            _ => None,
        });
        if let Some(message) = target {
            message.meta = Some(Box::new(meta));
        }
        context
            .messages
            .extend(provider_messages.into_iter().map(Message::ProviderSpecific));
    }

    /// Writes the async-tool messages held back during the response, after its words.
    fn release_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return;
        }
        let callbacks: Vec<OnContextUpdated> = {
            let mut context = self.context.lock();
            held.into_iter()
                .filter_map(|(message, callback)| {
                    context.messages.push(message);
                    callback
                })
                .collect()
        };
        for callback in callbacks {
            callback.call();
        }
    }

    fn request_run(&mut self, cx: &mut FrameContext<'_>) {
        self.run_pending = true;
        self.maybe_run(cx);
    }

    fn maybe_run(&mut self, cx: &mut FrameContext<'_>) {
        if self.run_pending && !self.user_speaking && !self.bot_speaking && !self.in_response {
            self.run_pending = false;
            cx.push_upstream(DataFrame::LlmContext(self.context.clone()));
        }
    }

    fn on_in_progress(&mut self, call: &crate::frames::FunctionCallInProgress) {
        let tool_call =
            ToolCall::function(&call.tool_call_id, &call.function_name, &call.arguments);
        // What the model said before calling comes first, in the same message, as it did in
        // the stream. Words still to be heard join it as they play (`commit_text`).
        let mut said = None;
        if self.in_response {
            self.blocks.push(ContentBlock::ToolCall(tool_call.clone()));
            if self.response_call.is_none() {
                self.response_call = Some(call.tool_call_id.clone());
                let text = std::mem::take(&mut self.text);
                said = Some(text.trim().to_owned()).filter(|t| !t.is_empty());
            }
        } else {
            self.commit_text();
        }
        let mut context = self.context.lock();
        context.messages.push(Message::Assistant(AssistantMessage {
            content: said.map(|text| Some(Content::Text(text))),
            tool_calls: Some(vec![tool_call]),
            ..AssistantMessage::default()
        }));
        if call.cancel_on_interruption {
            context
                .messages
                .push(Message::tool(&call.tool_call_id, IN_PROGRESS));
            *self.unsettled.entry(call.group_id).or_default() += 1;
            self.async_only.remove(&call.group_id);
        } else {
            context
                .messages
                .push(build_started_message(&call.tool_call_id));
            if !self.unsettled.contains_key(&call.group_id) {
                self.async_only.insert(call.group_id);
            }
        }
    }

    fn on_result(&mut self, result: &FunctionCallResult, cx: &mut FrameContext<'_>) {
        let run_now = if result.cancel_on_interruption {
            self.settle_sync(result)
        } else {
            self.record_async(result);
            true
        };
        match result.properties.run_llm {
            Some(false) => {}
            Some(true) => self.request_run(cx),
            None if run_now => self.request_run(cx),
            None => {}
        }
    }

    /// Replaces the call's placeholder with its result; true once its batch has settled.
    fn settle_sync(&mut self, result: &FunctionCallResult) -> bool {
        let content = if result.kind == ResultKind::Cancelled {
            "CANCELLED".to_owned()
        } else {
            encode_result(result.result.as_ref())
        };
        {
            let mut context = self.context.lock();
            let placeholder = context.messages.iter_mut().rev().find_map(|m| match m {
                Message::Tool(t) if t.tool_call_id == result.tool_call_id => Some(t),
                _ => None,
            });
            match placeholder {
                Some(message) => message.content = Content::Text(content),
                None => context.messages.push(Message::Tool(ToolMessage {
                    tool_call_id: result.tool_call_id.clone(),
                    content: Content::Text(content),
                    extra: Map::new(),
                })),
            }
        }
        if let Some(callback) = &result.properties.on_context_updated {
            callback.call();
        }
        let left = self.unsettled.entry(result.group_id).or_insert(1);
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.unsettled.remove(&result.group_id);
            return true;
        }
        false
    }

    fn record_async(&mut self, result: &FunctionCallResult) {
        let message = match result.kind {
            ResultKind::Cancelled => build_cancelled_message(&result.tool_call_id),
            ResultKind::Final => {
                build_final_result_message(&result.tool_call_id, result.result.as_ref())
            }
            ResultKind::Intermediate => {
                build_intermediate_result_message(&result.tool_call_id, result.result.as_ref())
            }
        };
        let callback = result.properties.on_context_updated.clone();
        if self.in_response {
            self.held.push((message, callback));
            return;
        }
        self.context.lock().messages.push(message);
        if let Some(callback) = callback {
            callback.call();
        }
    }
}

/// A sentence whose audio is playing.
struct Playing {
    text: String,
    words: Arc<[WordTiming]>,
    /// Audio of it that reached the listener.
    played_secs: f64,
}

impl Playing {
    /// The words whose audio had mostly played.
    fn heard(&self) -> String {
        let heard: Vec<&str> = self
            .words
            .iter()
            .take_while(|w| (w.start_secs + w.end_secs) / 2.0 <= self.played_secs)
            .map(|w| w.word.as_str())
            .collect();
        heard.join(" ")
    }
}

/// Puts the response's reasoning first, as the model produced it.
fn with_thinking(mut blocks: Vec<ContentBlock>, thinking: String) -> Vec<ContentBlock> {
    if !thinking.is_empty() {
        blocks.insert(0, ContentBlock::Thinking(thinking));
    }
    blocks
}

impl AssistantAggregator {
    /// What the listener heard stays, marked as cut short.
    fn interrupted(&mut self) {
        if let Some(playing) = self.playing.take() {
            self.add_heard(&playing.heard());
        }
        if self.in_response {
            self.finish_response(true);
        }
        self.in_response = false;
        self.release_held();
    }

    /// The voice started a sentence: with word timings, what is heard of it can be told.
    fn speaking(&mut self, spoken: &crate::frames::TtsText) {
        if let Some(words) = &spoken.words {
            self.finish_playing();
            self.playing = Some(Playing {
                text: spoken.text.clone(),
                words: words.clone(),
                played_secs: 0.0,
            });
        }
    }

    fn response_started(&mut self) {
        self.release_held();
        self.response_call = None;
        self.in_response = true;
        self.playing = None;
        self.text.clear();
        self.blocks.clear();
        self.summary = None;
    }
}

impl FrameProcessor for AssistantAggregator {
    fn name(&self) -> &str {
        "AssistantAggregator"
    }

    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        match &frame.body {
            FrameBody::System(SystemFrame::UserStartedSpeaking) => self.user_speaking = true,
            FrameBody::System(SystemFrame::UserStoppedSpeaking) => {
                self.user_speaking = false;
                cx.push(frame, direction);
                self.maybe_run(cx);
                return Ok(());
            }
            FrameBody::System(SystemFrame::BotStartedSpeaking) => self.bot_speaking = true,
            FrameBody::System(SystemFrame::BotStoppedSpeaking) => {
                self.bot_speaking = false;
                cx.push(frame, direction);
                self.maybe_run(cx);
                return Ok(());
            }
            FrameBody::System(SystemFrame::Interruption) => self.interrupted(),
            FrameBody::Data(DataFrame::OutputAudio(audio)) => {
                if let Some(playing) = &mut self.playing {
                    playing.played_secs += audio.duration().as_secs_f64();
                }
            }
            FrameBody::Data(DataFrame::TtsText(spoken)) if self.in_response && spoken.spoken => {
                self.speaking(spoken);
            }
            FrameBody::Control(ControlFrame::LlmFullResponseStart) => self.response_started(),
            FrameBody::Control(ControlFrame::LlmResponseSummary(summary)) => {
                self.summary = Some((**summary).clone());
            }
            FrameBody::Control(ControlFrame::LlmFullResponseEnd) => {
                self.in_response = false;
                self.finish_response(false);
                self.release_held();
                if !self.async_only.is_empty() {
                    self.async_only.clear();
                    self.run_pending = true;
                }
                cx.push(frame, direction);
                self.maybe_run(cx);
                return Ok(());
            }
            FrameBody::Data(DataFrame::LlmText(text)) if self.in_response => self.add_text(text),
            FrameBody::Control(ControlFrame::FunctionCallInProgress(call))
                if direction == Direction::Downstream =>
            {
                self.on_in_progress(call);
            }
            FrameBody::Data(DataFrame::FunctionCallResult(result))
                if direction == Direction::Downstream =>
            {
                let result = result.clone();
                cx.push(frame, direction);
                self.on_result(&result, cx);
                return Ok(());
            }
            _ => {}
        }
        cx.push(frame, direction);
        Ok(())
    }
}
