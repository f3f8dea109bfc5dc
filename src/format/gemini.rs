//! Gemini's `models/{model}:streamGenerateContent?alt=sse`.
//!
//! Each event (separated by CRLF line ends, which the scanner takes in its stride) is a
//! `GenerateContentResponse`: `{"candidates":[{"content":{"parts":[{"text":"..."}],"role":"model"},
//! "index":0}],"usageMetadata":{"promptTokenCount":..,"candidatesTokenCount":..},
//! "modelVersion":"gemini-2.0-flash","responseId":"..."}`. A chunk is a token event when some
//! candidate has a part with non-empty `text` (thought summaries included) or a `functionCall`
//! (Gemini sends a call whole). `usageMetadata.candidatesTokenCount` is the running count of
//! output tokens, so its growth since the previous token event is that event's exact count and
//! its latest value the server's total (thinking tokens, reported apart as `thoughtsTokenCount`,
//! are not in it). `usageMetadata.promptTokenCount` is the prompt's tokens. There is no end
//! sentinel: the last chunk carries a `finishReason` (`STOP`, `MAX_TOKENS`, `SAFETY` …). A failure
//! mid-stream arrives as `{"error": {"code": 500, "message": ..., "status": "INTERNAL"}}`.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::count::RunningCount;
use super::json::{non_empty_string, plain_string, present, string_inside};
use super::{Classified, FinishReason, Phase};
use crate::scan::Event;

/// Per-stream state: `candidatesTokenCount` at the previous token event.
#[derive(Debug, Default, Clone)]
pub struct GeminiAccounting {
    candidates_tokens: RunningCount,
}

// === impl GeminiAccounting ===

impl GeminiAccounting {
    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        if event.truncated {
            return Classified::unparsed();
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk<'a>>(event.data) else {
            return Classified::unparsed();
        };
        let phase = chunk.candidates.phase;
        let token_event = phase.is_some();
        let usage_total = chunk
            .usage_metadata
            .as_ref()
            .and_then(|u| u.candidates_token_count);
        let tokens = match usage_total {
            Some(now) if token_event => self.candidates_tokens.token_event(now),
            _ => None,
        };
        Classified {
            token_event,
            phase: phase.unwrap_or_default(),
            text: chunk.candidates.text,
            tokens,
            usage_total,
            usage_prompt: usage_prompt(chunk.usage_metadata.as_ref()),
            usage_reasoning: chunk
                .usage_metadata
                .as_ref()
                .and_then(|u| u.thoughts_token_count),
            finish: chunk.candidates.finish,
            model: chunk.model_version.and_then(plain_string),
            end: chunk.candidates.finished,
            error: present(chunk.error),
            unparsed: false,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk<'a> {
    #[serde(borrow, default)]
    candidates: CandidatesSummary<'a>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(borrow, default)]
    model_version: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    candidates_token_count: Option<u64>,
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    thoughts_token_count: Option<u64>,
}

/// `usageMetadata.promptTokenCount`, the prompt's tokens.
fn usage_prompt(usage: Option<&UsageMetadata>) -> Option<u64> {
    usage?.prompt_token_count
}

/// The `candidates` array folded to what matters, without collecting it.
#[derive(Default)]
struct CandidatesSummary<'a> {
    /// The phase of the output the candidates' parts show, when they show any.
    phase: Option<Phase>,
    /// The raw inside of the last non-empty text part that is not a thought.
    text: Option<&'a [u8]>,
    /// Some candidate has a `finishReason`.
    finished: bool,
    /// The last candidate's `finishReason` that names one.
    finish: Option<FinishReason>,
}

impl<'de: 'a, 'a> Deserialize<'de> for CandidatesSummary<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CandidatesVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for CandidatesVisitor<'a> {
            type Value = CandidatesSummary<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of candidates")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(CandidatesSummary::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut summary = CandidatesSummary::default();
                while let Some(candidate) = seq.next_element::<Candidate<'de>>()? {
                    if let Some(parts) = candidate.content.map(|c| c.parts) {
                        if let Some(phase) = parts.phase {
                            summary.phase = Some(Phase::join(summary.phase, phase));
                        }
                        summary.text = parts.text.or(summary.text);
                    }
                    if let Some(raw) = candidate.finish_reason.filter(|r| present(Some(r))) {
                        summary.finished = true;
                        let reason = FinishReason::gemini(raw.get().as_bytes());
                        summary.finish = reason.or(summary.finish);
                    }
                }
                Ok(summary)
            }
        }
        deserializer.deserialize_any(CandidatesVisitor(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Content<'a> {
    #[serde(borrow, default)]
    parts: PartsSummary<'a>,
}

/// A candidate's `parts` folded to the phase of the output they show: a `thought: true` part's
/// text is reasoning, another's content, a `functionCall` a tool call.
#[derive(Default)]
struct PartsSummary<'a> {
    phase: Option<Phase>,
    /// The raw inside of the last non-empty text part that is not a thought.
    text: Option<&'a [u8]>,
}

