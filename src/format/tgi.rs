//! Text Generation Inference's native `/generate_stream`.
//!
//! TGI sends one event per generated token: `{"index":n,"token":{"id","text","logprob","special"},
//! "generated_text":null,"details":null}`. Every event carries exactly one token. A token that is
//! not `special` is a token event; a special one (the end-of-sequence token, typically last)
//! counts toward the stream's total but shows the reader nothing. There is no end sentinel: the
//! event whose `generated_text` is not null is the last one, and with `details: true` its
//! `details.generated_tokens` is the server's own total, `details.finish_reason` why it ended
//! (`eos_token`, `stop_sequence`, `length`) and, in the versions that send it,
//! `details.prompt_tokens` the prompt's length. A failure mid-stream arrives as
//! `{"error": "...", "error_type": "..."}`; keep-alives are `:` comments, which never reach an
//! accountant.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{present, string_inside};
use super::{Classified, FinishReason};
use crate::scan::Event;

/// The TGI accountant; TGI's events need no memory of earlier ones.
#[derive(Debug, Default, Clone, Copy)]
pub struct TgiAccounting;

// === impl TgiAccounting ===

impl TgiAccounting {
    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        if event.truncated {
            return Classified::unparsed();
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk<'a>>(event.data) else {
            return Classified::unparsed();
        };
        let (token_event, tokens, text) = match &chunk.token {
            Some(token) => (!token.special, Some(1), string_inside(token.text)),
            None => (false, None, None),
        };
        let details = chunk.details;
        Classified {
            token_event,
            text: text.filter(|_| token_event),
            tokens,
            usage_total: details.as_ref().and_then(|d| d.generated_tokens),
            usage_prompt: details.as_ref().and_then(|d| d.prompt_tokens),
            finish: details
                .and_then(|d| d.finish_reason)
                .and_then(|raw| FinishReason::tgi(raw.get().as_bytes())),
            model: None,
            end: present(chunk.generated_text),
            error: present(chunk.error),
            ..Classified::default()
        }
    }
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    token: Option<Token<'a>>,
    #[serde(borrow, default)]
    generated_text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    details: Option<Details<'a>>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Token<'a> {
    #[serde(default)]
    special: bool,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Details<'a> {
    #[serde(default)]
    generated_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(data: &'static str) -> Classified<'static> {
        TgiAccounting.classify(&Event {
            kind: b"",
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn ordinary_special_and_last_tokens() {
        let token = classify(
            r#"{"index":1,"token":{"id":1533,"text":" Deep","logprob":-0.51,"special":false},"generated_text":null,"details":null}"#,
        );
        assert!(token.token_event);
        assert_eq!(token.tokens, Some(1));
        assert!(!token.end);
        let eos = classify(
            r#"{"index":9,"token":{"id":2,"text":"</s>","logprob":-0.1,"special":true},"generated_text":" Deep learning is","details":null}"#,
        );
        assert!(!eos.token_event, "a special token shows the reader nothing");
        assert_eq!(eos.tokens, Some(1), "but it is a token");
        assert!(eos.end);
        assert_eq!(eos.usage_total, None);
        let with_details = classify(
            r#"{"index":9,"token":{"id":2,"text":"</s>","logprob":-0.1,"special":true},"generated_text":"x","details":{"finish_reason":"eos_token","generated_tokens":9,"seed":null}}"#,
        );
        assert_eq!(with_details.usage_total, Some(9));
        assert_eq!(with_details.finish, Some(FinishReason::Stop));
        assert_eq!(with_details.usage_prompt, None, "this version does not say");
        assert_eq!(eos.finish, None, "without details: no reason");
    }

    #[test]
    fn details_with_the_prompt_and_a_stop_sequence() {
        let last = classify(
            r#"{"token":{"id":13,"text":"\n","logprob":-0.3,"special":false},"generated_text":"Yes.\n","details":{"finish_reason":"stop_sequence","prompt_tokens":11,"generated_tokens":3,"seed":null}}"#,
        );
        assert_eq!(last.usage_prompt, Some(11));
        assert_eq!(last.finish, Some(FinishReason::Stop));
    }

    #[test]
    fn a_last_token_that_is_text_is_a_token_event_and_the_end() {
        let last = classify(
            r#"{"index":20,"token":{"id":13,"text":".","logprob":-0.2,"special":false},"generated_text":"All of it.","details":{"finish_reason":"length","generated_tokens":20,"seed":null}}"#,
        );
        assert!(last.token_event && last.end);
        assert_eq!(last.usage_total, Some(20));
        assert_eq!(last.finish, Some(FinishReason::Length));
    }

    #[test]
    fn errors_and_garbage() {
        let error = classify(
            r#"{"error":"Request failed during generation: Server error: CUDA out of memory","error_type":"generation"}"#,
        );
        assert!(error.error && !error.token_event);
        assert!(classify("{not json").unparsed);
        assert!(!classify(r#"{"token":{"id":1,"text":"a","special":false},"error":null}"#).error);
    }
}
