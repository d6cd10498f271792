//! Audio helpers the engines share with the rest of voxide: WAV files, resampling, the log-mel
//! spectrogram and a reader of ONNX files.

pub mod mel;
pub mod onnx_file;
pub mod resample;
pub mod wav;
