//! The ONNX runtime, loaded once per process from the library the setup step unpacked.
//!
//! ort's `load-dynamic` mode opens `libonnxruntime.so` at run time, so the build downloads nothing.

use std::path::Path;
use std::sync::{OnceLock, PoisonError, RwLock, RwLockReadGuard};

use ort::environment::Environment;
use ort::session::Session;

use crate::models::{ModelError, model_path};

/// The runtime library's file name in the models folder.
pub const LIBRARY: &str = "libonnxruntime.so.1.31.1";

static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();

/// Whether the models are closed, read-locked by every inference in flight.
static CLOSED: RwLock<bool> = RwLock::new(false);

/// Leave to run a model, held for the length of the run: [`close`] waits for it.
pub struct Running {
    _closed: RwLockReadGuard<'static, bool>,
}

/// Leave to start an inference; `None` once [`close`] was called.
pub fn running() -> Option<Running> {
    let closed = CLOSED.read().unwrap_or_else(PoisonError::into_inner);
    (!*closed).then_some(Running { _closed: closed })
}

/// Waits for the inferences in flight and lets no new one start. The process calls it before it
/// exits: the models' own threads are never joined, and ORT torn down under a running model
/// fails it with a bogus error ("GetElementType is not implemented").
pub fn close() {
    *CLOSED.write().unwrap_or_else(PoisonError::into_inner) = true;
}

/// The process-wide ONNX environment, loading the library on first use.
pub fn environment() -> Result<&'static Environment, ModelError> {
    let library = model_path("onnxruntime", LIBRARY)?;
    let env = ENVIRONMENT.get_or_init(|| {
        ort::init_from(&library)
            .map_err(|e| e.to_string())?
            .with_name("voxide")
            .build()
            .map_err(|e| e.to_string())
    });
    env.as_ref().map_err(|reason| ModelError::Invalid {
        name: "onnxruntime".into(),
        path: library,
        reason: reason.clone(),
    })
}

/// Opens the model `file` (named `name` in errors) with `threads` intra-op threads.
pub fn session(name: &str, file: &str, threads: usize) -> Result<Session, ModelError> {
    let path = model_path(name, file)?;
    open(name, &path, threads)
}

/// Opens an ONNX model at `path`.
pub fn open(name: &str, path: &Path, threads: usize) -> Result<Session, ModelError> {
    let env = environment()?;
    let invalid = |reason: String| ModelError::Invalid {
        name: name.to_owned(),
        path: path.to_owned(),
        reason,
    };
    Session::builder(env)
        .map_err(|e| invalid(e.to_string()))?
        .with_intra_threads(threads)
        .map_err(|e| invalid(e.to_string()))?
        .with_inter_threads(1)
        .map_err(|e| invalid(e.to_string()))?
        // Idle worker threads sleep rather than spin: a server shares its cores with many
        // sessions, and a spinning pool burns them between inferences.
        .with_intra_op_spinning(false)
        .map_err(|e| invalid(e.to_string()))?
        // No memory pattern: it plans one block for all of a run's intermediates (per input
        // shape), where the arena reuses what each op frees: Smart Turn then peaks about 10 MB
        // lower, at the same speed.
        .with_memory_pattern(false)
        .map_err(|e| invalid(e.to_string()))?
        .commit_from_file(path)
        .map_err(|e| invalid(e.to_string()))
}
