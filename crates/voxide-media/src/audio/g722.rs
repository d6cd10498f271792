//! G.722 at 64 kbit/s (ITU-T G.722, mode 1): wideband telephone audio, 16 kHz samples in bytes
//! of 8 bits, what desk phones and PBXs offer as `G722/8000` (payload type 9; RFC 3551 keeps its
//! RTP clock at 8 kHz, one tick a byte, for history's sake).
//!
//! A quadrature mirror filter splits each pair of samples into a low band (0–4 kHz) and a high
//! band (4–8 kHz); each band is coded by ADPCM against an adaptive predictor (two poles, six
//! zeros), six bits for the low band and two for the high. Encoder and decoder keep the same
//! state, so both are stateful: one of each per stream, fed in order. The arithmetic is the
//! standard's fixed-point arithmetic, so the decoded samples are exactly those of every
//! conforming implementation (checked against FFmpeg's in the tests, on the fixture
//! `scripts/g722_fixture.py` makes).

/// Samples a second.
pub const RATE: u32 = 16_000;

/// The filter's 24 taps are these 12, mirrored.
const QMF: [i32; 12] = [3, -11, 12, 32, -210, 951, 3876, -805, 362, -156, 53, -11];

/// The low band's decision levels (6 bits: 30 magnitudes).
const Q6: [i32; 32] = [
    0, 35, 72, 110, 150, 190, 233, 276, 323, 370, 422, 473, 530, 587, 650, 714, 786, 858, 940,
    1023, 1121, 1219, 1339, 1458, 1612, 1765, 1980, 2195, 2557, 2919, 0, 0,
];
/// The low band's code for a negative and a positive difference at each level.
const ILN: [i32; 32] = [
    0, 63, 62, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11,
    10, 9, 8, 7, 6, 5, 4, 0,
];
const ILP: [i32; 32] = [
    0, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39,
    38, 37, 36, 35, 34, 33, 32, 0,
];
/// The low band's inverse quantizers: six bits (the output) and four (the predictor's input).
const QM6: [i32; 64] = [
    -136, -136, -136, -136, -24808, -21904, -19008, -16704, -14984, -13512, -12280, -11192, -10232,
    -9360, -8576, -7856, -7192, -6576, -6000, -5456, -4944, -4464, -4008, -3576, -3168, -2776,
    -2400, -2032, -1688, -1360, -1040, -728, 24808, 21904, 19008, 16704, 14984, 13512, 12280,
    11192, 10232, 9360, 8576, 7856, 7192, 6576, 6000, 5456, 4944, 4464, 4008, 3576, 3168, 2776,
    2400, 2032, 1688, 1360, 1040, 728, 432, 136, -432, -136,
];
const QM4: [i32; 16] = [
    0, -20456, -12896, -8968, -6288, -4240, -2584, -1200, 20456, 12896, 8968, 6288, 4240, 2584,
    1200, 0,
];
/// The low band's scale factor: each four-bit code's magnitude, and its log step.
const RL42: [usize; 16] = [0, 7, 6, 5, 4, 3, 2, 1, 7, 6, 5, 4, 3, 2, 1, 0];
const WL: [i32; 8] = [-60, -30, 58, 172, 334, 538, 1198, 3042];
/// The high band's codes, inverse quantizer, magnitudes and log steps.
const IHN: [i32; 3] = [0, 1, 0];
const IHP: [i32; 3] = [0, 3, 2];
const QM2: [i32; 4] = [-7408, -1616, 7408, 1616];
const RH2: [usize; 4] = [2, 1, 2, 1];
const WH: [i32; 3] = [0, -214, 798];
/// The scale factor's antilog: 2^(i/32) in Q11.
const ILB: [i32; 32] = [
    2048, 2093, 2139, 2186, 2233, 2282, 2332, 2383, 2435, 2489, 2543, 2599, 2656, 2714, 2774, 2834,
    2896, 2960, 3025, 3091, 3158, 3228, 3298, 3371, 3444, 3520, 3597, 3676, 3756, 3838, 3922, 4008,
];

/// Clamps to 16 bits, as the standard's arithmetic does after each step.
fn saturate(value: i32) -> i32 {
    value.clamp(i32::from(i16::MIN), i32::from(i16::MAX))
}

/// One band's ADPCM state: the adaptive predictor and the quantizer's scale.
#[derive(Debug, Clone)]
struct Band {
    /// The predicted signal, and its pole and zero parts.
    s: i32,
    sp: i32,
    sz: i32,
    /// Reconstructed signal, partial reconstructions and quantized differences, newest first.
    r: [i32; 3],
    p: [i32; 3],
    d: [i32; 7],
    /// Pole and zero coefficients (and their next values).
    a: [i32; 3],
    ap: [i32; 3],
    b: [i32; 7],
    bp: [i32; 7],
    /// The scale factor, on its log scale and linear.
    nb: i32,
    det: i32,
}

