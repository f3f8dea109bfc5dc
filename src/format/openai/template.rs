//! The template: the last token event the walker read, to read the next chunks by comparison.

// One `unsafe` block: a model the template's bytes already proved UTF-8 is not checked again.
#![allow(unsafe_code)]

use super::grammar::{non_empty_string, string_close, Span};
use super::{FinishReason, Phase, Summary};

/// The last token event the walker read, kept to read the stream's next chunks by comparison.
///
/// A server streams one chunk shape over and over: the same id, timestamps and model, only the
/// text differs. A chunk that is the template's bytes with one non-empty text value replaced
/// by another tokenizes as the template did, token for token, the one string aside: the bytes
/// before the string are the same, the new string is checked by the walker's own string rules
/// (escapes, control characters, UTF-8) to close exactly where the template's bytes resume,
/// and the parse after a string depends only on what came before it. Every field the summary
/// reads is the same but that string, and it reads only whether the string is empty, which
/// neither is. So the summary is the template's: a comparison of about 200 bytes instead of a
/// walk over them. Anything else (another shape, a changed number, an empty text) is walked.
#[derive(Debug, Clone)]
pub(super) struct Template {
    bytes: Vec<u8>,
    /// The text value's raw span in `bytes`, quotes included.
    text: Span,
    /// The summary's `model` as a span of `bytes`, and its other fields.
    model: Option<Span>,
    error: bool,
    token_ids: Option<u32>,
    usage_total: Option<u64>,
    finish: Option<FinishReason>,
    /// The chunk's phase: every field but the text is the template's, so it is too.
    phase: Phase,
    /// The text value is the chunk's content, lent to the no-parser shape.
    text_is_content: bool,
}

/// How much of a template [`Template::prefetch`] asks for. A chunk is usually a few hundred
/// bytes; one of many KiB (long logprobs, a large tool call) is compared from its start, so the
/// processor's own prefetcher follows the read after the first lines, and asking for all of
/// it ahead would cost a prefetch per 64 bytes, twice per frame, for lines the first-level
/// cache cannot hold anyway.
const PREFETCH_BYTES: usize = 1024;

// === impl Template ===

impl Template {
    /// Asks for the template's own line and its bytes' first [`PREFETCH_BYTES`] (see
    /// [`crate::prefetch`]).
    #[inline]
    pub(super) fn prefetch(&self) {
        crate::prefetch::value(self);
        crate::prefetch::slice(&self.bytes[..self.bytes.len().min(PREFETCH_BYTES)]);
    }

    /// A template of `data`, whose walk gave `summary` with the text value at `text`.
    pub(super) fn new(data: &[u8], text: Span, summary: &Summary<'_>) -> Self {
        let mut template = Template {
            bytes: Vec::new(),
            text,
            model: None,
            error: false,
            token_ids: None,
            usage_total: None,
            finish: None,
            phase: Phase::Content,
            text_is_content: false,
        };
        template.keep(data, text, summary);
        template
    }

    /// Makes `data` the template, reusing the buffer.
    pub(super) fn keep(&mut self, data: &[u8], text: Span, summary: &Summary<'_>) {
        debug_assert!(summary.token_event && non_empty_string(&data[text.0..text.1]));
        self.bytes.clear();
        self.bytes.extend_from_slice(data);
        self.text = text;
        self.model = summary.model.map(|model| {
            let start = model.as_ptr() as usize - data.as_ptr() as usize;
            (start, start + model.len())
        });
        self.error = summary.error;
        self.token_ids = summary.token_ids;
        self.usage_total = summary.usage_total;
        self.finish = summary.finish;
        self.phase = summary.phase;
        self.text_is_content = summary
            .text
            .is_some_and(|t| t.as_ptr() as usize - data.as_ptr() as usize == text.0 + 1);
    }

