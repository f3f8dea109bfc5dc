//! SGLang's native `/generate` stream.
//!
//! Each event is `{"text":"...","meta_info":{"id","finish_reason","prompt_tokens",
//! "completion_tokens","cached_tokens",...},"index":0}`, and `text` is cumulative: the whole
//! output so far. An event is a token event when its `text` grew, which needs only the previous
//! length per sequence, never the text. `meta_info.completion_tokens` is the running count of
//! generated tokens, so its growth since the previous token event is that event's exact count
//! and its latest value the stream's total; `meta_info.prompt_tokens` is the prompt's, and
//! `meta_info.finish_reason` (`null` until the last chunk, then `{"type": "stop" | "length" |
//! "abort", ...}`) why it ended. `data: [DONE]` ends the stream; a failure arrives as
//! `{"error": {"message": ...}}`.
//!
//! A server started with `--incremental-streaming-output` sends only the new text instead. The
//! first time a sequence's text shrinks, the accountant knows it is such a server and from then
//! on counts every non-empty `text` as a token event (until then, a piece no longer than the one
//! before is missed: set the route's `format` if that matters).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::count::{Indexed, SequenceCount};
use super::json::{present, raw_string_len, string_inside};
use super::{Classified, FinishReason};
use crate::scan::Event;

/// Per-stream state: each sequence's text length so far (raw JSON bytes) and token count.
#[derive(Debug, Default, Clone)]
pub struct SgLangAccounting {
    sequences: Indexed<Sequence>,
    /// Some event reported `completion_tokens`.
    reported: bool,
    /// A text shrank: the server sends increments, not the cumulative text.
    incremental: bool,
}

/// What is remembered of one sequence: the raw length of its text so far, and its token count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sequence {
    text_len: usize,
    tokens: SequenceCount,
}

// === impl SgLangAccounting ===

impl SgLangAccounting {
    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        let data = event.data.trim_ascii();
        if data == b"[DONE]" {
            return Classified::end();
        }
        if event.truncated {
            return Classified::unparsed();
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk<'a>>(data) else {
            return Classified::unparsed();
        };
        let sequence = self.sequences.slot(chunk.index.unwrap_or(0));
        let mut token_event = false;
        let mut text = None;
        // An event without text (an error report) leaves the sequence's length alone.
        if chunk.text.is_some() {
            let len = raw_string_len(chunk.text);
            if len > 0 && len < sequence.text_len {
                self.incremental = true;
            }
            let (grew, from) = if self.incremental {
                (len > 0, 0)
            } else {
                (len > sequence.text_len, sequence.text_len)
            };
            token_event = grew;
            // What the event added (escaping is per character, so the raw prefix is the old
            // text's), for the no-parser shape; a cut inside an escape reads as no tag.
            text = string_inside(chunk.text).and_then(|t| t.get(from..));
            sequence.text_len = len;
        }
        let mut tokens = None;
        let usage_prompt = chunk.meta_info.as_ref().and_then(|m| m.prompt_tokens);
        let finish = chunk.meta_info.as_ref().and_then(MetaInfo::finish);
        if let Some(now) = chunk.meta_info.and_then(|m| m.completion_tokens) {
            self.reported = true;
            sequence.tokens.latest = now;
            if token_event {
                tokens = sequence.tokens.running.token_event(now);
            }
        }
        let usage_total = self
            .reported
            .then(|| self.sequences.sum(|s| s.tokens.latest));
        Classified {
            token_event,
            text: text.filter(|_| token_event),
            tokens,
            usage_total,
            usage_prompt,
            finish,
            model: None,
            end: false,
            error: present(chunk.error),
            ..Classified::default()
        }
    }
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    meta_info: Option<MetaInfo<'a>>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct MetaInfo<'a> {
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
    /// Kept raw: `null` on every chunk but the last, which alone is read further.
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
}