impl<'de: 'a, 'a> Deserialize<'de> for PartsSummary<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PartsVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for PartsVisitor<'a> {
            type Value = PartsSummary<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of parts")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(PartsSummary::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut summary = PartsSummary::default();
                while let Some(part) = seq.next_element::<Part<'de>>()? {
                    let phase = if non_empty_string(part.text) {
                        if part.thought {
                            Some(Phase::Reasoning)
                        } else {
                            summary.text = string_inside(part.text);
                            Some(Phase::Content)
                        }
                    } else {
                        present(part.function_call).then_some(Phase::ToolCall)
                    };
                    if let Some(phase) = phase {
                        summary.phase = Some(Phase::join(summary.phase, phase));
                    }
                }
                Ok(summary)
            }
        }
        deserializer.deserialize_any(PartsVisitor(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part<'a> {
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    function_call: Option<&'a RawValue>,
    /// A thought summary's part (`includeThoughts`).
    #[serde(default)]
    thought: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(acc: &mut GeminiAccounting, data: &'static str) -> Classified<'static> {
        acc.classify(&Event {
            kind: b"",
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn text_chunks_with_running_usage() {
        let mut acc = GeminiAccounting::default();
        let first = classify(
            &mut acc,
            r#"{"candidates": [{"content": {"parts": [{"text": "The"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 1,"totalTokenCount": 10},"modelVersion": "gemini-2.0-flash","responseId": "9vNZaPbgLNaq1MkP4KLc2Q8"}"#,
        );
        assert!(first.token_event && !first.end);
        assert_eq!((first.tokens, first.usage_total), (Some(1), Some(1)));
        assert_eq!(first.model, Some("gemini-2.0-flash"));
        assert_eq!(first.usage_prompt, Some(9));
        let more = classify(
            &mut acc,
            r#"{"candidates": [{"content": {"parts": [{"text": " sky is blue because of Rayleigh"}],"role": "model"},"index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 8,"totalTokenCount": 17},"modelVersion": "gemini-2.0-flash"}"#,
        );
        assert_eq!(more.tokens, Some(7));
        let last = classify(
            &mut acc,
            r#"{"candidates": [{"content": {"parts": [{"text": " scattering."}],"role": "model"},"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 9,"candidatesTokenCount": 11,"totalTokenCount": 20},"modelVersion": "gemini-2.0-flash"}"#,
        );
        assert!(last.token_event && last.end);
        assert_eq!((last.tokens, last.usage_total), (Some(3), Some(11)));
        assert_eq!(last.finish, Some(FinishReason::Stop));
        assert_eq!(more.finish, None);
    }

    #[test]
    fn empty_parts_function_calls_and_finish_only_chunks() {
        let mut acc = GeminiAccounting::default();
        let empty = classify(
            &mut acc,
            r#"{"candidates": [{"content": {"parts": [{"text": ""}],"role": "model"},"index": 0}]}"#,
        );
        assert!(!empty.token_event);
        let call = classify(
            &mut acc,
            r#"{"candidates": [{"content": {"parts": [{"functionCall": {"name": "get_weather","args": {"city": "Paris"}}}],"role": "model"},"index": 0}]}"#,
        );
        assert!(call.token_event);
        let finish = classify(
            &mut acc,
            r#"{"candidates": [{"content": {"role": "model"},"finishReason": "MAX_TOKENS","index": 0}],"usageMetadata": {"candidatesTokenCount": 4}}"#,
        );
        assert!(!finish.token_event && finish.end);
        assert_eq!(finish.usage_total, Some(4));
        assert_eq!(finish.finish, Some(FinishReason::Length));
        let blocked = classify(
            &mut acc,
            r#"{"candidates": [{"finishReason": "SAFETY","index": 0,"safetyRatings": [{"category": "HARM_CATEGORY_HARASSMENT","probability": "MEDIUM","blocked": true}]}],"usageMetadata": {"promptTokenCount": 8,"totalTokenCount": 8}}"#,
        );
        assert!(blocked.end);
        assert_eq!(blocked.finish, Some(FinishReason::ContentFilter));
        assert_eq!(blocked.usage_prompt, Some(8));
    }

    #[test]
    fn errors_mid_stream() {
        let mut acc = GeminiAccounting::default();
        let error = classify(
            &mut acc,
            r#"{"error": {"code": 503,"message": "The model is overloaded. Please try again later.","status": "UNAVAILABLE"}}"#,
        );
        assert!(error.error && !error.token_event);
    }
}