impl Band {
    fn new(det: i32) -> Self {
        Self {
            s: 0,
            sp: 0,
            sz: 0,
            r: [0; 3],
            p: [0; 3],
            d: [0; 7],
            a: [0; 3],
            ap: [0; 3],
            b: [0; 7],
            bp: [0; 7],
            nb: 0,
            det,
        }
    }

    /// Moves the scale on by a log step, within `ceiling`, and its linear value with it;
    /// `shift` is where the antilog's exponent is zero (8 in the low band, 10 in the high).
    fn scale(&mut self, step: i32, ceiling: i32, shift: i32) {
        self.nb = (((self.nb * 127) >> 7) + step).clamp(0, ceiling);
        let mantissa = ILB[((self.nb >> 6) & 31) as usize];
        let exponent = shift - (self.nb >> 11);
        let linear = if exponent < 0 {
            mantissa << -exponent
        } else {
            mantissa >> exponent
        };
        self.det = linear << 2;
    }

    /// Takes the quantized difference `d`: reconstructs, adapts the predictor's coefficients
    /// (sign-sign) and predicts the next sample.
    fn adapt(&mut self, d: i32) {
        self.d[0] = d;
        self.r[0] = saturate(self.s + d);
        self.p[0] = saturate(self.sz + d);

        // The second pole.
        let sg: [i32; 3] = std::array::from_fn(|i| self.p[i] >> 15);
        let wd1 = saturate(self.a[1] << 2);
        let wd2 = if sg[0] == sg[1] { -wd1 } else { wd1 }.min(32_767);
        let mut a2 = if sg[0] == sg[2] { 128 } else { -128 };
        a2 += wd2 >> 7;
        a2 += (self.a[2] * 32_512) >> 15;
        self.ap[2] = a2.clamp(-12_288, 12_288);

        // The first pole, kept inside the stability triangle.
        let step = if sg[0] == sg[1] { 192 } else { -192 };
        let a1 = saturate(step + ((self.a[1] * 32_640) >> 15));
        let bound = saturate(15_360 - self.ap[2]);
        self.ap[1] = a1.clamp(-bound, bound);

        // The six zeros.
        let step = if d == 0 { 0 } else { 128 };
        let sign = d >> 15;
        for i in 1..7 {
            let wd2 = if self.d[i] >> 15 == sign { step } else { -step };
            self.bp[i] = saturate(wd2 + ((self.b[i] * 32_640) >> 15));
        }

        // Delay by one sample.
        for i in (1..7).rev() {
            self.d[i] = self.d[i - 1];
            self.b[i] = self.bp[i];
        }
        for i in (1..3).rev() {
            self.r[i] = self.r[i - 1];
            self.p[i] = self.p[i - 1];
            self.a[i] = self.ap[i];
        }

        // Predict.
        let pole = |a: i32, r: i32| (a * saturate(r + r)) >> 15;
        self.sp = saturate(pole(self.a[1], self.r[1]) + pole(self.a[2], self.r[2]));
        self.sz = saturate(
            (1..7)
                .rev()
                .map(|i| (self.b[i] * saturate(self.d[i] + self.d[i])) >> 15)
                .sum(),
        );
        self.s = saturate(self.sp + self.sz);
    }
}

/// The two bands, and the mirror filter's last 24 inputs.
#[derive(Debug, Clone)]
struct State {
    low: Band,
    high: Band,
    x: [i32; 24],
}

impl State {
    fn new() -> Self {
        Self {
            low: Band::new(32),
            high: Band::new(8),
            x: [0; 24],
        }
    }

    /// Shifts two values into the filter; returns its two sums (taps on the even and on the
    /// odd positions).
    fn filter(&mut self, first: i32, second: i32) -> (i32, i32) {
        self.x.copy_within(2.., 0);
        self.x[22] = first;
        self.x[23] = second;
        let mut even = 0;
        let mut odd = 0;
        for (i, q) in QMF.iter().enumerate() {
            even += self.x[2 * i] * q;
            odd += self.x[2 * i + 1] * QMF[11 - i];
        }
        (even, odd)
    }

    /// Both bands' steps once the code is known: `low` the six-bit code, `high` the two-bit one.
    fn adapt(&mut self, low: i32, high: i32) {
        let low4 = (low >> 2) as usize;
        let dlow = (self.low.det * QM4[low4]) >> 15;
        self.low.scale(WL[RL42[low4]], 18_432, 8);
        self.low.adapt(dlow);

        let dhigh = (self.high.det * QM2[high as usize]) >> 15;
        self.high.scale(WH[RH2[high as usize]], 22_528, 10);
        self.high.adapt(dhigh);
    }
}

/// Encodes a stream of 16 kHz samples, two samples a byte.
#[derive(Debug, Clone)]
pub struct G722Encoder {
    state: State,
    /// A sample waiting for its pair.
    odd: Option<i16>,
}

impl Default for G722Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl G722Encoder {
    /// An encoder at the start of a stream.
    pub fn new() -> Self {
        Self {
            state: State::new(),
            odd: None,
        }
    }

