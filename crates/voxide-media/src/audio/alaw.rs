//! G.711 A-law, the 8-bit audio of Europe's telephone networks (PCMA on SIP trunks and in
//! Telnyx's media streams).

/// Encodes one 16-bit sample: its 13 high bits, on a segmented (piecewise log) scale.
pub fn encode(sample: i16) -> u8 {
    let mut magnitude = i32::from(sample) >> 3;
    let mask = if magnitude >= 0 {
        0xd5
    } else {
        magnitude = -magnitude - 1;
        0x55
    };
    // The segment: how many times the magnitude doubles past 31, at most 7.
    let segment = (0..8).find(|s| magnitude < 0x20 << s);
    let Some(segment) = segment else {
        return 0x7f ^ mask;
    };
    let shift = if segment < 2 { 1 } else { segment };
    let value = ((segment as u8) << 4) | ((magnitude >> shift) & 0x0f) as u8;
    value ^ mask
}

/// Decodes one byte.
pub fn decode(byte: u8) -> i16 {
    let byte = byte ^ 0x55;
    let mut magnitude = i16::from(byte & 0x0f) << 4;
    match (byte & 0x70) >> 4 {
        0 => magnitude += 8,
        1 => magnitude += 0x108,
        segment => magnitude = (magnitude + 0x108) << (segment - 1),
    }
    if byte & 0x80 != 0 {
        magnitude
    } else {
        -magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_and_the_extremes_have_their_standard_codes() {
        // G.711's tables: +0 is 0xd5, -1 is 0x55, full scale 0xaa / 0x2a.
        assert_eq!(encode(0), 0xd5);
        assert_eq!(encode(-1), 0x55);
        assert_eq!(encode(i16::MAX), 0xaa);
        assert_eq!(encode(i16::MIN), 0x2a);
        assert_eq!(decode(0xd5), 8);
        assert_eq!(decode(0x55), -8);
        assert_eq!(decode(0xaa), 32_256);
        assert_eq!(decode(0x2a), -32_256);
    }

    #[test]
    fn every_code_decodes_to_a_level_that_encodes_back_to_it() {
        for code in 0..=255u8 {
            assert_eq!(encode(decode(code)), code, "{code:#04x}");
        }
    }

    #[test]
    fn a_sample_comes_back_within_its_segments_step() {
        for sample in (i16::MIN..=i16::MAX).step_by(7) {
            let back = decode(encode(sample));
            let step = (i32::from(sample).abs() >> 4).max(16) + 8;
            assert!(
                (i32::from(back) - i32::from(sample)).abs() <= step,
                "{sample} -> {back}"
            );
        }
    }
}
