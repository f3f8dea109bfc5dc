//! llama.cpp's native `/completion` stream (`llama-server`).
//!
//! Each event is `{"index":0,"content":"...","tokens":[...],"stop":false,"id_slot":0,
//! "tokens_predicted":n,"tokens_evaluated":m}`; a non-empty `content` is a token event. Recent
//! servers report `tokens_predicted`, the running count of generated tokens, so the growth since
//! the previous token event is each event's exact token count and the latest value the stream's
//! total; older servers omit it and every token event counts 1. The event with `"stop": true`
//! (empty `content`, with `model`, `timings` and the final counts) ends the stream; on it
//! `tokens_evaluated` is the prompt's length and `stop_type` (`eos`, `word`, `limit`; older
//! servers: `stopped_eos`, `stopped_word`, `stopped_limit`) why it ended. Failures
//! mid-stream arrive as `data: {"error": {...}}` in recent servers and as a legacy `error: {...}`
//! line (not a valid SSE field) in older ones; the latter reaches
//! [`Accounting::unknown_field`](super::Accounting::unknown_field).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::count::{Indexed, SequenceCount};
use super::json::{non_empty_string, plain_string, present, string_inside};
use super::{Classified, FinishReason};
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
        let end = chunk.stop == Some(true);
        Classified {
            token_event,
            text: string_inside(chunk.content),
            tokens,
            usage_total: self.reported.then(|| self.predicted.sum(|s| s.latest)),
            // Every chunk repeats `tokens_evaluated`; the final one's is the prompt's length.
            usage_prompt: chunk.tokens_evaluated.filter(|_| end),
            finish: if end { chunk.finish() } else { None },
            model: chunk.model.and_then(plain_string),
            end,
            error: present(chunk.error),
            ..Classified::default()
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
    #[serde(default)]
    tokens_evaluated: Option<u64>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stop_type: Option<&'a RawValue>,
    #[serde(default)]
    stopped_eos: bool,
    #[serde(default)]
    stopped_word: bool,
    #[serde(default)]
    stopped_limit: bool,
}

impl Chunk<'_> {
    /// Why the final chunk's generation ended: `stop_type`, else the older flags.
    fn finish(&self) -> Option<FinishReason> {
        if let Some(raw) = self.stop_type {
            return FinishReason::llamacpp(raw.get().as_bytes());
        }
        if self.stopped_limit {
            Some(FinishReason::Length)
        } else if self.stopped_eos || self.stopped_word {
            Some(FinishReason::Stop)
        } else {
            None
        }
    }
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
        assert_eq!(stop.usage_prompt, Some(6));
        assert_eq!(stop.finish, Some(FinishReason::Stop));
        assert_eq!((next.usage_prompt, next.finish), (None, None));
    }

    #[test]
    fn a_limit_and_the_older_flags() {
        let mut acc = LlamaCppAccounting::default();
        let limit = classify(
            &mut acc,
            r#"{"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"m","tokens_predicted":16,"tokens_evaluated":12,"stop_type":"limit","stopping_word":"","truncated":false}"#,
        );
        assert_eq!(limit.finish, Some(FinishReason::Length));
        assert_eq!(limit.usage_prompt, Some(12));
        let older = classify(
            &mut acc,
            r#"{"content":"","model":"m","slot_id":0,"stop":true,"stopped_eos":false,"stopped_limit":true,"stopped_word":false,"stopping_word":"","tokens_evaluated":5,"tokens_predicted":8,"truncated":false}"#,
        );
        assert_eq!(older.finish, Some(FinishReason::Length));
        let eos = classify(
            &mut acc,
            r#"{"content":"","stop":true,"stopped_eos":true,"stopped_limit":false,"stopped_word":false}"#,
        );
        assert_eq!(eos.finish, Some(FinishReason::Stop));
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
