//! G.711 μ-law, the telephone network's 8-bit audio (Twilio Media Streams use it at 8 kHz).

const BIAS: i32 = 0x84;
const CLIP: i32 = 32_635;

/// Encodes one 16-bit sample.
pub fn encode(sample: i16) -> u8 {
    let mut value = i32::from(sample);
    let sign = if value < 0 {
        value = -value;
        0x80
    } else {
        0
    };
    value = value.min(CLIP) + BIAS;
    // The segment is the position of the highest set bit above bit 7.
    let exponent = (7 - (value >> 7).leading_zeros().saturating_sub(24)).min(7) as i32;
    let mantissa = (value >> (exponent + 3)) & 0x0f;
    !(sign | (exponent << 4) as u8 | mantissa as u8)
}

/// Decodes one byte.
pub fn decode(byte: u8) -> i16 {
    let byte = !byte;
    let sign = byte & 0x80;
    let exponent = i32::from((byte >> 4) & 0x07);
    let mantissa = i32::from(byte & 0x0f);
    let magnitude = (((mantissa << 3) + BIAS) << exponent) - BIAS;
    if sign != 0 {
        -magnitude as i16
    } else {
        magnitude as i16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_of_the_standard_table() {
        assert_eq!(encode(0), 0xff);
        assert_eq!(decode(0xff), 0);
        assert_eq!(decode(0x7f), 0);
        assert_eq!(encode(-1), 0x7f);
        assert_eq!(decode(0x80), 32_124);
        assert_eq!(decode(0x00), -32_124);
        assert_eq!(encode(i16::MAX), 0x80);
        assert_eq!(encode(i16::MIN), 0x00);
    }

    #[test]
    fn round_trips_within_the_segment_step() {
        for sample in (-32_000i32..32_000).step_by(97) {
            let back = i32::from(decode(encode(sample as i16)));
            // The step doubles each segment: 2 near zero, 1024 at the top.
            let step = ((sample.abs() + BIAS) >> 4).max(8);
            assert!((back - sample).abs() <= step, "{sample} -> {back}");
        }
        for byte in 0..=255u8 {
            let sample = decode(byte);
            // 0x7f and 0xff both mean zero; every other code survives a round trip.
            if sample != 0 {
                assert_eq!(encode(sample), byte);
            }
        }
    }
}