    /// `data`'s summary, when `data` is the template with another non-empty text.
    pub(super) fn read<'a>(&self, data: &'a [u8]) -> Option<Summary<'a>> {
        let (open, end) = self.text;
        let head = &self.bytes[..=open];
        let tail = &self.bytes[end - 1..];
        if data.len() <= head.len() + tail.len() || !data.starts_with(head) || !data.ends_with(tail)
        {
            return None;
        }
        let close = data.len() - tail.len();
        if string_close(data, open)? != close {
            return None; // the new text ends early, or escapes the closing quote
        }
        // A token's text is most often ASCII, which is valid UTF-8 and cheaper to check.
        let text = &data[open + 1..close];
        if !text.is_ascii() {
            std::str::from_utf8(text).ok()?;
        }
        let model = self.model.and_then(|(start, model_end)| {
            // The model is before the text or after it, never inside it (the walker read them
            // as two strings). After it, the model is as far from the end as in the template.
            let (span, compared) = if start > open {
                let at = |i: usize| data.len() - (self.bytes.len() - i);
                (at(start)..at(model_end), start >= end)
            } else {
                (start..model_end, model_end <= open)
            };
            let model = &data[span];
            if !compared {
                // Not within the bytes compared above: cannot happen, but checked if it does.
                return std::str::from_utf8(model).ok();
            }
            debug_assert_eq!(model, &self.bytes[start..model_end]);
            // SAFETY: `model` lies within `head` or `tail` (`compared`), which `data` was found
            // equal to, so it is byte for byte `self.bytes[start..model_end]`: the model `keep`
            // took from a `&str`, valid UTF-8. (Checking again cost ~120 instructions a token
            // event, 1.5 % of what one costs.)
            Some(unsafe { std::str::from_utf8_unchecked(model) })
        });
        Some(Summary {
            model,
            error: self.error,
            token_event: true,
            phase: self.phase,
            text: self.text_is_content.then_some(text),
            token_ids: self.token_ids,
            usage_total: self.usage_total,
            finish: self.finish,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::VLLM_CHUNK;
    use super::super::walker;
    use super::*;

    /// The template made from walking `base`, and whether it reads `next` (checked against serde).
    fn template_reads(base: &str, next: &str) -> bool {
        let walker::Walked { summary, text, .. } = walker::walk(base.as_bytes()).expect("walked");
        let template = Template::new(base.as_bytes(), text.expect("a token event"), &summary);
        match template.read(next.as_bytes()) {
            Some(read) => {
                assert_eq!(Some(read), Summary::by_serde(next.as_bytes()), "{next}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn a_chunk_that_differs_only_in_its_text_is_read_by_the_template() {
        let long = "long ".repeat(40);
        for text in [
            " there",
            "x",
            r#"a\"b"#,
            r#"\u00e9\n"#,
            r#"a\\"#,
            "\u{e9}\u{4e16}",
            &long,
        ] {
            let next = VLLM_CHUNK.replace(" Hi", text);
            assert!(template_reads(VLLM_CHUNK, &next), "{next}");
        }
        // The model after the text: found at the same distance from the end.
        let after = r#"{"choices":[{"delta":{"content":"ab"}}],"model":"late-model","id":"x"}"#;
        let next = after.replace("ab", "a much longer text");
        assert!(template_reads(after, &next));
        let walker::Walked { summary, text, .. } = walker::walk(after.as_bytes()).unwrap();
        let template = Template::new(after.as_bytes(), text.unwrap(), &summary);
        assert_eq!(
            template.read(next.as_bytes()).unwrap().model,
            Some("late-model")
        );
    }

    #[test]
    fn a_chunk_the_template_cannot_vouch_for_is_walked() {
        for next in [
            VLLM_CHUNK.replace(" Hi", ""), // empty: not a token event
            VLLM_CHUNK.replace(" Hi", r#"a"},"x":{"y":"b"#), // a quote ends the text early
            VLLM_CHUNK.replace(" Hi", r#"x\"#), // escapes the closing quote
            VLLM_CHUNK.replace(" Hi", r#"x\u12"#), // a bad escape
            VLLM_CHUNK.replace(" Hi", r#"x\q"#),
            VLLM_CHUNK.replace(" Hi", "x\u{1}"), // a control character
            VLLM_CHUNK.replace(r#""created":1"#, r#""created":2"#), // another number
            VLLM_CHUNK.replace("}]}", "}]} "),
            VLLM_CHUNK.replace(" Hi", "x").replace("index", "indey"),
        ] {
            assert!(!template_reads(VLLM_CHUNK, &next), "{next}");
        }
        // Invalid UTF-8 in the new text.
        let mut bytes = VLLM_CHUNK.as_bytes().to_vec();
        bytes[VLLM_CHUNK.find(" Hi").unwrap()] = 0xff;
        let walker::Walked { summary, text, .. } = walker::walk(VLLM_CHUNK.as_bytes()).unwrap();
        let template = Template::new(VLLM_CHUNK.as_bytes(), text.unwrap(), &summary);
        assert_eq!(template.read(&bytes), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        /// A template reads a chunk only as serde does, whatever replaces its text and whatever
        /// else is edited; and a chunk that differs in its text alone (text of safe pieces) is
        /// always read by it.
        #[test]
        fn the_template_never_disagrees_with_serde(
            base in 0usize..3,
            pieces in proptest::collection::vec(0usize..16, 0..12),
            edit in proptest::option::of((0usize..400, 0usize..16)),
        ) {
            const BASES: [&str; 3] = [
                VLLM_CHUNK,
                r#"{"object":"text_completion","choices":[{"index":0,"text":"a\nb","finish_reason":null},{"index":1,"text":"c"}],"model":"m2","usage":{"completion_tokens":3}}"#,
                r#"{"choices":[{"index":0,"delta":{"reasoning_content":"r"},"token_ids":[1,2]}],"model":"m3"}"#,
            ];
            const PIECES: [&str; 16] = [
                "a", " ", "\u{e9}", r#"\n"#, r#"\u00e9"#, r#"\\"#, r#"\""#, "\u{4e16}",
                "\"", "\\", "\u{1}", r#"\u12"#, r#"\x"#, "}", "]", "\u{7f}",
            ];
            let base = BASES[base];
            let walker::Walked { summary, text, .. } = walker::walk(base.as_bytes()).unwrap();
            let (open, end) = text.unwrap();
            let template = Template::new(base.as_bytes(), (open, end), &summary);
            let new_text: String = pieces.iter().map(|p| PIECES[*p]).collect();
            let mut next = format!("{}{}{}", &base[..=open], new_text, &base[end - 1..]);
            let safe = !new_text.is_empty() && pieces.iter().all(|p| *p < 8);
            if let Some((at, piece)) = edit {
                let mut at = at % (next.len() + 1);
                while !next.is_char_boundary(at) {
                    at -= 1;
                }
                next.insert_str(at, PIECES[piece]);
            }
            match template.read(next.as_bytes()) {
                Some(read) => proptest::prop_assert_eq!(
                    Some(read),
                    Summary::by_serde(next.as_bytes()),
                    "{}",
                    next
                ),
                None => proptest::prop_assert!(!safe || edit.is_some(), "not read: {}", next),
            }
        }
    }
}
