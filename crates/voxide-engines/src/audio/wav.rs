//! WAV files in and out: any PCM or float WAV in, 16-bit PCM out.

use std::path::Path;

/// Why a WAV file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WavError {
    /// The file could not be opened or is not a WAV file.
    #[error("{path}: not a readable WAV file: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// What the reader said.
        reason: String,
    },
    /// The WAV holds a sample format voxide does not take.
    #[error("{path}: unsupported WAV sample format ({bits}-bit {format}); use PCM or float")]
    Unsupported {
        /// The file.
        path: String,
        /// Bits per sample.
        bits: u16,
        /// `int` or `float`.
        format: &'static str,
    },
    /// Writing failed.
    #[error("{path}: could not write the WAV file: {reason}")]
    Write {
        /// The file.
        path: String,
        /// What the writer said.
        reason: String,
    },
}

/// Decoded audio: interleaved 16-bit samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Wav {
    /// Interleaved samples.
    pub samples: Vec<i16>,
    /// Samples per second per channel.
    pub sample_rate: u32,
    /// Channels.
    pub channels: u16,
}

impl Wav {
    /// The first channel, or the mean of all channels.
    pub fn to_mono(&self) -> Vec<i16> {
        let channels = usize::from(self.channels.max(1));
        if channels == 1 {
            return self.samples.clone();
        }
        self.samples
            .chunks_exact(channels)
            .map(|frame| {
                let sum: i32 = frame.iter().map(|&s| i32::from(s)).sum();
                (sum / channels as i32) as i16
            })
            .collect()
    }

    /// Duration in seconds.
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / f64::from(self.channels.max(1)) / f64::from(self.sample_rate)
    }
}

/// Reads a WAV file of 8-, 16-, 24- or 32-bit PCM or 32-bit float samples.
pub fn read(path: impl AsRef<Path>) -> Result<Wav, WavError> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| WavError::Unreadable {
        path: name.clone(),
        reason: e.to_string(),
    })?;
    read_from(std::io::BufReader::new(file), name)
}

/// Reads WAV bytes (an upload, a request body) as [`read`] reads a file; `name` names them in
/// errors.
pub fn parse(bytes: &[u8], name: &str) -> Result<Wav, WavError> {
    read_from(std::io::Cursor::new(bytes), name.to_owned())
}

/// Most samples a WAV may hold (an hour of 48 kHz stereo): a header that says more is refused
/// before anything is allocated for it.
pub const MAX_SAMPLES: u32 = 48_000 * 2 * 3600;

fn read_from(input: impl std::io::Read, name: String) -> Result<Wav, WavError> {
    let unreadable = |e: hound::Error| WavError::Unreadable {
        path: name.clone(),
        reason: e.to_string(),
    };
    let mut reader = hound::WavReader::new(input).map_err(unreadable)?;
    if reader.len() > MAX_SAMPLES {
        return Err(WavError::Unreadable {
            path: name,
            reason: format!(
                "its header says {} samples, more than the {MAX_SAMPLES} (an hour of 48 kHz stereo) taken",
                reader.len()
            ),
        });
    }
    let spec = reader.spec();
    let samples: Vec<i16> = match (spec.sample_format, spec.bits_per_sample) {
        (hound::SampleFormat::Int, 16) => reader
            .samples::<i16>()
            .collect::<Result<_, _>>()
            .map_err(unreadable)?,
        (hound::SampleFormat::Int, bits @ (8 | 24 | 32)) => {
            let shift = i32::from(bits) - 16;
            reader
                .samples::<i32>()
                .map(|s| {
                    s.map(|v| {
                        if shift >= 0 {
                            (v >> shift) as i16
                        } else {
                            (v << -shift) as i16
                        }
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(unreadable)?
        }
        (hound::SampleFormat::Float, 32) => reader
            .samples::<f32>()
            .map(|s| s.map(|v| (v.clamp(-1.0, 1.0) * 32767.0) as i16))
            .collect::<Result<_, _>>()
            .map_err(unreadable)?,
        (format, bits) => {
            return Err(WavError::Unsupported {
                path: name,
                bits,
                format: match format {
                    hound::SampleFormat::Int => "int",
                    hound::SampleFormat::Float => "float",
                },
            });
        }
    };
    Ok(Wav {
        samples,
        sample_rate: spec.sample_rate,
        channels: spec.channels,
    })
}

/// Writes 16-bit PCM.
pub fn write(path: impl AsRef<Path>, wav: &Wav) -> Result<(), WavError> {
    let path = path.as_ref();
    let failed = |e: hound::Error| WavError::Write {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let spec = hound::WavSpec {
        channels: wav.channels,
        sample_rate: wav.sample_rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(path, spec).map_err(failed)?;
    for &s in &wav.samples {
        writer.write_sample(s).map_err(failed)?;
    }
    writer.finalize().map_err(failed)
}

/// Samples as floats in [-1, 1].
pub fn to_f32(samples: &[i16]) -> Vec<f32> {
    samples.iter().map(|&s| f32::from(s) / 32768.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_what_it_cannot_read() {
        let dir = std::env::temp_dir().join(format!("voxide-wav-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("a.wav");
        let wav = Wav {
            samples: vec![0, 1000, -1000, 32767, -32768, 5],
            sample_rate: 16_000,
            channels: 2,
        };
        write(&path, &wav).expect("write");
        assert_eq!(read(&path).expect("read"), wav);
        assert_eq!(wav.to_mono(), vec![500, 15_883, -16_381]);

        let junk = dir.join("junk.wav");
        std::fs::write(&junk, b"RIFF....not a wav").expect("write");
        let err = read(&junk).expect_err("junk");
        assert!(err.to_string().contains("not a readable WAV"), "{err}");
        assert!(read(dir.join("missing.wav")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
