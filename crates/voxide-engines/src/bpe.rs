//! Byte-level BPE (GPT-2's alphabet, no prefix space), as the embedded models tokenize: SmolLM2
//! (from the GGUF metadata) splits digits one by one before GPT-2's pre-tokenizer pattern,
//! Whisper (from `tokenizer.json`) keeps runs of digits as GPT-2 does.
//!
//! Special tokens are never produced from text: callers insert them by id, so a user who types
//! `<|im_end|>` gets the characters, not the control token; decoding leaves them out.

use std::collections::HashMap;

/// Byte-level BPE vocabulary and merges.
pub struct Tokenizer {
    pieces: Vec<String>,
    ids: HashMap<String, u32>,
    /// `(left, right)` → (rank, merged id), all as token ids.
    merges: HashMap<(u32, u32), (usize, u32)>,
    /// The single-byte token of each byte (a few control bytes have none and are dropped).
    byte_ids: [Option<u32>; 256],
    char_bytes: HashMap<char, u8>,
    digits: Digits,
}

/// How the pre-tokenizer splits numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digits {
    /// Each digit alone (SmolLM2).
    Single,
    /// A run of digits together, after an optional space (GPT-2, Whisper).
    Runs,
}

impl Tokenizer {
    /// Builds the tokenizer from the vocabulary (indexed by id) and the `"left right"` merge
    /// list.
    pub fn new(pieces: Vec<String>, merges: &[String], digits: Digits) -> Result<Self, String> {
        let ids: HashMap<String, u32> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i as u32))
            .collect();
        let mut ranked = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| format!("malformed merge {m:?}"))?;
            if let (Some(&l), Some(&r), Some(&merged)) =
                (ids.get(a), ids.get(b), ids.get(&format!("{a}{b}")))
            {
                ranked.entry((l, r)).or_insert((rank, merged));
            }
        }
        let byte_chars = byte_alphabet();
        let mut byte_ids = [None; 256];
        for (b, c) in byte_chars.iter().enumerate() {
            byte_ids[b] = ids.get(&c.to_string()).copied();
        }
        let char_bytes = byte_chars
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        Ok(Self {
            pieces,
            ids,
            merges: ranked,
            byte_ids,
            char_bytes,
            digits,
        })
    }

    /// The id of a whole token (e.g. `<|im_start|>`).
    pub fn token(&self, piece: &str) -> Option<u32> {
        self.ids.get(piece).copied()
    }

    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// True for an empty vocabulary (never for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Encodes plain text.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for word in pre_tokenize(text, self.digits) {
            let mut symbols: Vec<u32> = word
                .bytes()
                .filter_map(|b| self.byte_ids[usize::from(b)])
                .collect();
            // Merge the lowest-ranked adjacent pair until none is left.
            while let Some((i, merged)) = symbols
                .windows(2)
                .enumerate()
                .filter_map(|(i, pair)| {
                    self.merges
                        .get(&(pair[0], pair[1]))
                        .map(|&(rank, merged)| (rank, i, merged))
                })
                .min()
                .map(|(_, i, merged)| (i, merged))
            {
                symbols[i] = merged;
                symbols.remove(i + 1);
            }
            out.extend(symbols);
        }
        out
    }

    /// The bytes of `id` (empty for control tokens, `<|…|>`, which are never shown).
    pub fn bytes(&self, id: u32) -> Vec<u8> {
        let Some(piece) = self.pieces.get(id as usize) else {
            return Vec::new();
        };
        if piece.len() > 4 && piece.starts_with("<|") && piece.ends_with("|>") {
            return Vec::new();
        }
        piece
            .chars()
            .map(|c| self.char_bytes.get(&c).copied())
            .collect::<Option<Vec<u8>>>()
            .unwrap_or_default()
    }

    /// Decodes ids to text.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| self.bytes(id)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the rest are moved
/// above U+0100.
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    table
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_alphabetic() {
        Class::Letter
    } else if c.is_numeric() {
        Class::Digit
    } else if c.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// Splits text by GPT-2's pattern
/// (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`), with each
/// digit alone first for [`Digits::Single`].
pub fn pre_tokenize(text: &str, digits: Digits) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let end_of = |i: usize| chars.get(i).map_or(text.len(), |&(at, _)| at);
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let (start, c) = chars[i];
        // Contractions.
        if c == '\'' {
            let rest = &text[start + 1..];
            if let Some(len) = ["s", "t", "re", "ve", "m", "ll", "d"]
                .iter()
                .find(|s| rest.starts_with(**s))
                .map(|s| s.len())
            {
                out.push(&text[start..start + 1 + len]);
                i += 1 + len;
                continue;
            }
        }
        // An optional single space joins the run that follows it, unless single digits are
        // split first: that leaves the space on its own.
        let joins = |next: char| match class(next) {
            Class::Space => false,
            Class::Digit => digits == Digits::Runs,
            _ => true,
        };
        let run_start = match (c, chars.get(i + 1)) {
            (' ', Some(&(_, next))) if joins(next) => i + 1,
            _ => i,
        };
        let kind = class(chars[run_start].1);
        let mut j = run_start + 1;
        match kind {
            Class::Digit if digits == Digits::Single => {} // each digit alone
            Class::Space => {
                while j < chars.len() && class(chars[j].1) == Class::Space {
                    j += 1;
                }
                // `\s+(?!\S)`: leave the last space to the word after it.
                if j < chars.len() && j - run_start > 1 {
                    j -= 1;
                }
            }
            _ => {
                while j < chars.len() && class(chars[j].1) == kind {
                    j += 1;
                }
            }
        }
        out.push(&text[start..end_of(j)]);
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_tokenizer_splits_like_gpt2_with_single_digits() {
        assert_eq!(
            pre_tokenize("Hello world, it's 2024!  Ok", Digits::Single),
            vec![
                "Hello", " world", ",", " it", "'s", " ", "2", "0", "2", "4", "!", " ", " Ok"
            ]
        );
        assert_eq!(
            pre_tokenize("a\n\nb ", Digits::Single),
            vec!["a", "\n", "\n", "b", " "]
        );
    }

    #[test]
    fn pre_tokenizer_keeps_runs_of_digits_like_gpt2() {
        assert_eq!(
            pre_tokenize("Set 5 minutes, it's 2024!", Digits::Runs),
            vec!["Set", " 5", " minutes", ",", " it", "'s", " 2024", "!"]
        );
    }

    #[test]
    fn bytes_round_trip_through_the_alphabet() {
        let table = byte_alphabet();
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(table[b'a' as usize], 'a');
        let distinct: std::collections::HashSet<char> = table.iter().copied().collect();
        assert_eq!(distinct.len(), 256, "every byte its own character");
    }
}
