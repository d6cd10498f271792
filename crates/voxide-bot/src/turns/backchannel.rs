//! Backchannels: the short reactions a listener makes while someone else talks ("yeah",
//! "mm hmm", "I see", "oh wow"). Said over the bot they ask it to go on, not to stop: with
//! [`BargeIn::backchannels`](super::BargeIn::backchannels) they are no words towards an
//! interruption.

use voxide_core::text::edits;

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

/// Words of `text` that are not a reaction: "yeah I see" has none, "yeah but wait" two.
///
/// Some transcripts of a reaction are none either, as Whisper misreads a short sound:
/// - numbers and single letters alone ("oh" as "0", "hmm" as "10", "mm" as "M M");
/// - one word alone that is no [cue](CUES) ("I" for "I see"): over the bot that is a misheard
///   reaction more often than a request, and a request's next words come in the next
///   transcript ("Tell" becomes "Tell me about cats");
/// - two or three words without a cue that sound like a reaction ("On course" for "of
///   course", "All light" for "alright"; see [`sounds_like_a_reaction`]).
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
    let mut sounds = 0;
    let mut cue = false;
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
        if is_sound(words[at]) {
            sounds += 1;
        } else {
            meaning += 1;
            cue |= CUES.contains(&words[at]);
        }
        at += 1;
    }
    match (meaning, sounds) {
        (0, _) | (1, 0) if !cue => 0,
        _ if !cue && sounds == 0 && sounds_like_a_reaction(&words) => 0,
        _ => meaning + sounds,
    }
}

/// A number, or a letter that is no word ("M", "F"; not "I" or "a"): what Whisper writes for a
/// sound it cannot place.
fn is_sound(word: &str) -> bool {
    word.chars().all(|c| c.is_ascii_digit())
        || (word.chars().count() == 1 && !matches!(word, "i" | "a"))
}

/// Whether `words` (two or three, lower case) sound like a [reaction](REACTIONS) of two
/// consonants or more. Their [consonants](consonants) are the reaction's; or, as a small
/// recogniser keeps a short phrase's consonants but may lose one ("All light" for "alright"),
/// the reaction's less one when it has three, and one away from them when it has four or more
/// ("Mix sounds" for "makes sense").
fn sounds_like_a_reaction(words: &[&str]) -> bool {
    if !(2..=3).contains(&words.len()) {
        return false;
    }
    let heard = consonants(&words.concat());
    REACTIONS.iter().any(|reaction| {
        let said = consonants(&reaction.replace(' ', ""));
        match said.len() {
            0 | 1 => false,
            2 => heard == said,
            3 => heard == said || (heard.len() == 2 && edits(&heard, &said) == 1),
            _ => edits(&heard, &said) <= 1,
        }
    })
}

/// A word's consonants as they sound, alike ones as one: vowels, and "y", "w" and "h" after
/// the first letter, out, as is a silent "gh"; "c", "g", "k" and "q" alike, "b" and "p", "d"
/// and "t", "f" and "v", "m" and "n", "s" and "z"; "x" as "ks"; a letter doubled as one.
fn consonants(word: &str) -> Vec<u8> {
    let word = word.replace("gh", "");
    let mut out: Vec<u8> = Vec::new();
    let mut last: Option<u8> = None;
    for (i, c) in word.bytes().enumerate() {
        let sounds: &[u8] = match c {
            b'a' | b'e' | b'i' | b'o' | b'u' => b"",
            b'y' | b'w' | b'h' if i > 0 => b"",
            b'c' | b'g' | b'k' | b'q' => b"k",
            b'b' | b'p' => b"p",
            b'd' | b't' => b"t",
            b'f' | b'v' => b"f",
            b'm' | b'n' => b"n",
            b's' | b'z' => b"s",
            b'x' => b"ks",
            b'a'..=b'z' => std::slice::from_ref(&c),
            _ => b"",
        };
        // A doubled letter ("ll", "ss", "ck") is one sound.
        let skip = usize::from(last.is_some() && sounds.first() == last.as_ref());
        out.extend_from_slice(&sounds[skip.min(sounds.len())..]);
        last = sounds.last().copied();
    }
    out
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
    fn reactions_heard_as_words_that_sound_alike_or_as_letters_are_still_reactions() {
        for heard in [
            "On course.",
            "All light.",
            "Mix sounds.",
            "Of curse",
            "M M.",
            "F-f-f.",
            "Get it.",
        ] {
            assert_eq!(meaning_words(heard), 0, "{heard:?}");
        }
    }

    #[test]
    fn words_that_sound_unlike_any_reaction_keep_their_meaning() {
        for (heard, words) in [
            ("Let me", 2),
            ("One moment", 2),
            ("Set a", 2),
            ("Is that", 2),
            ("In class", 2),
            ("Tell me", 2),
            ("Turn your number", 3),
            ("1 load", 2),
            ("Make it stop", 3),
            ("Wait, go on.", 3),
        ] {
            assert_eq!(meaning_words(heard), words, "{heard:?}");
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
