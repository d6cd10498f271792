//! What a turn's words say about whether it is over: a transcript that ends a sentence or a
//! question sounds finished; one that ends on a word a sentence cannot end on ("and", "the",
//! "to"), or trails off ("…", a comma), sounds unfinished. Streaming STTs and Whisper both
//! punctuate, so the last mark and the last word carry most of it.

/// The words' side of whether a turn is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Words {
    /// A whole sentence or question.
    Finished,
    /// Cut off mid-sentence: more is coming.
    Trailing,
    /// A sentence or question that ends on a word a cut one often ends on too ("Thank you.",
    /// "Do you know where the station is?", but also Whisper's "Can you tell me the weather
    /// is?" for a question cut after "in"): it may be over, or not.
    Open,
    /// No words yet, or nothing to tell by.
    Unclear,
}

/// Words an English sentence does not end on: articles, conjunctions, prepositions, fillers,
/// and the openings of a clause.
const TRAILING_WORDS: &[&str] = &[
    "a", "an", "the", "and", "or", "but", "because", "if", "than", "to", "of", "for", "with", "in",
    "on", "at", "by", "from", "about", "into", "my", "your", "our", "their", "his", "her", "its",
    "um", "uh", "er", "erm", "hmm", "i", "i'm", "we", "let's", "very", "just", "some", "any",
    "until", "while", "although", "though", "whether", "as",
];

/// Words a sentence or question may end on ("…what it is.", "Thank you.", "Why?") as often as a
/// cut one does: with an end mark after them the words are [`Words::Open`], without one
/// trailing.
const OPEN_WORDS: &[&str] = &[
    "is", "are", "was", "were", "be", "do", "does", "did", "can", "could", "would", "should",
    "will", "you", "so", "then", "that", "this", "these", "those", "like", "what", "which", "who",
    "where", "when", "how", "why", "maybe", "also", "really",
];

/// Judges a turn's transcript so far.
pub fn judge(text: &str) -> Words {
    let text = text.trim();
    if text.is_empty() {
        return Words::Unclear;
    }
    if text.ends_with("...") || text.ends_with('…') || text.ends_with(',') || text.ends_with('-')
    {
        return Words::Trailing;
    }
    let last = text
        .split_whitespace()
        .next_back()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
                .to_lowercase()
        })
        .unwrap_or_default();
    let marked = text.ends_with(['.', '?', '!']);
    if TRAILING_WORDS.contains(&last.as_str()) {
        return Words::Trailing;
    }
    if OPEN_WORDS.contains(&last.as_str()) {
        // Not finished even after a question mark: Whisper writes "Can you tell me the weather
        // is?" for a question cut after "in" (`scripts/turn_wait.py`).
        return if marked { Words::Open } else { Words::Trailing };
    }
    if marked {
        Words::Finished
    } else {
        Words::Unclear
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_and_sentences_are_finished() {
        for text in [
            "What is the capital city of Italy?",
            "What is the square root of eighty one?",
            " Set a timer for five minutes. ",
            "Thanks!",
        ] {
            assert_eq!(judge(text), Words::Finished, "{text}");
        }
    }

    #[test]
    fn a_sentence_cut_on_a_word_it_cannot_end_on_or_trailing_off_is_not() {
        for text in [
            "I want to book a table for",
            "I want to book a table for.",
            "So the...",
            "What's the weather like in",
            "Tell me about cats and",
            "Well, um,",
            "Let me think…",
            "What I really want to know is",
            "Thank you and",
        ] {
            assert_eq!(judge(text), Words::Trailing, "{text}");
        }
    }

    #[test]
    fn a_marked_end_on_a_word_both_whole_and_cut_sentences_end_on_is_open() {
        for text in [
            "What I really want to know is.",
            "Can you tell me the weather is?",
            "Do you know where the station is?",
            "Thank you.",
            "Why?",
        ] {
            assert_eq!(judge(text), Words::Open, "{text}");
        }
    }

    #[test]
    fn no_words_or_no_mark_tell_nothing() {
        assert_eq!(judge(""), Words::Unclear);
        assert_eq!(judge("  "), Words::Unclear);
        assert_eq!(judge("what time is it"), Words::Unclear);
    }
}
