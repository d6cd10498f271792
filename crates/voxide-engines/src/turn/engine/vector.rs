//! The engine's element-wise loops: requantising sums, quantising activations, layer norms,
//! GELU, the attention's softmax. They are written as plain loops the compiler vectorises, and
//! compiled twice on x86-64: for any CPU (SSE2, 4 lanes), and for AVX-512 (16 lanes), which
//! runs where the CPU has it.
//!
//! Unsafe code, allowed here only to call the AVX-512 copies once the CPU is known to have it.
#![allow(unsafe_code)]

/// `1.5 · 2²³`: added to a float of magnitude below 2²², it leaves that float rounded to an
/// integer (ties to even) in the low mantissa bits.
const MAGIC: f32 = 12_582_912.0;
const MAGIC_BITS: i32 = 0x4b40_0000;

/// Whether the AVX-512 copies can run here.
#[cfg(target_arch = "x86_64")]
fn wide_available() -> bool {
    use std::sync::OnceLock;
    static WIDE: OnceLock<bool> = OnceLock::new();
    *WIDE.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
    })
}

/// Defines a function whose body is compiled for any CPU and, on x86-64, for AVX-512 too.
macro_rules! multiversion {
    ($(#[doc = $doc:literal])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[doc = $doc])*
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
            fn wide($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            if wide_available() {
                // SAFETY: the CPU has every feature `wide` is compiled for.
                return unsafe { wide($($arg),*) };
            }
            body($($arg),*)
        }
    };
}

/// `x / scale` clamped to the codes `0..=255` less `zero`, rounded, plus `zero`: ONNX
/// `QuantizeLinear`, in integer operations after the division (no float-to-int conversion).
#[inline(always)]
pub fn code(x: f32, scale: f32, zero: f32) -> u8 {
    // max and min, not clamp: clamp checks its bounds, a branch that stops vectorisation.
    let steps = (x / scale).max(-zero).min(255.0 - zero);
    ((steps + MAGIC).to_bits() as i32 - MAGIC_BITS + zero as i32) as u8
}

/// `x` rounded to an integer, ties to even, for |x| < 2²².
#[inline(always)]
pub fn round_even(x: f32) -> f32 {
    (x + MAGIC) - MAGIC
}

multiversion! {
    /// One row of a product's outputs: each column's sum times its multiplier, clamped to its
    /// codes, rounded, times its output scale, plus its bias (ONNX Runtime's requantisation,
    /// then `DequantizeLinear` and the bias's `Add`).
    pub fn requantize(
        sums: &[i32],
        multiplier: &[f32],
        zero: &[f32],
        scale: &[f32],
        bias: &[f32],
        out: &mut [f32],
    ) {
        let n = out.len();
        let (sums, multiplier, zero, scale, bias) =
            (&sums[..n], &multiplier[..n], &zero[..n], &scale[..n], &bias[..n]);
        for i in 0..n {
            let steps = (sums[i] as f32 * multiplier[i]).max(-zero[i]).min(255.0 - zero[i]);
            out[i] = round_even(steps) * scale[i] + bias[i];
        }
    }
}

multiversion! {
    /// Codes of sums requantised with one multiplier (an attention's scores).
    pub fn requantize_codes(sums: &[i32], multiplier: f32, zero: f32, out: &mut [u8]) {
        for (o, &s) in out.iter_mut().zip(sums) {
            *o = code(s as f32 * multiplier, 1.0, zero);
        }
    }
}

multiversion! {
    /// Codes of one row of a convolution's outputs: each column's sum plus its bias, times its
    /// multiplier, clamped to the codes, rounded (ONNX Runtime's `QLinearConv`).
    pub fn requantize_columns(
        sums: &[i32],
        bias: &[i32],
        multiplier: &[f32],
        zero: f32,
        out: &mut [u8],
    ) {
        let n = out.len();
        let (sums, bias, multiplier) = (&sums[..n], &bias[..n], &multiplier[..n]);
        for i in 0..n {
            out[i] = code((sums[i] + bias[i]) as f32 * multiplier[i], 1.0, zero);
        }
    }
}

multiversion! {
    /// Codes of `x · factor` quantised by `scale` and `zero`.
    pub fn quantize(x: &[f32], factor: f32, scale: f32, zero: f32, out: &mut [u8]) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = code(x * factor, scale, zero);
        }
    }
}

