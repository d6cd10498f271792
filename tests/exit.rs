//! Closing the models before the process exits. Its own test binary: closing is for the whole
//! process, so no other test may share it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use voxide::audio::turn::SmartTurn;

#[test]
fn closing_the_models_waits_for_the_inference_in_flight_and_refuses_new_ones() {
    let model = SmartTurn::shared().expect("the Smart Turn model loads; run scripts/setup.sh");
    let speech: Vec<f32> = (0..32_000).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
    let started = Arc::new(AtomicBool::new(false));
    let worker = {
        let (model, started) = (model.clone(), started.clone());
        std::thread::spawn(move || {
            let mut finished = Vec::new();
            loop {
                started.store(true, Ordering::SeqCst);
                match model.predict(&speech) {
                    Ok(_) => finished.push(Instant::now()),
                    Err(e) => return (finished, e.to_string()),
                }
            }
        })
    };
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    // The thread is all but always mid-inference now: a run takes tens of milliseconds.
    voxide::onnx::close();
    let closed = Instant::now();
    assert!(voxide::onnx::running().is_none());
    let (finished, error) = worker.join().expect("the inference thread");
    // The run in flight finished before the close returned; the next one was refused.
    assert!(finished.iter().all(|&t| t <= closed));
    assert!(error.contains("exiting"), "{error}");
}