    /// Encodes `samples`; an odd one out waits for the next call.
    pub fn encode(&mut self, samples: &[i16]) -> Vec<u8> {
        let mut out = Vec::with_capacity(samples.len().div_ceil(2));
        for &sample in samples {
            match self.odd.take() {
                None => self.odd = Some(sample),
                Some(first) => out.push(self.pair(i32::from(first), i32::from(sample))),
            }
        }
        out
    }

    fn pair(&mut self, first: i32, second: i32) -> u8 {
        let state = &mut self.state;
        let (even, odd) = state.filter(first, second);
        let xlow = (odd + even) >> 14;
        let xhigh = (odd - even) >> 14;

        // The low band: the difference from the prediction, on 30 levels of the scale.
        let el = saturate(xlow - state.low.s);
        let magnitude = if el >= 0 { el } else { -(el + 1) };
        let level = (1..30)
            .find(|&i| magnitude < (Q6[i] * state.low.det) >> 12)
            .unwrap_or(30);
        let low = if el < 0 { ILN[level] } else { ILP[level] };

        // The high band: the same on two levels.
        let eh = saturate(xhigh - state.high.s);
        let magnitude = if eh >= 0 { eh } else { -(eh + 1) };
        let level = if magnitude >= (564 * state.high.det) >> 12 {
            2
        } else {
            1
        };
        let high = if eh < 0 { IHN[level] } else { IHP[level] };

        state.adapt(low, high);
        ((high << 6) | low) as u8
    }
}

/// Decodes a stream of bytes into 16 kHz samples, two a byte.
#[derive(Debug, Clone)]
pub struct G722Decoder {
    state: State,
}

impl Default for G722Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl G722Decoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self {
            state: State::new(),
        }
    }

    /// Decodes `bytes`, appending two samples a byte to `out`.
    pub fn decode_into(&mut self, bytes: &[u8], out: &mut Vec<i16>) {
        out.reserve(bytes.len() * 2);
        for &byte in bytes {
            let low = i32::from(byte & 0x3f);
            let high = i32::from(byte >> 6);
            let state = &mut self.state;
            // The output uses all six bits of the low band; the predictor only four.
            let rlow =
                (state.low.s + ((state.low.det * QM6[low as usize]) >> 15)).clamp(-16_384, 16_383);
            let rhigh = (state.high.s + ((state.high.det * QM2[high as usize]) >> 15))
                .clamp(-16_384, 16_383);
            state.adapt(low, high);
            let (even, odd) = state.filter(rlow + rhigh, rlow - rhigh);
            out.push(saturate(odd >> 11) as i16);
            out.push(saturate(even >> 11) as i16);
        }
    }

    /// Decodes `bytes` into their samples.
    pub fn decode(&mut self, bytes: &[u8]) -> Vec<i16> {
        let mut out = Vec::new();
        self.decode_into(bytes, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../assets/test/g722")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn pcm(bytes: &[u8]) -> Vec<i16> {
        bytes
            .chunks_exact(2)
            .map(|b| i16::from_le_bytes([b[0], b[1]]))
            .collect()
    }

    /// The 2 s of `hello_16k.wav` FFmpeg encoded (samples 8,000 to 40,000).
    fn question() -> Vec<i16> {
        let wav = crate::audio::wav::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../assets/test/hello_16k.wav"),
        )
        .expect("the question");
        wav.samples[8_000..40_000].to_vec()
    }

    #[test]
    fn decodes_ffmpegs_stream_to_the_same_samples() {
        let ours = G722Decoder::new().decode(&fixture("ffmpeg.g722"));
        let theirs = pcm(&fixture("ffmpeg_decoded.raw"));
        assert_eq!(ours.len(), theirs.len());
        let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
        assert_eq!(first, None, "first difference at sample {first:?}");
    }

    #[test]
    fn encodes_the_same_bytes_as_ffmpeg() {
        let ours = G722Encoder::new().encode(&question());
        let theirs = fixture("ffmpeg.g722");
        let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
        assert_eq!(first, None, "first difference at byte {first:?}");
        assert_eq!(ours.len(), theirs.len());
    }

    #[test]
    fn a_6khz_tone_that_g711_cannot_carry_comes_through_whole() {
        let tone: Vec<i16> = (0..16_000)
            .map(|i| {
                ((i as f32 * std::f32::consts::TAU * 6_000.0 / 16_000.0).sin() * 8_000.0) as i16
            })
            .collect();
        let decoded = G722Decoder::new().decode(&G722Encoder::new().encode(&tone));
        let rms = |s: &[i16]| {
            (s.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / s.len() as f64).sqrt()
        };
        let ratio = rms(&decoded[4_000..]) / rms(&tone[4_000..]);
        assert!((0.8..1.25).contains(&ratio), "{ratio}");
    }

    #[test]
    fn an_odd_sample_waits_for_its_pair() {
        let speech = question();
        let mut whole = G722Encoder::new();
        let mut split = G722Encoder::new();
        let mut bytes = split.encode(&speech[..321]);
        assert_eq!(bytes.len(), 160);
        bytes.extend(split.encode(&speech[321..640]));
        assert_eq!(bytes, whole.encode(&speech[..640]));
    }
}
