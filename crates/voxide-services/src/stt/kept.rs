//! The audio a streaming STT provider has not finalized yet, kept so that a new socket can be
//! sent it again: nothing the user said is lost to a slow handshake or a dropped connection.
//!
//! Positions count samples from the start of the current socket's audio, the clock a provider's
//! result times use: a final that ends at sample `n` makes everything before `n` done with. When
//! a new socket opens, the kept audio is the first thing it hears, so its positions restart at 0.

use std::collections::VecDeque;

/// Unfinalized audio, bounded.
#[derive(Debug)]
pub struct KeptAudio {
    samples: VecDeque<i16>,
    /// The position of `samples[0]`.
    base: usize,
    /// The most samples kept: a provider that finalizes nothing for longer does not make a
    /// session grow without end.
    limit: usize,
}

impl KeptAudio {
    /// Keeps at most `limit` samples.
    pub fn new(limit: usize) -> Self {
        Self {
            samples: VecDeque::new(),
            base: 0,
            limit,
        }
    }

    /// Keeps `samples`, dropping the oldest beyond the limit.
    pub fn push(&mut self, samples: &[i16]) {
        self.samples.extend(samples);
        let excess = self.samples.len().saturating_sub(self.limit);
        if excess > 0 {
            self.samples.drain(..excess);
            self.base += excess;
        }
    }

    /// The position of the oldest sample kept.
    pub fn start(&self) -> usize {
        self.base
    }

    /// The position just past the newest sample.
    pub fn end(&self) -> usize {
        self.base + self.samples.len()
    }

    /// Samples kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Nothing is kept.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Everything before position `end` is final.
    pub fn done_up_to(&mut self, end: usize) {
        let done = end.saturating_sub(self.base).min(self.samples.len());
        self.samples.drain(..done);
        self.base += done;
    }

    /// A new socket opens and hears the kept audio first: positions restart at 0.
    pub fn restart(&mut self) {
        self.base = 0;
    }

    /// The kept samples from position `from` on (all of them from 0), in pieces of at most
    /// `piece` samples.
    pub fn pieces_from(&self, from: usize, piece: usize) -> Vec<Vec<i16>> {
        let skip = from.saturating_sub(self.base).min(self.samples.len());
        let rest: Vec<i16> = self.samples.range(skip..).copied().collect();
        rest.chunks(piece.max(1)).map(<[i16]>::to_vec).collect()
    }
}

/// 16-bit samples as the little-endian bytes providers read.
pub fn pcm_bytes(samples: &[i16]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finals_drop_what_they_cover_and_the_bound_drops_the_oldest() {
        let mut kept = KeptAudio::new(10);
        kept.push(&[1, 2, 3, 4, 5, 6]);
        kept.done_up_to(2);
        assert_eq!(kept.pieces_from(0, 100), vec![vec![3, 4, 5, 6]]);
        kept.push(&[7, 8, 9, 10, 11, 12, 13, 14]);
        assert_eq!(kept.len(), 10);
        assert_eq!(kept.end(), 14);
        // Positions stay the socket's: 5 is the sixth sample sent.
        kept.done_up_to(6);
        assert_eq!(
            kept.pieces_from(0, 4),
            vec![vec![7, 8, 9, 10], vec![11, 12, 13, 14]]
        );
        assert_eq!(kept.pieces_from(12, 4), vec![vec![13, 14]]);
        kept.restart();
        kept.done_up_to(3);
        assert_eq!(kept.pieces_from(0, 100), vec![vec![10, 11, 12, 13, 14]]);
        kept.done_up_to(100);
        assert!(kept.is_empty());
    }
}