impl MetaInfo<'_> {
    /// `finish_reason.type`, on the chunk that has one (any other shape is `other`).
    fn finish(&self) -> Option<FinishReason> {
        #[derive(Deserialize)]
        struct Reason<'a> {
            #[serde(borrow, default, rename = "type")]
            kind: Option<&'a RawValue>,
        }
        let raw = self.finish_reason.filter(|r| present(Some(r)))?;
        match serde_json::from_str::<Reason<'_>>(raw.get()) {
            Ok(Reason { kind: Some(kind) }) => FinishReason::sglang(kind.get().as_bytes()),
            _ => Some(FinishReason::Other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(acc: &mut SgLangAccounting, data: &'static str) -> Classified<'static> {
        acc.classify(&Event {
            kind: b"",
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn cumulative_text_is_a_token_event_when_it_grows() {
        let mut acc = SgLangAccounting::default();
        let first = classify(
            &mut acc,
            r#"{"text":" Paris","meta_info":{"id":"a1","finish_reason":null,"prompt_tokens":7,"completion_tokens":1,"cached_tokens":0},"index":0}"#,
        );
        assert!(first.token_event);
        assert_eq!((first.tokens, first.usage_total), (Some(1), Some(1)));
        let same = classify(
            &mut acc,
            r#"{"text":" Paris","meta_info":{"id":"a1","finish_reason":null,"prompt_tokens":7,"completion_tokens":2,"cached_tokens":0},"index":0}"#,
        );
        assert!(!same.token_event, "a token that added no text yet");
        let grew = classify(
            &mut acc,
            r#"{"text":" Paris.\n","meta_info":{"id":"a1","finish_reason":{"type":"stop","matched":2},"prompt_tokens":7,"completion_tokens":4,"cached_tokens":0},"index":0}"#,
        );
        assert!(grew.token_event);
        assert_eq!((grew.tokens, grew.usage_total), (Some(3), Some(4)));
        assert_eq!(grew.usage_prompt, Some(7));
        assert_eq!(grew.finish, Some(FinishReason::Stop));
        assert_eq!(same.finish, None);
        assert!(classify(&mut acc, "[DONE]").end);
    }

    #[test]
    fn a_length_and_an_abort() {
        let mut acc = SgLangAccounting::default();
        let length = classify(
            &mut acc,
            r#"{"text":" Paris is","meta_info":{"id":"b2","finish_reason":{"type":"length","length":16},"prompt_tokens":9,"completion_tokens":16,"cached_tokens":0},"index":0}"#,
        );
        assert_eq!(length.finish, Some(FinishReason::Length));
        let abort = classify(
            &mut acc,
            r#"{"text":"","meta_info":{"id":"c3","finish_reason":{"type":"abort","message":"Abort before prefill"},"prompt_tokens":9,"completion_tokens":0},"index":1}"#,
        );
        assert_eq!(abort.finish, Some(FinishReason::Abort));
    }

    #[test]
    fn parallel_sequences_are_tracked_apart() {
        let mut acc = SgLangAccounting::default();
        classify(
            &mut acc,
            r#"{"text":"Hello","meta_info":{"completion_tokens":1},"index":0}"#,
        );
        let other = classify(
            &mut acc,
            r#"{"text":"Hi","meta_info":{"completion_tokens":1},"index":1}"#,
        );
        assert!(other.token_event, "sequence 1 has its own length");
        assert_eq!(other.usage_total, Some(2));
        let back = classify(
            &mut acc,
            r#"{"text":"Hello there","meta_info":{"completion_tokens":2},"index":0}"#,
        );
        assert!(back.token_event);
        assert_eq!(back.usage_total, Some(3));
    }

    #[test]
    fn incremental_output_is_recognised_when_a_text_shrinks() {
        let mut acc = SgLangAccounting::default();
        assert!(classify(&mut acc, r#"{"text":"The","index":0}"#).token_event);
        assert!(classify(&mut acc, r#"{"text":" capital","index":0}"#).token_event);
        assert!(classify(&mut acc, r#"{"text":" of","index":0}"#).token_event);
        assert!(classify(&mut acc, r#"{"text":" the","index":0}"#).token_event);
        assert!(!classify(&mut acc, r#"{"text":"","index":0}"#).token_event);
    }

    #[test]
    fn errors_and_garbage() {
        let mut acc = SgLangAccounting::default();
        classify(&mut acc, r#"{"text":"Hello","index":0}"#);
        assert!(
            classify(
                &mut acc,
                r#"{"error":{"message":"The input is too long."}}"#
            )
            .error
        );
        assert!(
            !classify(&mut acc, r#"{"text":"Hello","index":0}"#).token_event,
            "an error report does not reset the text length"
        );
        assert!(classify(&mut acc, "{").unparsed);
    }
}