multiversion! {
    /// Codes of GELU(x) quantised by `scale` and `zero`.
    pub fn gelu_quantize(x: &[f32], scale: f32, zero: f32, out: &mut [u8]) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = code(gelu(x), scale, zero);
        }
    }
}

multiversion! {
    /// Codes of tanh(x) quantised by `scale` and `zero`.
    pub fn tanh_quantize(x: &[f32], scale: f32, zero: f32, out: &mut [u8]) {
        for (o, &x) in out.iter_mut().zip(x) {
            // tanh x = 1 - 2 / (e^2x + 1), which saturates cleanly at ±1.
            *o = code(1.0 - 2.0 / (exp(2.0 * x) + 1.0), scale, zero);
        }
    }
}

multiversion! {
    /// A row layer-normed (`weight`, `bias`, ε) and quantised by `scale` and `zero`.
    pub fn norm_quantize(
        x: &[f32],
        weight: &[f32],
        bias: &[f32],
        epsilon: f32,
        scale: f32,
        zero: f32,
        out: &mut [u8],
    ) {
        let n = x.len() as f32;
        let mean = sum(x) / n;
        let mut squares = [0.0f32; 16];
        let chunks = x.chunks_exact(16);
        let tail: f32 = chunks.remainder().iter().map(|v| (v - mean) * (v - mean)).sum();
        for chunk in chunks {
            for (s, v) in squares.iter_mut().zip(chunk) {
                *s += (v - mean) * (v - mean);
            }
        }
        let var = (squares.iter().sum::<f32>() + tail) / n;
        let inv = 1.0 / (var + epsilon).sqrt();
        for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(weight).zip(bias) {
            *o = code((v - mean) * inv * w + b, scale, zero);
        }
    }
}

multiversion! {
    /// One row of the attention's softmax, from score codes to probability codes, as ONNX
    /// Runtime's `QLinearSoftmax` computes it: `table` holds `exp` of each code's value with
    /// the row's maximum at entry 255, `inverse` is the output scale's inverse rounded down.
    pub fn softmax(codes: &[u8], table: &[f32; 256], inverse: f32, zero: f32, out: &mut [u8]) {
        assert!(codes.len() <= 512, "softmax rows are at most 512 long");
        let offset = 255 - usize::from(codes.iter().copied().max().unwrap_or(0));
        let mut exps = [0.0f32; 512];
        let exps = &mut exps[..codes.len().min(512)];
        for (e, &c) in exps.iter_mut().zip(codes) {
            *e = table[usize::from(c) + offset];
        }
        // ONNX Runtime adds them one by one; partial sums differ from that by an ulp or so,
        // and are not a chain of dependent additions.
        let total = sum(exps);
        for (o, &e) in out.iter_mut().zip(exps.iter()) {
            *o = code(e * inverse / total, 1.0, zero);
        }
    }
}

multiversion! {
    /// The sum of a row of bytes.
    pub fn sum_bytes(x: &[u8]) -> i32 {
        x.iter().map(|&v| i32::from(v)).sum()
    }
}

multiversion! {
    /// A row of raw integer sums with the zero points' terms taken out, in place: `sum +
    /// row_term - za · colsum`.
    pub fn take_out_zeros(sums: &mut [i32], row_term: i32, za: i32, colsum: &[i32]) {
        for (s, &c) in sums.iter_mut().zip(colsum) {
            *s += row_term - za * c;
        }
    }
}

/// The sum of `x` over 16 running partial sums (vectorisable, unlike one running sum).
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut partial = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (s, v) in partial.iter_mut().zip(chunk) {
            *s += v;
        }
    }
    partial.iter().sum::<f32>() + tail
}

/// GELU, `x · ½(1 + erf(x/√2))`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// The error function, to about 5e-7 in f32 (Abramowitz and Stegun 7.1.26).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    (1.0 - poly * exp(-a * a)).copysign(x)
}

