//! User-supplied text inside error messages: a name from a trace or a flag is quoted whole when
//! short, and cut to its first [`QUOTED_CHARS`] characters and its length when long, so a
//! damaged or hostile input (a category name of 50 MB) gives an error of a line, not of its
//! own size.
//!
//! Not for: text that is the output itself (reports, tables).

use std::borrow::Cow;

/// The most characters of user text an error message quotes.
pub const QUOTED_CHARS: usize = 64;

/// `text` whole if it has at most [`QUOTED_CHARS`] characters; otherwise its first
/// [`QUOTED_CHARS`] characters, then "… (N bytes)" with its whole length.
pub fn quote(text: &str) -> Cow<'_, str> {
    quote_at_most(text, QUOTED_CHARS)
}

/// `text` whole if it has at most `chars` characters; otherwise its first `chars` characters,
/// then "… (N bytes)". For a library's message that may quote the input (a parser's error).
pub fn quote_at_most(text: &str, chars: usize) -> Cow<'_, str> {
    match text.char_indices().nth(chars) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes)", &text[..cut], text.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_quoted_whole() {
        assert_eq!(quote(""), "");
        let exactly = "x".repeat(64);
        assert_eq!(quote(&exactly), exactly.as_str());
    }

    #[test]
    fn long_text_keeps_its_first_64_characters_and_its_length() {
        let long = "y".repeat(65);
        assert_eq!(quote(&long), format!("{}… (65 bytes)", "y".repeat(64)));
        // Characters, not bytes: "é" is 2 bytes, so 100 of them are 200 bytes.
        let accents = "é".repeat(100);
        assert_eq!(quote(&accents), format!("{}… (200 bytes)", "é".repeat(64)));
    }
}
