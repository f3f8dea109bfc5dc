//! llama.cpp's native `/completion` stream (`llama-server`).
//!
//! Each event is `{"index":0,"content":"...","tokens":[...],"stop":false,"id_slot":0,
//! "tokens_predicted":n,"tokens_evaluated":m}`; a non-empty `content` is a token event. Recent
//! servers report `tokens_predicted`, the running count of generated tokens, so the growth since
//! the previous token event is each event's exact token count and the latest value the stream's
//! total; older servers omit it and every token event counts 1. The event with `"stop": true`
//! (empty `content`, with `model`, `timings` and the final counts) ends the stream. Failures
//! mid-stream arrive as `data: {"error": {...}}` in recent servers and as a legacy `error: {...}`
//! line (not a valid SSE field) in older ones; the latter reaches
//! [`Accounting::unknown_field`](super::Accounting::unknown_field).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::count::{Indexed, SequenceCount};
use super::json::{non_empty_string, plain_string, present};
use super::Classified;
use crate::scan::Event;

/// Per-stream state: each sequence's `tokens_predicted` (a prompt array streams several,
/// told apart by `index`).
#[derive(Debug, Default, Clone)]
pub struct LlamaCppAccounting {
    predicted: Indexed<SequenceCount>,
    /// Some event reported `tokens_predicted`.
    reported: bool,
}

// === impl LlamaCppAccounting ===

impl LlamaCppAccounting {
    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        if event.truncated {
            return Classified::unparsed();
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk<'a>>(event.data) else {
            return Classified::unparsed();
        };
        let token_event = non_empty_string(chunk.content);
        let mut tokens = None;
        if let Some(now) = chunk.tokens_predicted {
            self.reported = true;
            let sequence = self.predicted.slot(chunk.index.unwrap_or(0));
            sequence.latest = now;
            if token_event {
                tokens = sequence.running.token_event(now);
            }
        }
        Classified {
            token_event,
            tokens,
            usage_total: self.reported.then(|| self.predicted.sum(|s| s.latest)),
            // `tokens_evaluated` comes only with the final chunk of some builds: not read yet.
            usage_prompt: None,
            model: chunk.model.and_then(plain_string),
            end: chunk.stop == Some(true),
            error: present(chunk.error),
            unparsed: false,
        }
    }
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    stop: Option<bool>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    tokens_predicted: Option<u64>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(acc: &mut LlamaCppAccounting, data: &'static str) -> Classified<'static> {
        acc.classify(&Event {
            kind: b"",
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn recent_server_with_tokens_predicted() {
        let mut acc = LlamaCppAccounting::default();
        let first = classify(
            &mut acc,
            r#"{"index":0,"content":" Paris","tokens":[],"stop":false,"id_slot":0,"tokens_predicted":1,"tokens_evaluated":6}"#,
        );
        assert!(first.token_event);
        assert_eq!(first.tokens, Some(1));
        assert_eq!(first.usage_total, Some(1));
        let empty = classify(
            &mut acc,
            r#"{"index":0,"content":"","tokens":[],"stop":false,"id_slot":0,"tokens_predicted":2,"tokens_evaluated":6}"#,
        );
        assert!(!empty.token_event);
        let next = classify(
            &mut acc,
            r#"{"index":0,"content":" is","tokens":[],"stop":false,"id_slot":0,"tokens_predicted":3,"tokens_evaluated":6}"#,
        );
        assert_eq!(next.tokens, Some(2), "the held-back token surfaces here");
        let stop = classify(
            &mut acc,
            r#"{"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"gpt-3.5-turbo","tokens_predicted":4,"tokens_evaluated":6,"stop_type":"eos","timings":{"predicted_n":4}}"#,
        );
        assert!(stop.end && !stop.token_event);
        assert_eq!(stop.usage_total, Some(4));
        assert_eq!(stop.model, Some("gpt-3.5-turbo"));
    }

    #[test]
    fn older_server_without_counts() {
        let mut acc = LlamaCppAccounting::default();
        let token = classify(
            &mut acc,
            r#"{"content":" Hello","multimodal":false,"slot_id":0,"stop":false}"#,
        );
        assert!(token.token_event);
        assert_eq!((token.tokens, token.usage_total), (None, None));
    }

    #[test]
    fn prompt_arrays_count_each_sequence() {
        let mut acc = LlamaCppAccounting::default();
        classify(
            &mut acc,
            r#"{"index":0,"content":"a","stop":false,"tokens_predicted":1}"#,
        );
        let b = classify(
            &mut acc,
            r#"{"index":1,"content":"b","stop":false,"tokens_predicted":1}"#,
        );
        assert_eq!(b.tokens, Some(1));
        assert_eq!(b.usage_total, Some(2));
    }

    #[test]
    fn errors_in_data() {
        let mut acc = LlamaCppAccounting::default();
        let error = classify(
            &mut acc,
            r#"{"error":{"code":500,"message":"the request exceeds the available context size","type":"server_error"}}"#,
        );
        assert!(error.error);
    }
}
