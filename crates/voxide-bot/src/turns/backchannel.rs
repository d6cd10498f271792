//! Backchannels: the short reactions a listener makes while someone else talks ("yeah",
//! "mm hmm", "I see", "oh wow"). Said over the bot they ask it to go on, not to stop: with
//! [`BargeIn::backchannels`](super::BargeIn::backchannels) they are no words towards an
//! interruption.

/// Reactions, as a speech-to-text writes them once lower-cased and stripped of punctuation
/// (hyphens read as spaces). Longer phrases first: "oh okay" is one reaction, not two.
const REACTIONS: &[&str] = &[
    "makes sense",
    "of course",
    "all right",
    "oh okay",
    "oh ok",
    "oh wow",
    "oh really",
    "oh nice",
    "oh i see",
    "i see",
    "i know",
    "i get it",
    "got it",
    "no way",
    "mm hmm",
    "mm hm",
    "uh huh",
    "ha ha",
    "yeah",
    "yea",
    "yes",
    "yep",
    "yup",
    "ya",
    "mhm",
    "mmhmm",
    "mm",
    "mmm",
    "hmm",
    "hm",
    "uhhuh",
    "huh",
    "ok",
    "okay",
    "right",
    "sure",
    "alright",
    "oh",
    "ah",
    "aha",
    "wow",
    "really",
    "nice",
    "cool",
    "great",
    "exactly",
    "true",
    "indeed",
    "interesting",
    "totally",
    "absolutely",
    "haha",
    "ha",
    // Hesitations: the start of "uh huh", or of a remark whose words will tell.
    "uh",
    "um",
    "er",
    "erm",
];

/// Words that ask the bot to stop even alone: a halt ("stop", "wait"), an objection ("no"), a
/// call for attention ("sorry", "hey") or the start of a question or request ("what", "can").
const CUES: &[&str] = &[
    "stop", "wait", "hold", "hang", "pause", "enough", "quiet", "shh", "no", "nope", "not",
    "never", "dont", "don't", "cancel", "sorry", "excuse", "pardon", "hey", "hello", "listen",
    "actually", "but", "please", "what", "what's", "whats", "why", "how", "who", "where", "when",
    "which", "can", "could", "would", "will", "repeat", "again",
];

/// Words of `text` that are not a reaction: "yeah I see" has none, "yeah but wait" two. Numbers
/// alone are none: Whisper writes short sounds it cannot place as digits ("oh" as "0", "hmm" as
/// "10"), and a lone number over the bot is no request to stop. Nor is one word alone that is
/// no [cue](CUES): over the bot, that is a reaction Whisper misheard ("I" for "I see", "In
/// class" is two) more often than a request, and a request's next words come in the next
/// transcript ("Tell" becomes "Tell me about cats").
pub fn meaning_words(text: &str) -> usize {
    let cleaned: String = text
        .chars()
        .map(|c| if c == '-' { ' ' } else { c })
        .filter(|c| c.is_alphanumeric() || c.is_whitespace() || *c == '\'')
        .flat_map(char::to_lowercase)
        .collect();
    let words: Vec<&str> = cleaned.split_whitespace().collect();
    let mut at = 0;
    let mut meaning = 0;
    let mut numbers = 0;
    let mut lone_cue = false;
    'words: while at < words.len() {
        for reaction in REACTIONS {
            let length = reaction.split(' ').count();
            if words.len() - at >= length
                && words[at..at + length]
                    .iter()
                    .copied()
                    .eq(reaction.split(' '))
            {
                at += length;
                continue 'words;
            }
        }
        if words[at].chars().all(|c| c.is_ascii_digit()) {
            numbers += 1;
        } else {
            meaning += 1;
            lone_cue = CUES.contains(&words[at]);
        }
        at += 1;
    }
    match (meaning, numbers) {
        (0, _) | (1, 0) if !lone_cue => 0,
        _ => meaning + numbers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reactions_have_no_meaning_words_however_they_are_written() {
        for reaction in [
            "Yeah.",
            "Mm-hmm.",
            "mm hmm",
            "Okay.",
            "I see.",
            "Uh-huh",
            "Oh, wow!",
            "Yeah, yeah.",
            "Makes sense.",
            "Of course.",
            "Oh okay",
            "Ha ha.",
            "Right, right.",
            "Uh",
            "Um, okay.",
            "0",
            "10.",
            "1, 2, 3.",
            "",
            "I.",
            "Yeah, sense.",
            "Interest.",
        ] {
            assert_eq!(meaning_words(reaction), 0, "{reaction:?}");
        }
    }

    #[test]
    fn interruptions_and_questions_keep_their_words() {
        assert_eq!(meaning_words("Wait, stop."), 2);
        assert_eq!(meaning_words("Stop."), 1);
        assert_eq!(meaning_words("No."), 1, "a bare no is a real objection");
        assert_eq!(meaning_words("Hold on, what time is it?"), 6);
        assert_eq!(
            meaning_words("Yeah, but wait."),
            2,
            "a reaction that goes on"
        );
        assert_eq!(meaning_words("Okay, tell me about cats."), 4);
        assert_eq!(meaning_words("I see what you mean"), 3);
        assert_eq!(meaning_words("Um, wait."), 1, "a hesitation before a word");
        assert_eq!(meaning_words("Sorry?"), 1);
        assert_eq!(meaning_words("What?"), 1);
        assert_eq!(meaning_words("Tell me"), 2);
        assert_eq!(meaning_words("Tokyo 2"), 2, "a word and a number");
        assert_eq!(
            meaning_words("What is 7 times 8?"),
            5,
            "numbers among words"
        );
    }
}
