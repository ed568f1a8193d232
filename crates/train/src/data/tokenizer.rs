//! The byte-level tokenizer: every byte is a token (vocabulary 256), so any file trains and
//! decoding is exact. Small vocabularies keep the embedding and output head small, which suits
//! models sized for a CPU.
//!
//! Not for: subword merges (a BPE would sit beside this behind the same two calls).

/// Byte-level tokenizer with a vocabulary of 256.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    pub const VOCAB_SIZE: usize = 256;

    pub fn encode(&self, text: &[u8]) -> Vec<u32> {
        text.iter().map(|&b| b as u32).collect()
    }

    /// Decodes token ids; ids outside the vocabulary become U+FFFD.
    pub fn decode(&self, tokens: &[u32]) -> String {
        let bytes: Vec<u8> = tokens
            .iter()
            .map(|&t| u8::try_from(t).unwrap_or(b'?'))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_any_text() {
        let t = ByteTokenizer;
        let text = "Sing Heav'nly Muse — ünïcödé";
        let ids = t.encode(text.as_bytes());
        assert_eq!(ids.len(), text.len());
        assert_eq!(ids[0], b'S' as u32);
        assert_eq!(t.decode(&ids), text);
    }
}
