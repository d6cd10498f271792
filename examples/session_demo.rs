//! A session end to end: frames flow through a small pipeline, and the session's event stream is
//! printed as JSON lines.
//!
//! Run with `cargo run --example session_demo`.

use voxide::frames::{DataFrame, Frame, FrameBody, SystemFrame, Transcription};
use voxide::pipeline::{
    Direction, FrameContext, FrameProcessor, ParallelPipeline, Pipeline, ProcessorError, Session,
};

/// Answers every final transcription with a line of text, the way an LLM would.
struct Echo;

impl FrameProcessor for Echo {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if let FrameBody::Data(DataFrame::Transcription(t)) = &frame.body {
            cx.push_downstream(DataFrame::LlmText(format!("You said: {}", t.text)));
        }
        cx.push(frame, direction);
        Ok(())
    }
}

/// Prints the text the bot would speak.
struct Printer(&'static str);

impl FrameProcessor for Printer {
    fn process(
        &mut self,
        frame: Frame,
        direction: Direction,
        cx: &mut FrameContext<'_>,
    ) -> Result<(), ProcessorError> {
        if let FrameBody::Data(DataFrame::LlmText(text)) = &frame.body {
            println!("[{}] {text}", self.0);
        }
        cx.push(frame, direction);
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let pipeline = Pipeline::new().then(Echo).then(
        ParallelPipeline::new()
            .branch(Printer("speaker"))
            .branch(Printer("captions")),
    );
    let builder = Session::builder(pipeline).metrics(true);
    let mut events = builder.subscribe();
    let session = builder.spawn();
    let printer = tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            if let Ok(line) = serde_json::to_string(&event) {
                println!("{line}");
            }
        }
    });

    let handle = session.handle();
    for words in ["hello there", "what time is it"] {
        let turn = [
            Frame::new(SystemFrame::UserStartedSpeaking),
            Frame::new(SystemFrame::UserStoppedSpeaking),
            Frame::new(DataFrame::Transcription(Box::new(Transcription::new(
                words, "user",
            )))),
        ];
        if handle.queue_frames(turn).await.is_err() {
            break;
        }
    }
    let _ = handle.stop_when_done().await;
    // The event stream closes once the last handle is gone.
    drop(handle);
    let reason = session.join().await;
    let _ = printer.await;
    eprintln!("session ended: {reason:?}");
}
