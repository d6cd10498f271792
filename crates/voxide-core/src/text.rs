//! Where a response's text breaks into sentences: the voice speaks it a sentence at a time, and
//! a text client gets it so.

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