/// `eˣ` to a few ulp, in plain arithmetic the compiler vectorises (`f32::exp` is a library
/// call). eˣ = 2ⁿ · eʳ with n = round(x / ln 2): n goes into the exponent bits, eʳ
/// (|r| ≤ ln2 / 2) is a polynomial.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // ln 2 in two parts (Cody and Waite), so that n · ln 2 is taken away exactly.
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // Beyond these, e^x is below f32's normal range or above its largest value.
    let x = x.clamp(-87.0, 88.0);
    let n = round_even(x * std::f32::consts::LOG2_E);
    let r = x - n * LN2_HIGH - n * LN2_LOW;
    // e^r by its Taylor series to r⁷/7!: the error is below 2e-9.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    f32::from_bits(((n as i32 + 127) as u32) << 23) * p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_ties_to_even_and_clamp() {
        assert_eq!(code(0.0, 0.5, 10.0), 10);
        assert_eq!(code(0.25, 0.5, 10.0), 10); // half a step: a tie, to even
        assert_eq!(code(0.75, 0.5, 10.0), 12); // one and a half steps: a tie, to even
        assert_eq!(code(-100.0, 0.5, 10.0), 0);
        assert_eq!(code(1000.0, 0.5, 10.0), 255);
        for i in -300_000..300_000 {
            let x = i as f32 / 1000.0;
            let reference = (x.round_ties_even() + 7.0).clamp(0.0, 255.0) as u8;
            assert_eq!(code(x, 1.0, 7.0), reference, "{x}");
        }
    }

    #[test]
    fn both_copies_compute_the_same() {
        // Whichever copy runs here, the plain loops must give what scalar code gives.
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        let mut fast = vec![0u8; x.len()];
        gelu_quantize(&x, 0.02, 10.0, &mut fast);
        let slow: Vec<u8> = x.iter().map(|&v| code(gelu(v), 0.02, 10.0)).collect();
        assert_eq!(fast, slow);
    }

    #[test]
    fn tanh_quantize_is_the_library_tanh_quantised() {
        let x: Vec<f32> = (-4000..4000).map(|i| i as f32 / 500.0).collect();
        let mut fast = vec![0u8; x.len()];
        tanh_quantize(&x, 0.0078, 127.0, &mut fast);
        for (&x, &f) in x.iter().zip(&fast) {
            // A tie may round either way.
            let exact = code(x.tanh(), 0.0078, 127.0);
            assert!(f.abs_diff(exact) <= 1, "tanh({x}): {f} vs {exact}");
        }
        let exact: Vec<u8> = x.iter().map(|&x| code(x.tanh(), 0.0078, 127.0)).collect();
        let same = fast.iter().zip(&exact).filter(|(a, b)| a == b).count();
        assert!(same * 1000 >= x.len() * 999, "{same} of {}", x.len());
    }

    #[test]
    fn exp_and_erf_agree_with_the_library() {
        for i in -17_400..=17_400 {
            let x = i as f32 / 200.0;
            let (fast, exact) = (exp(x), x.exp());
            assert!(
                (fast - exact).abs() <= exact * 1e-6,
                "exp({x}): {fast} vs {exact}"
            );
            let fast = erf(x);
            if x.abs() <= 3.0 {
                let exact = erf_reference(f64::from(x)) as f32;
                assert!((fast - exact).abs() < 6e-7, "erf({x}): {fast} vs {exact}");
            } else {
                // 1 - erf(3) is 2.2e-5, and the gap only narrows beyond.
                assert!((fast - x.signum()).abs() < 2.3e-5, "erf({x}): {fast}");
            }
        }
        assert!(exp(-1000.0) < 1e-37);
        assert!(exp(1000.0).is_finite());
    }

    /// erf by its Taylor series in f64 (accurate to 1e-12 for |x| <= 3).
    fn erf_reference(x: f64) -> f64 {
        let mut term = x;
        let mut sum = x;
        for n in 1..200 {
            term *= -x * x / f64::from(n);
            sum += term / f64::from(2 * n + 1);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }
}
